"""Scenarios on Kubernetes: during a run, delete the primary pod (failover), ask CloudNativePG for a switchover, or
fence a standby for a while (standby-loss); follow the operator; read the witness Job's log with the local witness's
own rules.

pglab holds no connection to the database here: the witness writes from a pod and prints every attempt, and the
ids it read back afterwards; :func:`parse_witness_log` turns that text into the local witness's ``Attempt`` list so
that ``witness.evaluate`` (RPO, in-doubt, RTO) is the very code a local run uses.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from pglab.plan.schema import Scenario
from pglab.scenarios.witness import ACKED, FAILED, IN_DOUBT, Attempt, Outcome, timeline_of
from pglab.targets.kubernetes.orchestrate import FENCED, K8sError, Orchestrator
from pglab.targets.kubernetes.render import START_MARK, WITNESS_MARK

Event = tuple[float, str, str]
_START = re.compile(rf"^{re.escape(START_MARK)} (\d+(?:\.\d+)?)\s*$", re.MULTILINE)
_OUTCOMES: dict[str, Outcome] = {"acked": ACKED, "failed": FAILED, "in_doubt": IN_DOUBT}


class WitnessLogError(Exception):
    """The witness pod's log cannot be evaluated; the message says why, in one line."""


@dataclass
class WitnessLog:
    """What the witness pod printed: its attempts, the ids it read back and the timeline it read them on."""

    attempts: list[Attempt]
    present: list[int]
    timeline: int | None


def parse_witness_log(text: str) -> WitnessLog:
    """The attempts and read-back ids of a witness pod's log (``render.witness_script``'s lines).

    A log without its read-back (the pod ended first, or could not read) cannot say what was lost: refused, never
    read as "everything lost"."""
    attempts: list[Attempt] = []
    present: list[int] = []
    timeline = None
    reading = finished = False
    for number, line in enumerate(text.splitlines(), 1):
        if reading:
            if line.strip() == f"{WITNESS_MARK} present end":
                reading, finished = False, True
            elif line.strip():
                present.append(int(line))
            continue
        if not line.startswith(WITNESS_MARK + " "):
            continue
        fields = line.split(" ", 7)
        what = fields[1]
        if what in _OUTCOMES:
            try:
                ident, sent, done = int(fields[2]), float(fields[3]), float(fields[4])
            except (IndexError, ValueError):
                raise WitnessLogError(f"line {number} of the witness log is not an attempt: {line[:80]!r}") from None
            server = fields[5] if len(fields) > 5 and fields[5] != "-" else None
            lsn = fields[6] if len(fields) > 6 and fields[6] != "-" else None
            error = fields[7].strip() if len(fields) > 7 and fields[7].strip() else None
            attempts.append(Attempt(ident, _OUTCOMES[what], sent, done, server, lsn, error))
        elif what == "walfile" and len(fields) > 2 and re.fullmatch(r"[0-9A-F]{24}", fields[2].strip()):
            timeline = timeline_of(fields[2].strip())
        elif what == "present" and fields[2:3] == ["begin"]:
            reading = True
        elif what in ("prepare-failed", "read-failed"):
            raise WitnessLogError(f"the witness could not {what.split('-')[0]} its table: "
                                  f"{' '.join(fields[2:]) or 'no reason printed'}")
    if not finished:
        raise WitnessLogError("the witness log ends before the ids it read back (the pod ended early?)")
    return WitnessLog(attempts, present, timeline)


def pgbench_started(log: str | None) -> float | None:
    """The pod's epoch at which the run Job started pgbench (its START_MARK line), or None before that."""
    m = _START.search(log or "")
    return float(m.group(1)) if m else None


