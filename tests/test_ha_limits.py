"""Limits, the CPU axis and shaped replication links on the Patroni lab, with the real things: cgroups (v1 or v2),
Patroni, etcd, PostgreSQL and Toxiproxy.

One 2-node lab (quorum ANY 1) is driven through PatroniTarget, as the runner drives it (the CPU axis set before
provision), in file order: every node's Patroni, postmaster and backends are in the node's group with the plan's
limits; each replica streams through the leader's proxy while clients use the real ports, and a synchronous commit
pays the configured round trip (compared with 0 ms on the same lab); a postgres restarted by Patroni, a node
started again and a switchover keep all that; a CPU step restarts every node under the new quota; nothing is left.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from conftest import pglab, processes_mentioning
from helpers import identities, still_running
from pglab.errors import PlanError, UserError
from pglab.plan import parse_plan
from pglab.plan.schema import LocalTarget
from pglab.targets.local import procs
from pglab.targets.local.cluster import cgroup_name
from pglab.targets.local.ha import HALab
from pglab.targets.local.ha_target import PatroniTarget

pytestmark = [pytest.mark.postgres,
              pytest.mark.skipif(not Path("/usr/bin/etcd").exists(), reason="etcd-server not installed (./setup.sh)")]
RTT_MS = 20
SPEC = {"instances": 2, "synchronous": {"method": "any", "number": 1}, "ha": "patroni",
        "resources": {"cpus": 1, "memory": "1G"}, "client": {"cpus": 1}, "network": {"latency_ms": RTT_MS}}
SEEN_PIDS: dict[int, int | None] = {}  # every node's Patroni and postmaster seen (pid → start): checked gone at the end
SEEN_GROUPS: set[str] = set()  # and every node's cgroup folder


def _groups_of(pid: int) -> dict[str, str] | None:
    """The process's cgroup per controller ('' for the unified hierarchy); None once it has exited."""
    out = {}
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            out[name] = path
    return out


def _assert_in_own_groups(lab: HALab) -> None:
    """Every node's Patroni, postmaster and the postmaster's children are in that node's group, for every
    controller the group uses (cpu and memory here; the unified hierarchy on v2)."""
    assert lab.lab_dir is not None
    top = cgroup_name(lab.lab_dir)
    for node in lab.nodes:
        group = lab.limits.groups[node.name]
        controllers = [""] if group.version == 2 else ["cpu", "cpuacct", "memory"]
        pm = node.postmaster_pid()
        assert node.proc is not None and pm is not None
        children = procs.descendants(pm)
        assert len(children) >= 4, children  # checkpointer, bgwriter, startup or walwriter, walsender/receiver …
        for pid in [node.proc.pid, pm, *children]:
            where = _groups_of(pid)
            if where is None:  # a child (a backend, an autovacuum worker) that exited since it was listed
                assert pid not in (node.proc.pid, pm), (node.name, pid)
                continue
            for c in controllers:
                assert where[c].endswith(f"/{top}/{node.name}"), (node.name, pid, c, where[c])
        SEEN_PIDS.update(identities([node.proc.pid, pm]))
        SEEN_GROUPS.update(str(d) for d in group.dirs)


