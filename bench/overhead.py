"""Probe overhead: bare pgbench (A) against pgbench with every pglab probe on (B), same lab, interleaved.

Why: pglab's figures are only worth something if watching does not change what is watched. The probes
share the CPU with the servers and pgbench, so on a small machine they can steal throughput; this script
measures how much, as the ratio TPS(B) / TPS(A), target ≥ 0.99.

How: one lab (primary + 2 standbys, quorum sync, as pglab's default), one dataset, then N pairs of runs. Pairs
alternate their order (A B, B A, A B …) so that a slow drift of the machine (page cache, autovacuum,
neighbours on a shared host) falls on both sides equally. Every run is prepared as ``pglab run`` prepares one
(``reset_for_run``, standbys caught up) and runs the same pgbench command line, per-transaction log included;
B also starts ``Sampler(default_probes(ctx))`` before pgbench and stops it after, with the ProbeContext built
as the runner builds it. TPS is pgbench's own ``tps = … (without initial connection time)``.

Probe cost is measured in the B runs themselves, under the real load: every probe is wrapped so that each
``sample()`` call is timed (wall clock, and CPU time of the probe's thread), and the CPU used by the probes'
server backends (``application_name = pglab-probe``) is read from /proc around each B run.

    .venv/bin/python bench/overhead.py --workload select-only
    .venv/bin/python bench/overhead.py --workload tpcb-like --pairs 5 --duration 10 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from scipy import stats

from pglab.plan.expand import default_jobs
from pglab.plan.schema import Dataset, LocalTarget, Run
from pglab.probes import Probe, ProbeContext, Sample, Sampler, default_probes
from pglab.targets.base import Endpoints
from pglab.targets.local.cluster import LocalLab
from pglab.workloads import pgbench
from pglab.workloads.pgbench import PgbenchError, PgbenchProcess

TARGET_RATIO = 0.99
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ timing the probes
@dataclass
class ProbeCost:
    """Time spent inside one probe's sample(), over every B run."""

    name: str
    interval: float
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)


class TimedProbe:
    """Wraps a probe so the Sampler's own calls are timed: the cost measured is the cost paid in the runs."""

    def __init__(self, probe: Probe, cost: ProbeCost):
        self._probe = probe
        self._cost = cost
        self.name = probe.name
        self.interval = probe.interval

    def open(self) -> None:
        self._probe.open()

    def sample(self, ts: float) -> list[Sample]:
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            return self._probe.sample(ts)
        finally:
            self._cost.wall_s.append(time.perf_counter() - w0)
            self._cost.cpu_s.append(time.thread_time() - c0)

    def close(self) -> None:
        self._probe.close()

    def summarize(self, samples: Sequence[Sample], start: float, end: float) -> dict[str, float]:
        return self._probe.summarize(samples, start, end)


def proc_cpu_s(pid: int) -> float | None:
    """CPU time of a process in seconds, or None when it is gone.

    /proc/<pid>/schedstat (ns) rather than /stat (clock ticks of 10 ms): a probe backend uses a few ms per
    second, below the resolution of /stat over a 10 s run.
    """
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# which probe a backend serves, told by the last query it ran (all probes share one application_name)
_BACKEND_PROBE = {"pg_stat_activity": "waits", "pg_stat_replication": "repl", "pg_stat_database": "pg"}


def probe_backends(endpoints: Endpoints) -> dict[int, str]:
    """The server processes serving the probes' connections on every node: pid -> probe name."""
    out: dict[int, str] = {}
    for ep in [endpoints.primary, *endpoints.standbys]:
        with psycopg.connect(ep.conninfo(application_name="pglab-control"), autocommit=True) as conn:
            rows = conn.execute("SELECT pid, query FROM pg_stat_activity "
                                "WHERE application_name = 'pglab-probe'")
            for pid, query in rows:
                name = next((n for key, n in _BACKEND_PROBE.items() if key in (query or "")), "other")
                out[int(pid)] = f"{ep.name}:{name}" if ep.role != "primary" else name
    return out


