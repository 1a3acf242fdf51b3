"""Report tables from a store built through the real Store API, checked against hand-computed values."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from conftest import pglab
from helpers import tps_store
from pglab import metrics
from pglab.analysis.compare import compare_stores
from pglab.report.tables import compare_view, durability_headers, durability_table, point_table
from pglab.store import Store


def test_mean_ci_cv_and_unstable_flag(tmp_path: Path) -> None:
    results = tps_store(tmp_path / "r", {("tpcb-like", "local", 4): [100.0, 110.0],
                                         ("tpcb-like", "on", 4): [90.0, 90.5]})
    store = Store.open(results, create=False)
    _, rows = point_table(store)
    local, on = rows
    sd = math.sqrt(((100 - 105) ** 2 + (110 - 105) ** 2) / 1)
    assert local["tps"] == 105.0 and local["repeats"] == 2
    assert local["tps_ci95"] == pytest.approx(12.706204736 * sd / math.sqrt(2), rel=1e-9)  # t(0.975, 1 df)
    assert local["tps_cv_pct"] == pytest.approx(sd / 105 * 100)
    assert local["unstable"] is True  # 6.7 % > 5 %
    assert on["unstable"] is False  # 0.4 %


def test_price_of_durability_against_local(tmp_path: Path) -> None:
    results = tps_store(tmp_path / "r", {
        ("tpcb-like", "local", 1): [200.0], ("tpcb-like", "on", 1): [150.0], ("tpcb-like", "remote_apply", 1): [100.0],
        ("tpcb-like", "local", 8): [800.0], ("tpcb-like", "on", 8): [720.0], ("tpcb-like", "remote_apply", 8): [600.0],
    })
    store = Store.open(results, create=False)
    columns, rows = durability_table(store)
    assert [(r["workload"], r["clients"]) for r in rows] == [("tpcb-like", 1), ("tpcb-like", 8)]
    assert rows[0]["base"] == "local"
    assert rows[0]["on_tps_vs_base_pct"] == pytest.approx(-25.0)
    assert rows[0]["remote_apply_tps_vs_base_pct"] == pytest.approx(-50.0)
    assert rows[1]["on_tps_vs_base_pct"] == pytest.approx(-10.0)
    assert rows[1]["remote_apply_latency_vs_base_pct"] == pytest.approx((1000 / 600 - 1000 / 800) / (1000 / 800) * 100)
    assert "local_tps_vs_base_pct" not in columns
    text = pglab("report", str(results), check=True).stdout
    assert "price of durability" in text and "-25.0 %" in text
    listed = list(csv.DictReader(io.StringIO(
        pglab("report", str(results), "--format", "csv", "--table", "durability", check=True).stdout)))
    assert float(listed[1]["on_tps_vs_base_pct"]) == pytest.approx(-10.0)


def test_off_is_the_base_when_measured(tmp_path: Path) -> None:
    results = tps_store(tmp_path / "r", {("select-only", "off", 1): [1000.0], ("select-only", "local", 1): [900.0]})
    _, rows = durability_table(Store.open(results, create=False))
    assert rows[0]["base"] == "off" and rows[0]["local_tps_vs_base_pct"] == pytest.approx(-10.0)


def test_the_durability_columns_are_the_catalogues_view(tmp_path: Path) -> None:
    """Each figure of the catalogue's durability view gives every level its column and every level but the base its
    Δ, interval and verdict, titled from the catalogue's header: a new figure there is a new column here."""
    results = tps_store(tmp_path / "r", {("tpcb-like", "off", 1): [200.0, 210.0], ("tpcb-like", "on", 1): [150.0]})
    columns, _ = durability_table(Store.open(results, create=False))
    view = metrics.columns("durability")
    assert [s.metric.name for s in view][:2] == ["tps", "latency_avg_ms"]
    derived = [*(f"{lv}_{s.metric.name}" for lv in ("off", "on") for s in view),
               *(f"on_{s.key}_{x}" for s in view for x in ("vs_base_pct", "ci95_low_pct", "ci95_high_pct", "verdict"))]
    assert sorted(c for c in columns if c.startswith(("off_", "on_"))) == sorted(derived)
    titles = durability_headers(columns)
    assert titles["on_latency_avg_ms"] == "on lat ms" and titles["on_latency_vs_base_pct"] == "on Δ lat"
    assert all(titles[f"on_{s.key}_verdict"] == f"on {s.short} verdict" for s in view)


