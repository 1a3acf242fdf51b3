"""The dataset cache: a lab whose dataset comes from the cache against ``pgbench -i`` and a fresh first load.

Why: every ``pglab run`` loaded its dataset again. The target (issue "Speed where users wait", item 1): a cached
dataset ready **≥ 20× faster than ``pgbench -i -s 100``**.

How: ``--repeats`` rounds, the order of the arms rotating from round to round; each arm builds a one-instance
lab with pglab's own settings (``LocalLab``), times it, and tears it down:

- ``pgbench -i``: an empty lab, then ``pgbench -i -q -s N`` into it (plain: pgbench's default steps). Timed: the
  pgbench command (the reference), and the lab build before it;
- ``miss``: a lab with ``dataset: {scale: N}`` and an empty cache: initdb, the fast load, the snapshot into the
  cache (what the first run of a key pays); the entry is then removed again so that every round misses;
- ``hit``: the same lab with the entry in the cache: the entry checked (key, control file, files), restored
  into the lab's data and WAL directories (reflink where the filesystem can, else ``copy_file_range``), fsynced,
  and the primary started. Timed: the dataset part (check + restore, from the lab's own record) and the whole
  lab build (``provision``), which adds the lab's directories, secrets and the server's start.

The ratio of the target is ``pgbench -i`` / the hit's dataset part; the whole builds are given beside it.

    PYTHONPATH=src .venv/bin/python bench/dataset_cache.py                     # scale 100, 3 rounds
    PYTHONPATH=src .venv/bin/python bench/dataset_cache.py --scale 10 --repeats 5 --cache-dir /mnt/x/cache
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pglab.plan.schema import Dataset, LabPaths, LocalTarget
from pglab.targets.local import dataset as df
from pglab.targets.local.cluster import LocalLab
from pglab.targets.local.dataset import cache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataset import machine

TARGET = 20.0
HERE = Path(__file__).resolve().parent
LOADAVG_START = os.getloadavg()


@dataclass
class Timing:
    arm: str
    round: int
    seconds: float  # the figure the ratio uses: pgbench's command, or the dataset part of a lab build
    build_s: float  # the whole lab build (for pgbench -i: the empty lab's build plus pgbench)
    info: dict[str, Any] = field(default_factory=dict)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        self.root = args.cache_dir or work / "cache"
        os.environ["PGLAB_CACHE"] = "on"
        os.environ["PGLAB_CACHE_DIR"] = str(self.root)
        os.environ["PGLAB_CACHE_SIZE"] = "1TiB"  # the bench's own folder: no eviction in the way
        self.dataset = Dataset(scale=args.scale, partitions=args.partitions)
        self.bases: list[Path] = []

    def _lab(self, dataset: Dataset | None) -> LocalLab:
        base = Path(tempfile.mkdtemp(prefix="lab-", dir=self.args.lab_dir or self.work))
        os.chmod(base, 0o711)
        self.bases.append(base)  # removed at the end (the lab removes only its own folder)
        return LocalLab(LocalTarget(instances=1, synchronous=None, paths=LabPaths(lab=str(base / "lab"))),
                        base, dataset=dataset)

    def _settle(self) -> None:
        subprocess.run(["sync"], check=False)  # the previous arm's writeback not in this arm's time

    def pgbench_init(self, rnd: int) -> Timing:
        self._settle()
        lab = self._lab(None)
        try:
            t0 = time.monotonic()
            endpoints = lab.provision({})
            built = time.monotonic() - t0
            env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | endpoints.primary.env()
            argv = [str(lab.bindir / "pgbench"), "-i", "-q", "-s", str(self.args.scale)]
            argv += [f"--partitions={self.args.partitions}"] if self.args.partitions else []
            t = time.monotonic()
            subprocess.run(argv, env=env, check=True, capture_output=True)
            seconds = time.monotonic() - t
        finally:
            lab.teardown()
        return Timing("pgbench -i", rnd, seconds, built + seconds, {"empty_lab_build_s": built})

    def _build(self, arm: str, rnd: int) -> Timing:
        self._settle()
        lab = self._lab(self.dataset)
        try:
            t0 = time.monotonic()
            lab.provision({})
            build = time.monotonic() - t0
            info = dict(lab.describe()["dataset"])
        finally:
            lab.teardown()
        c = info["cache"]
        assert c["hit"] is (arm == "hit"), c  # the arm measured what it says
        if arm == "hit":
            return Timing(arm, rnd, c["lookup_s"] + c["restore_s"], build, info)
        assert c.get("stored"), c
        return Timing(arm, rnd, info["total_s"], build, info)

    def miss(self, rnd: int) -> Timing:
        self._clear()
        timing = self._build("miss", rnd)
        return timing

    def hit(self, rnd: int) -> Timing:
        if not cache.DatasetCache(self.root).entries():
            self._build("miss", 0)  # untimed: the entry the hit needs
        return self._build("hit", rnd)

    def _clear(self) -> None:
        c = cache.DatasetCache(self.root)
        for e in c.entries():
            assert c.remove(e.name), e.name


def report(args: argparse.Namespace, bench: Bench, timings: list[Timing], started: float) -> dict[str, Any]:
    arms = list(dict.fromkeys(t.arm for t in timings))
    med = {a: statistics.median(t.seconds for t in timings if t.arm == a) for a in arms}
    med_build = {a: statistics.median(t.build_s for t in timings if t.arm == a) for a in arms}
    print()
    print(f"scale {args.scale}{f', {args.partitions} partitions' if args.partitions else ''}, {args.repeats} rounds; "
          "medians (min … max) in seconds")
    for a in arms:
        vals = [t.seconds for t in timings if t.arm == a]
        print(f"  {a:12} dataset {med[a]:8.2f}   ({min(vals):.2f} … {max(vals):.2f})   whole build "
              f"{med_build[a]:8.2f}")
    ratios = {}
    if "pgbench -i" in med and "hit" in med:
        ratios["pgbench -i / hit (dataset)"] = med["pgbench -i"] / med["hit"]
        ratios["empty lab + pgbench -i / hit (whole lab build)"] = med_build["pgbench -i"] / med_build["hit"]
    if "miss" in med and "hit" in med:
        ratios["miss / hit (whole lab build)"] = med_build["miss"] / med_build["hit"]
    print()
    for name, r in ratios.items():
        print(f"  {name:48} {r:6.2f}×" + (f"   target ≥ {TARGET:g}×: {'met' if r >= TARGET else 'NOT met'}"
                                           if name.startswith("pgbench -i / hit") else ""))
    hits = [t.info["cache"] for t in timings if t.arm == "hit"]
    if hits:
        print(f"  hit: check {statistics.median(h['lookup_s'] for h in hits):.2f} s, restore "
              f"{statistics.median(h['restore_s'] for h in hits):.2f} s by {hits[-1]['method']}, "
              f"{hits[-1]['bytes'] / 2**20:.0f} MiB")
    lab_dir = args.lab_dir or bench.work
    return {
        "benchmark": "dataset-cache",
        "started": started,
        "finished": time.time(),
        "command": "bench/dataset_cache.py " + " ".join(sys.argv[1:]),
        "machine": machine([lab_dir, bench.root if bench.root.exists() else bench.work]) | {
            "loadavg_start": LOADAVG_START, "loadavg_end": os.getloadavg()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "reflink_supported": df.reflink_supported(bench.root, lab_dir) if bench.root.exists() else None,
        "timings": [asdict(t) for t in timings],
        "medians_s": med,
        "medians_whole_build_s": med_build,
        "ratios": ratios,
        "target": TARGET,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--scale", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lab-dir", type=Path, default=None, help="where the labs go (default: a new folder under "
                    "$TMPDIR), e.g. on a reflink filesystem")
    ap.add_argument("--cache-dir", type=Path, default=None, help="the cache folder (default: in the bench's "
                    "own folder, removed afterwards); put it on the labs' filesystem for reflinks")
    ap.add_argument("--json", type=Path, default=None,
                    help=f"default: {HERE / 'measurements'}/dataset-cache-<date>.json")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.scale < 1:
        ap.error("--repeats and --scale must be at least 1")
    if args.json is None:
        args.json = HERE / "measurements" / f"dataset-cache-{dt.date.today().isoformat()}.json"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pglab-dataset-cache-"))
    os.chmod(work, 0o711)
    timings: list[Timing] = []
    started = time.time()
    bench = Bench(args, work)
    arms: list[Callable[[int], Timing]] = [bench.pgbench_init, bench.miss, bench.hit]
    try:
        print(f"dataset cache bench: scale {args.scale}, {args.repeats} rounds, cache in {bench.root}", flush=True)
        for rnd in range(1, args.repeats + 1):
            k = (rnd - 1) % len(arms)
            for arm in arms[k:] + arms[:k]:
                timing = arm(rnd)
                timings.append(timing)
                print(f"  round {timing.round} {timing.arm:12} {timing.seconds:8.2f} s (whole build "
                      f"{timing.build_s:.2f} s)", flush=True)
        out = report(args, bench, timings, started)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str))
        print(f"written {args.json}")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if args.cache_dir is not None:
            bench._clear()
        for base in bench.bases:
            shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
