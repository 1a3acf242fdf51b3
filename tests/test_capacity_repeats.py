"""The capacity search with repeats (issue 29): each probe rate run ``repeats`` times and judged on the mean of its
repeats, the interval from each rate's 95 % Student-t interval, `pglab compare` on capacities, and the HTML's
hockey stick. One search on a real lab, shared by the module: a server of known capacity (every transaction a
50 ms pg_sleep) at 2 and 4 clients (at most 40 and 80 tx/s). Every figure the tests check is recomputed here from
the stored probe runs (each a run whose figures tests/test_rate.py checks against pgbench), with the test's own
arithmetic."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import pglab, run_plan, write_plan
from helpers import Ran, stored_runs
from pglab.analysis.capacity import Search
from pglab.analysis.compare import capacity_comparison
from pglab.engine.capacity import judge, summarize
from pglab.plan.schema import Capacity

pytestmark = pytest.mark.postgres

TARGET_MS = 200.0
T_975_1DF = 12.706204736  # Student's t, 97.5 % quantile, 1 degree of freedom (two runs per rate)
PLAN = f"""
name: capacity-repeats
target: {{local: {{instances: 1}}}}
dataset: {{scale: 1}}
matrix:
  workload: [{{name: sleep, scripts: [{{file: sleep.sql}}]}}]
  clients: [2, 4]
run: {{duration: 2s, repeats: 2, order: sequential}}
probes: {{enabled: false}}
capacity: {{percentile: 99, target: {TARGET_MS:g}ms, precision_pct: 20, max_probes: 4}}
"""


@pytest.fixture(scope="module")
def search(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    folder = tmp_path_factory.mktemp("capacity-repeats")
    (folder / "sleep.sql").write_text("SELECT pg_sleep(0.05);\n")
    yield run_plan(write_plan(folder / "plan.yaml", PLAN), folder / "results")


def _csv(*args: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(pglab(*args, "--format", "csv", check=True).stdout)))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _oracle(ran: Ran) -> dict[int, dict[str, Any]]:
    """Per client count, from the stored runs: each rate's mean p99, its 95 % half-width, whether it held (mean),
    surely held or surely failed; the capacity, the failing rate and the interval's ends."""
    out: dict[int, dict[str, Any]] = {}
    for clients in (2, 4):
        runs = [r for r in ran.runs() if r.axes["clients"] == clients]
        by_rate: dict[float, list[float]] = {}
        tps: dict[float, list[float]] = {}
        for r in runs:
            assert r.status == "ok", r
            if "rate" in r.axes:
                by_rate.setdefault(float(r.axes["rate"]), []).append(float(r.metrics["latency_p99_ms"] or 0))
                tps.setdefault(float(r.axes["rate"]), []).append(float(r.metrics["tps"] or 0))
        rates: dict[float, dict[str, Any]] = {}
        for rate, p99 in by_rate.items():
            mean, half = _mean(p99), T_975_1DF * abs(p99[0] - p99[1]) / 2  # sd/sqrt(2) of two values: |a−b|/2
            rates[rate] = {"p99": mean, "half": half, "tps": _mean(tps[rate]), "held": mean <= TARGET_MS,
                           "surely_held": mean + half <= TARGET_MS, "surely_failed": mean - half > TARGET_MS}
        capacity = max((r for r, v in rates.items() if v["held"]), default=None)
        low = max((r for r, v in rates.items() if v["surely_held"]), default=0.0)
        out[clients] = {
            "runs": runs, "rates": rates, "capacity": capacity,
            "failing": min((r for r, v in rates.items() if not v["held"] and (capacity is None or r > capacity)),
                           default=None),
            "low": low, "high": min((r for r, v in rates.items() if v["surely_failed"] and r > low), default=None)}
    return out


def _number(text: str) -> float | None:
    return float(text) if text else None


