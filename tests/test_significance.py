"""Significance on every comparison pglab prints, and a point's flags in every view.

The interval math is checked against scipy and a hand-written Fieller; the views (terminal, markdown, CSV, JSON,
HTML, export) on stores built through the Store API, for the three cases that matter: one run a side (too few
repeats), clearly separated repeats (a verdict, the interval excluding 0), overlapping noisy ones (no difference).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from helpers import make_store, tps_runs
from pglab.analysis.compare import compare_stores, difference, uplift_rows, uplift_tables
from pglab.analysis.cost import cost_comparison
from pglab.analysis.flags import INTERFERED, UNSTABLE, flags
from pglab.analysis.stats import contrast
from pglab.report import html
from pglab.report.export import export
from pglab.report.tables import durability_table, full_report, point_table, render
from pglab.store import Store

ONE_RUN = ([1000.0], [2126.0])  # the quickstart's "select-only at 1 client: on +112.6 % vs local"
SEPARATED = ([100.0, 101.0, 99.0], [60.0, 61.0, 59.0])
NOISY = ([8363.7 + 1000, 8363.7 - 1000, 8500.0], [8000.0, 9500.0, 8700.0])  # CV > 5 % on both sides


def _durability_store(path: Path, a: list[float], b: list[float], extra: dict[str, float] | None = None,
                      plan_text: str = "name: t\n") -> Store:
    """One point per level, local (A) and on (B), at 8 clients; ``extra`` metrics on every run of 'on'."""
    local, on = ({"workload": "tpcb-like", "synchronous_commit": sc, "clients": 8, "jobs": 1} for sc in ("local", "on"))
    return make_store(path, [(local, tps_runs(*a)), (on, [{**m, **(extra or {})} for m in tps_runs(*b)])],
                      plan_text=plan_text, first_repeat=1)


def _every_view(store: Store, table: str) -> dict[str, str]:
    views = {fmt: full_report(store, fmt, table=table) for fmt in ("table", "markdown", "csv", "json")}
    views["html"] = html.build(store)
    return views


# the statistics


def test_welch_interval_and_p_value_match_scipy() -> None:
    a, b = [10.0, 12.0, 11.0, 15.0], [13.0, 13.5, 14.0]
    c = contrast(a, b)
    assert c is not None and c.diff_ci is not None and c.df is not None
    res = stats.ttest_ind(b, a, equal_var=False)
    assert c.diff == pytest.approx(13.5 - 12.0)
    assert c.diff_ci == pytest.approx(tuple(res.confidence_interval(0.95)))
    assert c.p_value == pytest.approx(res.pvalue)
    assert c.df == pytest.approx(res.df)


def test_fieller_interval_is_where_the_welch_statistic_equals_t() -> None:
    """Each bound ρ of the ratio interval is a root of |mean(B) − ρ·mean(A)| = t·√(s²_B/n_B + ρ²·s²_A/n_A)."""
    a, b = [100.0, 104.0, 97.0, 101.0], [115.0, 109.0, 121.0]
    c = contrast(a, b)
    assert c is not None and c.ratio_ci is not None and c.df is not None
    ma, mb = sum(a) / 4, sum(b) / 3
    sa2, sb2 = stats.tvar(a) / 4, stats.tvar(b) / 3
    t = stats.t.ppf(0.975, stats.ttest_ind(b, a, equal_var=False).df)
    for rho in c.ratio_ci:
        assert abs(mb - rho * ma) / math.sqrt(sb2 + rho * rho * sa2) == pytest.approx(t)
    assert c.ratio_ci[0] < mb / ma < c.ratio_ci[1]
    # textbook form (g = t²·s²_A/mean(A)²), written independently of the code's quadratic
    g, r = t * t * sa2 / ma ** 2, mb / ma
    half = t / ma * math.sqrt(sb2 * (1 - g) + r * r * sa2)
    assert c.ratio_ci == pytest.approx(((r - half) / (1 - g), (r + half) / (1 - g)))


@pytest.mark.parametrize(("a", "b"), [SEPARATED, NOISY, ([10.0, 11.0, 12.0], [11.5, 12.5, 13.5]),
                                      ([10.0, 11.0, 12.0], [12.0, 13.0, 14.0]), ([5.0, 5.5], [6.0, 6.2, 6.4])])
def test_percentage_interval_and_verdict_never_disagree(a: list[float], b: list[float]) -> None:
    """Fieller with Welch's t excludes 1 exactly when Welch's test rejects at 5 %."""
    d = difference("tps", a, b)
    assert d is not None and d.ci95_pct is not None
    rejects = stats.ttest_ind(b, a, equal_var=False).pvalue < 0.05
    excludes_zero = d.ci95_pct[0] > 0 or d.ci95_pct[1] < 0
    assert excludes_zero == rejects
    assert (d.verdict != "no significant difference") == rejects


def test_one_run_a_side_has_no_interval_and_says_too_few_repeats() -> None:
    d = difference("tps", *ONE_RUN)
    assert d is not None and d.delta_pct == pytest.approx(112.6)
    assert d.ci95_pct is None and d.ci95 is None and d.p_value is None and d.verdict == "too few repeats"


def test_a_reference_indistinguishable_from_zero_gives_an_unbounded_ratio() -> None:
    """8363.7 ± 18636.2 over two runs: A's mean is not known to be above 0, so no percentage interval exists."""
    c = contrast([-2000.0, 18727.4], [500.0, 600.0])
    assert c is not None and c.diff_ci is not None and c.ratio_ci is None
    d = difference("tps", [-2000.0, 18727.4], [500.0, 600.0])
    assert d is not None and d.verdict == "no significant difference"
    assert d.ci95_pct is not None and all(math.isnan(x) for x in d.ci95_pct)


