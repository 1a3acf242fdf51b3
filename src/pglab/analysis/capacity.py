"""The capacity table: for each configuration of a capacity search (``capacity:`` in the plan), the highest rate that
held the latency target and the lowest that did not, read from the probe runs the search stored. It is the
search's own answer (:mod:`pglab.engine.capacity`: passing rates only rise, failing ones only fall; each rate judged
on the mean of its repeats), recomputed from the store so that any report of the folder shows it, with the interval
the repeats give (the highest rate that surely held, the lowest that surely failed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pglab.analysis.cost import plan_block
from pglab.engine.capacity import Answer, Verdict, judge, summarize
from pglab.plan.schema import Capacity
from pglab.store.sqlite import RunRow, Store


@dataclass(frozen=True)
class Search:
    """One configuration's search as stored: its axes (without the rate), the closed-loop run's verdict, each
    probed rate's, the answer, and the runs it took."""

    axes: dict[str, Any]
    closed: Verdict | None
    verdicts: dict[float, Verdict]  # rate → verdict, open-loop probes that ended ok
    answer: Answer
    runs: int
    repeats: int  # the most runs that ended ok at one rate


def searches(store: Store, sweep_id: int | None = None) -> tuple[Capacity | None, list[Search]]:
    """The plan's capacity block and each configuration's search (none without the block)."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    spec = plan_block(store, sweep_id, "capacity", Capacity) if sweep_id is not None else None
    if spec is None or sweep_id is None:
        return None, []
    keys = (f"latency_p{spec.percentile}_ms", "skipped_pct", "tps")
    groups: dict[str, list[RunRow]] = {}
    for run in store.runs(sweep_id):
        config = {k: v for k, v in run.axes.items() if k != "rate"}
        groups.setdefault(repr(sorted(config.items())), []).append(run)
    out = []
    for runs in groups.values():
        by_rate: dict[float | None, list[RunRow]] = {}
        for r in runs:
            if r.status == "ok":
                by_rate.setdefault(float(r.axes["rate"]) if "rate" in r.axes else None, []).append(r)
        judged = {rate: judge(spec, {k: [r.metrics.get(k) for r in ok] for k in keys}) for rate, ok in by_rate.items()}
        verdicts = {rate: v for rate, v in judged.items() if rate is not None and v is not None}
        axes = {k: v for k, v in runs[0].axes.items() if k != "rate"}
        out.append(Search(axes, judged.get(None), verdicts, summarize(verdicts), len(runs),
                          max((len(ok) for ok in by_rate.values()), default=0)))
    return spec, out


def capacity_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per configuration: its closed-loop TPS, the capacity (tx/s) and the rate above it that failed, the
    interval at the noise (with repeats), the percentile at the capacity, and how many runs the search took."""
    spec, found = searches(store, sweep_id)
    if spec is None or not found:
        return [], []
    pct = f"p{spec.percentile}_at_capacity_ms"
    rows = []
    for s in found:
        closed = s.closed.tps if s.closed else None
        at = s.verdicts.get(s.answer.capacity) if s.answer.capacity is not None else None
        rows.append({**s.axes,
                     "closed_loop_tps": closed.mean if closed else None,
                     "closed_loop_tps_ci95": closed.ci95 if closed else None,
                     "capacity_tps": s.answer.capacity, "failed_at_tps": s.answer.failing,
                     "capacity_low_tps": s.answer.low, "capacity_high_tps": s.answer.high,
                     pct: at.latency.mean if at else None, f"{pct}_ci95": at.latency.ci95 if at else None,
                     "target_ms": spec.target * 1000, "repeats": s.repeats, "runs": s.runs})
    columns = [*found[0].axes, "closed_loop_tps", "closed_loop_tps_ci95", "capacity_tps", "failed_at_tps",
               "capacity_low_tps", "capacity_high_tps", pct, f"{pct}_ci95", "target_ms", "repeats", "runs"]
    return columns, rows