def test_compare_view_shows_every_figure_of_the_catalogues_compare_view(tmp_path: Path) -> None:
    """`pglab compare`'s terminal columns come from the catalogue: the first figure's A, B, Δ and verdict, the
    others' Δ and verdict, each a column compare_runs gives, each titled."""
    a = tps_store(tmp_path / "a", {("tpcb-like", "on", 4): [100.0, 101.0]})
    b = tps_store(tmp_path / "b", {("tpcb-like", "on", 4): [120.0, 121.0]})
    columns, _ = compare_stores(Store.open(a, create=False), Store.open(b, create=False))
    shown, headers, optional = compare_view()
    assert set(shown) <= set(columns) and set(shown) <= set(headers) and set(optional) - {"jobs", "flags"} <= set(shown)
    assert [c for c in shown if c.endswith("_delta_pct")] == [f"{k}_delta_pct" for k in metrics.keys("compare")]
    assert headers["tps_a"] == "A tps" and headers["latency_avg_ms_delta_pct"] == "Δ lat % [95 %]"


def test_one_level_has_no_durability_table(tmp_path: Path) -> None:
    results = tps_store(tmp_path / "r", {("select-only", "on", 1): [1000.0], ("select-only", "on", 2): [1900.0]})
    assert durability_table(Store.open(results, create=False)) == ([], [])
    assert "price of durability" not in pglab("report", str(results), check=True).stdout


def test_compare_two_folders_from_the_cli(tmp_path: Path) -> None:
    a = tps_store(tmp_path / "a", {("tpcb-like", "on", 4): [100.0, 101.0, 99.0],
                                   ("tpcb-like", "on", 8): [200.0, 190.0]})
    b = tps_store(tmp_path / "b", {("tpcb-like", "on", 4): [120.0, 121.0, 119.0],
                                   ("tpcb-like", "on", 8): [195.0, 205.0]})
    text = pglab("compare", str(a), str(b), check=True).stdout
    assert "faster" in text and "no significant difference" in text
    rows = list(csv.DictReader(io.StringIO(pglab("compare", str(a), str(b), "--format", "csv", check=True).stdout)))
    assert [r["tps_verdict"] for r in rows] == ["faster", "no significant difference"]
    assert float(rows[0]["tps_delta_pct"]) == pytest.approx(20.0)
    within = pglab("compare", str(a), "--axis", "clients", "--a", "4", "--b", "8", "--format", "json", check=True)
    assert '"tps_verdict": "faster"' in within.stdout
    bad = pglab("compare", str(a))
    assert bad.returncode == 2 and "give two results folders" in bad.stderr


def test_cost_per_tps_and_cheaper_per_tps(tmp_path: Path) -> None:
    a = tps_store(tmp_path / "a", {("tpcb-like", "on", 4): [400.0, 420.0], ("tpcb-like", "on", 8): [500.0, 520.0],
                                ("select-only", "on", 8): [10000.0]},
               "name: t\ncost: {monthly: 1000, breakdown: {compute: 700, storage: 300}}\n")
    b = tps_store(tmp_path / "b", {("tpcb-like", "on", 4): [900.0], ("tpcb-like", "on", 8): [1200.0]},
               "name: t\ncost: {monthly: 900}\n")
    from pglab.analysis.cost import cost_table

    _, rows = cost_table(Store.open(a, create=False))
    tpcb = next(r for r in rows if r["workload"] == "tpcb-like")
    assert tpcb["peak_tps"] == 510.0 and tpcb["at_clients"] == 8
    assert tpcb["per_tps"] == pytest.approx(1000 / 510)
    assert "cost at peak TPS" in pglab("report", str(a), check=True).stdout
    text = pglab("compare", str(a), str(b), check=True).stdout
    cheaper = (1 - (900 / 1200) / (1000 / 510)) * 100
    assert f"{cheaper:.1f} % cheaper per TPS" in text
    assert "select-only: B" not in text  # only on one side


