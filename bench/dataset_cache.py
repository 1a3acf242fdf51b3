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

Issue 33 item 4 (a hit in ≤ 1 s without reflinks, or the honest limit), two more arms (``--arms``):

- ``overlay``: the hit without a copy: the lab's data directory is an overlay mount whose lower layer is the
  cache entry's data (read-only), its upper and work directories in the lab; only the WAL (a few segments) is
  copied. What the copy no longer pays up front, the first writes pay later: overlayfs copies a whole file up
  to the upper layer when it is first opened for writing (PostgreSQL opens every relation file read-write, so a
  1 GiB segment of pgbench_accounts is copied on its first access);
- ``hit unshared``: on a reflink filesystem, the hit made by a full byte copy (``cp --reflink=never``): the
  baseline for what the first writes to reflinked files cost (copy-on-write of each block).

``--runs N`` (with ``--run-seconds``): after each hit arm's timed build, N short tpcb-like runs (2 clients) on
the lab, each with its TPS, p99 latency (from pgbench's per-transaction log), the writes the data's block device
did in its window, and (overlay) what the upper layer holds after it (the copy-up). Then, untimed, the checks
that PostgreSQL ran correctly on it: a CHECKPOINT, an immediate stop and a start (crash recovery), a clean
restart, then every committed transaction there (history rows = transactions pgbench counted, balances of the
three tables agree) and ``bt_index_check`` of the accounts' key with ``heapallindexed``.

    PYTHONPATH=src .venv/bin/python bench/dataset_cache.py                     # scale 100, 3 rounds
    PYTHONPATH=src .venv/bin/python bench/dataset_cache.py --scale 10 --repeats 5 --cache-dir /mnt/x/cache
    PYTHONPATH=src .venv/bin/python bench/dataset_cache.py --arms hit,overlay --runs 3 --run-seconds 5

``--fio PATH`` (twice or more): instead of the arms, what a filesystem pglab would create (a loop device over a
file) does to the storage figures: two quick fio jobs (8 KiB writes each followed by fdatasync, queue depth 1,
as PostgreSQL's WAL; 8 KiB random direct writes at queue depth 32) in a scratch folder under each path, the order
of the paths rotating from round to round.
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

import psycopg

from pglab.plan.schema import Dataset, LabPaths, LocalTarget
from pglab.targets.local import dataset as df
from pglab.targets.local import lab_dataset
from pglab.targets.local.cluster import LocalLab
from pglab.targets.local.dataset import cache
from pglab.targets.local.dataset.copytree import CopyReport

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataset import machine

TARGET = 20.0
ARMS = ("pgbench -i", "miss", "hit", "overlay", "hit unshared")
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

    def _build(self, arm: str, rnd: int, restore: Callable[..., CopyReport] | None = None) -> Timing:
        self._settle()
        lab = self._lab(self.dataset)
        real = lab_dataset.datasets.restore
        mounts: list[Path] = []
        if restore is not None:  # the hit made another way (only the cache's restore into the primary)
            def patched(snap: df.Snapshot, data: Path, wal: Path | None, **kw: Any) -> CopyReport:
                return restore(snap, data, wal, mounts=mounts, **kw)
            lab_dataset.datasets.restore = patched  # type: ignore[assignment]
        try:
            t0 = time.monotonic()
            lab.provision({})
            build = time.monotonic() - t0
            info = dict(lab.describe()["dataset"])
            if self.args.runs and arm != "miss":
                info["runs"] = self._runs(lab, mounts)
                info["checks"] = self._checks(lab, sum(r["transactions"] for r in info["runs"]))
        finally:
            lab_dataset.datasets.restore = real
            try:
                if mounts:  # the server off the overlay, the overlay off the data directory, then the lab removed
                    if lab.nodes[0].postmaster_pid() is not None:
                        lab._pg_ctl(lab.nodes[0], "-m", "fast", "stop")
                    for m in mounts:
                        subprocess.run(["umount", str(m)], check=True)
            finally:
                lab.teardown()
        c = info["cache"]
        assert c["hit"] is (arm != "miss"), c  # the arm measured what it says
        if arm != "miss":
            return Timing(arm, rnd, c["lookup_s"] + c["restore_s"], build, info)
        assert c.get("stored"), c
        return Timing(arm, rnd, info["total_s"], build, info)

    # ------------------------------------------------------------ issue 33 item 4: other hits, and their cost later
    def overlay(self, rnd: int) -> Timing:
        self._ensure_entry()
        return self._build("overlay", rnd, overlay_restore)

    def unshared(self, rnd: int) -> Timing:
        self._ensure_entry()
        return self._build("hit unshared", rnd, unshared_restore)

    def _runs(self, lab: LocalLab, mounts: list[Path]) -> list[dict[str, Any]]:
        node = lab.nodes[0]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | lab.endpoints().primary.env()
        dev = block_device(node.data.parent)
        out = []
        for i in range(1, self.args.runs + 1):
            logs = Path(tempfile.mkdtemp(prefix="runs-", dir=self.work))
            w0 = device_written(dev)
            t = time.monotonic()
            proc = subprocess.run([str(lab.bindir / "pgbench"), "-n", "-c", "2", "-j", "2", "-T",
                                   str(self.args.run_seconds), "-b", "tpcb-like", "-l", "--log-prefix",
                                   str(logs / "tx")], env=env, capture_output=True, text=True, check=True,
                                  timeout=self.args.run_seconds + 600)
            wall = time.monotonic() - t
            written = device_written(dev) - w0
            lat = sorted(int(line.split()[2]) for f in logs.iterdir() for line in f.read_text().splitlines())
            shutil.rmtree(logs)
            row: dict[str, Any] = {
                "run": i, "wall_s": round(wall, 2), "tps": _field(proc.stdout, "tps = "),
                "transactions": int(_field(proc.stdout, "number of transactions actually processed: ")),
                "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] / 1000 if lat else None,
                "p50_ms": lat[len(lat) // 2] / 1000 if lat else None,
                "max_ms": lat[-1] / 1000 if lat else None,
                "device_written_mib": round(written / 2**20, 1) if dev else None}
            if mounts:
                upper = node.data.parent / "upper"
                files, size = upper_usage(upper)
                row |= {"upper_mib": round(size / 2**20, 1), "upper_files": files}
            out.append(row)
            print(f"    run {i}: {row['tps']:8.1f} tps, p99 {row['p99_ms']:.1f} ms, max {row['max_ms']:.0f} ms, "
                  f"device wrote "
                  f"{row['device_written_mib']} MiB" + (f", upper {row['upper_mib']} MiB" if mounts else ""),
                  flush=True)
        return out

    def _checks(self, lab: LocalLab, committed: int) -> dict[str, Any]:
        """PostgreSQL ran correctly on it: a checkpoint, a crash and its recovery, a clean restart; then every
        committed transaction is there and the accounts' key matches its heap."""
        node = lab.nodes[0]
        with lab.connect(node) as conn:
            conn.execute("CHECKPOINT")
        lab._pg_ctl(node, "-m", "immediate", "stop")
        lab._start(node)
        lab._pg_ctl(node, "-m", "fast", "stop")
        lab._start(node)
        with lab.connect(node) as conn:
            conn.autocommit = True
            row = conn.execute("SELECT (SELECT count(*) FROM pgbench_history), (SELECT sum(abalance) FROM "
                               "pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches), (SELECT sum("
                               "tbalance) FROM pgbench_tellers)").fetchone()
            assert row is not None
            conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
            try:
                conn.execute("SELECT bt_index_check('pgbench_accounts_pkey', true)")
                amcheck = "ok"
            except psycopg.Error as exc:
                amcheck = str(exc).strip()
        return {"history_rows": row[0], "transactions_counted": committed, "all_there": row[0] == committed,
                "balances_agree": row[1] == row[2] == row[3], "amcheck": amcheck}

    def _ensure_entry(self) -> None:
        if not cache.DatasetCache(self.root).entries():
            self._build("miss", 0)  # untimed: the entry the hit needs

    def miss(self, rnd: int) -> Timing:
        self._clear()
        timing = self._build("miss", rnd)
        return timing

    def hit(self, rnd: int) -> Timing:
        self._ensure_entry()
        return self._build("hit", rnd)

    def _clear(self) -> None:
        c = cache.DatasetCache(self.root)
        for e in c.entries():
            assert c.remove(e.name), e.name


def overlay_restore(snap: df.Snapshot, data: Path, wal: Path | None, *, mounts: list[Path],
                    **_kw: Any) -> CopyReport:
    """The cache's entry as the lower layer of an overlay mounted on the lab's data directory; upper and work
    directories beside it in the lab. The WAL is copied (the entry's few segments), pg_wal pointed at it."""
    t0 = time.monotonic()
    assert wal is not None and snap.meta.get("separate_wal")
    owner = snap.data.stat()
    upper, work = data.parent / "upper", data.parent / "work"
    for d in (upper, work, data):
        d.mkdir(exist_ok=True)
        os.chown(d, owner.st_uid, owner.st_gid)
        os.chmod(d, 0o700)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={snap.data},upperdir={upper},workdir={work}", str(data)], check=True)
    mounts.append(data)
    (data / "pg_wal").unlink(missing_ok=True)  # the entry has none (its WAL is apart); a whiteout if it had
    os.symlink(wal, data / "pg_wal")
    os.lchown(data / "pg_wal", owner.st_uid, owner.st_gid)
    if wal.exists():
        os.rmdir(wal)
    subprocess.run(["cp", "-a", "--reflink=never", str(snap.wal), str(wal)], check=True)
    subprocess.run(["sync", "-f", str(wal)], check=True)  # the WAL copy and the upper layer (one filesystem)
    files, size = upper_usage(wal)
    return CopyReport("overlay", {"overlay": 0, "copy": size}, files, size, time.monotonic() - t0, 0.0, {})


def unshared_restore(snap: df.Snapshot, data: Path, wal: Path | None, *, mounts: list[Path],
                     **_kw: Any) -> CopyReport:
    """The entry copied byte by byte (no block shared with it, even on a reflink filesystem), fsynced."""
    t0 = time.monotonic()
    assert wal is not None
    for src, dst in ((snap.data, data), (snap.wal, wal)):
        if dst.exists():
            os.rmdir(dst)
        subprocess.run(["cp", "-a", "--reflink=never", str(src), str(dst)], check=True)
    (data / "pg_wal").unlink(missing_ok=True)
    os.symlink(wal, data / "pg_wal")
    t = time.monotonic()
    subprocess.run(["sync", "-f", str(data)], check=True)
    files, size = map(sum, zip(upper_usage(data), upper_usage(wal), strict=True))
    return CopyReport("read/write", {"read/write": size}, files, size, time.monotonic() - t0,
                      time.monotonic() - t, {})


FIO_JOBS = {
    "wal-fdatasync-8k": ["--rw=write", "--bs=8k", "--iodepth=1", "--ioengine=sync", "--direct=0", "--fdatasync=1",
                         "--size=256m"],
    "randwrite-8k-qd32": ["--rw=randwrite", "--bs=8k", "--iodepth=32", "--ioengine=libaio", "--direct=1",
                          "--size=1g"],
}


def fio_compare(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for rnd in range(1, args.repeats + 1):
        k = (rnd - 1) % len(args.fio)
        for path in args.fio[k:] + args.fio[:k]:
            for job, opts in FIO_JOBS.items():
                scratch = Path(tempfile.mkdtemp(prefix="fio-", dir=path))
                try:
                    proc = subprocess.run(["fio", f"--name={job}", f"--directory={scratch}", "--time_based",
                                           f"--runtime={args.run_seconds}", "--output-format=json", *opts],
                                          capture_output=True, text=True, check=True,
                                          timeout=args.run_seconds + 300)
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
                w = json.loads(proc.stdout)["jobs"][0]["write"]
                sync = json.loads(proc.stdout)["jobs"][0].get("sync", {})
                pct = w["clat_ns"].get("percentile", {})
                row = {"round": rnd, "path": str(path), "job": job, "iops": round(w["iops"], 1),
                       "mib_s": round(w["bw_bytes"] / 2**20, 1), "clat_p99_ms": pct.get("99.000000", 0) / 1e6,
                       "sync_p99_ms": sync.get("lat_ns", {}).get("percentile", {}).get("99.000000", 0) / 1e6}
                rows.append(row)
                print(f"  round {rnd} {path} {job:18} {row['iops']:9.0f} IOPS {row['mib_s']:7.1f} MiB/s "
                      f"write p99 {row['clat_p99_ms']:.2f} ms, fdatasync p99 {row['sync_p99_ms']:.2f} ms",
                      flush=True)
    med = {f"{p} {j}": {k: statistics.median(r[k] for r in rows if r["path"] == str(p) and r["job"] == j)
                        for k in ("iops", "mib_s", "clat_p99_ms", "sync_p99_ms")}
           for p in args.fio for j in FIO_JOBS}
    for name, m in med.items():
        print(f"  {name:60} {m['iops']:9.0f} IOPS  {m['mib_s']:7.1f} MiB/s  p99 {m['clat_p99_ms']:.2f} ms  "
              f"fdatasync p99 {m['sync_p99_ms']:.2f} ms")
    return {"benchmark": "dataset-cache-fio", "command": "bench/dataset_cache.py " + " ".join(sys.argv[1:]),
            "machine": machine(args.fio) | {"loadavg_start": LOADAVG_START, "loadavg_end": os.getloadavg()},
            "jobs": FIO_JOBS, "rows": rows, "medians": med}


def upper_usage(root: Path) -> tuple[int, int]:
    """Files and bytes allocated under ``root`` (an overlay's upper layer: what was copied up)."""
    files = size = 0
    for path, _dirs, names in os.walk(root):
        for n in names:
            st = os.lstat(os.path.join(path, n))
            files += 1
            size += st.st_blocks * 512
    return files, size


def block_device(path: Path) -> str | None:
    """/sys/dev/block/<major>:<minor> of the filesystem holding ``path`` (None when it has none, e.g. tmpfs)."""
    st = os.stat(path)
    sys_dir = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    return sys_dir if os.path.exists(sys_dir + "/stat") else None


def device_written(dev: str | None) -> int:
    """Bytes the block device has written since boot (its stat's sectors written × 512)."""
    if dev is None:
        return 0
    return int(Path(dev + "/stat").read_text().split()[6]) * 512


def _field(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):].split()[0])
    raise ValueError(f"pgbench printed no '{prefix.strip()}'")


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
    runs: dict[str, list[dict[str, Any]]] = {}
    for a in arms:
        rows = [t.info["runs"] for t in timings if t.arm == a and "runs" in t.info]
        if not rows:
            continue
        runs[a] = []
        for i in range(len(rows[0])):
            nth = [r[i] for r in rows if len(r) > i]
            med_row = {k: statistics.median(x[k] for x in nth) for k in nth[0]
                       if k != "run" and all(isinstance(x.get(k), int | float) for x in nth)}
            runs[a].append({"run": i + 1} | med_row)
            print(f"  {a:14} run {i + 1}: {med_row['tps']:8.1f} tps, p99 {med_row['p99_ms']:7.1f} ms, max "
                  f"{med_row.get('max_ms', 0):6.0f} ms, device "
                  f"wrote {med_row.get('device_written_mib', 0):7.1f} MiB"
                  + (f", upper {med_row['upper_mib']:.0f} MiB" if "upper_mib" in med_row else ""))
    checks = {a: [t.info["checks"] for t in timings if t.arm == a and "checks" in t.info] for a in arms}
    for a, c in checks.items():
        if c:
            print(f"  {a:14} checks: {c}")
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
        "runs_medians": runs,
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
    ap.add_argument("--arms", default="pgbench -i,miss,hit",
                    help=f"comma-separated, of: {', '.join(ARMS)} (default: pgbench -i,miss,hit)")
    ap.add_argument("--runs", type=int, default=0, help="short tpcb-like runs after each hit arm's build")
    ap.add_argument("--run-seconds", type=int, default=5)
    ap.add_argument("--fio", type=Path, action="append", default=[],
                    help="instead of the arms: fio's quick jobs on each of these paths (give two or more)")
    ap.add_argument("--json", type=Path, default=None,
                    help=f"default: {HERE / 'measurements'}/dataset-cache-<date>.json")
    args = ap.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not args.arms or any(a not in ARMS for a in args.arms):
        ap.error(f"--arms: give some of {', '.join(ARMS)}")
    if args.runs < 0 or args.run_seconds < 1:
        ap.error("--runs must be at least 0 and --run-seconds at least 1")
    if args.repeats < 1 or args.scale < 1:
        ap.error("--repeats and --scale must be at least 1")
    if args.json is None:
        args.json = HERE / "measurements" / f"dataset-cache-{dt.date.today().isoformat()}.json"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fio:
        out = fio_compare(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str))
        print(f"written {args.json}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="pglab-dataset-cache-"))
    os.chmod(work, 0o711)
    timings: list[Timing] = []
    started = time.time()
    bench = Bench(args, work)
    by_name: dict[str, Callable[[int], Timing]] = {"pgbench -i": bench.pgbench_init, "miss": bench.miss,
                                                    "hit": bench.hit, "overlay": bench.overlay,
                                                    "hit unshared": bench.unshared}
    arms = [by_name[a] for a in args.arms]
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
