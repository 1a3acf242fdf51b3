"""Tenants on Kubernetes without a cluster: a tier's storage classes (data and WAL volumes) in each tenant's Cluster,
checked by `pglab k8s check` against the fake API server's classes and refused where they mean nothing; each
tenant's CPU, memory and disk figures from the cluster's Prometheus over the tenant's window.

The real thing runs in tests/test_kube_lab_clusters.py, on the lab (a tier on its throttled class)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from conftest import pglab
from k8s_fake import FakeAPI, results_log, storage_class
from k8s_fake.routing import NS, Route
from k8s_support import (
    FIO,
    PGBENCH,
    TENANTS_TARGET,
    TXN_LOGS,
    Recorder,
    assert_all_deleted,
    cli,
    kubeconfig,
    pod_log,
    posted_jobs,
    statements_read,
    statements_row,
)
from pglab.plan.load import parse_plan
from pglab.plan.schema import PrometheusSource
from pglab.targets.kubernetes import prometheus
from pglab.targets.kubernetes.render import cluster
from pglab.targets.kubernetes.statements import END_FILE, ERR_FILE, MARK, START_FILE
from pglab.targets.kubernetes.tenants import START_WAIT

TIERS = TENANTS_TARGET + """tenants:
  arrangements:
    - name: io-tiers
      tiers:
        - {name: fast, tenants: 1, storage: {class: premium, size: 20Gi}, wal_storage: {class: premium, size: 4Gi}}
        - {name: slow, tenants: 1, storage: {class: throttled, size: 20Gi}}
        - {name: plain, tenants: 1}
