"""Why a run went as it did (issue 29): WAL records, full-page images, backend-written buffers and the statements
that took the time, checked against pg_stat_wal / pg_stat_bgwriter / pg_stat_statements read by the test itself over
the same window, on real PostgreSQL servers started here (one with pg_stat_statements loaded, one without).

Exactness: the counters compared exactly are read by the test right before and right after each of the probe's edge
reads, on a server kept quiet there (autovacuum off, wal_level minimal, a CHECKPOINT so that no dirty buffer is left
to the background writer); the two oracle reads around an edge being equal proves the probe's read between them saw
the same values. Commits are not quiet (the sessions publish theirs up to a second late), so the per-commit ratios
are compared to the oracle's within a few commits.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import pglab
from pg_server import BINDIR, EXACT, Server, app_role, exact, quiet, read_counters, start_server
from pglab import metrics
from pglab.probes import PgStatsProbe, ProbeContext, Sample, now
from pglab.probes.pgstats import _query_for
from pglab.probes.statements import StatementsWindow

pytestmark = pytest.mark.postgres

@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """Small shared buffers (1 MB for a 15 MB dataset), so the backends must write buffers themselves."""
    yield from start_server("-c shared_buffers=1MB -c shared_preload_libraries=pg_stat_statements")


@pytest.fixture(scope="module")
def plain() -> Iterator[Server]:
    """A server without pg_stat_statements."""
    yield from start_server("-c shared_buffers=16MB")


def test_wal_and_buffer_figures_match_pg_stat_wal_and_bgwriter_over_the_window(server: Server) -> None:
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        conn.execute("CHECKPOINT")  # nothing dirty left at the window's start: the background writer idles
    before = quiet(server)
    probe = PgStatsProbe(ProbeContext(server.conninfo))
    probe.open()  # the window's first read
    assert exact(read_counters(server)) == exact(before)  # … saw what the test saw
    samples: list[Sample] = []
    try:
        bench = subprocess.Popen([str(BINDIR / "pgbench"), "-n", "-c", "2", "-j", "2", "-T", "4", "-R", "300",
                                  *server.client_args(), "postgres"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        checkpointed = False
        while bench.poll() is None:
            time.sleep(1.0)
            samples += probe.sample(now())
            if not checkpointed:  # the pages' first changes after it log full pages
                with psycopg.connect(server.conninfo, autocommit=True) as conn:
                    conn.execute("CHECKPOINT")
                checkpointed = True
        out, _ = bench.communicate()
        assert bench.returncode == 0, out
        with psycopg.connect(server.conninfo, autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'"
                               ).fetchone() != (0,):  # their statistics are published as they exit
                time.sleep(0.1)
            conn.execute("CHECKPOINT")  # clean again: nothing left for the background writer after the window
        after = quiet(server)
        samples += probe.sample(now())  # the window's last read
        assert exact(read_counters(server)) == exact(after)
    finally:
        probe.close()
    s = probe.summarize(samples, 0.0, now() + 10)
    d = {k: after[k] - before[k] for k in (*EXACT, "commits")}
    print({k: s.get(k) for k in (*EXACT, "wal_bytes_per_commit", "wal_fpi_per_commit")}, d)
    for k in ("wal_records", "wal_fpi", "buffers_backend", "buffers_backend_fsync", "buffers_clean",
              "checkpoints_req", "buffers_checkpoint"):
        assert s[k] == d[k], k
    raw = [x for x in samples if x.metric == "d_wal_stat_bytes"]
    assert sum(x.value or 0.0 for x in raw) == d["wal_bytes"]
    # what the run is about: full pages after the checkpoint, backends writing for want of buffers
    assert d["wal_fpi"] > 0 and d["buffers_backend"] > 0 and d["checkpoints_req"] == 2
    commits = sum(x.value or 0.0 for x in samples if x.metric == "d_commits")
    assert commits == pytest.approx(d["commits"], abs=10)  # the sessions' own commits, published late
    assert s["wal_bytes_per_commit"] == pytest.approx(d["wal_bytes"] / d["commits"], rel=0.01)
    assert s["wal_fpi_per_commit"] == pytest.approx(d["wal_fpi"] / d["commits"], rel=0.01)


def test_the_new_figures_are_catalogued() -> None:
    for name in ("wal_records", "wal_fpi", "wal_bytes_per_commit", "wal_fpi_per_commit", "buffers_backend",
                 "buffers_backend_fsync", "buffers_clean"):
        assert metrics.get(name) is not None, name
    assert {"wal_bytes_per_commit", "wal_fpi_per_commit", "buffers_backend"} <= set(metrics.keys("runs"))


def test_queries_per_version() -> None:
    """pg_stat_wal from 14 (none before), buffers_backend from pg_stat_bgwriter to 16, pg_stat_io from 17."""
    assert "pg_stat_wal" not in _query_for(130000) and "NULL::bigint" in _query_for(130000)
    assert "pg_stat_wal" in _query_for(140000)
    assert "buffers_backend" in _query_for(160000) and "pg_stat_io" not in _query_for(160000)
    assert "pg_stat_io" in _query_for(170000) and "buffers_backend," not in _query_for(170000)


def test_a_server_without_pg_stat_wal_has_no_wal_figures() -> None:
    """Rows without the WAL counters (PostgreSQL 13) give the other figures and no made-up zero FPIs."""
    rows = [Sample(float(t), "pg", k, v) for t in (1, 2) for k, v in
            {"d_commits": 10.0, "d_rollbacks": 0.0, "d_blks_read": 1.0, "d_blks_hit": 9.0, "d_wal_bytes": 100.0,
             "checkpoints_timed": 0.0, "checkpoints_req": 0.0, "buffers_checkpoint": 0.0, "buffers_backend": 3.0,
             "buffers_backend_fsync": 0.0, "buffers_clean": 1.0, "dt": 1.0}.items()]
    s = PgStatsProbe(ProbeContext("")).summarize(rows, 0.0, 3.0)
    assert s["buffers_backend"] == 6.0 and s["commits_s"] == 10.0
    assert not {"wal_records", "wal_fpi", "wal_bytes_per_commit", "wal_fpi_per_commit"} & set(s)


def test_a_wal_flush_verdict_says_what_the_wal_was_made_of() -> None:
    from pglab.analysis.bottleneck import attribute

    waits: dict[str, float | None] = {"cpu_pct": 50.0, "wait.IO:WALSync": 0.6, "wait.CPU": 0.1}
    plain = {v.resource: v.evidence for v in attribute(waits, cores=2)}
    assert plain["wal-flush"] == "60 % of active backends waiting on WAL write/flush"  # no pg_stat_wal: as before
    why = {v.resource: v.evidence for v in attribute(
        {**waits, "wal_bytes_per_commit": 8123.0, "wal_fpi_per_commit": 0.9, "checkpoints_req": 1.0}, cores=2)}
    assert why["wal-flush"] == ("60 % of active backends waiting on WAL write/flush; 8,123 B of WAL and 0.90 "
                                "full-page images per commit with 1 checkpoint(s) in the window")


def _statements(conn: psycopg.Connection[Any]) -> dict[tuple[Any, ...], dict[str, float]]:
    rows = conn.execute(
        "SELECT userid::bigint, queryid, toplevel, calls, total_exec_time, rows, shared_blks_hit, shared_blks_read, "
        "shared_blks_dirtied, shared_blks_written, wal_bytes FROM pg_stat_statements "
        "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())").fetchall()
    names = ("calls", "total_exec_time", "rows", "shared_blks_hit", "shared_blks_read", "shared_blks_dirtied",
             "shared_blks_written", "wal_bytes")
    return {(r[0], r[1], r[2]): dict(zip(names, map(float, r[3:]), strict=True)) for r in rows}


def test_top_statements_match_pg_stat_statements_over_the_window(server: Server, tmp_path: Path) -> None:
    window = StatementsWindow(server.conninfo, create=True)
    window.open()  # the library is loaded: the extension is made
    assert window.available and window.errors == []
    with psycopg.connect(server.conninfo, autocommit=True) as oracle:
        oracle.execute("SET pg_stat_statements.track = 'none'")  # the test's own reads are not counted either
        before = _statements(oracle)
        window.start(now())
        out = server.pgbench("-n", "-c", "2", "-j", "2", "-t", "150")
        window.end(now())
        after = _statements(oracle)
    processed = int(re.search(r"actually processed: (\d+)", out).group(1))  # type: ignore[union-attr]
    assert processed == 300
    record = window.write(tmp_path)
    assert record is not None and window.errors == []
    doc = json.loads((tmp_path / "statements.json").read_text())
    got = {(s["userid"], s["queryid"], s["toplevel"]): s for s in doc["statements"]}
    zero = dict.fromkeys(after[next(iter(after))], 0.0)
    expected = {k: {f: a[f] - before.get(k, zero)[f] for f in a} for k, a in after.items()}
    expected = {k: v for k, v in expected.items() if v["calls"] > 0}
    assert set(got) == set(expected)  # every statement that ran, and only those (none of pglab's own)
    for k, e in expected.items():
        assert {f: float(got[k][f]) for f in e} == e, got[k]["query"]
    update = next(s for s in doc["statements"] if s["query"].startswith("UPDATE pgbench_accounts"))
    assert update["calls"] == processed and update["rows"] == processed and update["wal_bytes"] > 0
    times = [s["total_exec_time"] for s in doc["statements"]]
    assert times == sorted(times, reverse=True)
    assert sum(s["time_pct"] for s in doc["statements"]) == pytest.approx(100.0)
    assert record["count"] == len(doc["statements"]) and 0 < len(record["top"]) <= 5
    assert record["top"][0]["total_exec_time_ms"] == times[0]
    assert not any("pg_stat_statements" in s["query"] for s in doc["statements"])


def test_a_server_without_pg_stat_statements_has_no_artifact_and_no_error(plain: Server, tmp_path: Path) -> None:
    window = StatementsWindow(plain.conninfo, create=True)
    window.open()
    window.start(now())
    plain.pgbench("-n", "-c", "1", "-t", "20")
    window.end(now())
    assert window.write(tmp_path) is None
    assert not window.available and window.errors == []
    assert list(tmp_path.iterdir()) == []
    probe = PgStatsProbe(ProbeContext(plain.conninfo))  # the probes' own setting is harmless there
    probe.open()
    probe.close()


def test_an_external_servers_extension_is_used_not_made(server: Server) -> None:
    """Where pglab may not make it (an external server), a database without the extension has no statements; with
    it installed, they are read."""
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS other")
        conn.execute("CREATE DATABASE other")
    other = server.conninfo.replace("dbname=postgres", "dbname=other")
    window = StatementsWindow(other, create=False)
    window.open()
    assert not window.available and window.errors == []
    with psycopg.connect(other, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone() == (0,)
        conn.execute("CREATE EXTENSION pg_stat_statements")  # the server's owner installed it
    window = StatementsWindow(other, create=False)
    window.open()
    try:
        assert window.available and window.errors == []
    finally:
        window.close()


LAB_PLAN = """
name: why
target: {local: {instances: 1}}
postgres: {parameters: {shared_preload_libraries: pg_stat_statements}}
dataset: {scale: 1}
matrix: {workload: [tpcb-like], clients: [2]}
run: {duration: 3s, warmup: 2s}
"""


def test_a_lab_run_keeps_its_statements_and_csv_carries_the_figures(tmp_path: Path) -> None:
    """The local lab with pg_stat_statements asked for: statements.json beside run.json, its top in run.json, and
    the new figures in the report's CSV as the run stored them."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(LAB_PLAN)
    results = tmp_path / "r"
    pglab("run", str(plan), "--results", str(results), check=True)
    run_dir = next((results / "runs").iterdir())
    assert not (run_dir / "probe-errors.txt").exists()
    run = json.loads((run_dir / "run.json").read_text())
    doc = json.loads((run_dir / "statements.json").read_text())
    update = next(s for s in doc["statements"] if s["query"].startswith("UPDATE pgbench_accounts"))
    assert update["calls"] == run["metrics"]["transactions"]  # the measured pgbench's, not the warm-up's
    assert run["statements"]["top"][0]["query"] == doc["statements"][0]["query"][:120]
    m = run["metrics"]
    assert m["wal_records"] > 0 and m["wal_bytes_per_commit"] > 0 and "buffers_backend" in m
    proc = pglab("report", str(results), "--format", "csv", "--per-run", check=True)
    import csv
    import io

    row = next(csv.DictReader(io.StringIO(proc.stdout)))
    for key in ("wal_bytes_per_commit", "wal_fpi_per_commit", "buffers_backend"):
        assert float(row[key]) == pytest.approx(m[key]), key