# ------------------------------------------------------------------ one run
@dataclass
class RunResult:
    pair: int
    arm: str  # "A" bare, "B" probes on
    tps: float
    latency_avg_ms: float | None
    transactions: int
    elapsed_s: float  # wall time of the pgbench process, start to exit
    pglab_cpu_cores: float  # CPU of this Python process (probe threads, pgbench stderr reader) per second
    # CPU of the probes' server backends per second, by probe (B only)
    probe_backend_cpu_cores: dict[str, float] = field(default_factory=dict)
    probe_errors: list[str] = field(default_factory=list)


class Bench:
    """One lab, N interleaved A/B pairs; everything torn down in ``close``."""

    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        self.lab = LocalLab(LocalTarget(), work, log=lambda m: print(f"  lab: {m}", flush=True))
        self.endpoints: Endpoints | None = None
        self.proc: PgbenchProcess | None = None
        self.sampler: Sampler | None = None
        self.costs: dict[str, ProbeCost] = {}
        self.jobs = args.jobs or default_jobs(args.clients)
        self.run_spec = Run(duration=args.duration)

    def setup(self) -> None:
        params: dict[str, Any] = dict(self.args.set)
        params["synchronous_commit"] = self.args.synchronous_commit
        self.endpoints = self.lab.provision(params)
        print(f"  loading the dataset: pgbench -i -s {self.args.scale}", flush=True)
        secs = pgbench.initialise(self.lab.bindir, self.endpoints.primary, Dataset(scale=self.args.scale),
                                  self.work / "dataset")
        print(f"  dataset loaded in {secs:.1f} s", flush=True)

    def _prepare(self) -> None:
        """As the runner before every run: truncate, vacuum, checkpoint, then wait for the standbys."""
        assert self.endpoints is not None
        with psycopg.connect(self.endpoints.primary.conninfo(application_name="pglab-control"),
                             autocommit=True) as conn:
            pgbench.reset_for_run(conn)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                row = conn.execute("SELECT count(*) FROM pg_stat_replication WHERE replay_lsn IS NULL "
                                   "OR replay_lsn < pg_current_wal_lsn()").fetchone()
                if row is None or row[0] == 0:
                    return
                time.sleep(0.1)
        raise RuntimeError("standbys did not catch up within 60 s before the run")

    def _context(self) -> ProbeContext:
        """Exactly the runner's ProbeContext."""
        assert self.endpoints is not None
        eps = self.endpoints
        return ProbeContext(
            primary_conninfo=eps.primary.conninfo(application_name="pglab-probe"),
            paths=self.lab.probe_paths(),
            server_pids=self.lab.server_pids,
            client_pids=lambda: [self.proc.pid] if self.proc else [],
            wait_hz=self.args.wait_hz,
        )

    def _pgbench(self, run_dir: Path, seconds: float) -> pgbench.PgbenchSummary:
        assert self.endpoints is not None
        a = self.args
        args = pgbench.run_args(self.lab.bindir, a.workload, a.clients, self.jobs, self.run_spec, self.work,
                                seconds=seconds, transactions=None, log_prefix=run_dir / "pgbench_log")
        proc = self.proc = PgbenchProcess(args, self.endpoints.primary, run_dir, "pgbench")
        rc = proc.wait()  # interrupted, self.proc stays set so that close() stops pgbench
        self.proc = None
        if rc != 0:
            err = [x for x in proc.stderr_path.read_text().splitlines() if not x.startswith("progress:")]
            raise PgbenchError(f"pgbench exited with code {rc}: {' / '.join(err[-2:]) or 'no message'}")
        return pgbench.parse_summary(proc.stdout_path.read_text())

    def one_run(self, pair: int, arm: str, seconds: float | None = None) -> RunResult:
        assert self.endpoints is not None
        run_dir = self.work / f"run-{pair}-{arm}"
        run_dir.mkdir()
        self._prepare()
        backend_cpu0: dict[int, float] = {}
        if arm == "B" and not self.args.aa:
            probes: list[Probe] = []
            for p in default_probes(self._context()):
                cost = self.costs.setdefault(p.name, ProbeCost(p.name, p.interval))
                probes.append(TimedProbe(p, cost))
            self.sampler = Sampler(probes)
            self.sampler.start()
            backend_cpu0 = {p: c for p in probe_backends(self.endpoints) if (c := proc_cpu_s(p)) is not None}
        ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        try:
            summary = self._pgbench(run_dir, seconds or self.args.duration)
        finally:
            ru1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            backend_s: dict[str, float] = {}
            errors: list[str] = []
            if self.sampler is not None:
                cpu1 = {p: c for p in backend_cpu0 if (c := proc_cpu_s(p)) is not None}
                with contextlib.suppress(psycopg.Error):  # named now: each has run its own query by the end
                    for pid, name in probe_backends(self.endpoints).items():
                        if pid in cpu1:
                            backend_s[name] = backend_s.get(name, 0.0) + cpu1[pid] - backend_cpu0[pid]
                sampler, self.sampler = self.sampler, None
                sampler.stop()
                errors = list(sampler.errors)
        shutil.rmtree(run_dir, ignore_errors=True)  # the per-transaction logs are large and not needed here
        elapsed = t1 - t0
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        return RunResult(pair, arm, summary.tps, summary.latency_avg_ms, summary.transactions, elapsed,
                         cpu / elapsed, {k: v / elapsed for k, v in backend_s.items()}, errors)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        self.lab.teardown()


