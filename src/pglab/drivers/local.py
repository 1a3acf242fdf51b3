"""The driver of targets pglab reaches as processes and connections: the local lab, the Patroni lab, an external
server. :class:`ProcessDriver` is what they share with the tenants' fleet (provisioning, the storage phase, the
dataset, server logs, teardown); :class:`LocalDriver` does one measured run on one primary."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import psycopg

from pglab import environment, interrupts
from pglab.artifacts import write_json, write_samples
from pglab.engine.driver import FioMeasurement, MeasuredRun, SweepInfo, load_summary_modules
from pglab.engine.types import Event, Observer, RunFailed, RunResult
from pglab.errors import LabError, LabUnsound, RunInterrupted, first_line
from pglab.plan.expand import Point, expand
from pglab.plan.load import resolve_path
from pglab.plan.schema import Plan
from pglab.probes import ProbeContext, ProbeOpenError, Sample, Sampler, default_probes
from pglab.probes.base import now
from pglab.probes.statements import StatementsWindow
from pglab.targets.base import Endpoints, Target, Topology
from pglab.targets.external import ExternalServer
from pglab.targets.local import cgroups, registry
from pglab.workloads import pgbench
from pglab.workloads.pgbench import PgbenchError, PgbenchProcess, pgbench_metrics, pgbench_series

MIB = 1024 * 1024  # MB/s as the disk probe counts them (MiB)

RUN_ERRORS: tuple[type[BaseException], ...] = (RunFailed, PgbenchError, LabError, ProbeOpenError, psycopg.Error)

# pglab's own sessions between runs (docs/reliability.md): a statement or a lock that does not come within these ends
# in an error that names it, never in a silent wait
LOCK_TIMEOUT_S = 30  # the reset's TRUNCATE behind a lock a leftover session holds
STATEMENT_TIMEOUT_S = 900  # VACUUM (ANALYZE) and CHECKPOINT of a large dataset
# the plan's run.replay_stall (no standby behind makes replay progress that long: they stopped answering),
# run.connect_timeout (pglab's own connection to the primary between runs) and run.overrun (how long pgbench may go on
# past its duration) are the other deadlines; their defaults are in pglab.plan.schema.run
REPLAY_MAX_S = 600.0  # progress, but never caught up


TopologyT = TypeVar("TopologyT", bound=Topology)


class ProcessDriver(Generic[TopologyT]):
    """A sweep over a :class:`Topology`: what every process-run target does the same way."""

    run_overhead_s = 3.0
    run_errors = RUN_ERRORS
    # its long waits go through pglab.interrupts: a signal is acted on there, not raised by the handler into whatever
    # code the main thread is in (engine.driver.Driver)

    def __init__(self, plan: Plan, plan_dir: Path, plan_text: str, results_dir: Path, target: TopologyT,
                 ui: Observer):
        self.plan, self.plan_dir, self.plan_text = plan, plan_dir, plan_text
        self.results_dir = results_dir.resolve()  # pgbench runs in the run folder: paths must be absolute
        self.target, self.ui = target, ui
        self.points = expand(plan)
        self._pgbench: list[PgbenchProcess] = []  # what an interrupt must stop
        self._events: list[Event] = []
        self._logs_dir = self.results_dir / "server-logs"
        self._endpoints: Endpoints | None = None
        self._info: SweepInfo | None = None
        self._untouched = False  # only runs that change no row since the last full reset (LocalRun.reset)

    # ------------------------------------------------------------ the sweep's steps
    def preflight(self) -> None:
        for message in registry.reap_orphans():  # a lab a killed pglab left behind goes before a new one starts
            self.ui.log(message)
        self.target.preflight()

    def open(self, first: Point, with_storage: bool, resumed: bool) -> None:
        if resumed:
            self._logs_dir = self.results_dir / "server-logs" / time.strftime("resumed-%Y%m%d-%H%M%S")
        target = self.target
        endpoints = self._endpoints = target.provision(self.parameters(first))
        self._info = SweepInfo(environment.capture(endpoints.primary.conninfo(), target.probe_paths(),
                                                   target.bindir, self.plan_text), target.describe())

    def describe(self) -> SweepInfo | None:
        return self._info

    def storage_phase(self, results_dir: Path) -> Iterator[FioMeasurement]:
        from pglab import storage

        spec = self.plan.storage
        assert spec is not None
        self.ui.log(f"storage phase: fio on {', '.join(spec.paths)} ({spec.runtime:g} s per job)")
        jobs = storage.plan_jobs(spec.profiles, [resolve_path(f, self.plan_dir) for f in spec.job_files])
        paths: dict[str, tuple[Path, str]] = {label: p for label, p in self.target.storage_paths().items()
                                              if label in spec.paths}
        yield from storage.measure(results_dir, paths, jobs, runtime_s=spec.runtime,
                                   size_bytes=spec.size.bytes, log=self.ui.log)

    def load_dataset(self) -> None:
        ds = self.plan.dataset
        endpoints = self._endpoints
        assert endpoints is not None, "open() provisions before the dataset is loaded"
        with psycopg.connect(endpoints.primary.conninfo(), autocommit=True) as conn:
            state = pgbench.dataset_state(conn)
        if state != {"scale": ds.scale, "partitions": ds.partitions or 0}:
            self.ui.log(f"loading the dataset: pgbench -i -s {ds.scale}")
            seconds = pgbench.initialise(self.target.bindir, endpoints.primary, ds, self.results_dir / "dataset")
            self.ui.log(f"dataset loaded in {seconds:.1f} s")

    def before_run(self, point: Point) -> None:
        """Nothing between runs: a run provisions what its point needs itself (a reload, a restart, a CPU step)."""

    def health(self) -> str | None:
        return self.target.health()

    def take_events(self) -> list[Event]:
        events, self._events = self._events + self.target.take_events(), []
        return events

    def explain(self, exc: BaseException) -> BaseException | None:
        """A server's log named in a failure is the lab's, deleted with it: name the copy kept in the results."""
        if not isinstance(exc, LabError):
            return None
        text = str(exc)
        try:
            logs = self.target.server_logs()
        except Exception:  # a lab that never came up has no logs to name
            return None
        kept = {str(path): self._logs_dir / f"{name}.log" for name, path in logs.items() if str(path) in text}
        if not kept:
            return None
        for lab_path, copy in kept.items():
            text = text.replace(lab_path, str(copy))
        return LabError(text)

    def close(self, keep: bool) -> list[str]:
        self._stop_pgbench()
        try:
            self._keep_server_logs()
        finally:
            self.target.teardown(keep=keep)
        return []

    # ------------------------------------------------------------ shared by the runs
    def parameters(self, point: Point) -> dict[str, Any]:
        return {**self.plan.postgres.parameters, **point.parameters, "synchronous_commit": point.synchronous_commit}

    def prepare_dataset(self, target: Target, endpoints: Endpoints, run_dir: Path, untouched: bool = False) -> None:
        """Put the dataset back as the plan's ``dataset.reset`` says, and wait for the standbys to catch up.
        ``untouched``: only runs that change no row ran on this lab since its last full reset (the vacuum reset is
        then its CHECKPOINT alone; a server pglab does not own may have had other writers)."""
        ds = self.plan.dataset
        if target.read_only:  # a server pglab may not write to: the dataset is used as it is
            return
        # a lab whose every standby must stream names them: one missing is behind (an HA lab's membership moves)
        names = [s.name for s in endpoints.standbys] if getattr(target, "all_standbys_stream", False) else []
        stall_s = self.plan.run.replay_stall
        with self._control(endpoints) as conn:
            if not isinstance(target, ExternalServer):  # on a server pglab does not own, others' sessions are theirs
                self._end_leftovers(conn)  # a failed run's backends first: their locks would block the reset
            # standbys that do not answer stop the sweep here, not in a COMMIT
            _wait_replay(conn, names, self.ui.log, stall_s)
            if ds.reset == "vacuum":  # in the same session: the reset restarts no server
                pgbench.reset_for_run(conn, untouched=untouched and not isinstance(target, ExternalServer))
                _wait_replay(conn, names, self.ui.log, stall_s)
                return
        if ds.reset == "reinit":
            pgbench.initialise(target.bindir, endpoints.primary, ds, run_dir)
        elif ds.reset == "snapshot":
            write_json(run_dir / "dataset-reset.json", target.reset_dataset())
        with self._control(endpoints) as conn:
            _wait_replay(conn, names, self.ui.log, stall_s)

    def _control(self, endpoints: Endpoints) -> psycopg.Connection[Any]:
        """pglab's session on the primary between runs. A primary that lets two connections in a row time out is
        frozen (stopped, hung, partitioned) or drowning: the sweep stops in one sentence instead of failing every
        run after it (the plan's run.connect_timeout each)."""
        timeout_s = int(self.plan.run.connect_timeout)
        for attempt in (1, 2):
            try:
                return psycopg.connect(control_conninfo(endpoints, timeout_s), autocommit=True)
            except psycopg.errors.ConnectionTimeout as exc:
                if attempt == 2:
                    raise LabUnsound(
                        f"the primary {endpoints.primary.name} stopped answering (two connections timed out, "
                        f"{timeout_s} s each); the lab cannot run the next point: resume with the same pglab "
                        "run and --results once it answers") from None
                self.ui.log(f"the primary {endpoints.primary.name} does not answer ({first_line(exc)}); one more try")
        raise AssertionError("unreachable")

    def _end_leftovers(self, conn: psycopg.Connection[Any]) -> None:
        """End a stopped pgbench's backends on the primary; each one ended is a sweep event."""
        ended = pgbench.end_leftover_sessions(conn)
        if ended:
            self.ui.log(f"ended {len(ended)} backend(s) a stopped pgbench left on the primary")
            self._events += [(time.time(), "leftover-backend-ended", e) for e in ended]

    def end_leftovers_after_failure(self, endpoints: Endpoints | None) -> None:
        """Best effort right after a failed or stopped run, so its locks do not outlive it (prepare_dataset does it
        again before the next run, where a failure counts)."""
        if endpoints is None or getattr(self.target, "read_only", False) or isinstance(self.target, ExternalServer):
            return
        try:
            timeout_s = min(5, int(self.plan.run.connect_timeout))
            with psycopg.connect(control_conninfo(endpoints, connect_timeout=timeout_s), autocommit=True) as conn:
                self._end_leftovers(conn)
        except (psycopg.Error, PgbenchError) as exc:
            self.ui.log(f"backends of the stopped pgbench not ended yet: {first_line(exc)}")

    @staticmethod
    def settings(endpoints: Endpoints, run_dir: Path) -> dict[str, Any]:
        """The primary's settings that are not defaults, as it reports them (settings.json)."""
        with psycopg.connect(endpoints.primary.conninfo(application_name="pglab-control"),
                             autocommit=True) as conn:
            # pglab's own timeouts set in the session (source 'session'), so they are not the server's settings
            conn.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT_S}s'")
            conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'")
            rows = conn.execute("SELECT name, setting, unit FROM pg_settings WHERE source NOT IN "
                                "('default', 'override', 'session') ORDER BY name").fetchall()
        settings = {n: {"setting": s, "unit": u} for n, s, u in rows}
        write_json(run_dir / "settings.json", settings)
        return settings

    def _stop_pgbench(self) -> None:
        for proc in self._pgbench:
            proc.stop()
        self._pgbench.clear()

    def _keep_server_logs(self) -> None:
        """Copy the server logs into the results (artifacts) and keep checkpoint starts as sweep events."""
        try:
            logs_dir = self._logs_dir
            logs_dir.mkdir(parents=True, exist_ok=True)
            for name, path in self.target.server_logs().items():
                shutil.copyfile(path, logs_dir / f"{name}.log")
            primary_log = logs_dir / "n0.log"
            if primary_log.is_file():
                self._events += checkpoint_events(primary_log.read_text(errors="replace"))
        except OSError as exc:  # artifacts are best effort here: teardown must still happen
            self.ui.log(f"server logs not kept: {exc}")


