"""The sweep loop: for each point × repeat — provision, reset the dataset, probe, run pgbench, store.

Nothing else lives here: what a target, a workload, a probe or the store does is in its own module.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import psycopg

from pglab import __version__, environment
from pglab.errors import RunInterrupted, UserError
from pglab.plan.expand import Point, expand
from pglab.plan.load import resolve_path
from pglab.plan.schema import Plan
from pglab.probes import ProbeContext, ProbeOpenError, Sample, Sampler, default_probes
from pglab.probes.base import now
from pglab.store.sqlite import Store
from pglab.targets.base import Endpoints, Target
from pglab.targets.local import cgroups, registry
from pglab.targets.local.cluster import LabError, LocalLab
from pglab.workloads import pgbench
from pglab.workloads.pgbench import PgbenchError, PgbenchProcess, ProgressPoint


class Observer(Protocol):
    """What the runner tells the user interface (the CLI shows a live progress bar)."""

    def log(self, message: str) -> None: ...
    def sweep_started(self, runs: int, estimate_s: float | None) -> None: ...
    def run_started(self, point: Point, repeat: int, phase: str) -> None: ...
    def progress(self, p: ProgressPoint) -> None: ...
    def run_finished(self, point: Point, repeat: int, status: str, metrics: dict[str, Any]) -> None: ...


class SilentObserver:
    def log(self, message: str) -> None:
        pass

    def sweep_started(self, runs: int, estimate_s: float | None) -> None:
        pass

    def run_started(self, point: Point, repeat: int, phase: str) -> None:
        pass

    def progress(self, p: ProgressPoint) -> None:
        pass

    def run_finished(self, point: Point, repeat: int, status: str, metrics: dict[str, Any]) -> None:
        pass


class RunFailed(Exception):
    """One run could not complete (pgbench error, an instance down): recorded, and the sweep goes on."""


@dataclass
class SweepResult:
    sweep_id: int
    results_dir: Path
    ok: int = 0
    failed: int = 0
    interrupted: bool = False
    failures: list[str] = field(default_factory=list)
    already_done: int = 0  # runs a resumed sweep had completed before
    resumed: bool = False

    def record(self, point: Point, repeat: int, failure: str | None) -> None:
        """Count one run: ok, or failed with its reason (listed at the end of `pglab run`)."""
        if failure is None:
            self.ok += 1
        else:
            self.failed += 1
            self.failures.append(f"{point.label()} #{repeat}: {failure}")


def plan_hash(plan_text: str, files: list[Path] | None = None) -> str:
    """The plan's identity for resuming: its text and the bytes of every file it names (scripts, fio jobs)."""
    h = hashlib.sha256(plan_text.encode())
    for f in files or []:
        h.update(b"\0" + str(f).encode() + b"\0")
        try:
            h.update(f.read_bytes())
        except OSError:
            h.update(b"(unreadable)")
    return h.hexdigest()


def plan_files(plan: Plan, plan_dir: Path) -> list[Path]:
    """Every file the plan names (fio job files, pgbench scripts): part of its identity."""
    files = [resolve_path(f, plan_dir) for f in (plan.storage.job_files if plan.storage else [])]
    for wl in plan.matrix.workload:
        if not isinstance(wl, str):
            files += [resolve_path(sc.file, plan_dir) for sc in wl.scripts if sc.file]
    for a in plan.tenants.arrangements if plan.tenants else []:
        for t in a.tiers:
            if not isinstance(t.workload, str):
                files += [resolve_path(sc.file, plan_dir) for sc in t.workload.scripts if sc.file]
    return files


def open_sweep(store: Store, plan: Plan, plan_text: str, plan_dir: Path, force_new: bool,
               log: Any = lambda _m: None) -> tuple[int, bool]:
    """A new sweep, or the one this folder holds for the same plan (resume); a different plan is refused.
    Runs of the previous attempt that did not end ok are set aside in ``discarded/`` to be run again."""
    fingerprint = plan_hash(plan_text, plan_files(plan, plan_dir))
    previous = [s for s in store.sweeps() if s["plan_hash"]]  # `pglab fio` sweeps have no plan
    last = previous[-1] if previous else None
    if last is not None and not force_new:
        if last["plan_hash"] != fingerprint:
            raise UserError(
                f"--results: '{store.dir}' holds a sweep of a different plan ('{last['plan_name']}', or this plan "
                "before a change); give a new folder, or add --force-new to start a new sweep there.")
        dropped = store.reopen_sweep(last["id"])
        if dropped:
            aside = store.dir / "discarded"
            aside.mkdir(exist_ok=True)
            for d in dropped:
                if d.is_dir():
                    d.replace(aside / d.name)
            log(f"{len(dropped)} unfinished run(s) of the previous attempt set aside in {aside}")
        return last["id"], True
    return store.begin_sweep(plan.name, plan_text, fingerprint, __version__), False


