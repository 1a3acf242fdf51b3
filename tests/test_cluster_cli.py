"""``pglab cluster …`` with the real things (etcd, Patroni, PostgreSQL), each command a separate pglab process.

Two labs serve the module: ``lab_a``, created by ``pglab cluster create`` (a 2-node lab that outlives pglab), and
``lab_b``, restored by ``pglab cluster restore`` from a backup of ``lab_a``. Each is made by the first test that
asks for it (again if a test destroyed it), so every test runs alone or in any order: status (1 leader, streaming
replica), switchover, backup and restore, scale 2 → 3 → 2, failover on the restored lab, destroy both with no
process mentioning either lab directory left. Its own registry (PGLAB_STATE_DIR) keeps it apart from other labs on
the host.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import pglab, processes_mentioning

pytestmark = [pytest.mark.postgres,
              pytest.mark.skipif(not Path("/usr/bin/etcd").exists(), reason="etcd-server not installed (./setup.sh)")]

PLAN = """name: cluster-cli
target:
  local:
    instances: 2
    synchronous: {method: any, number: 1}
    ha: patroni
postgres:
  parameters: {shared_buffers: 32MB}
"""
TAG = f"pglab-ct-{os.getpid()}"
STATE: dict[str, Any] = {}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("cluster-cli")
    e = {**os.environ, "PGLAB_STATE_DIR": str(work / "state")}
    (work / "plan.yaml").write_text(PLAN)
    STATE.update(work=work, env=e, plan=work / "plan.yaml", a=f"{TAG}-a", b=f"{TAG}-b")
    yield STATE
    for name in (STATE["a"], STATE["b"]):  # whatever a failed test left
        if (Path("/tmp") / name / "lab.json").exists():
            pglab("cluster", "destroy", name, env=e, timeout=120)


def run(*args: str, timeout: float = 300) -> str:
    proc = pglab(*args, env=STATE["env"], timeout=timeout, check=True)
    print(f"$ pglab {' '.join(args)}\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def status(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(run("cluster", "status", name, "--format", "json"))
    return data


def leader_of(data: dict[str, Any]) -> dict[str, Any]:
    leaders = [m for m in data["members"] if m["role"] == "leader"]
    assert len(leaders) == 1, data
    return leaders[0]


def connect(data: dict[str, Any]) -> psycopg.Connection[Any]:
    lab_dir = Path(data["dir"])
    return psycopg.connect(host=str(lab_dir / "sock"), port=leader_of(data)["port"], user="pglab", dbname="pglab",
                           passfile=str(lab_dir / "secrets" / "pgpass"), autocommit=True, connect_timeout=5)


def exists(name: str) -> bool:
    return (Path("/tmp") / name / "lab.json").exists()


@pytest.fixture
def lab_a(env: dict[str, Any]) -> str:
    """``pglab cluster create``'s lab (its output and how long it took in STATE['create']), made if not there."""
    if not exists(env["a"]):
        started = time.monotonic()
        text = run("cluster", "create", str(env["plan"]), "--name", env["a"])
        STATE["create"] = (text, time.monotonic() - started)
    return str(env["a"])


@pytest.fixture
def lab_b(env: dict[str, Any], lab_a: str) -> str:
    """The lab ``pglab cluster restore`` made from a backup of ``lab_a``, made if not there; STATE['restore'] holds
    what the test of backup and restore reads: the outputs, the rows of ``lab_a`` at the backup and after it, the
    rows read from the restored lab at once."""
    if not exists(env["b"]):
        data = status(lab_a)
        with connect(data) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS witness (id int PRIMARY KEY, note text)")
            conn.execute("INSERT INTO witness VALUES (1, 'before the backup') ON CONFLICT DO NOTHING")
            backed_up = conn.execute("SELECT id, note FROM witness ORDER BY id").fetchall()
        backup = env["work"] / "backup"
        shutil.rmtree(backup, ignore_errors=True)
        backup_text = run("cluster", "backup", lab_a, str(backup))
        backup_files = {p.name for p in backup.iterdir()}
        with connect(data) as conn:
            after = conn.execute("INSERT INTO witness VALUES ((SELECT max(id) + 1 FROM witness), 'after the backup') "
                                 "RETURNING id").fetchone()
        started = time.monotonic()
        restore_text = run("cluster", "restore", str(backup), str(env["plan"]), "--name", env["b"])
        print(f"restore: {time.monotonic() - started:.1f} s")
        with connect(status(env["b"])) as conn:
            restored = conn.execute("SELECT id, note FROM witness ORDER BY id").fetchall()
        STATE["restore"] = {"backup": backup_text, "files": backup_files, "backed_up": backed_up,
                            "after": after, "restore": restore_text, "restored": restored}
    return str(env["b"])


def assert_healthy(data: dict[str, Any], nodes: int) -> None:
    assert len(data["members"]) == nodes, data
    leader = leader_of(data)
    assert leader["state"] == "running"
    replicas = [m for m in data["members"] if m is not leader]
    assert all(m["state"] == "streaming" and m["lag"] is not None for m in replicas), data


def test_create_outlives_pglab_and_status_shows_leader_and_streaming_replica(env: dict[str, Any], lab_a: str) -> None:
    text, took = STATE["create"]
    print(f"create: {took:.1f} s")
    lab_dir = Path("/tmp") / env["a"]
    assert f"created {env['a']} in {lab_dir}" in text and "leader" in text and "streaming" in text
    run("lab", "clean")  # reaps orphaned labs: a cluster is kept, not an orphan, though its pglab exited
    data = status(env["a"])
    assert data["dir"] == str(lab_dir)
    assert_healthy(data, 2)
    assert sorted(m["name"] for m in data["members"]) == ["n0", "n1"]
    assert processes_mentioning(str(lab_dir))  # etcd, Patroni, postgres run on without any pglab
    table = run("cluster", "status", str(lab_dir))  # by directory too
    assert "leader" in table and "streaming" in table and "n1" in table


