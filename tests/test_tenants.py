"""Many tenants on one host: real servers, real pgbench per tenant, tier limits through real cgroups."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import pglab, processes_mentioning, run_plan
from helpers import children_of, identities, read_store, still_running, stored_runs
from pglab.errors import UserError
from pglab.plan.load import load_plan
from pglab.targets.local.cluster import cgroup_name

pytestmark = pytest.mark.postgres

CAP_IOPS = 50
INTERRUPT_CAP_IOPS = 2000


@pytest.fixture
def labs() -> Iterator[Path]:
    """Where the tenants' labs go: a folder the server user can reach (pytest's tmp_path is private to root)."""
    top = Path(tempfile.mkdtemp(prefix="pglab-tenants-"))
    top.chmod(0o755)
    yield top / "labs"
    shutil.rmtree(top, ignore_errors=True)


def _plan(labs: Path, extra_arrangement: str = "", duration: str = "6s", instances: int = 1,
          cap_iops: int = CAP_IOPS, parameters: str = "") -> str:
    return f"""
name: tenants-test
target: {{local: {{paths: {{lab: {labs}}}}}}}
dataset: {{scale: 1}}
run: {{duration: {duration}}}
postgres: {{parameters: {{shared_buffers: 16MB{parameters}}}}}
tenants:
  instances: {instances}
  parallel_builds: 3  # every tenant at once (the default, one per core, built them 2 at a time here: ~2x slower)
  arrangements:
    - name: mixed
      tiers:
        - {{name: free, tenants: 1, clients: 2}}
        - {{name: capped, tenants: 2, clients: 2, resources: {{cpus: 0.5, write_iops: {cap_iops}}}}}
{extra_arrangement}"""


def _cgroups_left(labs: Path) -> list[Path]:
    """The tenants' cgroups still present, in any hierarchy (v1 controllers or v2)."""
    names = {cgroup_name(labs / f"t0{i}") for i in range(1, 4)}
    return [p for p in Path("/sys/fs/cgroup").rglob("pglab-*") if p.name in names]


def _pgbench_tps(out: Path) -> float:
    m = re.search(r"^tps = ([0-9.]+) \(without initial connection time\)", out.read_text(), re.MULTILINE)
    assert m, out.read_text()
    return float(m.group(1))


