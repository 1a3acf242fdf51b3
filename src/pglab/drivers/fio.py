"""`pglab fio`'s driver: a storage phase on the paths given and no runs, so that the engine runs it as any other
sweep (one writer per results folder, resume, signals, the sweep's end). And the parts of the Kubernetes storage
phase that read a fio Job's shipped results and place its host-path run (``storage.host_path``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from pglab import storage
from pglab.engine.driver import FioMeasurement, SweepInfo
from pglab.engine.types import Event
from pglab.plan.expand import Point
from pglab.workloads import fio
from pglab.workloads.fio import FioError


class FioDriver:
    """fio on each path (label → (path, the option naming it)), as they are: nothing is brought up or torn down."""

    run_overhead_s = 0.0
    run_errors: tuple[type[BaseException], ...] = ()

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


# ------------------------------------------------------------------ Kubernetes: a fio Job's results, the host path
def host_directory(host_path: str | dict[str, str] | None, storage_class: str | None, node: str) -> str | None:
    """The node's directory where the host-path fio run of a volume of ``storage_class`` goes (``{node}``: the
    node's name), or None: no host path given, or none for that class (None: the cluster's default class)."""
    directory = host_path.get(storage_class or "") if isinstance(host_path, dict) else host_path
    return directory.replace("{node}", node) if directory is not None else None


def job_results(dest: Path, jobs: Sequence[fio.JobSpec], label: str, where: str, job: str) -> list[fio.FioResult]:
    """Every fio job's figures from what the Kubernetes Job ``job`` shipped into ``dest`` (its JSON and logs);
    a job without a result fails the storage phase in one sentence."""
    results: list[fio.FioResult] = []
    for spec in jobs:
        json_file = dest / f"{spec.name}.json"
        data = fio._read_json(json_file)
        if data is None or not data.get("jobs") or data["jobs"][0].get("error"):
            raise FioError(f"fio job {spec.name} on the {label} volume left no result in Job/{job}'s output (see "
                           "its pod.log)")
        results += fio.parse_results(data, spec, where, json_file, fio._log_files(dest, spec))
    return results
