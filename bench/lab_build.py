"""The local lab's build alone, as a sweep's ``lab`` phase pays it: a 3-node lab (quorum ANY 1) whose dataset comes
from the dataset cache, built and torn down by each source tree given, the trees taking turns (issue 33 item 1:
the standbys' copies of the cached dataset side by side).

Why a bench of its own: in a sweep the build is one figure among the runs' (bench/duty_cycle.py), and on a shared
machine one figure a sweep is noise; here every round gives one build a tree, back to back.

    .venv/bin/python bench/lab_build.py --tree before=/tmp/before --tree after=. --rounds 8 --json out.json

The cache's entry for the scale must exist (a first build fills it: the first round is then a load, reported
apart). Each build is a fresh process (``python -c``) with the tree's ``src`` first on its path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BUILD = """
import json, os, sys, tempfile, time
from pathlib import Path
from pglab.plan.schema import Dataset, LocalTarget
from pglab.targets.local.cluster import LocalLab
base = Path(tempfile.mkdtemp(prefix="pglab-bench-build-"))
os.chmod(base, 0o711)
lines = []
t0 = time.monotonic()
def log(m):
    lines.append((round(time.monotonic() - t0, 3), m))
lab = LocalLab(LocalTarget(instances=3, synchronous={"method": "any", "number": 1}), base,
               dataset=Dataset(scale=int(sys.argv[1])), log=log)
try:
    lab.provision({"shared_buffers": "128MB", "max_wal_size": "1GB"})
    build = time.monotonic() - t0
    info = lab.describe()["dataset"]
finally:
    t1 = time.monotonic()
    lab.teardown()
    teardown = time.monotonic() - t1
    os.rmdir(base)
print(json.dumps({"build_s": build, "teardown_s": teardown, "hit": info.get("cache", {}).get("hit"), "log": lines}))
"""


def one(tree: Path, scale: int, python: str) -> dict[str, Any]:
    load = os.getloadavg()[0]
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    proc = subprocess.run([python, "-c", BUILD, str(scale)], env=env, capture_output=True, text=True, cwd=tree)
    if proc.returncode != 0:
        raise SystemExit(f"the build from {tree} failed: {proc.stderr[-2000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "load_before": load,
            "load_after": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR, a source tree with src/pglab")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trees = [(name, Path(d).resolve()) for name, _, d in (t.partition("=") for t in args.tree)]
    builds: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
    started = {"time": time.time(), "load": os.getloadavg()}
    for r in range(args.rounds):
        for name, tree in trees if r % 2 == 0 else list(reversed(trees)):  # neither tree always goes first
            b = one(tree, args.scale, sys.executable)
            builds[name].append(b)
            print(f"round {r + 1} {name}: build {b['build_s']:.2f} s (cache hit {b['hit']}), teardown "
                  f"{b['teardown_s']:.2f} s, load {b['load_before']:.1f} -> {b['load_after']:.1f}", flush=True)
    summary = {}
    for name, bs in builds.items():
        hits = [b["build_s"] for b in bs if b["hit"]]
        summary[name] = {"builds": len(hits), "median_s": statistics.median(hits) if hits else None,
                         "min_s": min(hits, default=None), "max_s": max(hits, default=None)}
        print(f"{name}: build from the cache, median {summary[name]['median_s']:.2f} s "
              f"({summary[name]['min_s']:.2f}-{summary[name]['max_s']:.2f}, {len(hits)} builds)")
    out = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "scale": args.scale,
           "started": started, "ended": {"time": time.time(), "load": os.getloadavg()},
           "trees": {name: str(tree) for name, tree in trees}, "summary": summary, "builds": builds}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
