"""A Kubernetes tenant's WAL, checkpoint and backend-write figures (issue 29 item 5): the reads its run Job takes at
its window's edges (``targets.kubernetes.pgstats``), their shell run here by sh against a real server as a role
without superuser rights (CloudNativePG's application role), checked against pg_stat_wal and pg_stat_bgwriter read
by the test itself over the same span. The sweep's handling of what the Job shipped is tests/test_k8s_tenants.py's;
the lab's is tests/test_kube_lab_clusters.py's."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from k8s_support import k8s_plan
from pg_server import BINDIR, Server, app_role, exact, quiet, start_server
from pglab.plan.load import parse_plan
from pglab.targets.kubernetes import pgstats
from pglab.targets.kubernetes.render import GRANT_CHECKPOINT, cluster
from pglab.targets.kubernetes.scripts import CHECKPOINT_REFUSED, reset_script, window_reads

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """Small shared buffers (1 MB for a 15 MB dataset), so the backends must write buffers themselves."""
    yield from start_server("-c shared_buffers=1MB")


@pytest.fixture
def app(server: Server) -> Iterator[None]:
    with app_role(server):
        yield


def test_the_tenants_job_reads_are_pg_stat_wal_and_bgwriter_over_its_window(server: Server, app: None,
                                                                            tmp_path: Path) -> None:
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        conn.execute("CHECKPOINT")  # nothing dirty at the start: the background writer idles
    before = quiet(server)
    bench = shlex.join([str(BINDIR / "pgbench"), "-n", "-c", "2", "-j", "2", "-t", "300"])
    start, end = window_reads([pgstats.read_part()], 0.0)
    script = (f"set -eu\ncd {tmp_path}\nrc=0\n{start}"
              f'if [ "$rc" = 0 ]; then {bench} > pgbench.out 2> pgbench.err || rc=$?; fi\n{end}exit $rc\n')
    env = {**os.environ, "PATH": f"{BINDIR}:{os.environ['PATH']}", "PGHOST": str(server.base),
           "PGPORT": str(server.port), "PGUSER": "app", "PGDATABASE": "postgres"}
    proc = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    err = tmp_path / pgstats.ERR_FILE
    assert proc.returncode == 0, proc.stdout + proc.stderr + (err.read_text() if err.is_file() else "")
    after = quiet(server)
    assert not err.is_file() or not err.read_text(), err.read_text()  # the role may read every view it asks
    got = pgstats.record(tmp_path)
    assert got is not None
    figures, info, d = got
    oracle = {k: after[k] - before[k] for k in (*exact(after), "commits")}
    print(figures, oracle)
    # the Job's reads bracket pgbench alone: every WAL record, full page and backend write of the span is pgbench's
    assert d["wal_records"] == oracle["wal_records"] and d["wal_fpi"] == oracle["wal_fpi"]
    assert d["wal_stat_bytes"] == oracle["wal_bytes"]
    for k in ("buffers_backend", "buffers_backend_fsync", "checkpoints_req", "buffers_checkpoint"):
        assert figures[k] == oracle[k], k
    assert oracle["wal_fpi"] > 0 and oracle["buffers_backend"] > 0  # the figures are about something
    # pgbench's 600 transactions, its set-up's and the reads' own (each psql one commit, read-only): as
    # pg_stat_database counts commits, so does the local probe (it adds one a second)
    assert 600 <= d["commits"] <= oracle["commits"]
    assert figures["wal_bytes_per_commit"] == oracle["wal_bytes"] / d["commits"]
    assert figures["wal_fpi_per_commit"] == oracle["wal_fpi"] / d["commits"]
    seconds = info["window"][1] - info["window"][0]
    assert figures["commits_s"] == pytest.approx(d["commits"] / seconds)
    assert info["deltas"] == d


def test_a_read_that_failed_gives_no_figure_and_one_that_cannot_be_parsed_is_said(tmp_path: Path) -> None:
    row = "|".join(["1700000000.5", *["1"] * len(pgstats.COUNTERS)])
    (tmp_path / pgstats.START_FILE).write_text(row + "\n")
    (tmp_path / pgstats.END_FILE).write_text("")  # psql could not connect: its words are in pgstats.err
    assert pgstats.record(tmp_path) is None and not (tmp_path / "probe-errors.txt").exists()
    (tmp_path / pgstats.END_FILE).write_text("1700000004.5|2|3\n")
    assert pgstats.record(tmp_path) is None
    assert (tmp_path / "probe-errors.txt").read_text().startswith("pgstats: unreadable: 3 fields, not 15")
    # counters that went back (statistics reset, or a new server behind -rw): no figure, said
    (tmp_path / pgstats.END_FILE).write_text("|".join(["1700000004.5", *["0"] * len(pgstats.COUNTERS)]) + "\n")
    assert pgstats.record(tmp_path) is None
    assert "counters went back" in (tmp_path / "probe-errors.txt").read_text().splitlines()[-1]


def test_the_clusters_post_init_grant_lets_the_app_role_end_its_reset_with_a_checkpoint(server: Server, app: None,
                                                                                       tmp_path: Path) -> None:
    """The reset a run's script runs as CloudNativePG's app role (``scripts.reset_script``) ends with a CHECKPOINT,
    refused without pg_checkpoint; the Cluster's post-init SQL (``render.GRANT_CHECKPOINT``, run as the superuser
    once the Cluster is made) grants it, and runs again without error (PostgreSQL 15+: this machine's server)."""
    plan = parse_plan(k8s_plan("matrix: {clients: [1], jobs: [1]}", "run: {duration: 4s}"))
    assert cluster(plan)["spec"]["bootstrap"]["initdb"]["postInitSQL"] == [GRANT_CHECKPOINT]
    env = {**os.environ, "PATH": f"{BINDIR}:{os.environ['PATH']}", "PGHOST": str(server.base),
           "PGPORT": str(server.port), "PGUSER": "app", "PGDATABASE": "postgres"}

    def reset() -> str:
        proc = subprocess.run(["/bin/sh", "-c", f"cd {tmp_path}\nrc=0\n{reset_script(plan)}exit $rc\n"],
                              env=env, capture_output=True, text=True, timeout=120)
        return (tmp_path / "reset.log").read_text() + proc.stdout + proc.stderr

    assert CHECKPOINT_REFUSED in reset()  # the app role alone may not
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        conn.execute(GRANT_CHECKPOINT)
        conn.execute(GRANT_CHECKPOINT)  # a second time changes nothing and fails nothing
    log = reset()
    assert CHECKPOINT_REFUSED not in log and log.count("CHECKPOINT") == 1, log
