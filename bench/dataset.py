"""Dataset first load and reset: the fast path (load alone, snapshot, restore) against pgbench -i.

Why: a plan that asks for a fresh dataset before every point pays the load each time, and the first load of a lab
pays it once with the WAL on. The targets (issue "fast dataset reuse"): the fast first load ≥ 2× faster than
``pgbench -i -s N``, and a reset by restoring the snapshot ≥ 10× faster than re-initialising.

How: one server (a lab of one instance, pglab's own settings: wal_level=replica …), then

(a) first load, ``--repeats`` rounds, the order of the arms rotating from round to round:
    - ``pgbench -i -s N``: plain, pgbench's default steps (client-side COPY), the issue's reference;
    - ``pglab today``: the command pglab runs now (``pgbench.init_args``: ``-q --init-steps=dtGvp``);
    - ``fast``: restart with ``fast_load_settings`` (wal_level=minimal, fsync=off …), ``fast_load``, restart with
      the lab's settings (so the snapshot's checkpoint says wal_level=replica, as standbys need), clean stop,
      ``sync_tree`` of data and WAL: everything the safe path needs before the snapshot. The snapshot itself is
      timed apart.
    - ``fast, no early flush`` (with ``--compare-flush``): the same without the fsync of each loaded table from a
      thread during the index build, to see what that overlap gains.
    Every arm starts with no pgbench tables, after a CHECKPOINT and a sync. Each records the CPU seconds of the
    server (postmaster and children) and of the client, to show what is CPU-bound where.
    With ``--profile`` (issue 33 item 5), a thread samples every 0.1 s the CPU (user and system) of every
    server process by kind (the loading backends, parallel workers, checkpointer, WAL and background writers …),
    of the client (this process with its threads, and pgbench), the machine's CPU (busy, iowait, idle, steal over
    its cores) and the writes of the data's block device; each arm's phases (pgbench -i's own step times from
    its "done in" line; the fast load's steps and the restarts around them) then get their share of each.

(b) reset, ``--repeats`` rounds, each arm after ``--dirty`` seconds of tpcb-like so there is something to undo
    (before a restore arm, the cluster is first brought back to the snapshot, untimed, when a re-init arm replaced
    its tables: in a sweep the cluster to reset is always the snapshot plus one run):
    - ``restore``: immediate stop (what the run wrote is discarded), ``restore(method="auto")`` (a reflink copy
      where the filesystem can, else the old cluster patched where it stands: only differing blocks written; then
      fsync and rename), start, first connection;
    - ``restore, copy``: the same with every byte copied (what "auto" avoids without reflinks);
    - ``re-init plain`` and ``re-init pglab today``: ``pgbench -i -s N`` into the running server, as the two
      commands above.

    .venv/bin/python bench/dataset.py                      # scale 100, 3 repeats
    .venv/bin/python bench/dataset.py --scale 20 --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from pglab.plan.schema import Dataset, LabPaths, LocalTarget
from pglab.targets.local import dataset as df
from pglab.targets.local.cluster import LocalLab
from pglab.targets.local.dataset.load import _memory_bytes
from pglab.workloads import pgbench

TARGET_LOAD = 2.0
TARGET_RESET = 10.0
HERE = Path(__file__).resolve().parent
LOADAVG_START = os.getloadavg()  # how busy the shared machine was: 1, 5, 15 minutes


@dataclass
class Timing:
    phase: str  # "load" | "reset"
    arm: str
    round: int
    seconds: float
    parts: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        paths = LabPaths(lab=str(args.lab_dir)) if args.lab_dir else LabPaths()
        self.lab = LocalLab(LocalTarget(instances=1, synchronous=None, paths=paths), work)
        self.dataset = Dataset(scale=args.scale, partitions=args.partitions)
        self.fast = df.fast_load_settings(self.lab.bindir, self.dataset, fsync=args.fsync)
        self.snap: df.Snapshot | None = None
        self.snap_dir = work / "snapshot"
        self.snap_report: df.CopyReport | None = None
        self.reinit_since_restore = True  # the load phase leaves pgbench's tables, not the snapshot's files

    @property
    def node(self) -> Any:
        return self.lab.nodes[0]

    def setup(self) -> None:
        self.lab.provision({})

    def _env(self) -> dict[str, str]:
        ep = self.lab.endpoints().primary
        return {k: v for k, v in os.environ.items() if not k.startswith("PG")} | ep.env()

    def _pgbench(self, argv: list[str], sampler: Sampler | None = None) -> str:
        with subprocess.Popen(argv, env=self._env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as proc:
            if sampler is not None:
                sampler.client_pids.append(proc.pid)
            _out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} failed: {err.strip().splitlines()[-1:]}")
        return next((ln for ln in err.splitlines() if ln.startswith("done in")), "")

    def _sampler(self) -> Sampler | contextlib.nullcontext[None]:
        pm = self.node.postmaster_pid()
        if not self.args.profile or pm is None:
            return contextlib.nullcontext()
        return Sampler(pm, block_device(self.node.data))

    def _clean_start(self) -> None:
        """No pgbench tables, nothing dirty: every arm starts from the same place."""
        if self.node.postmaster_pid() is None:
            self.lab._start(self.node)
        with self.lab.connect(self.node) as conn:
            conn.execute("DROP TABLE IF EXISTS " + ", ".join(pgbench.PGBENCH_TABLES))
            conn.execute("CHECKPOINT")
        subprocess.run(["sync"], check=False)

    def plain_args(self) -> list[str]:
        argv = [str(self.lab.bindir / "pgbench"), "-i", "-q", "-s", str(self.args.scale)]
        return argv + ([f"--partitions={self.args.partitions}"] if self.args.partitions else [])

    # ------------------------------------------------------------ (a) first load
    def load_pgbench(self, rnd: int, arm: str, argv: list[str]) -> Timing:
        self._clean_start()
        pm = self.node.postmaster_pid()
        background = _children(pm) if pm else set()
        server0, client0 = server_cpu(pm, background), client_cpu()
        with self._sampler() as sampler:
            t0 = time.monotonic()
            done = self._pgbench(argv, sampler)
            t1 = time.monotonic()
            cpu: dict[str, Any] = {"server_cpu_s": server_cpu(pm, background) - server0,
                                   "client_cpu_s": client_cpu() - client0}
            with self.lab.connect(self.node) as conn:  # for information: what a checkpoint then still writes
                conn.execute("CHECKPOINT")
            t2 = time.monotonic()
        if sampler is not None:
            steps = _pgbench_steps(done)
            start = t1 - sum(v for _n, v in steps)  # pgbench's steps end when it exits; its connection before
            cpu["profile"] = sampler.phases([("pgbench start, connect", t0, start), *_sequence(start, steps),
                                             ("pgbench exit", start + sum(v for _n, v in steps), t1),
                                             ("checkpoint after (not in the arm's time)", t1, t2),
                                             ("whole arm", t0, t1)])
            cpu["sampler_cpu_s"] = sampler.own_cpu
        return Timing("load", arm, rnd, t1 - t0, {"checkpoint_after": t2 - t1}, {"pgbench": done} | cpu)

    def load_fast(self, rnd: int, flush_early: bool = True) -> Timing:
        self._clean_start()
        parts: dict[str, float] = {}
        load = dataclasses.replace(self.fast, flush_early=flush_early)
        t0 = time.monotonic()
        self.lab._apply(load.parameters)
        parts["restart into load settings"] = time.monotonic() - t0
        pm = self.node.postmaster_pid()
        background = _children(pm) if pm else set()
        server0, client0 = server_cpu(pm, background), client_cpu()
        with self._sampler() as sampler:
            t_load = time.monotonic()
            report = df.fast_load(self.lab.endpoints().primary, self.dataset, load, self.work / "load")
            t_loaded = time.monotonic()
            # the wait for the last backends to be reaped is timed with the arm: a few ms
            cpu: dict[str, Any] = {"server_cpu_s": server_cpu(pm, background) - server0,
                                   "client_cpu_s": client_cpu() - client0}
            parts |= {f"load: {k}": v for k, v in report.steps.items()}
            t_restart = time.monotonic()
            self.lab._apply({})  # a new postmaster: the sampler follows the old one, so this is not in the profile
            parts["restart with the lab's settings"] = time.monotonic() - t_restart
        t = time.monotonic()
        self.lab._pg_ctl(self.node, "-m", "fast", "stop")
        parts["clean stop"] = time.monotonic() - t
        parts["sync data and WAL"] = df.sync_tree(self.node.data)
        total = time.monotonic() - t0
        if sampler is not None:
            bounds = _sequence(t_load, list(report.steps.items()))
            cpu["profile"] = sampler.phases([*bounds, ("rest of the load call", bounds[-1][2], t_loaded),
                                             ("between", t_loaded, t_restart),
                                             ("restart with the lab's settings (stop: its checkpoint)", t_restart,
                                              t_restart + parts["restart with the lab's settings"]),
                                             ("load call", t_load, t_loaded)])
            cpu["sampler_cpu_s"] = sampler.own_cpu
        if self.snap is not None:
            shutil.rmtree(self.snap.dir)
        snap, rep = df.snapshot(self.node.data, self.node.wal, self.snap_dir, bindir=self.lab.bindir)
        self.snap, self.snap_report = snap, rep
        self.lab._start(self.node)
        return Timing("load", "fast" if flush_early else "fast, no early flush", rnd, total, parts,
                      cpu | {"flushed_early": len(report.flushed), "snapshot_s": rep.seconds,
                             "snapshot_sync_s": rep.sync_seconds, "snapshot_bytes": rep.bytes,
                       "snapshot_method": rep.method, "wal_segments_left_out": rep.skipped_wal_segments})

    # ------------------------------------------------------------ (b) reset
    def dirty(self) -> None:
        if self.node.postmaster_pid() is None:
            self.lab._start(self.node)
        if self.args.dirty > 0:
            self._pgbench([str(self.lab.bindir / "pgbench"), "-n", "-c", "2", "-j", "2", "-T",
                           str(self.args.dirty), "-b", "tpcb-like"])

    def reset_restore(self, rnd: int, method: str) -> Timing:
        assert self.snap is not None
        if self.reinit_since_restore:  # as in a sweep: the cluster to reset is the snapshot plus one run
            self.lab._pg_ctl(self.node, "-m", "immediate", "stop")
            df.restore(self.snap, self.node.data, self.node.wal)
            self.lab._start(self.node)
            self.reinit_since_restore = False
        self.dirty()
        parts: dict[str, float] = {}
        t0 = time.monotonic()
        self.lab._pg_ctl(self.node, "-m", "immediate", "stop")
        parts["immediate stop"] = time.monotonic() - t0
        report = df.restore(self.snap, self.node.data, self.node.wal, method=method)
        parts[f"restore ({report.method})"] = report.seconds - report.sync_seconds
        parts["restore: fsync"] = report.sync_seconds
        t = time.monotonic()
        self.lab._start(self.node)
        with self.lab.connect(self.node) as conn:
            conn.execute("SELECT 1")
        parts["start, first connection"] = time.monotonic() - t
        total = time.monotonic() - t0
        with self.lab.connect(self.node) as conn:
            ok = conn.execute("SELECT sum(abalance) = 0 AND count(*) = %s FROM pgbench_accounts",
                              (self.args.scale * 100_000,)).fetchone()
        if ok != (True,):
            raise RuntimeError("the restored dataset is not the snapshot's")
        arm = "restore" if method == "auto" else f"restore, {method}"
        return Timing("reset", arm, rnd, total, parts,
                      {"method": report.method, "bytes": report.bytes, "files": report.files,
                       "compared_bytes": report.compared_bytes, "rewritten_bytes": report.rewritten_bytes,
                       "removed": report.removed})

    def reset_reinit(self, rnd: int, arm: str, argv: list[str]) -> Timing:
        self.dirty()
        self.reinit_since_restore = True
        t0 = time.monotonic()
        done = self._pgbench(argv)
        return Timing("reset", arm, rnd, time.monotonic() - t0, {}, {"pgbench": done})

    def close(self) -> None:
        self.lab.teardown()


def _children(postmaster: int) -> set[int]:
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    out.add(int(d))
    return out


def server_cpu(postmaster: int | None, settled: set[int] | None = None) -> float:
    """CPU seconds (user + system) the server has used since its start: the postmaster, its children that have
    exited (backends, parallel workers) and those still running (checkpointer, writers, autovacuum). ``settled``:
    first wait (2 s at most) until only those children are left, so that the backends that just exited have been
    reaped and counted."""
    if postmaster is None:
        return 0.0
    deadline = time.monotonic() + 2
    while settled is not None and _children(postmaster) - settled and time.monotonic() < deadline:
        time.sleep(0.005)
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    with contextlib.suppress(OSError, IndexError, ValueError):
        total = sum(int(x) for x in Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()[11:15])
    for pid in _children(postmaster):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += sum(int(x) for x in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13])
    return total / tick


def client_cpu() -> float:
    """CPU seconds of this process (the fast load's client: row generation, COPY) and its waited-for children
    (pgbench)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Sampler(threading.Thread):
    """CPU of the server's processes by kind, of the client, of the machine, and the data device's writes,
    every ``period`` seconds; :meth:`phases` splits them over consecutive phases."""

    KINDS = (("parallel worker", "parallel workers"), ("checkpointer", "checkpointer"),
             ("background writer", "bgwriter"), ("walwriter", "walwriter"), ("autovacuum", "autovacuum"),
             ("logger", "other"), ("stats", "other"), ("launcher", "other"))

    def __init__(self, postmaster: int, dev: str | None, period: float = 0.1):
        super().__init__(daemon=True)
        self.postmaster, self.dev, self.period = postmaster, dev, period
        self.client_pids: list[int] = []  # pgbench, while it runs
        self.samples: list[tuple[float, dict[str, float], list[int], int]] = []
        # pid → kind, user s, system s, s waited on a run queue (ready, no core free) (last seen)
        self._last: dict[int, tuple[str, float, float, float]] = {}
        self._kind: dict[int, str] = {}
        self._halt = threading.Event()
        self.own_cpu = 0.0
        self.tick = os.sysconf("SC_CLK_TCK")

    def _stat(self, pid: int) -> tuple[float, float, float] | None:
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            waited = int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9  # all its threads
        except (OSError, IndexError, ValueError):
            return None
        return int(f[11]) / self.tick, int(f[12]) / self.tick, waited

    def _kind_of(self, pid: int) -> str:
        if pid not in self._kind:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmd = ""
            self._kind[pid] = next((k for pat, k in self.KINDS if pat in cmd), "backends")
        return self._kind[pid]

    def sample(self) -> None:
        t = time.monotonic()
        try:
            kids = [int(x) for x in Path(f"/proc/{self.postmaster}/task/{self.postmaster}/children").read_text()
                    .split()]
        except OSError:
            kids = []
        for pid, kind in [(self.postmaster, "postmaster"), *((k, self._kind_of(k)) for k in kids),
                          (os.getpid(), "client (this process)"),
                          *((c, "client (pgbench)") for c in self.client_pids)]:
            st = self._stat(pid)
            if st is not None:
                self._last[pid] = (kind, *st)
        cpu: dict[str, float] = {}
        for kind, user, system, waited in self._last.values():
            cpu[f"{kind} user"] = cpu.get(f"{kind} user", 0.0) + user
            cpu[f"{kind} sys"] = cpu.get(f"{kind} sys", 0.0) + system
            cpu[f"{kind} runq"] = cpu.get(f"{kind} runq", 0.0) + waited
        machine_cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        written = int(Path(self.dev + "/stat").read_text().split()[6]) * 512 if self.dev else 0
        self.samples.append((t, cpu, machine_cpu, written))

    def run(self) -> None:
        while not self._halt.wait(self.period):
            self.sample()
        self.own_cpu = time.thread_time()  # the sampler's own CPU (it is in the client's figure)

    def __enter__(self) -> Sampler:
        self.sample()
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.sample()

    def _at(self, t: float) -> tuple[dict[str, float], list[float], float]:
        """Counters at time ``t``, interpolated between the samples around it."""
        s = self.samples
        i = next((k for k, row in enumerate(s) if row[0] >= t), len(s) - 1)
        a, b = s[max(i - 1, 0)], s[i]
        w = 0.0 if b[0] == a[0] else min(max((t - a[0]) / (b[0] - a[0]), 0.0), 1.0)
        keys = set(a[1]) | set(b[1])
        cpu = {k: a[1].get(k, 0.0) + w * (b[1].get(k, 0.0) - a[1].get(k, 0.0)) for k in keys}
        m = [x + w * (y - x) for x, y in zip(a[2], b[2], strict=True)]
        return cpu, m, a[3] + w * (b[3] - a[3])

    def phases(self, bounds: list[tuple[str, float, float]]) -> dict[str, dict[str, float]]:
        """Per phase (name, start, end): its wall, the CPU seconds of each kind of process (user and system),
        the machine's busy/iowait/steal core-seconds, and the data device's writes."""
        out = {}
        for name, t0, t1 in bounds:
            c0, m0, w0 = self._at(t0)
            c1, m1, w1 = self._at(t1)
            row = {"wall_s": t1 - t0}
            row |= {f"{k} s": round(c1.get(k, 0.0) - c0.get(k, 0.0), 3) for k in sorted(set(c0) | set(c1))
                    if abs(c1.get(k, 0.0) - c0.get(k, 0.0)) >= 0.005}
            # /proc/stat's cpu line: user nice system idle iowait irq softirq steal
            d = [(y - x) / self.tick for x, y in zip(m0, m1, strict=True)]
            row |= {"machine busy core-s": round(d[0] + d[1] + d[2] + d[5] + d[6], 3), "machine iowait core-s":
                    round(d[4], 3), "machine idle core-s": round(d[3], 3), "machine steal core-s": round(d[7], 3),
                    "device written MiB": round((w1 - w0) / 2**20, 1)}
            out[name] = row
        return out


def _sequence(start: float, steps: list[tuple[str, float]]) -> list[tuple[str, float, float]]:
    """Consecutive phases from their durations."""
    out, t = [], start
    for name, seconds in steps:
        out.append((name, t, t + seconds))
        t += seconds
    return out


def _pgbench_steps(done: str) -> list[tuple[str, float]]:
    """pgbench -i's step times from its line 'done in 17.1 s (drop tables 0.00 s, create tables 0.01 s, …)'."""
    inner = done.split("(", 1)[1].rsplit(")", 1)[0] if "(" in done else ""
    out = []
    for part in inner.split(", "):
        name, _, secs = part.removesuffix(" s").rpartition(" ")
        with contextlib.suppress(ValueError):
            out.append((name, float(secs)))
    return out


def block_device(path: Path) -> str | None:
    st = os.stat(path)
    sys_dir = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    return sys_dir if os.path.exists(sys_dir + "/stat") else None


# ------------------------------------------------------------------ reporting
def machine(paths: Sequence[Path]) -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    dft = subprocess.run(["df", "-T", *map(str, paths)], capture_output=True, text=True, check=False).stdout
    return {"nproc": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "memory_gib": round(_memory_bytes() / 2**30, 1),
            "df_T": dft.strip().splitlines()}


def medians(timings: list[Timing]) -> dict[tuple[str, str], float]:
    by: dict[tuple[str, str], list[float]] = {}
    for t in timings:
        by.setdefault((t.phase, t.arm), []).append(t.seconds)
    return {k: statistics.median(v) for k, v in by.items()}


def part_medians(timings: list[Timing], phase: str, arm: str) -> dict[str, float]:
    rows = [t.parts for t in timings if t.phase == phase and t.arm == arm]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}


