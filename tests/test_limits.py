"""Resource limits through cgroups: applied to each instance and to pgbench, read back and stored with every
run; the CPU scaling loop restarts the cluster between steps and the quota shows in the figures."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import pglab, processes_mentioning, run_plan
from helpers import stored_events, stored_runs, sweep_row
from pglab.targets.local import procs
from pglab.targets.local.cluster import cgroup_name

pytestmark = pytest.mark.postgres


def _cgroup_of(pid: int, controller: str) -> str | None:
    """The process's group for the controller; None once it has exited."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    return ""


@pytest.mark.quiet
def test_limits_applied_read_back_and_the_cpu_scaling_loop() -> None:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    os.chmod(base, 0o711)
    plan = base / "plan.yaml"
    plan.write_text("""
name: limits
target:
  local:
    instances: 2
    synchronous: {number: 1}
    resources: {memory: 1GiB, write_iops: 5000, read_mbps: 500}
    client: {cpus: 1.5}
dataset: {scale: 1}
matrix: {workload: [select-only], clients: [4], cpus: [0.25, 1]}
run: {duration: 3s, repeats: 1}
""")
    results = base / "r"
    lab: Path | None = None
    limits: dict[float, dict] = {}
    try:
        proc = run_plan(plan, results, "--keep", "--format", "json").proc
        target = sweep_row(results)["target"]
        lab = Path(target["lab_dir"])
        rows = {row["cpus"]: row for row in json.loads(proc.stdout)}
        # the quota is what bounds select-only: a quarter core gives far less than a full one
        assert rows[0.25]["tps"] < 0.5 * rows[1.0]["tps"], rows
        assert rows[0.25]["bottleneck"].startswith("cpu (primary"), rows[0.25]["bottleneck"]
        assert "quota" in rows[0.25]["bottleneck"]
        # the limits in force, as the kernel reports them, are stored with each run
        limits.update({json.loads(p.read_text())["n0"]["cpus"]: json.loads(p.read_text())
                       for p in (results / "runs").glob("*/limits.json")})
        assert sorted(limits) == [0.25, 1.0]
        for lim in limits.values():
            assert lim["applied"] is True and lim["n1"]["cpus"] == lim["n0"]["cpus"]
            assert lim["n0"]["memory_bytes"] == 1024**3
            assert lim["client"]["cpus"] == 1.5
            io = json.dumps(lim["n0"].get("io_max"))
            assert "5000" in io and str(500 * 1024 * 1024) in io
        (metrics,) = [r.metrics for r in stored_runs(results) if r.axes["cpus"] == 0.25]
        cores, throttled = metrics["primary_cpu_cores"], metrics["cpu_throttled_pct"]
        assert metrics["limit_cpus"] == 0.25 and metrics["limits_applied"] == 1.0
        assert cores is not None and cores <= 0.25 * 1.15  # the primary never used more than its quota
        assert throttled is not None and throttled > 20
        # one rolling restart between the two steps, recorded on the sweep's timeline
        steps = [detail or "" for _ts, _kind, detail, _run, _scope in stored_events(results, "cpu-step")]
        assert len(steps) == 1 and steps[0].startswith("cpus=1: rolling restart took"), steps
        # every server process and pgbench ran inside their groups
        state = json.loads((lab / "lab.json").read_text())
        for node in state["nodes"]:
            pid = int((Path(node["data"]) / "postmaster.pid").read_text().split()[0])
            assert (_cgroup_of(pid, "cpu") or "").endswith(f"{cgroup_name(lab)}/{node['name']}")
            for child in procs.descendants(pid):
                group = _cgroup_of(child, "cpu")  # None: a child (autovacuum worker) that exited since it was listed
                assert group is None or group.endswith(f"{cgroup_name(lab)}/{node['name']}")
        client = Path(limits[1.0]["client"]["path"])
        usage = client / ("cpuacct.usage" if (client / "cpuacct.usage").exists() else "cpu.stat")
        assert usage.exists() and any(int(x) > 0 for x in usage.read_text().split() if x.isdigit())
    finally:
        if lab is not None:
            pglab("lab", "clean", str(lab))
            assert processes_mentioning(str(lab)) == []
            groups = [g["path"] for lim in limits.values() for g in (lim["n0"], lim["client"])]
            assert groups and not any(Path(p).exists() for p in groups)  # the cgroups went with the lab
        shutil.rmtree(base, ignore_errors=True)


def test_limits_that_cannot_be_applied(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    bad_cpu = (os.cpu_count() or 1) + 60  # no such CPU: the kernel refuses the cpuset
    text = ("name: limits\ntarget: {local: {instances: 1, synchronous: null, client: {cpuset: '%d'}%s}}\n"
            "dataset: {scale: 1}\nrun: {transactions: 50}\n")
    plan.write_text(text % (bad_cpu, ""))
    strict = pglab("run", str(plan), "--results", str(tmp_path / "a"))
    # refused at preflight, from the host's CPU list, before the lab or the results folder exists
    assert strict.returncode == 2 and f"target.local.client.cpuset: CPU {bad_cpu} is not on this host" in strict.stderr
    assert "best-effort" in strict.stderr and "Traceback" not in strict.stderr
    assert not (tmp_path / "a").exists()
    plan.write_text(text % (bad_cpu, ", limits: best-effort"))
    loose = run_plan(plan, tmp_path / "b", "--format", "json").proc
    assert "limits NOT applied" in loose.stderr
    (limits,) = [json.loads(p.read_text()) for p in (tmp_path / "b" / "runs").glob("*/limits.json")]
    assert limits["applied"] is False and "cpuset" in limits["reason"]
    report = pglab("report", str(tmp_path / "b"), check=True).stdout
    assert "NOT applied" in report


@pytest.mark.quiet
def test_a_client_held_to_a_small_quota_is_recognised(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: client\ntarget: {local: {instances: 1, synchronous: null, client: {cpus: 0.1}}}\n"
                    "dataset: {scale: 1}\nmatrix: {workload: [select-only], clients: [4]}\n"
                    "run: {duration: 3s, repeats: 1}\n")
    proc = run_plan(plan, tmp_path / "r", "--format", "json").proc
    (row,) = json.loads(proc.stdout)
    assert row["bottleneck"].startswith("client (pgbench"), row["bottleneck"]
    assert "of its 0.1-core quota" in row["bottleneck"]


def test_the_primarys_figures_come_from_the_node_that_is_primary() -> None:
    """After a failover the primary is not n0: its limit, CPU use and throttling are read from its own group."""
    from pglab.drivers.local import limit_metrics

    limits = {"applied": True, "n0": {"cpus": 1.0}, "n1": {"cpus": 0.5}}
    before = {"n0": {"usage_s": 0.0, "periods": 0.0, "throttled": 0.0},
              "n1": {"usage_s": 10.0, "periods": 100.0, "throttled": 10.0}}
    after = {"n0": {"usage_s": 2.0, "periods": 50.0, "throttled": 0.0},
             "n1": {"usage_s": 15.0, "periods": 200.0, "throttled": 60.0}}
    m = limit_metrics(limits, before, after, 10.0, primary_name="n1")
    assert m["limit_cpus"] == 0.5
    assert m["primary_cpu_cores"] == 0.5 and m["cpu_throttled_pct"] == 50.0
    assert limit_metrics(limits, before, after, 10.0)["primary_cpu_cores"] == 0.2  # n0 by default