# ------------------------------------------------------------------ statistics
def ratio_stats(ratios: Sequence[float]) -> dict[str, float | None]:
    """Median, geometric mean, and the Student-t 95 % interval of the arithmetic mean of the pair ratios."""
    n = len(ratios)
    mean = statistics.fmean(ratios)
    out: dict[str, float | None] = {
        "n": n,
        "median": statistics.median(ratios),
        "geomean": math.exp(statistics.fmean(math.log(r) for r in ratios)),
        "mean": mean,
        "ci95_low": None,
        "ci95_high": None,
    }
    if n >= 2:
        half = float(stats.t.ppf(0.975, n - 1)) * statistics.stdev(ratios) / math.sqrt(n)
        out["ci95_low"], out["ci95_high"] = mean - half, mean + half
    return out


@dataclass
class CostRow:
    probe: str
    interval_s: float
    calls: int
    wall_mean_ms: float
    wall_p99_ms: float
    cpu_mean_ms: float
    cpu_core_pct: float  # share of one core spent in this probe's sample() over the B runs' time


def cost_rows(costs: dict[str, ProbeCost], measured_s: float) -> list[CostRow]:
    rows: list[CostRow] = []
    for c in costs.values():
        if not c.wall_s:
            continue
        wall = sorted(c.wall_s)
        rows.append(CostRow(
            c.name, c.interval, len(wall), statistics.fmean(wall) * 1e3,
            wall[min(len(wall) - 1, int(0.99 * len(wall)))] * 1e3, statistics.fmean(c.cpu_s) * 1e3,
            sum(c.cpu_s) / measured_s * 100 if measured_s > 0 else 0.0))
    return sorted(rows, key=lambda r: -r.cpu_core_pct)


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version()}


# ------------------------------------------------------------------ main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--workload", default="select-only",
                    choices=["select-only", "tpcb-like", "simple-update"],
                    help="select-only (default) is the most CPU-bound, so the most sensitive to probe CPU")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=None, help="pgbench -j (default: min(clients, cores))")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    ap.add_argument("--warmup", type=float, default=5.0, help="one discarded bare run first (0: none)")
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--synchronous-commit", default="on")
    ap.add_argument("--wait-hz", type=float, default=5.0, help="wait-event probe rate (pglab's default 5)")
    ap.add_argument("--set", action="append", default=[], type=_param, metavar="NAME=VALUE",
                    help="a PostgreSQL parameter for the lab (repeatable)")
    ap.add_argument("--aa", action="store_true",
                    help="A/A control: B runs without probes too, to see the noise floor of the ratio")
    ap.add_argument("--json", type=Path, default=None, help="write every figure to this file")
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.duration < 1 or args.clients < 1:
        ap.error("--pairs, --clients and --duration must be at least 1")
    return args


