"""The sweep engine and its recorder, the same for every target: order of runs, ok / failed / interrupted, resume,
the storage phase, cleanup, and what is stored and written to run.json from a driver's RunResult.

The driver here is scripted (the engine is what is under test, on a real store); the real drivers run end to end in
test_sweep.py, test_tenants.py, test_faults.py, test_k8s_run.py and test_kube_lab.py. It is also the smallest
complete driver: what a new target has to supply."""

from __future__ import annotations

import itertools
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pglab.engine.driver import FioMeasurement, MeasuredRun, SweepInfo
from pglab.engine.sweep import run_sweep
from pglab.engine.types import Event, RunFailed, RunResult, SilentObserver, SweepResult
from pglab.errors import RunInterrupted
from pglab.plan import expand, parse_plan
from pglab.plan.expand import Point
from pglab.plan.schema import Plan
from pglab.store.sqlite import Store

PLAN = """
name: engine
matrix:
  clients: [1, 2]
run: {duration: 5s, repeats: 2, order: sequential}
"""


class LibraryError(Exception):
    """Something a driver's library raises that the user cannot act on as it is."""


class Scripted:
    """A driver whose runs do what the test says: return figures, fail, be interrupted, or end the sweep."""

    run_overhead_s = 1.0
    run_errors: tuple[type[BaseException], ...] = (RunFailed,)

    def __init__(self, plan: Plan, script: dict[tuple[int, int], str] | None = None, leftovers: list[str] | None = None,
                 fio: bool = False):
        self.points = expand(plan, cores=2)
        self.script = script or {}
        self.leftovers = leftovers or []
        self.fio = fio
        self.calls: list[str] = []
        self._events: list[Event] = []
        self.info: SweepInfo | None = None
        self.run_dirs: list[Path] = []
        self.tps: Callable[[Point, int], float] = lambda point, repeat: 100.0 * point.clients + repeat

    def preflight(self) -> None:
        self.calls.append("preflight")

    def open(self, first: Point, with_storage: bool, resumed: bool) -> None:
        self.calls.append(f"open {first.clients} storage={with_storage} resumed={resumed}")
        self.info = SweepInfo({"target": "scripted"}, {"instances": 1})
        if self.script.get((0, 0)) == "open fails":
            raise LibraryError("the volume's storage class does not exist")

    def describe(self) -> SweepInfo | None:
        return self.info

    def storage_phase(self, results_dir: Path) -> Iterator[FioMeasurement]:
        self.calls.append("storage")
        yield FioMeasurement("data", "sdz", [], {"commit_flushes_per_s": 1234.0})
        self._events.append((100.0, "fio-done", "data"))

    def load_dataset(self) -> None:
        self.calls.append("dataset")

    def before_run(self, point: Point) -> None:
        self._events.append((200.0 + point.clients, "step", f"clients={point.clients}"))

    def start_run(self, point: Point, repeat: int, run_id: str, run_dir: Path) -> ScriptedRun:
        return ScriptedRun(self, point, repeat, run_dir)

    def health(self) -> str | None:
        return "instance n1 is down"

    def take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def explain(self, exc: BaseException) -> BaseException | None:
        return RunFailed(f"the server cannot be reached: {exc}") if isinstance(exc, LibraryError) else None

    def close(self, keep: bool) -> list[str]:
        self.calls.append(f"close keep={keep}")
        return self.leftovers


