"""Summarising pgbench's per-transaction logs: pglab's log summary against polars reading the same file.

Generates a synthetic log in pgbench's exact -l format (``client_id transaction_no time script_no time_epoch
time_us [schedule_lag] [retries]``, with some ``failed`` and ``skipped`` lines), then times each reader in its
own subprocess: wall time once its modules are imported (``read_s``: what a pglab run, which has them imported,
waits for), wall time with the imports (``wall_s``) and peak RSS (``ru_maxrss``), the readers alternating (their
order rotated each round), medians over the rounds.

- ``summary``: what ``pgbench.summarise_logs`` does before compressing (``pgbench.log_figures``: the figures and
  the latency histogram, no transaction kept);
- ``read``: ``txlog.read`` then the histogram and ``txlog_stats`` (the Kubernetes driver's way, which keeps the
  transactions for its windowed figures);
- ``before`` / ``before_read``: ``summary`` / ``read`` from another checkout's ``src`` (``--before DIR``), e.g. the
  commit before a change;
- ``polars_3_columns`` / ``polars_all_columns``: ``polars.read_csv`` of the file (its three columns pglab needs,
  or all of them), nothing computed: the target;
- ``polars_streaming``: ``polars.scan_csv`` of the file, the three columns taken batch by batch by polars'
  streaming engine (``collect_batches``), nothing computed (``--streaming``): whether polars itself, streaming,
  would fit in the memory target;
- ``former``: the line-by-line reader pglab had first (``--former``; ~17 s for 10 M lines).

Every pglab reader must give the same count and percentiles (asserted).

    mkdir -p before && git archive <commit> src | tar -x -C before
    PYTHONPATH=src python bench/txlog.py --lines 10000000 --rounds 5 [--before before/src] [--former]

A commit with the compiled scanner (bd2cae1 on) needs it built in the extracted tree: archive the whole tree, then
``python setup.py build_ext --inplace`` there with Cython and setuptools installed (src/ alone imports nothing).

A log with no failed or skipped line (most runs' logs), timed as it is (no .gz step):

    PYTHONPATH=src python bench/txlog.py --generate before/clean.log --lines 10000000 --no-failed
    PYTHONPATH=src python bench/txlog.py --log before/clean.log --rounds 5 --before before/src [--streaming]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np


def generate(path: Path, lines: int, seed: int = 1, lag: bool = True, retries: bool = True,
             failed: bool = True) -> None:
    """A pgbench -l log: 64 clients, ~170 k TPS, lognormal latencies, 0.1 % failed, 0.1 % skipped (or none)."""
    rng = np.random.default_rng(seed)
    block = 1_000_000
    t0 = 1_763_900_000.0
    with open(path, "w") as f:
        for first in range(0, lines, block):
            n = min(block, lines - first)
            i = np.arange(first, first + n)
            lat = np.maximum(1, rng.lognormal(np.log(350), 0.6, n)).astype(np.int64)
            end_us = ((t0 + i / 170_000.0) * 1e6).astype(np.int64)
            kind = rng.random(n)
            time = lat.astype(str).astype(object)
            if failed:
                time[kind < 0.001] = "failed"
                time[(kind >= 0.001) & (kind < 0.002)] = "skipped"
            cols = [(i % 64).astype(str), (i // 64).astype(str), time.astype(str), np.zeros(n, int).astype(str),
                    (end_us // 1_000_000).astype(str), (end_us % 1_000_000).astype(str)]
            if lag:
                cols.append(rng.integers(0, 900, n).astype(str))
            if retries:
                cols.append(rng.integers(0, 2, n).astype(str))
            rows = cols[0]
            for c in cols[1:]:
                rows = np.char.add(np.char.add(rows, " "), c)
            f.write("\n".join(rows.tolist()))
            f.write("\n")


OLD = """
import sys, time, resource
from pathlib import Path
import numpy as np
t = i = time.perf_counter()
c = time.process_time()
lat, end = [], []
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 6 or not parts[2].isdigit():
                continue
            lat.append(int(parts[2]))
            end.append(int(parts[4]) + int(parts[5]) / 1e6)
