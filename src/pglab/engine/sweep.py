"""The sweep, written once for every target: resume, order of runs, signals, storage phase, end of sweep.

What a target does is its driver's (``pglab.drivers``); what is stored, the recorder's. A sweep holds its results
folder's lock from the first row to the last, so two pglab never mix their runs in one folder."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pglab import interrupts
from pglab.analysis.stats import estimate
from pglab.engine import capacity
from pglab.engine.driver import Driver
from pglab.engine.recorder import Recorder
from pglab.engine.schedule import Schedule
from pglab.engine.types import Event, Observer, SilentObserver, SweepResult
from pglab.errors import RunInterrupted, UserError, first_line
from pglab.plan.expand import Point, expand
from pglab.plan.schema import Plan
from pglab.store.sqlite import Store


def run_sweep(driver: Driver, plan: Plan, plan_text: str, plan_dir: Path, results_dir: Path,
              observer: Observer | None = None, *, force_new: bool = False, keep: bool = False) -> SweepResult:
    """Run (or resume) the plan's sweep through ``driver`` into ``results_dir``."""
    ui: Observer = observer or SilentObserver()
    results_dir = results_dir.resolve()  # pgbench and fio run inside the run's folder: every path must be absolute
    driver.preflight()  # refusals happen here, before a results folder or a server exists
    with results_lock(results_dir):
        store = Store.open(results_dir)
        try:
            recorder = Recorder(store, ui)
            recorder.open_sweep(plan, plan_text, plan_dir, force_new)
            return _sweep(driver, plan, recorder, ui, keep)
        finally:
            store.close()


def _sweep(driver: Driver, plan: Plan, recorder: Recorder, ui: Observer, keep: bool) -> SweepResult:
    sweep_id, resumed = recorder.sweep_id, recorder.resumed
    result = SweepResult(sweep_id, recorder.dir, resumed=resumed)
    points = driver.points
    point_ids, done = recorder.points(points)
    schedule = recorder.schedule(plan.run)
    result.already_done = len(done)
    found: list[capacity.Found] = []
    if plan.capacity is not None:  # the rates are the search's: each probe's point is registered as it comes
        def probe(base: Point, rate: float | None) -> Point:  # None: the closed-loop run, the base point itself
            point = base if rate is None else dataclasses.replace(base, rate=rate, index=len(point_ids))
            if point.key not in point_ids:
                point_ids.update(recorder.register([point]))
            return point

        todo = capacity.runs(points, plan.capacity, schedule.min_repeats, probe, lambda p, r: (p.key, r) in done,
                             recorder.figures, found.append)
    else:
        todo = schedule.runs(points, done, recorder.tps_of)
    upcoming = next(todo, None)
    first_rounds = [(p.key, r) for p in points for r in range(1, schedule.min_repeats + 1)]  # adaptive: more later
    left = max(1, len([r for r in first_rounds if r not in done])) if upcoming else 0
    if plan.capacity is not None and upcoming:  # a search stops when its answer is found: an upper bound
        left = max(1, len(points) * plan.capacity.max_probes * schedule.min_repeats - len(done))
    if resumed and schedule.target_ci_pct is not None:  # adaptive: how many more is decided as runs end
        ui.log(f"resuming sweep {sweep_id}: {result.already_done} runs already complete, at least {left} to go")
    elif resumed:
        ui.log(f"resuming sweep {sweep_id}: {result.already_done} of {len(first_rounds)} runs already complete, "
               f"{left} to go")
    with_storage = plan.storage is not None and not recorder.storage_done()
    if upcoming is None and not with_storage:
        recorder.end("done", None)
        return result
    ui.log(f"runs: {schedule.describe()}")
    seconds = plan.run.measured_seconds
    per_run = plan.run.warmup + seconds + driver.run_overhead_s if seconds else None
    ui.sweep_started(left, per_run * left if per_run else None, at_most=plan.capacity is not None)
    status, reason = "done", None
    first = upcoming[0] if upcoming else (points or expand(plan))[0]  # `pglab fio`: no points of its own
    # a signal is recorded, and acted on at the safe points below and in the driver's waits (interrupts.check)
    with interrupt_signals() as signals:
        try:
            recorder.phase("lab")
            driver.open(first, with_storage, resumed)
            recorder.sweep_info(driver.describe())
            if with_storage:
                recorder.phase("storage")
                for measurement in driver.storage_phase(recorder.dir):
                    recorder.fio(measurement)
                    interrupts.check()
                recorder.events(driver.take_events())
                recorder.events([(time.time(), "storage-done", "")])
            if upcoming:
                interrupts.check()
                recorder.phase("dataset")
                driver.load_dataset()
            for n, (point, repeat) in enumerate(itertools.chain([upcoming] if upcoming else [], todo)):
                interrupts.check()  # between runs: a run that ended before the signal was acted on is kept
                if n and plan.run.pause:  # between runs: the runs come from generators, so before all but the first
                    recorder.phase("pause")
                    interrupts.sleep(plan.run.pause)
                recorder.phase("prepare")  # the run's id comes with its row; the phase is attached to it then
                driver.before_run(point)
                recorder.events(driver.take_events())
                result.record(point, repeat, recorder.run(driver, point, point_ids[point.key], repeat))
            interrupts.check()  # a signal during the last run: the sweep says so (exit 130/143), its runs are kept
            if schedule.target_ci_pct is not None:
                recorder.events(_targets(schedule, points, recorder, ui))
            if plan.capacity is not None:
                recorder.events([f.event(plan.capacity) for f in found])
                for f in found:
                    ui.log(f.event(plan.capacity)[2])
        except RunInterrupted as exc:
            status, reason = "interrupted", f"interrupted by {exc.signal_name}"
            result.interrupted, result.interrupted_by = True, exc.signal_name
        except BaseException as exc:
            better = driver.explain(exc)  # a cause the user can act on, in place of a library's exception
            status, reason = "failed", first_line(better or exc)
            if better is not None:
                raise better from None
            raise
        finally:
            signals.shield()
            recorder.phase("teardown")
            try:
                if recorder.info is None:  # the topology came partly up: what is known of it is kept
                    with contextlib.suppress(Exception):
                        recorder.sweep_info(driver.describe())
                try:
                    problems = driver.close(keep)
                finally:
                    recorder.events(driver.take_events())  # also what the driver kept while closing
                for p in problems:
                    ui.log(f"cleanup: {p}")
                if problems:
                    recorder.events([(time.time(), "cleanup-failed", p) for p in problems])
                    reason = f"{reason + '; ' if reason else ''}left behind: {'; '.join(problems)}"
            finally:
                recorder.end(status, reason)
    return result


