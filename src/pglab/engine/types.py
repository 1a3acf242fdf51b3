"""What the engine and the drivers exchange: the immutable result of one run, and the user interface's hooks.

A driver does one measured run and returns a :class:`RunResult`; it never writes to the store. The recorder is
the only writer (pyperf's split: a worker measures, an orchestrator keeps the books)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from pglab.plan.expand import Point
from pglab.workloads.pgbench import ProgressPoint

Event = tuple[float, str, str]  # (epoch ts, kind, detail)
SeriesPoint = tuple[float, str, str, float | None]  # (epoch ts, source, metric, value)
TenantFigure = tuple[str, str, str, float | None]  # (tenant, tier, metric, value)
Phase = tuple[float, str]  # (epoch ts it began, name): a step of a run, which lasts until the next one begins


class RunFailed(Exception):
    """One run could not complete (pgbench error, an instance down): recorded, and the sweep goes on."""


@dataclass(frozen=True)
class RunResult:
    """One measured run, as a driver saw it: what the recorder stores and writes to ``run.json``.

    ``window`` is the measured interval (epoch seconds) every figure is read over; ``record`` holds what a
    target adds to run.json beside the figures (its pgbench command, Job name, files shipped back …)."""

    window: tuple[float, float]
    metrics: MappingProxyType[str, float | None]
    series: tuple[SeriesPoint, ...] = ()
    events: tuple[Event, ...] = ()
    settings: MappingProxyType[str, Any] | None = None
    tenants: tuple[TenantFigure, ...] = ()
    record: MappingProxyType[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, window: tuple[float, float], metrics: dict[str, float | None], *,
           series: list[SeriesPoint] | tuple[SeriesPoint, ...] = (), events: list[Event] | tuple[Event, ...] = (),
           settings: dict[str, Any] | None = None,
           tenants: list[TenantFigure] | tuple[TenantFigure, ...] = (),
           record: dict[str, Any] | None = None) -> RunResult:
        """Freeze what a driver built up while it measured."""
        return cls(window=(float(window[0]), float(window[1])), metrics=MappingProxyType(dict(metrics)),
                   series=tuple(series), events=tuple(events),
                   settings=MappingProxyType(dict(settings)) if settings is not None else None,
                   tenants=tuple(tenants), record=MappingProxyType(dict(record or {})))

    def run_json(self, run_id: str, point: Point, repeat: int) -> dict[str, Any]:
        """run.json: the run's identity, window and figures, and the target's own record."""
        record = dict(self.record)
        head: dict[str, Any] = {k: record.pop(k) for k in ("job", "command") if k in record}
        return {"run_id": run_id, "point": point.axes, "repeat": repeat, "window": list(self.window), **head,
                "metrics": dict(self.metrics), **record}


class Observer(Protocol):
    """What the engine and drivers tell the user interface (the CLI shows a live progress bar)."""

    def log(self, message: str) -> None: ...
    def sweep_started(self, runs: int, estimate_s: float | None, at_most: bool = False) -> None: ...
    def run_started(self, point: Point, repeat: int, phase: str) -> None: ...
    def progress(self, p: ProgressPoint) -> None: ...
    def run_finished(self, point: Point, repeat: int, status: str, metrics: dict[str, Any]) -> None: ...


class SilentObserver:
    def log(self, message: str) -> None:
        pass

    def sweep_started(self, runs: int, estimate_s: float | None, at_most: bool = False) -> None:
        pass

    def run_started(self, point: Point, repeat: int, phase: str) -> None:
        pass

    def progress(self, p: ProgressPoint) -> None:
        pass

    def run_finished(self, point: Point, repeat: int, status: str, metrics: dict[str, Any]) -> None:
        pass


@dataclass
class SweepResult:
    """How a sweep ended, for the end of ``pglab run`` (its figures are in the store)."""

    sweep_id: int
    results_dir: Path
    ok: int = 0
    failed: int = 0
    interrupted: bool = False
    interrupted_by: str | None = None  # "SIGINT" or "SIGTERM": `pglab run` exits 130 or 143
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
