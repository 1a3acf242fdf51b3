"""What a target gives the runner: endpoints to connect to, server processes to watch, paths to probe."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# Sessions pglab itself holds beside pgbench's clients during a run (control, the probes, a scenario's own): a
# superuser may use every slot of max_connections, so clients + these must fit in it (checked at preflight).
OWN_SESSIONS = 5

@dataclass(frozen=True)
class Endpoint:
    """One PostgreSQL server. Credentials are in ``passfile``; a password never appears in a conninfo."""

    name: str
    role: str  # "primary" | "standby"
    host: str  # unix socket directory or address; several, comma-separated, for a client that follows the primary
    port: int | str  # or "p1,p2,…" with several hosts
    user: str
    dbname: str
    passfile: Path
    sslmode: str | None = None
    options: str | None = None  # session settings ("-c name=value …"), e.g. on a server pglab must not reconfigure
    target_session_attrs: str | None = None  # "read-write" with several hosts: libpq picks the primary
    # the user's own libpq variables (PGPASSWORD, PGSSLROOTCERT …) that pglab's connections use, given to client
    # programs too: on a server pglab does not own, pgbench must authenticate as pglab did
    inherited_env: tuple[tuple[str, str], ...] = ()

    def conninfo(self, **extra: str | int) -> str:
        parts = {
            "host": self.host,
            "port": str(self.port),
            "user": self.user,
            "dbname": self.dbname,
            "passfile": str(self.passfile),
            "connect_timeout": "10",
            **({"sslmode": self.sslmode} if self.sslmode else {}),
            **({"options": self.options} if self.options else {}),
            **({"target_session_attrs": self.target_session_attrs} if self.target_session_attrs else {}),
            **{k: str(v) for k, v in extra.items()},
        }
        return " ".join(f"{k}={_quote(v)}" for k, v in parts.items())

    def env(self) -> dict[str, str]:
        """libpq environment for client programs (pgbench, psql)."""
        env = {
            **dict(self.inherited_env),
            "PGHOST": self.host,
            "PGPORT": str(self.port),
            "PGUSER": self.user,
            "PGDATABASE": self.dbname,
            "PGPASSFILE": str(self.passfile),
        }
        if self.sslmode:
            env["PGSSLMODE"] = self.sslmode
        if self.options:
            env["PGOPTIONS"] = self.options
        if self.target_session_attrs:
            env["PGTARGETSESSIONATTRS"] = self.target_session_attrs
        return env


@dataclass(frozen=True)
class PlanCodeUser:
    """Who runs the plan's code (pgbench, whose scripts may ``\\shell``) when pglab is root: the lab's unprivileged
    server user, never root, so a plan someone was sent cannot give its author a root shell. ``passfile`` holds
    the endpoint's credentials where that user can read them (the endpoint's own is root's)."""

    name: str
    uid: int
    gid: int
    passfile: Path


@dataclass(frozen=True)
class Endpoints:
    primary: Endpoint
    standbys: list[Endpoint] = field(default_factory=list)


class Unshaped:
    """The Target methods of a target pglab does not limit, shape or scale: no cgroups, no proxies, no CPU axis."""

    cpus_axis = False
    cpus: float | None = None

    def set_cpus(self, cpus: float | None) -> float | None:
        return None

    def take_events(self) -> list[tuple[float, str, str]]:
        return []

    def limits_in_force(self) -> dict[str, Any]:
        return {}

    def cpu_stats(self) -> dict[str, dict[str, float]]:
        return {}

    def io_stats(self) -> dict[str, dict[str, float]]:
        return {}

    def io_accounting(self) -> str | None:
        return "pglab does not run this target's servers, so it has no cgroup per instance to count its I/O"

    def client_procs_files(self) -> list[Path]:
        return []

    def plan_code_user(self) -> PlanCodeUser | None:
        return None  # no lab user: the plan's code runs as whoever runs pglab (docs/reliability.md)

    def links_in_force(self) -> dict[str, Any]:
        return {}

    def primary_name(self) -> str:
        return "n0"


class Topology(Protocol):
    """Servers pglab reaches as processes and connections, brought up once per sweep: what every such target
    (one lab, an external server, a fleet of tenants' labs) gives the driver."""

    bindir: Path

    def preflight(self) -> None:
        """Refuse, with one sentence, what the target cannot do; nothing may have been started yet."""

    def provision(self, parameters: dict[str, Any]) -> Endpoints:
        """Bring the topology up (once) and put ``parameters`` in force (reload, or restart when needed)."""

    def server_pids(self) -> list[int]:
        """Postmaster pids of every instance (probes add their children)."""

    def probe_paths(self) -> dict[str, Path]:
        """Directories whose block devices the disk probe samples, by label (``n0.data``, ``n0.wal`` …)."""

    def storage_paths(self) -> dict[str, tuple[Path, str]]:
        """Where the storage phase runs fio (``data``, ``wal``), with the plan field that names each."""

    def health(self) -> str | None:
        """None when every instance is up; otherwise what is wrong, in one sentence."""

    def describe(self) -> dict[str, Any]:
        """Topology facts stored with the results (instances, ports, paths, replication)."""

    def server_logs(self) -> dict[str, Path]:
        """Server logs by instance name, to keep as artifacts."""

    def teardown(self, keep: bool = False) -> None:
        """Stop everything this target started; remove its files unless ``keep``."""

    def take_events(self) -> list[tuple[float, str, str]]:
        """Target events since the last call (restarts, CPU steps), for the sweep's timeline."""

    def limits_in_force(self) -> dict[str, Any]:
        """Resource limits as the kernel reports them ({} when the target has none)."""


class Target(Topology, Protocol):
    """One primary and its standbys: the local lab, the Patroni lab, an external server."""

    @property
    def read_only(self) -> bool:
        """True when pglab may not write to the target (an existing server without consent to write)."""

    cpus_axis: bool
    cpus: float | None

    def set_cpus(self, cpus: float | None) -> float | None:
        """A step of the CPU scaling loop (new limits, rolling restart); its seconds, or None when unchanged."""

    def cpu_stats(self) -> dict[str, dict[str, float]]:
        """Per instance: CPU seconds used and CFS throttling counters, for deltas over a window."""

    def io_stats(self) -> dict[str, dict[str, float]]:
        """Per instance: I/Os and bytes its cgroup submitted so far (``read_ios``, ``write_bytes`` …), for deltas
        over a window; {} when there are no such groups."""

    def io_accounting(self) -> str | None:
        """None when each instance's I/O is counted on its own; otherwise why I/O figures are device-wide only."""

    def client_procs_files(self) -> list[Path]:
        """cgroup.procs files pgbench must enter before it runs (its own budget), or []."""

    def plan_code_user(self) -> PlanCodeUser | None:
        """The unprivileged user pgbench runs as when pglab is root, or None (pgbench runs as pglab's user)."""

    def links_in_force(self) -> dict[str, Any]:
        """Replication links as shaped now (latency, bandwidth per standby), or {} when not shaped."""

    def reset_dataset(self) -> dict[str, Any]:
        """Put every instance back to the dataset's snapshot (dataset.reset: snapshot); returns what it took."""
        ...

    def primary_name(self) -> str:
        """The instance that is primary now (its limits and cgroup figures are the run's ``primary_*``)."""
        ...