# the price of durability, in every view


def test_durability_with_one_run_says_too_few_repeats_everywhere(tmp_path: Path) -> None:
    store = _durability_store(tmp_path / "r", *ONE_RUN)
    _, rows = durability_table(store)
    assert rows[0]["on_tps_vs_base_pct"] == pytest.approx(112.6)
    assert rows[0]["on_tps_verdict"] == "too few repeats" and rows[0]["on_tps_ci95_low_pct"] is None
    for fmt, text in _every_view(store, "durability").items():
        assert "too few repeats" in text, fmt
    table = full_report(store, "table", table="durability")
    line = next(x for x in table.splitlines() if "+112.6 %" in x)
    assert "too few repeats" in line and "[" not in line  # no interval pretended
    assert "set run.repeats to 3 or more" in table
    assert "set run.repeats to 3 or more" not in full_report(_durability_store(tmp_path / "s", *SEPARATED), "table")


def test_durability_with_separated_repeats_is_slower_and_its_interval_excludes_zero(tmp_path: Path) -> None:
    store = _durability_store(tmp_path / "r", *SEPARATED)
    _, rows = durability_table(store)
    row = rows[0]
    d = difference("tps", *SEPARATED)
    assert d is not None and d.ci95_pct is not None
    assert row["on_tps_vs_base_pct"] == pytest.approx(-40.0)
    assert (row["on_tps_ci95_low_pct"], row["on_tps_ci95_high_pct"]) == pytest.approx(d.ci95_pct)
    assert row["on_tps_ci95_high_pct"] < 0 and row["on_tps_verdict"] == "slower"
    assert row["on_latency_ci95_low_pct"] > 0 and row["on_latency_verdict"] == "slower"  # latency went up
    bracket = f"-40.0 % [{row['on_tps_ci95_low_pct']:+.1f}, {row['on_tps_ci95_high_pct']:+.1f}]"
    views = _every_view(store, "durability")
    assert bracket in views["table"] and bracket in views["markdown"]
    assert bracket in views["html"] and "(slower)" in views["html"]  # the summary line
    listed = list(csv.DictReader(io.StringIO(views["csv"])))
    assert listed[0]["on_tps_verdict"] == "slower"
    assert float(listed[0]["on_tps_ci95_high_pct"]) == pytest.approx(row["on_tps_ci95_high_pct"])
    assert json.loads(views["json"])[0]["on_tps_verdict"] == "slower"