def test_cost_breakdown_must_add_up() -> None:
    from pglab.errors import PlanError
    from pglab.plan import parse_plan

    with pytest.raises(PlanError) as info:
        parse_plan("name: t\ncost: {monthly: 100, breakdown: {compute: 50}}\n")
    assert info.value.problems == ["cost: breakdown adds up to 50, not to monthly (100)"]


def test_uplift_of_a_configuration_axis_in_report_and_compare(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "r")
    sweep = store.begin_sweep("t", "name: t\n", "h", "0")
    tps = {("off", 4): [100.0, 102.0, 98.0], ("lz4", 4): [150.0, 153.0, 147.0]}
    points = [(i, f"k{i}", {"workload": "tpcb-like", "synchronous_commit": "on", "clients": c, "jobs": 1,
                            "parameters.wal_compression": v}) for i, (v, c) in enumerate(tps)]
    ids = store.add_points(sweep, points)
    for (i, key, _), values in zip(points, tps.values(), strict=True):
        for rep, value in enumerate(values, 1):
            run_id, _ = store.start_run(sweep, ids[key], i, rep)
            store.finish_run(run_id, "ok", metrics={"tps": value})
    store.end_sweep(sweep, "done")
    store.close()
    results = tmp_path / "r"
    text = pglab("report", str(results), check=True).stdout
    assert "uplift: parameters.wal_compression=lz4 vs parameters.wal_compression=off" in text
    assert "+50.0 %" in text and "faster" in text
    rows = list(csv.DictReader(io.StringIO(
        pglab("report", str(results), "--format", "csv", "--table", "uplift", check=True).stdout)))
    assert len(rows) == 1 and float(rows[0]["uplift_pct"]) == pytest.approx(50.0)
    assert float(rows[0]["a"]) == pytest.approx(100.0) and rows[0]["verdict"] == "faster"
    same = pglab("compare", str(results), "--axis", "parameters.wal_compression", "--a", "off", "--b", "lz4",
                 "--uplift", "--format", "json", check=True).stdout
    assert '"uplift_pct": 50.0' in same.replace("50.00000000000001", "50.0")


def test_scenario_table_aggregates_every_trial_of_a_level(tmp_path: Path) -> None:
    """Trials of one scenario × level form one row: ok runs counted as trials, failed ones apart, RTO median and
    maximum, acknowledged losses summed (and called a finding). The live failover test runs one trial per level;
    the arithmetic over several is checked here on hand-made runs."""
    from pglab.report.scenarios import loud_findings, scenario_table

    store = Store.open(tmp_path / "r")
    sweep = store.begin_sweep("t", "name: t\n", "h", "0")
    axes = {level: {"workload": "tpcb-like", "clients": 2, "jobs": 1, "synchronous_commit": level,
                    "scenario": "failover-node"} for level in ("on", "off")}
    ids = store.add_points(sweep, [(0, "on", axes["on"]), (1, "off", axes["off"])])
    trials = {"off": [(20.5, 3.0), (24.0, 1.0), (21.0, 0.0)], "on": [(20.1, 0.0), (22.3, 2.0)]}
    for i, level in enumerate(("on", "off")):
        for rep, (rto, lost) in enumerate(trials[level], 1):
            run_id, _ = store.start_run(sweep, ids[level], i, rep)
            store.finish_run(run_id, "ok", metrics={"rto_s": rto, "acked_lost": lost, "witness_acked": 50.0,
                                                    "tps_before": 100.0 * rep, "tps_during": 0.0})
    run_id, _ = store.start_run(sweep, ids["on"], 0, 3)
    store.finish_run(run_id, "failed", reason="n1 not running", metrics={"rto_s": 99.0, "acked_lost": 7.0})
    store.end_sweep(sweep, "done")
    store.close()

    _, rows = scenario_table(Store.open(tmp_path / "r", create=False))
    by_level = {r["synchronous_commit"]: r for r in rows}
    assert [r["synchronous_commit"] for r in rows] == ["off", "on"]  # in durability order
    off, on = by_level["off"], by_level["on"]
    assert (off["trials"], off["failed_runs"], on["trials"], on["failed_runs"]) == (3, 0, 2, 1)
    assert off["rto_p50_s"] == 21.0 and off["rto_max_s"] == 24.0
    assert on["rto_p50_s"] == pytest.approx(21.2) and on["rto_max_s"] == 22.3  # the failed run's 99 s left out
    assert (off["acked_lost_total"], off["acked_lost_max"]) == (4.0, 3.0)
    assert (on["acked_lost_total"], on["acked_lost_max"]) == (2.0, 2.0)
    assert off["tps_before"] == 200.0 and on["tps_before"] == 150.0  # medians over the ok trials
    assert off["finding"] == "4 acknowledged write(s) lost (allowed at off)"
    assert on["finding"] == "LOST 2 acknowledged write(s) under synchronous_commit=on"
    assert loud_findings(rows) == ["FINDING: failover-node, tpcb-like at 2 clients: LOST 2 acknowledged write(s) "
                                   "under synchronous_commit=on"]
    listed = {r["synchronous_commit"]: r for r in json.loads(
        pglab("report", str(tmp_path / "r"), "--table", "scenarios", "--format", "json", check=True).stdout)}
    assert listed["on"]["trials"] == 2 and listed["on"]["acked_lost_total"] == 2
    assert listed["off"]["trials"] == 3 and listed["off"]["rto_max_s"] == 24.0


