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
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pglab import interrupts
from pglab.artifacts import write_json
from pglab.plan.schema import NodeFault, Scenario
from pglab.scenarios.witness import ACKED, FAILED, IN_DOUBT, Attempt, Outcome, timeline_of
from pglab.targets.kubernetes import restore
from pglab.targets.kubernetes.orchestrate import FENCED, K8sError, Orchestrator
from pglab.targets.kubernetes.render import (
    START_MARK,
    STORE_MARK,
    WITNESS_MARK,
    Manifest,
    backup,
    object_store_name,
    store_listing,
)

Event = tuple[float, str, str]
_START = re.compile(rf"^{re.escape(START_MARK)} (\d+(?:\.\d+)?)\s*$", re.MULTILINE)
NODE_KINDS = ("node-loss", "node-drain")
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


def lsn(text: object) -> int | None:
    """A PostgreSQL LSN (``16/B374D848``) as a byte position, or None."""
    if not isinstance(text, str) or not re.fullmatch(r"[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}", text):
        return None
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def _rfc3339(text: object) -> float | None:
    """An RFC 3339 time the API server gives (``2026-11-26T12:55:32Z``) as epoch seconds, or None."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


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
      for ``down`` seconds, then lifts the fence;
    - node-loss: the primary's node fails as a machine does (the plan's ``node_fault.stop`` command); once another
      instance is reported primary, and at least ``down`` seconds after the fault, ``node_fault.start`` brings it
      back;
    - node-drain: the primary's node is cordoned and its instance pods evicted as ``kubectl drain`` does (again at
      each step while a PodDisruptionBudget refuses: CloudNativePG switches the primary over first); uncordoned
      once none is left there, another instance is primary and ``down`` seconds have passed.

    The window starts ``warmup`` seconds after the run Job started pgbench (its START_MARK line, the pod's clock).
    ``fault_time`` is when the request was accepted; ``new_primary_time`` when the operator first reported another
    instance as current primary (and target: the promotion done); ``back_time`` when a fenced standby's fence was
    lifted, or the node back; ``healthy_time`` when the operator reported the Cluster healthy again, every instance
    ready."""

    orch: Orchestrator
    scenario: Scenario
    job: str
    warmup: float
    events: list[Event] = field(default_factory=list)
    old: str | None = None  # the primary when the scenario struck
    new: str | None = None  # the new primary the operator reported (failover, switchover)
    standby: str | None = None  # the standby fenced (standby-loss)
    node: str | None = None  # the node lost or drained
    node_fault: NodeFault | None = None  # node-loss: how the node is stopped and started
    fault_time: float | None = None
    new_primary_time: float | None = None
    back_time: float | None = None
    healthy_time: float | None = None
    _started: float | None = None
    _last_status: dict[str, Any] = field(default_factory=dict)
    _evicted: set[str] = field(default_factory=set)
    _evicting: list[str] = field(default_factory=list)  # node-drain: instance pods the budget still keeps there
    backup_name: str | None = None  # backup: the Backup object asked for
    backup_status: dict[str, Any] = field(default_factory=dict)  # backup: its status once completed
    store: dict[str, float] = field(default_factory=dict)  # backup: the object store's listing afterwards

    @property
    def done(self) -> bool:
        return self.healthy_time is not None

    @property
    def kind(self) -> str:
        return self.scenario.kind

    @property
    def recovered_time(self) -> float | None:
        """When the outage ended: the new primary reported, or the fenced standby let go (as a local run counts), or
        the backup seen completed."""
        return self.back_time if self.kind in ("standby-loss", "backup") else self.new_primary_time

    @property
    def fenced(self) -> bool:
        return self.kind == "standby-loss" and self.fault_time is not None and self.back_time is None

    @property
    def node_away(self) -> bool:
        """A node this scenario stopped or cordoned that is not back yet."""
        return self.kind in NODE_KINDS and self.fault_time is not None and self.back_time is None

    @property
    def disrupted(self) -> bool:
        """Something of this scenario's is still undone (a fence, a node away): ``release`` undoes it."""
        return self.fenced or self.node_away

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
        if self.kind == "backup":
            self._follow_backup()
            return
        if self.fenced:
            if time.time() >= self.fault_time + self.scenario.down:
                self.release()
            return
        if self.kind == "node-drain" and self.node_away:
            self._evict()
        status = self._last_status = self.orch.cluster_status()
        current, target = status.get("currentPrimary"), status.get("targetPrimary", status.get("currentPrimary"))
        t = time.time()
        if (self.kind != "standby-loss" and self.new_primary_time is None and current and current != self.old
                and current == target):
            self.new, self.new_primary_time = current, t
            self.events.append((t, "new-primary", f"{current} reported primary {t - self.fault_time:.1f} s after "
                                f"{self._what}"))
        if (self.node_away and self.new_primary_time is not None and t >= self.fault_time + self.scenario.down
                and not self._evicting):
            self.release()
        if self.recovered_time is not None and not self.node_away and self.orch.is_healthy(status):
            self.healthy_time = t
            began = "request" if self.kind == "switchover" else "fault"
            self.events.append((t, "cluster-healthy", f"{self.orch.k8s.instances} instances ready "
                                f"{t - self.fault_time:.1f} s after the {began}"))

    def _follow_backup(self) -> None:
        """The Backup's phase as the operator reports it: completed ends the scenario, failed fails the run."""
        assert self.backup_name is not None and self.fault_time is not None
        status = self.orch.custom_status("Backup", self.backup_name)
        phase = status.get("phase")
        if phase == "failed":
            raise K8sError(f"backup: Backup/{self.backup_name} failed: {status.get('error') or 'no reason given'}")
        if phase != "completed":
            return
        t = time.time()
        self.backup_status, self.back_time, self.healthy_time = status, t, t
        self.events.append((t, "backup-end", f"Backup/{self.backup_name} completed {t - self.fault_time:.1f} s after "
                            f"it was asked for (WAL {status.get('beginWal', '?')} to {status.get('endWal', '?')}, "
                            f"LSN {status.get('beginLSN', '?')} to {status.get('endLSN', '?')})"))
        self.orch.log(f"backup: {self.events[-1][2]}")

    def measure_store(self) -> None:
        """After a completed backup: the object store listed by a Job in the plugin's sidecar image on the primary's
        node (the image is there), for the backup's size and the WAL archived. A listing that fails costs the
        figures, said once in the run's events, not the run."""
        if self.kind != "backup" or self.back_time is None or self.old is None:
            return
        orch, k8s = self.orch, self.orch.k8s
        try:
            pod = orch.core.read_namespaced_pod(self.old, orch.ns)
            images = [c.image for c in [*(pod.spec.init_containers or []), *pod.spec.containers]
                      if c.name == "plugin-barman-cloud"]
            if not images:
                raise K8sError(f"pod/{self.old} has no plugin-barman-cloud container")
            group, version, plural = "barmancloud.cnpg.io", "v1", "objectstores"
            store = orch.custom.get_namespaced_custom_object(group, version, orch.ns, plural,
                                                             object_store_name(k8s))
            name = f"{self.job[:48]}-store"
            m = store_listing(orch.plan, name, images[0], str(pod.spec.node_name),
                              dict(store["spec"]["configuration"]), str(self.backup_status.get("backupId", "")))
            with tempfile.TemporaryDirectory(prefix="pglab-store-") as tmp:
                outcome = orch.run_job(m, Path(tmp))
            found = re.search(rf"^{STORE_MARK} (\d+) (\d+) (\d+) (\d+)\s*$", outcome.log, re.MULTILINE)
            if not outcome.succeeded or found is None:
                raise K8sError(f"the listing Job/{name} printed no listing: {outcome.log.strip()[-200:]}")
        except Exception as exc:  # figures, not the run: the API, the Job, the store may each refuse
            self.events.append((time.time(), "store-listing-failed", str(exc).splitlines()[0][:300]))
            return
        objects, size, wal_objects, wal_size = (int(g) for g in found.groups())
        self.store = {"backup_objects": objects, "backup_mb": size / 2**20, "archive_wal_objects": wal_objects,
                      "archive_wal_mb": wal_size / 2**20}
        self.events.append((time.time(), "store-listing", f"base backup {objects} objects, {size / 2**20:.1f} MiB; "
                            f"WAL archive {wal_objects} objects, {wal_size / 2**20:.1f} MiB"))

    def check_restore(self, witness: Manifest, run_dir: Path, timeout_s: float) -> dict[str, float | None]:
        """The backup's restore check (``restore.check``), after the witness Job ended (its log is read back from
        ``run_dir``/witness/pod.log): its figures, restore.json beside the run's files, and its events. A
        recovered Cluster that is not healthy in ``timeout_s``, or cannot be read, fails the run."""
        if self.kind != "backup" or not self.scenario.restore_check or self.back_time is None:
            return {}
        attempts = parse_witness_log((run_dir / "witness" / "pod.log").read_text()).attempts
        started = time.time()
        self.events.append((started, "restore-start", f"Cluster/{restore.restore_name(self.orch.plan)} recovered "
                            f"from backup {self.backup_status.get('backupId', '?')}"))
        found = restore.check(self.orch, self.backup_status, attempts, witness, run_dir / "restore", timeout_s)
        write_json(run_dir / "restore.json", found.as_dict())
        lost = f"; lost: {', '.join(map(str, found.lost[:20]))}" if found.lost else ""
        self.events.append((started + found.seconds, "restore-ready",
                            f"Cluster/{found.cluster} healthy {found.seconds:.1f} s after its creation"))
        self.events.append((time.time(), "restore-check",
                            f"{len(found.acked) - len(found.lost)} of the {len(found.acked)} writes acknowledged "
                            f"before the backup's end (LSN {found.end_lsn}) found, {len(found.lost)} lost; "
                            f"{len(found.after_found)} of the {len(found.after)} acknowledged after it{lost}"))
        self.orch.log(f"restore check: {self.events[-1][2]}")
        return found.figures()

    def backup_figures(self) -> dict[str, float | None]:
        """A completed backup's figures under the local backup scenario's names: how long it took as seen here
        (asked for until reported completed), its size and the WAL archive's (``measure_store``), the WAL it spans
        (its begin and end LSN); from the operator's own start and stop (whole seconds): how long the plugin took
        and how long the request waited before it began."""
        if self.kind != "backup" or self.back_time is None or self.fault_time is None:
            return {}
        st = self.backup_status
        out: dict[str, float | None] = {"backup_s": self.back_time - self.fault_time, **self.store}
        if self.store.get("backup_mb") and out["backup_s"]:
            out["backup_mb_s"] = self.store["backup_mb"] / (self.back_time - self.fault_time)
        begin, end = lsn(st.get("beginLSN")), lsn(st.get("endLSN"))
        if begin is not None and end is not None and end >= begin:
            out["backup_wal_mb"] = (end - begin) / 2**20
        started, stopped = _rfc3339(st.get("startedAt")), _rfc3339(st.get("stoppedAt"))
        if started is not None and stopped is not None and stopped >= started:
            out["backup_operator_s"] = stopped - started
        if started is not None:  # from the request until the plugin began (the operator's queue, the checks)
            out["backup_wait_s"] = max(0.0, started - self.fault_time)
        return out

    @property
    def _what(self) -> str:
        return {"failover": f"pod/{self.old} was deleted", "switchover": "the switchover request",
                "standby-loss": f"{self.standby}'s fence was lifted", "node-loss": f"node {self.node} was stopped",
                "node-drain": f"node {self.node} was cordoned",
                "backup": f"Backup/{self.backup_name} was asked for"}[self.kind]

    def _strike(self) -> None:
        status = self.orch.cluster_status()
        primary = status.get("currentPrimary")
        if not primary:
            raise K8sError(f"{self.kind}: Cluster/{self.orch.k8s.cluster_name} reports no currentPrimary")
        self.old = primary
        if self.kind == "backup":
            self.backup_name = f"{self.job[:50]}-backup"
            self.orch.create(backup(self.orch.plan, self.backup_name))
            self.fault_time = time.time()
            self.events.append((self.fault_time, "backup-start", f"Backup/{self.backup_name} of {primary} asked for "
                                "(method plugin, Barman Cloud)"))
            self.orch.log(f"backup: {self.events[-1][2]}")
            return
        if self.kind in NODE_KINDS:
            self.node = self.orch.instance_node(primary)
            if self.kind == "node-loss":
                assert self.node_fault is not None  # the plan's validation requires it
                # the node is cut off as the command begins (the lab's takes its link down first), and a command
                # that fails half-way leaves it away: release() starts it again
                self.fault_time = time.time()
                self._node_command("stop")
                what = f"node {self.node} (of the primary {primary}) stopped"
            else:
                self.orch.cordon(self.node)
                self.fault_time = time.time()
                what = f"node {self.node} (of the primary {primary}) cordoned, its instance pods to be evicted"
            self.events.append((self.fault_time, "fault", what))
            self.orch.log(f"{self.kind}: {what}")
            if self.kind == "node-drain":
                self._evict()
            return
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

    def _evict(self) -> None:
        """One round of ``kubectl drain``: evict the Cluster's instance pods still on the node (a refusal by a
        PodDisruptionBudget is asked again next round)."""
        left = [p.metadata.name for p in self.orch.instance_pods()
                if p.spec.node_name == self.node and p.metadata.deletion_timestamp is None]
        for pod in left:
            if self.orch.evict(pod) and pod not in self._evicted:
                self._evicted.add(pod)
                self.events.append((time.time(), "evicted", f"pod/{pod} evicted from node {self.node}"))
        self._evicting = [p for p in left if p not in self._evicted]

    def _node_command(self, action: str) -> None:
        """The plan's command that stops or starts a node; its failure is the run's, in one sentence."""
        assert self.node_fault is not None and self.node is not None
        argv = [a.replace("{node}", self.node) for a in getattr(self.node_fault, action)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.node_fault.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise K8sError(f"node-loss: target.kubernetes.node_fault.{action} for node {self.node} failed: "
                           f"{exc}") from None
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout).strip().splitlines()
            raise K8sError(f"node-loss: target.kubernetes.node_fault.{action} for node {self.node} exited "
                           f"{proc.returncode}: {said[-1] if said else 'nothing said'}")

    def release(self) -> None:
        """Undo what is still undone: bring a stopped node back, uncordon a drained one (once its time has come,
        or at once when the run ends early), lift a standby's fence; a no-op when nothing is."""
        if self.node_away:
            assert self.fault_time is not None
            if self.kind == "node-loss":
                self._node_command("start")
                how = "started again"
            else:
                self.orch.cordon(str(self.node), unschedulable=False)
                how = "uncordoned"
            self.back_time = time.time()
            self.events.append((self.back_time, "node-back", f"node {self.node} {how} "
                                f"{self.back_time - self.fault_time:.1f} s after the fault"))
            self.orch.log(f"{self.kind}: node {self.node} {how}")
            return
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
                if self.kind == "backup":
                    what = (f"Backup/{self.backup_name} not completed (phase "
                            f"{self.orch.custom_status('Backup', str(self.backup_name)).get('phase', 'none')})")
                raise K8sError(f"{self.kind}: {what} {timeout_s:.0f} s after {self._what} ({state})")
            interrupts.sleep(self.orch.poll_s)
            self.poll()
        if self.kind == "backup" and not self.store:
            self.measure_store()