lat, end = np.asarray(lat, dtype=np.float64) / 1000.0, np.asarray(end, dtype=np.float64)
p = np.percentile(lat, (50, 95, 99))
first = float((end - lat / 1000.0).min())
print(time.perf_counter() - t, time.perf_counter() - i, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      time.process_time() - c,
      lat.size, *p)
"""

READ = """
import sys, time, resource
from pathlib import Path
t = time.perf_counter()
from pglab.workloads import txlog
from pglab.workloads.pgbench import txlog_stats
i = time.perf_counter()
c = time.process_time()
log = txlog.read([Path(a) for a in sys.argv[1:]])
n = log.count
h = txlog.LatencyHistogram.of(log.latency_us)
p = txlog_stats(log, last_use=True).percentiles_ms.values()
print(time.perf_counter() - t, time.perf_counter() - i, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      time.process_time() - c,
      n, *p)
"""

SUMMARY = """
import sys, time, resource, tempfile
from pathlib import Path
t = time.perf_counter()
from pglab.workloads import pgbench
i = time.perf_counter()
c = time.process_time()
with tempfile.TemporaryDirectory() as tmp:
    s = pgbench.log_figures([Path(a) for a in sys.argv[1:]], Path(tmp) / "latency_histogram.json")
print(time.perf_counter() - t, time.perf_counter() - i, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      time.process_time() - c,
      s.count, *s.percentiles_ms.values())
"""

POLARS = """
import sys, time, resource
t = time.perf_counter()
import polars as pl
i = time.perf_counter()
c = time.process_time()
df = pl.concat([pl.read_csv(a, separator=" ", has_header=False, null_values=["failed", "skipped"],
                            columns=COLUMNS) for a in sys.argv[1:]])
print(time.perf_counter() - t, time.perf_counter() - i, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      time.process_time() - c,
      df.height)
"""

POLARS_STREAMING = """
import sys, time, resource
t = time.perf_counter()
import polars as pl
i = time.perf_counter()
c = time.process_time()
n = 0
for a in sys.argv[1:]:
    lf = pl.scan_csv(a, separator=" ", has_header=False, null_values=["failed", "skipped"]).select(pl.nth(2, 4, 5))
    for df in lf.collect_batches():
        n += df.height
print(time.perf_counter() - t, time.perf_counter() - i, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      time.process_time() - c,
      n)