class LocalDriver(ProcessDriver[Target]):
    """One primary (and its standbys) per run: the local lab, the Patroni lab, an external server."""

    def __init__(self, plan: Plan, plan_dir: Path, plan_text: str, results_dir: Path, target: Target,
                 ui: Observer):
        super().__init__(plan, plan_dir, plan_text, results_dir, target, ui)
        # the logs' summary (numpy, the log scanner) and the closing tables' intervals (scipy.special) load
        # while the lab builds, not in the first run's summary (0.3-0.6 s there) nor at the sweep's end (0.35 s);
        # joined before any run's probes start, so never inside a window
        self._summary_modules = threading.Thread(target=load_summary_modules, name="summary-modules", daemon=True)

    def open(self, first: Point, with_storage: bool, resumed: bool) -> None:
        if self.plan.matrix.cpus:  # the scaling loop: build the lab at its first step, no restart needed for it
            self.target.cpus_axis, self.target.cpus = True, first.cpus
        self._summary_modules.start()
        super().open(first, with_storage, resumed)
        if os.geteuid() == 0 and self.target.plan_code_user() is None:
            self.ui.log("pglab runs as root and this target has no lab user: pgbench and the plan's scripts "
                        "(\\shell, \\setshell) run as root; run pglab as an unprivileged user for a plan you did "
                        "not write")

    def start_run(self, point: Point, repeat: int, run_id: str, run_dir: Path) -> LocalRun:
        return LocalRun(self, point, run_dir)

    def _pgbench_once(self, endpoints: Endpoints, point: Point, run_dir: Path, name: str, seconds: float | None,
                      transactions: int | None, log: bool, watch_health: bool = True) -> tuple[PgbenchProcess, int]:
        """One pgbench, watched: the target's health each second, and a deadline past its duration."""
        target = self.target
        user = target.plan_code_user()
        scripts, log_prefix = pgbench.stage_scripts(point.workload, self.plan_dir, run_dir, user is not None)
        args = pgbench.run_args(target.bindir, point.workload, point.clients, point.jobs, self.plan.run,
                                scripts, seconds=seconds, transactions=transactions,
                                log_prefix=log_prefix if log else None, rate=point.rate)
        # pgbench in its own cgroup when the plan asks, as the lab user when pglab is root
        proc = PgbenchProcess(args, endpoints.primary, run_dir, name, on_progress=self.ui.progress, run_as=user,
                              procs_files=target.client_procs_files())
        self._pgbench.append(proc)

        def stuck(_names: list[str], late: float) -> str:
            answers = _answers(endpoints, min(5, int(self.plan.run.connect_timeout)))
            why = ("transactions stuck (a synchronous standby not answering?)" if answers
                   else f"the primary {endpoints.primary.name} does not answer (a connection timed out)")
            return f"pgbench did not end {late:.0f} s after its {seconds:g} s: {why}"

        try:
            rc = watch({name: proc}, name, seconds, target.health if watch_health else lambda: None, self.ui.log,
                       stuck, overrun_s=self.plan.run.overrun_s(seconds) if seconds else None)[name]
        except BaseException:  # a failure or an interrupt while waiting: pgbench lives in its own session
            proc.stop()
            raise
        finally:
            self._pgbench.remove(proc)
        if name == "warmup" and rc != 0:
            err = proc.stderr_path.read_text().strip().splitlines()
            raise PgbenchError(f"warm-up pgbench exited with code {rc}: {(err or ['no message'])[-1]}")
        return proc, rc