def _targets(schedule: Schedule, points: list[Point], recorder: Recorder, ui: Observer) -> list[Event]:
    """Which points' TPS came within the target interval, and which stopped at max: one event each, logged too."""
    events: list[Event] = []
    for point in points:
        tps = recorder.tps_of(point)
        e = estimate(tps)
        width = f"±{e.ci95 / abs(e.mean) * 100:.1f} %" if e and e.ci95 is not None and e.mean else "no interval"
        reached = schedule.reached(tps)
        kind = "repeats-target-reached" if reached else "repeats-max-reached"
        detail = f"{point.label()}: {len(tps)} ok runs, TPS {width} (target ±{schedule.target_ci_pct:g} %)"
        events.append((time.time(), kind, detail))
        if not reached:
            ui.log(f"target not reached: {detail}")
    reached_n = sum(e[1] == "repeats-target-reached" for e in events)
    ui.log(f"adaptive repeats: {reached_n} of {len(points)} points within ±{schedule.target_ci_pct:g} %")
    return events


@contextmanager
def results_lock(results_dir: Path) -> Iterator[None]:
    """One writer per results folder: a second pglab run into it is refused instead of mixing two sweeps."""
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(results_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"--results: cannot create '{results_dir}' ({exc.strerror}); choose a folder you can "
                        "write to.") from None
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


def interrupt_signals() -> interrupts.Catching:
    """SIGINT/SIGTERM recorded for the duration of a ``with`` block, acted on as RunInterrupted at the next safe point
    (:mod:`pglab.interrupts`); ignored once ``shield()`` is called, while tearing down."""
    return interrupts.Catching()


def check_results_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise UserError(f"--results: '{path}' is a file; give a folder.")