def test_durability_with_noisy_repeats_is_no_significant_difference(tmp_path: Path) -> None:
    store = _durability_store(tmp_path / "r", *NOISY)
    _, rows = durability_table(store)
    row = rows[0]
    assert row["on_tps_ci95_low_pct"] < 0 < row["on_tps_ci95_high_pct"]
    assert row["on_tps_verdict"] == "no significant difference"
    for fmt, text in _every_view(store, "durability").items():
        assert "no significant difference" in text, fmt


# uplift and compare


def _uplift_store(path: Path, a: list[float], b: list[float]) -> Store:
    store = Store.open(path)
    sweep = store.begin_sweep("t", "name: t\n", "h", "0")
    axes = [{"workload": "tpcb-like", "synchronous_commit": "on", "clients": 4, "jobs": 1,
             "parameters.wal_compression": v} for v in ("off", "lz4")]
    ids = store.add_points(sweep, [(i, f"k{i}", ax) for i, ax in enumerate(axes)])
    for i, values in enumerate((a, b)):
        for rep, v in enumerate(values, 1):
            run_id, _ = store.start_run(sweep, ids[f"k{i}"], i, rep)
            store.finish_run(run_id, "ok", metrics={"tps": v})
    store.end_sweep(sweep, "done")
    return store


@pytest.mark.parametrize(("case", "verdict"), [(ONE_RUN, "too few repeats"), (SEPARATED, "slower"),
                                               (NOISY, "no significant difference")])
def test_uplift_verdicts(tmp_path: Path, case: tuple[list[float], list[float]], verdict: str) -> None:
    store = _uplift_store(tmp_path / "r", *case)
    [(_, columns, rows)] = uplift_tables(store)
    assert rows[0]["verdict"] == verdict
    low, high = rows[0]["ci95_low_pct"], rows[0]["ci95_high_pct"]
    if verdict == "too few repeats":
        assert low is None and high is None
    elif verdict == "slower":
        assert high < 0
    else:
        assert low < 0 < high
    for fmt in ("table", "markdown", "csv", "json"):
        assert verdict in render(columns, rows, fmt), fmt
    assert verdict in html.build(store)


@pytest.mark.parametrize(("case", "verdict"), [(ONE_RUN, "too few repeats"), (SEPARATED, "slower"),
                                               (NOISY, "no significant difference")])
def test_compare_verdicts(tmp_path: Path, case: tuple[list[float], list[float]], verdict: str) -> None:
    a = _durability_store(tmp_path / "a", case[0], case[0])
    b = _durability_store(tmp_path / "b", case[1], case[1])
    columns, rows = compare_stores(a, b, metrics=("tps",))
    assert [r["tps_verdict"] for r in rows] == [verdict, verdict]
    _, urows = uplift_rows(columns, rows)
    assert urows[0]["verdict"] == verdict
    for fmt in ("table", "markdown", "csv", "json"):
        assert verdict in render(columns, rows, fmt), fmt


# flags


def test_flags_from_the_runs_metrics() -> None:
    assert flags([{"tps": 100.0}, {"tps": 101.0}]) == []
    assert flags([{"tps": 100.0}, {"tps": 110.0}]) == [UNSTABLE]  # CV 6.7 %
    assert flags([{"tps": 100.0}]) == []  # one run has no spread to judge
    assert flags([{"tps": 100.0, "interference_cpu_cores": 0.6}, {"tps": 100.5, "interference_cpu_cores": 0.4}]
                 ) == [INTERFERED]
    assert flags([{"tps": 100.0, "interference_cpu_cores": 0.1}, {"tps": 100.5, "interference_cpu_cores": 0.2}]
                 ) == []


def _flag_rows(text: str, fmt: str) -> list[dict[str, Any]]:
    return list(csv.DictReader(io.StringIO(text))) if fmt == "csv" else json.loads(text)