class LocalRun(MeasuredRun):
    """One measured run on one primary (and its standbys), step by step; :func:`pglab.engine.run.measure` calls
    the steps. A scenario's run (a fault under load) is the load step of its own run (:mod:`pglab.drivers.faults`)."""

    def __init__(self, driver: LocalDriver, point: Point, run_dir: Path):
        self.d, self.target, self.point, self.run_dir = driver, driver.target, point, run_dir
        self.warmup_s = driver.plan.run.warmup
        self.endpoints: Endpoints | None = None
        self.sampler: Sampler | None = None
        self.statements: StatementsWindow | None = None
        self.limits: dict[str, Any] = {}
        self.settings: dict[str, Any] = {}
        self.events: list[Event] = []
        self.samples: list[Sample] = []
        self.measured: tuple[PgbenchProcess, int] | None = None  # pgbench as it ended, read in the summary
        self.result: pgbench.PgbenchRun | None = None
        self.scenario_metrics: dict[str, float | None] = {}
        self.primary_name = ""
        self.primary_at_end: str | None = ""  # "": not looked at again after the window (io_metrics)

    @property
    def ep(self) -> Endpoints:
        assert self.endpoints is not None, "prepare() provisions before anything else"
        return self.endpoints

    def prepare(self) -> None:
        d, target = self.d, self.target
        self.endpoints = target.provision(d.parameters(self.point))
        if self.point.cpus is not None:
            target.set_cpus(self.point.cpus)
        d._events += target.take_events()
        if problem := target.health():
            raise RunFailed(problem)
        self.limits = target.limits_in_force()
        if self.limits:
            write_json(self.run_dir / "limits.json", self.limits)
        if links := target.links_in_force():  # the replication links as Toxiproxy shapes them during this run
            write_json(self.run_dir / "network.json", links)

    def reset(self) -> None:
        d = self.d
        untouched, d._untouched = d._untouched, False  # a reset that fails leaves the dataset's state unknown
        d.prepare_dataset(self.target, self.ep, self.run_dir, untouched)
        d._untouched = self.point.reads_only  # this run, whatever its end, leaves the dataset as reset if it reads
        d._events += self.target.take_events()  # a snapshot reset's own

    def start_probes(self) -> None:
        """The settings read, the probes opened and pg_stat_statements found, side by side: each is mostly its own
        connection's round trips (one after the other they took 0.07-0.2 s before every run). All before the
        window; a failure raised is the settings' first, then the probes' (the statements' never fails a run)."""
        d, target, ep = self.d, self.target, self.ep
        if d._summary_modules.ident is not None:  # started with the lab: done long before (a second at most)
            interrupts.join(d._summary_modules)
        ctx = ProbeContext(
            primary_conninfo=ep.primary.conninfo(application_name="pglab-probe"),
            paths=target.probe_paths(),
            server_pids=target.server_pids,
            client_pids=lambda: [p.pid for p in d._pgbench],
            wait_hz=d.plan.probes.wait_hz,
        )
        self.sampler = sampler = Sampler(default_probes(ctx) if d.plan.probes.enabled else [])
        if d.plan.probes.enabled:  # pg_stat_statements where loaded (the extension made only where pglab owns it)
            self.statements = StatementsWindow(ctx.primary_conninfo,
                                               create=not (target.read_only or isinstance(target, ExternalServer)))
        statements = self.statements
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="run-open") as pool:
            settings = pool.submit(d.settings, ep, self.run_dir)
            opened = [pool.submit(sampler.start)] + ([pool.submit(statements.open)] if statements else [])
            interrupts.wait_all([settings, *opened])  # a signal is acted on here; the pool's exit waits the rest
        self.settings = settings.result()
        for future in opened:
            future.result()

    def warm_up(self) -> None:
        self.events.append((now(), "warmup-start", f"{self.warmup_s:g} s"))
        self.d._pgbench_once(self.ep, self.point, self.run_dir, "warmup", seconds=self.warmup_s, transactions=None,
                             log=False)
        self.events.append((now(), "warmup-end", ""))

    def measure(self) -> None:
        d, target, run = self.d, self.target, self.d.plan.run
        self.primary_name = self.primary_at_end = target.primary_name()
        if self.statements:
            self.statements.start(now())
        self.io_before, self.cpu_before, self.launched = target.io_stats(), target.cpu_stats(), now()
        if self.point.scenario is None:
            self.measured = d._pgbench_once(self.ep, self.point, self.run_dir, "pgbench",
                                            seconds=run.measured_seconds, transactions=run.transactions, log=True)
            self.cpu_after, self.ended = target.cpu_stats(), now()
        else:
            from pglab.drivers.faults import through_scenario

            self.result, self.scenario_metrics, scenario_events = through_scenario(
                d.plan, target, d.ui.log, d._pgbench_once, self.point, self.run_dir, self.launched)
            self.cpu_after, self.ended = target.cpu_stats(), self.result.window_end
            self.events += scenario_events
        self.io_after = target.io_stats()
        if self.statements:
            self.statements.end(now())

    def close_probes(self) -> None:
        if self.point.scenario is not None:
            try:
                self.primary_at_end = self.target.primary_name()  # a failover or switchover moves the primary's role
            except Exception:  # no leader yet: the roles over the window are not known either
                self.primary_at_end = None
        assert self.sampler is not None
        self.samples = close_window(self.sampler, self.ended)  # every probe's sample that closes the window, no more

    def summarize(self) -> RunResult:
        sampler, statements, run_dir = self.sampler, self.statements, self.run_dir
        assert sampler is not None
        if self.measured is not None:
            self.result = pgbench.finish_run(*self.measured, run_dir / "pgbench_log", self.launched, self.ended)
        result = self.result
        assert result is not None
        window = (result.window_start, result.window_end)
        metrics = pgbench_metrics(result)
        metrics.update(sampler.summarize(*window))
        metrics.update(limit_metrics(self.limits, self.cpu_before, self.cpu_after, self.ended - self.launched,
                                     self.primary_name))
        io_figures, io_record = io_metrics(self.io_before, self.io_after, (self.launched, self.ended),
                                           self.primary_name, self.target.io_accounting(),
                                           primary_at_end=self.primary_at_end)
        metrics.update(io_figures)
        metrics.update(self.scenario_metrics)
        statements_record = statements.write(run_dir) if statements else None
        if errors := sampler.errors + (statements.errors if statements else []):
            (run_dir / "probe-errors.txt").write_text("\n".join(errors) + "\n")
        series = pgbench_series(result, "pgbench")
        series += [(s.ts, s.source, s.metric, s.value) for s in self.samples]
        write_samples(run_dir / "probes.csv", self.samples)
        dataset = self.target.describe().get("dataset")  # how the lab got it: loaded, or from the dataset cache
        return RunResult.of(window, metrics, series=series, events=self.events, settings=self.settings,
                            record={"command": result.command, "io": io_record,
                                    **({"dataset": dataset} if dataset else {}),
                                    **({"statements": statements_record} if statements_record else {})})

    def end(self, failure: BaseException | None) -> None:
        if failure is None:
            return
        self.d._stop_pgbench()
        if self.sampler:
            self.sampler.stop()
        if self.statements:
            self.statements.close()
        if not isinstance(failure, (KeyboardInterrupt, RunInterrupted, LabUnsound)):  # teardown follows those
            self.d.end_leftovers_after_failure(self.endpoints)