def test_tiers_limits_results_and_cleanup(tmp_path: Path, labs: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(_plan(labs, duration="4s", extra_arrangement="""    - name: solo
      tiers:
        - {name: only, tenants: 1, resources: {cpus: 0.3}}
""", parameters=", shared_preload_libraries: pg_stat_statements"))
    results = tmp_path / "results"
    run_plan(plan, results)
    runs = {r.axes["arrangement"]: r for r in stored_runs(results) if r.status == "ok"}
    assert all(r.axes == {"arrangement": name} for name, r in runs.items()), runs
    mixed = results / runs["mixed"].dir
    solo = results / runs["solo"].dir

    # the limits of each tenant's tier, as the kernel reports them
    limits = json.loads((mixed / "limits.json").read_text())
    assert [limits[t]["tier"] for t in ("t01", "t02", "t03")] == ["free", "capped", "capped"]
    assert limits["t01"]["n0"]["cpus"] is None and not limits["t01"]["n0"].get("io_max")
    for t in ("t02", "t03"):
        assert limits[t]["n0"]["cpus"] == 0.5
        io = limits[t]["n0"]["io_max"]
        assert str(io.get("write_iops") if isinstance(io, dict) else io).split()[-1].endswith(str(CAP_IOPS))
    solo_limits = json.loads((solo / "limits.json").read_text())
    assert list(solo_limits) == ["t01"] and solo_limits["t01"]["n0"]["cpus"] == 0.3  # rebuilt with its own tiers

    # per tenant: TPS as each tenant's pgbench printed it; the capped tenants are held to their IOPS
    with read_store(results) as store:
        tenants = store.tenant_metrics(runs["mixed"].id)
    per: dict[str, dict[str, Any]] = {tenant: figures for tenant, (_tier, figures) in tenants.items()}
    for t in ("t01", "t02", "t03"):
        assert "database system is ready" in (mixed / "tenants" / t / "server-n0.log").read_text()
        assert per[t]["tps"] == pytest.approx(_pgbench_tps(mixed / "tenants" / t / "pgbench.out"), rel=1e-9)
        assert 1 < per[t]["memory_mb"] < 1024
    for t in ("t02", "t03"):
        assert per[t]["write_iops"] <= CAP_IOPS * 1.15, per[t]
        assert per[t]["tps"] < per["t01"]["tps"] / 3, (per[t]["tps"], per["t01"]["tps"])
    assert per["t01"]["write_iops"] > CAP_IOPS * 2  # the free tenant's demand is above the cap
    # why, per tenant: each tenant's own server's statements over the window and its WAL (issue 29)
    record = json.loads((mixed / "run.json").read_text())
    assert set(record["statements"]["tenants"]) == {"t01", "t02", "t03"}
    for t in ("t01", "t02", "t03"):
        doc = json.loads((mixed / "tenants" / t / "statements.json").read_text())
        update = next(s for s in doc["statements"] if s["query"].startswith("UPDATE pgbench_accounts"))
        assert update["calls"] == per[t]["transactions"]  # this tenant's pgbench, not another's
        assert record["statements"]["tenants"][t]["file"] == f"tenants/{t}/statements.json"
        assert per[t]["wal_records"] > 0 and per[t]["wal_bytes_per_commit"] > 0 and "buffers_backend" in per[t]
    for t in ("t02", "t03"):  # held to their IOPS: fewer transactions, less WAL than the free tenant's server
        assert per[t]["wal_records"] < per["t01"]["wal_records"]
    host = runs["mixed"].metrics
    assert host["wal_records"] == sum(per[t]["wal_records"] for t in ("t01", "t02", "t03"))
    assert not (mixed / "probe-errors.txt").exists()
    tier_tps = runs["mixed"].metrics["tier.capped.tps"]
    assert tier_tps == pytest.approx((per["t02"]["tps"] + per["t03"]["tps"]) / 2)

    # the tier table, and the per-tenant rows for other tools
    table = pglab("report", str(results), "--table", "tiers", "--format", "csv", check=True).stdout.splitlines()
    assert table[0].startswith("arrangement,tier,instances,tps_per_instance")
    assert [line.split(",")[:3] for line in table[1:]] == [["mixed", "free", "1"], ["mixed", "capped", "2"],
                                                           ["solo", "only", "1"]]
    tenants = json.loads(pglab("report", str(results), "--table", "tenants", "--format", "json", check=True).stdout)
    assert {(r["arrangement"], r["tenant"]) for r in tenants} == {("mixed", "t01"), ("mixed", "t02"),
                                                                 ("mixed", "t03"), ("solo", "t01")}
    for r in tenants:  # each tenant's own WAL per commit, as its run stored it
        if r["arrangement"] == "mixed":
            assert r["wal_bytes_per_commit"] == pytest.approx(per[r["tenant"]]["wal_bytes_per_commit"])

    html = tmp_path / "report.html"
    pglab("report", str(results), "--html", str(html), check=True)
    text = html.read_text()
    assert "Tiers (per tenant" in text and "TPS per instance, per tier" in text and ">capped<" in text
    # each tenant's statements that took the most time, as its statements.json has them (issue 29)
    section = text[text.index('<h2 id="statements">'):]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(<td.*?)</tr>",
                                                                       section[:section.index("</table>")])]
    for t, tier in (("t01", "free"), ("t02", "capped"), ("t03", "capped")):
        doc = json.loads((mixed / "tenants" / t / "statements.json").read_text())
        mine = [r for r in rows if r[0] == runs["mixed"].id and r[2] == t]
        assert len(mine) == min(5, len(doc["statements"])) and all(r[3] == tier for r in mine)
        assert [int(r[5].replace(",", "")) for r in mine] == [round(s["calls"]) for s in doc["statements"][:5]]

    # nothing left: no server, no pgbench, no cgroup, no lab directory
    assert processes_mentioning(str(labs)) == []
    assert _cgroups_left(labs) == []
    assert not labs.exists() or not any(labs.iterdir())


