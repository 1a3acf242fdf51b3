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
from pglab.plan.schema import LocalTarget
from pglab.targets.base import Endpoint, Endpoints, PlanCodeUser
from pglab.targets.local.cluster import DBNAME, SUPERUSER
from pglab.targets.local.ha import HALab, Kill

PATRONI_ANSWER_S = 2.0  # Patroni's REST API answers in milliseconds; silent this long, Patroni is frozen or hung

Log = Any


def _epoch(kill: Kill) -> float:
    """A Kill's monotonic time on the run's clock (epoch seconds)."""
    return time.time() - (time.monotonic() - kill.at)


class PatroniTarget:
    """Implements the Target protocol and the scenarios' FaultTarget over an HALab: per-node cgroups (Patroni and
    its postgres together), pgbench's own group, the CPU axis as a rolling restart through Patroni, and the
    replication links through a Toxiproxy proxy in front of each node."""

    read_only = False

    def __init__(self, spec: LocalTarget, base_dir: Path, log: Log = lambda _m: None):
        self.lab = HALab(spec, base_dir, log=log)
        self.log = log
        self.bindir = self.lab.bindir
        self._events: list[tuple[float, str, str]] = []
        self._started = False

    # ---------------------------------------------------------------- limits, CPU axis, links: the lab's
    @property
    def cpus_axis(self) -> bool:
        return self.lab.cpus_axis

    @cpus_axis.setter
    def cpus_axis(self, value: bool) -> None:
        self.lab.cpus_axis = value

    @property
    def cpus(self) -> float | None:
        return self.lab.cpus

    @cpus.setter
    def cpus(self, value: float | None) -> None:
        self.lab.cpus = value

    def set_cpus(self, cpus: float | None) -> float | None:
        return self.lab.set_cpus(cpus)

    def limits_in_force(self) -> dict[str, Any]:
        return self.lab.limits_in_force()

    def cpu_stats(self) -> dict[str, dict[str, float]]:
        return self.lab.cpu_stats()

    def io_stats(self) -> dict[str, dict[str, float]]:
        return self.lab.io_stats()

    def io_accounting(self) -> str | None:
        return self.lab.io_accounting()

    def client_procs_files(self) -> list[Path]:
        return self.lab.client_procs_files()

    def plan_code_user(self) -> PlanCodeUser | None:
        return self.lab.plan_code_user()

    def links_in_force(self) -> dict[str, Any]:
        return self.lab.links_in_force()

    # ---------------------------------------------------------------- Target
    def preflight(self) -> None:
        """etcd, Patroni and PostgreSQL were found on construction."""

    def provision(self, parameters: dict[str, Any]) -> Endpoints:
        if not self._started:
            self._started = True
            self.lab.start(parameters)
        else:
            try:
                self.heal()
            except LabError as exc:  # not ready within its deadline: every run left would fail the same way
                raise LabUnsound(f"{str(exc).strip()}; the lab cannot run the next point: see the logs of etcd and "
                                 "Patroni in the lab, then resume with the same pglab run and --results") from None
            if parameters != self.lab.parameters:
                self.lab.apply(parameters)
        return self.endpoints()

    def heal(self) -> list[str]:
        """Start again the nodes a scenario killed, and what died under a run (etcd, a node's Patroni: found by
        :meth:`health`); wait until every replica streams with its sync role."""
        lab = self.lab
        repaired = []
        if lab.etcd_proc is not None and lab.etcd_proc.poll() is not None:
            lab.restart_etcd()
            repaired.append("etcd")
        hung = self._patroni_hung()
        for name in hung:
            lab.end_patroni(name)
            lab.log(f"ended Patroni of {name}, which did not answer its REST API (twice {PATRONI_ANSWER_S:g} s)")
            self._events.append((time.time(), "repair", f"ended Patroni of {name} (its REST API did not answer)"))
        lost = self._patroni_lost()
        for name in lost:
            lab.start_node(name)
        down = sorted(lab.killed)
        for name in down:
            lab.start_node(name)
        if not lab.etcd_answers():  # else the wait below would wait on it for its whole deadline
            raise LabError("etcd (Patroni's DCS) does not answer (three health checks of 2 s)")
        lab.wait_ready()
        for name in [*lost, *down]:  # started again: a health check right after must not find them still starting
            lab.wait_patroni_answers(name)
        if down:
            self._events.append((time.time(), "repair", f"started {', '.join(down)} again (rejoined as replica)"))
        if repaired or lost:
            what = ", ".join(repaired + [f"Patroni of {n}" for n in lost])
            lab.log(f"restarted {what} (found not running)")
            self._events.append((time.time(), "repair", f"restarted {what} (found not running)"))
        return down + repaired + lost

    def _patroni_lost(self) -> list[str]:
        """Nodes whose Patroni died without pglab killing it (a scenario's kills are in ``lab.killed``)."""
        return [n.name for n in self.lab.nodes
                if n.name not in self.lab.killed and n.proc is not None and n.proc.poll() is not None]

    def _patroni_hung(self) -> list[str]:
        """Nodes whose Patroni is alive but does not answer its REST API (frozen, hung): ended and started again by
        :meth:`heal`, like one that died."""
        return [n.name for n in self.lab.nodes
                if n.name not in self.lab.killed and n.proc is not None and n.proc.poll() is None
                and not self.lab.patroni_answers(n, PATRONI_ANSWER_S)]

    def follow_endpoint(self) -> Endpoint:
        assert self.lab.lab_dir is not None
        nodes = self.lab.nodes
        sock = str(self.lab.lab_dir / "sock")
        return Endpoint("primary", "primary", ",".join(sock for _ in nodes), ",".join(str(n.port) for n in nodes),
                        SUPERUSER, DBNAME, self.lab.client_passfile, target_session_attrs="read-write")

    def endpoints(self) -> Endpoints:
        return Endpoints(self.follow_endpoint(), self.lab.endpoints().standbys)

    def primary_name(self) -> str:
        return self.lab.primary().name  # Patroni's leader now: after a failover, not n0

    def server_pids(self) -> list[int]:
        return self.lab.server_pids()

    def probe_paths(self) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for n in self.lab.nodes:
            out[f"{n.name}.data"] = n.data
            out[f"{n.name}.wal"] = n.wal
        return out

    def storage_paths(self) -> dict[str, tuple[Path, str]]:
        first = self.lab.nodes[0]
        return {"data": (first.data.parent, "target.local.paths.data"),
                "wal": (first.wal.parent, "target.local.paths.wal")}

    def health(self) -> str | None:
        lab = self.lab
        down = [n.name for n in lab.nodes if n.name not in lab.killed and n.postmaster_pid() is None]
        problems = [f"instance(s) {', '.join(down)} not running"] if down else []
        if lab.etcd_proc is not None and lab.etcd_proc.poll() is not None:
            problems.append("etcd (Patroni's DCS) not running")
        lost = self._patroni_lost()
        if lost:
            problems.append(f"Patroni of {', '.join(lost)} not running")
        hung = self._patroni_hung()
        if hung:
            problems.append(f"Patroni of {', '.join(hung)} does not answer its REST API (twice {PATRONI_ANSWER_S:g} s)")
        return "; ".join(problems) or None

    def describe(self) -> dict[str, Any]:
        members = []
        with contextlib.suppress(LabError):
            members = [m.__dict__ for m in self.lab.members()]
        return {
            "kind": "local", "ha": "patroni", "lab_dir": str(self.lab.lab_dir), "bindir": str(self.bindir),
            "patroni_timings": dict(self.lab.timings), "failover_budget_s": self.lab.failover_budget,
            "build_s": self.lab.build_seconds, "members": members,
            "nodes": [{"name": n.name, "port": n.port, "rest_port": n.rest_port, "data": str(n.data),
                       "wal": str(n.wal),
                       **({"via_proxy_port": self.lab.proxy_ports[n.name]} if n.name in self.lab.proxy_ports else {})}
                      for n in self.lab.nodes],
            "network": self.lab.spec.network.model_dump() if self.lab.spec.network else None,
        }

    def server_logs(self) -> dict[str, Path]:
        """PostgreSQL's logs under the node names (the runner reads checkpoints from n0's), then etcd's and
        each Patroni's."""
        logs = self.lab.logs()
        out = {n.name: n.pg_log for n in self.lab.nodes if n.pg_log.is_file()}
        out.update({k: v for k, v in logs.items() if k not in out and v.is_file() and not k.startswith("n")})
        return out

    def teardown(self, keep: bool = False) -> None:
        self.lab.teardown(keep=keep)

    def take_events(self) -> list[tuple[float, str, str]]:
        out, self._events = [*self._events, *self.lab.take_events()], []
        return sorted(out)

    def reset_dataset(self) -> dict[str, Any]:
        raise LabError("dataset.reset: snapshot is not available with ha: patroni")

    # ---------------------------------------------------------------- FaultTarget
    def fail_primary(self, kill: str) -> tuple[str, float]:
        k = self.lab.kill_primary_node() if kill == "node" else self.lab.kill_primary_postgres()
        return k.node, _epoch(k)

    def wait_new_primary(self, old: str, since: float) -> str:
        started = time.monotonic() - (time.time() - since)
        return self.lab.wait_new_primary(old, since=started).new

    def switchover(self) -> tuple[str, str]:
        t = self.lab.switchover()
        return t.old, t.new

    def kill_standby(self) -> str:
        """The whole node of a replica (Patroni would restart a postgres killed alone within a second)."""
        leader = self.lab.primary().name
        name = next(n.name for n in reversed(self.lab.nodes) if n.name != leader and n.name not in self.lab.killed)
        self.lab.kill_node(name)
        return name

    def start_instance(self, name: str) -> None:
        self.lab.start_node(name)

    def scratch_dir(self) -> Path:
        assert self.lab.lab_dir is not None
        path = self.lab.lab_dir / "scratch"
        path.mkdir(exist_ok=True)
        return path
