"""What the plain lab's servers are told: pglab's role and database, each node's ``pglab.conf`` (the lab's base
settings plus the plan's parameters), and which parameters PostgreSQL accepts (``postgres -C``). Reloads and the
restarts they need are the lab's (cluster.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pglab.errors import LabError, UserError
from pglab.targets.local import procs
from pglab.targets.local.lab_base import LabBase

SUPERUSER = "pglab"
DBNAME = "pglab"


def conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int | float):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "''") + "'"  # postgresql.conf escapes both


@dataclass
class Node:
    name: str
    role: str
    data: Path
    wal: Path
    port: int
    log: Path

    def postmaster_pid(self) -> int | None:
        return procs.postmaster_pid(self.data)  # a killed postmaster may linger unreaped as a zombie: not counted


class Configuration:
    """The plain lab's part that writes each server's pglab.conf and asks PostgreSQL about parameters."""

    def __init__(self, lab: LabBase[Node]):
        self.lab = lab
        self.parameters: dict[str, Any] = {}  # in force (written into every pglab.conf)
        self.wanted: dict[str, Any] = {}  # the parameters of the first provision
        self.sync_enabled = False  # set once the standbys stream, or the build itself would wait on them
        self._accepted: set[str] = set()  # parameter sets postgres -C accepted (asked once each)

    def base(self, node: Node) -> dict[str, Any]:
        standby_names = ", ".join(n.name for n in self.lab.nodes[1:])
        sync = self.lab.spec.synchronous
        conf: dict[str, Any] = {
            "listen_addresses": "127.0.0.1",
            "port": node.port,
            "unix_socket_directories": str(self.lab.sock_dir),
            "wal_level": "replica",
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "hot_standby": True,
            "cluster_name": node.name,
            "log_checkpoints": True,
            "log_timezone": "UTC",  # the runner reads checkpoint times from the log
        }
        if sync is not None and standby_names and self.sync_enabled:
            conf["synchronous_standby_names"] = f"{sync.method.upper()} {sync.number} ({standby_names})"
        return conf

    def write(self, node: Node) -> None:
        conf = {**self.base(node), **self.parameters}
        path = node.data / "pglab.conf"
        path.write_text("# written by pglab for every run; do not edit\n"
                        + "".join(f"{k} = {conf_value(v)}\n" for k, v in conf.items()))
        self.lab._chown(path)

    def validate(self, parameters: dict[str, Any]) -> None:
        """Ask PostgreSQL itself (postgres -C) whether names and values are valid, before writing them; a set it
        accepted once is not asked again (an interleaved sweep comes back to the same sets run after run)."""
        if not parameters:
            return
        key = repr(sorted((str(k), conf_value(v)) for k, v in parameters.items()))
        if key in self._accepted:
            return
        args = [str(self.lab.bindir / "postgres"), "-D", str(self.lab.nodes[0].data), "-C", next(iter(parameters))]
        for name, value in parameters.items():
            args += ["-c", f"{name}={conf_value(value).strip(chr(39))}"]
        try:
            self.lab._run(args, timeout=30)
        except LabError as exc:
            message = str(exc).removeprefix("postgres failed: ").replace("FATAL:  ", "")
            message = re.sub(r"^\S+ \S+ \S+ \[\d+\] ", "", message)
            rejected = next((n for n in parameters if f'"{n}"' in message), None)
            field = f"parameters.{rejected}" if rejected else "parameters"
            raise UserError(f"{field}: PostgreSQL rejects it ({message}); fix the plan.") from None
        self._accepted.add(key)

    def use_wanted(self) -> None:
        """The first provision's parameters, checked, in force from the next start (after a load or a restore)."""
        self.validate(self.wanted)
        self.parameters = dict(self.wanted)