def watch(procs: dict[str, PgbenchProcess], name: str, seconds: float | None, health: Callable[[], str | None],
          log: Callable[[str], None], stuck: Callable[[list[str], float], str],
          tick: Callable[[], None] | None = None, overrun_s: float | None = None) -> dict[str, int]:
    """Wait for a run's pgbench processes (one, or one per tenant) and return their exit codes: the target's health
    looked at each second, ``tick`` too, a word when they outlive their duration by 5 s, and a deadline ``overrun_s``
    past it (the plan's run.overrun; by default the duration, at least 30 s): a run that outlives its duration that
    long is stuck (commits waiting for a standby that is gone). A failure is RunFailed, ``stuck`` saying why for the
    ones still running; the caller stops them."""
    started = time.monotonic()
    if seconds and overrun_s is None:
        overrun_s = max(30.0, seconds)
    deadline = started + seconds + overrun_s if seconds and overrun_s is not None else None
    overrun_said = False  # the wait past the duration is said once, not sat through in silence
    codes: dict[str, int] = {}
    while len(codes) < len(procs):
        for n, proc in procs.items():
            if n not in codes and (rc := proc.poll_for(1.0 / len(procs))) is not None:
                codes[n] = rc
        if tick is not None:
            tick()
        if len(codes) == len(procs):
            break
        if problem := health():
            raise RunFailed(f"{problem} ({time.monotonic() - started:.1f} s into the {name} run)")
        if deadline is None or seconds is None:
            continue
        if not overrun_said and time.monotonic() > started + seconds + 5:
            log(f"pgbench has not ended 5 s after its {seconds:g} s (transactions stuck?); it is stopped "
                f"{deadline - started - seconds:.0f} s after its end")
            overrun_said = True
        if time.monotonic() > deadline:
            raise RunFailed(stuck(sorted(set(procs) - set(codes)), time.monotonic() - started - seconds))
    for proc in procs.values():
        proc.wait()
    return codes


