"""A scenario's fault or operation, injected at its time during a measured run, with its events.

The runner keeps pgbench and the witness writer going; the injector only does the one thing the scenario names
(kill the primary, switch over, kill a standby and start it again, take a base backup) and records when each step
happened on the run's clock (epoch seconds), so that the report can split the run into before / during / after.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg

from pglab.plan.schema import Scenario
from pglab.targets.base import Endpoint

Event = tuple[float, str, str]


class FaultTarget(Protocol):
    """What a target offers scenarios (the local lab: standby-loss and backup; the Patroni lab: all)."""

    bindir: Path

    def follow_endpoint(self) -> Endpoint:
        """The primary, followed through failovers (several hosts, target_session_attrs=read-write)."""
        ...

    def fail_primary(self, kill: str) -> tuple[str, float]:
        """SIGKILL the primary's node or postgres; (node name, epoch time of the kill)."""
        ...

    def wait_new_primary(self, old: str, since: float) -> str:
        """Block until a leader other than ``old`` runs; its name."""
        ...

    def switchover(self) -> tuple[str, str]:
        """A planned switchover; (old, new)."""
        ...

    def kill_standby(self) -> str:
        """SIGKILL a synchronous standby's postgres; its name."""
        ...

    def start_instance(self, name: str) -> None: ...

    def scratch_dir(self) -> Path:
        """Where a base backup may be written (removed afterwards)."""
        ...


@dataclass
class Injection:
    """What happened: the events, the fault time (when the outage or operation began) and when it ended."""

    events: list[Event] = field(default_factory=list)
    fault_time: float | None = None
    recovered_time: float | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)
    error: str | None = None


class Injector(threading.Thread):
    """Runs the scenario at ``at`` (epoch seconds) in its own thread; ``stop()`` cuts a wait or a backup short."""

    def __init__(self, scenario: Scenario, target: FaultTarget, at: float, log: Any = lambda _m: None):
        super().__init__(daemon=True, name=f"scenario-{scenario.kind}")
        self.scenario = scenario
        self.target = target
        self.at = at
        self.log = log
        self.result = Injection()
        self._stopping = threading.Event()
        self._basebackup: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        self._stopping.set()
        if self._basebackup is not None and self._basebackup.poll() is None:
            os.killpg(self._basebackup.pid, signal.SIGTERM)

    def run(self) -> None:
        if self._stopping.wait(max(0.0, self.at - time.time())):
            return
        try:
            getattr(self, "_" + self.scenario.kind.replace("-", "_"))()
        except Exception as exc:  # reported with the run; the runner heals the lab afterwards
            self.result.error = f"{self.scenario.kind}: {str(exc).strip() or type(exc).__name__}"
            self.log(f"scenario {self.result.error}")

    def _event(self, kind: str, detail: str) -> float:
        t = time.time()
        self.result.events.append((t, kind, detail))
        return t

    # ------------------------------------------------------------------ the scenarios
    def _failover(self) -> None:
        kill = self.scenario.kill
        node, t = self.target.fail_primary(kill)
        self.result.fault_time = t
        what = "Patroni and postgres" if kill == "node" else "postgres"
        self.result.events.append((t, "fault", f"SIGKILL of {node}'s {what}"))
        new = self.target.wait_new_primary(node, since=t)
        self.result.recovered_time = self._wait_writable()
        self.result.metrics["leader_changed"] = 1.0 if new != node else 0.0
        self._event("primary-writable", f"{new} accepts writes {self.result.recovered_time - t:.1f} s after the kill")

    def _switchover(self) -> None:
        self.result.fault_time = self._event("fault", "switchover requested")
        old, new = self.target.switchover()
        back = self.result.recovered_time = self._wait_writable()
        self._event("primary-writable", f"{old} → {new}, writable {back - self.result.fault_time:.1f} s after the "
                    "request")

    def _standby_loss(self) -> None:
        name = self.target.kill_standby()
        self.result.fault_time = self._event("fault", f"SIGKILL of standby {name}'s postgres")
        if self._stopping.wait(self.scenario.down):
            return
        self.target.start_instance(name)
        self.result.recovered_time = self._event("standby-back", f"{name} started again after "
                                                 f"{self.scenario.down:g} s")

    def _backup(self) -> None:
        dest = self.target.scratch_dir() / f"backup-{os.getpid()}-{int(time.time() * 1000)}"
        ep = self.target.follow_endpoint()
        args = [str(self.target.bindir / "pg_basebackup"), "-D", str(dest), "-X", "stream", "-c", "fast",
                "--no-sync", "-d", ep.conninfo(application_name="pglab-backup")]
        if self.scenario.max_rate:
            args.append(f"--max-rate={self.scenario.max_rate}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        self.result.fault_time = self._event("backup-start", " ".join(a for a in args[1:] if "passfile" not in a))
        try:
            proc = self._basebackup = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                                                       stderr=subprocess.PIPE, start_new_session=True)
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"pg_basebackup exited with code {proc.returncode}: "
                                   f"{err.decode(errors='replace').strip().splitlines()[-1:]}")
            end = self._event("backup-end", "")
            # --max-rate throttles the data files, not the WAL streamed beside them (-X stream): counted apart
            files = [p for p in dest.rglob("*") if p.is_file()]
            wal = sum(p.stat().st_size for p in files if "pg_wal" in p.relative_to(dest).parts)
            size = sum(p.stat().st_size for p in files) - wal
            seconds = end - self.result.fault_time
            self.result.recovered_time = end
            self.result.metrics.update({"backup_s": seconds, "backup_mb": size / 2**20, "backup_wal_mb": wal / 2**20,
                                        "backup_mb_s": size / 2**20 / seconds if seconds > 0 else None})
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def _wait_writable(self, timeout: float = 120) -> float:
        """The first moment a new session through the following endpoint lands on a primary."""
        deadline = time.monotonic() + timeout
        conninfo = self.target.follow_endpoint().conninfo(connect_timeout=2, application_name="pglab-scenario")
        while time.monotonic() < deadline and not self._stopping.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    if conn.execute("SELECT NOT pg_is_in_recovery()").fetchone() == (True,):
                        return time.time()
            except psycopg.Error:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"no primary accepted a session within {timeout:.0f} s")
