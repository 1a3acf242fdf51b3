"""The Patroni lab's nodes (``HANode``) and the daemons they run (``Proc``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pglab.targets.local import procs

Log = Callable[[str], None]
HOST = "127.0.0.1"


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
