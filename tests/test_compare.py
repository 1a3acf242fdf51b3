"""pglab compare on synthetic result folders built through the real Store API, against hand-computed figures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from helpers import make_store, tps_runs
from pglab.analysis.compare import (
    Difference,
    compare_runs,
    compare_stores,
    compare_within,
    difference,
    uplift_rows,
    uplift_tables,
)
from pglab.errors import UserError
from pglab.report.tables import render
from pglab.store.sqlite import Store


def axes(clients: int, sc: str | bool = "on", **extra: Any) -> dict[str, Any]:
    return {"workload": "tpcb", "synchronous_commit": sc, "clients": clients, "jobs": 1, **extra}


def fieller_by_hand(a: list[float], b: list[float]) -> tuple[float, float]:
    """The textbook form of Fieller's interval for mean(b) / mean(a), t with Welch's df, as % change."""
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    sa2 = sum((x - ma) ** 2 for x in a) / (na - 1) / na
    sb2 = sum((x - mb) ** 2 for x in b) / (nb - 1) / nb
    df = (sa2 + sb2) ** 2 / (sa2 ** 2 / (na - 1) + sb2 ** 2 / (nb - 1))
    t = stats.t.ppf(0.975, df)
    g, r = t * t * sa2 / ma ** 2, mb / ma
    half = t / ma * math.sqrt(sb2 * (1 - g) + r * r * sa2)
    return ((r - half) / (1 - g) - 1) * 100, ((r + half) / (1 - g) - 1) * 100


def test_clear_difference(tmp_path: Path) -> None:
    a = make_store(tmp_path / "a", [(axes(8), tps_runs(100, 101, 99))])
    b = make_store(tmp_path / "b", [(axes(8), tps_runs(120, 121, 119))])
    columns, rows = compare_stores(a, b, metrics=("tps",))
    assert len(rows) == 1
    row = rows[0]
    assert row["clients"] == 8 and row["synchronous_commit"] == "on"
    assert row["runs_a"] == 3 and row["runs_b"] == 3
    assert row["tps_a"] == pytest.approx(100) and row["tps_b"] == pytest.approx(120)
    assert row["tps_delta_pct"] == pytest.approx(20.0)
    # by hand: both variances are 1, s²/n = 1/3 a side, df = 4, t = t(0.975, 4) = 2.7764; Fieller: the ρ with
    # (120 − 100ρ)² = t²·(1/3 + ρ²/3), i.e. (10000 − t²/3)ρ² − 24000ρ + (14400 − t²/3) = 0
    t = 2.7764451051977987
    assert stats.t.ppf(0.975, 4) == pytest.approx(t)
    qa, qc = 10000 - t * t / 3, 14400 - t * t / 3
    roots = sorted((24000 - s * math.sqrt(24000 ** 2 - 4 * qa * qc)) / (2 * qa) for s in (1, -1))
    assert row["tps_ci95_low_pct"] == pytest.approx((roots[0] - 1) * 100)
    assert row["tps_ci95_high_pct"] == pytest.approx((roots[1] - 1) * 100)
    assert row["tps_ci95_low_pct"] == pytest.approx(17.526, abs=1e-3)
    assert row["tps_ci95_high_pct"] == pytest.approx(22.535, abs=1e-3)
    assert row["tps_ci95_low_pct"] > 0
    assert row["tps_verdict"] == "faster"
    assert row["tps_p_value"] == pytest.approx(stats.ttest_ind([120, 121, 119], [100, 101, 99], equal_var=False).pvalue)
    assert row["tps_p_value"] < 0.001
    for fmt in ("csv", "json", "markdown", "table"):
        text = render(columns, rows, fmt)
        assert "faster" in text
    # B against A the other way round is slower by the same amount in absolute terms
    _, back = compare_stores(b, a, metrics=("tps",))
    assert back[0]["tps_verdict"] == "slower"
    assert back[0]["tps_delta_pct"] == pytest.approx(-100 / 6)


def test_unequal_variances_match_hand_welch() -> None:
    a, b = [10.0, 12.0, 11.0, 15.0], [13.0, 13.5, 14.0]
    d = difference("tps", a, b)
    assert isinstance(d, Difference)
    assert d.a_n == 4 and d.b_n == 3
    assert d.ci95_pct == pytest.approx(fieller_by_hand(a, b))
    assert d.ci95 == pytest.approx(tuple(stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)))
    assert d.p_value == pytest.approx(stats.ttest_ind(b, a, equal_var=False).pvalue)
    assert d.verdict == "no significant difference"  # the interval straddles 0


def test_no_significant_difference(tmp_path: Path) -> None:
    a = make_store(tmp_path / "a", [(axes(8), tps_runs(100, 110, 90, 105))])
    b = make_store(tmp_path / "b", [(axes(8), tps_runs(102, 95, 112, 99))])
    _, rows = compare_stores(a, b, metrics=("tps",))
    row = rows[0]
    assert row["tps_delta_pct"] == pytest.approx((102 - 101.25) / 101.25 * 100)
    assert row["tps_ci95_low_pct"] < 0 < row["tps_ci95_high_pct"]
    low, high = fieller_by_hand([100, 110, 90, 105], [102, 95, 112, 99])
    assert (row["tps_ci95_low_pct"], row["tps_ci95_high_pct"]) == pytest.approx((low, high))
    assert row["tps_p_value"] > 0.05
    assert row["tps_verdict"] == "no significant difference"


def test_latency_lower_is_faster(tmp_path: Path) -> None:
    a = make_store(tmp_path / "a", [(axes(8), [{"tps": 100.0, "latency_avg_ms": v, "latency_p99_ms": 3 * v}
                                               for v in (10.0, 10.2, 9.8)])])
    b = make_store(tmp_path / "b", [(axes(8), [{"tps": 100.0, "latency_avg_ms": v, "latency_p99_ms": 3 * v}
                                               for v in (8.0, 8.1, 7.9)])])
    _, rows = compare_stores(a, b)
    row = rows[0]
    assert row["latency_avg_ms_delta_pct"] == pytest.approx(-20.0)
    assert row["latency_avg_ms_ci95_high_pct"] < 0
    assert row["latency_avg_ms_verdict"] == "faster"
    assert row["latency_p99_ms_verdict"] == "faster"
    # identical tps on both sides, no spread: exactly no difference
    assert row["tps_delta_pct"] == 0 and row["tps_verdict"] == "no significant difference"
    _, back = compare_stores(b, a)
    assert back[0]["latency_avg_ms_verdict"] == "slower"


def test_single_run(tmp_path: Path) -> None:
    a = make_store(tmp_path / "a", [(axes(8), tps_runs(100))])
    b = make_store(tmp_path / "b", [(axes(8), tps_runs(150, 151, 149))])
    _, rows = compare_stores(a, b, metrics=("tps",))
    row = rows[0]
    assert row["tps_delta_pct"] == pytest.approx(50.0)
    assert row["tps_ci95_low_pct"] is None and row["tps_ci95_high_pct"] is None and row["tps_p_value"] is None
    assert row["tps_verdict"] == "too few repeats"
    d = difference("tps", [100.0], [150.0])
    assert d is not None and d.ci95_pct is None and d.p_value is None and d.verdict == "too few repeats"
    for fmt in ("table", "markdown"):  # the Δ is printed with its verdict beside it, never bare
        text = render(*uplift_rows(*compare_stores(a, b, metrics=("tps",))), fmt)
        assert "+50.0 %" in text and "too few repeats" in text and "[" not in text.split("+50.0 %")[1][:3]


def test_failed_runs_are_left_out(tmp_path: Path) -> None:
    # failed runs (tps 1.0) would drag A's mean down and turn the verdict: they must not count
    a = make_store(tmp_path / "a", [(axes(8), tps_runs(100, 101, 99))], failed={0: 2})
    b = make_store(tmp_path / "b", [(axes(8), tps_runs(100, 101, 99))])
    _, rows = compare_stores(a, b, metrics=("tps",))
    assert rows[0]["runs_a"] == 3
    assert rows[0]["tps_delta_pct"] == pytest.approx(0.0)
    assert rows[0]["tps_verdict"] == "no significant difference"


def test_compare_within_synchronous_commit(tmp_path: Path) -> None:
    store = make_store(tmp_path / "r", [
        (axes(1, "local"), tps_runs(200, 202, 198)),
        (axes(1, "on"), tps_runs(100, 101, 99)),
        (axes(8, "local"), tps_runs(800, 810, 790)),
        (axes(8, "on"), tps_runs(780, 830, 800)),
    ])
    columns, rows = compare_within(store, "synchronous_commit", "local", "on", metrics=("tps",))
    assert "synchronous_commit" not in columns
    assert [r["clients"] for r in rows] == [1, 8]
    one, eight = rows
    assert one["tps_a"] == pytest.approx(200) and one["tps_b"] == pytest.approx(100)
    assert one["tps_delta_pct"] == pytest.approx(-50.0)
    assert one["tps_verdict"] == "slower"
    assert eight["tps_delta_pct"] == pytest.approx((803.333333 - 800) / 800 * 100)
    assert eight["tps_verdict"] == "no significant difference"
    ucols, urows = uplift_rows(columns, rows)
    assert ucols == ["workload", "clients", "jobs", "a", "b", "uplift_pct", "ci95_low_pct", "ci95_high_pct",
                     "verdict", "flags"]
    assert urows[0]["uplift_pct"] == pytest.approx(-50.0) and urows[0]["clients"] == 1
    with pytest.raises(UserError, match="values present: local, on"):
        compare_within(store, "synchronous_commit", "off", "on")
    with pytest.raises(UserError, match="no run has the axis"):
        compare_within(store, "nonesuch", "a", "b")


def test_compare_within_matches_text_to_stored_bool(tmp_path: Path) -> None:
    store = make_store(tmp_path / "r", [
        (axes(4, True, **{"parameters.fsync": "on"}), tps_runs(100, 101, 99)),
        (axes(4, True, **{"parameters.fsync": "off"}), tps_runs(300, 301, 299)),
    ])
    _, rows = compare_within(store, "parameters.fsync", "on", "off", metrics=("tps",))
    assert len(rows) == 1 and rows[0]["tps_verdict"] == "faster"
    _, rows = compare_within(store, "synchronous_commit", "on", "on", metrics=("tps",))  # stored as a YAML true
    assert [(r["runs_a"], r["runs_b"]) for r in rows] == [(3, 3), (3, 3)]


def test_unmatched_points(tmp_path: Path) -> None:
    a = make_store(tmp_path / "a", [(axes(1), tps_runs(100, 101, 99)), (axes(8), tps_runs(500, 510, 490))])
    b = make_store(tmp_path / "b", [(axes(8), tps_runs(600, 610, 590)), (axes(32), tps_runs(900, 910, 890))])
    columns, rows = compare_stores(a, b, metrics=("tps",))
    by_clients = {r["clients"]: r for r in rows}
    assert [r["clients"] for r in rows] == [1, 8, 32]
    assert by_clients[1]["tps_verdict"] == "only in A"
    assert by_clients[1]["tps_a"] == pytest.approx(100) and by_clients[1]["tps_b"] is None
    assert by_clients[1]["tps_delta_pct"] is None and by_clients[1]["runs_b"] == 0
    assert by_clients[32]["tps_verdict"] == "only in B"
    assert by_clients[32]["tps_b"] == pytest.approx(900) and by_clients[32]["tps_a"] is None
    assert by_clients[8]["tps_verdict"] == "faster"
    assert by_clients[8]["tps_delta_pct"] == pytest.approx(20.0)
    assert "only in B" in render(columns, rows, "table")


def test_ignore_axes_and_missing_metric(tmp_path: Path) -> None:
    a = make_store(tmp_path / "a", [(axes(8, jobs=1), tps_runs(100, 101, 99))])
    b = make_store(tmp_path / "b", [(axes(8) | {"jobs": 4}, [{"tps": v} for v in (120.0, 121.0, 119.0)])])
    _, rows = compare_stores(a, b, metrics=("tps", "latency_avg_ms"))
    assert [r["tps_verdict"] for r in rows] == ["only in A", "only in B"]
    _, rows = compare_stores(a, b, metrics=("tps", "latency_avg_ms"), ignore_axes=("jobs",))
    assert len(rows) == 1
    assert rows[0]["tps_verdict"] == "faster"
    assert rows[0]["latency_avg_ms_verdict"] == "no data"


def test_empty_store(tmp_path: Path) -> None:
    a = Store.open(tmp_path / "a")
    b = make_store(tmp_path / "b", [(axes(8), tps_runs(100, 101, 99))])
    with pytest.raises(UserError, match="no sweep"):
        compare_stores(a, b)


def test_compare_runs_directly(tmp_path: Path) -> None:
    store = make_store(tmp_path / "a", [(axes(8), tps_runs(100, 101, 99))])
    runs = store.runs()
    columns, rows = compare_runs(runs, runs, metrics=("tps",))
    assert columns[:6] == ["workload", "synchronous_commit", "clients", "jobs", "runs_a", "runs_b"]
    assert rows[0]["tps_verdict"] == "no significant difference"


def test_uplift_tables_one_per_configuration_pair(tmp_path: Path) -> None:
    store = make_store(tmp_path / "r", [
        (axes(1, **{"parameters.wal_compression": "off"}), tps_runs(100, 101, 99)),
        (axes(1, **{"parameters.wal_compression": "on"}), tps_runs(150, 151, 149)),
        (axes(1, **{"parameters.wal_compression": "lz4"}), tps_runs(100, 102, 98)),
        (axes(8, **{"parameters.wal_compression": "off"}), tps_runs(400, 404, 396)),
        (axes(8, **{"parameters.wal_compression": "on"}), tps_runs(300, 303, 297)),
        (axes(8, **{"parameters.wal_compression": "lz4"}), tps_runs(410, 400, 390)),
    ])
    tables = uplift_tables(store)
    assert [t[0].split(" (")[0] for t in tables] == ["uplift: parameters.wal_compression=on vs "
                                                    "parameters.wal_compression=off",
                                                    "uplift: parameters.wal_compression=lz4 vs "
                                                    "parameters.wal_compression=off"]
    _, on_rows = tables[0][1], tables[0][2]
    assert [(r["clients"], round(r["uplift_pct"], 6), r["verdict"]) for r in on_rows] == [
        (1, 50.0, "faster"), (8, -25.0, "slower")]
    assert [r["verdict"] for r in tables[1][2]] == ["no significant difference"] * 2
    assert uplift_tables(make_store(tmp_path / "s", [(axes(1), tps_runs(1, 2))])) == []
