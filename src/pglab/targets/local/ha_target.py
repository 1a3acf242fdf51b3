"""The Patroni lab (ha.py) as a runner target: ``target.local.ha: patroni``.

Clients follow the leader: the primary endpoint lists every instance with ``target_session_attrs=read-write``, so
pgbench, the probes and the witness writer land on whichever node leads now. Between runs the lab is healed:
nodes killed by a scenario are started again and rejoin as replicas before the next trial.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from pglab.errors import LabError, LabUnsound
from pglab.targets.base import Endpoint, Endpoints
from pglab.targets.local.ha import HALab
from pglab.targets.local.pgconf import DBNAME, SUPERUSER

PATRONI_ANSWER_S = 2.0  # Patroni's REST API answers in milliseconds; silent this long, Patroni is frozen or hung


class PatroniTarget(HALab):
    """The HA lab as the runner's Target and the scenarios' FaultTarget: what the lab shares with the plain one
    (per-node cgroups holding Patroni and its postgres, pgbench's own group, the CPU axis as a rolling restart
    through Patroni, the links through a Toxiproxy proxy in front of each node) is the lab's own (LabBase); this
    adds provisioning with healing between runs, health, the run's description and the faults' interface."""

    _started = False

    # ---------------------------------------------------------------- Target
    def provision(self, parameters: dict[str, Any]) -> Endpoints:
        if not self._started:
            self._started = True
            self.start(parameters)
        else:
            try:
                self.heal()
            except LabError as exc:  # not ready within its deadline: every run left would fail the same way
                raise LabUnsound(f"{str(exc).strip()}; the lab cannot run the next point: see the logs of etcd and "
                                 "Patroni in the lab, then resume with the same pglab run and --results") from None
            if parameters != self.parameters:
                self.settings.apply(parameters)
        return Endpoints(self.follow_endpoint(), self.endpoints().standbys)

    def heal(self) -> list[str]:
        """Start again the nodes a scenario killed, and what died under a run (etcd, a node's Patroni: found by
        :meth:`health`); wait until every replica streams with its sync role."""
        repaired = []
        if self.dcs.down():
            self.dcs.restart()
            repaired.append("etcd")
        for name in self.patroni.hung(PATRONI_ANSWER_S):
            self.patroni.end(name)
            self.log(f"ended Patroni of {name}, which did not answer its REST API (twice {PATRONI_ANSWER_S:g} s)")
            self._events.append((time.time(), "repair", f"ended Patroni of {name} (its REST API did not answer)"))
        lost = self.patroni.lost()
        down = sorted(self.killed)
        for name in [*lost, *down]:
            self.faults.start_node(name)
        if not self.dcs.answers():  # else the wait below would wait on it for its whole deadline
            raise LabError("etcd (Patroni's DCS) does not answer (three health checks of 2 s)")
        self.wait_ready()
        for name in [*lost, *down]:  # started again: a health check right after must not find them still starting
            self.patroni.wait_answers(name)
        if down:
            self._events.append((time.time(), "repair", f"started {', '.join(down)} again (rejoined as replica)"))
        if repaired or lost:
            what = ", ".join(repaired + [f"Patroni of {n}" for n in lost])
            self.log(f"restarted {what} (found not running)")
            self._events.append((time.time(), "repair", f"restarted {what} (found not running)"))
        return down + repaired + lost

    def follow_endpoint(self) -> Endpoint:
        sock = str(self.sock_dir)
        return Endpoint("primary", "primary", ",".join(sock for _ in self.nodes),
                        ",".join(str(n.port) for n in self.nodes), SUPERUSER, DBNAME, self.client_passfile,
                        target_session_attrs="read-write")

    def primary_name(self) -> str:
        return self.primary().name  # Patroni's leader now: after a failover, not n0

    def health(self) -> str | None:
        down = [n.name for n in self.nodes if n.name not in self.killed and n.postmaster_pid() is None]
        problems = [f"instance(s) {', '.join(down)} not running"] if down else []
        if self.dcs.down():
            problems.append("etcd (Patroni's DCS) not running")
        if lost := self.patroni.lost():
            problems.append(f"Patroni of {', '.join(lost)} not running")
        if hung := self.patroni.hung(PATRONI_ANSWER_S):
            problems.append(f"Patroni of {', '.join(hung)} does not answer its REST API (twice {PATRONI_ANSWER_S:g} s)")
        return "; ".join(problems) or None

    def describe(self) -> dict[str, Any]:
        members = []
        with contextlib.suppress(LabError):
            members = [m.__dict__ for m in self.members()]
        return {
            "kind": "local", "ha": "patroni", "lab_dir": str(self.lab_dir), "bindir": str(self.bindir),
            "patroni_timings": dict(self.timings), "failover_budget_s": self.failover_budget,
            "build_s": self.build_seconds, "members": members,
            "nodes": [{"name": n.name, "port": n.port, "rest_port": n.rest_port, "data": str(n.data),
                       "wal": str(n.wal),
                       **({"via_proxy_port": self.links.ports[n.name]} if n.name in self.links.ports else {})}
                      for n in self.nodes],
            "network": self.spec.network.model_dump() if self.spec.network else None,
        }

    def server_logs(self) -> dict[str, Path]:
        """PostgreSQL's logs under the node names (the runner reads checkpoints from n0's), then etcd's and
        each Patroni's."""
        out = {n.name: n.pg_log for n in self.nodes if n.pg_log.is_file()}
        out.update({k: v for k, v in self.logs().items() if k not in out and v.is_file() and not k.startswith("n")})
        return out

    def take_events(self) -> list[tuple[float, str, str]]:
        return sorted(super().take_events())

    def reset_dataset(self) -> dict[str, Any]:
        raise LabError("dataset.reset: snapshot is not available with ha: patroni")

    # ---------------------------------------------------------------- FaultTarget
    def fail_primary(self, kill: str) -> tuple[str, float]:
        k = self.faults.kill_primary_node() if kill == "node" else self.faults.kill_primary_postgres()
        return k.node, time.time() - (time.monotonic() - k.at)  # the kill's monotonic time on the run's clock

    def wait_new_primary(self, old: str, since: float) -> str:
        started = time.monotonic() - (time.time() - since)
        return self.faults.wait_new_primary(old, since=started).new

    def switchover(self) -> tuple[str, str]:
        t = self.faults.switchover()
        return t.old, t.new

    def kill_standby(self) -> str:
        """The whole node of a replica (Patroni would restart a postgres killed alone within a second)."""
        leader = self.primary().name
        name = next(n.name for n in reversed(self.nodes) if n.name != leader and n.name not in self.killed)
        self.faults.kill_node(name)
        return name

    def start_instance(self, name: str) -> None:
        self.faults.start_node(name)

    def scratch_dir(self) -> Path:
        assert self.lab_dir is not None
        path = self.lab_dir / "scratch"
        path.mkdir(exist_ok=True)
        return path
