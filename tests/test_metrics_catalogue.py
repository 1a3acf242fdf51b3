"""The metrics catalogue (pglab.metrics) is the one place the reports learn about a metric: every figure a run stores
has an entry, every report column that shows a stored figure is the catalogue's column for it, and the renderers
(terminal/markdown headers, CSV keys, export types, compare's verdict) agree with it about unit and direction.

What a run stores is collected from the code that stores it, never listed here: the local drivers' helpers, the
host's probes sampling this machine, a local lab run (its PostgreSQL probes: statistics, WAL, replication, waits),
and the Kubernetes driver's sources (CloudNativePG's exporter, the disk sampler, Prometheus' container CPU) fed the
texts the Kubernetes tests serve."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pglab import metrics
from pglab.analysis.compare import BETTER, FASTER, HIGHER, SLOWER, WORSE, difference
from pglab.probes.base import ProbeContext, Sampler
from pglab.probes.cpu import CpuProbe
from pglab.probes.disk import DiskProbe
from pglab.probes.memory import MemoryProbe
from pglab.report.export import table_frame
from pglab.report.scenarios import scenario_table
from pglab.report.tables import point_table, run_table
from pglab.report.tiers import host_table, tenant_table, tier_table
from pglab.store import Store
from pglab.store.sqlite import RunRow

EXAMPLES = {"{tier}": "gold", "{event}": "IO:WALSync", "{device}": "vda", "{standby}": "n1", "{figure}": "write_iops"}


def _example(name: str) -> str:
    for part, value in EXAMPLES.items():
        name = name.replace(part, value)
    return name


def _pgbench_names() -> set[str]:
    """What a driver makes of one pgbench run (its summary and its transaction log)."""
    from pglab.drivers.local import pgbench_metrics
    from pglab.workloads.pgbench import LogStats, PgbenchRun, PgbenchSummary

    run = PgbenchRun(PgbenchSummary(100.0, 1.0, 0.1, 2.0, 1000, 0, 10.0),
                     LogStats(1000, 1.0, {50: 1.0, 95: 2.0, 99: 3.0}, 9.0, 0.0, 10.0), [], 0.0, 10.0, [], 0)
    return set(pgbench_metrics(run))


def _limit_names() -> set[str]:
    from pglab.drivers.local import limit_metrics

    before = {g: {"usage_s": 0.0, "periods": 0.0, "throttled": 0.0} for g in ("n0", "client")}
    after = {g: {"usage_s": 5.0, "periods": 100.0, "throttled": 10.0} for g in ("n0", "client")}
    return set(limit_metrics({"applied": True, "n0": {"cpus": 2}, "client": {"cpus": 1}}, before, after, 10.0))


def _io_names() -> set[str]:
    """Each instance's I/O from its cgroup (cgroup v2 with PSI adds the stall time), and the flag without groups."""
    from pglab.drivers.local import io_metrics

    zero = {"read_ios": 0.0, "write_ios": 0.0, "read_bytes": 0.0, "write_bytes": 0.0, "io_stall_s": 0.0}
    one = {k: 1.0 for k in zero}
    figures, _ = io_metrics({"n0": zero, "n1": zero}, {"n0": one, "n1": one}, (0.0, 10.0))
    return set(figures) | set(io_metrics({}, {}, (0.0, 10.0), problem="no cgroups")[0])


def _tier_names() -> set[str]:
    from pglab.drivers.tenants import tier_metrics
    from pglab.plan.schema import Tier

    member: dict[str, float | None] = {
        "tps": 10.0, "latency_avg_ms": 1.0, "latency_p95_ms": 2.0, "latency_p99_ms": 3.0, "total_iops": 5.0,
        "cpu_cores": 0.5, "memory_per_instance_mb": 64.0}
    return set(tier_metrics(Tier(name="gold", tenants=2), [member, {**member, "tps": 12.0}]))