K8S_PLAN = """
name: k8s-statements
target: {{kubernetes: {{namespace: bench, cluster_name: pg, instances: 1, resources: {{cpu: 1, memory: 1Gi}}}}}}
postgres: {{parameters: {{pg_stat_statements.max: '1000'}}}}
matrix: {{clients: [2]}}
run: {{{run}}}
"""


def _job_reads(server: Server, tmp_path: Path, run: str, pgbench_args: list[str]) -> tuple[Path, str]:
    """The Kubernetes run Job's reads around pgbench, as render puts them into its script, run by sh here against a
    real server as a role without superuser rights (CloudNativePG's application role); the folder it wrote and
    pgbench's output."""
    from pglab.plan.expand import expand
    from pglab.plan.load import parse_plan
    from pglab.targets.kubernetes.render import instance_parameters
    from pglab.targets.kubernetes.statements import reads

    plan = parse_plan(K8S_PLAN.format(run=run))
    point = expand(plan)[0]
    before, after = reads(plan, instance_parameters(plan, point), point)
    assert before and after
    bench = shlex.join([str(BINDIR / "pgbench"), *pgbench_args])
    script = (f"set -eu\ncd {tmp_path}\nrc=0\n{before}"
              f'if [ "$rc" = 0 ]; then {bench} > pgbench.out 2> pgbench.err || rc=$?; fi\n{after}exit $rc\n')
    env = {**os.environ, "PATH": f"{BINDIR}:{os.environ['PATH']}", "PGHOST": str(server.base),
           "PGPORT": str(server.port), "PGUSER": "app", "PGDATABASE": "postgres"}
    proc = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr + (tmp_path / "statements.err").read_text()
    return tmp_path, (tmp_path / "pgbench.out").read_text()