@dataclass
class Injector:
    """Does what the scenario names ``at`` seconds into the window and follows the operator, one step per ``poll``.

    - failover: deletes the primary pod; CloudNativePG promotes a standby;
    - switchover: asks CloudNativePG to promote a standby (``Orchestrator.promote``, as ``kubectl cnpg promote``);
    - standby-loss: fences a standby (``cnpg.io/fencedInstances``: the operator stops its postgres, the pod stays)
      for ``down`` seconds, then lifts the fence.

    The window starts ``warmup`` seconds after the run Job started pgbench (its START_MARK line, the pod's clock).
    ``fault_time`` is when the request was accepted; ``new_primary_time`` when the operator first reported another
    instance as current primary (and target: the promotion done); ``back_time`` when a fenced standby's fence was
    lifted; ``healthy_time`` when the operator reported the Cluster healthy again, every instance ready."""

    orch: Orchestrator
    scenario: Scenario
    job: str
    warmup: float
    events: list[Event] = field(default_factory=list)
    old: str | None = None  # the primary when the scenario struck
    new: str | None = None  # the new primary the operator reported (failover, switchover)
    standby: str | None = None  # the standby fenced (standby-loss)
    fault_time: float | None = None
    new_primary_time: float | None = None
    back_time: float | None = None
    healthy_time: float | None = None
    _started: float | None = None
    _last_status: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.healthy_time is not None

    @property
    def kind(self) -> str:
        return self.scenario.kind

    @property
    def recovered_time(self) -> float | None:
        """When the outage ended: the new primary reported, or the fenced standby let go (as a local run counts)."""
        return self.back_time if self.kind == "standby-loss" else self.new_primary_time

    @property
    def fenced(self) -> bool:
        return self.kind == "standby-loss" and self.fault_time is not None and self.back_time is None

    def poll(self) -> None:
        """One look: before the fault, whether it is due; after it, what the operator reports."""
        if self.fault_time is None:
            if self._started is None:
                try:
                    self._started = pgbench_started(self.orch.job_log(self.job))
                except K8sError:  # its container not started yet (400 while it waits): look again next time
                    return
            if self._started is not None and time.time() >= self._started + self.warmup + self.scenario.at:
                self._strike()
            return
        if self.done:
            return
        if self.fenced:
            if time.time() >= self.fault_time + self.scenario.down:
                self.release()
            return
        status = self._last_status = self.orch.cluster_status()
        current, target = status.get("currentPrimary"), status.get("targetPrimary", status.get("currentPrimary"))
        t = time.time()
        if (self.kind != "standby-loss" and self.new_primary_time is None and current and current != self.old
                and current == target):
            self.new, self.new_primary_time = current, t
            self.events.append((t, "new-primary", f"{current} reported primary {t - self.fault_time:.1f} s after "
                                f"{self._what}"))
        if self.recovered_time is not None and self.orch.is_healthy(status):
            self.healthy_time = t
            began = "request" if self.kind == "switchover" else "fault"
            self.events.append((t, "cluster-healthy", f"{self.orch.k8s.instances} instances ready "
                                f"{t - self.fault_time:.1f} s after the {began}"))

    @property
    def _what(self) -> str:
        return {"failover": f"pod/{self.old} was deleted", "switchover": "the switchover request",
                "standby-loss": f"{self.standby}'s fence was lifted"}[self.kind]

    def _strike(self) -> None:
        status = self.orch.cluster_status()
        primary = status.get("currentPrimary")
        if not primary:
            raise K8sError(f"{self.kind}: Cluster/{self.orch.k8s.cluster_name} reports no currentPrimary")
        self.old = primary
        if self.kind == "failover":
            self.orch.delete_pod(primary)
            self.fault_time = time.time()
            self.events.append((self.fault_time, "fault", f"pod/{primary} (the primary) deleted"))
            self.orch.log(f"failover: deleted pod/{primary}, the primary")
            return
        standbys = sorted(p.metadata.name for p in self.orch.instance_pods()
                          if p.metadata.name != primary and p.metadata.deletion_timestamp is None)
        if not standbys:
            raise K8sError(f"{self.kind}: Cluster/{self.orch.k8s.cluster_name} has no standby pod besides {primary}")
        standby = standbys[0]
        if self.kind == "switchover":
            self.orch.promote(standby)
            self.fault_time = time.time()
            self.events.append((self.fault_time, "fault", f"switchover from {primary} to {standby} requested"))
        else:
            self.orch.patch_cluster({"metadata": {"annotations": {FENCED: json.dumps([standby])}}})
            self.standby, self.fault_time = standby, time.time()
            self.events.append((self.fault_time, "fault", f"standby {standby} fenced (CloudNativePG stops its "
                                f"postgres) for {self.scenario.down:g} s"))
        self.orch.log(f"{self.kind}: {self.events[-1][2]}")

    def release(self) -> None:
        """Lift a standby's fence (at ``down``, or at once when the run ends early); a no-op when none is set."""
        if not self.fenced:
            return
        self.orch.patch_cluster({"metadata": {"annotations": {FENCED: None}}})
        self.back_time = time.time()
        assert self.fault_time is not None
        self.events.append((self.back_time, "standby-back", f"{self.standby}'s fence lifted after "
                            f"{self.back_time - self.fault_time:.1f} s"))

    def finish(self, timeout_s: float) -> None:
        """After the run's Job: wait until the scenario is over, or say why it is not. ``timeout_s`` counts from the
        fault, or for a standby-loss from when its fence is lifted (``down`` may be long)."""
        if self.fault_time is None:
            why = ("the run Job never printed its start" if self._started is None else
                   f"the run ended before the {self.kind} was due at {self.scenario.at:g} s")
            raise K8sError(f"{self.kind}: nothing was done ({why})")
        while not self.done:
            start = self.fault_time + (self.scenario.down if self.kind == "standby-loss" else 0.0)
            if self.back_time is not None:
                start = self.back_time
            if time.time() > start + timeout_s:
                st = self._last_status
                state = (f"currentPrimary {st.get('currentPrimary', '?')}, targetPrimary "
                         f"{st.get('targetPrimary', '?')}, phase: {st.get('phase', 'none')}, ready instances: "
                         f"{st.get('readyInstances', 0)} of {self.orch.k8s.instances}")
                what = "no new primary reported" if self.recovered_time is None else "Cluster not healthy again"
                raise K8sError(f"{self.kind}: {what} {timeout_s:.0f} s after {self._what} ({state})")
            time.sleep(self.orch.poll_s)
            self.poll()