def test_a_folder_of_the_current_schema_reopens_and_reports(tmp_path: Path) -> None:
    """Written by this pglab, closed, opened again: same schema version, same figures, nothing migrated twice."""
    import sqlite3

    from pglab.store.sqlite import SCHEMA_VERSION

    results = tps_store(tmp_path / "r", {("tpcb-like", "on", 4): [100.0, 110.0]})
    db = sqlite3.connect(results / "results.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()
    store = Store.open(results, create=False)
    _, rows = point_table(store)
    store.close()
    assert rows[0]["tps"] == 105.0 and rows[0]["repeats"] == 2
    listed = json.loads(pglab("report", str(results), "--format", "json", check=True).stdout)
    assert [r["tps"] for r in listed] == [105.0]


def test_a_folder_of_schema_1_is_migrated_and_reports(tmp_path: Path) -> None:
    """A folder an older pglab wrote (schema 1: no fio, no tenants tables) opens: the later migrations are applied
    in order and its runs report as they were stored."""
    import sqlite3

    from pglab.store.sqlite import MIGRATIONS, SCHEMA_VERSION, _statements

    results = tmp_path / "old"
    (results / "runs").mkdir(parents=True)
    db = sqlite3.connect(results / "results.db")
    for stmt in _statements(MIGRATIONS[1]):
        db.execute(stmt)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO sweeps (id, plan_name, plan_text, plan_hash, pglab_version, started, status) "
               "VALUES (1, 'old', 'name: old\n', 'h', '0.1', 1.0, 'done')")
    db.execute("INSERT INTO points (id, sweep_id, idx, key, axes) VALUES (1, 1, 0, 'k0', ?)",
               (json.dumps({"workload": "tpcb-like", "synchronous_commit": "on", "clients": 4}),))
    for rep, tps in ((1, 200.0), (2, 220.0)):
        db.execute("INSERT INTO runs (id, sweep_id, point_id, repeat, status, started, dir) "
                   "VALUES (?, 1, 1, ?, 'ok', 1.0, ?)", (f"r{rep}", rep, f"runs/r{rep}"))
        db.execute("INSERT INTO run_metrics (run_id, name, value) VALUES (?, 'tps', ?)", (f"r{rep}", tps))
    db.commit()
    db.close()

    store = Store.open(results, create=False)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.fio_results(1) == [] and store.tenant_metrics("r1") == {}  # the later tables exist, empty
    _, rows = point_table(store)
    store.close()
    assert rows[0]["tps"] == 210.0 and rows[0]["repeats"] == 2
    text = pglab("report", str(results), check=True).stdout
    assert "210.0" in text and "tpcb-like" in text