@pytest.fixture
def app(server: Server) -> Iterator[None]:
    """The application role of a CloudNativePG Cluster: may use the tables, sees its own statements' text only."""
    with app_role(server, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"):  # as CloudNativePG does
        yield


def test_the_kubernetes_jobs_reads_match_pg_stat_statements_over_the_window(server: Server, app: None,
                                                                            tmp_path: Path) -> None:
    """No warm-up: the Job reads right before and right after pgbench; statements.json is the application role's
    statements over that span, exactly as pg_stat_statements read by the test (a superuser) says, without the
    reads' own; the superuser's statements of the same window are not there."""
    from pglab.targets.kubernetes.statements import record

    with psycopg.connect(server.conninfo, autocommit=True) as oracle:
        oracle.execute("SET pg_stat_statements.track = 'none'")
        appid = oracle.execute("SELECT oid::bigint FROM pg_roles WHERE rolname = 'app'").fetchone()[0]  # type: ignore[index]
        before = _statements(oracle)
        oracle.execute("SET pg_stat_statements.track = 'top'")
        oracle.execute("SELECT count(*) FROM pgbench_branches")  # another role's statement: not the Job's to see
        oracle.execute("SET pg_stat_statements.track = 'none'")
        run_dir, out = _job_reads(server, tmp_path, "duration: 2s", ["-n", "-c", "2", "-j", "2", "-t", "100"])
        after = _statements(oracle)
    got = record(run_dir)["statements"]
    doc = json.loads((run_dir / "statements.json").read_text())
    assert got["count"] == len(doc["statements"]) and got["top"][0]["query"] == doc["statements"][0]["query"][:120]
    zero = dict.fromkeys(after[next(iter(after))], 0.0)
    expected = {k: {f: a[f] - before.get(k, zero)[f] for f in a} for k, a in after.items() if k[0] == appid}
    expected = {k: v for k, v in expected.items() if v["calls"] > 0}
    reads = {k for k in expected if "pglab-statements" in _query_text(server, k)}
    assert len(reads) == 2  # the reads' own two statements (the view, its evictions): left out
    assert {(s["userid"], s["queryid"], s["toplevel"]): s for s in doc["statements"]}.keys() == expected.keys() - reads
    for s in doc["statements"]:
        e = expected[(s["userid"], s["queryid"], s["toplevel"])]
        assert {f: float(s[f]) for f in e} == e, s["query"]
    processed = int(re.search(r"actually processed: (\d+)", out).group(1))  # type: ignore[union-attr]
    update = next(s for s in doc["statements"] if s["query"].startswith("UPDATE pgbench_accounts"))
    assert update["calls"] == processed == 200
    assert not any("pgbench_branches" in s["query"] and s["userid"] != appid for s in doc["statements"])
    assert doc["source"].startswith("pg_stat_statements 1.") and doc["evicted"] == 0


def test_the_kubernetes_jobs_first_read_waits_out_the_warm_up(server: Server, app: None, tmp_path: Path) -> None:
    """With a warm-up, pgbench runs warm-up and window in one process: the first read comes run.warmup seconds
    after pgbench started, so the warm-up's transactions are out of statements.json."""
    from pglab.targets.kubernetes.statements import START_FILE, record

    run_dir, out = _job_reads(server, tmp_path, "duration: 2s, warmup: 1s",
                              ["-n", "-c", "1", "-T", "3", "-R", "50"])
    started = (run_dir / "pgbench.err").stat().st_mtime  # created as the shell started pgbench (progress-free)
    record(run_dir)
    doc = json.loads((run_dir / "statements.json").read_text())
    processed = int(re.search(r"actually processed: (\d+)", out).group(1))  # type: ignore[union-attr]
    update = next(s for s in doc["statements"] if s["query"].startswith("UPDATE pgbench_accounts"))
    assert 0 < update["calls"] < processed  # the warm-up's updates were counted before the first read
    assert float((run_dir / START_FILE).read_text().split()[0]) >= started + 1.0


def _query_text(server: Server, key: tuple[Any, ...]) -> str:
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        conn.execute("SET pg_stat_statements.track = 'none'")
        row = conn.execute("SELECT query FROM pg_stat_statements WHERE userid = %s AND queryid = %s AND toplevel = %s",
                           key).fetchone()
    return str(row[0]) if row else ""