def test_interrupt_while_tenants_run_leaves_nothing_and_resumes(tmp_path: Path, labs: Path) -> None:
    """With small clusters as tenants (a primary and a synchronous standby each). The capped tier's IOPS cap is
    high here: at 25 IOPS each run's dataset reset (VACUUM, CHECKPOINT) alone takes ~10 s, and what the cap does
    to the load is test_tiers_limits_results_and_cleanup's business; this test checks that it is in force."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(_plan(labs, duration="4s", instances=2, cap_iops=INTERRUPT_CAP_IOPS))
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "pglab.cli", "run", str(plan), "--results", str(results)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def measured() -> dict[int, int | None]:
        """This pglab's measured pgbench (-T 4), with their start times: not another test's on the host."""
        return identities(p for p, (name, args) in children_of(proc.pid).items()
                          if name == "pgbench" and "-T" in args and args[args.index("-T") + 1] == "4")

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(seen := measured()) < 3:
        time.sleep(0.5)
    assert len(seen) == 3, "every tenant's pgbench runs"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert processes_mentioning(str(labs)) == [] and not still_running(seen)
    with read_store(results) as store:
        (run,) = store.runs()
        assert run.status == "interrupted"
        assert store.tenant_metrics(run.id) == {}  # nothing half-written
    # the rerun resumes the same sweep and completes it
    rerun = run_plan(plan, results).proc
    assert "resuming sweep" in rerun.stdout + rerun.stderr
    with read_store(results) as store:
        (run,) = store.runs()
        assert run.status == "ok"
        assert len(store.tenant_metrics(run.id)) == 3
    assert run.metrics["instances"] == 6
    run_dir = results / run.dir
    limits = json.loads((run_dir / "limits.json").read_text())
    assert all(set(limits[t]) >= {"n0", "n1"} for t in ("t01", "t02", "t03"))
    assert limits["t02"]["n1"]["cpus"] == 0.5  # a tier's limits hold for every instance of its tenants
    io = limits["t02"]["n1"]["io_max"]
    assert str(io.get("write_iops") if isinstance(io, dict) else io).split()[-1].endswith(str(INTERRUPT_CAP_IOPS))
    settings = json.loads((run_dir / "settings.json").read_text())
    assert settings["synchronous_standby_names"]["setting"] == "ANY 1 (n1)"
    assert processes_mentioning(str(labs)) == [] and _cgroups_left(labs) == []


RATE, LATENCY_LIMIT_MS = 400, 5


def _pgbench_line(out: str, pattern: str) -> re.Match[str]:
    m = re.search(pattern, out, re.MULTILINE)
    assert m is not None, f"pgbench printed no {pattern!r}"
    return m


def test_tenants_at_a_rate_run_open_loop_with_pgbenchs_own_rate_figures(tmp_path: Path, labs: Path) -> None:
    """run.rate with tenants: every tenant's pgbench runs at that arrival rate (-R, with --latency-limit), and its
    schedule lag, skipped and late shares are pgbench's own, in its tenant rows and the tenants table. The capped
    tenants (50 write IOPS, each commit a WAL flush) cannot keep up with 400 transactions a second: they skip."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(_plan(labs, duration=f"4s, rate: {RATE}, latency_limit: {LATENCY_LIMIT_MS}ms"))
    results = tmp_path / "results"
    run_plan(plan, results)
    (run,) = stored_runs(results)
    assert run.status == "ok"
    run_dir = results / run.dir
    record = json.loads((run_dir / "run.json").read_text())["tenants"]
    with read_store(results) as store:
        per = {tenant: figures for tenant, (_tier, figures) in store.tenant_metrics(run.id).items()}
    table = {r["tenant"]: r for r in json.loads(pglab("report", str(results), "--table", "tenants", "--format",
                                                         "json", check=True).stdout)}
    for t in ("t01", "t02", "t03"):
        command = record[t]["command"]
        assert command[command.index("-R") + 1] == str(RATE) and f"--latency-limit={LATENCY_LIMIT_MS}" in command
        folder = run_dir / "tenants" / t
        out = (folder / "pgbench.out").read_text()
        m = per[t]
        lag = _pgbench_line(out, r"^rate limit schedule lag: avg ([\d.]+) \(max ([\d.]+)\) ms")
        assert (m["schedule_lag_ms"], m["schedule_lag_max_ms"]) == (float(lag.group(1)), float(lag.group(2)))
        processed = int(_pgbench_line(out, r"^number of transactions actually processed: (\d+)").group(1))
        skipped = int(_pgbench_line(out, r"^number of transactions skipped: (\d+)").group(1))
        late = int(_pgbench_line(out, rf"^number of transactions above the {LATENCY_LIMIT_MS}\.0 ms latency limit: "
                                      r"(\d+)/").group(1))
        assert m["skipped_pct"] == pytest.approx(skipped / (processed + skipped) * 100)
        assert m["late_pct"] == pytest.approx(late / processed * 100)
        # its -l log (every transaction) says the same: a 'skipped' line per transaction skipped, a schedule lag
        # column on every other, each time counted from the scheduled start (so at least its lag)
        (log,) = folder.glob("pgbench_log.*")
        text = gzip.decompress(log.read_bytes()).decode() if log.suffix == ".gz" else log.read_text()
        lines = [line.split() for line in text.splitlines() if line.strip()]
        assert sum(1 for f in lines if f[2] == "skipped") == skipped
        done = [f for f in lines if f[2] not in ("skipped", "failed")]
        assert len(done) == processed and all(len(f) >= 7 and int(f[2]) >= int(f[6]) for f in done)
        assert m["latency_log_mean_ms"] == pytest.approx(sum(int(f[2]) for f in done) / len(done) / 1000)
        for key in ("schedule_lag_ms", "schedule_lag_max_ms", "skipped_pct", "late_pct"):  # the tenants table
            assert table[t][key] == pytest.approx(m[key]), key
    assert all((per[t]["skipped_pct"] or 0) > 0 for t in ("t02", "t03")), per


