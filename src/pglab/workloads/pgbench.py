"""pgbench: dataset initialisation and reset, one run with progress and per-transaction log, parsing.

Figures come from pgbench itself: TPS is the ``tps = … (without initial connection time)`` line of its
output; percentiles are computed from its per-transaction log (``-l``), latency series from its
``-P 1 --progress-timestamp`` lines, so every number can be recomputed from the artifacts.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pglab import interrupts
from pglab.plan.load import resolve_path
from pglab.plan.schema import CustomWorkload, Dataset, Run
from pglab.targets.base import Endpoint, PlanCodeUser
from pglab.targets.local import cgroups, procs

if TYPE_CHECKING:  # numpy and the log scanner (txlog) load in the functions reading logs: `pglab --help` needs neither
    import numpy as np

    from pglab.workloads import txlog

PGBENCH_TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")
PERCENTILES = (50, 95, 99)
INIT_BASE_S = 600.0  # pgbench -i's deadline: this much, plus INIT_S_PER_SCALE per scale unit
INIT_S_PER_SCALE = 3.0

_PROGRESS = re.compile(
    r"^progress: (?P<t>[\d.]+) s, (?P<tps>[\d.]+) tps, lat (?P<lat>[\d.]+|NaN) ms stddev (?P<sd>[\d.]+|NaN)"
    r"(?:, (?P<failed>\d+) failed)?(?:, lag (?P<lag>[\d.]+) ms)?"
)


class PgbenchError(Exception):
    """pgbench failed; the message carries pgbench's own last words."""


@dataclass
class ProgressPoint:
    ts: float  # epoch seconds, end of the 1-second interval
    tps: float
    latency_ms: float | None
    stddev_ms: float | None
    failed: int | None
    lag_ms: float | None


@dataclass
class PgbenchSummary:
    """What pgbench printed at the end of a run."""

    tps: float
    latency_avg_ms: float | None
    latency_stddev_ms: float | None
    initial_connection_ms: float | None
    transactions: int
    failed: int
    duration_s: float | None
    # with a rate (-R) and a latency limit: what pgbench says of the schedule
    schedule_lag_ms: float | None = None  # mean delay from a transaction's scheduled start to its actual start
    schedule_lag_max_ms: float | None = None
    skipped: int | None = None  # already later than the limit at their scheduled start: never run
    late: int | None = None  # ran, and took longer than the limit (from the scheduled start)


@dataclass
class LogStats:
    count: int
    latency_mean_ms: float
    percentiles_ms: dict[int, float]
    latency_max_ms: float
    first_start: float
    last_end: float


@dataclass
class PgbenchRun:
    summary: PgbenchSummary
    log: LogStats | None
    progress: list[ProgressPoint]
    window_start: float
    window_end: float
    command: list[str]
    returncode: int
    files: list[Path] = field(default_factory=list)


# ------------------------------------------------------------------ parsing
def parse_summary(text: str) -> PgbenchSummary:
    def num(pattern: str) -> float | None:
        m = re.search(pattern, text, re.MULTILINE)
        return float(m.group(1)) if m else None

    tps = num(r"^tps = ([\d.]+) \(without initial connection time\)")
    if tps is None:
        raise PgbenchError("pgbench printed no 'tps = … (without initial connection time)' line")
    processed = num(r"^number of transactions actually processed: (\d+)")
    return PgbenchSummary(
        tps=tps,
        latency_avg_ms=num(r"^latency average = ([\d.]+) ms"),
        latency_stddev_ms=num(r"^latency stddev = ([\d.]+) ms"),
        initial_connection_ms=num(r"^initial connection time = ([\d.]+) ms"),
        transactions=int(processed or 0),
        failed=int(num(r"^number of failed transactions: (\d+)") or 0),
        duration_s=num(r"^duration: ([\d.]+) s"),
        schedule_lag_ms=num(r"^rate limit schedule lag: avg ([\d.]+) \(max [\d.]+\) ms"),
        schedule_lag_max_ms=num(r"^rate limit schedule lag: avg [\d.]+ \(max ([\d.]+)\) ms"),
        skipped=None if (skipped := num(r"^number of transactions skipped: (\d+)")) is None else int(skipped),
        late=None if (late := num(r"^number of transactions above the [\d.]+ ms latency limit: (\d+)/")) is None
        else int(late),
    )


