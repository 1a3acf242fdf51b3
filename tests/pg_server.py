"""A throwaway PostgreSQL for the tests of the WAL, buffer and statement figures (the local probe's and the
Kubernetes Jobs' reads), and the oracle they are checked against: pg_stat_wal, pg_stat_bgwriter and pg_stat_database
read by the test itself, once the counters stopped moving."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from helpers import as_server_user
from pglab.targets.local.postgres_bin import find_bindir

BINDIR = find_bindir()
EXACT = ("wal_records", "wal_fpi", "wal_bytes", "buffers_backend", "buffers_backend_fsync", "buffers_clean",
         "checkpoints_req", "buffers_checkpoint")
ORACLE = """
SELECT w.wal_records, w.wal_fpi, w.wal_bytes::float8, b.buffers_backend, b.buffers_backend_fsync, b.buffers_clean,
       b.checkpoints_req, b.buffers_checkpoint, d.xact_commit
FROM pg_stat_wal w, pg_stat_bgwriter b, pg_stat_database d WHERE d.datname = current_database()
"""


@dataclass
class Server:
    """A throwaway PostgreSQL of this machine's binaries, its socket in ``base``."""

    base: Path
    port: int
    conninfo: str

    def client_args(self) -> list[str]:
        return ["-h", str(self.base), "-p", str(self.port), "-U", "postgres"]

    def pgbench(self, *args: str) -> str:
        proc = subprocess.run([str(BINDIR / "pgbench"), *args, *self.client_args(), "postgres"], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout


def start_server(options: str) -> Iterator[Server]:
    """A server with pgbench's dataset at scale 1 (autovacuum off, minimal WAL, no timed checkpoint: the counters
    move only with what a test runs), stopped and removed afterwards; ``options``: more of postgres's ``-c``."""
    base = Path(tempfile.mkdtemp(prefix="pglab-why-", dir="/var/tmp"))
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data, started = base / "data", False
    try:
        subprocess.run([str(BINDIR / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"],
                       check=True, capture_output=True, **as_server_user())
        opts = (f"-p {port} -k {base} -c listen_addresses='' -c autovacuum=off -c wal_level=minimal "
                f"-c max_wal_senders=0 -c checkpoint_timeout=1h {options}")
        subprocess.run([str(BINDIR / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(base / "log"), "-w", "start"],
                       check=True, capture_output=True, **as_server_user())
        started = True
        server = Server(base, port, f"host={base} port={port} user=postgres dbname=postgres")
        server.pgbench("-i", "-s", "1", "-q")
        yield server
    finally:
        if started:
            subprocess.run([str(BINDIR / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True,
                           **as_server_user())
        shutil.rmtree(base, ignore_errors=True)


def read_counters(server: Server) -> dict[str, float]:
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        row = conn.execute(ORACLE).fetchone()
    assert row is not None
    return dict(zip((*EXACT, "commits"), map(float, row), strict=True))


def quiet(server: Server) -> dict[str, float]:
    """The oracle once the exact counters stopped moving (two reads half a second apart agree)."""
    last = read_counters(server)
    for _ in range(40):
        time.sleep(0.5)
        cur = read_counters(server)
        if all(cur[k] == last[k] for k in EXACT):
            return cur
        last = cur
    raise AssertionError(f"the server never went quiet: {last}")


def exact(o: dict[str, float]) -> dict[str, float]:
    return {k: o[k] for k in EXACT}


@contextmanager
def app_role(server: Server, *then: str) -> Iterator[None]:
    """CloudNativePG's application role on ``server`` for the duration: a login that may use the tables and
    nothing more (``then``: more statements run as the superuser once it exists); dropped afterwards."""
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS app")
        conn.execute("CREATE ROLE app LOGIN")
        conn.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO app")
        for statement in then:
            conn.execute(statement)
    yield
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        conn.execute("REVOKE ALL ON ALL TABLES IN SCHEMA public FROM app")
        conn.execute("DROP OWNED BY app")
        conn.execute("DROP ROLE app")