def _host_probe_names(tmp_path: Path) -> set[str]:
    """The host's own probes, sampling this machine for two seconds (the PostgreSQL probes need a server)."""
    ctx = ProbeContext("", paths={"data": tmp_path})
    sampler = Sampler([CpuProbe(ctx), DiskProbe(ctx), MemoryProbe(ctx)])
    start = time.time()
    sampler.start()
    time.sleep(2.5)
    sampler.stop()
    assert not sampler.errors
    return set(sampler.summarize(start, time.time()))


LAB_PLAN = """
name: catalogue
target: {local: {instances: 2, synchronous: {method: any, number: 1}}}
postgres: {parameters: {shared_preload_libraries: pg_stat_statements}}
dataset: {scale: 1}
matrix: {workload: [tpcb-like], clients: [2]}
run: {duration: 3s, warmup: 1s}
"""


def _lab_names(folder: Path) -> set[str]:
    """What a local lab run of a primary and a synchronous standby stores: every probe (PostgreSQL's statistics and
    WAL, replication, waits, the host's) and the driver's own figures."""
    from conftest import run_plan, write_plan
    from helpers import stored_runs

    results = folder / "results"
    run_plan(write_plan(folder / "plan.yaml", LAB_PLAN), results)
    runs: list[RunRow] = stored_runs(results)
    assert [r.status for r in runs] == ["ok"]
    return set(runs[0].metrics)


def _k8s_exporter_names() -> set[str]:
    """What the Kubernetes driver makes of CloudNativePG's exporter (tests/k8s_fake's text, PostgreSQL 16 and 17
    shapes, a standby streaming, the WAL archiver on): exporter.summarize over four scrapes of the primary."""
    from k8s_fake.texts import exporter_text
    from pglab.targets.kubernetes import exporter

    names: set[str] = set()
    for pg17 in (False, True):
        scrapes = []
        for i in range(4):
            grown: dict[str, float | None] = {
                k: 1000.0 * (i + 1) for k in ("xact_commit", "xact_rollback", "blks_read", "blks_hit",
                                              "wal_bytes", "checkpoints_timed", "checkpoints_req",
                                              "buffers_checkpoint", "wal_records", "wal_fpi", "buffers_backend",
                                              "buffers_backend_fsync", "buffers_clean")}
            lags = {"replay_diff_bytes": 8192.0, "replay_lag_seconds": 0.002, "write_lag_seconds": 0.001,
                    "flush_lag_seconds": 0.001}
            text = exporter_text("pg-1", grown, standbys={"pg-2": lags}, pg17=pg17) + (
                f"cnpg_pg_stat_archiver_archived_count {i}\ncnpg_pg_stat_archiver_failed_count 0\n"
                f'cnpg_collector_pg_wal{{value="size"}} {i * 16 << 20}\n'
                f'cnpg_collector_pg_wal_archive_status{{value="ready"}} {i % 2}\n')
            scrapes.append(exporter.Scrape("pg-1", float(i), text, values=exporter.parse(text)))
        names |= set(exporter.summarize(scrapes, "pg-1", (0.0, 3.0), "app").metrics)
    return names


def _k8s_disk_names() -> set[str]:
    """The disk sampler's log (tests/k8s_fake's text) of the primary's node: disks.summarize's figures."""
    from k8s_fake.texts import sampler_log
    from pglab.targets.kubernetes import disks

    blocks = disks.parse_log(sampler_log("node-a", [(float(i), {"vdb": [
        10 * i, 0, 80 * i, 5 * i, 20 * i, 0, 160 * i, 9 * i, 0, 12 * i, 14 * i, 0, 0, 0, 0, 2 * i, i]})
        for i in range(4)]))
    return set(disks.summarize({"node-a": blocks}, {"pg-1": "node-a"}, "pg-1", (0.0, 3.0)).metrics)