def parse_progress_line(line: str) -> ProgressPoint | None:
    m = _PROGRESS.match(line.strip())
    if not m:
        return None

    def f(name: str) -> float | None:
        v = m.group(name)
        return None if v is None or v == "NaN" else float(v)

    failed = m.group("failed")
    return ProgressPoint(float(m.group("t")), float(m.group("tps")), f("lat"), f("sd"),
                         int(failed) if failed is not None else None, f("lag"))


def txlog_stats(log: txlog.TxLog, last_use: bool = False) -> LogStats | None:
    """The figures of a :class:`txlog.TxLog` without float64 copies: percentiles by linear interpolation between
    closest ranks (numpy's default, Excel's PERCENTILE.INC), exact from the int32 µs; the mean from the exact
    integer sum. ``last_use: the percentiles partition the log's
    latencies in place (no 40 MB copy for 10 M transactions); the log is not to be used afterwards."""
    import numpy as np

    from pglab.workloads import txlog
    if log.count == 0:
        return None
    lat = log.latency_us
    first, last = txlog.first_start(log), log.last_end()
    mean, top = float(lat.sum(dtype=np.int64)) / log.count / 1000.0, float(lat.max()) / 1000.0
    pct = txlog.percentiles_ms(lat, PERCENTILES, in_place=last_use)
    return LogStats(count=log.count, latency_mean_ms=mean, percentiles_ms=dict(zip(PERCENTILES, pct, strict=True)),
                    latency_max_ms=top, first_start=first, last_end=last)


def summary_stats(summary: txlog.Summary) -> LogStats | None:
    """:func:`txlog_stats` of the same logs, from their :class:`txlog.Summary`: the same figures, bit for bit."""
    if summary.count == 0:
        return None
    pct = summary.percentiles_ms(PERCENTILES)
    return LogStats(count=summary.count, latency_mean_ms=float(summary.total_us) / summary.count / 1000.0,
                    percentiles_ms=dict(zip(PERCENTILES, pct, strict=True)),
                    latency_max_ms=float(summary.max_us) / 1000.0, first_start=summary.first_start,
                    last_end=summary.last_end)


def log_figures(files: Sequence[Path], histogram: Path) -> LogStats | None:
    """The figures of -l logs, read once block by block (no transaction kept), and their latency histogram
    written to ``histogram`` (when there is a transaction)."""
    from pglab.workloads import txlog
    summary = txlog.summarise(files)
    if summary.count:
        summary.histogram().save(histogram)
    return summary_stats(summary)


def summarise_logs(log_prefix: Path) -> tuple[LogStats | None, list[Path]]:
    """Read a run's -l logs once: figures, the latency histogram kept beside them (``latency_histogram.json``,
    mergeable across repeats/tenants/processes), then the logs gzip-compressed; returns the logs as now named."""
    from pglab.workloads import txlog
    files = sorted(log_prefix.parent.glob(log_prefix.name + ".*"))
    files = [f for f in files if not f.name.endswith(".part")]
    stats = log_figures(files, log_prefix.parent / txlog.HISTOGRAM_FILE)
    return stats, txlog.compress(files)


# ------------------------------------------------------------------ command lines
def script_args(workload: str | CustomWorkload, base_dir: Path) -> list[str]:
    if isinstance(workload, str):
        return ["-b", workload]
    args: list[str] = []
    for s in workload.scripts:
        if s.builtin:
            args += ["-b", f"{s.builtin}@{s.weight}"]
        else:
            assert s.file is not None
            args += ["-f", f"{resolve_path(s.file, base_dir)}@{s.weight}"]
    return args


