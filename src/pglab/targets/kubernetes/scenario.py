"""The failover scenario on Kubernetes: delete the primary pod during a run, follow CloudNativePG's promotion, and
read the witness Job's log with the local witness's own rules.

pglab holds no connection to the database here: the witness writes from a pod and prints every attempt, and the
ids it read back afterwards; :func:`parse_witness_log` turns that text into the local witness's ``Attempt`` list so
that ``witness.evaluate`` (RPO, in-doubt, RTO) is the very code a local run uses.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from pglab.plan.schema import Scenario
from pglab.scenarios.witness import ACKED, FAILED, IN_DOUBT, Attempt, Outcome, timeline_of
from pglab.targets.kubernetes.orchestrate import HEALTHY, K8sError, Orchestrator
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
class Failover:
    """Deletes the primary pod ``at`` seconds into the window and follows the promotion, one step per ``poll``.

    The window starts ``warmup`` seconds after the run Job started pgbench (its START_MARK line, the pod's clock).
    ``fault_time`` is when the delete was accepted; ``new_primary_time`` when the operator first reported another
    instance as current primary (and target: the promotion done); ``healthy_time`` when it reported the Cluster
    healthy again, every instance ready."""

    orch: Orchestrator
    scenario: Scenario
    job: str
    warmup: float
    events: list[Event] = field(default_factory=list)
    old: str | None = None
    new: str | None = None
    fault_time: float | None = None
    new_primary_time: float | None = None
    healthy_time: float | None = None
    _started: float | None = None
    _last_status: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.healthy_time is not None

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
        status = self._last_status = self.orch.cluster_status()
        current, target = status.get("currentPrimary"), status.get("targetPrimary", status.get("currentPrimary"))
        t = time.time()
        if self.new_primary_time is None and current and current != self.old and current == target:
            self.new, self.new_primary_time = current, t
            self.events.append((t, "new-primary", f"{current} reported primary {t - self.fault_time:.1f} s after "
                                f"pod/{self.old} was deleted"))
        if (self.new_primary_time is not None and status.get("phase") == HEALTHY
                and status.get("readyInstances") == self.orch.k8s.instances):
            self.healthy_time = t
            self.events.append((t, "cluster-healthy", f"{self.orch.k8s.instances} instances ready "
                                f"{t - self.fault_time:.1f} s after the fault"))

    def _strike(self) -> None:
        primary = self.orch.cluster_status().get("currentPrimary")
        if not primary:
            raise K8sError(f"failover: Cluster/{self.orch.k8s.cluster_name} reports no currentPrimary to delete")
        self.orch.delete_pod(primary)
        self.old, self.fault_time = primary, time.time()
        self.events.append((self.fault_time, "fault", f"pod/{primary} (the primary) deleted"))
        self.orch.log(f"failover: deleted pod/{primary}, the primary")

    def finish(self, timeout_s: float) -> None:
        """After the run's Job: wait (at most ``timeout_s`` past the fault) until the failover is over, or say why
        it is not."""
        if self.fault_time is None:
            why = ("the run Job never printed its start" if self._started is None else
                   f"the run ended before the fault was due at {self.scenario.at:g} s")
            raise K8sError(f"failover: no pod was deleted ({why})")
        deadline = self.fault_time + timeout_s
        while not self.done:
            if time.time() > deadline:
                st = self._last_status
                state = (f"currentPrimary {st.get('currentPrimary', '?')}, targetPrimary "
                         f"{st.get('targetPrimary', '?')}, phase: {st.get('phase', 'none')}, ready instances: "
                         f"{st.get('readyInstances', 0)} of {self.orch.k8s.instances}")
                what = "no new primary reported" if self.new_primary_time is None else "Cluster not healthy again"
                raise K8sError(f"failover: {what} {timeout_s:.0f} s after pod/{self.old} was deleted ({state})")
            time.sleep(self.orch.poll_s)
            self.poll()