def _k8s_cpu_names() -> set[str]:
    """Container CPU from Prometheus (cAdvisor's counters of the instances' and the load pods' containers, one sample
    a second, the primary throttled in some periods): prometheus.container_cpu's figures."""
    from pglab.plan.schema import PrometheusSource
    from pglab.targets.kubernetes import prometheus

    cfg = PrometheusSource(url="http://prometheus:9090")
    containers = {("pg-1", "postgres"), ("pg-2", "postgres"), ("pg-run-0000-1-x", "main")}

    class Answers:  # what Prometheus answers the range queries container_cpu asks
        def __init__(self) -> None:
            self.cfg = cfg

        def matchers(self, **labels: str) -> str:
            return ""

        def samples(self, selector: str, stamps: str, by: tuple[str, ...] | None, start: float, end: float,
                    step: float) -> prometheus.Series:
            return {frozenset({"__name__": selector, cfg.pod_label: pod, cfg.container_label: c}.items()):
                    [(float(t), 0.5 * t * (1 + math.log1p(t))) for t in range(5)] for pod, c in containers}

    cpu, _ = prometheus.container_cpu(Answers(), "bench", {  # type: ignore[arg-type]
        "server": ("pg-1|pg-2", "postgres"), "client": ("pg-run-0000-1-.+", "main")}, "pg-1",
        prometheus.Window(0.0, 4.0, 1.0))
    return set(cpu.metrics)


@pytest.fixture(scope="module")
def k8s_stored() -> set[str]:
    return _k8s_exporter_names() | _k8s_disk_names() | _k8s_cpu_names()


@pytest.fixture(scope="module")
def lab_stored(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return _lab_names(tmp_path_factory.mktemp("lab"))


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory, k8s_stored: set[str], lab_stored: set[str]) -> set[str]:
    return (_pgbench_names() | _limit_names() | _io_names() | _tier_names()
            | _host_probe_names(tmp_path_factory.mktemp("probes")) | k8s_stored | lab_stored)


def test_the_collected_names_cover_every_source(k8s_stored: set[str], lab_stored: set[str]) -> None:
    """The collectors above reach what they claim: each source's own figures are among the names (a collector that
    silently stopped finding them would make the next test vacuous)."""
    assert {"commits_s", "cache_hit_pct", "wal_records", "wal_bytes_per_commit", "buffers_backend",
            "replay_lag_max_ms", "active_backends_mean", "checkpoints_timed"} <= lab_stored
    assert any(n.startswith("repl.") for n in lab_stored) and any(n.startswith("wait.") for n in lab_stored)
    assert {"commits_s", "wal_mb_s", "wal_fpi_per_commit", "buffers_clean", "replay_lag_max_ms",
            "archived_wal_segments", "pg_wal_growth_mb", "write_iops", "read_latency_ms", "primary_cpu_cores",
            "server_cpu_cores", "client_cgroup_cpu_cores", "cpu_throttled_pct"} <= k8s_stored
    assert any(n.startswith("disk.") for n in k8s_stored) and any(n.startswith("repl.pg-2.") for n in k8s_stored)


def test_every_metric_a_run_stores_is_catalogued(stored: set[str]) -> None:
    assert {"tps", "latency_p99_ms", "limit_cpus", "tier.gold.tps_spread_pct", "cpu_pct", "write_iops",
            "primary_write_iops", "standby_io_pressure_pct", "io_per_instance"} <= stored
    missing = sorted(n for n in stored if metrics.get(n) is None)
    assert missing == [], f"stored but not in pglab.metrics: {missing}"


def test_catalogue_names_and_columns_are_unique() -> None:
    names = [m.name for m in metrics.METRICS]
    assert len(names) == len(set(names))
    for table in metrics.TABLES:
        keys = metrics.keys(table)
        assert len(keys) == len(set(keys)), table
    decimals: dict[str, set[int]] = {}
    for table in metrics.TABLES:
        for s in metrics.columns(table):
            decimals.setdefault(s.key, set()).add(s.metric.decimals)
    assert {k: v for k, v in decimals.items() if len(v) > 1} == {}  # a key reads the same in every table


def _tracers(names: list[str]) -> dict[str, float]:
    """A value per stored name that no other name has, also summed over two runs (odd) or cut to a whole number
    (even)."""
    return {n: 1000.0 + 10 * i + 0.5 for i, n in enumerate(names)}