"""

BASE = """
import resource
import numpy
from pglab.workloads import pgbench, txlog
print(0, 0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0, 0, 0, 0, 0)
"""


class Run(NamedTuple):
    wall_s: float  # imports included
    read_s: float  # once imported: what a pglab run, which has them imported, waits for
    rss_mb: float
    cpu_s: float  # CPU time of the process once imported (all its threads)
    transactions: int
    percentiles: list[float]


def run(code: str, files: list[Path], src: Path | None = None) -> Run:
    env = dict(os.environ, PYTHONPATH=str(src)) if src else None
    out = subprocess.run([sys.executable, "-c", code, *map(str, files)], check=True, capture_output=True,
                         text=True, env=env).stdout.split()
    return Run(float(out[0]), float(out[1]), float(out[2]), float(out[3]), int(out[4]), [float(x) for x in out[5:]])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--before", type=Path, default=None, help="another checkout's src: its summary and read")
    ap.add_argument("--former", action="store_true", help="also the line-by-line reader (slow)")
    ap.add_argument("--generate", type=Path, default=None, help="only write a log of --lines lines there")
    ap.add_argument("--no-failed", action="store_true", help="with --generate: no failed or skipped line")
    ap.add_argument("--streaming", action="store_true",
                    help="also polars' streaming engine over the file, batch by batch, nothing computed")
    ap.add_argument("--log", type=Path, default=None, help="time these readers on this log (no .gz step)")
    args = ap.parse_args()
    if args.generate:
        generate(args.generate, args.lines, failed=not args.no_failed)
        return
    readers: dict[str, tuple[str, Path | None]] = {
        "summary": (SUMMARY, None), "read": (READ, None),
        "polars_3_columns": (POLARS.replace("COLUMNS", "[2, 4, 5]"), None),
        "polars_all_columns": (POLARS.replace("COLUMNS", "None"), None)}
    if args.before:
        readers["before"] = (SUMMARY, args.before.resolve())
        readers["before_read"] = (READ, args.before.resolve())
    if args.former:
        readers["former"] = (OLD, None)
    if args.streaming:
        readers["polars_streaming"] = (POLARS_STREAMING, None)
    results: dict[str, list[Run]] = {name: [] for name in readers}

    def rounds(log: Path) -> None:
        names = list(readers)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                code, src = readers[name]
                results[name].append(run(code, [log], src))

    def medians() -> dict[str, dict[str, float]]:
        return {k: {f: statistics.median(getattr(x, f) for x in v) for f in ("read_s", "wall_s", "rss_mb", "cpu_s")}
                for k, v in results.items()}

    load_before = os.getloadavg()
    if args.log:
        rounds(args.log)
        med = medians()
        polars = med["polars_3_columns"]
        print(json.dumps({"log_bytes": args.log.stat().st_size, "rounds": args.rounds, "median": med,
                          "read_over_polars_3_columns": {k: v["read_s"] / polars["read_s"] for k, v in med.items()},
                          "cpu_over_polars_3_columns": {k: v["cpu_s"] / polars["cpu_s"] for k, v in med.items()},
                          "loadavg_1_5_15_before_after": [load_before, os.getloadavg()], "nproc": os.cpu_count(),
                          "figures": {k: (v[-1].transactions, v[-1].percentiles) for k, v in results.items()},
                          "all_runs": {k: [x._asdict() for x in v] for k, v in results.items()}}, indent=1))
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        log = Path(tmp) / "pgbench_log.4242"
        # in a child, so that the children timed below do not inherit this one's peak RSS (fork keeps ru_maxrss)
        subprocess.run([sys.executable, __file__, "--generate", str(log), "--lines", str(args.lines)], check=True)
        size = log.stat().st_size
        rounds(log)
        base = run(BASE, []).rss_mb
        gz = Path(tmp) / "gz" / log.name
        gz.parent.mkdir()
        log.rename(gz)
        from pglab.workloads import txlog
        t = time.perf_counter()
        (packed,) = txlog.compress([gz])
        compress_s = time.perf_counter() - t
        from_gz = run(SUMMARY, [packed])
        gz_size = packed.stat().st_size
    figures = {k: (v[-1].transactions, v[-1].percentiles) for k, v in results.items()}
    assert all(figures[k] == (from_gz.transactions, from_gz.percentiles) for k in readers if not k.startswith("polars"))
    assert figures["polars_3_columns"][0] == figures["polars_all_columns"][0] == args.lines
    med = medians()
    polars = med["polars_3_columns"]
    print(json.dumps({"lines": args.lines, "bytes": size, "rounds": args.rounds, "transactions": from_gz.transactions,
                      "percentiles_ms": from_gz.percentiles, "median": med,
                      "read_over_polars_3_columns": {k: v["read_s"] / polars["read_s"] for k, v in med.items()},
                      "wall_over_polars_3_columns": {k: v["wall_s"] / polars["wall_s"] for k, v in med.items()},
                      "cpu_over_polars_3_columns": {k: v["cpu_s"] / polars["cpu_s"] for k, v in med.items()},
                      "loadavg_1_5_15_before_after": [load_before, os.getloadavg()], "nproc": os.cpu_count(),
                      "interpreter_numpy_rss_mb": base, "gzip_level1_s": compress_s, "gz_bytes": gz_size,
                      "summary_from_gz": from_gz._asdict(),
                      "all_runs": {k: [x._asdict() for x in v] for k, v in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