def _param(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError("expected NAME=VALUE")
    return name, value


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:  # Ctrl-C and SIGTERM both tear the lab down (SIGINT even if the parent ignored it)
        signal.signal(sig, _terminate)
    work = Path(tempfile.mkdtemp(prefix="pglab-overhead-"))
    bench: Bench | None = None
    results: list[RunResult] = []
    started = time.time()
    try:
        bench = Bench(args, work)
        print(f"probe overhead: {args.workload}, {args.clients} clients, {bench.jobs} jobs, "
              f"{args.pairs} pairs × 2 × {args.duration:g} s, synchronous_commit={args.synchronous_commit}",
              flush=True)
        bench.setup()
        if args.warmup > 0:
            w = bench.one_run(0, "warmup", seconds=args.warmup)
            print(f"  warm-up (discarded): {w.tps:.1f} tps", flush=True)
        for pair in range(1, args.pairs + 1):
            order = ("A", "B") if pair % 2 == 1 else ("B", "A")  # pair 1 A B, pair 2 B A …
            got = {arm: bench.one_run(pair, arm) for arm in order}
            results += [got[order[0]], got[order[1]]]
            a, b = got["A"], got["B"]
            print(f"  pair {pair:>2} ({order[0]}{order[1]}): A {a.tps:10.1f}  B {b.tps:10.1f}  "
                  f"B/A {b.tps / a.tps:.4f}", flush=True)
            for e in b.probe_errors:
                print(f"    probe error: {e}", flush=True)
    except KeyboardInterrupt:
        print("interrupted; tearing the lab down", file=sys.stderr)
        return 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)  # teardown must not be cut short
        try:
            if bench is not None:
                bench.close()
        finally:
            shutil.rmtree(work, ignore_errors=True)
            for sig, handler in saved.items():
                signal.signal(sig, handler)

    assert bench is not None
    report(args, bench, results, started)
    return 0


