"""The protocol a target's driver implements: the engine calls these, in this order, once per sweep.

    preflight → open → storage_phase → load_dataset → (before_run → start_run → its steps) × runs → close

One module per target under ``pglab.drivers`` implements it; ``pglab.drivers.driver_for`` chooses one from the
plan (Patroni's model: the engine does the public operations once, a driver supplies the narrow primitives). A run's
steps are a :class:`MeasuredRun` the driver returns; :func:`pglab.engine.run.measure` calls them in their order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pglab.engine.types import Event, RunResult
from pglab.plan.expand import Point


@dataclass(frozen=True)
class FioMeasurement:
    """The storage phase's figures for one path or volume (fio's parsed results and the ceilings derived)."""

    label: str
    device: str | None
    results: list[Any]
    ceilings: dict[str, float]


@dataclass(frozen=True)
class SweepInfo:
    """What is known of the platform once the topology is up: stored with the sweep, shown by the report."""

    environment: dict[str, Any]
    topology: dict[str, Any]


class MeasuredRun:
    """One measured run on one target, as the steps its driver supplies; state between steps lives on the object
    (pyperf's worker: one run measured, an immutable result handed back).

    :func:`pglab.engine.run.measure` calls them in this order, each step a phase of the run: prepare (in the
    ``prepare`` phase the engine opened) → reset → probes → warm-up (when ``warmup_s`` > 0) → ``load_phase`` →
    closing-tick → summary, then ``end`` whatever happened. A step a target does not have is left as it is here, and
    is no phase of its runs."""

    load_phase = "measure"  # the phase the measured window lies in (Kubernetes: "job", its pod's start in it)
    warmup_s = 0.0  # the plan's warm-up, when the driver runs it as a step of its own

    def prepare(self) -> None:
        """Shape the target for the point (parameters, a CPU step) and refuse an unhealthy one (RunFailed)."""

    def reset(self) -> None:
        """The dataset as the plan's ``dataset.reset`` says, every standby caught up."""

    def start_probes(self) -> None:
        """The samplers of the window started (and what the run reads once before it, such as the settings)."""

    def warm_up(self) -> None:
        """The plan's warm-up load."""

    def measure(self) -> None:
        """Start the load, wait for it (watched, with a deadline), stop it: the measured window."""

    def close_probes(self) -> None:
        """Each probe's sample that closes the window."""

    def summarize(self) -> RunResult:
        """The run's figures over its window; its files written."""
        raise NotImplementedError

    def end(self, failure: BaseException | None) -> None:
        """Stop and release what the run started; ``failure`` is what ended it early (None after ``summarize``)."""


class Driver(Protocol):
    """What the engine calls, in this order: preflight, open, storage_phase, load_dataset, then before_run and
    start_run per run, and close.

    Ctrl-C and SIGTERM are only recorded by the engine's handler (:mod:`pglab.interrupts`): a driver's long waits go
    through that module's ``sleep``, ``wait``, ``join``, ``wait_all`` and ``run`` (or call its ``check``), and each of
    those waits raises RunInterrupted from its own code. A wait that does not is not interrupted until it ends."""

    points: list[Point]  # every point of the plan, in the order they run
    run_overhead_s: float  # seconds a run takes beyond its warm-up and measurement (for the ETA)
    run_errors: tuple[type[BaseException], ...]  # what fails one run; anything else ends the sweep

    def preflight(self) -> None:
        """Refuse, with one sentence, what the target cannot do: before a results folder or a server exists."""

    def open(self, first: Point, with_storage: bool, resumed: bool) -> None:
        """Bring the topology up, shaped for ``first`` (a resume may start further on)."""

    def describe(self) -> SweepInfo | None:
        """What is known of the platform so far (stored with the sweep, also when ``open`` failed half-way);
        None before anything is up."""

    def storage_phase(self, results_dir: Path) -> Iterator[FioMeasurement]:
        """fio on the target's paths or volumes, one measurement at a time (each stored as it comes)."""

    def load_dataset(self) -> None:
        """Make the dataset the plan asks for exist (load it, or find it loaded)."""

    def before_run(self, point: Point) -> None:
        """Shape the target for ``point`` when that is a step of its own (a rolling update); may end the sweep."""

    def start_run(self, point: Point, repeat: int, run_id: str, run_dir: Path) -> MeasuredRun:
        """One measured run's steps; a step raises one of ``run_errors`` (or RunInterrupted, from a wait that saw
        the signal), and the run's ``end`` stops what it started."""

    def health(self) -> str | None:
        """None when the target is healthy; otherwise what is wrong, in one sentence (added to a failure)."""

    def take_events(self) -> list[Event]:
        """Sweep events since the last call (restarts, CPU steps, a fault's steps of a failed run)."""

    def explain(self, exc: BaseException) -> BaseException | None:
        """What to end the sweep with in place of ``exc`` (one sentence the user can act on), or None."""

    def close(self, keep: bool) -> list[str]:
        """Stop and delete what the driver started (also after a failure or an interrupt); what it could not."""


def load_summary_modules() -> None:
    """Import what the runs' summaries and the sweep's closing tables need and ``pglab --help`` does not (numpy and
    the log scanner, scipy.special for the intervals). A driver runs it in a thread while its target comes up,
    so that neither the first run's summary nor the sweep's end pays for it (a failure here is theirs to report)."""
    with contextlib.suppress(Exception):
        import scipy.special  # noqa: F401

        import pglab.scenarios.figures
        import pglab.workloads.shipped  # noqa: F401