def profile_medians(timings: list[Timing]) -> dict[str, dict[str, dict[str, float]]]:
    """Per first-load arm and phase, the median of each profile figure over the rounds (absent: 0)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for arm in dict.fromkeys(t.arm for t in timings if t.phase == "load" and "profile" in t.info):
        rows = [t.info["profile"] for t in timings if t.phase == "load" and t.arm == arm and "profile" in t.info]
        out[arm] = {}
        for phase in rows[0]:
            keys = list(dict.fromkeys(k for r in rows for k in r.get(phase, {})))
            out[arm][phase] = {k: round(statistics.median(r.get(phase, {}).get(k, 0.0) for r in rows), 3)
                               for k in keys}
    return out


def print_profiles(prof: dict[str, dict[str, dict[str, float]]]) -> None:
    for arm, phases in prof.items():
        print(f"profile of '{arm}' (medians; CPU seconds user+system; machine: core-seconds of all cores)")
        print(f"  {'phase':44} {'wall':>6} {'backends':>8} {'(sys)':>6} {'(runq)':>6} {'par.w.':>6} {'ckpt':>5} "
              f"{'walw':>5} {'bgw':>5} {'client':>6} {'(runq)':>6} {'busy':>6} {'iowait':>6} {'idle':>6} {'MiB':>6}")
        for name, r in phases.items():
            def cpu(kind: str, r: dict[str, float] = r) -> float:
                return r.get(f"{kind} user s", 0.0) + r.get(f"{kind} sys s", 0.0)
            client = cpu("client (this process)") + cpu("client (pgbench)")
            runq = r.get("client (this process) runq s", 0.0) + r.get("client (pgbench) runq s", 0.0)
            print(f"  {name[:44]:44} {r['wall_s']:6.2f} {cpu('backends'):8.2f} {r.get('backends sys s', 0.0):6.2f} "
                  f"{r.get('backends runq s', 0.0):6.2f} {cpu('parallel workers'):6.2f} {cpu('checkpointer'):5.2f} "
                  f"{cpu('walwriter'):5.2f} "
                  f"{cpu('bgwriter'):5.2f} {client:6.2f} {runq:6.2f} {r['machine busy core-s']:6.2f} "
                  f"{r['machine iowait core-s']:6.2f} {r['machine idle core-s']:6.2f} {r['device written MiB']:6.0f}")


def report(args: argparse.Namespace, bench: Bench, timings: list[Timing], started: float) -> dict[str, Any]:
    med = medians(timings)
    print()
    print(f"scale {args.scale}{f', {args.partitions} partitions' if args.partitions else ''}, "
          f"{args.repeats} rounds; medians (min … max) in seconds")
    for phase in ("load", "reset"):
        for (ph, arm), m in med.items():
            if ph != phase:
                continue
            vals = [t.seconds for t in timings if t.phase == ph and t.arm == arm]
            print(f"  {phase:5} {arm:24} {m:8.2f}   ({min(vals):.2f} … {max(vals):.2f})")
    ratios: dict[str, float] = {}

    def ratio(name: str, num: tuple[str, str], den: tuple[str, str]) -> None:
        if num in med and den in med and med[den] > 0:
            ratios[name] = med[num] / med[den]

    ratio("load: pgbench -i / fast", ("load", "pgbench -i"), ("load", "fast"))
    ratio("load: pglab today / fast", ("load", "pglab today"), ("load", "fast"))
    ratio("load: fast, no early flush / fast", ("load", "fast, no early flush"), ("load", "fast"))
    ratio("reset: re-init plain / restore", ("reset", "re-init plain"), ("reset", "restore"))
    ratio("reset: re-init pglab today / restore", ("reset", "re-init pglab today"), ("reset", "restore"))
    print()
    for name, r in ratios.items():
        if "no early flush" in name:
            print(f"  {name:40} {r:6.2f}×")
            continue
        target = TARGET_LOAD if name.startswith("load") else TARGET_RESET
        print(f"  {name:40} {r:6.2f}×   target ≥ {target:g}×: {'met' if r >= target else 'NOT met'}")
    print()
    print("fast load, median of its parts:")
    for k, v in part_medians(timings, "load", "fast").items():
        print(f"  {k:48} {v:7.2f}")
    for arm in ("restore", "restore, copy"):
        rows = [t for t in timings if t.phase == "reset" and t.arm == arm]
        if not rows:
            continue
        print(f"{arm}, median of its parts:")
        for k, v in part_medians(timings, "reset", arm).items():
            print(f"  {k:48} {v:7.2f}")
        info = rows[-1].info
        print(f"  (last round: {info['method']}, {info['files']} files, {info['bytes'] / 2**20:.0f} MiB"
              + (f", compared {info['compared_bytes'] / 2**20:.0f} MiB, rewrote {info['rewritten_bytes'] / 2**20:.1f}"
                 f" MiB, removed {info['removed']}" if info["method"] == "patch" else "") + ")")
    prof = profile_medians(timings)
    print_profiles(prof)
    snap = bench.snap_report
    if snap is not None:
        print(f"snapshot: {snap.bytes / 2**20:.0f} MiB in {snap.seconds:.2f} s (fsync {snap.sync_seconds:.2f} s), "
              f"copied by {snap.method}; filesystems {snap.filesystems}")
    out = {
        "benchmark": "dataset-first-load-and-reset",
        "started": started,
        "finished": time.time(),
        "command": "bench/dataset.py " + " ".join(sys.argv[1:]),
        "machine": machine([bench.lab.lab_dir or bench.work, bench.snap_dir.parent]) | {
            "loadavg_start": LOADAVG_START, "loadavg_end": os.getloadavg()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "fast_load": {"parameters": bench.fast.parameters, "pgbench": bench.fast.pgbench_args[1:],
                      "parallel": bench.fast.parallel, "notes": bench.fast.notes},
        "reflink_supported": df.reflink_supported(bench.node.data.parent, bench.snap_dir.parent),
        "snapshot": asdict(snap) if snap else None,
        "timings": [asdict(t) for t in timings],
        "medians_s": {f"{ph}: {arm}": v for (ph, arm), v in med.items()},
        "parts_medians_s": {"load: fast": part_medians(timings, "load", "fast"),
                            "load: fast, no early flush": part_medians(timings, "load", "fast, no early flush"),
                            "reset: restore": part_medians(timings, "reset", "restore"),
                            "reset: restore, copy": part_medians(timings, "reset", "restore, copy")},
        "ratios": ratios,
        "profile_medians": prof,
        "targets": {"load": TARGET_LOAD, "reset": TARGET_RESET},
    }
    return out


# ------------------------------------------------------------------ main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--scale", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dirty", type=int, default=10, help="seconds of tpcb-like before each reset arm")
    ap.add_argument("--fsync", action="store_true", help="keep fsync on during the fast load (default off)")
    ap.add_argument("--compare-flush", action="store_true",
                    help="one more first-load arm: fast without the early flush of the loaded tables")
    ap.add_argument("--no-today", action="store_true", help="leave the first-load arm 'pglab today' out")
    ap.add_argument("--profile", action="store_true", help="sample the CPU of the server's processes, the client "
                    "and the machine, and the disk's writes, split over each first-load arm's phases")
    ap.add_argument("--skip", action="append", default=[], choices=["load", "reset", "copy"],
                    help="leave a phase out (repeatable); copy: the restore by full copy")
    ap.add_argument("--lab-dir", type=Path, default=None,
                    help="an empty directory for the lab (default: a new one under $TMPDIR), e.g. on a reflink "
                         "filesystem")
    ap.add_argument("--snapshot-dir", type=Path, default=None, help="a directory to hold the snapshot (default: "
                    "$TMPDIR); keep it on the data's filesystem for reflinks")
    ap.add_argument("--json", type=Path, default=None,
                    help=f"default: {HERE / 'measurements'}/dataset-<date>.json")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.scale < 1:
        ap.error("--repeats and --scale must be at least 1")
    if args.json is None:
        args.json = HERE / "measurements" / f"dataset-{dt.date.today().isoformat()}.json"
    return args


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, _terminate)
    work = Path(tempfile.mkdtemp(prefix="pglab-dataset-", dir=args.snapshot_dir))  # the snapshot goes in here
    bench: Bench | None = None
    timings: list[Timing] = []
    started = time.time()

    def rounds(arms: list[Callable[[int], Timing]], n: int) -> None:
        """Every arm once per round, the order rotating from round to round (drift falls on every arm)."""
        for rnd in range(1, n + 1):
            k = (rnd - 1) % len(arms)
            for arm in arms[k:] + arms[:k]:
                timing = arm(rnd)
                timings.append(timing)
                print(f"  {timing.phase:5} round {timing.round} {timing.arm:24} {timing.seconds:8.2f} s", flush=True)

    try:
        bench = Bench(args, work)
        bench.setup()
        print(f"dataset bench: scale {args.scale}, {args.repeats} rounds, lab in {bench.lab.lab_dir}, "
              f"snapshot in {bench.snap_dir}", flush=True)
        lab_today = pgbench.init_args(bench.lab.bindir, bench.dataset)
        load_arms: list[Callable[[int], Timing]] = [
            lambda r: bench.load_pgbench(r, "pgbench -i", bench.plain_args()),
            lambda r: bench.load_pgbench(r, "pglab today", lab_today),
            bench.load_fast,
        ]
        if args.no_today:
            del load_arms[1]
        if args.compare_flush:
            load_arms.append(lambda r: bench.load_fast(r, flush_early=False))
        if "load" in args.skip:
            rounds([bench.load_fast], 1)  # the snapshot is still needed
        else:
            rounds(load_arms, args.repeats)
        if "reset" not in args.skip:
            reset_arms: list[Callable[[int], Timing]] = [
                lambda r: bench.reset_restore(r, "auto"),
                lambda r: bench.reset_reinit(r, "re-init plain", bench.plain_args()),
                lambda r: bench.reset_reinit(r, "re-init pglab today", lab_today),
            ]
            if "copy" not in args.skip:
                reset_arms.insert(1, lambda r: bench.reset_restore(r, "copy"))
            rounds(reset_arms, args.repeats)
        out = report(args, bench, timings, started)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str))
        print(f"written {args.json}")
    except KeyboardInterrupt:
        print("interrupted; tearing the lab down", file=sys.stderr)
        return 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        try:
            if bench is not None:
                bench.close()
        finally:
            shutil.rmtree(work, ignore_errors=True)
            for sig, handler in saved.items():
                signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