@pytest.mark.parametrize(("change", "field"), [
    ("target: {external: {conninfo: 'host=/tmp'}}", "target"),
    ("target: {local: {instances: 2}}", "target.local.instances"),
    ("target: {local: {resources: {cpus: 1}}}", "target.local.resources"),
    ("target: {local: {ha: patroni}}", "target.local.ha"),
    ("matrix: {clients: [1, 2]}", "matrix"),
])
def test_what_tenants_cannot_take_is_refused(tmp_path: Path, change: str, field: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"""name: t
{change}
tenants:
  arrangements: [{{name: a, tiers: [{{name: x}}]}}]
""")
    proc = pglab("run", str(plan), "--results", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = (proc.stdout + proc.stderr).strip()
    assert field in message and "Traceback" not in message and len(message.splitlines()) == 1, message
    assert not (tmp_path / "r").exists()


def test_tier_and_arrangement_rules(tmp_path: Path) -> None:
    def refused(tenants: str) -> str:
        plan = tmp_path / "p.yaml"
        plan.write_text(f"name: t\ntenants: {tenants}\n")
        with pytest.raises(UserError) as exc:
            load_plan(plan)
        return str(exc.value)

    assert "tier names must be unique" in refused("{arrangements: [{name: a, tiers: [{name: x}, {name: x}]}]}")
    assert "arrangement names must be unique" in refused(
        "{arrangements: [{name: a, tiers: [{name: x}]}, {name: a, tiers: [{name: y}]}]}")
    assert "jobs (4) must be at most clients (2)" in refused(
        "{arrangements: [{name: a, tiers: [{name: x, clients: 2, jobs: 4}]}]}")
    assert "need a standby" in refused(
        "{arrangements: [{name: a, tiers: [{name: x, synchronous_commit: remote_apply}]}]}")
    assert "more than 256" in refused("{arrangements: [{name: a, tiers: [{name: x, tenants: 200}, "
                                      "{name: y, tenants: 100}]}]}")
