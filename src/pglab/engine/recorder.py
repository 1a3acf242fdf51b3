"""The recorder: the only writer of a sweep's runs to the store, and of each run's ``run.json``.

Drivers measure and return a :class:`RunResult`; whether a run ended ok, failed or was interrupted, and what
that means for its rows, is decided here once for every target."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from pathlib import Path

from pglab import __version__
from pglab.artifacts import write_json
from pglab.engine.driver import Driver, FioMeasurement, SweepInfo
from pglab.engine.run import measure
from pglab.engine.schedule import Schedule, new_seed
from pglab.engine.types import Event, Observer, RunResult
from pglab.errors import NoSpace, RunInterrupted, UserError, first_line, no_space
from pglab.plan.expand import Point
from pglab.plan.load import resolve_path
from pglab.plan.schema import Plan, Run
from pglab.store.sqlite import Store


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
    tiers = [t.workload for a in (plan.tenants.arrangements if plan.tenants else []) for t in a.tiers]
    return files + [resolve_path(sc.file, plan_dir) for wl in [*plan.matrix.workload, *tiers]
                    if not isinstance(wl, str) for sc in wl.scripts if sc.file]


class PhaseLog:
    """Where a sweep's wall time goes: each phase ends where the next begins, so from the sweep's start to its end
    the phases tile the time pglab spent on it (a resumed sweep adds the phases of each attempt)."""

    def __init__(self) -> None:
        self._open: tuple[str, float, str | None] | None = None  # name, started, run_id
        self._closed: list[tuple[str | None, str, float, float]] = []  # run_id, name, started, ended

    def mark(self, name: str, at: float | None = None, run_id: str | None = None) -> None:
        """``name`` begins (now, or at ``at``): the phase open until then ends there."""
        t = time.time() if at is None else at
        if self._open is not None:
            open_name, started, open_run = self._open
            t = max(t, started)  # a mark never ends a phase before it began (a step of the wall clock)
            self._closed.append((open_run, open_name, started, t))
        self._open = (name, t, run_id)

    def attach(self, run_id: str) -> None:
        """The open phase belongs to ``run_id`` (its preparation began before the run had an id)."""
        if self._open is not None:
            self._open = (self._open[0], self._open[1], run_id)

    def take(self) -> list[tuple[str | None, str, float, float]]:
        """The phases ended since the last call, for the store."""
        closed, self._closed = self._closed, []
        return closed

    def put_back(self, phases: list[tuple[str | None, str, float, float]]) -> None:
        """Phases taken but not stored: stored with the next ones."""
        self._closed[:0] = phases

    def close(self, at: float) -> list[tuple[str | None, str, float, float]]:
        """End the open phase at ``at`` (the sweep's end); every phase not yet taken."""
        if self._open is not None:
            name, started, run_id = self._open
            self._closed.append((run_id, name, started, max(at, started)))
            self._open = None
        return self.take()


class Recorder:
    """One sweep's books in one results folder (whose lock the caller holds)."""

    def __init__(self, store: Store, ui: Observer):
        self.store, self.ui = store, ui
        self.sweep_id = 0
        self.resumed = False
        self.info: SweepInfo | None = None
        self.phases = PhaseLog()

    def phase(self, name: str) -> None:
        """The sweep enters ``name`` now (lab, storage, dataset, prepare, pause, teardown …)."""
        self.phases.mark(name)

    @property
    def dir(self) -> Path:
        return self.store.dir

    def open_sweep(self, plan: Plan, plan_text: str, plan_dir: Path, force_new: bool) -> tuple[int, bool]:
        """A new sweep, or the one this folder holds for the same plan (resume); a different plan is refused.
        Runs of the previous attempt that did not end ok are set aside in ``discarded/`` to be run again."""
        store = self.store
        started = time.time()
        self.phases.mark("setup", at=started)  # opening the store, resuming, the schedule: until the lab is built
        store.recover()
        fingerprint = plan_hash(plan_text, plan_files(plan, plan_dir))
        previous = [s for s in store.sweeps() if s["plan_hash"]]  # old `pglab fio` sweeps: no plan
        last = previous[-1] if previous else None
        if last is not None and not force_new:
            if last["plan_hash"] != fingerprint:
                raise UserError(
                    f"--results: '{store.dir}' holds a sweep of a different plan ('{last['plan_name']}', or this "
                    "plan before a change); give a new folder, or add --force-new to start a new sweep there.")
            dropped = store.reopen_sweep(last["id"])
            if dropped:
                aside = store.dir / "discarded"
                aside.mkdir(exist_ok=True)
                for d in dropped:
                    if d.is_dir():
                        d.replace(aside / d.name)
                self.ui.log(f"{len(dropped)} unfinished run(s) of the previous attempt set aside in {aside}")
            self.sweep_id, self.resumed = last["id"], True
        else:
            self.sweep_id = store.begin_sweep(plan.name, plan_text, fingerprint, __version__, started=started)
        return self.sweep_id, self.resumed

    def points(self, points: list[Point]) -> tuple[dict[str, int], set[tuple[str, int]]]:
        """The sweep's point ids by key, and the (key, repeat) already run ok (none unless resumed)."""
        if self.resumed:
            return self.store.point_ids(self.sweep_id), self.store.completed_runs(self.sweep_id)
        return self.register(points), set()

    def schedule(self, run: Run) -> Schedule:
        """The sweep's order and repeats: as recorded when resuming (its seed above all), else new and recorded."""
        recorded = self.store.sweep_schedule(self.sweep_id) if self.resumed else None
        if recorded is not None:
            return Schedule.from_json(recorded)
        schedule = Schedule.of(run, run.seed if run.seed is not None else new_seed())
        self.store.set_sweep_schedule(self.sweep_id, schedule.as_json())
        return schedule

    def register(self, points: list[Point]) -> dict[str, int]:
        """Points a search decides on as it goes (the capacity probes' rates): their ids by key."""
        return self.store.add_points(self.sweep_id, [(p.index, p.key, p.axes) for p in points])

    def figures(self, point: Point, metric: str) -> list[float]:
        """The metric of each of the point's runs that ended ok (and have it), in the order they ran."""
        return self.store.ok_values(self.sweep_id, metric).get(point.key, [])

    def tps_of(self, point: Point) -> list[float]:
        """TPS of the point's runs that ended ok (what adaptive repeats judge)."""
        return self.figures(point, "tps")

    def storage_done(self) -> bool:
        return self.store.storage_done(self.sweep_id)

    def sweep_info(self, info: SweepInfo | None) -> None:
        if info is not None:
            self.info = info
            self.store.set_sweep_info(self.sweep_id, info.environment, info.topology)

    def events(self, events: Iterable[Event]) -> None:
        events = list(events)
        if events:
            try:
                self.store.add_events(self.sweep_id, events)
            except Exception as exc:  # a full disk: what happened is in the log, the store can take no more
                if no_space(exc) is None:
                    raise

    def fio(self, m: FioMeasurement) -> None:
        self.store.save_fio(self.sweep_id, m.label, m.device, m.results, m.ceilings)

    def run(self, driver: Driver, point: Point, point_id: int, repeat: int) -> str | None:
        """One run through its driver, recorded: None when it ended ok, else why it failed. RunInterrupted
        propagates after the run is marked interrupted."""
        store, ui = self.store, self.ui
        run_id, run_dir = store.start_run(self.sweep_id, point_id, point.index, repeat)
        self.phases.attach(run_id)  # the preparation the sweep marked before the run had an id

        def mark(name: str) -> None:  # a step of the run begins: a phase of the wall time, shown live
            self.phases.mark(name, run_id=run_id)
            ui.run_started(point, repeat, name)

        def steps() -> None:  # the run's steps are over: the recording of its end
            self.phases.mark("record", run_id=run_id)

        try:
            ui.run_started(point, repeat, "prepare")
            result = measure(driver.start_run(point, repeat, run_id, run_dir), mark)
            steps()
            write_json(run_dir / "run.json", result.run_json(run_id, point, repeat))
        except RunInterrupted as exc:
            steps()
            self.events(driver.take_events())
            store.finish_run(run_id, "interrupted", reason=f"interrupted by {exc.signal_name}")
            ui.run_finished(point, repeat, "interrupted", {})
            raise
        except driver.run_errors as exc:
            steps()
            if (where := no_space(exc)) is not None:
                raise self._full(where) from None
            reason = first_line(exc)
            try:
                problem = driver.health()
            except Exception:  # the reason is what matters; a health check that fails adds nothing
                problem = None
            if problem and problem not in reason:
                reason += f"; {problem}"
            self.events(driver.take_events())
            store.finish_run(run_id, "failed", reason=reason)
            self._phases_so_far()
            ui.run_finished(point, repeat, "failed", {"reason": reason})
            return reason
        except BaseException as exc:  # it ends the sweep; the run is not left marked running
            steps()
            if (where := no_space(exc)) is not None:
                raise self._full(where) from None
            self.events(driver.take_events())
            store.finish_run(run_id, "failed", reason=f"the sweep ended: {first_line(exc)}")
            raise
        self.events(driver.take_events())
        self._finish(run_id, run_dir, point, repeat, result)
        self._phases_so_far()
        return None

    def _phases_so_far(self) -> None:
        """The phases ended so far, stored after each run: a pglab killed later keeps them (best effort)."""
        phases = self.phases.take()
        try:
            self.store.add_phases(self.sweep_id, phases)
        except Exception as exc:  # a full disk: the run's own rows matter, the phases are kept for the end
            if no_space(exc) is None:
                raise
            self.phases.put_back(phases)

    def _full(self, where: str) -> NoSpace:
        """The sentence for a full filesystem; the run stays marked running, which a rerun redoes (the store may
        take no more)."""
        thing = str(self.dir / where) if where in ("", "results.db") else where
        return NoSpace(f"no space left on the filesystem of {thing}: free some and resume with the same pglab run "
                       "and --results")

    def _finish(self, run_id: str, run_dir: Path, point: Point, repeat: int, result: RunResult) -> None:
        window = result.window
        events = [*result.events, (window[0], "window-start", ""), (window[1], "window-end", "")]
        self.store.finish_run(run_id, "ok", window=window,
                              settings=dict(result.settings) if result.settings is not None else None,
                              metrics=dict(result.metrics), series=result.series, events=events,
                              tenants=result.tenants)
        self.ui.run_finished(point, repeat, "ok", dict(result.metrics))

    def end(self, status: str, reason: str | None) -> None:
        at = time.time()
        try:
            self.store.end_sweep(self.sweep_id, status, reason, phases=self.phases.close(at), at=at)
        except Exception as exc:  # a full disk: the sweep stays 'running', which a rerun resumes
            if no_space(exc) is None:
                raise
