"""PostgreSQL probes against a throwaway PostgreSQL 15 server running a small pgbench.

The server is started here (not in conftest.py, which belongs to the whole suite): initdb into a temp dir
owned by ``postgres`` (PostgreSQL refuses to run as root), unix socket in that dir only, port number taken
by binding port 0. One pgbench run is sampled by all the probes at once; the tests check its figures.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from helpers import as_server_user
from pglab.errors import UserError
from pglab.probes import (
    CpuProbe,
    PgStatsProbe,
    Probe,
    ProbeContext,
    ReplicationProbe,
    Sample,
    Sampler,
    WaitEventsProbe,
    default_probes,
    now,
)
from pglab.probes._util import rows_in_window
from pglab.probes.pgstats import _query_for
from pglab.targets.local.postgres_bin import find_bindir

pytestmark = pytest.mark.postgres

BINDIR = find_bindir()
RUN_SECONDS = 7
RATE = 400  # tps; this 2-core machine does ~900 with 2 clients

@dataclass
class Server:
    base: Path
    port: int
    conninfo: str
    postmaster_pid: int

    def bin(self, name: str) -> str:
        return str(BINDIR / name)

    def client_args(self) -> list[str]:
        return ["-h", str(self.base), "-p", str(self.port), "-U", "postgres"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    base = Path(tempfile.mkdtemp(prefix="pglab-pg-", dir="/var/tmp"))
    data = base / "data"
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    port = _free_port()
    started = False
    try:
        subprocess.run(
            [
                str(BINDIR / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
            **as_server_user(),
        )
        opts = f"-p {port} -k {base} -c listen_addresses='' -c shared_buffers=64MB"
        subprocess.run(
            [str(BINDIR / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(base / "log"), "-w", "start"],
            check=True,
            capture_output=True,
            **as_server_user(),
        )
        started = True
        pid = int((data / "postmaster.pid").read_text().split()[0])
        yield Server(base, port, f"host={base} port={port} user=postgres dbname=postgres", pid)
    finally:
        if started:
            subprocess.run(
                [str(BINDIR / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                capture_output=True,
                **as_server_user(),
            )
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class Run:
    samples: list[Sample]
    probes: dict[str, object]
    start: float  # the whole second pgbench started at
    end: float  # when pgbench had exited
    tps: float
    processed: int
    errors: list[str]


def _next_second() -> float:
    t = now()
    time.sleep(int(t) + 1.0 - t)
    return float(int(now()))


@pytest.fixture(scope="module")
def run(server: Server) -> Run:
    subprocess.run(
        [server.bin("pgbench"), "-i", "-s", "1", "-q", *server.client_args(), "postgres"],
        check=True,
        capture_output=True,
    )
    client: list[int] = []
    ctx = ProbeContext(
        server.conninfo, server_pids=lambda: [server.postmaster_pid], client_pids=lambda: client, wait_hz=5.0
    )
    probes: list[Probe] = [PgStatsProbe(ctx), WaitEventsProbe(ctx), ReplicationProbe(ctx), CpuProbe(ctx)]
    sampler = Sampler(probes)
    sampler.start()
    try:
        start = _next_second()
        bench = subprocess.Popen(
            [
                server.bin("pgbench"),
                "-c",
                "2",
                "-j",
                "2",
                "-T",
                str(RUN_SECONDS),
                "-n",  # pgbench -i has vacuumed already: start at once
                "-R",
                str(RATE),  # a steady rate, so any whole seconds of the run have the same tps
                *server.client_args(),
                "postgres",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        client.append(bench.pid)
        time.sleep(RUN_SECONDS / 2)
        with psycopg.connect(server.conninfo, autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # a requested checkpoint inside the window
        out, _ = bench.communicate(timeout=RUN_SECONDS + 30)
        end = now()
        assert bench.returncode == 0, out
        time.sleep(max(0.0, int(end) + 2.2 - now()))  # two more ticks: stats flushed at disconnect
    finally:
        samples = sampler.stop()
    tps = float(re.search(r"tps = ([\d.]+)", out).group(1))  # type: ignore[union-attr]
    processed = int(re.search(r"actually processed: (\d+)", out).group(1))  # type: ignore[union-attr]
    return Run(samples, {p.name: p for p in probes}, start, end, tps, processed, list(sampler.errors))


def _mine(run: Run, name: str) -> list[Sample]:
    return [s for s in run.samples if s.source == name or s.source.startswith(name + ":")]


def _summary(run: Run, name: str, start: float, end: float) -> dict[str, float]:
    return run.probes[name].summarize(_mine(run, name), start, end)  # type: ignore[attr-defined]


def test_probes_ran_without_errors(run: Run) -> None:
    assert run.errors == []


@pytest.mark.quiet
def test_commit_rate_matches_pgbench_tps(run: Run) -> None:
    """Over whole seconds inside the run the commit rate is pgbench's tps.

    PostgreSQL publishes a backend's commit count about once a second, so the probe's view lags pgbench by
    up to a second; pgbench runs at a fixed rate so that this lag does not change the rate.
    """
    interior = _summary(run, "pg", run.start + 1, run.start + RUN_SECONDS - 1)
    print(f"pgbench tps {run.tps:.1f}, pg probe commits/s {interior['commits_s']:.1f}")
    assert run.tps == pytest.approx(RATE, rel=0.1)  # else the machine was too busy to hold the rate
    assert interior["commits_s"] == pytest.approx(run.tps, rel=0.10)


def test_all_commits_are_counted_over_the_run(run: Run) -> None:
    """Every pgbench transaction is counted once; the extra are the probes' own queries (about 7 a
    second: one per tick of the pg and repl probes, five of the waits probe) and pgbench's vacuum."""
    window = rows_in_window(_mine(run, "pg"), run.start - 1, run.end + 1.5, rate=True)
    counted = sum(r.get("d_commits") for r in window)
    seconds = sum(r.get("dt") for r in window)
    assert run.processed <= counted <= run.processed + 10 * seconds + 50, (run.processed, counted)