def limit_metrics(limits: dict[str, Any], before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                  seconds: float, primary_name: str = "n0") -> dict[str, float | None]:
    """The limits in force during the run, and the primary's CPU use and throttling from its own cgroup (the
    node that was primary when the run started: on an HA lab, not always n0)."""
    if not limits:
        return {}
    out: dict[str, float | None] = {"limits_applied": 1.0 if limits.get("applied") else 0.0}
    primary = limits.get(primary_name) or {}
    if primary.get("cpus") is not None:
        out["limit_cpus"] = primary["cpus"]
    if (limits.get("client") or {}).get("cpus") is not None:
        out["limit_client_cpus"] = limits["client"]["cpus"]
    for group, prefix in ((primary_name, "primary"), ("client", "client")):
        b, a = before.get(group), after.get(group)
        if b and a and seconds > 0:
            out[f"{prefix}_cgroup_cpu_cores"] = (a["usage_s"] - b["usage_s"]) / seconds
            periods = a["periods"] - b["periods"]
            throttled = (a["throttled"] - b["throttled"]) / periods * 100 if periods > 0 else 0.0
            out["cpu_throttled_pct" if prefix == "primary" else "client_throttled_pct"] = throttled
    if "primary_cgroup_cpu_cores" in out:
        out["primary_cpu_cores"] = out.pop("primary_cgroup_cpu_cores")
    return out