def run_args(bindir: Path, workload: str | CustomWorkload, clients: int, jobs: int, run: Run,
             base_dir: Path, *, seconds: float | None, transactions: int | None,
             log_prefix: Path | None, rate: float | None = None) -> list[str]:
    """pgbench's command line for one load; ``rate`` (the point's, or a load pod's share of it) before run.rate."""
    args = [str(bindir / "pgbench"), "-n", "-c", str(clients), "-j", str(jobs), "-M", run.protocol,
            "-P", "1", "--progress-timestamp"]
    if transactions is not None:
        args += ["-t", str(transactions)]
    else:
        args += ["-T", str(max(1, round(seconds or 1)))]
    if rate := rate or run.rate:
        args += ["-R", f"{rate:g}"]
    if run.latency_limit:
        args += [f"--latency-limit={run.latency_limit * 1000:g}"]
    if log_prefix is not None:
        args += ["-l", f"--log-prefix={log_prefix}"]
        if run.sampling_rate < 1:
            args += [f"--sampling-rate={run.sampling_rate:g}"]
    return args + script_args(workload, base_dir)


def stage_scripts(workload: str | CustomWorkload, plan_dir: Path, work_dir: Path, as_user: bool) -> tuple[Path, Path]:
    """The folder to resolve the scripts against, and the -l log prefix. As the lab user (``as_user``) pgbench may
    not reach the plan's folder (root's) nor the results': it starts in ``work_dir`` and opens everything relative
    to it, the script files copied to ``work_dir``/scripts (the copies also keep, with the run, the code that ran)."""
    if not as_user:
        return plan_dir, work_dir / "pgbench_log"
    if isinstance(workload, str):
        return plan_dir, Path("pgbench_log")
    for s in workload.scripts:
        if s.file is not None:
            copy = work_dir / "scripts" / s.file
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(resolve_path(s.file, plan_dir), copy)
            os.chmod(copy, 0o644)
    return Path("scripts"), Path("pgbench_log")


