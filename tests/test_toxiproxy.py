"""The replication-link shaper against the real toxiproxy-server that ./setup.sh builds: latency and bandwidth
are measured through a proxy in front of a small echo server, each against the same proxy without toxics."""

from __future__ import annotations

import os
import signal
import socket
import socketserver
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import processes_mentioning
from pglab.errors import LabError, UserError
from pglab.targets.local import registry
from pglab.targets.local import toxiproxy as tp

pytestmark = pytest.mark.postgres


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = _EchoServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    """Stands for a lab directory: the server's workdir goes under it, as the lab will put it."""
    return tmp_path / "lab"


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed early"
        buf += chunk
    return bytes(buf)


def median_round_trip_ms(port: int, count: int = 30) -> float:
    """Median of ``count`` 32-byte request/replies on one connection (after one to open the path)."""
    with _connect(port) as s:
        s.sendall(b"w" * 32)
        _recv_exactly(s, 32)
        times = []
        for i in range(count):
            msg = bytes([65 + i % 26]) * 32
            t0 = time.perf_counter()
            s.sendall(msg)
            assert _recv_exactly(s, 32) == msg
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def bulk_seconds(port: int, size: int = 64 * 1024) -> float:
    """Seconds to send ``size`` bytes and get them echoed back: the echo is the downstream direction."""
    payload = bytes(range(256)) * (size // 256)
    with _connect(port) as s:
        t0 = time.perf_counter()
        s.sendall(payload)
        assert _recv_exactly(s, size) == payload
        return time.perf_counter() - t0


def test_latency_adds_the_round_trip_asked_for(lab: Path, echo_port: int) -> None:
    with tp.ToxiproxyServer(lab / "toxiproxy", lab / "logs" / "toxiproxy.log") as server:
        port = server.create_proxy("n1", echo_port)
        base = median_round_trip_ms(port)
        server.set_link("n1", latency_ms=40)
        shaped = median_round_trip_ms(port)
        server.remove_link("n1")
        again = median_round_trip_ms(port)
    print(f"round trip median: {base:.2f} ms plain, {shaped:.2f} ms with latency_ms=40, {again:.2f} ms removed")
    assert 30 <= shaped - base <= 60
    assert again - base < 10  # removing the link takes the delay away


def test_bandwidth_caps_the_downstream_direction(lab: Path, echo_port: int) -> None:
    with tp.ToxiproxyServer(lab / "toxiproxy", lab / "logs" / "toxiproxy.log") as server:
        port = server.create_proxy("n1", echo_port)
        base = bulk_seconds(port)
        server.set_link("n1", bandwidth_kbps=256)  # 32 KB/s: 65,536 bytes take 2.05 s
        capped = bulk_seconds(port)
    print(f"64 KiB echoed: {base * 1000:.1f} ms plain, {capped * 1000:.0f} ms at 256 kbps "
          f"({64 * 1024 * 8 / 1000 / capped:.0f} kbps achieved)")
    assert capped / base >= 3
    assert capped >= 0.75 * (64 * 1024 * 8 / 256_000)  # the cap holds, it is not merely some slowdown


def test_toxics_read_back_and_are_replaced(lab: Path, echo_port: int) -> None:
    with tp.ToxiproxyServer(lab / "toxiproxy", lab / "logs" / "toxiproxy.log") as server:
        server.create_proxy("n1", echo_port)
        assert server.version == "2.8.0"
        server.set_link("n1", latency_ms=41, jitter_ms=5, bandwidth_kbps=1000)
        got = {(t["type"], t["stream"]): t["attributes"] for t in server.toxics("n1")}
        assert got == {("latency", "downstream"): {"latency": 21, "jitter": 3},
                       ("latency", "upstream"): {"latency": 20, "jitter": 2},
                       ("bandwidth", "downstream"): {"rate": 125}}
        assert server.link("n1") == tp.Link(41, 5, 1000)

        server.set_link("n1", latency_ms=10)  # replaces: the cap goes away
        assert server.link("n1") == tp.Link(10, 0, None)
        server.set_link("n1", latency_ms=10, bandwidth_kbps=8)
        assert [t["type"] for t in server.toxics("n1") if t["stream"] == "downstream"] == ["latency", "bandwidth"]
        server.remove_link("n1")
        assert server.toxics("n1") == []

        with pytest.raises(ValueError, match="multiple of 8"):
            server.set_link("n1", bandwidth_kbps=100)
        with pytest.raises(ValueError, match="must not exceed"):
            server.set_link("n1", latency_ms=4, jitter_ms=5)
        assert server.toxics("n1") == []  # a refused link changes nothing
        with pytest.raises(LabError, match="proxy not found"):
            server.toxics("n2")


def test_stop_leaves_no_process_and_the_registry_finds_a_running_one(lab: Path) -> None:
    workdir = lab / "toxiproxy"
    server = tp.ToxiproxyServer(workdir, lab / "logs" / "toxiproxy.log")
    assert server.proc is not None
    pid = server.proc.pid
    assert processes_mentioning(str(workdir))  # the command line names the workdir ...
    assert pid in registry.processes_using([lab])  # ... so a killed pglab's server is found and reaped
    server.stop()
    server.stop()  # idempotent
    assert processes_mentioning(str(workdir)) == []
    assert not Path(f"/proc/{pid}").exists()


def test_a_missing_binary_says_to_run_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGLAB_TOXIPROXY", raising=False)
    monkeypatch.setattr(tp, "REPO_BINARY", tmp_path / "none")
    with pytest.raises(UserError, match=r"run \./setup\.sh install"):
        tp.find_toxiproxy()
    monkeypatch.setenv("PGLAB_TOXIPROXY", str(tmp_path / "nothing-here"))
    with pytest.raises(UserError, match="PGLAB_TOXIPROXY"):
        tp.find_toxiproxy()


def test_a_frozen_server_hears_its_sigterm_and_one_deaf_to_it_is_killed(lab: Path) -> None:
    server = tp.ToxiproxyServer(lab / "toxiproxy", lab / "logs" / "toxiproxy.log")
    assert server.proc is not None
    frozen = server.proc
    os.kill(frozen.pid, signal.SIGSTOP)  # a stopped process leaves SIGTERM pending: stop() sends SIGCONT with it
    server.stop()
    assert frozen.returncode in (0, -signal.SIGTERM)  # ended by the SIGTERM (it exits 0 on it), not SIGKILLed
    assert not Path(f"/proc/{frozen.pid}").exists()
    assert processes_mentioning(str(lab / "toxiproxy")) == []

    # a process that ignores SIGTERM (an ignored signal stays ignored across exec) is SIGKILLed after 5 s
    deaf = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 60"], start_new_session=True)
    deadline = time.monotonic() + 30  # the trap is set once sh has become sleep
    while Path(f"/proc/{deaf.pid}/comm").read_text().strip() != "sleep" and time.monotonic() < deadline:
        time.sleep(0.01)
    server.proc = deaf
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 >= 4
    assert deaf.returncode == -signal.SIGKILL