def _build(root: Path, names: list[str], tracer: dict[str, float]) -> Store:
    store = Store.open(root)
    values: dict[str, float | None] = {n: tracer[n] for n in names}
    tenant_rows = [(t, "gold", n, v) for t in ("t01", "t02") for n, v in values.items() if "." not in n]
    plans = {"matrix": [{"workload": "tpcb-like", "synchronous_commit": "on", "clients": 4}],
             "scenario": [{"workload": "tpcb-like", "synchronous_commit": "on", "clients": 4,
                           "scenario": "failover-node"}],
             "tenants": [{"arrangement": "noqos", "clients": 1}]}
    for name, axes in plans.items():
        sweep = store.begin_sweep(name, f"name: {name}\n", "h", "0")
        ids = store.add_points(sweep, [(i, f"k{i}", a) for i, a in enumerate(axes)])
        for rep in (1, 2):
            run_id, _ = store.start_run(sweep, ids["k0"], 0, rep)
            store.finish_run(run_id, "ok", window=(100.0 * rep, 100.0 * rep + 10), metrics=values,
                             tenants=tenant_rows if name == "tenants" else ())
        store.end_sweep(sweep, "done")
    return store


def test_a_report_column_showing_a_stored_metric_is_the_catalogues(tmp_path: Path, stored: set[str]) -> None:
    """Every run stores every metric, each with its own value; whichever table cell shows one of those values (or
    the sum over the two repeats) must sit in the catalogue's column for that metric. A column added to a table
    beside the catalogue fails here."""
    names = sorted(stored | {_example(m.name) for m in metrics.METRICS})
    tracer = _tracers(names)
    by_value: dict[float, set[str]] = {}
    for n, v in tracer.items():
        by_value.setdefault(v, set()).add(n)
        by_value.setdefault(2 * v, set()).add(n)
        by_value.setdefault(float(int(v)), set()).add(n)  # a count shown whole (host: tenants, instances)
    store = _build(tmp_path / "r", names, tracer)
    sweeps = {s["plan_name"]: s["id"] for s in store.sweeps()}
    tables: dict[str, tuple[list[str], list[dict[str, Any]]]] = {
        "points": point_table(store, sweeps["matrix"]), "runs": run_table(store, sweeps["matrix"]),
        "scenarios": scenario_table(store, sweeps["scenario"]), "tiers": tier_table(store, sweeps["tenants"]),
        "host": host_table(store, sweeps["tenants"]), "tenants": tenant_table(store, sweeps["tenants"])}
    store.close()
    seen = 0
    for table, (columns, rows) in tables.items():
        assert rows, table
        catalogued = {s.key: _example(s.metric.name) for s in metrics.columns(table)}
        for column in columns:
            cells = [r.get(column) for r in rows]
            shows = set().union(*(by_value.get(float(v), set()) for v in cells
                                  if isinstance(v, int | float) and not isinstance(v, bool)))
            if not shows:
                continue
            seen += 1
            assert column in catalogued, f"{table}.{column} shows {sorted(shows)} without a catalogue entry"
            assert catalogued[column] in shows, f"{table}.{column} shows {sorted(shows)}, not {catalogued[column]}"
        # and the other way: every catalogue column of the table is there, showing its metric
        assert [c for c in columns if c in catalogued] == list(catalogued), table
    assert seen == sum(len(metrics.columns(t)) for t in tables)


UNIT_WORDS = {"ms": "ms", "s": "s", "%": "%", "MB/s": "MB/s", "B": "B", "MB": "MB", "IOPS": "IOPS", "tx/s": "TPS",
              "cores": "cores"}
SUFFIXES = (("_mb_s", "MB/s"), ("_ms", "ms"), ("_pct", "%"), ("_bytes", "B"), ("_mb", "MB"), ("_s", "s"))


