"""PostgreSQL's parameters on the lab, through Patroni's dynamic configuration (``PATCH /config``), checked by
PostgreSQL first; the restarts they ask for, and the rolling restart after a CPU step, through Patroni's REST API."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from pglab.errors import LabError, UserError
from pglab.targets.local.cluster import conf_value
from pglab.targets.local.ha.membership import Membership


class Settings(Membership):
    """The lab's part that changes settings and restarts nodes in order."""

    bindir: Path
    parameters: dict[str, Any]

    def _roll(self, timeout: float) -> None:
        self.rolling_restart(timeout)

    def rolling_restart(self, timeout: float = 180) -> list[str]:
        """Restart every live node's postgres through Patroni (``POST /restart``): the replicas one by one, each
        back to streaming before the next, then the leader in place. In place, not a switchover first: the leader
        keeps its lock while Patroni restarts its postgres, writes pause for the restart and resume on the same
        node — CloudNativePG's default for the primary (``primaryUpdateMethod: restart``) and what the plain lab
        does, so a CPU step costs the same kind of outage on both. Returns the nodes in the order restarted."""
        deadline = time.monotonic() + timeout
        leader = self.primary().name
        order = [n.name for n in self.nodes if n.name not in self.killed and n.name != leader] + [leader]
        for name in order:
            self.log(f"restart {name} (rolling)")
            status, reply = self._request(f"{self._node(name).api_url}/restart", "POST", {},
                                          timeout=max(1.0, deadline - time.monotonic()))
            if status != 200:
                raise LabError(f"restart of {name} refused ({status}): {reply}")
            self.wait_ready(max(1.0, deadline - time.monotonic()))
        return order

    def _postgres_c(self, name: str, value: Any) -> str:
        """The value as pg_settings.setting shows it, from PostgreSQL itself (``postgres -C`` on a scratch
        configuration, so it works before any node exists); an invalid name or value is the user's to fix."""
        assert self.lab_dir is not None
        scratch = self.lab_dir / "server" / "guc"
        if not (scratch / "postgresql.conf").exists():
            self._mkdir_server(scratch)
            (scratch / "postgresql.conf").write_text("")
            self._chown(scratch / "postgresql.conf")
        args = [str(self.bindir / "postgres"), "-D", str(scratch), "-C", name,
                "-c", f"{name}={conf_value(value).strip(chr(39))}"]
        kwargs: dict[str, Any] = self.server_user.popen_kwargs() if self.server_user else {}
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30, env=self._env(), cwd=self.lab_dir,
                              check=False, **kwargs)
        if proc.returncode != 0:
            message = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no message)"]
            raise UserError(f"parameters.{name}: PostgreSQL rejects it ({message[0].replace('FATAL:  ', '')}); "
                            "fix the plan.")
        return str(proc.stdout).strip()

    def _normalized(self, parameters: dict[str, Any]) -> dict[str, str]:
        return {k: self._postgres_c(k, v) for k, v in parameters.items()}

    def apply(self, parameters: dict[str, Any], timeout: float = 120) -> list[str]:
        """Put ``parameters`` in force on every node through Patroni's dynamic configuration (PATCH /config);
        parameters set before and absent now are removed. Restarts the nodes (replicas first) when PostgreSQL
        asks for it. Returns the nodes restarted."""
        if parameters == self.parameters:
            return []
        want = self._normalized(parameters)
        patch: dict[str, Any] = {k: None for k in self.parameters if k not in parameters}
        patch.update(parameters)
        leader = self.primary().name
        status, reply = self._request(f"{self._node(leader).api_url}/config", "PATCH",
                                      {"postgresql": {"parameters": patch}})
        if status != 200:
            raise LabError(f"PATCH /config refused ({status}): {reply}")
        self.parameters = dict(parameters)
        deadline = time.monotonic() + timeout
        live = [n.name for n in self.nodes if n.name not in self.killed]
        pending: set[str] = set()

        def settled() -> bool:
            pending.clear()
            for name in live:
                with self.connect(name) as conn:
                    rows = conn.execute("SELECT name, setting, pending_restart FROM pg_settings WHERE name = ANY(%s)",
                                        [list(want)]).fetchall()
                for pname, setting, pend in rows:
                    if pend:
                        pending.add(name)
                    elif setting != want[pname]:
                        return False
            return True

        self._wait(settled, deadline, "the new parameters to be read by every node")
        if not pending:
            return []
        order = sorted(pending, key=lambda n: n == leader)  # replicas first, the leader last
        for name in order:
            self.log(f"restart {name} for parameters")
            status, reply = self._request(f"{self._node(name).api_url}/restart", "POST", {}, timeout=timeout)
            if status != 200:
                raise LabError(f"restart of {name} refused ({status}): {reply}")
        self._wait(lambda: settled() and not pending, deadline, "the new parameters in force after restart")
        self.wait_ready(max(1.0, deadline - time.monotonic()))
        return order