def test_flags_appear_in_every_view(tmp_path: Path) -> None:
    # local: unstable (CV > 5 %); on: steady but another tenant used 0.6 cores during its runs
    store = _durability_store(tmp_path / "r", [9363.7, 7363.7, 8500.0], [8000.0, 8010.0, 7990.0],
                              extra={"interference_cpu_cores": 0.6})
    _, points = point_table(store)
    assert [p["flags"] for p in points] == ["unstable", "interfered"]
    assert points[0]["unstable"] is True and points[1]["unstable"] is False
    table, markdown = full_report(store, "table"), full_report(store, "markdown")
    for text in (table, markdown):
        local = next(x for x in text.splitlines() if "local" in x and "8409" in x)
        on = next(x for x in text.splitlines() if "| on " in x or "│ on " in x)
        assert "unstable" in local and "interfered" not in local
        assert "interfered" in on and "unstable" not in on
        assert "local: unstable; on: interfered" in text  # the durability table's row
    for fmt in ("csv", "json"):
        assert [r["flags"] for r in _flag_rows(full_report(store, fmt), fmt)] == ["unstable", "interfered"]
        dur = _flag_rows(full_report(store, fmt, table="durability"), fmt)
        assert dur[0]["flags"] == "local: unstable; on: interfered"
    page = html.build(store)
    assert "<td class=\"text\">unstable</td>" in page and "<td class=\"text\">interfered</td>" in page
    assert "local: unstable; on: interfered" in page
    for fmt in ("csv", "json"):
        [points_file] = [p for p in export(store, tmp_path / f"x{fmt}", fmt) if p.stem == "points"]
        text = points_file.read_text()
        rows = _flag_rows(text, fmt) if fmt == "csv" else json.loads(text)
        assert [r["flags"] for r in rows] == ["unstable", "interfered"]


def test_compare_names_the_side_that_is_flagged(tmp_path: Path) -> None:
    a = _durability_store(tmp_path / "a", [100.0, 101.0, 99.0], [100.0, 101.0, 99.0])
    b = _durability_store(tmp_path / "b", [100.0, 120.0, 80.0], [100.0, 101.0, 99.0],
                          extra={"interference_cpu_cores": 1.0})
    columns, rows = compare_stores(a, b, metrics=("tps",))
    assert [r["flags"] for r in rows] == ["B: unstable", "B: interfered"]
    assert "B: unstable" in render(columns, rows, "table") and "B: interfered" in render(columns, rows, "markdown")
    _, urows = uplift_rows(columns, rows)
    assert [r["flags"] for r in urows] == ["B: unstable", "B: interfered"]


# cost


@pytest.mark.parametrize(("a", "b", "expected"), [
    ([500.0], [1000.0], "too few repeats"),
    ([500.0, 505.0, 495.0], [1000.0, 1010.0, 990.0], "; cheaper"),
    ([500.0, 600.0, 400.0], [520.0, 400.0, 640.0], "no significant difference"),
])
def test_cost_comparison_says_whether_cheaper_per_tps_is_measured(tmp_path: Path, a: list[float],
                                                                  b: list[float], expected: str) -> None:
    priced = "name: t\ncost: {monthly: 1000}\n"
    _durability_store(tmp_path / "a", a, a, plan_text=priced).close()
    _durability_store(tmp_path / "b", b, b, plan_text=priced).close()
    [line] = cost_comparison(Store.open(tmp_path / "a", create=False), Store.open(tmp_path / "b", create=False))
    assert expected in line
    if expected == "; cheaper":  # same price: per-TPS cost ratio = 1 / TPS ratio, the Fieller bounds turned over
        c = contrast(a, b)
        assert c is not None and c.ratio_ci is not None
        assert f"{(1 / c.ratio_ci[1] - 1) * 100:+.1f} % to {(1 / c.ratio_ci[0] - 1) * 100:+.1f} %" in line


# tenants: a tier against the first arrangement


