"""The protocol a target's driver implements: the engine calls these, in this order, once per sweep.

    preflight → open → storage_phase → load_dataset → (before_run → one_run) × runs → close

One module per target under ``pglab.drivers`` implements it; ``pglab.drivers.driver_for`` chooses one from the
plan (Patroni's model: the engine does the public operations once, a driver supplies the narrow primitives)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pglab.engine.types import Event, Phase, RunResult
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


class Driver(Protocol):
    """What the engine calls, in this order: preflight, open, storage_phase, load_dataset, then before_run and
    one_run per run, and close.

    Ctrl-C and SIGTERM are only recorded by the engine's handler (:mod:`pglab.interrupts`); a driver whose long waits
    go through that module's ``sleep``, ``wait``, ``join``, ``wait_all`` and ``run`` (or call its ``check``) says so
    with a class attribute ``polls_interrupts = True``, and each of those waits then raises RunInterrupted from its
    own code. The attribute is optional (not a member here): without it, the handler raises RunInterrupted itself
    wherever the main thread is, as all drivers had it before (every driver of pglab's own polls now)."""

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

    def one_run(self, point: Point, repeat: int, run_id: str, run_dir: Path) -> RunResult:
        """One measured run; raises one of ``run_errors`` (or RunInterrupted, from a wait that saw the signal) after
        stopping what it started."""

    def health(self) -> str | None:
        """None when the target is healthy; otherwise what is wrong, in one sentence (added to a failure)."""

    def take_events(self) -> list[Event]:
        """Sweep events since the last call (restarts, CPU steps, a fault's steps of a failed run)."""

    def take_phases(self) -> list[Phase]:
        """The steps of the last run since the last call, (when each began, its name): warm-up, measure, summary …
        The engine marks a run's start and end itself; these split it so the report can say where time went."""

    def explain(self, exc: BaseException) -> BaseException | None:
        """What to end the sweep with in place of ``exc`` (one sentence the user can act on), or None."""

    def close(self, keep: bool) -> list[str]:
        """Stop and delete what the driver started (also after a failure or an interrupt); what it could not."""