def io_metrics(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
               window: tuple[float, float], primary_name: str = "n0",
               problem: str | None = None, *, primary_at_end: str | None = "") -> tuple[dict[str, float | None],
                                                                                   dict[str, Any]]:
    """Each instance's own I/O over ``window``, from its cgroup's counters read at its start and end: the metrics
    (``primary_*``; ``standby_*``, the mean of one standby) and run.json's ``io`` (every instance's figures).

    The disk probe's ``read_iops``, ``write_mb_s`` … are the devices', every instance and anything else on the host
    together; these are one instance's. On cgroup v1 they are what the instance's processes submitted themselves
    (see :meth:`cgroups.Group.io_stat`). Without groups, ``io_per_instance`` is 0 and the record says why."""
    seconds = window[1] - window[0]
    nodes: dict[str, dict[str, float]] = {}
    if problem is None and seconds > 0:
        for name, a in after.items():
            if (b := before.get(name)) is None:
                continue
            fig = {"read_iops": (a["read_ios"] - b["read_ios"]) / seconds,
                   "write_iops": (a["write_ios"] - b["write_ios"]) / seconds,
                   "read_mb_s": (a["read_bytes"] - b["read_bytes"]) / MIB / seconds,
                   "write_mb_s": (a["write_bytes"] - b["write_bytes"]) / MIB / seconds}
            if "io_stall_s" in a and "io_stall_s" in b:  # cgroup v2 with PSI: time its tasks waited on I/O
                fig["io_pressure_pct"] = (a["io_stall_s"] - b["io_stall_s"]) / seconds * 100
            nodes[name] = fig
    if primary_name not in nodes:
        return {"io_per_instance": 0.0}, {"scope": "device-wide only",
                                          "reason": problem or f"no cgroup counters for {primary_name}"}
    version = cgroups.version()
    source = ("cgroup v1 blkio.throttle: I/O the instance's processes submitted (not the kernel's writeback)"
              if version == 1 else "cgroup v2 io.stat: I/O attributed to the instance, writeback included")
    if primary_at_end != "" and primary_at_end != primary_name:  # "": the caller did not look again
        # the primary's role moved during the window (a failover, a switchover): no instance was the primary
        # throughout, so primary_* / standby_* would mix roles; each node's figures stay in the record
        moved = f"{primary_name} → {primary_at_end or 'no leader'}"
        return {"io_per_instance": 1.0}, {
            "scope": "per instance", "source": source, "window": list(window),
            "note": f"the primary changed during the window ({moved}): primary_* and standby_* left out",
            "nodes": {n: {"role": "primary at start" if n == primary_name else
                          "primary at end" if n == primary_at_end else "standby", **f} for n, f in nodes.items()}}
    out: dict[str, float | None] = {"io_per_instance": 1.0}
    out.update({f"primary_{k}": v for k, v in nodes[primary_name].items()})
    standbys = [f for n, f in nodes.items() if n != primary_name]
    for key in nodes[primary_name]:
        if values := [f[key] for f in standbys if key in f]:
            out[f"standby_{key}"] = sum(values) / len(values)
    return out, {"scope": "per instance", "source": source, "window": list(window),
                 "nodes": {n: {"role": "primary" if n == primary_name else "standby", **f} for n, f in nodes.items()}}


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) (UTC|GMT)")