def test_each_rate_runs_twice_and_the_answer_follows_the_mean_of_its_repeats(search: Ran) -> None:
    oracle = _oracle(search)
    table = {int(r["clients"]): r for r in _csv("report", str(search.results), "--table", "capacity")}
    events = [e[2] or "" for e in search.events("capacity")]
    for clients, o in oracle.items():
        keys = [(r.axes.get("rate"), r.repeat) for r in o["runs"]]
        rates = {rate for rate, _ in keys}  # every rate, the closed loop's (None) too, run twice
        assert sorted(keys, key=str) == sorted(((r, n) for r in rates for n in (1, 2)), key=str)
        assert len(o["rates"]) + 1 == len(rates) <= 4
        row = table[clients]
        assert (_number(row["capacity_tps"]), _number(row["failed_at_tps"])) == (o["capacity"], o["failing"])
        assert (_number(row["capacity_low_tps"]), _number(row["capacity_high_tps"])) == (o["low"], o["high"])
        assert int(row["repeats"]) == 2 and int(row["runs"]) == len(o["runs"])
        if o["capacity"] is not None:
            assert math.isclose(float(row["p99_at_capacity_ms"]), o["rates"][o["capacity"]]["p99"])
            assert math.isclose(float(row["p99_at_capacity_ms_ci95"]), o["rates"][o["capacity"]]["half"])
            detail = next(e for e in events if f" c={clients} " in e)
            high = "∞" if o["high"] is None else f"{o['high']:g}"
            assert f": {o['capacity']:g} tx/s" in detail and f"95 % interval [{o['low']:g}, {high})" in detail, detail
            assert f"{len(o['runs']) // 2} rates, {len(o['runs'])} runs" in detail, detail
    # a rerun replays every decision from the stored runs: nothing runs again
    before = [r.id for r in search.runs()]
    run_plan(search.results.parent / "plan.yaml", search.results)
    assert [r.id for r in stored_runs(search.results)] == before


def _verdict(a: dict[str, Any], b: dict[str, Any]) -> str:
    if a["high"] is not None and b["low"] >= a["high"]:
        return "higher"
    if b["high"] is not None and a["low"] >= b["high"]:
        return "lower"
    return "no significant difference"


def test_compare_gives_the_capacities_their_interval_and_verdict(search: Ran) -> None:
    oracle = _oracle(search)
    a, b = oracle[2], oracle[4]
    [row] = _csv("compare", str(search.results), "--axis", "clients", "--a", "2", "--b", "4", "--uplift")
    assert (_number(row["capacity_a"]), _number(row["capacity_b"])) == (a["capacity"], b["capacity"])
    assert (_number(row["low_a"]), _number(row["high_a"])) == (a["low"], a["high"])
    assert (_number(row["low_b"]), _number(row["high_b"])) == (b["low"], b["high"])
    if a["capacity"] and b["capacity"] is not None:
        assert math.isclose(float(row["uplift_pct"]), (b["capacity"] / a["capacity"] - 1) * 100)
        assert row["verdict"] == _verdict(a, b)
        if a["low"] and a["high"] is not None and b["high"] is not None:  # bounded: (lowB/highA, highB/lowA)
            assert math.isclose(float(row["ci95_low_pct"]), (b["low"] / a["high"] - 1) * 100)
            assert math.isclose(float(row["ci95_high_pct"]), (b["high"] / a["low"] - 1) * 100)
    # a folder against itself: equal capacities, and an interval can never tell a side from itself
    rows = _csv("compare", str(search.results), str(search.results), "--uplift")
    assert {int(r["clients"]): r["verdict"] for r in rows} == {2: "no significant difference",
                                                              4: "no significant difference"}
    assert all(r["uplift_pct"] in ("", "0.0") for r in rows)
    text = pglab("compare", str(search.results), "--axis", "clients", "--a", "2", "--b", "4", check=True).stdout
    assert "capacity at p99 ≤ 200 ms" in text and "surely held" in text


TICK = re.compile(r'<text x="58" y="([\d.]+)" text-anchor="end">([\d,.k]+)</text>')


