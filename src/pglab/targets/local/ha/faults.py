"""The faults and operations a scenario asks of the lab (the FaultTarget's): switch over, kill the leader's
postgres or a whole node, wait for the new leader, start a node again."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from pglab.errors import LabError
from pglab.targets.local import procs
from pglab.targets.local.ha.membership import Membership
from pglab.targets.local.ha.processes import Patronis


@dataclass(frozen=True)
class Kill:
    """A fault injected: which node, which pids got SIGKILL, and when (time.monotonic())."""

    node: str
    pids: tuple[int, ...]
    at: float


@dataclass(frozen=True)
class Transition:
    """A change of leader: from whom, to whom, on which timeline, and how long it took."""

    old: str
    new: str
    timeline: int  # the new leader's, read from the WAL it writes
    seconds: float


class Faults:
    """The lab's part that breaks it on purpose, and watches it heal."""

    def __init__(self, lab: Membership, patroni: Patronis):
        self.lab, self.patroni = lab, patroni

    def start_node(self, name: str) -> None:
        """Start a node's Patroni again (after ``kill_primary_node``): it rejoins as a replica (pg_rewind if needed)."""
        node = self.lab._node(name)
        if node.proc is not None and node.proc.poll() is None:
            return
        self.lab.killed.discard(name)
        self.patroni.start(node)

    def switchover(self, candidate: str | None = None, timeout: float = 90) -> Transition:
        """Planned switchover through the leader's REST API; returns once the new leader runs and takes writes."""
        started = time.monotonic()
        old = self.lab.primary()
        body: dict[str, Any] = {"leader": old.name}
        if candidate:
            body["candidate"] = candidate
        status, reply = self.lab._request(f"{self.lab._node(old.name).api_url}/switchover", "POST", body,
                                          timeout=timeout)
        if status != 200:
            raise LabError(f"switchover from {old.name} refused ({status}): {reply}")
        return self.wait_new_primary(old.name, max(1.0, timeout - (time.monotonic() - started)), since=started)

    def kill_primary_postgres(self) -> Kill:
        """SIGKILL the leader's postmaster only. Its Patroni, still holding the leader lock, sees postgres down
        within ``loop_wait`` and, ``primary_start_timeout`` (300 s) not being over, starts it again in place as
        primary (crash recovery, same timeline): no failover; writes stop for about loop_wait + recovery."""
        leader = self.lab.primary().name
        pid = self.lab._node(leader).postmaster_pid()
        if pid is None:
            raise LabError(f"leader {leader} has no running postmaster")
        at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        self.lab.log(f"killed postmaster of leader {leader} (pid {pid})")
        return Kill(leader, (pid,), at)

    def kill_primary_node(self) -> Kill:
        """SIGKILL the leader's Patroni and its whole PostgreSQL together (the node dies): a real failover once the
        leader lock expires. The node stays down until ``start_node``."""
        return self.kill_node(self.lab.primary().name)

    def kill_node(self, leader: str) -> Kill:
        """SIGKILL a node's Patroni and PostgreSQL together; it stays down until ``start_node``."""
        node = self.lab._node(leader)
        pids: list[int] = []
        if node.proc is not None and node.proc.poll() is None:
            pids += [node.proc.pid, *procs.descendants(node.proc.pid)]
        if (pm := node.postmaster_pid()) is not None:
            pids += [pm, *procs.descendants(pm)]  # started by Patroni in its own session, reparented: not below it
        at = time.monotonic()
        procs.freeze_and_kill(pids)
        self.lab.killed.add(leader)
        if node.proc is not None:
            node.proc.wait(timeout=10)
        end = time.monotonic() + 10  # return once the node is dead: a killed process takes a moment to exit
        while any(procs.alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.01)
        self.lab.log(f"killed node {leader}: patroni and postgres (pids {', '.join(map(str, pids))})")
        return Kill(leader, tuple(pids), at)

    def wait_new_primary(self, old: str, timeout: float | None = None, since: float | None = None) -> Transition:
        """Wait until a node other than ``old`` is the running leader and accepts writes. ``seconds`` counts from
        ``since`` (e.g. a Kill's ``at``), else from the call."""
        start = time.monotonic() if since is None else since
        deadline = time.monotonic() + (timeout if timeout is not None else 2 * self.lab.failover_budget)
        found: list[tuple[str, int]] = []

        def check() -> bool:
            leaders = [m for m in self.lab.members() if m.role == "leader" and m.state == "running" and m.name != old]
            if not leaders:
                return False
            with self.lab.connect(leaders[0].name) as conn:
                if conn.execute("SELECT pg_is_in_recovery()").fetchone() != (False,):
                    return False
                row = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
            # the timeline it writes on: /cluster may still show the one before the promotion
            found[:] = [(leaders[0].name, int(row[0][:8], 16) if row else 0)]
            return True

        self.lab._wait(check, deadline, f"a new leader other than {old}")
        seconds = time.monotonic() - start
        new, timeline = found[0]
        self.lab.log(f"new leader {new} (was {old}, timeline {timeline}) after {seconds:.1f} s")
        return Transition(old, new, timeline, seconds)