def _commit_ms(lab: HALab, n: int = 25) -> float:
    """Median time of a one-row synchronous commit (synchronous_commit = on, quorum ANY 1) on the leader; what the
    leader and Toxiproxy said about the link is printed, for a failure's reader."""
    with psycopg.connect(lab.conninfo_multi(), autocommit=True) as conn:
        assert conn.info.port == lab._node(lab.primary().name).port  # the real port: clients skip the proxies
        conn.execute("SET synchronous_commit = on")
        # right after a switchover Patroni names the synchronous standby a moment after the leader is up: until
        # then commits wait for no one, and there is no round trip to pay yet
        deadline = time.monotonic() + 60
        while not conn.execute("SELECT count(*) FROM pg_stat_replication "
                               "WHERE sync_state IN ('sync', 'quorum')").fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "no synchronous standby 60 s after the leader was ready"
            time.sleep(0.2)
        conn.execute("CREATE TABLE IF NOT EXISTS c (id serial PRIMARY KEY, at timestamptz DEFAULT now())")
        times = []
        for _ in range(n):
            started = time.perf_counter()
            conn.execute("INSERT INTO c DEFAULT VALUES")
            times.append(time.perf_counter() - started)
        names = conn.execute("SHOW synchronous_standby_names").fetchone()
        senders = conn.execute("SELECT application_name, client_port, state, sync_state "
                               "FROM pg_stat_replication").fetchall()
    assert lab.links.toxiproxy is not None
    print(f"commit ms {[round(t * 1000, 1) for t in times]}; synchronous_standby_names {names}; senders {senders}; "
          f"toxics {[(p, lab.links.toxiproxy.toxics(p)) for p in lab.links.ports]}")
    return statistics.median(times) * 1000


def _assert_replicas_stream_through_the_leaders_proxy(lab: HALab) -> None:
    leader = lab.primary().name
    for node in lab.nodes:
        if node.name == leader:
            continue
        with lab.connect(node.name) as conn:
            row = conn.execute("SELECT sender_port, status FROM pg_stat_wal_receiver").fetchone()
        assert row == (lab.links.ports[leader], "streaming"), (node.name, row, lab.links.ports)


@pytest.fixture(scope="module")
def target() -> Iterator[PatroniTarget]:
    t = PatroniTarget(LocalTarget.model_validate(SPEC), Path("/tmp"), log=lambda m: print(f"{time.strftime('%X')} {m}"))
    t.cpus_axis, t.cpus = True, 1.0  # what the runner does for matrix.cpus: [1, 0.5], before provision
    try:
        t.provision({})
        yield t
    finally:
        t.teardown()


def test_plan_accepts_limits_network_and_the_cpu_axis_with_ha_and_still_refuses_a_snapshot_reset() -> None:
    plan = ("name: x\ntarget: {local: {instances: 2, ha: patroni, resources: {cpus: 1}, client: {cpus: 1}, "
            "network: {latency_ms: 5}}}\nmatrix: {cpus: [1, 0.5]}\n")
    assert parse_plan(plan).matrix.cpus == [1, 0.5]
    with pytest.raises(PlanError) as info:
        parse_plan(plan + "dataset: {reset: snapshot}\n")
    assert len(info.value.problems) == 1 and "dataset.reset" in info.value.problems[0], info.value.problems