def _scale(svg: str) -> tuple[float, float, float, float]:
    """The chart's axes from its tick labels: (y pixel of 0, pixels per ms, x pixel of 0, pixels per tx/s)."""
    ys = [(float(y) - 4, float(v.replace(",", ""))) for y, v in TICK.findall(svg)]
    bottom = next(y for y, v in ys if v == 0)
    top_y, top_v = min(ys)
    xs = [(float(x), float(v.replace(",", ""))) for x, v in
          re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="middle">([\d,.]+)</text>', svg)]
    x0 = next(x for x, v in xs if v == 0)
    x_top, v_top = max(xs)
    return bottom, (bottom - top_y) / top_v, x0, (x_top - x0) / v_top


def test_the_html_draws_each_configurations_hockey_stick_from_its_probes(search: Ran, tmp_path: Path) -> None:
    oracle = _oracle(search)
    out = tmp_path / "report.html"
    pglab("report", str(search.results), "--html", str(out), check=True)
    page = out.read_text()
    assert '<h2 id="capacity">' in page  # the capacity table too, and a line of the summary per configuration
    for clients, o in oracle.items():
        said = re.search(rf"capacity at p99 ≤ 200 ms, [^<]*clients={clients} [^<]*: ([^<]*); (\d+) runs\.", page)
        assert said is not None and int(said.group(2)) == len(o["runs"])
        assert said.group(1).startswith(f"{o['capacity']:g} tx/s" if o["capacity"] is not None else "no probed")
    figures = dict(re.findall(r'<figure id="(capacity-\d)">(.*?)</figure>', page, re.S))
    assert len(figures) == 2
    for (_, svg), clients in zip(sorted(figures.items()), (2, 4), strict=True):
        o = oracle[clients]
        assert f"clients={clients}" in svg
        bottom, per_ms, x0, per_tx = _scale(svg)
        target = re.search(r'<line class="target" x1="[\d.]+" y1="([\d.]+)"', svg)
        assert target is not None and math.isclose((bottom - float(target.group(1))) / per_ms, TARGET_MS,
                                                   abs_tol=0.2 / per_ms)
        top = max(float(v.replace(",", "")) for _, v in TICK.findall(svg))
        dots = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)" r="3.5" fill="[^"]+"><title>rate ([\d.]+) tx/s', svg)
        off = re.findall(r'<path class="off-scale"[^>]*><title>rate ([\d.]+) tx/s', svg)
        assert sorted([float(r) for *_, r in dots] + [float(r) for r in off]) == sorted(o["rates"])
        for cx, cy, rate in dots:  # each point where its probe's mean TPS and mean p99 put it
            probe = o["rates"][float(rate)]
            assert math.isclose((float(cx) - x0) / per_tx, probe["tps"], abs_tol=0.1 / per_tx)
            assert math.isclose((bottom - float(cy)) / per_ms, probe["p99"], abs_tol=0.1 / per_ms)
        assert all(o["rates"][float(r)]["p99"] > top for r in off)  # above the axis: on its top edge
        line = re.search(r'<line class="capacity" x1="([\d.]+)"', svg)
        if o["capacity"] is None:
            assert line is None
        else:
            at = o["rates"][o["capacity"]]["tps"]  # where the capacity's probe is: its achieved TPS
            assert line is not None and math.isclose((float(line.group(1)) - x0) / per_tx, at, abs_tol=0.1 / per_tx)
            assert f"capacity {o['capacity']:g} tx/s (achieved {at:.1f})" in svg
        assert ('<rect class="band"' in svg) == (o["high"] is not None)  # the interval shaded when bounded


def _stored_search(name: str, p99_by_rate: dict[float, list[float]]) -> Search:
    """A configuration's search as the report reads it, from p99s (ms) per rate, the target 100 ms."""
    spec = Capacity(percentile=99, target="100ms")
    verdicts = {}
    for rate, p99 in p99_by_rate.items():
        v = judge(spec, {"latency_p99_ms": p99, "tps": [rate] * len(p99)})
        assert v is not None
        verdicts[rate] = v
    return Search({"storage": name}, None, verdicts, summarize(verdicts), sum(map(len, p99_by_rate.values())), 2)


def test_the_comparison_gives_a_direction_only_when_the_intervals_part() -> None:
    """The rule on figures worked by hand (t = 12.706 for two runs): A's 100 tx/s surely held (51 + 12.7 × 1 = 63.7
    ≤ 100) and 200 surely failed (305 − 12.7 × 5 = 241.5 > 100); B's 250 surely held, 400 surely failed. B's low
    (250) reaches A's high (200): higher, Δ +150 % within (250/200 − 1, 400/100 − 1) = (+25 %, +300 %)."""
    a = _stored_search("a", {100.0: [50, 52], 200.0: [300, 310]})
    b = _stored_search("b", {250.0: [60, 62], 400.0: [500, 520]})
    assert (a.answer.low, a.answer.high, b.answer.low, b.answer.high) == (100, 200, 250, 400)
    [row] = capacity_comparison([a], [b], ignore_axes=("storage",))[1]
    assert row["verdict"] == "higher" and math.isclose(row["uplift_pct"], 150)
    assert math.isclose(row["ci95_low_pct"], 25) and math.isclose(row["ci95_high_pct"], 300)
    assert capacity_comparison([b], [a], ignore_axes=("storage",))[1][0]["verdict"] == "lower"
    # the mean decides: one run of two over the target holds on the mean (all-repeats-hold would say no) …
    split = _stored_search("c", {100.0: [150, 40]})
    assert split.answer.capacity == 100 and split.answer.low == 0.0  # … but not surely: 95 ± 699 ms
    # overlapping intervals: no direction; one run per rate: no interval at all
    close = _stored_search("d", {100.0: [50, 52], 220.0: [60, 200]})
    assert capacity_comparison([a], [close], ("storage",))[1][0]["verdict"] == "no significant difference"
    single = _stored_search("e", {300.0: [40], 400.0: [500]})
    assert (single.answer.capacity, single.answer.low, single.answer.high) == (300, None, None)
    assert capacity_comparison([a], [single], ("storage",))[1][0]["verdict"] == "no interval"