def test_wal_checkpoints_and_cache(run: Run) -> None:
    s = _summary(run, "pg", run.start, run.end)
    assert s["wal_mb_s"] > 0
    assert s["checkpoints_req"] >= 1
    assert s["buffers_checkpoint"] > 0
    assert 50 < s["cache_hit_pct"] <= 100  # scale 1 fits in shared_buffers
    assert s["rollbacks_s"] >= 0
    assert set(s) == {
        "commits_s",
        "rollbacks_s",
        "blks_read_s",
        "blks_hit_s",
        "cache_hit_pct",
        "wal_mb_s",
        "checkpoints_timed",
        "checkpoints_req",
        "buffers_checkpoint",
        "buffers_backend",
        "buffers_backend_fsync",
        "buffers_clean",
        "wal_records",
        "wal_fpi",
        "wal_bytes_per_commit",
        "wal_fpi_per_commit",
    }


def test_wait_events_see_the_active_backends(run: Run) -> None:
    s = _summary(run, "waits", run.start + 1, run.start + RUN_SECONDS - 1)
    assert 0 < s["active_backends_mean"] <= 2  # two pgbench clients, never the probes themselves
    shares = {k: v for k, v in s.items() if k.startswith("wait.")}
    assert shares
    assert sum(shares.values()) == pytest.approx(1.0)
    # samples came at ~5 Hz
    ticks = {x.ts for x in _mine(run, "waits") if x.metric == "_active" and run.start <= x.ts <= run.end}
    assert len(ticks) >= 4 * (run.end - run.start) - 2


def test_no_standby_means_no_lag_figures(run: Run) -> None:
    assert _mine(run, "repl") == []
    assert _summary(run, "repl", run.start, run.end) == {}


def test_server_and_client_cpu_during_pgbench(run: Run) -> None:
    s = _summary(run, "cpu", run.start + 1, run.start + RUN_SECONDS - 1)
    assert s["server_cpu_cores"] > 0.1  # backends are children of the postmaster
    assert s["client_cpu_cores"] > 0.01


