"""The lab's daemons: etcd and one Patroni per node, started as the server user (in the node's cgroup when it has
one), adopted from lab.json when another pglab process started them, and stopped — Patroni first, then whatever
postgres outlived it, then etcd."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from pglab import interrupts
from pglab.errors import LabError, UserError
from pglab.targets.local import cgroups, leftovers, procs
from pglab.targets.local.ha.membership import Membership
from pglab.targets.local.ha.node import HOST, HANode, Proc


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


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on loopback (held together while chosen, so none is handed out twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


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


class Processes(Membership):
    """The lab's part that starts and stops its daemons."""

    etcd_bin: Path
    patroni_bin: Path
    etcd_proc: Proc | None
    etcd_port: int
    etcd_peer_port: int
    _created_dirs: list[Path]
    _logs: list[IO[bytes]]

    def _spawn(self, args: list[str], log_path: Path, group: cgroups.Group | None = None) -> subprocess.Popen[bytes]:
        """A lab daemon as the server user, in its own session, its output appended to ``log_path``.

        With ``group``, the daemon is held at the door (a shell waiting for a line on stdin) until pglab has moved
        it into the group, then it execs: whatever it forks later (Patroni's postgres, pg_basebackup, pg_rewind) is
        born in the group. The server user cannot write ``cgroup.procs`` itself (root's), so ``cgroups.wrap``,
        where the process enters the group on its own, does not fit here. If pglab dies before the release, the
        shell reads EOF and exits without running anything."""
        kwargs: dict[str, Any] = self.server_user.popen_kwargs() if self.server_user else {}
        out = open(log_path, "ab")  # noqa: SIM115 - kept open for the daemon's lifetime, closed in stop()
        self._logs.append(out)
        if group is None:
            return subprocess.Popen(args, cwd=self.lab_dir, env=self._env(), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
        held = ["sh", "-c", 'read -r _go && exec "$@"', "sh", *args]
        proc = subprocess.Popen(held, cwd=self.lab_dir, env=self._env(), stdin=subprocess.PIPE, stdout=out,
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

    def _start_etcd(self, deadline: float) -> None:
        assert self.lab_dir is not None
        for attempt in range(3):
            if attempt:  # the port was taken between choosing and binding it
                self.etcd_port, self.etcd_peer_port = free_ports(2)
            client, peer = f"http://{HOST}:{self.etcd_port}", f"http://{HOST}:{self.etcd_peer_port}"
            log_path = self.lab_dir / "logs" / "etcd.log"
            offset = log_path.stat().st_size if log_path.exists() else 0
            self.etcd_proc = self._spawn([
                str(self.etcd_bin), "--name", "etcd0", "--data-dir", str(self.lab_dir / "etcd"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"etcd0={peer}", "--initial-cluster-state", "new",
                "--initial-cluster-token", self.name, "--logger", "zap", "--log-outputs", "stderr",
            ], log_path)
            self._write_state()
            while time.monotonic() < deadline:
                if self.etcd_proc.poll() is not None:
                    with open(log_path, "rb") as f:
                        f.seek(offset)
                        text = f.read().decode(errors="replace")
                    if "address already in use" in text:
                        break
                    raise LabError(f"etcd exited with code {self.etcd_proc.returncode}: {self._tail(log_path)}")
                with contextlib.suppress(OSError, ValueError):
                    status, body = self._request(f"{client}/health", timeout=1)
                    if status == 200 and isinstance(body, dict) and body.get("health") == "true":
                        self.log(f"etcd on {HOST}:{self.etcd_port}")
                        return
                interrupts.sleep(0.1)
            else:
                raise LabError(f"etcd did not become healthy: {self._tail(log_path)}")
        raise LabError("etcd did not start: every port tried was taken")

    def etcd_answers(self, attempts: int = 3, timeout: float = 2) -> bool:
        """Whether etcd says it is healthy within ``attempts`` reads of ``timeout`` seconds (a frozen or hung etcd
        does not answer; Patroni then waits on it with every request)."""
        for _ in range(attempts):
            with contextlib.suppress(OSError, ValueError):
                status, body = self._request(f"http://{HOST}:{self.etcd_port}/health", timeout=timeout)
                if status == 200 and isinstance(body, dict) and body.get("health") == "true":
                    return True
        return False

    def patroni_answers(self, node: HANode, timeout: float, attempts: int = 2) -> bool:
        """Whether the node's Patroni REST API answers at all, in one of ``attempts`` calls of ``timeout``: any
        status counts (``/liveness`` says 503 while its loop waits on etcd), only silence means Patroni itself is
        frozen or hung (two calls: one slow answer on a busy host is not that)."""
        for _ in range(attempts):
            with contextlib.suppress(OSError, ValueError):
                self._request(f"{node.api_url}/liveness", timeout=timeout)
                return True
        return False

    def wait_patroni_answers(self, name: str, timeout: float = 60) -> None:
        """After a Patroni is started again: until its REST API listens (it binds after loading its configuration
        from etcd), so that a health check right after does not take a Patroni still starting for a hung one."""
        node = self._node(name)
        self._wait(lambda: self.patroni_answers(node, timeout=2, attempts=1), time.monotonic() + timeout,
                   f"the REST API of Patroni {name} restarted")

    def end_patroni(self, name: str) -> None:
        """SIGKILL a node's Patroni that stopped answering (its PostgreSQL is left running, as after a crash of
        Patroni: the next Patroni takes it over) and reap it."""
        node = self._node(name)
        if node.proc is None or node.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait(timeout=10)

    def restart_etcd(self, timeout: float = 60) -> None:
        """etcd found dead under the lab: started again on its data directory (the cluster's keys are kept), on its
        former port when free, and Patroni's configuration follows the port."""
        if self.etcd_proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.etcd_proc.wait(timeout=1)  # reaped
        port = self.etcd_port
        self._start_etcd(time.monotonic() + timeout)
        if self.etcd_port != port:
            raise LabError(f"etcd could not listen on its former port {port} again (taken); Patroni still points there")

    def _start_patroni(self, node: HANode) -> None:
        """Patroni in the node's group (when there is one), so that every postgres it starts is born there."""
        try:
            node.proc = self._spawn([str(self.patroni_bin), str(node.config)], node.log, self.groups.get(node.name))
        except cgroups.CgroupError as exc:  # its group was removed under the lab, or cgroups stopped working
            raise LabError(f"patroni {node.name} could not enter its cgroup: {exc}") from None
        self._write_state()

    def stop(self, graceful: bool = True, timeout: float = 30) -> None:
        """Stop every Patroni, every PostgreSQL, then etcd; whatever still runs from the lab after that is killed.

        ``graceful``: SIGTERM each Patroni, which stops its postgres cleanly (replicas first, so none takes over
        from a leader being stopped; a synchronous standby waits to be released by the primary: seconds each).
        Otherwise every Patroni gets SIGKILL and each postmaster an immediate shutdown (SIGQUIT), for a lab about
        to be removed. Idempotent."""
        if graceful:
            try:
                leader: str | None = self.primary().name
            except LabError:
                leader = None
            replicas = [n for n in self.nodes if n.name != leader]
            for group in (replicas, [n for n in self.nodes if n.name == leader]):
                self._stop_patronis(group, timeout)
        else:
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is None:
                    procs.freeze_and_kill([node.proc.pid, *procs.descendants(node.proc.pid)])
                    node.proc.wait(timeout=10)
        for node in self.nodes:  # a postgres whose Patroni is gone would otherwise run on
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGQUIT)  # immediate shutdown: the postmaster takes its children down
        for node in self.nodes:
            if (pid := node.postmaster_pid()) is not None:
                procs.stop_postmaster(pid, signalled=True)  # all were signalled at once above
        if self.etcd_proc is not None:
            terminate(self.etcd_proc, 10)
        if self.toxiproxy is not None:
            self.toxiproxy.stop()
        if self.lab_dir is not None:
            leftovers.sweep([self.lab_dir, *self._outside_dirs()])
        for f in self._logs:
            f.close()
        self._logs.clear()

    def _stop_patronis(self, nodes: list[HANode], timeout: float) -> None:
        procs = [n.proc for n in nodes if n.proc is not None and n.proc.poll() is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)  # Patroni stops its postgres (fast) before it exits
        for p in procs:
            terminate(p, timeout)

    def _outside_dirs(self) -> list[Path]:
        assert self.lab_dir is not None
        return [d for d in self._created_dirs if not d.is_relative_to(self.lab_dir)]


    def pids(self) -> dict[str, int]:
        """Every lab daemon now running: etcd, each Patroni, each postmaster."""
        out: dict[str, int] = {}
        if self.etcd_proc is not None and self.etcd_proc.poll() is None:
            out["etcd"] = self.etcd_proc.pid
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                out[f"patroni-{n.name}"] = n.proc.pid
            if (p := n.postmaster_pid()) is not None:
                out[f"postgres-{n.name}"] = p
        return out
