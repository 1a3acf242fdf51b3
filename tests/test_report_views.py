"""The reports people read: the compact terminal table, the HTML page (opened in headless Chromium), the storage
table's commit latency, money, `compare`'s differences and the one-sentence refusals.

One results folder, built through the real Store API once for the module, serves every test: two workloads ×
two synchronous_commit levels × two client counts, three repeats each, each run with a time series (one with a
TPS dip), a WAL fio profile, a plan with a cost, and an environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import pglab
from helpers import VIEWS_ENVIRONMENT, VIEWS_PLAN, views_store
from pglab.store import Store


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return views_store(tmp_path_factory.mktemp("views") / "r")


def _env(columns: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return env


# the terminal


def test_default_table_fits_the_terminal_and_keeps_one_row_per_line(results: Path) -> None:
    wide = pglab("report", str(results), "--wide", env=_env(None), check=True).stdout
    assert max(len(line) for line in wide.splitlines()) > 120  # every column does not fit 120
    for columns in (120, 100):
        text = pglab("report", str(results), env=_env(columns), check=True).stdout
        assert max(len(line) for line in text.splitlines()) <= columns, columns
        rows = [line for line in text.split("cost at peak TPS")[0].splitlines()
                if line.startswith("│ select-only") and "│       8 │" in line]
        assert len(rows) == 2 + 1  # local and remote_apply in the database table, one row in the durability one
    text = pglab("report", str(results), env=_env(120), check=True).stdout
    assert "tps ± 95 %" in text and "p99 ms" in text and "disk w IOPS" in text and "cpu %" in text
    assert re.search(r"│ tpcb-like\s+│ local\s+│\s+8 │\s+1250\.0 ± \d", text)  # TPS with its interval
    assert "bottleneck" in text and "\n  none: no rule fired" in text  # the tag and its legend below
    piped = pglab("report", str(results), env=_env(None), check=True).stdout
    assert max(len(line) for line in piped.splitlines()) <= 120  # piped, no COLUMNS: 120
    # one line a row: four points, two durability rows, one cost row
    assert len([line for line in piped.splitlines() if line.startswith("│ select-only")]) == 4 + 2 + 1


def test_columns_chooses_the_figures_and_rejects_an_unknown_one(results: Path) -> None:
    text = pglab("report", str(results), "--columns", "tps,wal_mb_s", "--table", "database", env=_env(None),
                 check=True).stdout
    header = next(line for line in text.splitlines() if "workload" in line)
    assert [h.strip() for h in header.strip("┃ ").split("┃")] == ["workload", "sync commit", "clients", "tps ± 95 %",
                                                                   "wal_mb_s"]
    bad = pglab("report", str(results), "--columns", "tps,speed")
    assert bad.returncode == 2 and "--columns: 'speed' is no column" in bad.stderr and "Traceback" not in bad.stderr


def test_storage_table_shows_what_a_commit_waits_for(results: Path) -> None:
    text = pglab("report", str(results), "--table", "storage", env=_env(None), check=True).stdout
    row = next(line for line in text.splitlines() if "wal-fdatasync-8k" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[5:] == ["fdatasync", "1.476", "6.717", "37.487"]
    assert "latency of" in text and "write() alone: mean 0.016 ms, p99 0.057 ms" in text


def test_money_has_three_significant_digits(results: Path) -> None:
    from pglab.units import money

    assert [money(v) for v in (0.0598, 0.05984, 1.2345, 61.0, 1234.5)] == ["0.0598", "0.0598", "1.23", "61.0",
                                                                          "1,234"]
    text = pglab("report", str(results), "--table", "cost", env=_env(None), check=True).stdout
    assert f" {61 / 18_000:.3g} " in text.replace("│", " ")  # 0.00339, not 0.0


@pytest.mark.parametrize(("args", "message"), [
    (("--table", "uplift"), "--table: sweep 1 has no uplift table: the sweep varies no configuration axis"),
    (("--table", "scenarios"), "--table: sweep 1 has no scenarios table: the plan ran no scenario"),
    (("--table", "tiers"), "--table: sweep 1 has no tiers table: it is for tenants plans"),
    (("--sweep", "9"), "holds no sweep 9; it holds 1."),
])
def test_a_table_or_sweep_that_does_not_apply_is_one_sentence(results: Path, args: tuple[str, ...],
                                                              message: str) -> None:
    proc = pglab("report", str(results), *args)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ""
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# compare


def test_compare_lists_what_differs_first(results: Path, tmp_path: Path) -> None:
    plan = VIEWS_PLAN.replace("instances: 3", "instances: 2").replace("scale: 10", "scale: 5")
    other = views_store(tmp_path / "b", plan,
                        {**VIEWS_ENVIRONMENT, "postgres": {**VIEWS_ENVIRONMENT["postgres"], "version_num": 160004}})
    text = pglab("compare", str(results), str(other), check=True).stdout
    lines = text.splitlines()
    assert lines[0] == "what differs between A and B:"
    assert "  target.local.instances: A 3 · B 2" in lines and "  dataset.scale: A 10 · B 5" in lines
    assert "  PostgreSQL version: A 150018 · B 160004" in lines
    warning = next(i for i, line in enumerate(lines) if line.startswith("warning:"))
    assert "dataset.scale" in lines[warning] and "PostgreSQL version" in lines[warning]
    table = next(i for i, line in enumerate(lines) if line.startswith(f"B ({other})"))
    title = " ".join(line.strip() for line in lines[table:table + 3])  # wrapped to the width, between words
    assert warning < table and f"B ({other}) relative to A ({results})" in title
    same = pglab("compare", str(results), str(results), check=True).stdout
    assert same.startswith("A and B: same plan") and "warning" not in same


def test_compare_refuses_sides_with_no_common_point(results: Path, tmp_path: Path) -> None:
    other = views_store(tmp_path / "b", VIEWS_PLAN)
    db = __import__("sqlite3").connect(other / "results.db")
    db.execute("UPDATE points SET axes = replace(axes, '\"clients\": 8', '\"clients\": 16')")
    db.execute("UPDATE points SET axes = replace(axes, '\"clients\": 1,', '\"clients\": 2,')")
    db.commit()
    db.close()
    proc = pglab("compare", str(results), str(other))
    assert proc.returncode == 2 and "no point of" in proc.stderr and "Traceback" not in proc.stderr


# the HTML page


@pytest.fixture(scope="module")
def page(results: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("html") / "report.html"
    pglab("report", str(results), "--html", str(out), check=True)
    return out, out.read_text()


def test_html_has_the_sections_and_leaves_out_the_empty_ones(page: tuple[Path, str]) -> None:
    path, html = page
    assert path.stat().st_size < 1_500_000
    for anchor in ("summary", "durability", "scaling", "disk", "runs-charts", "plan", "environment", "storage"):
        assert f'id="{anchor}"' in html and f'href="#{anchor}"' in html, anchor  # the section and its entry
    assert 'id="uplift' not in html and ">Uplift<" not in html
    assert "instances: 3" in html  # the plan's YAML
    assert "<td class=\"text\">cpu.model</td><td class=\"text long\">test CPU</td>" in html  # environment table
    assert re.search(r'<td class="">1,250 ± \d', html)  # intervals in the table, right-aligned as figures
    assert f"<td class=\"\">{61 / 18_000:.3g}</td>" in html  # the cost table's money: 0.00339
    # the durability chart: grouped bars with error bars, per workload, TPS and latency
    figure = html[html.index('id="durability-tpcb-like-tps"'):]
    figure = figure[: figure.index("</figure>")]
    assert figure.count("<rect") >= 2 * 2 * 1 + 2 and "M" in figure and "local" in figure and "remote_apply" in figure
    assert 'id="durability-select-only-latency_avg_ms"' in html
    # each mark's tooltip gives its figure and interval as the tables do: 1,250.0 ± …, never 1.25e+03
    tips = re.findall(r"<title>([^<]*)</title></(?:rect|circle)>", html)
    assert tips and all(re.fullmatch(r"[^:]+: [\d,.]+( ± [\d,.]+)?", t) for t in tips), tips
    # the run with the dip has its chart, TPS on a panel of its own (shaded dip)
    assert html.count('<figure id="run-') >= 1 and 'fill="#d62728" fill-opacity="0.12"' in html
    assert "<script" not in html and re.search(r'(src|href)="https?://', html) is None


def test_html_renders_in_chromium_offline(page: tuple[Path, str]) -> None:
    """Debian's Chromium, headless: no console error, no network request, the charts in the DOM; the
    screenshot is kept next to the page."""
    path, _ = page
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is installed by ./setup.sh test"
    out = path.parent
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={out / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
             "--enable-logging=stderr", "--v=0", f"--log-net-log={out / 'net.json'}", "--virtual-time-budget=4000",
             "--window-size=1400,3000", "--hide-scrollbars"]
    shot = subprocess.run([*flags, f"--screenshot={out / 'report.png'}", path.as_uri()], capture_output=True,
                          text=True, timeout=120)
    assert (out / "report.png").stat().st_size > 20_000, shot.stderr[-2000:]
    print(f"screenshot: {out / 'report.png'}")
    console = [line for line in shot.stderr.splitlines() if "CONSOLE" in line]
    assert not [line for line in console if "Uncaught" in line or "rror" in line], console
    net = json.loads((out / "net.json").read_text())
    kinds = {v: k for k, v in net["constants"]["logEventTypes"].items()}
    requests = [e.get("params", {}) for e in net["events"] if kinds.get(e["type"]) == "URL_REQUEST_START_JOB"]
    # the browser's own background requests have no origin; any the page made would
    from_page = [r.get("url") for r in requests if "url" in r and r.get("initiator") != "not an origin"
                 and r["url"] != path.as_uri()]
    assert from_page == []
    dom = subprocess.run([*flags, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<svg") >= 8 and 'id="durability-tpcb-like-tps"' in dom


def test_per_run_is_for_the_database_table_and_columns_work_in_markdown(results: Path) -> None:
    bad = pglab("report", str(results), "--per-run", "--table", "durability")
    assert bad.returncode == 2 and "--per-run: one row per run is for the database table" in bad.stderr
    md = pglab("report", str(results), "--format", "markdown", "--table", "database", "--columns",
               "tps,cpu_pct", check=True).stdout
    assert md.splitlines()[0] == "| workload | synchronous_commit | clients | tps | cpu_pct |"


def test_a_sweep_without_disk_figures_says_so_instead_of_an_empty_chart(tmp_path: Path) -> None:
    from pglab.report import html

    store = Store.open(tmp_path / "r")
    sweep = store.begin_sweep("t", "name: t\n", "h", "0")
    ids = store.add_points(sweep, [(i, f"k{i}", {"workload": "tpcb-like", "synchronous_commit": "on", "clients": c,
                                                  "jobs": 1}) for i, c in enumerate((1, 4))])
    for i in range(2):
        for rep in (1, 2):
            run_id, _ = store.start_run(sweep, ids[f"k{i}"], i, rep)
            store.finish_run(run_id, "ok", metrics={"tps": 100.0 * (i + 1) + rep, "latency_p99_ms": 2.0})
    store.end_sweep(sweep, "done")
    page = html.build(store)
    assert "The disk was not measured for this sweep" in page and 'id="disk"' not in page
    assert 'id="scaling-tpcb-like-tps"' in page and 'id="durability' not in page  # one level: no durability chart


def test_per_run_table_says_why_a_run_failed_below_it(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "r")
    sweep = store.begin_sweep("t", "name: t\n", "h", "0")
    ids = store.add_points(sweep, [(0, "k0", {"workload": "tpcb-like", "synchronous_commit": "on", "clients": 1,
                                              "jobs": 1})])
    ok, _ = store.start_run(sweep, ids["k0"], 0, 1)
    store.finish_run(ok, "ok", metrics={"tps": 100.0})
    failed, _ = store.start_run(sweep, ids["k0"], 0, 2)
    store.finish_run(failed, "failed", reason="pgbench was killed by SIGKILL")
    store.end_sweep(sweep, "done")
    store.close()
    text = pglab("report", str(tmp_path / "r"), "--per-run", env=_env(None), check=True).stdout
    assert f"\n{failed} failed: pgbench was killed by SIGKILL\n" in text
    assert max(len(line) for line in text.splitlines()) <= 120


def test_error_bars_stay_inside_the_chart() -> None:
    """The axis reaches past the highest value plus its interval, and stops at zero for figures that cannot
    go below it: every error bar is drawn inside the frame."""
    from pglab.report import svg

    chart = svg.categories("t", ["1", "8"], [svg.Series("a", [6371.4, 5000.0], [9000.0, 1000.0]),
                                             svg.Series("b", [6700.0, None], [2000.0, None])], "TPS", "clients")
    bars = re.findall(r'<path d="M([\d.]+),([\d.]+)V([\d.]+)', chart)
    assert len(bars) == 3
    plot_bottom = svg.TOP + 300 - svg.TOP - 44
    for _x, low, high in bars:
        assert svg.TOP <= float(high) < float(low) <= plot_bottom
    assert svg.categories("t", ["1"], [svg.Series("a", [None])], "TPS", "clients") == ""
