"""Cost per TPS: the plan's monthly price over the peak TPS each workload reached."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from pglab.analysis.stats import estimate
from pglab.plan.schema import Cost
from pglab.store.sqlite import RunRow, Store


def sweep_cost(store: Store, sweep_id: int) -> Cost | None:
    """The ``cost:`` block of the plan the sweep ran (None when the plan had none)."""
    text = store.plan_text(sweep_id)
    try:
        data = yaml.safe_load(text) if text is not None else None
        return Cost.model_validate(data["cost"]) if isinstance(data, dict) and data.get("cost") else None
    except (yaml.YAMLError, ValidationError):
        return None


def peak_points(runs: list[RunRow], metric: str = "tps") -> dict[str, tuple[RunRow, float]]:
    """Per workload, the point whose mean ``metric`` over its ok runs is highest: (a run of it, that mean).
    The same means the database table shows; the first point reaching the peak wins a tie."""
    groups: dict[int, list[RunRow]] = {}
    for r in runs:
        groups.setdefault(r.point_id, []).append(r)
    best: dict[str, tuple[RunRow, float]] = {}
    for group in groups.values():
        e = estimate([r.metrics.get(metric) for r in group if r.status == "ok"])
        workload = str(group[0].axes.get("workload"))
        if e is not None and (workload not in best or e.mean > best[workload][1]):
            best[workload] = (group[0], e.mean)
    return best


def cost_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per workload: peak TPS (mean over repeats of the best point), monthly price, price per TPS."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    cost = sweep_cost(store, sweep_id) if sweep_id is not None else None
    if cost is None:
        return [], []
    columns = ["workload", "peak_tps", "at_clients", "at_synchronous_commit", "monthly", "currency", "per_tps"]
    rows = [{"workload": run.axes.get("workload"), "peak_tps": tps, "at_clients": run.axes.get("clients"),
             "at_synchronous_commit": run.axes.get("synchronous_commit"), "monthly": cost.monthly,
             "currency": cost.currency, "per_tps": cost.monthly / tps}
            for run, tps in peak_points(store.runs(sweep_id)).values()]
    return columns, rows


def cost_comparison(store_a: Store, store_b: Store) -> list[str]:
    """One sentence per workload present on both sides: how much cheaper (or dearer) per TPS B is than A."""
    a_id, b_id = store_a.latest_sweep_id(), store_b.latest_sweep_id()
    _, rows_a = cost_table(store_a, a_id)
    _, rows_b = cost_table(store_b, b_id)
    by_a = {r["workload"]: r for r in rows_a}
    lines = []
    for rb in rows_b:
        ra = by_a.get(rb["workload"])
        if ra is None or ra["currency"] != rb["currency"]:
            continue
        change = (rb["per_tps"] - ra["per_tps"]) / ra["per_tps"] * 100
        word = "cheaper" if change < 0 else "dearer"
        lines.append(f"{rb['workload']}: B costs {rb['per_tps']:.4f} {rb['currency']}/TPS·month vs "
                     f"{ra['per_tps']:.4f} for A at peak TPS: {abs(change):.1f} % {word} per TPS "
                     f"(peak {rb['peak_tps']:,.0f} vs {ra['peak_tps']:,.0f} TPS; monthly {rb['monthly']:g} vs "
                     f"{ra['monthly']:g})")
    return lines
