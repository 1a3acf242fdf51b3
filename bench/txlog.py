"""Summarising pgbench's per-transaction logs: the former line-by-line reader against pglab.workloads.txlog.

Generates a synthetic log in pgbench's exact -l format (``client_id transaction_no time script_no time_epoch
time_us [schedule_lag] [retries]``, with some ``failed`` and ``skipped`` lines), then times each reader
(read + percentiles) in its own subprocess: wall time and peak RSS (``ru_maxrss``), old and new alternating in
the same run, medians over the repeats.

    PYTHONPATH=src python bench/txlog.py --lines 10000000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def generate(path: Path, lines: int, seed: int = 1, lag: bool = True, retries: bool = True) -> None:
    """A pgbench -l log: 64 clients, ~170 k TPS, lognormal latencies, 0.1 % failed, 0.1 % skipped."""
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
t = time.perf_counter()
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
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, lat.size, *p)
"""

NEW = """
import sys, time, resource
from pathlib import Path
t = time.perf_counter()
from pglab.workloads import txlog
from pglab.workloads.pgbench import txlog_stats
log = txlog.read([Path(a) for a in sys.argv[1:]])
n = log.count
h = txlog.LatencyHistogram.of(log.latency_us)
p = txlog_stats(log, last_use=True).percentiles_ms.values()  # what pgbench.summarise_logs does
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, n, *p)
"""

BASE = """
import resource
import numpy
from pglab.workloads import pgbench, txlog
print(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0, 0, 0, 0)
"""


def run(code: str, files: list[Path]) -> tuple[float, float, int, list[float]]:
    out = subprocess.run([sys.executable, "-c", code, *map(str, files)], check=True, capture_output=True,
                         text=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2]), [float(x) for x in out[3:]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--generate", type=Path, default=None, help="only write a log of --lines lines there")
    args = ap.parse_args()
    if args.generate:
        generate(args.generate, args.lines)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        log = Path(tmp) / "pgbench_log.4242"
        # in a child, so that the children timed below do not inherit this one's peak RSS (fork keeps ru_maxrss)
        subprocess.run([sys.executable, __file__, "--generate", str(log), "--lines", str(args.lines)], check=True)
        size = log.stat().st_size
        results: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        figures = {}
        for _ in range(args.repeats):
            for name, code in (("old", OLD), ("new", NEW)):
                wall, rss, n, pct = run(code, [log])
                results[name].append((wall, rss))
                figures[name] = (n, pct)
        base = run(BASE, [])[1]
        gz = Path(tmp) / "gz" / log.name
        gz.parent.mkdir()
        log.rename(gz)
        import time

        from pglab.workloads import txlog
        t = time.perf_counter()
        (packed,) = txlog.compress([gz])
        compress_s = time.perf_counter() - t
        gz_wall, gz_rss, gz_n, gz_pct = run(NEW, [packed])
        gz_size = packed.stat().st_size
    assert figures["old"] == figures["new"] == (gz_n, gz_pct), (figures, gz_n, gz_pct)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(r for _, r in v)) for k, v in results.items()}
    print(json.dumps({"lines": args.lines, "bytes": size, "repeats": args.repeats, "transactions": figures["new"][0],
                      "old_wall_s": med["old"][0], "old_peak_rss_mb": med["old"][1],
                      "new_wall_s": med["new"][0], "new_peak_rss_mb": med["new"][1],
                      "wall_ratio": med["old"][0] / med["new"][0], "rss_ratio": med["old"][1] / med["new"][1],
                      "interpreter_numpy_rss_mb": base, "gzip_level1_s": compress_s,
                      "gz_bytes": gz_size,
                      "new_from_gz_wall_s": gz_wall, "new_from_gz_peak_rss_mb": gz_rss,
                      "all_runs": results}, indent=1))


if __name__ == "__main__":
    main()
