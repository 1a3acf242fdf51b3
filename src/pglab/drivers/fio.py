"""`pglab fio`'s driver: a storage phase on the paths given and no runs, so that the engine runs it as any other
sweep (one writer per results folder, resume, signals, the sweep's end)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from pglab import storage
from pglab.engine.driver import FioMeasurement, SweepInfo
from pglab.engine.types import Event
from pglab.plan.expand import Point
from pglab.workloads import fio


class FioDriver:
    """fio on each path (label → (path, the option naming it)), as they are: nothing is brought up or torn down."""

    run_overhead_s = 0.0
    run_errors: tuple[type[BaseException], ...] = ()
    polls_interrupts = True  # fio's waits act on the recorded signal: its files are removed before the sweep ends

    def __init__(self, paths: dict[str, tuple[Path, str]], jobs: Sequence[fio.JobSpec], runtime_s: float,
                 size_bytes: int, log: Callable[[str], None]):
        self.paths, self.jobs, self.runtime_s, self.size_bytes, self.log = paths, jobs, runtime_s, size_bytes, log
        self.points: list[Point] = []

    def preflight(self) -> None:
        """Before the results folder exists: fio is there and every path can take a test file."""
        fio.find_fio()
        for path, field in self.paths.values():
            fio.check_path(path, self.size_bytes, field=field)

    def storage_phase(self, results_dir: Path) -> Iterator[FioMeasurement]:
        return storage.measure(results_dir, self.paths, self.jobs, runtime_s=self.runtime_s,
                               size_bytes=self.size_bytes, log=self.log)

    # no topology, dataset or runs: the rest of the protocol has nothing to do
    def open(self, first: Point, with_storage: bool, resumed: bool) -> None: pass
    def load_dataset(self) -> None: pass
    def before_run(self, point: Point) -> None: pass
    def start_run(self, point: Point, repeat: int, run_id: str, run_dir: Path) -> NoReturn: raise AssertionError
    def describe(self) -> SweepInfo | None: return None
    def health(self) -> str | None: return None
    def take_events(self) -> list[Event]: return []
    def explain(self, exc: BaseException) -> BaseException | None: return None
    def close(self, keep: bool) -> list[str]: return []
