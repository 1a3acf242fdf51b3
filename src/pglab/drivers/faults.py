"""A measured run with a fault in it, on a process-run target (the local lab, the Patroni lab)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, cast

from pglab import interrupts
from pglab.artifacts import write_json
from pglab.engine.types import Event, RunFailed
from pglab.plan.expand import Point
from pglab.plan.schema import Plan
from pglab.probes.base import now
from pglab.scenarios.figures import fault_phases, phase_metrics, witness_metrics
from pglab.scenarios.inject import FaultTarget, Injector
from pglab.scenarios.witness import Witness
from pglab.targets.base import Endpoints
from pglab.workloads import pgbench
from pglab.workloads.pgbench import PgbenchProcess


class PgbenchOnce(Protocol):
    def __call__(self, endpoints: Endpoints, point: Point, run_dir: Path, name: str, seconds: float | None,
                 transactions: int | None, log: bool, watch_health: bool = True) -> tuple[PgbenchProcess, int]: ...


def through_scenario(plan: Plan, target: object, log: Callable[[str], None], pgbench_once: PgbenchOnce,
                     point: Point, run_dir: Path, launched: float
                     ) -> tuple[pgbench.PgbenchRun, dict[str, float | None], list[Event]]:
    """The measured run with its scenario: the witness writes, the injector strikes at ``at``, and pgbench is
    started again each time the fault ends it, until the run's duration is over (the outage stays in the
    window). Then the witness's ids are read back from the primary now in place."""
    sc = point.scenario
    seconds = plan.run.measured_seconds
    assert sc is not None and seconds is not None
    faults = cast(FaultTarget, target)  # the plan allows scenarios only on targets that take them
    follow = faults.follow_endpoint()
    witness = None
    if sc.witness:
        witness = Witness(follow.conninfo(), run_dir / "witness.jsonl", synchronous_commit=point.synchronous_commit)
        witness.prepare()
        witness.start()
    injector = Injector(sc, faults, launched + sc.at, log=log)
    injector.start()
    segments: list[tuple[PgbenchProcess, int]] = []
    end = launched + seconds
    try:
        while not segments or end - now() >= 1:
            name = "pgbench" if not segments else f"pgbench-{len(segments) + 1}"
            segments.append(pgbench_once(Endpoints(follow), point, run_dir, name,
                                                 seconds=max(1.0, end - now()), transactions=None, log=True,
                                                 watch_health=False))
            if segments[-1][1] != 0 and end - now() >= 1:
                interrupts.sleep(1.0)  # no primary yet: try again in a second
        ended = now()
        interrupts.join(injector, timeout=max(30.0, seconds))  # a backup may outlast the load; the scenario still ends
    finally:
        injector.stop()
        if witness is not None:
            witness.stop()
    injection = injector.result
    events = list(injection.events)
    if injection.error:
        raise RunFailed(injection.error)
    result, metrics = pgbench.finish_segments(segments, run_dir / "pgbench_log", launched, ended)
    out: dict[str, float | None] = {**metrics, **injection.metrics}
    fault, back = injection.fault_time, injection.recovered_time
    if fault is not None:
        out["fault_at_s"] = fault - launched
        if back is not None:
            out["recovered_s"] = back - fault
        phases, unmeasured = fault_phases(launched, fault, back, ended)
        if unmeasured:
            log(unmeasured)
            events.append((now(), "after-unmeasured", unmeasured))
        out.update(phase_metrics(sorted(run_dir.glob("pgbench_log.*")), plan.run.sampling_rate, phases))
    if witness is not None:
        w = witness.verify(fault_time=fault)
        write_json(run_dir / "witness.json", w.as_dict())
        out.update(witness_metrics(w))
    return result, out, events
