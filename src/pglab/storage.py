"""The storage phase: fio on the very paths PostgreSQL uses, before the database phase.

"Slow storage produces slow databases": the figures stored here (and the ceilings derived from them —
commit flushes per second, random IOPS at depth 32, bandwidth) are the roofline the database results are
read against. Paths on one block device are measured once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pglab.engine.driver import FioMeasurement
from pglab.probes.disk import resolve_device
from pglab.workloads import fio


def plan_jobs(profiles: Sequence[str], job_files: Sequence[Path]) -> list[fio.JobSpec]:
    return [*(j for name in profiles for j in fio.jobs_for(name)), *(j for f in job_files for j in fio.custom_jobs(f))]


def measure(results_dir: Path, paths: dict[str, tuple[Path, str]], jobs: Sequence[fio.JobSpec], *,
            runtime_s: float, size_bytes: int, log: Callable[[str], None]) -> Iterator[FioMeasurement]:
    """Run ``jobs`` on each path (label → (path, plan field naming it)), one measurement per block device, each
    given to the caller (who stores it) as soon as it is done; fio's files go under ``results_dir/storage``."""
    fio.find_fio()
    for path, field in paths.values():
        fio.check_path(path, size_bytes, field=field)
    measured: dict[str, str] = {}
    for label, (path, _field) in paths.items():
        device = resolve_device(path).device
        if device is not None and device in measured:
            log(f"storage: {label} ({path}) is on {device}, already measured as '{measured[device]}'")
            continue
        out_dir = results_dir / "storage" / _safe(label)
        out_dir.mkdir(parents=True, exist_ok=True)
        def started(job: fio.JobSpec, label: str = label) -> None:
            log(f"storage: fio {job.name} on {label}")

        results = fio.run_jobs(path, jobs, runtime_s=runtime_s, size_bytes=size_bytes, out_dir=out_dir,
                               on_job=started)
        for r in results:
            for finding in r.findings:
                log(f"storage: {label} {r.job} {r.direction}: {finding.message}")
        yield FioMeasurement(label, device, results, fio.ceilings(results))
        if device is not None:
            measured[device] = label


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label).strip("_") or "path"