def checkpoint_events(log_text: str) -> list[Event]:
    """(epoch ts, "checkpoint-start", reason) for every "checkpoint starting: …" line of a server log.

    pg_stat_bgwriter counts a checkpoint when it completes; the log says when it began, which is when its
    flush storm starts (log_line_prefix is PostgreSQL's default '%m [%p] ', logged in UTC here)."""
    events = []
    for line in log_text.splitlines():
        if "checkpoint starting:" not in line:
            continue
        m = _LOG_TIME.match(line)
        if m:
            when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f" if "." in m.group(1) else "%Y-%m-%d %H:%M:%S")
            events.append((when.replace(tzinfo=UTC).timestamp(), "checkpoint-start",
                           line.split("checkpoint starting:", 1)[1].strip()))
    return events


def close_window(sampler: Sampler, end: float) -> list[Sample]:
    """Stop the probes once each has taken the samples that close a window ending by ``end`` (a rate probe one
    closing sample at once, its row from its last one to that read; a gauge none: :meth:`Sampler.close`), and
    return every sample. A safe point: a recorded Ctrl-C or SIGTERM ends the wait (the caller stops the sampler)."""
    return sampler.close(end, join=interrupts.join)


def _answers(endpoints: Endpoints, timeout_s: int = 5) -> bool:
    """Whether the primary lets a connection in within ``timeout_s``; only a timeout says no (a refusal or an
    authentication error is an answer)."""
    try:
        psycopg.connect(control_conninfo(endpoints, timeout_s), autocommit=True).close()
    except psycopg.errors.ConnectionTimeout:
        return False
    except psycopg.Error:
        pass
    return True


