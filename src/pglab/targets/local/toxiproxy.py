"""Toxiproxy on the replication links: each standby reaches the primary through a proxy whose toxics add latency,
jitter and a bandwidth cap.

Units, as pglab's plan states them and as this module turns them into toxics:

* ``latency_ms`` is the added **round trip**: half of it delays the downstream stream (primary → standby: WAL)
  and half the upstream stream (standby → primary: feedback, replies), each as a ``latency`` toxic. An odd
  value puts the extra millisecond downstream, so the two halves always add up to the round trip asked for.
* ``jitter_ms`` is split the same way; Toxiproxy draws each chunk's delay uniformly in ``latency ± jitter``, so
  the round trip stays ``latency_ms`` on average. It may not exceed ``latency_ms`` (a negative delay would be cut
  to zero and shift that average).
* ``bandwidth_kbps`` is kilobits per second (1 kbit = 1,000 bits), capping the downstream (WAL) direction.
  Toxiproxy's ``bandwidth`` toxic takes ``rate`` in KB/s with 1 KB = 1,000 bytes (it allows ``rate`` bytes per
  millisecond), so ``rate = bandwidth_kbps / 8``; a whole number of KB/s, hence multiples of 8 kbps.

Toxiproxy is built by ``./setup.sh install toxiproxy`` (and ``./setup.sh test``) into
``.tools/bin/toxiproxy-server`` (pinned version). The server runs with its working directory, and its ``-config``
file, inside the workdir it is given: put that under the lab directory and the lab registry finds a server left
behind by a killed pglab like any other process of the lab (``registry.processes_using``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, NoReturn

from pglab.errors import LabError, UserError
from pglab.targets.local.ports import free_port

REPO_BINARY = Path(__file__).resolve().parents[4] / ".tools" / "bin" / "toxiproxy-server"
HOST = "127.0.0.1"
_TOXIC_PREFIX = "pglab_"
# Direct connections only: a proxy named in http_proxy must never see the lab's loopback API calls.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def find_toxiproxy() -> Path:
    """$PGLAB_TOXIPROXY when set (an explicit choice wins), else the one ./setup.sh builds into the repository."""
    override = os.environ.get("PGLAB_TOXIPROXY")
    if override:
        path = Path(override).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(f"PGLAB_TOXIPROXY: '{path}' is not an executable file; point it at toxiproxy-server.")
        return path
    if REPO_BINARY.is_file() and os.access(REPO_BINARY, os.X_OK):
        return REPO_BINARY
    raise UserError("toxiproxy-server, which shapes the replication links (target.local.network), is not "
                    "installed; run ./setup.sh install toxiproxy.")


def kbps_to_rate(bandwidth_kbps: int) -> int:
    """Toxiproxy's bandwidth ``rate`` (KB/s, 1 KB = 1,000 bytes) for a cap in kbit/s; refused unless exact."""
    if bandwidth_kbps <= 0 or bandwidth_kbps % 8:
        raise ValueError(f"bandwidth_kbps must be a positive multiple of 8 (toxiproxy counts whole KB/s), "
                         f"not {bandwidth_kbps}")
    return bandwidth_kbps // 8


@dataclass(frozen=True)
class Link:
    """The shaping of one proxy, in the plan's units (see the module docstring); zeros and None mean none."""

    latency_ms: int = 0
    jitter_ms: int = 0
    bandwidth_kbps: int | None = None