class ScriptedRun(MeasuredRun):
    """A run with the two steps every target has: the load (which does what the script says) and its summary."""

    def __init__(self, driver: Scripted, point: Point, repeat: int, run_dir: Path):
        self.driver, self.point, self.repeat, self.run_dir = driver, point, repeat, run_dir

    def measure(self) -> None:
        point, repeat, driver = self.point, self.repeat, self.driver
        driver.calls.append(f"run {point.clients} #{repeat}")
        driver.run_dirs.append(self.run_dir)
        what = driver.script.get((point.clients, repeat), "ok")
        if what == "fail":
            raise RunFailed("pgbench exited 1\nsecond line not kept")
        if what == "interrupt":
            raise RunInterrupted("SIGINT")
        if what == "signal":  # SIGTERM comes in the middle of the run, wherever the main thread is
            signal.raise_signal(signal.SIGTERM)
        if what == "library":
            raise LibraryError("socket closed")
        (self.run_dir / "out.txt").write_text("artifact")

    def summarize(self) -> RunResult:
        point, repeat = self.point, self.repeat
        start = 1000.0 * point.clients + repeat
        return RunResult.of((start, start + 5.0), {"tps": self.driver.tps(point, repeat), "latency_avg_ms": None},
                            series=[(start + 1, "pgbench", "tps", 99.0)], events=[(start - 1, "warmup-start", "1 s")],
                            settings={"work_mem": {"setting": "4096", "unit": "kB"}},
                            record={"files": ["out.txt"], "command": ["pgbench", "-c", str(point.clients)]})


def sweep(tmp_path: Path, driver: Scripted, text: str = PLAN, **kw: Any) -> SweepResult:
    plan = parse_plan(text)
    return run_sweep(driver, plan, text, tmp_path, tmp_path / "results", SilentObserver(), **kw)


def driver_points(text: str) -> list[Point]:
    return Scripted(parse_plan(text)).points