def test_switchover_moves_the_leader(env: dict[str, Any], lab_a: str) -> None:
    before = leader_of(status(env["a"]))["name"]
    target = "n1" if before == "n0" else "n0"
    bad = pglab("cluster", "switchover", env["a"], "--to", "n7", env=env["env"], timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"error: --to: no node 'n7' in {env['a']}; its nodes are n0, n1."], bad.stderr
    text = run("cluster", "switchover", env["a"], "--to", target)
    assert f"switchover {before} -> {target}" in text
    data = status(env["a"])
    assert leader_of(data)["name"] == target
    assert_healthy(data, 2)


def test_backup_then_restore_into_a_new_lab_holds_the_row(env: dict[str, Any], lab_a: str, lab_b: str) -> None:
    done = STATE["restore"]
    assert "MiB in" in done["backup"] and {"PG_VERSION", "backup_label"} <= done["files"]
    assert "as in the backup" in done["restore"]
    assert (1, "before the backup") in done["backed_up"]
    assert done["restored"] == done["backed_up"]  # what the backup held, not the row written after it
    assert done["after"] is not None and done["after"][0] not in [row[0] for row in done["restored"]]
    restored = status(lab_b)
    assert_healthy(restored, 2)
    with connect(restored) as conn:
        conn.execute("INSERT INTO witness VALUES (-1, 'written on the restored lab') ON CONFLICT DO NOTHING")
    with connect(status(lab_a)) as conn:  # the source lab is untouched by the restored one
        assert conn.execute("SELECT count(*) FROM witness WHERE id = -1").fetchone() == (0,)


def test_scale_up_then_down(env: dict[str, Any], lab_a: str) -> None:
    lab_dir = Path("/tmp") / env["a"]
    run("cluster", "scale", env["a"], "3")
    data = status(env["a"])
    assert_healthy(data, 3)
    assert (lab_dir / "n2" / "data").is_dir()
    with connect(data) as conn:  # a synchronous commit with the new replica among the standbys
        conn.execute("CREATE TABLE IF NOT EXISTS scaled (nodes int)")
        conn.execute("INSERT INTO scaled VALUES (3)")
    leader = leader_of(data)["name"]
    run("cluster", "scale", env["a"], "2")
    data = status(env["a"])
    assert_healthy(data, 2)
    assert leader_of(data)["name"] == leader  # a replica went, not the leader
    gone = ({"n0", "n1", "n2"} - {m["name"] for m in data["members"]}).pop()
    assert not (lab_dir / gone).exists()
    with connect(data) as conn:  # its slot would hold WAL on the leader
        slots = [r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()]
    assert gone not in slots and len(slots) == 1, slots
    assert not [p for p in processes_mentioning(str(lab_dir / gone)) if "patroni" in p or "postgres" in p]


def test_failover_elects_a_new_leader_and_the_old_one_rejoins(env: dict[str, Any], lab_b: str) -> None:
    with connect(status(lab_b)) as conn:
        (committed,) = conn.execute("INSERT INTO witness VALUES ((SELECT max(id) + 1 FROM witness), "
                                    "'before the failover') RETURNING id").fetchone() or (None,)
    before = leader_of(status(env["b"]))["name"]
    text = run("cluster", "failover", env["b"])
    assert f"failover {before} -> " in text and "rejoined as a replica" in text
    data = status(env["b"])
    assert_healthy(data, 2)
    assert leader_of(data)["name"] != before
    with connect(data) as conn:
        assert conn.execute("SELECT max(id) FROM witness").fetchone() == (committed,)  # the committed row kept


def test_destroy_leaves_no_process_and_no_file(env: dict[str, Any], lab_a: str, lab_b: str) -> None:
    for name in (env["a"], env["b"]):
        lab_dir = Path("/tmp") / name
        text = run("cluster", "destroy", name)
        assert f"destroyed {name}" in text
        assert not lab_dir.exists()
        deadline = time.monotonic() + 10
        while processes_mentioning(str(lab_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_mentioning(str(lab_dir)) == []
    assert env["a"] not in run("lab", "list") and env["b"] not in run("lab", "list")
    shutil.rmtree(env["work"] / "backup", ignore_errors=True)


@pytest.mark.parametrize("case", ["no-ha", "unknown-lab", "scale-1", "backup-not-empty", "not-a-backup"])
def test_bad_input_is_one_sentence_and_exit_2(case: str, tmp_path: Path) -> None:
    e = {**os.environ, "PGLAB_STATE_DIR": str(tmp_path / "state")}
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN if case != "no-ha" else PLAN.replace("    ha: patroni\n", ""))
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    args, expect = {
        "no-ha": (["cluster", "create", str(plan)], "target.local.ha"),
        "unknown-lab": (["cluster", "status", "no-such-lab"], "no HA lab named 'no-such-lab'"),
        "scale-1": (["cluster", "scale", "no-such-lab", "1"], "2 to 9"),
        "backup-not-empty": (["cluster", "backup", "no-such-lab", str(full)], "not an empty folder"),
        "not-a-backup": (["cluster", "restore", str(full), str(plan)], "holds no base backup"),
    }[case]
    proc = pglab(*args, env=e, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
