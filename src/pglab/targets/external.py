"""An existing PostgreSQL server that pglab does not own: it connects, measures, and never reconfigures it.

Safety is the point of this target. pglab writes to it (loads or resets the pgbench dataset, runs a workload
that writes) only when the plan says ``destructive: true`` *and* the command line says ``--allow-destructive``;
even then it refuses when the database holds tables other than pgbench's. Without both, the benchmark
sessions run with ``default_transaction_read_only = on``, so not even a custom script can write, and only a
dataset that is already there can be used. Per-point settings (``synchronous_commit``) are session options,
never server settings.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg

from pglab.errors import UserError, first_line
from pglab.plan.schema import ExternalTarget, Plan
from pglab.targets.base import OWN_SESSIONS, Endpoint, Endpoints, Unshaped
from pglab.targets.local import procs
from pglab.targets.local.postgres_bin import find_client_bindir
from pglab.workloads import pgbench

PGBENCH_TABLE_PATTERN = r"^pgbench_(accounts|branches|tellers|history)(_\d+)?$"


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(comm, ppid, start time in clock ticks since boot) of a process on this host, or None."""
    fields = procs.stat_fields(pid)
    return (procs.comm(pid), int(fields[1]), int(fields[19])) if len(fields) > 19 else None


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def local_postmaster(conninfo: str) -> int | None:
    """The pid of the server's postmaster when it runs on this host, else None.

    The backend serving our own connection is a child of the postmaster. Its pid is only trusted when the process
    of that pid here is a postgres whose start time matches the backend's (within 2 s): a server on another host,
    or in another pid namespace (a container), has pids that mean nothing here."""
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as c:
            row = c.execute("SELECT pid, extract(epoch FROM backend_start)::float8 FROM pg_stat_activity "
                            "WHERE pid = pg_backend_pid()").fetchone()
            backend = _proc_stat(int(row[0])) if row else None
    except psycopg.Error:
        return None
    if row is None or backend is None or backend[0] not in ("postgres", "postmaster"):
        return None
    if abs(_boot_time() + backend[2] / _CLK_TCK - float(row[1])) > 2.0:
        return None
    parent = _proc_stat(backend[1])
    return backend[1] if parent is not None and parent[0] in ("postgres", "postmaster") else None


def _default_passfile() -> Path:
    return Path(os.environ.get("PGPASSFILE") or Path.home() / ".pgpass")


# what the endpoint sets itself; every other PG* variable of the user's is libpq's (psycopg reads it too)
_SET_BY_PGLAB = {"PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSFILE", "PGSSLMODE", "PGOPTIONS",
                 "PGTARGETSESSIONATTRS", "PGAPPNAME", "PGCONNECT_TIMEOUT"}


