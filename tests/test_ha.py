"""The HA lab with the real things: etcd, Patroni and PostgreSQL on this host.

One 3-node lab (quorum ANY 1) serves the tests in file order: it comes up, takes writes through the multi-host
string, switches over, survives a killed postmaster in place, fails over when the leader node dies without losing
a committed row, and leaves no process behind. A second, 1-node lab is left by a killed owner and cleaned.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from helpers import alive, identities, still_running
from pglab.errors import UserError
from pglab.plan.schema import LocalTarget
from pglab.targets.local import registry
from pglab.targets.local.cluster import cgroup_name
from pglab.targets.local.ha import HALab, check_timings, clean_ha_lab, is_ha_lab

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.postgres,
              pytest.mark.skipif(not Path("/usr/bin/etcd").exists(), reason="etcd-server not installed (./setup.sh)")]
SEEN_PIDS: dict[int, int | None] = {}  # every lab daemon seen running (pid → start), checked gone after teardown


def _remember(lab: HALab) -> None:
    SEEN_PIDS.update(identities(lab.pids().values()))


def _lab_processes(paths: list[Path]) -> list[str]:
    """Live processes whose command line, environment or working directory names one of ``paths``."""
    return [f"{p}: {Path(f'/proc/{p}/cmdline').read_bytes()[:200]!r}" for p in registry.processes_using(paths)
            if alive(p)]


def _cgroup_dirs(lab_dir: Path) -> set[Path]:
    """The cgroup directories (every controller) of the lab's running processes that belong to the lab's groups."""
    top = cgroup_name(lab_dir)
    found = set()
    for pid in registry.processes_using([lab_dir]):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                _, names, path = line.split(":", 2)
                if f"/{top}/" in path:
                    found.add(Path("/sys/fs/cgroup") / names / path.lstrip("/"))
    return found


@pytest.fixture(scope="module")
def lab() -> Iterator[HALab]:
    spec = LocalTarget.model_validate({"instances": 3, "synchronous": {"method": "any", "number": 1}})
    the_lab = HALab(spec, Path("/tmp"), log=lambda m: print(f"{time.strftime('%X')} {m}"))
    the_lab.start()
    print(f"3-node lab built in {the_lab.build_seconds:.1f} s")
    _remember(the_lab)
    yield the_lab
    the_lab.teardown()


def test_timings_follow_patronis_rules() -> None:
    check_timings({"ttl": 20, "loop_wait": 1, "retry_timeout": 6})
    with pytest.raises(UserError, match="ttl >= 20"):
        check_timings({"ttl": 10, "loop_wait": 1, "retry_timeout": 3})  # Patroni would silently make it 20
    with pytest.raises(UserError, match="loop_wait \\+ 2 \\* retry_timeout <= ttl"):
        check_timings({"ttl": 20, "loop_wait": 5, "retry_timeout": 8})


def test_three_nodes_one_leader_two_streaming_quorum_standbys(lab: HALab) -> None:
    members = lab.members()
    assert sorted(m.name for m in members) == ["n0", "n1", "n2"]
    leaders = [m for m in members if m.role == "leader"]
    assert len(leaders) == 1 and leaders[0].state == "running" and lab.primary().name == leaders[0].name
    replicas = [m for m in members if m.role != "leader"]
    assert [(m.role, m.state) for m in replicas] == [("quorum_standby", "streaming")] * 2
    assert all(m.lag is not None and 0 <= m.lag < 1024 * 1024 for m in replicas)  # bytes behind the leader
    with lab.connect(leaders[0].name) as conn:
        names = conn.execute("SHOW synchronous_standby_names").fetchone()
        rows = conn.execute("SELECT application_name, state, sync_state FROM pg_stat_replication "
                            "ORDER BY 1").fetchall()
        assert conn.execute("SHOW data_directory").fetchone() is not None
    others = sorted(m.name for m in replicas)
    assert names == (f"ANY 1 ({','.join(others)})",)
    assert rows == [(n, "streaming", "quorum") for n in others]
    t = lab.timings
    assert t["ttl"] >= 20 and t["loop_wait"] + 2 * t["retry_timeout"] <= t["ttl"]
    for node in lab.nodes:  # WAL in its own directory, as the plan's paths.wal would put it
        assert (node.data / "pg_wal").is_symlink() and (node.data / "pg_wal").resolve() == node.wal
    assert {"etcd", "patroni-n0", "n0"} <= set(lab.logs())  # etcd's, Patroni's and PostgreSQL's own logs


def test_write_through_the_multi_host_string_lands_on_the_primary(lab: HALab) -> None:
    with psycopg.connect(lab.conninfo_multi(), autocommit=True) as conn:
        assert conn.info.port == lab._node(lab.primary().name).port
        conn.execute("CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY, origin text)")
        conn.execute("INSERT INTO t VALUES (1, 'before switchover')")
    with psycopg.connect(lab.conninfo_multi(target_session_attrs="read-only"), autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)


def test_parameters_applied_through_patroni_and_invalid_ones_refused(lab: HALab) -> None:
    assert lab.settings.apply({"work_mem": "12MB"}) == []  # a reload is enough
    for node in lab.nodes:
        with lab.connect(node.name) as conn:
            assert conn.execute("SHOW work_mem").fetchone() == ("12MB",)
    with pytest.raises(UserError, match=r"parameters\.work_mem"):
        lab.settings.apply({"work_mem": "lots"})
    _remember(lab)


def test_switchover_moves_the_leader_and_clients_follow(lab: HALab) -> None:
    old = lab.primary().name
    conn = psycopg.connect(lab.conninfo_multi(), autocommit=True)
    assert conn.info.port == lab._node(old).port
    transition = lab.faults.switchover()
    print(f"switchover {transition.old} -> {transition.new} in {transition.seconds:.1f} s")
    assert transition.old == old and transition.new != old and lab.primary().name == transition.new
    with pytest.raises(psycopg.OperationalError):  # the old primary ended the session
        conn.execute("INSERT INTO t VALUES (2, 'old session')")
    conn.close()
    with psycopg.connect(lab.conninfo_multi(), autocommit=True) as conn:  # reconnecting finds the new primary
        assert conn.info.port == lab._node(transition.new).port
        conn.execute("INSERT INTO t VALUES (2, 'after switchover')")
    members = {m.name: m for m in lab.wait_ready(90)}
    assert members[old].role == "quorum_standby" and members[old].state == "streaming"  # the old leader follows
    _remember(lab)


def test_killed_postmaster_is_restarted_in_place_without_failover(lab: HALab) -> None:
    leader = lab.primary()
    timeline = leader.timeline
    kill = lab.faults.kill_primary_postgres()
    assert kill.node == leader.name
    deadline = time.monotonic() + lab.failover_budget
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(lab.conninfo_multi(connect_timeout=2), autocommit=True) as conn:
                conn.execute("INSERT INTO t VALUES (3, 'after postmaster kill')")
                port = conn.info.port
            break
        except psycopg.OperationalError:
            time.sleep(0.2)
    else:
        pytest.fail(f"no primary took writes within {lab.failover_budget} s after the postmaster was killed")
    print(f"postmaster kill: writes back after {time.monotonic() - kill.at:.1f} s")
    assert port == lab._node(leader.name).port  # the same node, Patroni restarted it in place
    members = {m.name: m for m in lab.wait_ready(90)}
    assert members[leader.name].role == "leader" and members[leader.name].timeline == timeline
    assert lab._node(leader.name).postmaster_pid() not in kill.pids
    _remember(lab)


def test_killed_leader_node_fails_over_within_the_budget_and_keeps_committed_rows(lab: HALab) -> None:
    old = lab.primary().name
    with psycopg.connect(lab.conninfo_multi(), autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        for i in range(100, 300):  # each commit acknowledged by a quorum standby
            conn.execute("INSERT INTO t VALUES (%s, 'acked before the kill')", [i])
        before_timeline = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
    _remember(lab)
    kill = lab.faults.kill_primary_node()
    assert kill.node == old
    assert [(p, Path(f"/proc/{p}/stat").read_text()[:60]) for p in kill.pids if alive(p)] == []
    transition = lab.faults.wait_new_primary(old, timeout=3 * lab.failover_budget, since=kill.at)
    print(f"failover {old} -> {transition.new} in {transition.seconds:.1f} s (budget {lab.failover_budget:.0f} s)")
    t = lab.timings
    # the leader lock had to expire (refreshed every loop_wait, it lives ttl), and the election fits the budget:
    # ttl + loop_wait + retry_timeout
    assert t["ttl"] - 2 * t["loop_wait"] <= transition.seconds < lab.failover_budget
    assert before_timeline is not None and transition.timeline == int(before_timeline[0][:8], 16) + 1
    with psycopg.connect(lab.conninfo_multi(), autocommit=True) as conn:
        assert conn.info.port == lab._node(transition.new).port
        assert conn.execute("SELECT count(*) FROM t WHERE id BETWEEN 100 AND 299").fetchone() == (200,)
        conn.execute("INSERT INTO t VALUES (4, 'after failover')")
    members = {m.name: m for m in lab.wait_ready(90)}
    survivor = ({"n0", "n1", "n2"} - {old, transition.new}).pop()
    assert members[transition.new].role == "leader"
    assert (members[survivor].role, members[survivor].state) == ("quorum_standby", "streaming")
    _remember(lab)
    lab.faults.start_node(old)  # the dead leader comes back as a replica of the new timeline (pg_rewind if needed)
    members = {m.name: m for m in lab.wait_ready(120)}
    assert (members[old].role, members[old].state, members[old].timeline) == (
        "quorum_standby", "streaming", transition.timeline)
    with lab.connect(old) as conn:
        assert conn.execute("SELECT count(*) FROM t WHERE id = 4").fetchone() == (1,)
    _remember(lab)


def test_teardown_leaves_no_process_and_no_file(lab: HALab) -> None:
    _remember(lab)
    assert lab.lab_dir is not None
    lab_dir = lab.lab_dir
    replica = next(n for n in lab.nodes if n.name != lab.primary().name)
    assert replica.proc is not None
    os.kill(replica.proc.pid, signal.SIGKILL)  # a Patroni dies alone: its postgres runs on, orphaned
    replica.proc.wait()
    assert replica.postmaster_pid() is not None
    lab.teardown()
    assert not still_running(SEEN_PIDS)
    assert _lab_processes([lab_dir]) == []
    assert not lab_dir.exists()
    assert all(e.lab_dir != lab_dir for e in registry.entries())


def test_lab_left_by_a_killed_owner_is_cleaned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGLAB_STATE_DIR", str(tmp_path / "state"))  # this test's registry only
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from pglab.plan.schema import LocalTarget\n"
        "from pglab.targets.local.ha import HALab\n"
        "spec = LocalTarget(instances=1, resources={'cpus': 1}, network={'latency_ms': 2})\n"
        "lab = HALab(spec, Path('/tmp'))\n"
        "lab.start()\n"
        "print(lab.lab_dir, flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO,
                             env={**os.environ, "PGLAB_STATE_DIR": str(tmp_path / "state")})
    assert owner.stdout is not None
    lab_dir = Path(owner.stdout.readline().strip())
    try:
        assert is_ha_lab(lab_dir)
        running = _lab_processes([lab_dir])
        assert len(running) >= 4, running  # etcd, toxiproxy, patroni, postgres and its children
        groups = _cgroup_dirs(lab_dir)
        assert groups and all(g.is_dir() for g in groups), groups  # the node's group, Patroni and postgres in it
        os.kill(owner.pid, signal.SIGKILL)  # pglab dies; its lab runs on
        owner.wait()
        (entry,) = [e for e in registry.entries() if e.lab_dir == lab_dir]
        assert not entry.owner_alive()
        stopped = clean_ha_lab(lab_dir)
        assert any("patroni" in s for s in stopped) and any("etcd" in s for s in stopped), stopped
        assert any("toxiproxy" in s for s in stopped), stopped
        assert _lab_processes([lab_dir]) == []
        assert not [g for g in groups if g.exists()] and not [g.parent for g in groups if g.parent.exists()]
        assert not lab_dir.exists() and registry.entries() == []
    finally:
        if owner.poll() is None:
            owner.kill()
        if lab_dir.is_dir():
            clean_ha_lab(lab_dir)
