"""What every part of the Patroni lab shares: its nodes (``HANode``), the daemons they run (``Proc``), and the lab's
state, declared once in ``HAParts`` (set by ``HALab.__init__``), with the few helpers every part uses."""

from __future__ import annotations

import abc
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pglab.plan.schema import LocalTarget
from pglab.targets.local import procs
from pglab.targets.local.lab_base import LabBase

Log = Callable[[str], None]
HOST = "127.0.0.1"
_PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


class Proc(Protocol):
    """A lab daemon: a Popen this process started, or an ``Adopted`` one started by an earlier pglab."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | Any: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class HANode:
    name: str
    data: Path
    wal: Path
    port: int
    rest_port: int
    config: Path
    log: Path  # Patroni's output
    pg_log: Path  # PostgreSQL's log (logging_collector)
    proc: Proc | None = None

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.rest_port}"

    def postmaster_pid(self) -> int | None:
        return procs.postmaster_pid(self.data)


class HAParts(LabBase[HANode]):
    """The root of the lab's parts (membership, processes, faults, settings): the state they read, and the helpers
    they all use. ``HALab`` composes the parts and sets this state."""

    spec: LocalTarget
    base_dir: Path
    timings: dict[str, int]
    killed: set[str]  # nodes whose Patroni was killed (not restarted)
    _rest_auth: str

    @property
    def name(self) -> str:
        assert self.lab_dir is not None
        return self.lab_dir.name

    @abc.abstractmethod
    def _write_state(self) -> None:
        """Record what runs where in lab.json (after every daemon started or stopped)."""

    def _env(self) -> dict[str, str]:
        assert self.lab_dir is not None
        drop = ("PG", "PATRONI_", "ETCD_", "ETCDCTL_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k.lower() not in _PROXY_VARS}
        env.update(LC_ALL="C", LANG="C", HOME=str(self.lab_dir), TMPDIR=str(self.lab_dir / "server"))
        return env

    def _node(self, name: str) -> HANode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def _tail(self, path: Path, lines: int = 3) -> str:
        try:
            text = path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " / ".join(text[-lines:])
