"""The capacity table: for each configuration of a capacity search (``capacity:`` in the plan), the highest rate that
held the latency target and the lowest that did not, read from the probe runs the search stored. It is the
search's own answer (:mod:`pglab.engine.capacity`: passing rates only rise, failing ones only fall), recomputed
from the store so that any report of the folder shows it."""

from __future__ import annotations

from typing import Any

from pglab.analysis.cost import plan_block
from pglab.plan.schema import Capacity
from pglab.store.sqlite import RunRow, Store


def capacity_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per configuration: its closed-loop TPS, the capacity (tx/s) and the rate above it that failed, the
    percentile at the capacity, and how many runs the search took."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    spec = plan_block(store, sweep_id, "capacity", Capacity) if sweep_id is not None else None
    if spec is None or sweep_id is None:
        return [], []
    key = f"latency_p{spec.percentile}_ms"
    groups: dict[str, list[RunRow]] = {}
    for run in store.runs(sweep_id):
        config = {k: v for k, v in run.axes.items() if k != "rate"}
        groups.setdefault(repr(sorted(config.items())), []).append(run)
    axes = [k for k in next(iter(groups.values()))[0].axes if k != "rate"] if groups else []
    rows = []
    for runs in groups.values():
        ok = [r for r in runs if r.status == "ok"]
        closed = next((r for r in ok if "rate" not in r.axes), None)
        held = {float(r.axes["rate"]): bool(spec.holds(r.metrics)) for r in ok if "rate" in r.axes}
        capacity = max((rate for rate, h in held.items() if h), default=None)
        above = [rate for rate, h in held.items() if not h and (capacity is None or rate > capacity)]
        at = next((r for r in ok if r.axes.get("rate") == capacity), None) if capacity is not None else None
        rows.append({**{k: runs[0].axes.get(k) for k in axes},
                     "closed_loop_tps": closed.metrics.get("tps") if closed else None,
                     "capacity_tps": capacity, "failed_at_tps": min(above, default=None),
                     f"p{spec.percentile}_at_capacity_ms": at.metrics.get(key) if at else None,
                     "target_ms": spec.target * 1000, "runs": len(runs)})
    columns = [*axes, "closed_loop_tps", "capacity_tps", "failed_at_tps", f"p{spec.percentile}_at_capacity_ms",
               "target_ms", "runs"]
    return columns, rows