def _tenants_store(path: Path, base: list[float], tier: list[float]) -> Store:
    """Arrangement 'noqos' (2 tenants, host TPS ``base`` per run) then 'qos' whose tier 'gold' made ``tier``."""
    store = Store.open(path)
    sweep = store.begin_sweep("t", "name: t\n", "h", "0")
    ids = store.add_points(sweep, [(0, "k0", {"arrangement": "noqos", "clients": 1}),
                                   (1, "k1", {"arrangement": "qos", "clients": 1})])
    for i, (key, values) in enumerate((("k0", base), ("k1", tier))):
        for rep, v in enumerate(values, 1):
            run_id, _ = store.start_run(sweep, ids[key], i, rep)
            m: dict[str, float | None] = {"tps": 2 * v, "tenants": 2.0}
            if i == 1:
                m["tier.gold.tps"] = v
            store.finish_run(run_id, "ok", metrics=m)
    store.end_sweep(sweep, "done")
    return store


@pytest.mark.parametrize(("case", "verdict"), [(ONE_RUN, "too few repeats"), (SEPARATED, "slower"),
                                               (NOISY, "no significant difference")])
def test_tier_vs_base_has_its_interval_and_verdict(tmp_path: Path, case: tuple[list[float], list[float]],
                                                   verdict: str) -> None:
    from pglab.report.tiers import tier_table

    store = _tenants_store(tmp_path / "r", *case)
    _, rows = tier_table(store)
    gold = next(r for r in rows if r["tier"] == "gold")
    d = difference("tps", *case)
    assert d is not None
    assert gold["tps_vs_base_pct"] == pytest.approx(d.delta_pct) and gold["tps_verdict"] == verdict
    if d.ci95_pct is not None:
        assert (gold["tps_ci95_low_pct"], gold["tps_ci95_high_pct"]) == pytest.approx(d.ci95_pct)
    for fmt in ("table", "markdown", "csv", "json"):
        assert verdict in full_report(store, fmt, table="tiers"), fmt
    assert ("set run.repeats to 3 or more" in full_report(store, "table")) == (verdict == "too few repeats")
    assert verdict in html.build(store)
    if verdict == "no significant difference":  # NOISY's runs spread more than 5 %: both arrangements flagged
        assert [r["flags"] for r in rows] == ["unstable"] * len(rows)


def test_compare_command_notes_too_few_repeats(tmp_path: Path) -> None:
    from conftest import pglab

    for name, case in (("one", ONE_RUN), ("sep", SEPARATED)):
        _durability_store(tmp_path / f"{name}a", case[0], case[0]).close()
        _durability_store(tmp_path / f"{name}b", case[1], case[1]).close()
    one = pglab("compare", str(tmp_path / "onea"), str(tmp_path / "oneb"), check=True).stdout
    assert "+112.6 %" in one and "too few repeats" in one and "set run.repeats to 3 or more" in one
    sep = pglab("compare", str(tmp_path / "sepa"), str(tmp_path / "sepb"), "--uplift", "--format", "markdown",
                check=True).stdout
    d = difference("tps", *SEPARATED)
    assert d is not None and d.ci95_pct is not None
    assert f"-40.0 % [{d.ci95_pct[0]:+.1f}, {d.ci95_pct[1]:+.1f}] | slower" in sep
    assert "set run.repeats" not in sep


def test_an_unbounded_interval_is_printed_as_such_in_the_terminal_and_markdown() -> None:
    from pglab.report.tables import render

    columns = ["workload", "on_tps_vs_base_pct", "on_tps_ci95_low_pct", "on_tps_ci95_high_pct", "on_tps_verdict"]
    row = {"workload": "tpcb-like", "on_tps_vs_base_pct": -33.2, "on_tps_ci95_low_pct": None,
           "on_tps_ci95_high_pct": None, "on_tps_verdict": "no significant difference"}
    for fmt in ("table", "markdown"):  # the terminal's table reads cells as text: "[unbounded]" is no style tag
        assert "-33.2 % [unbounded]" in render(columns, [row], fmt), fmt