run: {duration: 10s}
"""


def plan_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def test_a_tiers_storage_classes_are_its_tenants_clusters_volumes() -> None:
    from pglab.targets.kubernetes.tenants import tenants_of

    plan = parse_plan(TIERS)
    assert plan.tenants is not None
    specs = {t.tier.name: cluster(t.plan)["spec"] for t in tenants_of(plan, plan.tenants.arrangements[0])}
    assert specs["fast"]["storage"] == {"size": "20Gi", "storageClass": "premium"}
    assert specs["fast"]["walStorage"] == {"size": "4Gi", "storageClass": "premium"}
    assert specs["slow"]["storage"] == {"size": "20Gi", "storageClass": "throttled"}
    assert "walStorage" not in specs["slow"] and "walStorage" not in specs["plain"]  # WAL on the data volume
    assert specs["plain"]["storage"] == {"size": "10Gi", "storageClass": "standard"}  # the target's

    # a target with WAL volumes: a tier without wal_storage keeps the target's, a tier's own replaces it
    with_wal = parse_plan(TIERS.replace("    storage: {class: standard, size: 10Gi}\n",
                                        "    storage: {class: standard, size: 10Gi}\n"
                                        "    wal_storage: {class: standard, size: 2Gi}\n"))
    assert with_wal.tenants is not None
    specs = {t.tier.name: cluster(t.plan)["spec"] for t in tenants_of(with_wal, with_wal.tenants.arrangements[0])}
    assert specs["slow"]["walStorage"] == {"size": "2Gi", "storageClass": "standard"}
    assert specs["fast"]["walStorage"] == {"size": "4Gi", "storageClass": "premium"}


@pytest.mark.parametrize(("text", "message"), [
    ("name: l\ntarget: {local: {}}\ntenants:\n  arrangements:\n    - name: a\n      tiers:\n"
     "        - {name: gold, wal_storage: {class: fast, size: 1Gi}}\n",
     "tenants.arrangements[0].tiers[0].wal_storage: is for a Kubernetes target; on a local lab remove it"),
    ("name: l\ntarget: {local: {}}\ntenants:\n  arrangements:\n    - name: a\n      tiers:\n"
     "        - {name: gold, storage: {class: fast}}\n",
     "tenants.arrangements[0].tiers[0].storage: is for a Kubernetes target; on a local lab remove it"),
    (TIERS + "postgres: {parameters: {max_wal_size: 4GB}}\n",
     "postgres.parameters.max_wal_size: max_wal_size 4GB is not below the WAL volume "
     "(tenants.arrangements.0.tiers.0.wal_storage.size: 4Gi), which CloudNativePG refuses; lower it or make the "
     "volume larger"),
])
def test_a_tiers_volumes_where_they_mean_nothing_are_refused_in_one_sentence(tmp_path: Path, text: str,
                                                                              message: str) -> None:
    proc = pglab("plan", "validate", str(plan_file(tmp_path, text)))
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.strip() == message, proc.stderr


def test_k8s_check_finds_each_tiers_classes(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    text = TIERS.replace("    namespace: bench\n",
                         f"    namespace: bench\n    kubeconfig: {kubeconfig(tmp_path, api_client)}\n")
    path = plan_file(tmp_path, text)
    api.storage_classes = [storage_class("standard", default=True), storage_class("premium")]
    rc = cli(monkeypatch, "k8s", "check", str(path))
    out = capsys.readouterr().out.splitlines()
    assert rc == 2
    assert out[-1] == ("FAIL  storage class 'throttled' (tenants.arrangements[0].tiers[1].storage.class): not found; "
                       "existing: premium, standard (default)"), out
    api.storage_classes.append(storage_class("throttled"))
    rc = cli(monkeypatch, "k8s", "check", str(path))
    out = capsys.readouterr().out.splitlines()
    assert rc == 0, out
    (line,) = [x for x in out if x.startswith("ok    storage classes:")]
    assert line == ("ok    storage classes: data on standard, tier fast on premium, tier fast WAL on premium, "
                    "tier slow on throttled"), line
    # the WAL class of a tier is checked as its data class is
    path.write_text(text.replace("wal_storage: {class: premium", "wal_storage: {class: ultra"))
    rc = cli(monkeypatch, "k8s", "check", str(path))
    out = capsys.readouterr().out.splitlines()
    assert rc == 2 and out[-1].startswith("FAIL  storage class 'ultra' (tenants.arrangements[0].tiers[0]"
                                          ".wal_storage.class): not found"), out


# ------------------------------------------------------------------ each tenant's primary's figures from Prometheus
class Prometheus(prometheus.Client):
    """Prometheus's range queries answered from raw samples, as its engine does for the expressions pglab asks: a
    selector (the latest sample at or before each step, within 5 minutes), ``timestamp()`` of one (that sample's
    time) and ``max by (label)`` of that. Only the HTTP round trip is left out."""

    MATCHER = re.compile(r'(\w+)(=~|=)"((?:[^"\\]|\\.)*)"')

    def __init__(self, raw: list[tuple[dict[str, str], list[tuple[float, float]]]]):
        super().__init__(PrometheusSource(url="http://prometheus:9090", interval=1.0), Path("."))
        self.raw, self.asked = raw, []  # type: list[tuple[dict[str, str], list[tuple[float, float]]]], list[str]

    def range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        self.asked.append(expr)
        by = m.group(1) if (m := re.match(r"max by \((\w+)\) \((.*)\)$", expr)) else None
        expr = m.group(2) if m else expr
        stamps = expr.startswith("timestamp(")
        expr = expr.removeprefix("timestamp(").removesuffix(")") if stamps else expr
        name, _, matchers = expr.partition("{")
        want = [(k, op, re.sub(r"\\(.)", r"\1", v)) for k, op, v in self.MATCHER.findall(matchers)]  # unquoted
        if name:
            want.append(("__name__", "=", name))
        steps = [start + i * step for i in range(int((end - start) / step) + 1)]
        out: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
        for labels, samples in self.raw:
            if not all(re.fullmatch(v, labels.get(k, "")) if op == "=~" else labels.get(k, "") == v
                       for k, op, v in want):
                continue
            metric = {by: labels[by]} if by else {k: v for k, v in labels.items() if not (stamps and k == "__name__")}
            key = tuple(sorted(metric.items()))
            for t in steps:
                seen = [(ts, v) for ts, v in samples if t - 300 < ts <= t]
                if seen:
                    ts, v = seen[-1]
                    value = ts if stamps else v
                    out.setdefault(key, {})[t] = max(out.get(key, {}).get(t, value), value) if by else value
        return [{"metric": dict(key), "values": [[t, str(v)] for t, v in sorted(points.items())]}
                for key, points in out.items()]


def counter(per_s: float, times: list[float]) -> list[tuple[float, float]]:
    return [(t, per_s * t) for t in times]


def test_a_tenants_primary_figures_are_its_containers_and_its_volumes_device_over_its_window() -> None:
    """The primary's container at 0.25 cores (throttled in 20 % of its periods), 100 MiB of working set in the first
    half of the window and 120 MiB in the second (200 MiB outside it), its volume on loop7 of its node doing 50
    writes of 8 KiB and 10 reads of 4 KiB a second; another device of the node (another tenant's class) and another
    pod's container busy meanwhile, and a container of the same pod name gone before the window (an earlier
    arrangement's Cluster of the same name). Samples each second, 0.3 s after the window's whole seconds."""
    from pglab import metrics
    from pglab.targets.kubernetes.disks import Volume
    from pglab.targets.kubernetes.tenants import primary_figures

    times = [90.3 + i for i in range(30)]  # 90.3 … 119.3; the window is [100, 110]
    ns, pod, node = "bench", "mt-t01-1", "db-1"
    cont = {"namespace": ns, "pod": pod, "container": "postgres", "cpu": "total"}
    other = {**cont, "pod": "mt-t02-1"}
    mib = float(1 << 20)
    disk = {"instance": node}
    raw: list[tuple[dict[str, str], list[tuple[float, float]]]] = [
        ({"__name__": "container_cpu_usage_seconds_total", **cont}, counter(0.25, times)),
        ({"__name__": "container_cpu_cfs_periods_total", **cont}, counter(10, times)),
        ({"__name__": "container_cpu_cfs_throttled_periods_total", **cont}, counter(2, times)),
        ({"__name__": "container_cpu_usage_seconds_total", **other}, counter(0.9, times)),
        ({"__name__": "container_memory_working_set_bytes", **cont},
         [(t, (100 if t < 105 else 120 if t < 110 else 200) * mib if t >= 100 else 200 * mib) for t in times]),
        ({"__name__": "container_memory_working_set_bytes", **other}, [(t, 900 * mib) for t in times]),
    ]
    rates = {"loop7": {"node_disk_reads_completed_total": 10, "node_disk_read_bytes_total": 10 * 4096,
                       "node_disk_writes_completed_total": 50, "node_disk_written_bytes_total": 50 * 8192,
                       "node_disk_read_time_seconds_total": 0.01, "node_disk_write_time_seconds_total": 0.5,
                       "node_disk_io_time_seconds_total": 0.6, "node_disk_io_time_weighted_seconds_total": 0.7},
             "loop0": {"node_disk_reads_completed_total": 0, "node_disk_read_bytes_total": 0,
                       "node_disk_writes_completed_total": 900, "node_disk_written_bytes_total": 900 * 16384,
                       "node_disk_read_time_seconds_total": 0, "node_disk_write_time_seconds_total": 0.9,
                       "node_disk_io_time_seconds_total": 0.95, "node_disk_io_time_weighted_seconds_total": 1.0}}
    for device, counters in rates.items():
        raw += [({"__name__": name, **disk, "device": device}, counter(rate, times)) for name, rate in counters.items()]
        raw.append(({"__name__": "node_disk_info", **disk, "device": device, "major": "7", "minor": device[4:]},
                    [(t, 1.0) for t in times]))
    # the same pod name's container of an earlier arrangement (another node, another cgroup id): one last sample
    # before it went, which Prometheus still answers within its lookback
    earlier = {**cont, "id": "/kubepods/pod-earlier/c0"}
    raw += [({"__name__": name, **earlier}, [(91.0, 7.0)]) for name in
            ("container_cpu_usage_seconds_total", "container_cpu_cfs_periods_total",
             "container_cpu_cfs_throttled_periods_total")]
    prom = Prometheus(raw)
    volumes: dict[str, list[Volume] | str] = {pod: [Volume("mt-t01-data", "7:7", "ext4", "/dev/loop7")]}
    got = primary_figures(prom, ns, pod, node, "postgres", (100.0, 110.0), volumes, cpu_limit=0.5)
    expected = {"cpu_cores": 0.25, "cpu_s": 2.5, "cpu_limit_pct": 50.0, "cpu_throttled_pct": 20.0,
                "memory_mb": 110.0, "read_iops": 10.0, "write_iops": 50.0, "total_iops": 60.0,
                "read_mb_s": 10 * 4096 / mib, "write_mb_s": 50 * 8192 / mib}
    assert got.metrics == pytest.approx(expected, rel=1e-9), (got.metrics, got.info, prom.asked)
    assert got.info["disk"]["volumes"] == [{"claim": "mt-t01-data", "device": "loop7", "how": "ext4 on device 7:7"}]
    assert got.info["memory"] == {"samples": 10, "max_mb": 120.0}
    assert set(got.raw) == {"cpu", "memory", "disk"}
    # every figure is in the catalogue, and but the total a column of the tenants table
    assert all(metrics.get(name) is not None for name in got.metrics)
    assert set(got.metrics) - {"total_iops"} <= set(metrics.keys("tenants")), metrics.keys("tenants")

    # a volume on a device node-exporter did not sample gives no disk figure (not the busy device's), and says why
    gone: dict[str, list[Volume] | str] = {pod: [Volume("mt-t01-data", "7:9", "ext4", "/dev/loop9")]}
    got = primary_figures(prom, ns, pod, node, "postgres", (100.0, 110.0), gone, cpu_limit=0.5)
    assert "write_iops" not in got.metrics and "cpu_cores" in got.metrics
    assert "/dev/loop9" in got.info["disk"], got.info


def test_tenants_whose_volumes_share_a_device_are_named_to_each_other() -> None:
    """On the lab a node has one disk per class: two tenants' volumes of a class on one node are one device, whose
    figures both get; a device of another node, or another device of the node, is not shared."""
    from pglab.targets.kubernetes.tenants import PrimaryFigures, mark_shared

    def on(node: str, *devices: str) -> PrimaryFigures:
        return PrimaryFigures(info={"node": node, "disk": {"volumes": [{"claim": "c", "device": d} for d in devices]}})

    figures = {"t01": on("db-1", "loop1"), "t02": on("db-1", "loop1", "loop2"), "t03": on("db-2", "loop1"),
               "t04": on("db-1", "loop2"), "t05": PrimaryFigures(info={"node": "db-1", "disk": "no sample"})}
    mark_shared(figures)
    assert {n: f.info["disk"].get("shared_with") for n, f in figures.items() if isinstance(f.info["disk"], dict)} == {
        "t01": ["t02"], "t02": ["t01", "t04"], "t03": None, "t04": ["t02"]}


# ------------------------------------------------------------------ each tenant's statements, as its Job read them
STATEMENTS = TENANTS_TARGET + """tenants:
  arrangements:
    - name: pair
      tiers:
        - {name: gold, tenants: 1, clients: 2}
        - {name: bronze, tenants: 1, clients: 1}
postgres: {parameters: {pg_stat_statements.max: '1000'}}
run: {duration: 4s, warmup: 0s}
"""
UPDATE = "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2"
SELECT = "SELECT abalance FROM pgbench_accounts WHERE aid = $1"


def tenant_reads(tenant: str) -> tuple[str, str]:
    """What tenant t0N's Job printed of the view: its UPDATE called 100·N times and its SELECT 10·N times in the
    window (N ms and N/2 ms each), the window from second 100·N to 100·N + 4; the reads' own statement and another
    role's (no identity for the application role) left for pglab to leave out."""
    n = int(tenant[1:])
    start = statements_read(1700000000 + 100 * n, [statements_row(16385, 11, UPDATE, 7, 7.0),
                                                   statements_row(16385, 12, SELECT, 3, 1.5)], 0)
    end = statements_read(1700000004 + 100 * n, [
        statements_row(16385, 11, UPDATE, 7 + 100 * n, 7.0 + 100 * n * n, wal_bytes=500.0 * n),
        statements_row(16385, 12, SELECT, 3 + 10 * n, 1.5 + 5 * n * n),
        statements_row(16385, 14, f"SELECT /* {MARK} */ jsonb_build_object($1, ...)", 1, 0.5),
        statements_row(None, None, "<insufficient privilege>", 80, 18.0)], 0)
    return start, end


def test_each_tenants_statements_are_what_its_own_job_read(fake: tuple[FakeAPI, client.ApiClient],
                                                            tmp_path: Path) -> None:
    """Two tenants whose Jobs printed different reads: each one's statements.json and summary are its own reads'
    deltas; each Job waits for the common start before its first read."""
    from pglab.drivers import driver_for
    from pglab.engine.sweep import run_sweep

    api, api_client = fake

    def log(job: str) -> str:
        if "-run-" not in job:
            return pod_log(job)
        start, end = tenant_reads(job.split("-")[1])  # mt-t01-run-0000-1
        files = {name: (PGBENCH / name).read_text() for name in ("pgbench.out", "pgbench.err", *TXN_LOGS)}
        return results_log({**files, "settings.txt": "pg_stat_statements.max|1000||f|t\n",
                            START_FILE: start, END_FILE: end, ERR_FILE: ""}, text="")

    api.default_log = log
    plan, results = parse_plan(STATEMENTS, base_dir=tmp_path), tmp_path / "results"
    driver = driver_for(plan, STATEMENTS, tmp_path, results, Recorder(), api=api_client, poll_s=0.01,
                        ready_timeout_s=5.0)
    result = run_sweep(driver, plan, STATEMENTS, tmp_path, results, Recorder())
    assert (result.ok, result.failed) == (1, 0), result.failures

    jobs = [b for b in api.posted if b["kind"] == "Job" and "-run-" in b["metadata"]["name"]]
    assert sorted(j["metadata"]["name"] for j in jobs) == ["mt-t01-run-0000-1", "mt-t02-run-0000-1"]
    for job in jobs:
        script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
        assert (script.index(START_WAIT) < script.index(f"statements_read {START_FILE}") < script.index("pgbench -n")
                < script.index(f"statements_read {END_FILE}"))

    (run_dir,) = (results / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert json.loads((run_dir / "tenants.json").read_text())["statements"] == record["statements"]
    for tenant, n in (("t01", 1), ("t02", 2)):
        doc = json.loads((run_dir / "tenants" / tenant / "statements.json").read_text())
        assert doc["window"] == [1700000000 + 100 * n, 1700000004 + 100 * n]
        assert doc["source"] == "pg_stat_statements 1.10" and "other roles' statements" in doc["note"]
        got = {s["query"]: s for s in doc["statements"]}
        assert list(got) == [UPDATE, SELECT]  # most time first; neither the reads' own nor the hidden row
        assert (got[UPDATE]["calls"], got[UPDATE]["total_exec_time"], got[UPDATE]["wal_bytes"]) == (
            100 * n, 100 * n * n, 500 * n)
        assert (got[SELECT]["calls"], got[SELECT]["total_exec_time"]) == (10 * n, 5 * n * n)
        assert got[UPDATE]["mean_exec_time"] == pytest.approx(n)
        summary = record["statements"]["tenants"][tenant]
        assert summary["file"] == f"tenants/{tenant}/statements.json" and summary["count"] == 2
        assert summary["top"][0] == {"query": UPDATE, "calls": 100 * n, "total_exec_time_ms": 100 * n * n,
                                     "mean_exec_time_ms": pytest.approx(n), "time_pct": pytest.approx(100 / 1.05)}
    assert set(record["statements"]["tenants"]) == {"t01", "t02"}
    assert not list(run_dir.rglob("probe-errors.txt"))

    # the HTML report shows each tenant's statements as its Job read them, the tenants in order
    pglab("report", str(results), "--html", str(tmp_path / "report.html"), check=True)
    page = (tmp_path / "report.html").read_text()
    section = page[page.index('<h2 id="statements">'):]
    section = section[:section.index("</table>")]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(<td.*?)</tr>", section)]
    assert [(r[2], r[3], r[5], r[6]) for r in rows] == [
        ("t01", "gold", "100", "100.00"), ("t01", "gold", "10", "5.00"),
        ("t02", "bronze", "200", "400.00"), ("t02", "bronze", "20", "20.00")]


def test_each_tenants_job_runs_at_the_plans_rate() -> None:
    """run.rate with tenants on Kubernetes: every tenant's pgbench is open loop at that rate, with the latency limit,
    as on a local lab (tests/test_tenants.py runs it there)."""
    from pglab.plan.expand import expand
    from pglab.targets.kubernetes.tenants import tenant_run, tenants_of

    plan = parse_plan(TIERS.replace("run: {duration: 10s}", "run: {duration: 10s, rate: 40, latency_limit: 5ms}"))
    assert plan.tenants is not None
    (point,) = expand(plan)
    tenants = tenants_of(plan, plan.tenants.arrangements[0])
    assert len(tenants) == 3
    for t in tenants:
        command = tenant_run(t, point, 1, 1_800_000_000).body["spec"]["template"]["spec"]["containers"][0]["command"]
        (line,) = [x for x in command[-1].splitlines() if "pgbench -n " in x]
        args = line.split()
        assert args[args.index("-R") + 1] == "40" and "--latency-limit=5" in args, line


# ------------------------------------------------------------------ each tenant's WAL, checkpoints, backend writes
WHY = TENANTS_TARGET + """tenants:
  arrangements:
    - name: pair
      tiers:
        - {name: gold, tenants: 1, clients: 2}
        - {name: bronze, tenants: 1, clients: 1}
postgres: {parameters: {work_mem: 8MB}}
run: {duration: 4s, warmup: 0s}
"""


def pgstats_reads(n: int) -> tuple[str, str]:
    """What tenant t0N's Job read of its primary's counters, 4 s apart (the server's clock): 1000·N commits, 8·N MiB
    of WAL by its position, 5000·N records of 6 000 000·N bytes with 300·N full pages, one requested checkpoint of 50
    buffers, 20·N buffers written by backends; 990 of 1000 blocks hit. The second tenant's server has no
    buffers_backend_fsync (an empty field, psql's NULL)."""
    start = [1700000000.25 + 100 * n, 5000, 7, 100, 9000, 1 << 30, 3, 1, 400, 70000, 900, 8e6, 60, 0, 11]
    step = [4.0, 1000 * n, 0, 10, 990, 8 * n << 20, 0, 1, 50, 5000 * n, 300 * n, 6e6 * n, 20 * n, 0, 3]
    end = [a + b for a, b in zip(start, step, strict=True)]

    def line(values: list[float]) -> str:
        return "|".join("" if n == 2 and i == 13 else f"{v:.17g}"
                        for i, v in enumerate(values)) + "\n"

    return line(start), line(end)


def test_each_tenants_wal_and_buffer_figures_are_its_own_jobs_reads(fake: tuple[FakeAPI, client.ApiClient],
                                                                     tmp_path: Path) -> None:
    """Two tenants whose Jobs read different counters: each one's rows are its own reads' increases under the local
    tenants' names, the run's are both added up (per commit as ratios of the sums), tenants.json keeps the reads'
    window and increases, and the tenants table shows them. Each Job reads after the common start, innermost."""
    from pglab.drivers import driver_for
    from pglab.engine.sweep import run_sweep
    from pglab.store.sqlite import Store
    from pglab.targets.kubernetes import pgstats

    api, api_client = fake

    def log(job: str) -> str:
        if "-run-" not in job:
            return pod_log(job)
        start, end = pgstats_reads(int(job.split("-")[1][1:]))  # mt-t01-run-0000-1
        files = {name: (PGBENCH / name).read_text() for name in ("pgbench.out", "pgbench.err", *TXN_LOGS)}
        return results_log({**files, "settings.txt": "work_mem|8192|kB|f|t\n", pgstats.START_FILE: start,
                            pgstats.END_FILE: end}, text="")

    api.default_log = log
    plan, results = parse_plan(WHY, base_dir=tmp_path), tmp_path / "results"
    driver = driver_for(plan, WHY, tmp_path, results, Recorder(), api=api_client, poll_s=0.01, ready_timeout_s=5.0)
    result = run_sweep(driver, plan, WHY, tmp_path, results, Recorder())
    assert (result.ok, result.failed) == (1, 0), result.failures

    for job in (b for b in api.posted if b["kind"] == "Job" and "-run-" in b["metadata"]["name"]):
        script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
        assert (script.index("TRUNCATE") < script.index(START_WAIT) < script.index(f"pgstats_read {pgstats.START_FILE}")
                < script.index("pgbench -n") < script.index(f"pgstats_gone; pgstats_settled {pgstats.END_FILE}")
                < script.index("base64"))

    store = Store.open(results, create=False)
    (run_,) = store.runs()
    figures: dict[str, dict[str, float]] = {}
    for tenant, name, value in store.conn.execute("SELECT tenant, name, value FROM tenant_metrics WHERE run_id = ?",
                                                  (run_.id,)):
        figures.setdefault(tenant, {})[name] = value
    for tenant, n in (("t01", 1), ("t02", 2)):
        f = figures[tenant]
        expected = {"commits_s": 250.0 * n, "rollbacks_s": 0.0, "blks_read_s": 2.5, "blks_hit_s": 247.5,
                    "wal_mb_s": 2.0 * n, "checkpoints_timed": 0.0, "checkpoints_req": 1.0, "buffers_checkpoint": 50.0,
                    "wal_records": 5000.0 * n, "wal_fpi": 300.0 * n, "wal_bytes_per_commit": 6000.0,
                    "wal_fpi_per_commit": 0.3, "buffers_backend": 20.0 * n, "buffers_clean": 3.0,
                    "cache_hit_pct": 99.0}
        if n == 1:
            expected["buffers_backend_fsync"] = 0.0
        assert {k: f[k] for k in f if k in expected or k == "buffers_backend_fsync"} == pytest.approx(expected), f
        assert f["tps"] > 0  # beside its pgbench's figures
    # the run: both tenants' counts added up, per commit as ratios of the sums
    m = run_.metrics
    assert (m["wal_records"], m["wal_fpi"], m["buffers_backend"], m["checkpoints_req"]) == (15000, 900, 60, 2)
    assert m["wal_bytes_per_commit"] == pytest.approx(18e6 / 3000) and m["wal_fpi_per_commit"] == pytest.approx(0.3)
    assert m["buffers_backend_fsync"] == 0.0  # the one tenant that has it
    record = json.loads((store.dir / run_.dir / "tenants.json").read_text())["tenants"]
    assert record["t02"]["pgstats"]["window"] == [1700000200.25, 1700000204.25]
    assert record["t02"]["pgstats"]["deltas"]["wal_stat_bytes"] == 12e6
    assert "buffers_backend_fsync" not in record["t02"]["pgstats"]["deltas"]
    store.close()

    # shown as a local tenants run's are: the tenants table (JSON, CSV)
    out = pglab("report", str(results), "--table", "tenants", "--format", "json", check=True)
    rows = {r["tenant"]: r for r in json.loads(out.stdout)}
    assert rows["t02"]["wal_bytes_per_commit"] == pytest.approx(6000.0)
    assert rows["t02"]["wal_fpi_per_commit"] == pytest.approx(0.3) and rows["t02"]["buffers_backend"] == 40
    csv = pglab("report", str(results), "--table", "tenants", "--format", "csv", check=True).stdout.splitlines()
    header = csv[0].split(",")
    t02 = next(line.split(",") for line in csv[1:] if ",t02," in line)
    assert float(t02[header.index("buffers_backend")]) == 40.0
    # … and the HTML report's table of every tenant
    pglab("report", str(results), "--html", str(tmp_path / "report.html"), check=True)
    page = (tmp_path / "report.html").read_text()
    section = page[page.index('<h2 id="tenants">'):]
    section = section[:section.index("</table>")]
    heads = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", section)]
    cells = {r[heads.index("tenant")]: r for r in (re.findall(r"<td[^>]*>(.*?)</td>", row)
                                                   for row in re.findall(r"<tr>(<td.*?)</tr>", section))}
    for head, value in (("wal_bytes_per_commit", 6000.0), ("wal_fpi_per_commit", 0.3), ("buffers_backend", 40.0)):
        assert float(cells["t02"][heads.index(head)].replace(",", "")) == pytest.approx(value), (head, cells["t02"])


def test_a_parameter_a_tenants_primary_did_not_run_with_fails_the_run_naming_it(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """The tenant's Job waited for the parameter and gave up (exit 3): the run's reason names the tenant and the
    parameter, as a one-Cluster run's does, not the Job's exit code."""
    from pglab.drivers import driver_for
    from pglab.engine.sweep import run_sweep
    from pglab.store.sqlite import Store

    api, api_client = fake

    def log(job: str) -> str:
        if "-run-" not in job:
            return pod_log(job)
        applied = "work_mem|8192|kB|f|t\n" if "-t01-" in job else "work_mem|4096|kB|f|f\n"
        return results_log({"settings.txt": applied}, text="")

    api.default_log = log
    api.failing_jobs = {"mt-t02-run-0000-1"}
    plan, results = parse_plan(WHY, base_dir=tmp_path), tmp_path / "results"
    driver = driver_for(plan, WHY, tmp_path, results, Recorder(), api=api_client, poll_s=0.01, ready_timeout_s=5.0)
    result = run_sweep(driver, plan, WHY, tmp_path, results, Recorder())
    assert (result.ok, result.failed) == (0, 1), result.failures
    store = Store.open(results, create=False)
    (run_,) = store.runs()
    assert run_.reason is not None and run_.reason.startswith(
        "tenant t02 (bronze): parameter work_mem: the primary ran with 4096kB, not 8MB"), run_.reason
    store.close()


STORAGE = TENANTS_TARGET + """tenants:
  instances: 1
  arrangements:
    - name: alike
      tiers:
        - {name: all, tenants: 2}
    - name: io-tiers
      tiers:
        - {name: fast, tenants: 1, storage: {class: premium, size: 20Gi}, wal_storage: {class: premium, size: 4Gi}}
        - {name: slow, tenants: 1, storage: {class: throttled, size: 20Gi}, namespace: bench-slow}
        - {name: plain, tenants: 1}
storage: {profiles: [randread-8k], runtime: 2s, size: 64MiB, paths: [data, wal]}
run: {duration: 4s, warmup: 0s}
"""


def test_the_storage_phase_measures_each_tiers_class_once_before_the_first_arrangement_runs(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """Every storage class the tiers' volumes use, in any arrangement (data, and WAL where a tier has its own), is
    measured once by fio on a PVC of that class, where a tenant's primary on that class runs, in the namespace of
    the first tenant on it (a later arrangement's namespace made for it), before the first dataset is loaded; the
    rows are labelled by class and volume."""
    from pglab.drivers import driver_for
    from pglab.engine.sweep import run_sweep
    from pglab.store.sqlite import Store

    api, api_client = fake
    fio_files = {f.name: f.read_text() for f in FIO.iterdir()}
    api.default_log = lambda job: (results_log({**fio_files, "fio-version.txt": "fio-3.33\n"}, text="")
                                   if re.search(r"-fio-(data|wal)-\d+$", job) else pod_log(job))
    api.routes[:0] = [Route("GET", NS + "/persistentvolumeclaims",  # the first arrangement's Clusters' claims gone
                            lambda req: (200, {"kind": "PersistentVolumeClaimList", "apiVersion": "v1",
                                               "metadata": {}, "items": []}))]
    plan, results = parse_plan(STORAGE, base_dir=tmp_path), tmp_path / "results"
    driver = driver_for(plan, STORAGE, tmp_path, results, Recorder(), api=api_client, poll_s=0.01,
                        ready_timeout_s=5.0)
    result = run_sweep(driver, plan, STORAGE, tmp_path, results, Recorder())
    assert (result.ok, result.failed) == (2, 0), result.failures

    fio_jobs = {b["metadata"]["name"]: b for b in api.posted if b["kind"] == "Job" and "-fio-" in b["metadata"]["name"]}
    # the first arrangement's class, then the later one's new classes; the plain tier's class is measured once
    assert [(n, b["metadata"]["namespace"]) for n, b in fio_jobs.items()] == [
        ("mt-t01-fio-data-1", "bench"), ("mt-t01-fio-data-2", "bench"), ("mt-t01-fio-wal-3", "bench"),
        ("mt-t02-fio-data-4", "bench-slow")]
    claims = {b["metadata"]["name"]: b["spec"].get("storageClassName") for b in api.posted
              if b["kind"] == "PersistentVolumeClaim" and "-fio-" in b["metadata"]["name"]}
    assert claims == {"mt-t01-fio-data-1": "standard", "mt-t01-fio-data-2": "premium",
                      "mt-t01-fio-wal-3": "premium", "mt-t02-fio-data-4": "throttled"}
    for name, job in fio_jobs.items():  # on the node of the primary of a tenant on that class (the fake's node-1)
        terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}], name
    # every fio volume gone before the first dataset was loaded; bench-slow made once, for its fio, and deleted
    jobs = posted_jobs(api)
    assert jobs[:4] == list(fio_jobs) and jobs[4].endswith("-pgbench-init"), jobs
    first_load = api.requests.index(("POST", "/apis/batch/v1/namespaces/bench/jobs"), api.requests.index(
        ("DELETE", "/api/v1/namespaces/bench-slow/persistentvolumeclaims/mt-t02-fio-data-4")))
    for name, job in fio_jobs.items():
        ns = job["metadata"]["namespace"]
        assert api.requests.index(("DELETE", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}")) < first_load
    assert [b["metadata"]["name"] for b in api.posted if b["kind"] == "Namespace"] == ["bench", "bench-slow"]
    assert_all_deleted(api)

    store = Store.open(results, create=False)
    rows = store.fio_results(store.sweeps()[-1]["id"])
    assert sorted({r["label"] for r in rows}) == ["premium/data@node-1", "premium/wal@node-1",
                                                 "standard/data@node-1", "throttled/data@node-1"]
    iops = {json.loads((FIO / f"randread-8k-{qd}.json").read_text())["jobs"][0]["read"]["iops"]
            for qd in ("qd1", "qd32")}
    assert len(rows) == 8 and {r["iops"] for r in rows} == iops  # fio's own JSON, both jobs of each class's row
    assert rows[0]["path"] == "pvc/mt-t01-fio-data-1 (standard) on node node-1"
    assert store.storage_done(store.sweeps()[-1]["id"])
    store.close()


def test_a_failed_fio_of_a_tiers_class_fails_the_sweep_names_it_and_leaves_nothing(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """fio failing on the throttled class's volume (in the later arrangement's namespace) fails the sweep in one
    sentence naming the Job and the volume; its claim, the Clusters and both namespaces are deleted all the same."""
    from pglab.drivers import driver_for
    from pglab.engine.sweep import run_sweep

    api, api_client = fake
    fio_files = {f.name: f.read_text() for f in FIO.iterdir()}
    api.default_log = lambda job: (results_log({**fio_files, "fio-version.txt": "fio-3.33\n"}, text="")
                                   if re.search(r"-fio-(data|wal)-\d+$", job) else pod_log(job))
    api.failing_jobs.add("mt-t02-fio-data-4")
    api.logs["mt-t02-fio-data-4"] = results_log({}, text="fio: pid=7, err=28/file:filesetup.c:240, error=No space "
                                                "left on device\n")
    plan, results = parse_plan(STORAGE, base_dir=tmp_path), tmp_path / "results"
    driver = driver_for(plan, STORAGE, tmp_path, results, Recorder(), api=api_client, poll_s=0.01,
                        ready_timeout_s=5.0)
    with pytest.raises(Exception, match=r"fio failed in Job/mt-t02-fio-data-4 on the throttled/data@node-1 volume: "
                                        r".*No space left on device"):
        run_sweep(driver, plan, STORAGE, tmp_path, results, Recorder())
    assert not any(j.endswith("-pgbench-init") for j in posted_jobs(api))  # nothing loaded after the failure
    assert_all_deleted(api)
