"""Cost per TPS: the plan's monthly price over the peak TPS each workload reached."""

from __future__ import annotations

from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from pglab.analysis.stats import contrast, estimate
from pglab.plan.schema import Cost
from pglab.store.sqlite import RunRow, Store
from pglab.units import money

BlockT = TypeVar("BlockT", bound=BaseModel)


def plan_block(store: Store, sweep_id: int, key: str, model: type[BlockT]) -> BlockT | None:
    """The plan's ``key:`` block the sweep ran with, as ``model`` (None when the plan had none, or an older pglab
    wrote one this one cannot read)."""
    text = store.plan_text(sweep_id)
    try:
        data = yaml.safe_load(text) if text is not None else None
        return model.model_validate(data[key]) if isinstance(data, dict) and data.get(key) else None
    except (yaml.YAMLError, ValidationError):
        return None


def sweep_cost(store: Store, sweep_id: int) -> Cost | None:
    """The ``cost:`` block of the plan the sweep ran (None when the plan had none)."""
    return plan_block(store, sweep_id, "cost", Cost)


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


def storage_costs(store: Store, sweep_id: int) -> dict[str, Cost | None]:
    """The storage axis's values (Kubernetes ``matrix.storage``) → each one's price: its own ``cost``, else the
    plan's; empty when the plan has no storage axis."""
    text = store.plan_text(sweep_id)
    try:
        data = yaml.safe_load(text) if text is not None else None
        values = data.get("matrix", {}).get("storage") if isinstance(data, dict) else None
        if not isinstance(values, list):
            return {}
        plan_cost = sweep_cost(store, sweep_id)
        return {str(v["name"]): Cost.model_validate(v["cost"]) if v.get("cost") else plan_cost for v in values}
    except (yaml.YAMLError, ValidationError, AttributeError, KeyError, TypeError):
        return {}


PART = "monthly."  # a column of the cost's breakdown: PART + the part's name (compute, storage, ...)


def part_columns(costs: list[Cost | None]) -> list[str]:
    """The breakdown's parts of the prices shown, each a column after ``monthly`` (in the order the plan lists
    them; none when no price has a breakdown)."""
    return list(dict.fromkeys(PART + name for c in costs if c is not None for name in c.breakdown))


def parts(cost: Cost | None, columns: list[str]) -> dict[str, float | None]:
    """A row's breakdown columns: each part's monthly price (None where its price has no such part)."""
    given = cost.breakdown if cost is not None else {}
    return {c: given.get(c.removeprefix(PART)) for c in columns}


def storage_cost_table(store: Store, sweep_id: int,
                       costs: dict[str, Cost | None]) -> tuple[list[str], list[dict[str, Any]]]:
    """The storage axis: one row per value and workload — peak TPS of the value's points, its monthly price (and its
    breakdown's parts) and its price per TPS (values without a price show their TPS alone)."""
    breakdown = part_columns(list(costs.values()))
    columns = ["storage", "workload", "peak_tps", "at_clients", "at_synchronous_commit", "monthly", *breakdown,
               "currency", "per_tps"]
    runs = store.runs(sweep_id)
    rows = []
    for name, cost in costs.items():
        mine = [r for r in runs if str(r.axes.get("storage")) == name]
        for run, tps in peak_points(mine).values():
            rows.append({"storage": name, "workload": run.axes.get("workload"), "peak_tps": tps,
                         "at_clients": run.axes.get("clients"),
                         "at_synchronous_commit": run.axes.get("synchronous_commit"),
                         "monthly": cost.monthly if cost else None, **parts(cost, breakdown),
                         "currency": cost.currency if cost else None,
                         "per_tps": cost.monthly / tps if cost and tps else None})
    return (columns, rows) if any(r["per_tps"] is not None for r in rows) else ([], [])


def cost_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per workload: peak TPS (mean over repeats of the best point), monthly price (and, with
    ``cost.breakdown``, each part's monthly price: ``monthly.<part>``), price per TPS; with a storage axis, one row per
    value and workload (``storage_cost_table``)."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    if sweep_id is not None and (costs := storage_costs(store, sweep_id)):
        return storage_cost_table(store, sweep_id, costs)
    cost = sweep_cost(store, sweep_id) if sweep_id is not None else None
    if cost is None:
        return [], []
    breakdown = part_columns([cost])
    columns = ["workload", "peak_tps", "at_clients", "at_synchronous_commit", "monthly", *breakdown, "currency",
               "per_tps"]
    rows = [{"workload": run.axes.get("workload"), "peak_tps": tps, "at_clients": run.axes.get("clients"),
             "at_synchronous_commit": run.axes.get("synchronous_commit"), "monthly": cost.monthly,
             **parts(cost, breakdown), "currency": cost.currency, "per_tps": cost.monthly / tps}
            for run, tps in peak_points(store.runs(sweep_id)).values()]
    return columns, rows


def cost_comparison(store_a: Store, store_b: Store) -> list[str]:
    """One sentence per workload present on both sides: how much cheaper (or dearer) per TPS B is than A, with the
    95 % interval of that change (from the peak points' TPS, the prices being exact) and whether it is significant
    — "too few repeats" when a peak point ran once."""
    a_id, b_id = store_a.latest_sweep_id(), store_b.latest_sweep_id()
    _, rows_a = cost_table(store_a, a_id)
    _, rows_b = cost_table(store_b, b_id)
    peaks_a = peak_points(store_a.runs(a_id)) if a_id is not None else {}
    peaks_b = peak_points(store_b.runs(b_id)) if b_id is not None else {}
    by_a = {r["workload"]: r for r in rows_a}
    lines = []
    for rb in rows_b:
        ra = by_a.get(rb["workload"])
        if ra is None or ra["currency"] != rb["currency"]:
            continue
        change = (rb["per_tps"] - ra["per_tps"]) / ra["per_tps"] * 100
        word = "cheaper" if change < 0 else "dearer"
        run_a, run_b = peaks_a[str(rb["workload"])][0], peaks_b[str(rb["workload"])][0]
        tps = contrast(_ok_tps(store_a, a_id, run_a), _ok_tps(store_b, b_id, run_b))
        price = rb["monthly"] / ra["monthly"]
        if tps is None or tps.significant is None:
            judged = "too few repeats to tell"
        elif tps.ratio_ci is None or tps.ratio_ci[0] <= 0:
            judged = "95 % interval unbounded; no significant difference"
        else:  # cost per TPS = price ratio / TPS ratio: the TPS ratio's Fieller interval, turned over
            low, high = price / tps.ratio_ci[1], price / tps.ratio_ci[0]
            verdict = word if low > 1 or high < 1 else "no significant difference"
            judged = f"95 % interval {(low - 1) * 100:+.1f} % to {(high - 1) * 100:+.1f} %; {verdict}"
        lines.append(f"{rb['workload']}: B costs {money(rb['per_tps'])} {rb['currency']}/TPS·month vs "
                     f"{money(ra['per_tps'])} for A at peak TPS: {abs(change):.1f} % {word} per TPS ({judged}; "
                     f"peak {rb['peak_tps']:,.0f} vs {ra['peak_tps']:,.0f} TPS; monthly {rb['monthly']:g} vs "
                     f"{ra['monthly']:g})")
    return lines


def _ok_tps(store: Store, sweep_id: int | None, run: RunRow) -> list[float | None]:
    """The TPS of every ok run of ``run``'s point."""
    return [r.metrics.get("tps") for r in store.runs(sweep_id) if r.point_id == run.point_id and r.status == "ok"]
