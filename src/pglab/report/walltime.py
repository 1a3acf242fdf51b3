"""Where a sweep's wall time went: its phases (stored by the engine, see ``pglab.engine.recorder.PhaseLog``) summed
by name, and the duty cycle: the measured windows' seconds over the wall time pglab spent on the sweep.

A plan whose runs are short pays the lab, the storage phase and each run's preparation many times over its
measurements; this table says which of them to shorten (or that the runs are long enough)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pglab.store.sqlite import Store

# what each phase is, in the order phases are listed; any other name a driver reports comes after them
WHAT = {"setup": "the results folder, the schedule",
        "lab": "building the lab (a local lab loads its dataset here), reading the environment",
        "storage": "fio",
        "dataset": "loading the dataset (when the lab did not), or finding it loaded",
        "prepare": "per run: parameters in force (reload, restart), health",
        "reset": "per run: dataset reset (dataset.reset), standbys caught up",
        "probes": "per run: settings read, probes connected",
        "warm-up": "per run: pgbench before the window",
        "measure": "per run: pgbench's measured run (start to exit)",
        "job": "per run: the pgbench Job (pod start, warm-up, window)",
        "closing-tick": "per run: the probes' sample that closes the window",
        "summary": "per run: pgbench's summary and logs, figures",
        "record": "per run: run.json and the store",
        "pause": "per run: run.pause",
        "teardown": "stopping and deleting the lab, keeping its logs"}


@dataclass(frozen=True)
class WallTime:
    """A sweep's wall time by phase (seconds), and the seconds its ok runs measured."""

    total_s: float
    by_phase: dict[str, float]
    runs_with: dict[str, int]  # how many runs went through each per-run phase
    measured_s: float
    windows: int

    @property
    def duty_cycle(self) -> float:
        return self.measured_s / self.total_s if self.total_s > 0 else 0.0


def wall_time(store: Store, sweep_id: int) -> WallTime | None:
    """The sweep's account, None for a sweep stored before phases were (or with none)."""
    phases = store.phases(sweep_id)
    if not phases:
        return None
    by_phase: dict[str, float] = {}
    runs: dict[str, set[str]] = {}
    for run_id, name, started, ended in phases:
        by_phase[name] = by_phase.get(name, 0.0) + (ended - started)
        if run_id is not None:
            runs.setdefault(name, set()).add(run_id)
    windows = store.measured_windows(sweep_id)
    ordered = {n: by_phase[n] for n in WHAT if n in by_phase}
    ordered.update({n: s for n, s in by_phase.items() if n not in ordered})
    return WallTime(sum(by_phase.values()), ordered, {n: len(r) for n, r in runs.items()},
                    sum(e - s for s, e in windows), len(windows))


def wall_time_rows(account: WallTime) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per phase: seconds, share of the wall time, seconds per run for a run's phases."""
    columns = ["phase", "seconds", "share_pct", "per_run_s", "what"]
    rows = [{"phase": name, "seconds": round(s, 2),
             "share_pct": round(s / account.total_s * 100, 1) if account.total_s > 0 else None,
             "per_run_s": round(s / account.runs_with[name], 2) if account.runs_with.get(name) else None,
             "what": WHAT.get(name, "")}
            for name, s in account.by_phase.items()]
    return columns, rows


def duty_cycle_line(account: WallTime) -> str:
    """One sentence: the wall time, what share of it the measured windows were."""
    return (f"duty cycle {account.duty_cycle * 100:.1f} %: {account.measured_s:.1f} s measured in "
            f"{account.windows} window(s) out of {_duration(account.total_s)} of wall time")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.1f} s"
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes} min {s:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"