def test_headers_and_keys_name_the_catalogues_unit() -> None:
    """The terminal/markdown header and the CSV/JSON key of a column say the same unit as its metric."""
    words = {w.upper(): w for w in UNIT_WORDS.values()}
    for table in (*metrics.TABLES, *metrics.VIEWS):
        for s in metrics.columns(table):
            unit = UNIT_WORDS.get(s.metric.unit)
            for word in s.header.replace("/", " / ").replace("MB / s", "MB/s").split():
                if word.upper() in words:
                    assert unit is not None and word.upper() == unit.upper(), (table, s.key, s.header, s.metric.unit)
            suffix = next((u for sfx, u in SUFFIXES if s.key.endswith(sfx)), None)
            if suffix is not None and not s.key.endswith("_per_instance"):
                assert suffix == s.metric.unit, (table, s.key, s.metric.unit)
    for m in metrics.METRICS:  # suffixes that cannot mean anything else
        for sfx, unit in (("_ms", "ms"), ("_pct", "%"), ("_bytes", "B"), ("_mb_s", "MB/s")):
            if m.name.endswith(sfx):
                assert m.unit == unit, (m.name, m.unit)


def test_a_view_picks_figures_its_table_has() -> None:
    """The compact terminal table, the HTML charts and runs table read the points or runs table's rows, compare the
    runs' stored metrics: a view naming anything else would show an empty column or chart."""
    points, runs = set(metrics.keys("points")), set(metrics.keys("runs"))
    compact = metrics.columns("compact")
    assert {s.key for s in compact} <= points and {s.key for s in compact if s.column.per_run} <= runs
    assert set(metrics.keys("chart")) | set(metrics.keys("durability-chart")) <= points
    assert set(metrics.keys("html-runs")) <= runs and set(metrics.keys("tier-chart")) <= set(metrics.keys("tiers"))
    assert set(metrics.keys("compare")) <= {m.name for m in metrics.METRICS}
    assert {s.metric.name for s in metrics.columns("durability")} <= points  # read from the points' rows
    assert all(metrics.keys(v) for v in metrics.VIEWS)
    for table in metrics.TABLES:  # the view-only fields mean nothing in a table
        assert all(s.column.at == 0 and not (s.column.optional or s.column.interval) for s in metrics.columns(table))


def test_compare_takes_its_direction_from_the_catalogue() -> None:
    """B clearly above A: better, worse or just higher, as the catalogue says — for every metric a report shows
    (acked writes lost or an RTO going up is worse, whatever their names suggest); throughput and latency say it
    as faster or slower."""
    a, b = [10.0, 10.1, 9.9], [20.0, 20.1, 19.9]
    shown = {m for t in metrics.TABLES for m in (s.metric for s in metrics.columns(t))}
    for m in shown:
        d = difference(_example(m.name), a, b)
        assert d is not None
        speed = m.name.rsplit(".", 1)[-1].startswith("tps") or "latency" in m.name
        up_is = (SLOWER, FASTER) if speed else (WORSE, BETTER)
        expected = HIGHER if m.lower_is_better is None else up_is[0] if m.lower_is_better else up_is[1]
        assert d.verdict == expected, (m.name, d.verdict)
    assert difference("acked_lost", a, b).verdict == WORSE  # type: ignore[union-attr]
    assert difference("latency_p99_ms", a, b).verdict == SLOWER  # type: ignore[union-attr]


def test_export_types_every_catalogued_column_as_a_number_even_when_empty() -> None:
    for table in ("points", "runs"):
        keys = list(metrics.keys(table))
        frame = table_frame(keys, [])
        assert {k: frame.schema[k] for k in keys} == {k: pl.Float64 for k in keys}, table


def test_combine_says_how_runs_make_one_figure() -> None:
    assert metrics.combine("median", [3.0, None, 1.0, 2.0]) == 2.0
    assert metrics.combine("sum", [1.0, 2.0]) == 3.0 and metrics.combine("max", [1.0, 4.0]) == 4.0
    assert metrics.combine("mean", [1.0, 2.0]) == 1.5 and metrics.combine("sum", [None]) is None
    with pytest.raises(ValueError):
        metrics.combine("value", [1.0, 2.0])