# ------------------------------------------------------------------ running
def _reclaim(folder: Path, uid: int, gid: int) -> None:
    """``folder`` and every folder below it owned by uid:gid and not writable by others; symlinks, special files and
    hard links in them removed (never followed)."""
    os.chown(folder, uid, gid, follow_symlinks=False)
    os.chmod(folder, stat.S_IMODE(os.lstat(folder).st_mode) & ~0o022)
    with os.scandir(folder) as entries:
        for entry in list(entries):
            if entry.is_dir(follow_symlinks=False):
                _reclaim(Path(entry.path), uid, gid)
            elif not entry.is_file(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_nlink > 1:
                os.unlink(entry.path)  # a symlink, a FIFO, a socket, a device, or a hard link to another's file


class PgbenchProcess:
    """One pgbench invocation: started in its own session so that a terminal Ctrl-C reaches pglab only,
    and pglab decides how pgbench ends."""

    def __init__(self, args: list[str], endpoint: Endpoint, out_dir: Path, name: str,
                 on_progress: Callable[[ProgressPoint], None] | None = None, *, run_as: PlanCodeUser | None = None,
                 procs_files: Sequence[Path] = ()):
        """``procs_files``: the cgroup pgbench must be in before it runs. ``run_as``: the user pgbench (and the
        plan's ``\\shell`` commands) run as; ``out_dir`` is then that user's while pgbench runs, for its -l logs."""
        self.args = args
        self.out_dir = out_dir
        self.name = name
        self.on_progress = on_progress
        self.progress: list[ProgressPoint] = []
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(endpoint.env())
        self.stdout_path = out_dir / f"{name}.out"
        self.stderr_path = out_dir / f"{name}.err"
        self._stdout = open(self.stdout_path, "w")  # noqa: SIM115 - closed in wait()
        # opened before the folder may become the lab user's: nothing of pglab is opened by name while it is
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - closed by the reader thread
        self._owner: tuple[int, int] | None = None
        if run_as is None:
            self.proc = subprocess.Popen(cgroups.wrap(args, list(procs_files)), cwd=out_dir, env=env,
                                         stdout=self._stdout, stderr=subprocess.PIPE, text=True,
                                         start_new_session=True)
        else:
            env["PGPASSFILE"] = str(run_as.passfile)
            self.proc = self._start_as(run_as, env, procs_files)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _start_as(self, user: PlanCodeUser, env: dict[str, str], procs_files: Sequence[Path]
                  ) -> subprocess.Popen[str]:
        """pgbench as ``user``. It cannot enter a root-owned cgroup itself, so it waits at the door (a shell
        reading a line) until pglab has moved it into the group, then execs; if that fails it never runs."""
        st = self.out_dir.stat()
        self._owner = (st.st_uid, st.st_gid)
        os.chown(self.out_dir, user.uid, user.gid)
        args = ["sh", "-c", 'read -r _go && exec "$@"', "sh", *self.args] if procs_files else self.args
        try:
            # stdin: the door's pipe, never pglab's terminal
            proc = subprocess.Popen(args, cwd=self.out_dir, env=env,
                                    stdin=subprocess.PIPE if procs_files else subprocess.DEVNULL,
                                    stdout=self._stdout, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                    user=user.uid, group=user.gid, extra_groups=[])
        except BaseException:
            self._stdout.close()
            self._stderr.close()
            self._give_back()
            raise
        if procs_files:
            assert proc.stdin is not None
            try:
                for f in procs_files:
                    f.write_text(str(proc.pid))
                proc.stdin.write("go\n")
                proc.stdin.close()
            except OSError as exc:
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # EOF: the shell exits without running pgbench
                proc.wait(timeout=10)
                self._stdout.close()
                self._stderr.close()
                self._give_back()
                raise PgbenchError(f"pgbench could not enter its cgroup ({exc})") from None
        return proc

    def _give_back(self) -> None:
        r"""The run folder back to its owner, made safe for pglab (root) to write in again: while it was the lab
        user's, the plan's ``\shell`` could plant a symlink (``latency_histogram.json`` → /etc/shadow), a FIFO or a
        folder of its own there. Every folder becomes the owner's again (first, so nothing new appears in it while
        it is read), anything that is neither a regular file nor a folder is removed; the files pgbench wrote stay
        the lab user's (pglab only reads them)."""
        if self._owner is not None:
            _reclaim(self.out_dir, *self._owner)
            self._owner = None
            for path in (self.stdout_path, self.stderr_path):  # moved away: the run then fails on an empty output
                if not path.exists():
                    path.touch(exist_ok=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        err, writing = self._stderr, True
        try:
            for line in self.proc.stderr:  # read to the end whatever happens, or pgbench blocks on a full pipe
                if writing:
                    try:
                        err.write(line)
                    except OSError:  # a full disk: the run fails on its missing outputs, pgbench must not hang
                        writing = False
                p = parse_progress_line(line)
                if p is not None:
                    self.progress.append(p)
                    if self.on_progress:
                        self.on_progress(p)
        finally:
            with contextlib.suppress(OSError):  # the last flush on a full disk
                err.close()

    def poll_for(self, seconds: float) -> int | None:
        """Wait up to ``seconds`` for pgbench to end; its exit code, or None while it still runs. A safe point: a
        recorded Ctrl-C or SIGTERM raises RunInterrupted here (pgbench left running: :meth:`stop` is the caller's)."""
        try:
            return interrupts.wait(self.proc, timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            self._reader.join(timeout=5)
            self._stdout.close()
            if self.proc.poll() is not None:
                self._give_back()
        return rc

    def stop(self, grace: float = 5.0) -> None:
        """Interrupt pgbench (it then prints what it has), then kill it if it lingers."""
        procs.end_group(self.proc, signal.SIGINT, grace)
        self.wait(timeout=5)


def finish_run(proc: PgbenchProcess, rc: int, log_prefix: Path, launched: float, ended: float) -> PgbenchRun:
    out = proc.stdout_path.read_text()
    if rc != 0:
        err = proc.stderr_path.read_text().strip().splitlines()
        last = [line for line in err if not line.startswith("progress:")][-2:]
        how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        raise PgbenchError(f"pgbench {how}: {' / '.join(last) or 'no message'}")
    summary = parse_summary(out)
    stats, log_files = summarise_logs(log_prefix)
    if stats is not None:
        start, stop = stats.first_start, stats.last_end
    elif proc.progress:
        start, stop = proc.progress[0].ts - 1.0, proc.progress[-1].ts
    else:
        start, stop = launched, ended
    return PgbenchRun(summary, stats, list(proc.progress), start, stop, proc.args, rc,
                      [proc.stdout_path, proc.stderr_path, *log_files])


_ABORTED = re.compile(r"^pgbench: error: client \d+ aborted|^client \d+ aborted", re.MULTILINE)


def finish_segments(segments: Sequence[tuple[PgbenchProcess, int]], log_prefix: Path, launched: float,
                    ended: float) -> tuple[PgbenchRun, dict[str, float]]:
    """One run made of several pgbench processes: the load started again each time a fault ended it.

    No single pgbench line covers the run, so its figures are recomputed from the segments: transactions and
    failures add up, TPS is all transactions over the whole window (``launched`` to ``ended``, outage included),
    latency comes from the union of the per-transaction logs, progress lines are concatenated. Also returns how
    many times pgbench ran and how many clients were aborted (their transaction in flight lost with the server)."""
    summaries: list[PgbenchSummary] = []
    aborted = 0
    for proc, _rc in segments:
        err = proc.stderr_path.read_text(errors="replace")
        aborted += len(_ABORTED.findall(err))
        try:
            summaries.append(parse_summary(proc.stdout_path.read_text(errors="replace")))
        except PgbenchError:
            continue  # a start that could not connect (no primary yet): no transaction, no summary
    if not summaries:
        proc, rc = segments[-1]
        last = proc.stderr_path.read_text(errors="replace").strip().splitlines()[-1:]
        raise PgbenchError(f"pgbench never ran through the scenario (last exit code {rc}: {' '.join(last)})")
    stats, log_files = summarise_logs(log_prefix)
    transactions = sum(x.transactions for x in summaries)
    window = max(ended - launched, 1e-9)
    weighted = [(x.latency_avg_ms, x.transactions) for x in summaries if x.latency_avg_ms is not None]
    latency = (sum(v * n for v, n in weighted) / sum(n for _v, n in weighted)
               if weighted and sum(n for _v, n in weighted) else None)
    summary = PgbenchSummary(tps=transactions / window, latency_avg_ms=latency, latency_stddev_ms=None,
                             initial_connection_ms=None, transactions=transactions,
                             failed=sum(x.failed for x in summaries), duration_s=window)
    progress = [p for proc, _rc in segments for p in proc.progress]
    files = [f for proc, _rc in segments for f in (proc.stdout_path, proc.stderr_path)] + log_files
    run = PgbenchRun(summary, stats, progress, launched, ended, segments[0][0].args, 0, files)
    return run, {"pgbench_starts": float(len(segments)), "clients_aborted": float(aborted)}


def phase_stats(latency: np.ndarray, end_ts: np.ndarray, start: float, stop: float,
                scale: float = 1.0) -> tuple[float, float | None]:
    """TPS and mean latency (ms) of the transactions that ended in [start, stop) (from the per-transaction log);
    ``latency`` in ms, or in µs with ``scale=1000`` (a :class:`txlog.TxLog`'s, no float64 copy of it all)."""
    if stop <= start:
        return 0.0, None
    mask = (end_ts >= start) & (end_ts < stop)
    n = int(mask.sum())
    return n / (stop - start), float((latency[mask] / scale).mean()) if n else None


# ------------------------------------------------------------------ dataset
def dataset_state(conn: Any) -> dict[str, int] | None:
    """The scale and partition count of the pgbench dataset present, or None."""
    exists = conn.execute("SELECT count(*) FROM pg_class WHERE relname = ANY(%s) AND relkind IN ('r','p')",
                          (list(PGBENCH_TABLES),)).fetchone()[0]
    if exists != len(PGBENCH_TABLES):
        return None
    scale = conn.execute("SELECT count(*) FROM pgbench_branches").fetchone()[0]
    parts = conn.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgbench_accounts'::regclass").fetchone()[0]
    return {"scale": int(scale), "partitions": int(parts)}


def init_args(bindir: Path, dataset: Dataset, *, client_side: bool = False) -> list[str]:
    """``pgbench -i`` for the plan's dataset. The rows are generated in the server (``G``: no rows over the
    connection) unless ``client_side`` (``g``, pgbench's default: COPY from the client, which spares a
    CPU-limited server the generation; the Kubernetes Jobs' choice)."""
    steps = "dtgvp" if client_side else "dtGvp"
    args = [str(bindir / "pgbench"), "-i", "-s", str(dataset.scale), "-q", f"--init-steps={steps}"]
    if dataset.partitions:
        args += [f"--partitions={dataset.partitions}"]
    return args


def init_deadline_s(dataset: Dataset) -> float:
    """How long ``pgbench -i`` may take: 10 min, plus 3 s per scale unit (this 2-core machine loads one in 0.2 s;
    a volume ten times slower still fits). Past it the server is not answering (a synchronous standby frozen, a
    primary stopped) rather than slow."""
    return INIT_BASE_S + INIT_S_PER_SCALE * dataset.scale


def initialise(bindir: Path, endpoint: Endpoint, dataset: Dataset, out_dir: Path,
               timeout_s: float | None = None) -> float:
    """pgbench -i at the plan's scale, within ``timeout_s`` (default :func:`init_deadline_s`); output kept as an
    artifact. Returns seconds taken."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(endpoint.env())
    t0 = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = init_deadline_s(dataset) if timeout_s is None else timeout_s
    with open(out_dir / "pgbench-init.out", "w") as out:
        try:  # on the deadline or a recorded interrupt, pgbench -i is killed and reaped
            proc = interrupts.run(init_args(bindir, dataset), env=env, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True, cwd=out_dir, timeout=deadline)
        except subprocess.TimeoutExpired:
            raise PgbenchError(f"pgbench -i did not end within {deadline:.0f} s (the server stopped answering, or is "
                               f"far slower than that allows); its output: {out_dir / 'pgbench-init.out'}") from None
    if proc.returncode != 0:
        tail = (out_dir / "pgbench-init.out").read_text().strip().splitlines()[-2:]
        raise PgbenchError(f"pgbench -i failed: {' / '.join(tail)}")
    return time.monotonic() - t0


def end_leftover_sessions(conn: Any, grace_s: float = 5.0) -> list[str]:
    """Cancel, then terminate, the backends of a pgbench that is gone (application_name 'pgbench', pgbench's own
    default), so the locks they hold cannot block the next run's reset. Returns one line per backend ended.

    A backend waiting for a synchronous standby's ack ("COMMIT waiting for …") does not end on a cancel: PostgreSQL
    warns "canceling wait for synchronous replication due to user request" and the commit stays committed locally
    (not yet replicated); the terminate that follows ends it, and the replay wait after it says whether the standbys
    receive it. Both calls return at once (pg_terminate_backend without a timeout); the wait for them is bounded."""
    query = ("SELECT pid, coalesce(wait_event, state, '?'), left(query, 60) FROM pg_stat_activity "
             "WHERE application_name = 'pgbench' AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
             "AND datname = current_database() AND usename = current_user")  # pglab's pgbench, no one else's
    rows = conn.execute(query).fetchall()
    if not rows:
        return []
    pids = [r[0] for r in rows]
    deadline = time.monotonic() + grace_s
    for fn in ("pg_cancel_backend", "pg_terminate_backend"):
        conn.execute(f"SELECT {fn}(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        step_end = min(deadline, time.monotonic() + grace_s / 2)
        while (left := {r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,))}
               ) and time.monotonic() < step_end:
            time.sleep(0.1)
        if not left:
            break
    if left:
        raise LeftoverSessions(f"{len(left)} backend(s) of a stopped pgbench did not end within {grace_s:g} s of "
                               f"pg_terminate_backend (pids {', '.join(map(str, sorted(left)))})")
    return [f"pid {pid} ({wait}: {q.strip()})" for pid, wait, q in rows]


class LeftoverSessions(PgbenchError):
    """Backends of a stopped pgbench still there after pg_terminate_backend."""


def reset_for_run(conn: Any, *, untouched: bool = False) -> None:
    """Bring the dataset to a known state before a run (see docs/methodology.md, "Dataset state").

    Write workloads append to pgbench_history and leave dead tuples in accounts/tellers/branches;
    truncating the history, vacuuming and checkpointing gives every run the same starting point:
    no dead tuples, fresh statistics, no dirty buffers waiting to be flushed inside the window.
    ``untouched``: only runs that change no row ran since the last full reset, so the tables are as it left them
    (nothing to truncate, no dead tuple, statistics of the same rows): the CHECKPOINT alone (hint bits a read
    set are dirty buffers too). ANALYZE reads up to 30,000 of accounts' pages each time."""
    if not untouched:
        conn.execute("TRUNCATE pgbench_history")
        conn.execute("VACUUM (ANALYZE) pgbench_branches, pgbench_tellers, pgbench_accounts, pgbench_history")
    conn.execute("CHECKPOINT")


def limit_shares(processed: int, skipped: int | None, late: int | None) -> dict[str, float | None]:
    """With a latency limit: the shares of the scheduled transactions pgbench skipped (already late at their start)
    and of the processed ones that ended late, each present only where pgbench counted it."""
    out: dict[str, float | None] = {}
    if skipped is not None:
        out["skipped_pct"] = skipped / (processed + skipped) * 100 if processed + skipped else None
    if late is not None:
        out["late_pct"] = late / processed * 100 if processed else None
    return out


def pgbench_metrics(result: PgbenchRun) -> dict[str, float | None]:
    """A run's pgbench figures: its summary, and the percentiles of its per-transaction log."""
    s = result.summary
    m: dict[str, float | None] = {
        "tps": s.tps,
        "latency_avg_ms": s.latency_avg_ms,
        "latency_stddev_ms": s.latency_stddev_ms,
        "initial_connection_ms": s.initial_connection_ms,
        "transactions": float(s.transactions),
        "failed": float(s.failed),
        "window_s": result.window_end - result.window_start,
    }
    if s.schedule_lag_ms is not None:  # open loop (-R): latency counts from each transaction's scheduled start
        m.update(schedule_lag_ms=s.schedule_lag_ms, schedule_lag_max_ms=s.schedule_lag_max_ms)
    m.update(limit_shares(s.transactions, s.skipped, s.late))
    if result.log:
        m.update({
            "latency_p50_ms": result.log.percentiles_ms[50],
            "latency_p95_ms": result.log.percentiles_ms[95],
            "latency_p99_ms": result.log.percentiles_ms[99],
            "latency_max_ms": result.log.latency_max_ms,
            "latency_log_mean_ms": result.log.latency_mean_ms,
            "logged_transactions": float(result.log.count),
        })
    return m


def pgbench_series(result: PgbenchRun, source: str,
                   metrics: tuple[str, ...] = ("tps", "latency_ms", "stddev_ms", "failed", "lag_ms")
                   ) -> list[tuple[float, str, str, float | None]]:
    """pgbench's per-second progress lines as series points."""
    return [(p.ts, source, m, v) for p in result.progress for m in metrics if (v := getattr(p, m)) is not None]
