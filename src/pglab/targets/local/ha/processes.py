"""The lab's daemons, two parts of it: etcd, its DCS (``Etcd``), and one Patroni per node (``Patronis``), started as
the server user (Patroni in the node's cgroup when it has one), adopted from lab.json when another pglab process
started them, and stopped. ``HALab.stop`` orders them: Patroni first, then whatever postgres outlived it, then etcd."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pglab import interrupts
from pglab.errors import LabError, UserError
from pglab.targets.local import cgroups, procs
from pglab.targets.local.ha.config import NAMESPACE
from pglab.targets.local.ha.membership import OPENER, Membership
from pglab.targets.local.ha.node import HOST, HANode, Proc
from pglab.targets.local.ports import free_ports


class Adopted:
    """A daemon started by another (earlier) pglab process, watched through /proc: not our child, so its exit
    status is unknown (reported as -1). ``marker`` (its config file or data directory, found in its command line)
    tells it from a process that reused the pid."""

    def __init__(self, pid: int, marker: str):
        self.pid = pid
        self.marker = marker
        self.returncode: int | None = None

    def _running(self) -> bool:
        if not procs.alive(self.pid):
            return False
        try:
            cmd = Path(f"/proc/{self.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        return self.marker in cmd

    def poll(self) -> int | None:
        if self.returncode is None and not self._running():
            self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.02)
        return -1


def find_etcd() -> Path:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if not found:
        raise UserError("etcd, the HA lab's DCS, is not installed; run ./setup.sh install ha "
                        "(or apt-get install etcd-server).")
    return Path(found)


def find_patroni() -> Path:
    """The ``patroni`` entry point beside this Python (the project's virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / "patroni"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("patroni")
    if not found:
        raise UserError("patroni is not installed in pglab's environment; run ./setup.sh install ha (or pip "
                        "install -e '.[ha]').")
    return Path(found)


def terminate(proc: Proc, timeout: float) -> None:
    """SIGTERM (if not sent yet), wait, then SIGKILL the process and what it started; always reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            procs.freeze_and_kill([proc.pid, *procs.descendants(proc.pid)])
            proc.wait(timeout=10)


def spawn(lab: Membership, args: list[str], log_path: Path, group: cgroups.Group | None = None
          ) -> subprocess.Popen[bytes]:
    """A lab daemon as the server user, in its own session, its output appended to ``log_path``.

    With ``group``, the daemon is held at the door (a shell waiting for a line on stdin) until pglab has moved
    it into the group, then it execs: whatever it forks later (Patroni's postgres, pg_basebackup, pg_rewind) is
    born in the group. The server user cannot write ``cgroup.procs`` itself (root's), so ``cgroups.wrap``,
    where the process enters the group on its own, does not fit here. If pglab dies before the release, the
    shell reads EOF and exits without running anything."""
    kwargs: dict[str, Any] = lab.server_user.popen_kwargs() if lab.server_user else {}
    out = open(log_path, "ab")  # noqa: SIM115 - kept open for the daemon's lifetime, closed in HALab.stop()
    lab._logs.append(out)
    if group is None:
        return subprocess.Popen(args, cwd=lab.lab_dir, env=lab._env(), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
    held = ["sh", "-c", 'read -r _go && exec "$@"', "sh", *args]
    proc = subprocess.Popen(held, cwd=lab.lab_dir, env=lab._env(), stdin=subprocess.PIPE, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
    assert proc.stdin is not None
    try:
        group.add(proc.pid)
    except cgroups.CgroupError:
        proc.stdin.close()  # EOF: the shell exits without running the daemon
        proc.wait(timeout=10)
        raise
    proc.stdin.write(b"go\n")
    proc.stdin.close()  # the daemon's stdin is then at EOF, as /dev/null would be
    return proc


class Etcd:
    """The lab's DCS: one etcd on loopback, its data in ``<lab>/etcd``."""

    def __init__(self, lab: Membership, binary: Path):
        self.lab, self.binary = lab, binary
        self.proc: Proc | None = None
        self.port = 0
        self.peer_port = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def state(self) -> dict[str, Any]:
        """What lab.json records of it (``HALab.attach`` adopts it from there)."""
        return {"client_port": self.port, "peer_port": self.peer_port, "pid": self.proc.pid if self.proc else None}

    def down(self) -> bool:
        """Started by pglab and no longer running."""
        return self.proc is not None and self.proc.poll() is not None

    def start(self, deadline: float) -> None:
        lab = self.lab
        assert lab.lab_dir is not None
        for attempt in range(3):
            if attempt:  # the port was taken between choosing and binding it
                self.port, self.peer_port = free_ports(2)
            client, peer = self.url, f"http://{HOST}:{self.peer_port}"
            log_path = lab.lab_dir / "logs" / "etcd.log"
            offset = log_path.stat().st_size if log_path.exists() else 0
            self.proc = spawn(lab, [
                str(self.binary), "--name", "etcd0", "--data-dir", str(lab.lab_dir / "etcd"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"etcd0={peer}", "--initial-cluster-state", "new",
                "--initial-cluster-token", lab.name, "--logger", "zap", "--log-outputs", "stderr",
            ], log_path)
            lab._write_state()
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    with open(log_path, "rb") as f:
                        f.seek(offset)
                        text = f.read().decode(errors="replace")
                    if "address already in use" in text:
                        break
                    raise LabError(f"etcd exited with code {self.proc.returncode}: {lab._tail(log_path)}")
                if self.answers(attempts=1, timeout=1):
                    lab.log(f"etcd on {HOST}:{self.port}")
                    return
                interrupts.sleep(0.1)
            else:
                raise LabError(f"etcd did not become healthy: {lab._tail(log_path)}")
        raise LabError("etcd did not start: every port tried was taken")

    def answers(self, attempts: int = 3, timeout: float = 2) -> bool:
        """Whether etcd says it is healthy within ``attempts`` reads of ``timeout`` seconds (a frozen or hung etcd
        does not answer; Patroni then waits on it with every request)."""
        for _ in range(attempts):
            with contextlib.suppress(OSError, ValueError):
                status, body = self.lab._request(f"{self.url}/health", timeout=timeout)
                if status == 200 and isinstance(body, dict) and body.get("health") == "true":
                    return True
        return False

    def restart(self, timeout: float = 60) -> None:
        """etcd found dead under the lab: started again on its data directory (the cluster's keys are kept), on its
        former port when free, and Patroni's configuration follows the port."""
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=1)  # reaped
        port = self.port
        self.start(time.monotonic() + timeout)
        if self.port != port:
            raise LabError(f"etcd could not listen on its former port {port} again (taken); Patroni still points there")

    def forget(self, member: str) -> None:
        """Delete a member's key: the leader then drops its place in synchronous_standby_names."""
        key = f"/{NAMESPACE.strip('/')}/{self.lab.name}/members/{member}"
        req = urllib.request.Request(f"{self.url}/v3/kv/deleterange", method="POST",
                                     data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
                                     headers={"Content-Type": "application/json"})  # no REST API credentials
        try:
            with OPENER.open(req, timeout=10) as resp:
                resp.read()
        except (OSError, urllib.error.HTTPError) as exc:
            raise LabError(f"etcd refused to delete {key}: {exc}") from None

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, 10)


class Patronis:
    """One Patroni per node: started in the node's group, watched, ended, stopped."""

    def __init__(self, lab: Membership, binary: Path):
        self.lab, self.binary = lab, binary

    def start(self, node: HANode) -> None:
        """Patroni in the node's group (when there is one), so that every postgres it starts is born there."""
        try:
            node.proc = spawn(self.lab, [str(self.binary), str(node.config)], node.log,
                              self.lab.limits.groups.get(node.name))
        except cgroups.CgroupError as exc:  # its group was removed under the lab, or cgroups stopped working
            raise LabError(f"patroni {node.name} could not enter its cgroup: {exc}") from None
        self.lab._write_state()

    def answers(self, node: HANode, timeout: float, attempts: int = 2) -> bool:
        """Whether the node's Patroni REST API answers at all, in one of ``attempts`` calls of ``timeout``: any
        status counts (``/liveness`` says 503 while its loop waits on etcd), only silence means Patroni itself is
        frozen or hung (two calls: one slow answer on a busy host is not that)."""
        for _ in range(attempts):
            with contextlib.suppress(OSError, ValueError):
                self.lab._request(f"{node.api_url}/liveness", timeout=timeout)
                return True
        return False

    def wait_answers(self, name: str, timeout: float = 60) -> None:
        """After a Patroni is started again: until its REST API listens (it binds after loading its configuration
        from etcd), so that a health check right after does not take a Patroni still starting for a hung one."""
        node = self.lab._node(name)
        self.lab._wait(lambda: self.answers(node, timeout=2, attempts=1), time.monotonic() + timeout,
                       f"the REST API of Patroni {name} restarted")

    def lost(self) -> list[str]:
        """Nodes whose Patroni died without pglab killing it (a scenario's kills are in ``lab.killed``)."""
        return [n.name for n in self.lab.nodes
                if n.name not in self.lab.killed and n.proc is not None and n.proc.poll() is not None]

    def hung(self, timeout: float) -> list[str]:
        """Nodes whose Patroni is alive but does not answer its REST API within ``timeout`` (frozen, hung)."""
        return [n.name for n in self.lab.nodes
                if n.name not in self.lab.killed and n.proc is not None and n.proc.poll() is None
                and not self.answers(n, timeout)]

    def end(self, name: str) -> None:
        """SIGKILL a node's Patroni that stopped answering (its PostgreSQL is left running, as after a crash of
        Patroni: the next Patroni takes it over) and reap it."""
        node = self.lab._node(name)
        if node.proc is None or node.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait(timeout=10)

    def stop(self, nodes: list[HANode], timeout: float) -> None:
        """SIGTERM: each Patroni stops its postgres (fast) before it exits; SIGKILL after ``timeout``."""
        running = [n.proc for n in nodes if n.proc is not None and n.proc.poll() is None]
        for p in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
        for p in running:
            terminate(p, timeout)

    def kill(self) -> None:
        """SIGKILL every Patroni and what it started in its session (not the postgres it started in its own)."""
        for node in self.lab.nodes:
            if node.proc is not None and node.proc.poll() is None:
                procs.freeze_and_kill([node.proc.pid, *procs.descendants(node.proc.pid)])
                node.proc.wait(timeout=10)
