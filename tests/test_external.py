"""An external target: a real server this test starts (pglab does not own it). pglab measures it read-only
unless the plan says destructive and the command line says --allow-destructive, and even then refuses a
database holding tables that are not pgbench's."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import pglab, run_plan
from helpers import scalar
from pglab.plan.schema import Dataset, LocalTarget
from pglab.targets.external import local_postmaster
from pglab.targets.local.cluster import LocalLab
from pglab.workloads import pgbench

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def server() -> Iterator[dict[str, Any]]:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    lab = LocalLab(LocalTarget(instances=1, synchronous=None), base)
    try:
        ep = lab.provision({}).primary
        pgbench.initialise(lab.bindir, ep, Dataset(scale=1), base / "init")
        with psycopg.connect(ep.conninfo(), autocommit=True) as conn:
            conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
            conn.execute("INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 100) g")
        yield {"ep": ep, "conninfo": f"host={ep.host} port={ep.port} user={ep.user} dbname={ep.dbname}",
               "passfile": str(ep.passfile), "postmaster": lab.server_pids()[0]}
    finally:
        lab.teardown()
        shutil.rmtree(base, ignore_errors=True)


def _plan(tmp_path: Path, server: dict[str, Any], extra: str = "", workload: str = "select-only",
          scale: int = 1, sc: str = "[local]") -> Path:
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"""
name: external
target: {{external: {{conninfo: "{server['conninfo']}", passfile: {server['passfile']}{extra}}}}}
dataset: {{scale: {scale}}}
matrix: {{workload: [{workload}], clients: [2], synchronous_commit: {sc}}}
run: {{duration: 2s}}
""")
    return plan


def _writes(server: dict[str, Any]) -> tuple[int, int]:
    """Rows ever inserted, updated or deleted in user tables, and the customers' checksum."""
    with psycopg.connect(server["ep"].conninfo(), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        touched = scalar(conn, "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) "
                               "FROM pg_stat_user_tables")
        customers = scalar(conn, "SELECT sum(hashtext(name)) FROM customers") or 0
    return int(touched), int(customers)


def _refused(proc: Any, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr


def test_read_only_benchmark_writes_nothing(tmp_path: Path, server: dict[str, Any]) -> None:
    before = _writes(server)
    proc = pglab("run", str(_plan(tmp_path, server, sc="[off]")), "--results", str(tmp_path / "r"),
                 "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert rows[0]["tps"] > 0 and rows[0]["workload"] == "select-only"
    assert _writes(server) == before  # no row written, the foreign table untouched
    settings = json.loads(next((tmp_path / "r" / "runs").glob("*/settings.json")).read_text())
    assert settings["default_transaction_read_only"]["setting"] == "on"  # the sessions could not have written
    assert settings["synchronous_commit"]["setting"] == "off"  # the point's level, as a session option
    # the server runs on this host: found through our own backend, its CPU is the servers', not outside the lab
    metrics = json.loads(next((tmp_path / "r" / "runs").glob("*/run.json")).read_text())["metrics"]
    assert metrics["server_cpu_cores"] > 0, metrics
    assert "interference_cpu_cores" in metrics
    # no lab user to run the plan's scripts as: said, when pglab is root (docs/reliability.md, plans are code)
    assert ("this target has no lab user: pgbench and the plan's scripts" in proc.stderr) == (os.geteuid() == 0)


def test_the_postmaster_on_this_host_is_found_from_our_backend(server: dict[str, Any]) -> None:
    assert local_postmaster(server["ep"].conninfo()) == server["postmaster"]
    assert local_postmaster("host=/nonexistent dbname=x user=x connect_timeout=1") is None


def test_write_workload_or_missing_dataset_refused_without_consent(tmp_path: Path, server: dict[str, Any]) -> None:
    before = _writes(server)
    _refused(pglab("run", str(_plan(tmp_path, server, workload="tpcb-like")), "--results", str(tmp_path / "a")),
             "matrix.workload: tpcb-like may write", "--allow-destructive")
    _refused(pglab("run", str(_plan(tmp_path, server, scale=3)), "--results", str(tmp_path / "b")),
             "dataset:", "a dataset of scale 1, the plan wants scale 3")
    _refused(pglab("run", str(_plan(tmp_path, server, extra=", destructive: true")), "--results",
                   str(tmp_path / "c")), "target.external.destructive is true: add --allow-destructive")
    _refused(pglab("run", str(_plan(tmp_path, server)), "--results", str(tmp_path / "d"), "--allow-destructive"),
             "--allow-destructive: the plan does not say target.external.destructive: true")
    assert not any((tmp_path / d).exists() for d in "abcd")  # refused before anything was created
    assert _writes(server) == before


def test_more_clients_than_the_server_allows_are_refused_first(tmp_path: Path, server: dict[str, Any]) -> None:
    plan = _plan(tmp_path, server)
    plan.write_text(plan.read_text().replace("clients: [2]", "clients: [2, 5000]"))
    _refused(pglab("run", str(plan), "--results", str(tmp_path / "r")), "matrix.clients: 5000 clients",
             "lets this user open 100 (max_connections)")
    assert not (tmp_path / "r").exists()


def test_destructive_with_both_consents_still_refuses_foreign_tables(tmp_path: Path, server: dict[str, Any]) -> None:
    plan = _plan(tmp_path, server, extra=", destructive: true", workload="tpcb-like", scale=2)
    before = _writes(server)
    _refused(pglab("run", str(plan), "--results", str(tmp_path / "a"), "--allow-destructive"),
             "holds tables that are not pgbench's (public.customers)")
    assert _writes(server) == before
    with psycopg.connect(server["ep"].conninfo(), autocommit=True) as conn:
        conn.execute("DROP TABLE customers")  # now the database holds pgbench's tables only
    proc = run_plan(plan, tmp_path / "b", "--allow-destructive", "--format", "json").proc
    assert json.loads(proc.stdout)[0]["tps"] > 0
    with psycopg.connect(server["ep"].conninfo(), autocommit=True) as conn:
        assert scalar(conn, "SELECT count(*) FROM pgbench_branches") == 2  # loaded at the plan's scale
        assert scalar(conn, "SELECT count(*) FROM pgbench_history") > 0


def test_plan_rules_for_external_targets(tmp_path: Path, server: dict[str, Any]) -> None:
    plan = tmp_path / "p.yaml"
    for target, extra, expected in (
        (f'conninfo: "{server["conninfo"]} password=hunter2"', "", "target.external.conninfo: holds a password"),
        ('conninfo: "host=/tmp dbname=x"', "", "target.external.conninfo: needs user"),
        (f'conninfo: "{server["conninfo"]} options=-cwork_mem=1GB"', "", "'options' is not supported here"),
        (f'conninfo: "{server["conninfo"]}"', "postgres: {parameters: {work_mem: 4MB}}",
         "postgres.parameters: an external target is measured as it is"),
        (f'conninfo: "{server["conninfo"]}"', "storage: {runtime: 2s}", "storage: an external target"),
    ):
        plan.write_text(f"name: x\ntarget: {{external: {{{target}}}}}\n{extra}\n")
        proc = pglab("plan", "validate", str(plan))
        assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
        assert "hunter2" not in proc.stderr


def _scale(server: dict[str, Any]) -> int:
    """The scale of the dataset the module's earlier tests left on the server."""
    with psycopg.connect(server["ep"].conninfo(), autocommit=True) as conn:
        return int(scalar(conn, "SELECT count(*) FROM pgbench_branches"))


def _touched(server: dict[str, Any]) -> int:
    with psycopg.connect(server["ep"].conninfo(), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        return int(scalar(conn, "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) "
                                "FROM pg_stat_user_tables"))


def _role_with_password(server: dict[str, Any], name: str, password: str, grants: str) -> str:
    """A login role the server lets in by password over its socket; returns the plan's conninfo for it."""
    with psycopg.connect(server["ep"].conninfo(), autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {name}")
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        conn.execute(grants.format(role=name))
        hba = Path(scalar(conn, "SHOW hba_file"))
        if f" {name} " not in hba.read_text():
            hba.write_text(f"local all {name} scram-sha-256\n" + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")
    return server["conninfo"].replace(f"user={server['ep'].user}", f"user={name}")


def test_pgbench_authenticates_as_pglab_did_with_the_users_pgpassword(tmp_path: Path, server: dict[str, Any]) -> None:
    # the password only in PGPASSWORD: pglab's own connections used it, and pgbench (whose environment pglab builds)
    # must too, or every run fails late on "could not create connection"
    conninfo = _role_with_password(server, "bench_pw", "pw-only-in-env",
                                   "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    scale = _scale(server)
    empty = tmp_path / "empty.pgpass"
    empty.write_text("")
    empty.chmod(0o600)
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"""
name: pw
target: {{external: {{conninfo: "{conninfo}", passfile: {empty}}}}}
dataset: {{scale: {scale}}}
matrix: {{workload: [select-only], clients: [2]}}
run: {{duration: 2s}}
""")
    proc = pglab("run", str(plan), "--results", str(tmp_path / "r"), "--format", "json",
                 env={**os.environ, "PGPASSWORD": "pw-only-in-env"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["tps"] > 0


def test_a_destructive_sweep_without_checkpoint_rights_is_refused_first(tmp_path: Path,
                                                                        server: dict[str, Any]) -> None:
    with psycopg.connect(server["ep"].conninfo(), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS customers")  # pgbench's tables only: the last refusal before this one
    conninfo = _role_with_password(server, "bench_nockpt", "pw-nockpt",
                                   "GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
    scale = _scale(server)
    passfile = tmp_path / "pgpass"
    passfile.write_text("*:*:*:bench_nockpt:pw-nockpt\n")
    passfile.chmod(0o600)
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"""
name: nockpt
target: {{external: {{conninfo: "{conninfo}", passfile: {passfile}, destructive: true}}}}
dataset: {{scale: {scale}}}
matrix: {{workload: [tpcb-like], clients: [2]}}
run: {{duration: 2s}}
""")
    before = _touched(server)
    _refused(pglab("run", str(plan), "--results", str(tmp_path / "r"), "--allow-destructive"),
             "dataset.reset: vacuum ends with CHECKPOINT, which user 'bench_nockpt' may not run",
             "GRANT pg_checkpoint TO bench_nockpt")
    assert _touched(server) == before and not (tmp_path / "r").exists()
    with psycopg.connect(server["ep"].conninfo(), autocommit=True) as conn:
        conn.execute("GRANT pg_checkpoint TO bench_nockpt")
    run_plan(plan, tmp_path / "r", "--allow-destructive", "--format", "json")


def test_the_capacity_search_runs_on_an_external_server(tmp_path: Path, server: dict[str, Any]) -> None:
    """Issue 29 item 5: the search's probes are rate points like any other, so an external server (read-only here)
    gets them too: each probe's rate reached pgbench (-R, its schedule lag), one answer in the capacity event."""
    with psycopg.connect(server["ep"].conninfo(), autocommit=True) as conn:  # as the module's tests left it
        scale = int(scalar(conn, "SELECT count(*) FROM pgbench_branches") or 0)
    plan = _plan(tmp_path, server, scale=scale)
    plan.write_text(plan.read_text() + "capacity: {percentile: 99, target: 200ms, max_probes: 3}\n")
    ran = run_plan(plan, tmp_path / "r")
    closed, *probes = ran.runs()
    assert probes and all(r.status == "ok" for r in (closed, *probes)) and "rate" not in closed.axes
    assert probes[0].axes["rate"] == round(closed.metrics["tps"] or 0)  # the closed loop's pace first
    for r in probes:
        command = json.loads((tmp_path / "r" / r.dir / "run.json").read_text())["command"]
        assert command[command.index("-R") + 1] == f"{r.axes['rate']:g}", command
        assert r.metrics["schedule_lag_ms"] is not None and r.metrics["latency_p99_ms"] is not None
    (event,) = ran.events("capacity")  # the answer (or none within 3 rates) depends on this machine's load
    assert (event[2] or "").startswith("select-only sc=local c=2 j=2: p99 ≤ 200 ms: "), event