def rows(tmp_path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    store = Store.open(tmp_path / "results", create=False)
    try:
        return list(store.conn.execute(sql, args))
    finally:
        store.close()


def test_every_point_and_repeat_in_order_and_recorded_as_the_driver_returned_it(tmp_path: Path) -> None:
    driver = Scripted(parse_plan(PLAN))
    result = sweep(tmp_path, driver, keep=True)
    assert (result.ok, result.failed, result.interrupted) == (4, 0, False)
    assert driver.calls == ["preflight", "open 1 storage=False resumed=False", "dataset", "run 1 #1", "run 1 #2",
                            "run 2 #1", "run 2 #2", "close keep=True"]
    runs = rows(tmp_path, "SELECT r.id, r.status, r.window_start, r.window_end, r.dir, r.settings FROM runs r "
                          "ORDER BY r.started")
    assert [(s, ws, we) for _, s, ws, we, _, _ in runs] == [("ok", 1001.0, 1006.0), ("ok", 1002.0, 1007.0),
                                                              ("ok", 2001.0, 2006.0), ("ok", 2002.0, 2007.0)]
    run_id, _, _, _, run_dir, settings = runs[2]
    assert json.loads(settings) == {"work_mem": {"setting": "4096", "unit": "kB"}}
    assert dict(rows(tmp_path, "SELECT name, value FROM run_metrics WHERE run_id = ?", run_id)) == {
        "tps": 201.0, "latency_avg_ms": None}
    assert rows(tmp_path, "SELECT ts, source, metric, value FROM series WHERE run_id = ?", run_id) == [
        (2002.0, "pgbench", "tps", 99.0)]
    assert sorted(rows(tmp_path, "SELECT ts, kind FROM events WHERE run_id = ?", run_id)) == [
        (2000.0, "warmup-start"), (2001.0, "window-start"), (2006.0, "window-end")]
    record = json.loads((tmp_path / "results" / run_dir / "run.json").read_text())
    assert record == {"run_id": run_id, "point": {"workload": "tpcb-like", "synchronous_commit": "on", "clients": 2,
                                                "jobs": 2},
                      "repeat": 1, "window": [2001.0, 2006.0], "command": ["pgbench", "-c", "2"],
                      "metrics": {"tps": 201.0, "latency_avg_ms": None}, "files": ["out.txt"]}
    assert (tmp_path / "results" / run_dir / "out.txt").read_text() == "artifact"
    # the driver's sweep events (a step before each run) are the sweep's, not a run's
    assert rows(tmp_path, "SELECT count(*) FROM events WHERE kind = 'step' AND run_id IS NULL") == [(4,)]
    assert rows(tmp_path, "SELECT status, environment FROM sweeps") == [("done", '{"target": "scripted"}')]


def test_a_failed_run_is_recorded_with_its_first_line_and_the_targets_health_and_the_sweep_goes_on(
        tmp_path: Path) -> None:
    result = sweep(tmp_path, Scripted(parse_plan(PLAN), {(1, 2): "fail"}))
    assert (result.ok, result.failed) == (3, 1)
    assert result.failures == [f"{driver_points(PLAN)[0].label()} #2: pgbench exited 1; instance n1 is down"]
    failed = rows(tmp_path, "SELECT id, reason FROM runs WHERE status = 'failed'")
    assert [r for _, r in failed] == ["pgbench exited 1; instance n1 is down"]
    assert rows(tmp_path, "SELECT count(*) FROM run_metrics WHERE run_id = ?", failed[0][0]) == [(0,)]
    assert rows(tmp_path, "SELECT status FROM sweeps") == [("done",)]


def test_an_interrupt_marks_the_run_ends_the_sweep_cleans_up_and_a_rerun_resumes_what_is_left(
        tmp_path: Path) -> None:
    plan = parse_plan(PLAN)
    first = Scripted(plan, {(2, 1): "interrupt"})
    result = sweep(tmp_path, first)
    assert (result.ok, result.interrupted) == (2, True)
    assert first.calls[-1] == "close keep=False"
    assert rows(tmp_path, "SELECT status, reason FROM sweeps") == [("interrupted", "interrupted by SIGINT")]
    assert rows(tmp_path, "SELECT status FROM runs ORDER BY started") == [("ok",), ("ok",), ("interrupted",)]

    second = Scripted(plan)
    result = sweep(tmp_path, second)
    assert (result.resumed, result.already_done, result.ok) == (True, 2, 2)
    assert second.calls == ["preflight", "open 2 storage=False resumed=True", "dataset", "run 2 #1", "run 2 #2",
                            "close keep=False"]
    assert rows(tmp_path, "SELECT status, count(*) FROM runs GROUP BY status") == [("ok", 4)]
    assert len(list((tmp_path / "results" / "discarded").iterdir())) == 1  # the interrupted run's folder
    assert rows(tmp_path, "SELECT status FROM sweeps") == [("done",)]

    third = Scripted(plan)
    assert sweep(tmp_path, third).already_done == 4
    assert third.calls == ["preflight"]  # nothing left to run: no topology is brought up


def test_a_signal_is_only_recorded_where_it_lands_and_the_sweep_stops_at_its_next_safe_point(
        tmp_path: Path) -> None:
    """The handler raises nothing into the driver's code (which may be a library's, holding a lock): the run the
    signal came in goes on to its end and is kept; the engine stops before the next run, the sweep interrupted by
    that signal, and the rerun resumes from there."""
    plan = parse_plan(PLAN)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    first = Scripted(plan, {(1, 2): "signal"})
    result = sweep(tmp_path, first)
    assert (result.ok, result.failed, result.interrupted, result.interrupted_by) == (2, 0, True, "SIGTERM")
    assert first.calls[-2:] == ["run 1 #2", "close keep=False"]
    assert rows(tmp_path, "SELECT status FROM runs ORDER BY started") == [("ok",), ("ok",)]
    assert (first.run_dirs[-1] / "out.txt").read_text() == "artifact"  # written after the signal
    assert rows(tmp_path, "SELECT status, reason FROM sweeps") == [("interrupted", "interrupted by SIGTERM")]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers

    second = Scripted(plan)
    result = sweep(tmp_path, second)
    assert (result.resumed, result.already_done, result.ok, result.interrupted) == (True, 2, 2, False)
    assert second.calls[2:] == ["dataset", "run 2 #1", "run 2 #2", "close keep=False"]


def test_the_storage_phase_runs_once_before_the_runs_and_a_resume_skips_it(tmp_path: Path) -> None:
    text = PLAN + "storage: {profiles: [randread-8k], runtime: 1s, size: 1MiB}\n"
    plan = parse_plan(text)
    first = Scripted(plan, {(1, 2): "interrupt"})
    sweep(tmp_path, first, text)
    assert first.calls[1:4] == ["open 1 storage=True resumed=False", "storage", "dataset"]
    assert rows(tmp_path, "SELECT label, name, value FROM ceilings") == [("data", "commit_flushes_per_s", 1234.0)]
    assert [k for (k,) in rows(tmp_path, "SELECT kind FROM events WHERE run_id IS NULL ORDER BY ts")][:2] == [
        "fio-done", "step"]
    second = Scripted(plan)
    sweep(tmp_path, second, text)
    assert "storage" not in second.calls and second.calls[1] == "open 1 storage=False resumed=True"


def test_what_close_could_not_remove_is_kept_as_events_and_in_the_sweeps_reason(tmp_path: Path) -> None:
    sweep(tmp_path, Scripted(parse_plan(PLAN), leftovers=["pvc/data-1 still terminating"]))
    assert rows(tmp_path, "SELECT status, reason FROM sweeps") == [
        ("done", "left behind: pvc/data-1 still terminating")]
    assert rows(tmp_path, "SELECT detail FROM events WHERE kind = 'cleanup-failed'") == [
        ("pvc/data-1 still terminating",)]


def test_an_error_outside_the_runs_ends_the_sweep_in_the_drivers_words_after_cleaning_up(tmp_path: Path) -> None:
    driver = Scripted(parse_plan(PLAN), {(1, 2): "library"})
    with pytest.raises(RunFailed, match="the server cannot be reached: socket closed"):
        sweep(tmp_path, driver)
    assert driver.calls[-1] == "close keep=False"
    assert rows(tmp_path, "SELECT status, reason FROM sweeps") == [
        ("failed", "the server cannot be reached: socket closed")]
    assert rows(tmp_path, "SELECT status, reason FROM runs ORDER BY started") == [
        ("ok", None), ("failed", "the sweep ended: socket closed")]


def test_a_run_result_cannot_be_changed_after_the_driver_returned_it() -> None:
    r = RunResult.of((1.0, 2.0), {"tps": 1.0})
    with pytest.raises(TypeError):
        r.metrics["tps"] = 2.0  # type: ignore[index]
    with pytest.raises(AttributeError):
        r.window = (0.0, 0.0)  # type: ignore[misc]


def test_a_relative_results_folder_gives_the_driver_absolute_run_folders(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """pgbench and fio run inside the run's folder and are given paths in it: relative ones would point nowhere
    (``pglab run`` without --results uses results/<name>-<time>)."""
    monkeypatch.chdir(tmp_path)
    plan = parse_plan(PLAN)
    driver = Scripted(plan)
    result = run_sweep(driver, plan, PLAN, tmp_path, Path("results"), SilentObserver())
    assert result.results_dir == tmp_path / "results"
    assert driver.run_dirs and all(d.is_absolute() and d.is_dir() for d in driver.run_dirs)


def test_what_is_known_of_a_platform_that_came_half_up_is_kept(tmp_path: Path) -> None:
    driver = Scripted(parse_plan(PLAN), {(0, 0): "open fails"})
    with pytest.raises(RunFailed, match="storage class does not exist"):
        sweep(tmp_path, driver)
    assert driver.calls[-1] == "close keep=False"
    assert rows(tmp_path, "SELECT status, environment FROM sweeps") == [("failed", '{"target": "scripted"}')]


# ------------------------------------------------------------------ order and repeats
MATRIX = """
name: order
matrix:
  clients: [1, 2, 4]
  parameters: {work_mem: [4MB, 64MB]}
"""


def _ran(driver: Scripted) -> list[str]:
    return [c.removeprefix("run ") for c in driver.calls if c.startswith("run ")]


def _stored_order(tmp_path: Path) -> list[tuple[str, int]]:
    store = Store.open(tmp_path / "results", create=False)
    try:
        return store.run_order(store.latest_sweep_id() or 0)
    finally:
        store.close()


def test_interleaved_rounds_run_every_point_once_in_blocks_of_parameters_and_the_order_comes_back_from_the_seed(
        tmp_path: Path) -> None:
    text = MATRIX + "run: {duration: 5s, repeats: 3, seed: 42}\n"
    first = Scripted(parse_plan(text))
    sweep(tmp_path / "a", first, text=text)
    ran = _ran(first)
    assert len(ran) == 18
    work_mem = [p.parameters["work_mem"] for p in first.points]
    # a block per work_mem value (a restart at most between blocks), the plan's block first
    by_block = [ran[:9], ran[9:]]
    assert work_mem[0] == "4MB"
    for block in by_block:
        rounds = [block[i:i + 3] for i in range(0, 9, 3)]
        for number, one_round in enumerate(rounds, 1):  # each round: every point once, this round's repeat
            assert sorted(one_round) == [f"1 #{number}", f"2 #{number}", f"4 #{number}"], block
    assert len({tuple(r) for r in (ran[0:3], ran[3:6], ran[6:9], ran[9:12], ran[12:15], ran[15:18])}) > 1  # shuffled
    stored = _stored_order(tmp_path / "a")
    assert [f"{next(p.clients for p in first.points if p.key == k)} #{r}" for k, r in stored] == ran
    again = Scripted(parse_plan(text))
    sweep(tmp_path / "b", again, text=text)
    assert _ran(again) == ran  # the same seed, the same order
    other_text = text.replace("seed: 42", "seed: 43")
    other = Scripted(parse_plan(other_text))
    sweep(tmp_path / "c", other, text=other_text)
    assert _ran(other) != ran and sorted(_ran(other)) == sorted(ran)


def test_without_a_seed_one_is_drawn_recorded_and_a_resume_follows_it(tmp_path: Path) -> None:
    text = MATRIX + "run: {duration: 5s, repeats: 2}\n"
    whole = Scripted(parse_plan(text))
    sweep(tmp_path / "whole", whole, text=text)
    store = Store.open(tmp_path / "whole" / "results", create=False)
    try:
        schedule = store.sweep_schedule(1)
    finally:
        store.close()
    assert schedule is not None and schedule["order"] == "interleaved" and isinstance(schedule["seed"], int)
    seeded = text.replace("repeats: 2}", f"repeats: 2, seed: {schedule['seed']}}}")
    interrupted = Scripted(parse_plan(seeded))
    order = _ran(whole)
    stop = order[5].split(" #")
    interrupted.script = {(int(stop[0]), int(stop[1])): "interrupt"}
    sweep(tmp_path / "part", interrupted, text=seeded)
    resumed = Scripted(parse_plan(seeded))
    sweep(tmp_path / "part", resumed, text=seeded)
    assert _ran(interrupted)[:5] == order[:5] and _ran(resumed) == order[5:]


def test_sequential_runs_the_plans_order_with_repeats_back_to_back(tmp_path: Path) -> None:
    text = MATRIX + "run: {duration: 5s, repeats: 2, order: sequential}\n"
    driver = Scripted(parse_plan(text))
    sweep(tmp_path, driver, text=text)
    assert _ran(driver) == [f"{p.clients} #{r}" for p in driver.points for r in (1, 2)]


def test_adaptive_repeats_stop_a_quiet_point_at_its_target_and_a_noisy_one_at_max(tmp_path: Path) -> None:
    text = ("name: adaptive\nmatrix: {clients: [1, 2]}\n"
            "run: {duration: 5s, repeats: {min: 3, max: 8, target_ci: 2%}, seed: 1}\n")
    driver = Scripted(parse_plan(text))
    noise = [1.0, 0.6, 1.4, 0.7, 1.3, 0.8, 1.2, 0.9]
    driver.tps = lambda point, repeat: 1000.0 + repeat if point.clients == 1 else 1000.0 * noise[repeat - 1]
    result = sweep(tmp_path, driver, text=text)
    ran = _ran(driver)
    quiet, noisy = [r for r in ran if r.startswith("1 #")], [r for r in ran if r.startswith("2 #")]
    assert quiet == ["1 #1", "1 #2", "1 #3"]  # 1001, 1002, 1003: the interval is ±0.25 %, within 2 % at min
    assert noisy == [f"2 #{r}" for r in range(1, 9)]  # ±30 % swings: never within 2 %, stops at max
    assert result.ok == 11
    said = dict(rows(tmp_path, "SELECT kind, detail FROM events WHERE kind LIKE 'repeats-%'"))
    assert said["repeats-target-reached"].startswith("tpcb-like sc=on c=1 ") and "3 ok runs" in \
        said["repeats-target-reached"]
    assert "c=2 " in said["repeats-max-reached"] and "8 ok runs" in said["repeats-max-reached"]
    from pglab.report.tables import point_table
    store = Store.open(tmp_path / "results", create=False)
    try:
        _, table = point_table(store)
    finally:
        store.close()
    assert {row["clients"]: row["flags"] for row in table} == {
        1: "", 2: "unstable, TPS interval wider than ±2 % after 8 runs"}


def test_adaptive_repeats_count_only_runs_that_ended_ok(tmp_path: Path) -> None:
    text = "name: adaptive\nmatrix: {clients: [1]}\nrun: {duration: 5s, repeats: {min: 2, max: 4, target_ci: 5%}}\n"
    driver = Scripted(parse_plan(text), script={(1, 1): "fail"})
    driver.tps = lambda point, repeat: 1000.0
    sweep(tmp_path, driver, text=text)
    assert _ran(driver) == ["1 #1", "1 #2", "1 #3"]  # #1 failed: one ok run gives no interval, so one more round


def _phase_rows(tmp_path: Path) -> list[tuple[Any, ...]]:
    return rows(tmp_path, "SELECT run_id, name, started, ended FROM phases ORDER BY started, rowid")


def test_the_phases_tile_each_attempt_of_a_sweep_failed_and_interrupted_runs_included(tmp_path: Path) -> None:
    """Each attempt's phases run from its start to its end without a gap or an overlap; a failed run and an
    interrupted one have their phases too; a resume adds its own and the time between the attempts is in none."""
    plan = parse_plan(PLAN)
    sweep(tmp_path, Scripted(plan, {(1, 2): "fail", (2, 1): "interrupt"}))
    first = _phase_rows(tmp_path)
    (started, finished), = rows(tmp_path, "SELECT started, finished FROM sweeps")
    assert first[0][2] == started and first[-1][3] == finished
    assert all(b[2] == a[3] for a, b in itertools.pairwise(first))
    run_ids = [r for (r,) in rows(tmp_path, "SELECT id FROM runs ORDER BY started")]
    assert len(run_ids) == 3  # ok, failed, interrupted (both in the load step: no summary)
    assert [[n for r, n, _s, _e in first if r == run_id] for run_id in run_ids] == [
        ["prepare", "measure", "summary", "record"], ["prepare", "measure", "record"], ["prepare", "measure", "record"]]
    assert [n for r, n, _s, _e in first if r is None] == ["setup", "lab", "dataset", "teardown"]

    resumed_at = time.time()
    sweep(tmp_path, Scripted(plan))
    both = _phase_rows(tmp_path)
    second = both[len(first):]
    (_, finished), = rows(tmp_path, "SELECT started, finished FROM sweeps")
    assert both[:len(first)] == first  # the first attempt's account is kept
    assert second[0][2] >= resumed_at and second[-1][3] == finished
    assert all(b[2] == a[3] for a, b in itertools.pairwise(second))
    assert [n for r, n, _s, _e in second if r is None] == ["setup", "lab", "dataset", "teardown"]
    gap = second[0][2] - first[-1][3]
    assert sum(e - s for _r, _n, s, e in both) == pytest.approx(finished - started - gap, abs=1e-6)


def test_the_pause_is_between_runs_only(tmp_path: Path) -> None:
    """``run.pause`` idles between two runs: not before the first, not after the last (the sweep ends then)."""
    text = PLAN.replace("order: sequential", "order: sequential, pause: 0.05s")
    sweep(tmp_path, Scripted(parse_plan(text)), text)
    names = [n for _r, n, _s, _e in _phase_rows(tmp_path)]
    assert names.count("pause") == 3  # 4 runs
    assert names[names.index("pause") - 1] == "record" and names[names.index("pause") + 1] == "prepare"
    assert names[-2:] == ["record", "teardown"]


def test_the_time_table_sums_the_phases_and_the_duty_cycle_is_the_windows_over_them(tmp_path: Path) -> None:
    from pglab.report.tables import full_report

    sweep(tmp_path, Scripted(parse_plan(PLAN)))
    phases = _phase_rows(tmp_path)
    store = Store.open(tmp_path / "results", create=False)
    try:
        table = {r["phase"]: r for r in json.loads(full_report(store, "json", table="time"))}
        text = " ".join(full_report(store, "table", width=200).split())
    finally:
        store.close()
    wall = sum(e - s for _r, _n, s, e in phases)
    assert table["measure"]["seconds"] == pytest.approx(sum(e - s for _r, n, s, e in phases if n == "measure"),
                                                        abs=0.006)
    assert table["measure"]["per_run_s"] == pytest.approx(table["measure"]["seconds"] / 4, abs=0.006)
    # the scripted windows are 5 s each, four runs ok: 20 s measured over a wall time of milliseconds
    assert f"duty cycle {20.0 / wall * 100:.1f} %: 20.0 s measured in 4 window(s)" in text


class Steps(MeasuredRun):
    """Every step a run can have, each noting that it ran; ``fail_in`` raises RunFailed there."""

    load_phase = "job"

    def __init__(self, calls: list[str], fail_in: str = "", warmup_s: float = 0.0):
        self.calls, self.fail_in, self.warmup_s = calls, fail_in, warmup_s

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_in:
            raise RunFailed(f"{name} failed")

    def prepare(self) -> None:
        self._step("prepare")

    def reset(self) -> None:
        self._step("reset")

    def start_probes(self) -> None:
        self._step("start_probes")

    def warm_up(self) -> None:
        self._step("warm_up")

    def measure(self) -> None:
        self._step("measure")

    def close_probes(self) -> None:
        self._step("close_probes")

    def summarize(self) -> RunResult:
        self._step("summarize")
        return RunResult.of((1.0, 2.0), {"tps": 1.0})

    def end(self, failure: BaseException | None) -> None:
        self.calls.append(f"end {failure}")


def test_the_engine_runs_a_targets_steps_in_one_order_each_a_phase_and_always_ends_the_run() -> None:
    from pglab.engine.run import measure

    calls: list[str] = []
    result = measure(Steps(calls, warmup_s=2.0), lambda phase: calls.append(f"[{phase}]"))
    assert result.metrics["tps"] == 1.0
    assert calls == ["prepare", "[reset]", "reset", "[probes]", "start_probes", "[warm-up]", "warm_up", "[job]",
                     "measure", "[closing-tick]", "close_probes", "[summary]", "summarize", "end None"]

    calls.clear()  # no warm-up in the plan: no warm-up step; a failing step ends the run with its reason
    with pytest.raises(RunFailed, match="measure failed"):
        measure(Steps(calls, fail_in="measure"), lambda phase: calls.append(f"[{phase}]"))
    assert calls == ["prepare", "[reset]", "reset", "[probes]", "start_probes", "[job]", "measure",
                     "end measure failed"]

    calls.clear()  # a target without probes or a reset of its own (the scripted one): no such phases
    driver = Scripted(parse_plan(PLAN))
    run = driver.start_run(driver.points[0], 1, "r1", Path("."))
    run.measure = lambda: calls.append("measure")  # type: ignore[method-assign]
    measure(run, lambda phase: calls.append(f"[{phase}]"))
    assert calls == ["[measure]", "measure", "[summary]"]
