"""pgbench's files as a pod shipped them back (pgbench.out, pgbench.err, the -l logs), read into one run's figures:
one pod (warm-up and window in one pgbench, or a scenario's segments), or several load pods whose window is the time
they all ran together. The parsing is :mod:`pglab.workloads.pgbench`'s, as for a local run."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pglab.artifacts import write_json
from pglab.plan.schema import Run
from pglab.workloads import txlog
from pglab.workloads.pgbench import (
    _ABORTED,
    PgbenchError,
    PgbenchRun,
    PgbenchSummary,
    limit_shares,
    parse_progress_line,
    parse_summary,
    pgbench_series,
    txlog_stats,
)

TXN_LOG = re.compile(r"^pgbench\.\d+(\.\d+)?(\.gz)?$")  # -l --log-prefix=/results/pgbench: pgbench.<pid>[.<thread>]
# (.gz once summarised)


def one_pod(run_dir: Path, job: str, command: list[str], run: Run, scenario: bool, launched: float,
            ended: float) -> tuple[PgbenchRun, dict[str, float | None], float | None]:
    """The run's figures from the files the pod shipped: pgbench.out, pgbench.err (progress), the -l logs.

    pgbench ran warm-up and measured window in one process (the Job's -T is their sum), so with a warm-up the
    window starts ``warmup`` seconds after the first transaction began, and its TPS, latency and percentiles
    are recomputed from the per-transaction log of that window; pgbench's own whole-run TPS is kept beside
    (``tps_with_warmup``). Without a warm-up the figures are pgbench's own lines, as on a local lab."""
    out_file = run_dir / "pgbench.out"
    if not out_file.is_file():
        raise PgbenchError(f"Job/{job} shipped no pgbench.out")
    later = sorted((f.with_suffix("") for f in run_dir.glob("pgbench-*.out")), key=lambda f: int(f.name[8:]))
    segments = [run_dir / "pgbench", *later]
    extra: dict[str, float | None] = {}
    if scenario:  # pgbench started again after the fault ended it: one summary per segment that ran
        summaries = []
        for seg in segments:
            with contextlib.suppress(PgbenchError):
                summaries.append(parse_summary(seg.with_suffix(".out").read_text(errors="replace")))
        if not summaries:
            raise PgbenchError(f"pgbench never ran through the scenario in Job/{job} (see pgbench*.err)")
        summary = summaries[0]
        errs = [seg.with_suffix(".err") for seg in segments if seg.with_suffix(".err").is_file()]
        extra["pgbench_starts"] = float(len(segments))
        extra["clients_aborted"] = float(sum(len(_ABORTED.findall(f.read_text(errors="replace")))
                                             for f in errs))
    else:
        summary = parse_summary(out_file.read_text(errors="replace"))
        errs = [run_dir / "pgbench.err"] if (run_dir / "pgbench.err").is_file() else []
    err_text = "".join(f.read_text(errors="replace") for f in errs)
    progress = [p for line in err_text.splitlines() if (p := parse_progress_line(line)) is not None]
    log_files = sorted(f for f in run_dir.iterdir() if TXN_LOG.match(f.name))
    log = txlog.read(log_files)
    if log.count:
        first, last = txlog.first_start(log), log.last_end()
    elif progress:
        first, last = progress[0].ts - 1.0, progress[-1].ts
    else:
        first, last = launched, ended
    warmup = run.warmup if run.measured_seconds is not None else 0.0
    warmup_start = None
    if warmup > 0 or scenario:  # no one pgbench line covers a scenario's segments: recomputed from the log
        start = first + warmup
        log = log.select(log.end_ts() >= start)
        lat = log.latency_ms
        if lat.size == 0 or last <= start:
            raise PgbenchError(f"no transaction ended after the {warmup:g} s warm-up (pgbench.out: "
                               f"{summary.transactions} transactions in all)")
        scale = 1.0 / run.sampling_rate
        if warmup > 0:
            extra["tps_with_warmup"] = summary.tps
        summary = PgbenchSummary(
            tps=lat.size * scale / (last - start), latency_avg_ms=float(lat.mean()),
            latency_stddev_ms=float(lat.std()), initial_connection_ms=summary.initial_connection_ms,
            transactions=round(lat.size * scale),
            failed=round(int((log.failed_end_ts >= start).sum()) * scale), duration_s=last - start)
        del lat
        warmup_start, first = (first, start) if warmup > 0 else (None, start)
    if log.count:  # the window's latencies, mergeable across repeats without the logs
        txlog.LatencyHistogram.of(log.latency_us).save(run_dir / txlog.HISTOGRAM_FILE)
    stats = txlog_stats(log, last_use=True)
    del log
    log_files = txlog.compress(log_files)
    return PgbenchRun(summary, stats, progress, first, last, command, 0, log_files), extra, warmup_start


def load_pods(run_dir: Path, job: str, command: list[str], run: Run, shares: list[tuple[int, int]],
              pods_of: Callable[[int], tuple[str | None, str | None]], load_dir: str
              ) -> tuple[PgbenchRun, dict[str, float | None], float | None, dict[str, Any],
                         list[tuple[float, str, str, float | None]]]:
    """One run's figures from its load pods' files (load-<i>/): the common window is from the last pod's first
    transaction start (plus the warm-up) to the first pod's last transaction end, when every pod was loading;
    TPS counts every pod's transactions that ended inside it; latency mean and exact percentiles are those of
    the merged logs' transactions of the window, and the merged histogram (each pod's, added) is kept as the
    run's. Each pod's pgbench.out, progress (pgbench.err), logs and histogram stay in its folder."""
    pods = []
    for index in range(run.load_pods):
        d = run_dir / load_dir.format(index=index)
        out = d / "pgbench.out"
        if not out.is_file():
            raise PgbenchError(f"load pod {index} of Job/{job} shipped no pgbench.out")
        summary = parse_summary(out.read_text(errors="replace"))
        err = d / "pgbench.err"
        progress = [p for line in (err.read_text(errors="replace") if err.is_file() else "").splitlines()
                    if (p := parse_progress_line(line)) is not None]
        files = sorted(f for f in d.iterdir() if TXN_LOG.match(f.name))
        log = txlog.read(files)
        if not log.count:
            raise PgbenchError(f"load pod {index} of Job/{job} logged no transaction")
        pods.append((d, summary, progress, files, log, txlog.first_start(log), log.last_end()))
    begun = max(p[5] for p in pods)
    start, end = begun + (run.warmup if run.measured_seconds is not None else 0.0), min(p[6] for p in pods)
    if end <= start:
        raise PgbenchError(f"the load pods of Job/{job} never ran together (the last started at {begun:.3f}, "
                           f"the first ended at {end:.3f}{f', warm-up {run.warmup:g} s' if run.warmup else ''})")
    scale = 1.0 / run.sampling_rate
    selected, histogram, per_pod = [], txlog.LatencyHistogram({}, 0, 0), []
    failed = 0
    for index, (d, summary, _, _, log, first, last) in enumerate(pods):
        ends = log.end_ts()
        sel = log.select((ends >= start) & (ends <= end))
        del ends
        mine = txlog.LatencyHistogram.of(sel.latency_us)
        mine.save(d / txlog.HISTOGRAM_FILE)
        histogram = histogram.merge(mine)
        failed += int(((log.failed_end_ts >= start) & (log.failed_end_ts <= end)).sum())
        selected.append(sel)
        pod_name, node = pods_of(index)
        per_pod.append({"index": index, "pod": pod_name, "node": node, "clients": shares[index][0],
                        "threads": shares[index][1], "first_start": first, "last_end": last,
                        "transactions_in_window": round(sel.count * scale), "pgbench_tps": summary.tps})
    histogram.save(run_dir / txlog.HISTOGRAM_FILE)
    merged = txlog.concat(selected)
    del selected
    lat = merged.latency_ms
    connect = [p[1].initial_connection_ms for p in pods if p[1].initial_connection_ms is not None]
    summary = PgbenchSummary(
        tps=merged.count * scale / (end - start), latency_avg_ms=float(lat.mean()) if lat.size else None,
        latency_stddev_ms=float(lat.std()) if lat.size else None,
        initial_connection_ms=max(connect) if connect else None, transactions=round(merged.count * scale),
        failed=round(failed * scale), duration_s=end - start)
    del lat
    series = per_second(merged, start, end, scale)
    for index, pod in enumerate(pods):
        series += pgbench_series(PgbenchRun(pod[1], None, pod[2], pod[5], pod[6], [], 0), f"pgbench:{index}")
    stats = txlog_stats(merged, last_use=True)
    del merged
    files = [f for p in pods for f in txlog.compress(p[3])]
    extra: dict[str, float | None] = {"load_pods": float(run.load_pods), "load_start_skew_s":
                                      max(p[5] for p in pods) - min(p[5] for p in pods)}
    summary.schedule_lag_ms, summary.schedule_lag_max_ms = _merged_lag([p[1] for p in pods])
    extra.update(_merged_limit_shares([p[1] for p in pods]))
    info = {"pods": run.load_pods, "window": [start, end], "start_skew_s": extra["load_start_skew_s"],
            "nodes": len({p["node"] for p in per_pod if p["node"]}), "per_pod": per_pod}
    write_json(run_dir / "load.json", info)
    warmup_start = begun if start > begun else None
    return PgbenchRun(summary, stats, [], start, end, command, 0, files), extra, warmup_start, info, series


def _merged_lag(summaries: list[PgbenchSummary]) -> tuple[float | None, float | None]:
    """With a rate (each pod's pgbench kept the schedule of its share): the mean schedule lag of all the pods'
    transactions (each pod's average weighted by the transactions it processed) and the largest; None without."""
    if not summaries or any(s.schedule_lag_ms is None for s in summaries):
        return None, None
    processed = sum(s.transactions for s in summaries)
    mean = sum((s.schedule_lag_ms or 0.0) * s.transactions for s in summaries) / processed if processed else None
    return mean, max(s.schedule_lag_max_ms or 0.0 for s in summaries)


def _merged_limit_shares(summaries: list[PgbenchSummary]) -> dict[str, float | None]:
    """With a latency limit: the skipped and late shares of the pods' counts added (over each pgbench's whole run,
    as one pgbench's are), not of the merged window's transactions, which are fewer than the pods processed."""
    counted = bool(summaries)
    skipped = sum(s.skipped or 0 for s in summaries) if counted and all(s.skipped is not None for s in summaries) \
        else None
    late = sum(s.late or 0 for s in summaries) if counted and all(s.late is not None for s in summaries) else None
    return limit_shares(sum(s.transactions for s in summaries), skipped, late)


def per_second(log: txlog.TxLog, start: float, end: float,
                scale: float) -> list[tuple[float, str, str, float | None]]:
    """The merged load's per-second series (source ``pgbench``, as one pgbench's progress): transactions that
    ended in each whole second from ``start`` (TPS, mean latency); a last partial second is left out."""
    if not log.count:
        return []
    ends = log.end_ts()
    bins = np.floor(ends - start).astype(np.int64)
    seconds = math.floor(end - start)
    keep = (bins >= 0) & (bins < seconds)
    counts = np.bincount(bins[keep], minlength=seconds)
    sums = np.bincount(bins[keep], weights=log.latency_ms[keep], minlength=seconds)
    out: list[tuple[float, str, str, float | None]] = []
    for i in range(seconds):
        ts = start + i + 1
        out.append((ts, "pgbench", "tps", float(counts[i]) * scale))
        out.append((ts, "pgbench", "latency_ms", float(sums[i] / counts[i]) if counts[i] else None))
    return out