def control_conninfo(endpoints: Endpoints, connect_timeout: int = 10) -> str:
    """pglab's own session on the primary between runs: bounded by lock and statement timeouts, and committing
    without waiting for a synchronous standby (the replay wait after it checks the standbys, with a deadline)."""
    ours = f"-c lock_timeout={LOCK_TIMEOUT_S}s -c statement_timeout={STATEMENT_TIMEOUT_S}s -c synchronous_commit=local"
    theirs = endpoints.primary.options
    return endpoints.primary.conninfo(application_name="pglab-control", connect_timeout=connect_timeout,
                                      options=f"{theirs} {ours}" if theirs else ours)


def _wait_replay(conn: psycopg.Connection[Any], standbys: list[str], log: Callable[[str], None],
                 stall_s: float, max_s: float = REPLAY_MAX_S) -> None:
    """Start every run with standbys caught up, so one run's replication backlog never leaks into the next.

    A standby pglab expects that is not connected counts as behind (a frozen standby's walsender goes after
    wal_sender_timeout: its row vanishing is not catching up). When none of those behind replays anything for
    ``stall_s``, or they are still behind after ``max_s``, the lab is not sound: :class:`LabUnsound` ends the sweep."""
    started = last_progress = last_log = time.monotonic()
    seen: dict[str, Any] = {}
    poll_s = 0.01  # standbys usually catch up within milliseconds of the reset: look again soon, then less often
    while True:
        rows = conn.execute("SELECT application_name, replay_lsn, replay_lsn >= pg_current_wal_lsn() "
                            "FROM pg_stat_replication").fetchall()
        state = {name: (lsn, bool(ok)) for name, lsn, ok in rows}
        # without names: the connected standbys that replay (an archiver such as pg_receivewal reports no replay)
        expected = standbys or [n for n, (lsn, _) in state.items() if lsn is not None]
        behind = [n for n in expected if not state.get(n, (None, False))[1]]
        if not behind:
            return
        t = time.monotonic()
        replayed = {n: state[n][0] for n in behind if n in state}
        if any(lsn is not None and lsn != seen.get(n) for n, lsn in replayed.items()):
            last_progress = t
        seen.update(replayed)
        names = ", ".join(behind)
        if t - last_progress > stall_s:
            raise LabUnsound(f"standby(s) {names} stopped answering (no replay progress for {stall_s:.0f} s); "
                             "the lab cannot run the next point: resume with the same pglab run and --results "
                             "once they are back")
        if t - started > max_s:
            raise LabUnsound(f"standby(s) {names} still behind the primary after {max_s:.0f} s of replay; the lab "
                             "cannot run the next point: resume with the same pglab run and --results once they "
                             "have caught up")
        if t - last_log >= min(10.0, stall_s / 2):  # said at least once before the sweep stops
            log(f"waiting for standby(s) {names} to replay ({t - started:.0f} s; the sweep stops after "
                f"{stall_s:.0f} s without progress)")
            last_log = t
        interrupts.sleep(poll_s)
        poll_s = min(poll_s * 2, 0.2)