@contextmanager
def results_lock(results_dir: Path) -> Iterator[None]:
    """One writer per results folder: a second pglab run into it is refused instead of mixing two sweeps."""
    results_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(results_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UserError(f"--results: '{results_dir}' is being written by another pglab (pid {holder}); wait "
                            "for it to end or choose another folder.") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, harmless


def interrupt_signals() -> _Signals:
    """SIGINT/SIGTERM → RunInterrupted in the main thread, for the duration of a ``with`` block."""
    return _Signals()


class _Signals:
    """SIGINT/SIGTERM become RunInterrupted in the main thread; ignored while tearing down."""

    def __init__(self) -> None:
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._saved[sig] = signal.signal(sig, self._raise)
        return self

    @staticmethod
    def _raise(signum: int, _frame: FrameType | None) -> None:
        raise RunInterrupted(signal.Signals(signum).name)

    def shield(self) -> None:
        for sig in self._saved:
            signal.signal(sig, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)


class Runner:
    def __init__(self, plan: Plan, plan_text: str, plan_dir: Path, results_dir: Path,
                 observer: Observer | None = None, keep: bool = False, force_new: bool = False,
                 allow_destructive: bool = False):
        self.plan = plan
        self.plan_text = plan_text
        self.plan_dir = plan_dir
        self.results_dir = results_dir.resolve()  # pgbench runs in the run folder: paths must be absolute
        self.ui: Observer = observer or SilentObserver()
        self.keep = keep
        self.force_new = force_new
        self.allow_destructive = allow_destructive
        self.points = expand(plan)
        self._pgbench: PgbenchProcess | None = None
        self._logs_dir = self.results_dir / "server-logs"

    def _open_sweep(self, store: Store) -> tuple[int, bool]:
        sweep_id, resumed = open_sweep(store, self.plan, self.plan_text, self.plan_dir, self.force_new, self.ui.log)
        if resumed:
            self._logs_dir = self.results_dir / "server-logs" / time.strftime("resumed-%Y%m%d-%H%M%S")
        return sweep_id, resumed

    # ------------------------------------------------------------ the sweep
    def run(self) -> SweepResult:
        for message in registry.reap_orphans():
            self.ui.log(message)
        target = self._target()
        target.preflight()  # refusals happen here, before a results folder or a server exists
        with results_lock(self.results_dir):
            store = Store.open(self.results_dir)
            try:
                store.recover()
                sweep_id, resumed = self._open_sweep(store)
            except BaseException:
                store.close()
                raise
            return self._sweep(store, target, sweep_id, resumed)

    def _target(self) -> Target:
        if self.plan.target.external is not None:
            from pglab.targets.external import ExternalServer

            return ExternalServer(self.plan.target.external, self.plan, self.allow_destructive)
        if self.allow_destructive:
            raise UserError("--allow-destructive: only an external target needs it; the local lab is pglab's own.")
        assert self.plan.target.local is not None
        if self.plan.tenants is not None:
            from pglab.targets.local.fleet import Fleet

            return Fleet(self.plan, self.plan_dir, log=self.ui.log)  # type: ignore[return-value]
        if self.plan.target.local.ha == "patroni":
            from pglab.targets.local.ha_target import PatroniTarget

            return PatroniTarget(self.plan.target.local, self.plan_dir, log=self.ui.log)
        # the lab loads the dataset on its primary alone and snapshots it while it builds
        return LocalLab(self.plan.target.local, self.plan_dir, log=self.ui.log, dataset=self.plan.dataset)

    def _sweep(self, store: Store, target: Target, sweep_id: int, resumed: bool) -> SweepResult:
        plan = self.plan
        result = SweepResult(sweep_id, self.results_dir, resumed=resumed)
        if resumed:
            point_ids = store.point_ids(sweep_id)
            done = store.completed_runs(sweep_id)
        else:
            point_ids = store.add_points(sweep_id, [(p.index, p.key, p.axes) for p in self.points])
            done = set()
        repeats = plan.run.repeats
        todo = [(p, r) for p in self.points for r in range(1, repeats + 1) if (p.key, r) not in done]
        result.already_done = len(self.points) * repeats - len(todo)
        if resumed:
            self.ui.log(f"resuming sweep {sweep_id}: {result.already_done} of {len(self.points) * repeats} runs "
                        f"already complete, {len(todo)} to go")
        if not todo and (plan.storage is None or store.storage_done(sweep_id)):
            store.end_sweep(sweep_id, "done")
            store.close()
            return result
        per_run = (plan.run.warmup + (plan.run.measured_seconds or 0) + 3) if plan.run.measured_seconds else None
        self.ui.sweep_started(len(todo), per_run * len(todo) if per_run else None)
        status, reason = "done", None
        first = todo[0][0] if todo else self.points[0]
        if plan.matrix.cpus:  # the scaling loop: build the lab at its first step, no restart needed for it
            target.cpus_axis, target.cpus = True, first.cpus
        if first.arrangement is not None:  # a tenants plan: the fleet of the first arrangement to run
            target.use(first.arrangement)  # type: ignore[attr-defined]
        with _Signals() as signals:
            try:
                endpoints = target.provision(self._parameters(first))
                store.set_sweep_info(sweep_id, environment.capture(
                    endpoints.primary.conninfo(), target.probe_paths(), target.bindir, self.plan_text),
                    target.describe())
                if plan.storage is not None and not store.storage_done(sweep_id):
                    self._storage_phase(store, sweep_id, target)
                    store.add_events(sweep_id, [(now(), "storage-done", "")])
                if todo:
                    self._ensure_dataset(target, endpoints)
                for point, repeat in todo:
                    if point.arrangement is not None:
                        from pglab import tenants

                        failure = tenants.one_run(self, store, target, sweep_id,  # type: ignore[arg-type]
                                                  point_ids[point.key], point, repeat)
                    else:
                        failure = self._one_run(store, target, sweep_id, point_ids[point.key], point, repeat)
                    result.record(point, repeat, failure)
                    if plan.run.pause:
                        time.sleep(plan.run.pause)
            except RunInterrupted as exc:
                status, reason = "interrupted", f"interrupted by {exc.signal_name}"
                result.interrupted = True
            except BaseException as exc:
                status, reason = "failed", str(exc)
                raise
            finally:
                signals.shield()
                self._stop_pgbench()
                try:
                    self._keep_server_logs(store, sweep_id, target)
                    target.teardown(keep=self.keep)
                finally:
                    store.end_sweep(sweep_id, status, reason)
                    store.close()
        return result

    def _storage_phase(self, store: Store, sweep_id: int, target: Target) -> None:
        from pglab import storage
        from pglab.workloads import fio

        spec = self.plan.storage
        assert spec is not None
        self.ui.log(f"storage phase: fio on {', '.join(spec.paths)} ({spec.runtime:g} s per job)")
        jobs = storage.plan_jobs(spec.profiles, [resolve_path(f, self.plan_dir) for f in spec.job_files])
        paths = {label: p for label, p in target.storage_paths().items() if label in spec.paths}
        storage.measure(store, sweep_id, paths, jobs, runtime_s=spec.runtime, size_bytes=fio.parse_size(spec.size),
                        log=self.ui.log)

    def _keep_server_logs(self, store: Store, sweep_id: int, target: Target) -> None:
        """Copy the server logs into the results (artifacts) and store checkpoint starts as sweep events."""
        try:
            logs_dir = self._logs_dir
            logs_dir.mkdir(parents=True, exist_ok=True)
            for name, path in target.server_logs().items():
                shutil.copyfile(path, logs_dir / f"{name}.log")
            primary_log = logs_dir / "n0.log"
            if primary_log.is_file():
                store.add_events(sweep_id, checkpoint_events(primary_log.read_text(errors="replace")))
        except OSError as exc:  # artifacts are best effort here: teardown must still happen
            self.ui.log(f"server logs not kept: {exc}")

    def _parameters(self, point: Point) -> dict[str, Any]:
        return {**self.plan.postgres.parameters, **point.parameters,
                "synchronous_commit": point.synchronous_commit}

    def _ensure_dataset(self, target: Target, endpoints: Endpoints) -> None:
        ds = self.plan.dataset
        with psycopg.connect(endpoints.primary.conninfo(), autocommit=True) as conn:
            state = pgbench.dataset_state(conn)
        if state != {"scale": ds.scale, "partitions": ds.partitions or 0}:
            self.ui.log(f"loading the dataset: pgbench -i -s {ds.scale}")
            seconds = pgbench.initialise(target.bindir, endpoints.primary, ds, self.results_dir / "dataset")
            self.ui.log(f"dataset loaded in {seconds:.1f} s")

    # ------------------------------------------------------------ one run
    def _one_run(self, store: Store, target: Target, sweep_id: int, point_id: int, point: Point,
                 repeat: int) -> str | None:
        """None when the run succeeded, else why it failed. RunInterrupted propagates after marking the run."""
        run_id, run_dir = store.start_run(sweep_id, point_id, point.index, repeat)
        sampler: Sampler | None = None
        try:
            self.ui.run_started(point, repeat, "prepare")
            endpoints = target.provision(self._parameters(point))
            if point.cpus is not None:
                target.set_cpus(point.cpus)
            store.add_events(sweep_id, target.take_events())
            if problem := target.health():
                raise RunFailed(problem)
            limits = target.limits_in_force()
            if limits:
                _write_json(run_dir / "limits.json", limits)
            links = target.links_in_force()
            if links:  # the replication links as Toxiproxy shapes them during this run
                _write_json(run_dir / "network.json", links)
            self._prepare_dataset(target, endpoints, run_dir)
            store.add_events(sweep_id, target.take_events())  # a snapshot reset's own
            settings = self._settings(endpoints, run_dir)
            ctx = ProbeContext(
                primary_conninfo=endpoints.primary.conninfo(application_name="pglab-probe"),
                standby_conninfos={s.name: s.conninfo(application_name="pglab-probe") for s in endpoints.standbys},
                paths=target.probe_paths(),
                server_pids=target.server_pids,
                client_pids=lambda: [self._pgbench.pid] if self._pgbench else [],
                wait_hz=self.plan.probes.wait_hz,
            )
            sampler = Sampler(default_probes(ctx) if self.plan.probes.enabled else [])
            sampler.start()
            run = self.plan.run
            events: list[tuple[float, str, str]] = []
            if run.warmup > 0:
                self.ui.run_started(point, repeat, "warm-up")
                events.append((now(), "warmup-start", f"{run.warmup:g} s"))
                self._pgbench_once(target, endpoints, point, run_dir, "warmup", seconds=run.warmup,
                                   transactions=None, log=False)
                events.append((now(), "warmup-end", ""))
            self.ui.run_started(point, repeat, "measure")
            primary_name = target.primary_name()
            cpu_before, launched = target.cpu_stats(), now()
            scenario_metrics: dict[str, float | None] = {}
            if point.scenario is None:
                measured = self._pgbench_once(target, endpoints, point, run_dir, "pgbench",
                                              seconds=run.measured_seconds, transactions=run.transactions, log=True)
                cpu_after, ended = target.cpu_stats(), now()
                _wait_for_tick(ended)  # let every 1 s probe take the sample that closes the window
                samples = sampler.stop()
                result = pgbench.finish_run(measured[0], measured[1], run_dir / "pgbench_log", launched, ended)
            else:
                result, scenario_metrics, scenario_events = self._through_scenario(target, point, run_dir, launched)
                cpu_after, ended = target.cpu_stats(), result.window_end
                _wait_for_tick(ended)
                samples = sampler.stop()
                events += scenario_events
            window = (result.window_start, result.window_end)
            metrics = self._metrics(result)
            metrics.update(sampler.summarize(*window))
            metrics.update(_limit_metrics(limits, cpu_before, cpu_after, ended - launched, primary_name))
            metrics.update(scenario_metrics)
            if sampler.errors:
                (run_dir / "probe-errors.txt").write_text("\n".join(sampler.errors) + "\n")
            series = [(p.ts, "pgbench", m, v) for p in result.progress
                      for m, v in (("tps", p.tps), ("latency_ms", p.latency_ms), ("stddev_ms", p.stddev_ms),
                                   ("failed", p.failed), ("lag_ms", p.lag_ms)) if v is not None]
            series += [(s.ts, s.source, s.metric, s.value) for s in samples]
            _write_samples(run_dir / "probes.csv", samples)
            _write_json(run_dir / "run.json", {"run_id": run_id, "point": point.axes, "repeat": repeat,
                                               "window": window, "command": result.command, "metrics": metrics})
            events += [(window[0], "window-start", ""), (window[1], "window-end", "")]
            store.finish_run(run_id, "ok", window=window, settings=settings, metrics=metrics, series=series,
                             events=events)
            self.ui.run_finished(point, repeat, "ok", metrics)
            return None
        except RunInterrupted as exc:
            self._stop_pgbench()
            if sampler:
                sampler.stop()
            store.finish_run(run_id, "interrupted", reason=f"interrupted by {exc.signal_name}")
            self.ui.run_finished(point, repeat, "interrupted", {})
            raise
        except (RunFailed, PgbenchError, LabError, ProbeOpenError, psycopg.Error) as exc:
            self._stop_pgbench()
            if sampler:
                sampler.stop()
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if (problem := target.health()) and problem not in reason:
                reason += f"; {problem}"
            store.finish_run(run_id, "failed", reason=reason)
            self.ui.run_finished(point, repeat, "failed", {"reason": reason})
            return reason

    def _prepare_dataset(self, target: Target, endpoints: Endpoints, run_dir: Path) -> None:
        ds = self.plan.dataset
        if target.read_only:  # a server pglab may not write to: the dataset is used as it is
            return
        if ds.reset == "reinit":
            pgbench.initialise(target.bindir, endpoints.primary, ds, run_dir)
        elif ds.reset == "snapshot":
            _write_json(run_dir / "dataset-reset.json", target.reset_dataset())
        with psycopg.connect(endpoints.primary.conninfo(application_name="pglab-control"),
                             autocommit=True) as conn:
            if ds.reset == "vacuum":
                pgbench.reset_for_run(conn)
            _wait_replay(conn)

    def _settings(self, endpoints: Endpoints, run_dir: Path) -> dict[str, Any]:
        with psycopg.connect(endpoints.primary.conninfo(application_name="pglab-control"),
                             autocommit=True) as conn:
            rows = conn.execute("SELECT name, setting, unit FROM pg_settings WHERE source NOT IN "
                                "('default', 'override') ORDER BY name").fetchall()
        settings = {n: {"setting": s, "unit": u} for n, s, u in rows}
        _write_json(run_dir / "settings.json", settings)
        return settings

    def _pgbench_once(self, target: Target, endpoints: Endpoints, point: Point, run_dir: Path, name: str,
                      seconds: float | None, transactions: int | None, log: bool,
                      watch_health: bool = True) -> tuple[PgbenchProcess, int]:
        args = pgbench.run_args(target.bindir, point.workload, point.clients, point.jobs, self.plan.run,
                                self.plan_dir, seconds=seconds, transactions=transactions,
                                log_prefix=run_dir / "pgbench_log" if log else None)
        args = cgroups.wrap(args, target.client_procs_files())  # pgbench in its own cgroup, when the plan asks
        proc = PgbenchProcess(args, endpoints.primary, run_dir, name, on_progress=self.ui.progress)
        self._pgbench = proc
        started = time.monotonic()
        # a run that outlives its duration this long is stuck (commits waiting for a standby that is gone)
        deadline = started + seconds + max(30.0, seconds) if seconds else None
        try:
            while (rc := proc.poll_for(1.0)) is None:
                if watch_health and (problem := target.health()):
                    proc.stop()
                    raise RunFailed(f"{problem} ({time.monotonic() - started:.1f} s into the {name} run)")
                if deadline is not None and time.monotonic() > deadline:
                    proc.stop()
                    raise RunFailed(f"pgbench did not end {time.monotonic() - started - seconds:.0f} s after its "
                                    f"{seconds:g} s: transactions stuck (a synchronous standby not answering?)")
            proc.wait()
        except BaseException:  # an interrupt while waiting: pgbench lives in its own session, stop it here
            proc.stop()
            raise
        finally:
            self._pgbench = None
        if name == "warmup" and rc != 0:
            err = proc.stderr_path.read_text().strip().splitlines()
            raise PgbenchError(f"warm-up pgbench exited with code {rc}: {(err or ['no message'])[-1]}")
        return proc, rc

    def _through_scenario(self, target: Target, point: Point, run_dir: Path, launched: float
                          ) -> tuple[pgbench.PgbenchRun, dict[str, float | None], list[tuple[float, str, str]]]:
        """The measured run with its scenario: the witness writes, the injector strikes at ``at``, and pgbench is
        started again each time the fault ends it, until the run's duration is over (the outage stays in the
        window). Then the witness's ids are read back from the primary now in place."""
        from pglab.scenarios.inject import FaultTarget, Injector
        from pglab.scenarios.witness import Witness

        sc = point.scenario
        seconds = self.plan.run.measured_seconds
        assert sc is not None and seconds is not None
        faults: FaultTarget = target  # type: ignore[assignment]  # local targets implement both protocols
        follow = faults.follow_endpoint()
        witness = None
        if sc.witness:
            witness = Witness(follow.conninfo(), run_dir / "witness.jsonl",
                              synchronous_commit=point.synchronous_commit)
            witness.prepare()
            witness.start()
        injector = Injector(sc, faults, launched + sc.at, log=self.ui.log)
        injector.start()
        segments: list[tuple[PgbenchProcess, int]] = []
        end = launched + seconds
        try:
            while not segments or end - now() >= 1:
                name = "pgbench" if not segments else f"pgbench-{len(segments) + 1}"
                segments.append(self._pgbench_once(target, Endpoints(follow), point, run_dir, name,
                                                   seconds=max(1.0, end - now()), transactions=None, log=True,
                                                   watch_health=False))
                if segments[-1][1] != 0 and end - now() >= 1:
                    time.sleep(1.0)  # no primary yet: try again in a second
            ended = now()
            injector.join(timeout=max(30.0, seconds))  # a backup may outlast the load; the scenario still ends
        finally:
            injector.stop()
            if witness is not None:
                witness.stop()
        injection = injector.result
        if injection.error:
            raise RunFailed(injection.error)
        result, metrics = pgbench.finish_segments(segments, run_dir / "pgbench_log", launched, ended)
        out: dict[str, float | None] = {**metrics, **injection.metrics}
        fault, back = injection.fault_time, injection.recovered_time
        if fault is not None:
            out["fault_at_s"] = fault - launched
            lat, end_ts = pgbench.read_transaction_log(sorted(run_dir.glob("pgbench_log.*")))
            scale = 1 / self.plan.run.sampling_rate
            phases = [("before", launched, fault), ("during", fault, back or ended)]
            if back is not None:
                out["recovered_s"] = back - fault
                phases.append(("after", back, ended))
            for phase, a, b in phases:
                tps, latency = pgbench.phase_stats(lat, end_ts, a, b)
                out[f"tps_{phase}"], out[f"latency_{phase}_ms"] = tps * scale, latency
        if witness is not None:
            w = witness.verify(fault_time=fault)
            _write_json(run_dir / "witness.json", w.as_dict())
            out.update({"witness_attempts": float(w.attempts), "witness_acked": float(w.acked),
                        "witness_failed": float(w.failed), "in_doubt": float(w.in_doubt),
                        "acked_lost": float(w.acked_lost), "in_doubt_survived": float(len(w.in_doubt_survived)),
                        "witness_unexpected": float(len(w.unexpected)), "rto_s": w.rto_s, "write_gap_s": w.gap_s,
                        "lsn_gap_bytes": float(w.lsn_gap_bytes) if w.lsn_gap_bytes is not None else None})
        return result, out, injection.events

    def _stop_pgbench(self) -> None:
        if self._pgbench is not None:
            self._pgbench.stop()
            self._pgbench = None

    @staticmethod
    def _metrics(result: pgbench.PgbenchRun) -> dict[str, float | None]:
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


def _limit_metrics(limits: dict[str, Any], before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
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


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) (UTC|GMT)")


def checkpoint_events(log_text: str) -> list[tuple[float, str, str]]:
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


def _wait_for_tick(t: float) -> None:
    time.sleep(max(0.0, (int(t) + 1 - t) + 0.25))


def _wait_replay(conn: psycopg.Connection[Any], timeout: float = 60) -> None:
    """Start every run with standbys caught up, so one run's replication backlog never leaks into the next."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        behind = conn.execute(
            "SELECT count(*) FROM pg_stat_replication "
            "WHERE replay_lsn IS NULL OR replay_lsn < pg_current_wal_lsn()").fetchone()
        if behind is None or behind[0] == 0:
            return
        time.sleep(0.1)
    raise RunFailed(f"standbys did not catch up within {timeout:.0f} s before the run")


def _write_samples(path: Path, samples: list[Sample]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ts", "source", "metric", "value"])
        for s in samples:
            w.writerow([f"{s.ts:.3f}", s.source, s.metric, "" if s.value is None else s.value])
    tmp.replace(path)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def check_results_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise UserError(f"--results: '{path}' is a file; give a folder.")