def _libpq_env() -> tuple[tuple[str, str], ...]:
    """The user's libpq variables (PGPASSWORD, PGSSLROOTCERT, PGSERVICE …) that pglab's own connections use."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PG") and k not in _SET_BY_PGLAB
                        and not k.startswith("PGLAB_")))


class ExternalServer(Unshaped):  # a server pglab does not own is not limited or restarted by it
    """Implements the Target protocol for a server reached by a connection string."""

    def __init__(self, spec: ExternalTarget, plan: Plan, allow_destructive: bool):
        self.spec = spec
        self.plan = plan
        self.allow_destructive = allow_destructive
        self.bindir = find_client_bindir(spec.bindir)
        self.writes = spec.destructive and allow_destructive
        params = spec.parameters()
        self._endpoint = Endpoint("primary", "primary", params["host"], int(params.get("port", 5432)),
                                  params["user"], params["dbname"],
                                  Path(spec.passfile).expanduser() if spec.passfile else _default_passfile(),
                                  sslmode=params.get("sslmode"), inherited_env=_libpq_env())
        self.session: dict[str, Any] = {}
        self._postmaster: tuple[int, int] | None = None  # (pid, start time) once looked for; (0, 0): not here

    # ------------------------------------------------------------ safety, before anything starts
    def preflight(self) -> None:
        """Connect, then refuse what would write without the plan's and the command line's consent."""
        if self.spec.destructive and not self.allow_destructive:
            raise UserError("target.external.destructive is true: add --allow-destructive to the command to let "
                            f"pglab write to {self._where()}.")
        if self.allow_destructive and not self.spec.destructive:
            raise UserError("--allow-destructive: the plan does not say target.external.destructive: true; both "
                            "are needed before pglab writes to a server it does not own.")
        try:
            with psycopg.connect(self._endpoint.conninfo(application_name="pglab-control"), autocommit=True) as c:
                state = pgbench.dataset_state(c)
                others = [r[0] for r in c.execute(
                    "SELECT n.nspname || '.' || c.relname FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND n.nspname NOT IN ('pg_catalog', "
                    "'information_schema') AND n.nspname NOT LIKE 'pg\\_toast%%' AND n.nspname NOT LIKE 'pg\\_temp%%' "
                    "AND c.relname !~ %s ORDER BY 1", (PGBENCH_TABLE_PATTERN,))]
                slots = c.execute(
                    "SELECT current_setting('max_connections')::int - CASE WHEN r.rolsuper THEN 0 ELSE "
                    "current_setting('superuser_reserved_connections')::int END FROM pg_roles r "
                    "WHERE r.rolname = current_user").fetchone()
                checkpoint = c.execute(  # the vacuum reset ends with CHECKPOINT: superuser, or pg_checkpoint (15+)
                    "SELECT r.rolsuper OR CASE WHEN current_setting('server_version_num')::int >= 150000 "
                    "THEN pg_has_role(current_user, 'pg_checkpoint', 'MEMBER') ELSE false END "
                    "FROM pg_roles r WHERE r.rolname = current_user").fetchone()
        except psycopg.Error as exc:
            raise UserError(f"target.external.conninfo: cannot connect to {self._where()} ({first_line(exc)}); "
                            "check the connection string and the passfile.") from None
        self._check_connections(slots[0] if slots else None)
        if self.writes:
            if others:
                shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
                raise UserError(f"target.external: {self._where()} holds tables that are not pgbench's ({shown}); "
                                "pglab writes only to a database dedicated to the benchmark.")
            if self.plan.dataset.reset == "vacuum" and not (checkpoint and checkpoint[0]):
                raise UserError(f"dataset.reset: vacuum ends with CHECKPOINT, which user '{self._endpoint.user}' may "
                                f"not run on {self._where()}; GRANT pg_checkpoint TO {self._endpoint.user} (PostgreSQL "
                                "15+, else connect as a superuser), or set dataset.reset: reinit.")
            return
        wanted = {"scale": self.plan.dataset.scale, "partitions": self.plan.dataset.partitions or 0}
        if state != wanted:
            found = "no pgbench dataset" if state is None else f"a dataset of scale {state['scale']}"
            raise UserError(f"dataset: {self._where()} has {found}, the plan wants scale {wanted['scale']}; loading "
                            "it writes, so set target.external.destructive: true and add --allow-destructive, or "
                            "match dataset.scale to what is there.")
        writers = [w if isinstance(w, str) else w.name for w in self.plan.matrix.workload if w != "select-only"]
        if writers:
            raise UserError(f"matrix.workload: {', '.join(writers)} may write, and {self._where()} is read-only for "
                            "pglab; use select-only, or set target.external.destructive: true and add "
                            "--allow-destructive.")

    def _check_connections(self, slots: int | None) -> None:
        """Clients beyond what the server lets this role open would fail every run late, on a connection error."""
        most = max(self.plan.matrix.clients)
        if slots is not None and most + OWN_SESSIONS > slots:
            raise UserError(f"matrix.clients: {most} clients and pglab's own {OWN_SESSIONS} sessions need "
                            f"{most + OWN_SESSIONS} connections, and {self._where()} lets this user open "
                            f"{slots} (max_connections); lower the clients.")

    def _where(self) -> str:
        e = self._endpoint
        return f"database '{e.dbname}' on {e.host}:{e.port}"

    # ------------------------------------------------------------ the Target protocol
    @property
    def read_only(self) -> bool:
        return not self.writes

    def provision(self, parameters: dict[str, Any]) -> Endpoints:
        """Nothing to build, nothing reconfigured: per-point settings become the sessions' own options."""
        options = {k: v for k, v in parameters.items() if k == "synchronous_commit"}
        if self.read_only:
            options["default_transaction_read_only"] = "on"
        self.session = options
        return self.endpoints()

    def endpoints(self) -> Endpoints:
        options = " ".join(f"-c {k}={v}" for k, v in self.session.items())
        return Endpoints(replace(self._endpoint, options=options or None), [])

    def server_pids(self) -> list[int]:
        """The server's postmaster when it runs on this host, so its CPU is the servers' and not "outside the
        lab"; looked up once (again only if that process is gone: a restart). [] for a server elsewhere."""
        if self._postmaster is not None:
            pid, start = self._postmaster
            if not pid:
                return []
            now = _proc_stat(pid)
            if now is not None and now[2] == start:
                return [pid]
        found = local_postmaster(self._endpoint.conninfo(application_name="pglab-control"))
        st = _proc_stat(found) if found else None
        self._postmaster = (found, st[2]) if found and st else (0, 0)
        return [found] if found and st else []

    def probe_paths(self) -> dict[str, Path]:
        return {}

    def storage_paths(self) -> dict[str, tuple[Path, str]]:
        return {}

    def health(self) -> str | None:
        try:
            with psycopg.connect(self._endpoint.conninfo(application_name="pglab-control"), autocommit=True) as c:
                c.execute("SELECT 1")
        except psycopg.Error as exc:
            return f"{self._where()} does not answer ({first_line(exc)})"
        return None

    def describe(self) -> dict[str, Any]:
        e = self._endpoint
        return {"kind": "external", "host": e.host, "port": e.port, "dbname": e.dbname, "user": e.user,
                "writes_allowed": self.writes, "session_options": self.session}

    def server_logs(self) -> dict[str, Path]:
        return {}

    def teardown(self, keep: bool = False) -> None:
        """Nothing was started, so nothing is stopped."""

    def reset_dataset(self) -> dict[str, Any]:
        raise UserError("dataset.reset: 'snapshot' needs the local lab; an external server is never restored.")
