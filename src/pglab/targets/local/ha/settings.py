"""PostgreSQL's parameters on the lab, through Patroni's dynamic configuration (``PATCH /config``), checked by
PostgreSQL first; the restarts they ask for, and the rolling restart after a CPU step, through Patroni's REST API;
a departed member's slot dropped at once."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from pglab.errors import LabError, UserError
from pglab.targets.local.ha.membership import Membership
from pglab.targets.local.pgconf import conf_value


class Settings:
    """The lab's part that changes settings and restarts nodes in order."""

    def __init__(self, lab: Membership):
        self.lab = lab

    def rolling_restart(self, timeout: float = 180) -> list[str]:
        """Restart every live node's postgres through Patroni (``POST /restart``): the replicas one by one, each
        back to streaming before the next, then the leader in place. In place, not a switchover first: the leader
        keeps its lock while Patroni restarts its postgres, writes pause for the restart and resume on the same
        node — CloudNativePG's default for the primary (``primaryUpdateMethod: restart``) and what the plain lab
        does, so a CPU step costs the same kind of outage on both. Returns the nodes in the order restarted."""
        deadline = time.monotonic() + timeout
        leader = self.lab.primary().name
        order = [n.name for n in self.lab.nodes if n.name not in self.lab.killed and n.name != leader] + [leader]
        for name in order:
            self.lab.log(f"restart {name} (rolling)")
            status, reply = self.lab._request(f"{self.lab._node(name).api_url}/restart", "POST", {},
                                          timeout=max(1.0, deadline - time.monotonic()))
            if status != 200:
                raise LabError(f"restart of {name} refused ({status}): {reply}")
            self.lab.wait_ready(max(1.0, deadline - time.monotonic()))
        return order

    def _postgres_c(self, name: str, value: Any) -> str:
        """The value as pg_settings.setting shows it, from PostgreSQL itself (``postgres -C`` on a scratch
        configuration, so it works before any node exists); an invalid name or value is the user's to fix."""
        assert self.lab.lab_dir is not None
        scratch = self.lab.lab_dir / "server" / "guc"
        if not (scratch / "postgresql.conf").exists():
            self.lab._mkdir_server(scratch)
            (scratch / "postgresql.conf").write_text("")
            self.lab._chown(scratch / "postgresql.conf")
        args = [str(self.lab.bindir / "postgres"), "-D", str(scratch), "-C", name,
                "-c", f"{name}={conf_value(value).strip(chr(39))}"]
        kwargs: dict[str, Any] = self.lab.server_user.popen_kwargs() if self.lab.server_user else {}
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30, env=self.lab._env(),
                              cwd=self.lab.lab_dir, check=False, **kwargs)
        if proc.returncode != 0:
            message = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no message)"]
            raise UserError(f"parameters.{name}: PostgreSQL rejects it ({message[0].replace('FATAL:  ', '')}); "
                            "fix the plan.")
        return str(proc.stdout).strip()

    def normalized(self, parameters: dict[str, Any]) -> dict[str, str]:
        return {k: self._postgres_c(k, v) for k, v in parameters.items()}

    def apply(self, parameters: dict[str, Any], timeout: float = 120) -> list[str]:
        """Put ``parameters`` in force on every node through Patroni's dynamic configuration (PATCH /config);
        parameters set before and absent now are removed. Restarts the nodes (replicas first) when PostgreSQL
        asks for it. Returns the nodes restarted."""
        if parameters == self.lab.parameters:
            return []
        want = self.normalized(parameters)
        patch: dict[str, Any] = {k: None for k in self.lab.parameters if k not in parameters}
        patch.update(parameters)
        leader = self.lab.primary().name
        status, reply = self.lab._request(f"{self.lab._node(leader).api_url}/config", "PATCH",
                                      {"postgresql": {"parameters": patch}})
        if status != 200:
            raise LabError(f"PATCH /config refused ({status}): {reply}")
        self.lab.parameters = dict(parameters)
        deadline = time.monotonic() + timeout
        live = [n.name for n in self.lab.nodes if n.name not in self.lab.killed]
        pending: set[str] = set()

        def settled() -> bool:
            pending.clear()
            for name in live:
                with self.lab.connect(name) as conn:
                    rows = conn.execute("SELECT name, setting, pending_restart FROM pg_settings WHERE name = ANY(%s)",
                                        [list(want)]).fetchall()
                for pname, setting, pend in rows:
                    if pend:
                        pending.add(name)
                    elif setting != want[pname]:
                        return False
            return True

        self.lab._wait(settled, deadline, "the new parameters to be read by every node")
        if not pending:
            return []
        order = sorted(pending, key=lambda n: n == leader)  # replicas first, the leader last
        for name in order:
            self.lab.log(f"restart {name} for parameters")
            status, reply = self.lab._request(f"{self.lab._node(name).api_url}/restart", "POST", {}, timeout=timeout)
            if status != 200:
                raise LabError(f"restart of {name} refused ({status}): {reply}")
        self.lab._wait(lambda: settled() and not pending, deadline, "the new parameters in force after restart")
        self.lab.wait_ready(max(1.0, deadline - time.monotonic()))
        return order

    def drop_member_slot(self, name: str, timeout: float = 20) -> None:
        """Patroni 4 keeps a departed member's slot on the leader for member_slots_ttl (30 min), holding WAL for
        it: set it to 0 until the leader drops the slot, then put the previous value back."""
        lab = self.lab
        leader = lab.primary().name
        url = f"{lab._node(leader).api_url}/config"
        status, config = lab._request(url)
        previous = config.get("member_slots_ttl") if status == 200 and isinstance(config, dict) else None
        status, reply = lab._request(url, "PATCH", {"member_slots_ttl": 0})
        if status != 200:
            raise LabError(f"PATCH /config refused ({status}): {reply}")
        try:
            def dropped() -> bool:
                with lab.connect(leader) as conn:
                    return conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                                        [name]).fetchone() is None

            lab._wait(dropped, time.monotonic() + timeout, f"the leader to drop the replication slot of {name}")
        finally:
            lab._request(url, "PATCH", {"member_slots_ttl": previous})
