"""The scenarios table: per scenario and durability level, what the faults cost (RTO, acknowledged writes lost,
writes in doubt) and what the load saw before, during and after (TPS, latency) — medians and maxima over trials."""

from __future__ import annotations

import statistics
from collections import OrderedDict
from typing import Any

from pglab.store.sqlite import RunRow, Store

DURABILITY_ORDER = ("off", "local", "remote_write", "on", "remote_apply")
PROTECTED = ("remote_write", "on", "remote_apply")  # levels that promise an acknowledged commit is on a standby
COLUMNS = ["scenario", "workload", "clients", "synchronous_commit", "trials", "failed_runs", "rto_p50_s", "rto_max_s",
           "write_gap_max_s", "acked_lost_total", "acked_lost_max", "in_doubt", "in_doubt_survived",
           "lsn_gap_max_bytes", "clients_aborted", "tps_before", "tps_during", "tps_after", "latency_before_ms",
           "latency_during_ms", "latency_after_ms", "backup_s", "backup_mb_s", "finding"]
HEADERS = {"rto_p50_s": "RTO p50 s", "rto_max_s": "RTO max s", "write_gap_max_s": "write gap max s",
           "acked_lost_total": "acked lost", "acked_lost_max": "lost max/trial", "in_doubt": "in doubt",
           "in_doubt_survived": "in doubt kept", "lsn_gap_max_bytes": "LSN gap max B",
           "clients_aborted": "clients aborted", "tps_before": "tps before", "tps_during": "tps during",
           "tps_after": "tps after", "latency_before_ms": "lat before ms", "latency_during_ms": "lat during ms",
           "latency_after_ms": "lat after ms", "backup_s": "backup s", "backup_mb_s": "backup MB/s"}


def _values(runs: list[RunRow], metric: str) -> list[float]:
    return [v for r in runs if (v := r.metrics.get(metric)) is not None]


def _median(runs: list[RunRow], metric: str) -> float | None:
    values = _values(runs, metric)
    return statistics.median(values) if values else None


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
        rto = _values(ok, "rto_s") if str(scenario).startswith(("failover", "switchover", "standby")) else []
        row: dict[str, Any] = {
            "scenario": scenario, "workload": workload, "clients": clients, "synchronous_commit": level,
            "trials": len(ok), "failed_runs": len(group) - len(ok),
            "rto_p50_s": statistics.median(rto) if rto else None, "rto_max_s": max(rto) if rto else None,
            "write_gap_max_s": max(_values(ok, "write_gap_s"), default=None),
            "acked_lost_total": sum(lost) if lost else None, "acked_lost_max": max(lost) if lost else None,
            "in_doubt": sum(_values(ok, "in_doubt")) if _values(ok, "in_doubt") else None,
            "in_doubt_survived": sum(_values(ok, "in_doubt_survived")) if _values(ok, "in_doubt_survived") else None,
            "lsn_gap_max_bytes": max(_values(ok, "lsn_gap_bytes"), default=None),
            "clients_aborted": sum(_values(ok, "clients_aborted")) if _values(ok, "clients_aborted") else None,
            "finding": None,
        }
        for metric in ("tps_before", "tps_during", "tps_after", "latency_before_ms", "latency_during_ms",
                       "latency_after_ms", "backup_s", "backup_mb_s"):
            row[metric] = _median(ok, metric)
        if lost and sum(lost) > 0:
            row["finding"] = (f"LOST {sum(lost):g} acknowledged write(s) under synchronous_commit={level}"
                              if level in PROTECTED else f"{sum(lost):g} acknowledged write(s) lost (allowed at "
                              f"{level})")
        rows.append(row)
    columns = [c for c in COLUMNS if c in ("scenario", "synchronous_commit", "trials")
               or any(row.get(c) not in (None, 0) or (c.startswith("acked_lost") and row.get(c) is not None)
                      for row in rows)]
    return columns, rows


def loud_findings(rows: list[dict[str, Any]]) -> list[str]:
    """Acknowledged writes lost under a level that promised them: said apart from the table, not only in it."""
    return [f"FINDING: {r['scenario']}, {r['workload']} at {r['clients']} clients: {r['finding']}"
            for r in rows if r.get("finding", "") and str(r["finding"]).startswith("LOST")]