def test_pglab_cluster_refuses_what_only_pglab_run_applies(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: c\ntarget: {local: {instances: 2, ha: patroni, network: {latency_ms: 5}}}\n")
    proc = pglab("cluster", "create", str(plan), env={**os.environ, "PGLAB_STATE_DIR": str(tmp_path / "state")},
                 timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "target.local.network" in lines[0], proc.stderr


def test_every_node_runs_under_its_limits_in_its_own_group(target: PatroniTarget) -> None:
    lab = target
    limits = target.limits_in_force()
    assert limits["applied"] is True
    for name in ("n0", "n1"):
        assert limits[name]["cpus"] == 1.0 and limits[name]["memory_bytes"] == 1024**3, limits[name]
    assert limits["client"]["cpus"] == 1.0
    assert target.client_procs_files() == lab.limits.client.procs_files()  # type: ignore[union-attr]
    _assert_in_own_groups(lab)
    stats = target.cpu_stats()
    assert set(stats) == {"n0", "n1", "client"} and stats["n0"]["usage_s"] > 0  # Patroni's and postgres' CPU
    described = {n["name"]: n for n in target.describe()["nodes"]}
    assert described["n0"]["via_proxy_port"] == lab.links.ports["n0"] != described["n0"]["port"]


def test_replicas_stream_through_the_leaders_proxy_and_a_synchronous_commit_pays_the_round_trip(
        target: PatroniTarget) -> None:
    lab = target
    links = target.links_in_force()
    assert {name: link["latency_ms"] for name, link in links.items()} == {"n0": RTT_MS, "n1": RTT_MS}
    _assert_replicas_stream_through_the_leaders_proxy(lab)
    shaped = _commit_ms(lab)
    assert lab.links.toxiproxy is not None
    for name in lab.links.ports:
        lab.links.toxiproxy.set_link(name, 0)
    try:
        plain = _commit_ms(lab)
    finally:
        lab.links.shape()
    print(f"synchronous commit: {shaped:.1f} ms with +{RTT_MS} ms round trip, {plain:.1f} ms without")
    assert 0.8 * RTT_MS <= shaped - plain <= 2 * RTT_MS, (shaped, plain)


def test_restarted_postgres_restarted_node_and_new_leader_keep_groups_and_links(target: PatroniTarget) -> None:
    lab = target
    kill = lab.faults.kill_primary_postgres()  # Patroni restarts it in place: its new postmaster is Patroni's child
    lab.wait_ready(90)
    assert lab._node(kill.node).postmaster_pid() not in kill.pids
    replica = next(n.name for n in lab.nodes if n.name != lab.primary().name)
    lab.faults.kill_node(replica)  # Patroni and postgres dead; started again by pglab, as heal() does between runs
    assert target.heal() == [replica]
    assert [e[1] for e in target.take_events()] == ["repair"]
    _assert_in_own_groups(lab)
    old = lab.primary().name
    transition = lab.faults.switchover()
    lab.wait_ready(90)
    assert transition.old == old and lab.primary().name == transition.new
    assert target.primary_name() == transition.new  # the run's primary_* cgroup figures follow the leader
    _assert_replicas_stream_through_the_leaders_proxy(lab)  # now the other proxy: links follow the leader
    shaped = _commit_ms(lab)
    print(f"after switchover to {transition.new}: synchronous commit {shaped:.1f} ms")
    assert shaped >= 0.8 * RTT_MS
    _assert_in_own_groups(lab)


def test_a_cpu_step_restarts_every_node_under_the_new_quota(target: PatroniTarget) -> None:
    lab = target
    leader = lab.primary().name
    before = {n.name: n.postmaster_pid() for n in lab.nodes}
    assert target.set_cpus(1.0) is None  # no change, no restart
    seconds = target.set_cpus(0.5)
    assert seconds is not None and target.cpus == 0.5
    print(f"CPU step to 0.5: rolling restart took {seconds:.1f} s")
    after = {n.name: n.postmaster_pid() for n in lab.nodes}
    assert all(after[name] not in (None, before[name]) for name in before), (before, after)  # each restarted
    assert lab.primary().name == leader  # in place: no switchover
    limits = target.limits_in_force()
    assert limits["n0"]["cpus"] == limits["n1"]["cpus"] == 0.5
    events = target.take_events()
    assert [e[1] for e in events] == ["cpu-step"] and "cpus=0.5" in events[0][2]
    _assert_in_own_groups(lab)
    _assert_replicas_stream_through_the_leaders_proxy(lab)


def test_teardown_leaves_no_process_no_group_and_no_file(target: PatroniTarget) -> None:
    lab = target
    assert lab.lab_dir is not None and lab.links.toxiproxy is not None and lab.links.toxiproxy.proc is not None
    lab_dir, toxiproxy = lab.lab_dir, identities([lab.links.toxiproxy.proc.pid])
    with pytest.raises(UserError, match=r"target\.local\.resources"):  # its groups and proxies are this process's
        HALab.attach(lab_dir)
    _assert_in_own_groups(lab)  # the groups and processes of now (run alone, the only ones seen)
    SEEN_PIDS.update(identities(lab.pids().values()))
    target.teardown()
    assert not still_running({**SEEN_PIDS, **toxiproxy})
    assert processes_mentioning(str(lab_dir)) == []
    assert SEEN_GROUPS and not [g for g in SEEN_GROUPS if Path(g).exists()]
    assert not any(Path(g).parent.exists() for g in SEEN_GROUPS)  # pglab-<lab>-<digest> itself
    assert not lab_dir.exists()
