"""The scenarios table: per scenario and durability level, what the faults cost (RTO, acknowledged writes lost,
writes in doubt) and what the load saw before, during and after (TPS, latency) — medians and maxima over trials."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from pglab import metrics
from pglab.store.sqlite import RunRow, Store

DURABILITY_ORDER = ("off", "local", "remote_write", "on", "remote_apply")
PROTECTED = ("remote_write", "on", "remote_apply")  # levels that promise an acknowledged commit is on a standby
RTO_SCENARIOS = ("failover", "switchover", "standby", "node")  # faults that move or fence an instance: an RTO
COLUMNS = ["scenario", "workload", "clients", "synchronous_commit", "trials", "failed_runs",
           *metrics.keys("scenarios"), "finding"]
HEADERS = metrics.headers("scenarios")


def _values(runs: list[RunRow], metric: str) -> list[float]:
    return [v for r in runs if (v := r.metrics.get(metric)) is not None]


def scenario_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per scenario × workload × clients × synchronous_commit (the durability matrix). Columns no run
    measured are left out."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    runs = [r for r in store.runs(sweep_id) if "scenario" in r.axes]
    if not runs:
        return [], []
    groups: OrderedDict[tuple[Any, ...], list[RunRow]] = OrderedDict()
    level_rank = {lv: i for i, lv in enumerate(DURABILITY_ORDER)}
    for r in sorted(runs, key=lambda r: (str(r.axes["scenario"]), str(r.axes.get("workload")),
                                         r.axes.get("clients") or 0,
                                         level_rank.get(str(r.axes.get("synchronous_commit")), 99))):
        key = (r.axes["scenario"], r.axes.get("workload"), r.axes.get("clients"), r.axes.get("synchronous_commit"))
        groups.setdefault(key, []).append(r)
    rows = []
    for (scenario, workload, clients, level), group in groups.items():
        ok = [r for r in group if r.status == "ok"]
        lost = _values(ok, "acked_lost")
        row: dict[str, Any] = {
            "scenario": scenario, "workload": workload, "clients": clients, "synchronous_commit": level,
            "trials": len(ok), "failed_runs": len(group) - len(ok),
        }
        for shown in metrics.columns("scenarios"):
            values = _values(ok, shown.metric.name)
            if shown.metric.name == "rto_s" and not str(scenario).startswith(RTO_SCENARIOS):
                values = []  # a fault that moves or fences no node (a backup) has no RTO
            row[shown.key] = metrics.combine(shown.how, values)
        row["finding"] = None
        if lost and sum(lost) > 0:
            row["finding"] = (f"LOST {sum(lost):g} acknowledged write(s) under synchronous_commit={level}"
                              if level in PROTECTED else f"{sum(lost):g} acknowledged write(s) lost (allowed at "
                              f"{level})")
        restore_lost = sum(_values(ok, "restore_lost"))
        if restore_lost > 0:  # the backup's restore check: an acknowledged write missing is lost whatever the level
            row["finding"] = "; ".join(filter(None, [row["finding"], f"LOST {restore_lost:g} acknowledged write(s) "
                                                     "in the Cluster recovered from the backup"]))
        rows.append(row)
    columns = [c for c in COLUMNS if c in ("scenario", "synchronous_commit", "trials")
               or any(row.get(c) not in (None, 0) or (c.startswith(("acked_lost", "restore_lost"))
                                                       and row.get(c) is not None)
                      for row in rows)]
    return columns, rows


def loud_findings(rows: list[dict[str, Any]]) -> list[str]:
    """Acknowledged writes lost under a level that promised them: said apart from the table, not only in it."""
    return [f"FINDING: {r['scenario']}, {r['workload']} at {r['clients']} clients: {r['finding']}"
            for r in rows if "LOST " in str(r.get("finding") or "")]