def test_waits_leave_out_pglab_sessions(server: Server) -> None:
    """A session named pglab-… sleeping is not counted; an ordinary one sleeping is."""

    def sleeper(app: str) -> None:
        with psycopg.connect(server.conninfo, autocommit=True, application_name=app) as conn:
            conn.execute("SELECT pg_sleep(1.5)")

    threads = [threading.Thread(target=sleeper, args=(app,)) for app in ("pglab-witness", "app")]
    for t in threads:
        t.start()
    probe = WaitEventsProbe(ProbeContext(server.conninfo))
    probe.open()
    try:
        time.sleep(0.7)
        got = {s.metric: s.value for s in probe.sample(now())}
    finally:
        probe.close()
        for t in threads:
            t.join()
    assert got == {"Timeout:PgSleep": 1.0, "_active": 1.0}


def test_open_failure_names_probe_and_address_not_password() -> None:
    port = _free_port()  # nothing listens there
    ctx = ProbeContext(f"host=127.0.0.1 port={port} user=someone password=s3cret dbname=bench")
    for probe in (PgStatsProbe(ctx), ReplicationProbe(ctx), WaitEventsProbe(ctx)):
        with pytest.raises(UserError) as err:
            probe.open()
        msg = str(err.value)
        assert f"the {probe.name} probe" in msg
        assert f"host 127.0.0.1 port {port}" in msg
        assert "s3cret" not in msg


def test_checkpoint_counters_come_from_the_checkpointer_view_on_17() -> None:
    assert "pg_stat_bgwriter" in _query_for(150000)
    assert "pg_stat_checkpointer" in _query_for(170000)


def test_default_probes_cover_every_layer() -> None:
    probes = default_probes(ProbeContext("host=/nonexistent"))
    assert [p.name for p in probes] == ["disk", "cpu", "mem", "pg", "repl", "waits"]
    assert all(isinstance(p, Probe) for p in probes)
    assert next(p for p in probes if p.name == "waits").interval == pytest.approx(0.2)


def test_replication_probe_with_a_real_standby(server: Server) -> None:
    """A streaming standby made with pg_basebackup -R: one ``repl:<name>`` source with lags and distances."""
    standby = server.base / "standby"
    port = _free_port()
    started = False
    try:
        subprocess.run(
            [server.bin("pg_basebackup"), "-D", str(standby), *server.client_args(), "-R", "-X", "stream",
             "-c", "fast", "--no-sync"],
            check=True,
            capture_output=True,
            **as_server_user(),
        )  # fmt: skip
        opts = f"-p {port} -k {server.base} -c listen_addresses='' -c cluster_name=standby1"
        subprocess.run(
            [server.bin("pg_ctl"), "-D", str(standby), "-o", opts, "-l", str(server.base / "standby.log"),
             "-w", "start"],
            check=True,
            capture_output=True,
            **as_server_user(),
        )  # fmt: skip
        started = True
        probe = ReplicationProbe(ProbeContext(server.conninfo))
        probe.open()
        samples: list[Sample] = []
        t0 = now()
        with psycopg.connect(server.conninfo, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS repl_probe (x int)")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                conn.execute("INSERT INTO repl_probe SELECT generate_series(1, 1000)")
                got = probe.sample(now())
                samples.extend(got)
                if any(s.metric == "streaming" and s.value == 1.0 for s in got) and len(samples) > 20:
                    break
                time.sleep(0.2)
        probe.close()
        t1 = now()
        sources = {s.source for s in samples}
        assert sources == {"repl:standby1"}
        summary = probe.summarize(samples, t0, t1)
        assert {"replay_lsn_distance_max_bytes", "repl.standby1.replay_lsn_distance_max_bytes"} <= set(
            summary
        )
        assert summary["replay_lsn_distance_max_bytes"] >= 0
        # lags are known (measured, or 0 because caught up) while WAL flows
        assert summary.get("write_lag_max_ms", 0.0) >= 0.0
        assert "replay_lag_max_ms" in summary
        assert all(s.value in (0.0, 1.0) for s in samples if s.metric in ("streaming", "sync"))
    finally:
        if started:
            subprocess.run(
                [server.bin("pg_ctl"), "-D", str(standby), "-m", "immediate", "stop"],
                capture_output=True,
                **as_server_user(),
            )
        shutil.rmtree(standby, ignore_errors=True)
