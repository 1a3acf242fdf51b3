"""A scenario's figures, the same on every target: the witness's verdict and TPS/latency around the fault."""

from __future__ import annotations

from pathlib import Path

from pglab.scenarios.witness import WitnessResult
from pglab.workloads import pgbench, txlog


def witness_metrics(w: WitnessResult) -> dict[str, float | None]:
    """The witness's verdict as run metrics (RPO: acked_lost; RTO: rto_s)."""
    return {"witness_attempts": float(w.attempts), "witness_acked": float(w.acked),
            "witness_failed": float(w.failed), "in_doubt": float(w.in_doubt),
            "acked_lost": float(w.acked_lost), "in_doubt_survived": float(len(w.in_doubt_survived)),
            "witness_unexpected": float(len(w.unexpected)), "rto_s": w.rto_s, "write_gap_s": w.gap_s,
            "lsn_gap_bytes": float(w.lsn_gap_bytes) if w.lsn_gap_bytes is not None else None}


def fault_phases(start: float, fault: float, back: float | None,
                 end: float) -> tuple[list[tuple[str, float, float]], str | None]:
    """Before, during and after a fault, each clipped to the load's window [start, end). A recovery (a failover,
    a backup's end) that came after the load had ended leaves no "after" phase: no TPS is known there, which is not
    0 TPS. The second value says so in one sentence, or is None."""
    if back is not None and back < end:
        return [("before", start, fault), ("during", fault, back), ("after", back, end)], None
    if back is None:
        return [("before", start, fault), ("during", fault, end)], None
    return [("before", start, fault), ("during", fault, end)], (
        f"the fault's recovery came {back - end:.1f} s after the load ended: no TPS after it (a longer "
        "run.duration, or an earlier scenario `at`, measures it)")


def phase_metrics(log_files: list[Path], sampling_rate: float,
                  phases: list[tuple[str, float, float]]) -> dict[str, float | None]:
    """``tps_<phase>`` and ``latency_<phase>_ms`` for each (phase, start, end), from pgbench's -l logs (scaled
    back up when only a sample of the transactions was logged). The logs may be gzip-compressed already."""
    log = txlog.read(log_files)
    end_ts = log.end_ts()
    scale = 1.0 / sampling_rate
    out: dict[str, float | None] = {}
    for phase, a, b in phases:
        tps, latency = pgbench.phase_stats(log.latency_us, end_ts, a, b, scale=1000.0)
        out[f"tps_{phase}"], out[f"latency_{phase}_ms"] = tps * scale, latency
    return out