def report(args: argparse.Namespace, bench: Bench, results: list[RunResult], started: float) -> None:
    by_pair: dict[int, dict[str, RunResult]] = {}
    for r in results:
        by_pair.setdefault(r.pair, {})[r.arm] = r
    pairs = [(p, d["A"], d["B"]) for p, d in sorted(by_pair.items())]
    ratios = [b.tps / a.tps for _, a, b in pairs]
    rs = ratio_stats(ratios)
    b_runs = [b for _, _, b in pairs]
    measured_b = sum(b.elapsed_s for b in b_runs)
    costs = cost_rows(bench.costs, measured_b)
    # server-side CPU of each probe's connection, as a share of one core over the B runs
    backend: dict[str, float] = {}
    for b in b_runs:
        for name, cores in b.probe_backend_cpu_cores.items():
            backend[name] = backend.get(name, 0.0) + cores * b.elapsed_s / measured_b * 100
    a_cpu = statistics.fmean(a.pglab_cpu_cores for _, a, _ in pairs) * 100
    b_cpu = statistics.fmean(b.pglab_cpu_cores for b in b_runs) * 100
    probe_cpu = (b_cpu - a_cpu) + sum(backend.values())  # % of one core
    ncpu = os.cpu_count() or 1

    print()
    label = "B/A" if not args.aa else "B/A (A/A: no probes in B)"
    print(f"{'pair':>4} {'order':>5} {'TPS A':>10} {'TPS B':>10} {'B/A':>7} {'pglab CPU A':>11} "
          f"{'pglab CPU B':>11} {'probe backends':>14}")
    for p, a, b in pairs:
        order = "AB" if p % 2 == 1 else "BA"
        be = f"{sum(b.probe_backend_cpu_cores.values()) * 100:.2f} %" if b.probe_backend_cpu_cores else "-"
        print(f"{p:>4} {order:>5} {a.tps:>10.1f} {b.tps:>10.1f} {b.tps / a.tps:>7.4f} "
              f"{a.pglab_cpu_cores * 100:>9.2f} % {b.pglab_cpu_cores * 100:>9.2f} % {be:>14}")
    print("(CPU columns: share of one core, over the run; probe backends: the probes' server processes)")
    print()
    ci = f"[{rs['ci95_low']:.4f}, {rs['ci95_high']:.4f}]" if rs["ci95_low"] is not None else "n/a (1 pair)"
    print(f"{label}: median {rs['median']:.4f}   geometric mean {rs['geomean']:.4f}   "
          f"mean {rs['mean']:.4f}, Student-t 95 % CI {ci}")
    median = float(rs["median"] or 0)
    low = rs["ci95_low"]
    verdict = "met" if median >= TARGET_RATIO else "NOT met"
    print(f"target B/A ≥ {TARGET_RATIO}: {verdict} by the median"
          + (f"; CI lower bound {low:.4f} {'≥' if low >= TARGET_RATIO else '<'} {TARGET_RATIO}"
             if low is not None else ""))
    if not costs:
        _write_json(args, bench, results, pairs, rs, costs, backend, a_cpu, b_cpu, started)
        return
    print()
    print("probe cost, measured in the B runs: each probe's sample() timed on the Sampler's own calls")
    print("(CPU ms: CPU of the probe's thread per call; % core: that CPU over the B runs' time;")
    print(" backend: CPU of the probe's server connection, from /proc/<pid>/schedstat)")
    print(f"{'probe':>6} {'every':>7} {'calls':>6} {'wall ms':>8} {'wall p99':>9} {'CPU ms':>7} "
          f"{'% core':>7} {'backend':>8}")
    for c in costs:
        be = f"{backend[c.probe]:>7.2f}%" if c.probe in backend else f"{'-':>8}"
        print(f"{c.probe:>6} {c.interval_s:>6.2f}s {c.calls:>6} {c.wall_mean_ms:>8.3f} {c.wall_p99_ms:>9.3f} "
              f"{c.cpu_mean_ms:>7.3f} {c.cpu_core_pct:>6.2f}% {be}")
    total = sum(c.cpu_core_pct for c in costs)
    print(f"{'all':>6} {'':>7} {'':>6} {'':>8} {'':>9} {'':>7} {total:>6.2f}% {sum(backend.values()):>7.2f}%")
    print(f"whole pglab process: {a_cpu:.2f} % of one core in A, {b_cpu:.2f} % in B")
    print(f"CPU taken by the probes (pglab B - A, plus backends): {probe_cpu:.2f} % of one core = "
          f"{probe_cpu / ncpu:.2f} % of this {ncpu}-core machine")
    print("  (about the share of TPS a CPU-bound run could lose to them: an estimate, not the A/B result)")
    _write_json(args, bench, results, pairs, rs, costs, backend, a_cpu, b_cpu, started)


def _write_json(args: argparse.Namespace, bench: Bench, results: list[RunResult],
                pairs: list[tuple[int, RunResult, RunResult]], rs: dict[str, float | None],
                costs: list[CostRow], backend: dict[str, float], a_cpu: float, b_cpu: float,
                started: float) -> None:
    if not args.json:
        return
    args.json.write_text(json.dumps({
        "benchmark": "probe-overhead",
        "started": started,
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        | {"jobs": bench.jobs},
        "runs": [asdict(r) for r in results],
        "pairs": [{"pair": p, "order": "AB" if p % 2 == 1 else "BA", "tps_a": a.tps, "tps_b": b.tps,
                   "ratio": b.tps / a.tps} for p, a, b in pairs],
        "ratio": rs,
        "target": TARGET_RATIO,
        "probe_cost": [asdict(c) for c in costs],
        "probe_backend_core_pct": backend,
        "pglab_cpu_core_pct": {"A": a_cpu, "B": b_cpu},
    }, indent=1))
    print(f"written {args.json}")


if __name__ == "__main__":
    sys.exit(main())