def _error(message: str) -> NoReturn:
    raise LabError(message)


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class ToxiproxyServer:
    """One toxiproxy-server on 127.0.0.1, started on construction; ``stop()`` (or leaving a ``with``) ends it."""

    def __init__(self, workdir: Path, log_path: Path, binary: Path | None = None, timeout: float = 15) -> None:
        self.workdir = workdir.resolve()
        self.log_path = log_path
        self.binary = binary or find_toxiproxy()
        self.port = 0
        self.version = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_offset = 0
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # A disabled proxy with a random name, created from the -config file, proves that the API answering on the
        # port is this server and not another that took the port first (it binds nothing).
        self._sentinel = f"pglab-sentinel-{secrets.token_hex(6)}"
        self.config = self.workdir / "toxiproxy.json"
        self.config.write_text(json.dumps([{"name": self._sentinel, "listen": f"{HOST}:0",
                                            "upstream": f"{HOST}:9", "enabled": False}]))
        try:
            for _attempt in range(3):
                if self._start(timeout):
                    return
                self.stop()
            _error(f"toxiproxy-server did not start on a free port (log: {self.log_path})")
        except BaseException:
            self.stop()
            raise

    # ---------------------------------------------------------------- process
    def _start(self, timeout: float) -> bool:
        """Start on a fresh port; True once the API answers as this server, False when the port was taken."""
        self.port = free_port()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open for the server's lifetime, closed in stop()
        self._log_offset = self._log.tell()  # this attempt's lines only: an earlier one may have failed
        env = {**os.environ, "LOG_LEVEL": "info"}  # the default logs every API request
        self.proc = subprocess.Popen(
            [str(self.binary), "-host", HOST, "-port", str(self.port), "-config", str(self.config)],
            cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                _error(f"toxiproxy-server exited with code {self.proc.returncode}: {self._log_tail()}")
            if "address already in use" in self._log_tail():
                return False  # the port was taken between choosing and binding it
            try:
                proxies = self._request("GET", "/proxies", timeout=1)
            except Exception:  # not listening yet, or something else answers there: the log or the loop decides
                time.sleep(0.05)
                continue
            if not isinstance(proxies, dict) or self._sentinel not in proxies:
                return False  # another toxiproxy answers on this port
            self.version = str(self._request("GET", "/version").get("version", ""))
            return True
        _error(f"toxiproxy-server did not answer within {timeout:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " / ".join(lines[-3:]) or "(empty log)"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; the process is reaped, so nothing is left behind. Idempotent."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
                os.killpg(proc.pid, signal.SIGCONT)  # a frozen (stopped) server handles the SIGTERM at once
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ToxiproxyServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---------------------------------------------------------------- API
    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _request(self, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):
                detail = json.loads(detail)["error"]
            _error(f"toxiproxy {method} {path}: {detail} (HTTP {exc.code})")
        return json.loads(raw) if raw.strip() else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def answers(self, timeout: float, attempts: int = 2) -> bool:
        """Whether the API answers in one of ``attempts`` calls of ``timeout``: a frozen or hung server is alive
        but holds the replication links still, which only a deadline tells apart from a slow run (two calls: one
        slow answer on a busy host is not that)."""
        for _ in range(attempts):
            with contextlib.suppress(OSError, ValueError, LabError):
                self._request("GET", "/version", timeout=timeout)
                return True
        return False

    def create_proxy(self, name: str, upstream_port: int, upstream_host: str = HOST, listen_port: int = 0) -> int:
        """Proxy 127.0.0.1:<port chosen by the kernel, no race; or ``listen_port``, the port of a proxy made again>
        to the upstream; returns the listen port."""
        proxy = self._request("POST", "/proxies", {"name": name, "listen": f"{HOST}:{listen_port}",
                                                   "upstream": f"{upstream_host}:{upstream_port}", "enabled": True})
        return int(str(proxy["listen"]).rsplit(":", 1)[1])

    def delete_proxy(self, name: str) -> None:
        """Remove a proxy; the connections through it are closed."""
        self._request("DELETE", f"/proxies/{_q(name)}")

    def toxics(self, name: str) -> list[dict[str, Any]]:
        """The toxics in force on a proxy, as Toxiproxy reports them (name, type, stream, attributes, toxicity)."""
        return list(self._request("GET", f"/proxies/{_q(name)}/toxics"))

    def link(self, name: str) -> Link:
        """The shaping in force, read back from the toxics and given in the plan's units."""
        latency = jitter = 0
        bandwidth: int | None = None
        for t in self.toxics(name):
            attrs = t.get("attributes", {})
            if t["type"] == "latency":
                latency += int(attrs.get("latency", 0))
                jitter += int(attrs.get("jitter", 0))
            elif t["type"] == "bandwidth" and t["stream"] == "downstream":
                bandwidth = int(attrs["rate"]) * 8
        return Link(latency, jitter, bandwidth)

    def set_link(self, name: str, latency_ms: int = 0, jitter_ms: int = 0, bandwidth_kbps: int | None = None) -> None:
        """Make these the only toxics of the proxy; live connections take them at once (units: module docstring).

        Changed values are updated in place, so the link is never briefly unshaped. Latency comes before the
        bandwidth cap downstream: Toxiproxy then adds the two delays, as a real link does (the other way round
        the latency would be hidden inside the time the cap already waits)."""
        if latency_ms < 0 or jitter_ms < 0:
            raise ValueError("latency_ms and jitter_ms must not be negative")
        if jitter_ms > latency_ms:
            raise ValueError(f"jitter_ms ({jitter_ms}) must not exceed latency_ms ({latency_ms})")
        wanted: list[dict[str, Any]] = []
        halves = {"downstream": ((latency_ms + 1) // 2, (jitter_ms + 1) // 2),
                  "upstream": (latency_ms // 2, jitter_ms // 2)}
        for stream, (lat, jit) in halves.items():
            if lat or jit:
                wanted.append({"name": f"{_TOXIC_PREFIX}latency_{stream}", "type": "latency", "stream": stream,
                               "toxicity": 1.0, "attributes": {"latency": lat, "jitter": jit}})
        if bandwidth_kbps is not None:
            wanted.append({"name": f"{_TOXIC_PREFIX}bandwidth_downstream", "type": "bandwidth",
                           "stream": "downstream", "toxicity": 1.0,
                           "attributes": {"rate": kbps_to_rate(bandwidth_kbps)}})

        current = self.toxics(name)

        def chains(toxics: list[dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
            out: dict[str, list[tuple[str, str]]] = {"downstream": [], "upstream": []}
            for t in toxics:
                out[t["stream"]].append((t["name"], t["type"]))
            return out

        if chains(current) == chains(wanted):
            by_name = {t["name"]: t for t in current}
            for t in wanted:
                if by_name[t["name"]].get("attributes") != t["attributes"]:
                    self._request("PATCH", f"/proxies/{_q(name)}/toxics/{_q(t['name'])}",
                                  {"attributes": t["attributes"], "toxicity": 1.0})
            return
        for t in current:
            self._request("DELETE", f"/proxies/{_q(name)}/toxics/{_q(t['name'])}")
        for t in wanted:
            self._request("POST", f"/proxies/{_q(name)}/toxics", t)

    def remove_link(self, name: str) -> None:
        """Remove every toxic of the proxy: the link is the plain loopback again."""
        for t in self.toxics(name):
            self._request("DELETE", f"/proxies/{_q(name)}/toxics/{_q(t['name'])}")
