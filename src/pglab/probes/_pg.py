"""Connections of the PostgreSQL probes: one autocommit connection each, short timeouts, clear errors."""

from __future__ import annotations

import contextlib

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pglab.errors import UserError, first_line

# Every probe connection carries this name so the wait-event probe can leave pglab's own sessions out.
APP_NAME = "pglab-probe"
CONNECT_TIMEOUT_S = 3
STATEMENT_TIMEOUT_MS = 2000


class ProbeOpenError(UserError):
    """A probe could not start (connection refused, path missing …): one sentence naming the probe."""


def describe_conninfo(conninfo: str) -> str:
    """``host H port P`` of a connection string — never the password or the rest of it."""
    try:
        params = conninfo_to_dict(conninfo)
    except Exception:
        return "an invalid connection string"
    host = params.get("host") or params.get("hostaddr") or "the default unix socket"
    port = params.get("port") or "5432"
    dbname = params.get("dbname")
    where = f"host {host} port {port}"
    return f"{where} database {dbname}" if dbname else where


def connect(conninfo: str, probe: str, *, connect_timeout: int = CONNECT_TIMEOUT_S) -> psycopg.Connection:
    """Open the probe's connection; errors name the probe and where it tried to connect."""
    try:
        conn = psycopg.connect(
            conninfo, autocommit=True, application_name=APP_NAME, connect_timeout=connect_timeout
        )
    except Exception as exc:
        raise ProbeOpenError(
            f"the {probe} probe cannot connect to PostgreSQL at {describe_conninfo(conninfo)}: "
            f"{first_line(exc)}; check that the server is running and the connection settings are right"
        ) from None
    try:
        # A probe must never hang the run or wait on the benchmark's locks.
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        conn.execute(f"SET lock_timeout = {STATEMENT_TIMEOUT_MS}")
    except Exception:
        conn.close()
        raise
    if conn.info.parameter_status("is_superuser") == "on":
        # pglab's own queries stay out of the run's statements (pg_stat_statements); only a superuser may say so,
        # and a server without the module takes it as a placeholder
        with contextlib.suppress(psycopg.Error):
            conn.execute("SET pg_stat_statements.track = 'none'")
    return conn


class PgConnection:
    """A probe's connection that reconnects once per tick after a failure (a failover, a restart)."""

    def __init__(self, conninfo: str, probe: str):
        self.conninfo = conninfo
        self.probe = probe
        self.conn: psycopg.Connection | None = None
        self.reconnected = False  # set when the last ``get`` had to reconnect: counters restart

    def open(self) -> psycopg.Connection:
        self.conn = connect(self.conninfo, self.probe)
        self.reconnected = False
        return self.conn

    def get(self) -> psycopg.Connection:
        """The live connection; a broken one is replaced (one quick attempt, the error is raised)."""
        self.reconnected = False
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.close()
            self.conn = connect(self.conninfo, self.probe, connect_timeout=2)
            self.reconnected = True
        return self.conn

    def fetchall(self, query: str) -> list[tuple]:
        conn = self.get()
        try:
            return conn.execute(query).fetchall()
        except psycopg.OperationalError:
            # Leave the broken connection to be replaced at the next tick.
            if conn.broken:
                self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None
