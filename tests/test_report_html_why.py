"""The HTML report shows why each run went as it did (issue 29): the runs table carries the WAL and backend-write
figures per commit the terminal's --wide table has, and a section lists each run's statements that took the most
time in its window (pg_stat_statements, where the lab loaded it)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from markupsafe import escape

from conftest import pglab, run_plan, write_plan
from helpers import stored_runs, views_store
from pglab import metrics
from pglab.store import Store

PLAN = """
name: why-html
target: {local: {instances: 1}}
postgres: {parameters: {shared_preload_libraries: pg_stat_statements}}
dataset: {scale: 1}
matrix: {workload: [tpcb-like], clients: [2]}
run: {duration: 3s, warmup: 1s}
"""


def _section(page: str, sid: str) -> str:
    """The HTML of one section: from its heading to the next one."""
    start = page.index(f'<h2 id="{sid}">')
    end = page.find("<h2 ", start + 1)
    return page[start:end if end >= 0 else len(page)]


def _cells(row: str) -> list[str]:
    return re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)


def _html(results: Path, out: Path) -> str:
    pglab("report", str(results), "--html", str(out), check=True)
    return out.read_text()


def test_the_statements_that_took_the_most_time_and_the_why_figures_are_on_the_page(tmp_path: Path) -> None:
    results = tmp_path / "results"
    run_plan(write_plan(tmp_path / "plan.yaml", PLAN), results)
    (run,) = stored_runs(results)
    doc = json.loads((results / run.dir / "statements.json").read_text())
    most = max(doc["statements"], key=lambda s: s["total_exec_time"])
    page = _html(results, tmp_path / "report.html")

    section = _section(page, "statements")
    rows = [_cells(r) for r in re.findall(r"<tr>(<td.*?)</tr>", section, re.S)]
    assert rows and all(r[0] == run.id for r in rows)
    query = str(escape(most["query"][:120]))  # run.json keeps each one's first 120 characters
    assert rows[0][4] == query  # the first row is the statement that took the most time …
    assert f"{most['calls']}" == rows[0][5].replace(",", "")  # … with its calls in the window
    times = [float(r[6].replace(",", "")) for r in rows]
    assert times == sorted(times, reverse=True) and len(rows) == min(5, len(doc["statements"]))

    runs = _section(page, "runs")
    headers = re.findall(r"<th[^>]*>(.*?)</th>", runs)
    (cells,) = [_cells(r) for r in re.findall(r"<tr>(<td.*?)</tr>", runs, re.S)]
    shown = dict(zip(headers, cells, strict=True))
    for key, header in (("wal_bytes_per_commit", "WAL B/commit"), ("wal_fpi_per_commit", "FPI/commit"),
                        ("buffers_backend", "backend writes")):
        value = run.metrics[key]
        assert value is not None and header == metrics.headers("html-runs")[key]
        assert float(shown[header].replace(",", "")) == round(value, 0 if abs(value) >= 1000 else 2), key
    assert (run.metrics["wal_bytes_per_commit"] or 0) > 0  # tpcb-like writes WAL on every commit


def test_a_sweep_without_statements_or_why_figures_shows_neither(tmp_path: Path) -> None:
    page = _html(views_store(tmp_path / "r"), tmp_path / "report.html")
    assert 'id="statements"' not in page
    headers = re.findall(r"<th[^>]*>(.*?)</th>", _section(page, "runs"))
    assert "tps" in headers and not {"WAL B/commit", "FPI/commit", "backend writes"} & set(headers)


def test_a_statements_text_is_shown_as_text_not_markup(tmp_path: Path) -> None:
    """A workload's statement can hold anything (a custom script's comparison, a string literal with a tag): the
    page shows it escaped."""
    results = views_store(tmp_path / "r")
    query = "SELECT 1 WHERE $1 < 2 -- '<b>x</b>' & more"
    for run in stored_runs(results):
        (results / run.dir / "run.json").write_text(json.dumps({"statements": {"top": [
            {"query": query, "calls": 7, "total_exec_time_ms": 3.0, "mean_exec_time_ms": 0.4, "time_pct": 100.0}]}}))
    page = _html(results, tmp_path / "report.html")
    section = _section(page, "statements")
    assert str(escape(query)) in section and "<b>" not in page


def _tenants_store(path: Path, statements: dict[str, list[dict[str, Any]]] | None) -> tuple[Path, str]:
    """A tenants sweep of one run (two tenants of two tiers) built through the Store API, its run.json as a tenants
    run writes it on either target: each tenant's tier, and with ``statements`` each tenant's summary of its
    tenants/<tenant>/statements.json under statements.tenants."""
    store = Store.open(path)
    sweep = store.begin_sweep("mt", "name: mt\n", "h", "0")
    ids = store.add_points(sweep, [(0, "k0", {"arrangement": "pair"})])
    run_id, run_dir = store.start_run(sweep, ids["k0"], 0, 1)
    tiers = {"t01": "gold", "t02": "bronze"}
    figures = {"t01": {"tps": 100.0, "latency_avg_ms": 2.0}, "t02": {"tps": 40.0, "latency_avg_ms": 5.0}}
    record: dict[str, Any] = {"tenants": {t: {"tier": tiers[t], **figures[t]} for t in tiers}}
    if statements is not None:
        record["statements"] = {"tenants": {t: {"file": f"tenants/{t}/statements.json", "count": len(top),
                                                "top": top} for t, top in statements.items()}}
    (path / run_dir / "run.json").write_text(json.dumps(record))
    store.finish_run(run_id, "ok", window=(1e9, 1e9 + 10), metrics={"tps": 140.0, "tenants": 2.0},
                     tenants=[(t, tiers[t], k, v) for t, f in figures.items() for k, v in f.items()])
    store.end_sweep(sweep, "done")
    store.close()
    return path, run_id


def _top(query: str, calls: int, total: float, pct: float) -> dict[str, Any]:
    return {"query": query, "calls": calls, "total_exec_time_ms": total, "mean_exec_time_ms": total / calls,
            "time_pct": pct}


def test_each_tenants_statements_that_took_the_most_time_are_on_the_page(tmp_path: Path) -> None:
    """A row per statement of each tenant's summary, the tenants in order, each with its run, arrangement and tier,
    its statements in the summary's order (most time first); a statement's text escaped."""
    update, odd = "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2", "SELECT $1 WHERE $2 < 3"
    statements = {"t02": [_top(update, 40, 80.0, 90.0), _top(odd, 40, 8.0, 10.0)],
                  "t01": [_top(update, 100, 150.0, 75.0), _top("SELECT abalance FROM pgbench_accounts", 100, 50.0,
                                                                   25.0)]}
    results, run_id = _tenants_store(tmp_path / "r", statements)
    page = _html(results, tmp_path / "report.html")
    section = _section(page, "statements")
    rows = [_cells(r) for r in re.findall(r"<tr>(<td.*?)</tr>", section, re.S)]
    expected = [[run_id, "pair", t, tier, str(escape(s["query"])), f"{s['calls']}"]
                for t, tier in (("t01", "gold"), ("t02", "bronze")) for s in statements[t]]
    assert [r[:6] for r in rows] == expected
    assert [float(r[6].replace(",", "")) for r in rows] == [150.0, 50.0, 80.0, 8.0]  # total ms
    assert "per tenant" in section and "&lt; 3" in section

    # a tenants sweep without statements (not loaded): no such section
    results, _ = _tenants_store(tmp_path / "none", None)
    assert 'id="statements"' not in _html(results, tmp_path / "none.html")
