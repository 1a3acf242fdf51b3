"""The HTML report's rough edges (issue 31): a chart's caption promises error bars only when it draws them (the
disk's write IOPS now has them), the environment shows its key rows and folds the rest, and the comparison
tables show each interval once, in its Δ's cell."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import pglab
from helpers import VIEWS_ENVIRONMENT, tps_store, views_store

ERROR_BAR = re.compile(r'<path d="M[\d.]+,[\d.]+V[\d.]+M')  # svg.categories' bar: a vertical line and two caps


def _figures(html: str) -> dict[str, tuple[str, str]]:
    """Each chart's id → (its SVG, its caption)."""
    return {m.group(1): (m.group(2), m.group(3)) for m in
            re.finditer(r'<figure id="([^"]+)">(.*?)<figcaption>(.*?)</figcaption></figure>', html, re.S)}


def _html(results: Path, tmp_path: Path) -> str:
    out = tmp_path / "report.html"
    pglab("report", str(results), "--html", str(out), check=True)
    return out.read_text()


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> str:
    settings = {f"setting_{i}": {"setting": str(i), "unit": "", "source": "configuration file"} for i in range(120)}
    environment = {**VIEWS_ENVIRONMENT, "kernel": {"release": "6.1.0-test", "machine": "x86_64"},
                   "memory": {"total_bytes": 4 << 30, "swap_bytes": 0},
                   "postgres": {**VIEWS_ENVIRONMENT["postgres"], "non_default_settings": settings}}
    folder = tmp_path_factory.mktemp("html")
    return _html(views_store(folder / "r", environment=environment), folder)


def test_every_caption_that_promises_error_bars_has_them(page: str) -> None:
    figures = {k: v for k, v in _figures(page).items() if not k.startswith("run-")}
    disk = [k for k in figures if k.startswith("disk-")]
    assert disk == ["disk-tpcb-like-write_iops", "disk-select-only-write_iops"]
    for chart, (svg, caption) in figures.items():
        assert "(error bars: 95 % interval)" in caption, chart  # three runs a point: every chart has intervals
        assert ERROR_BAR.search(svg), chart  # … and draws them


def test_a_caption_without_intervals_says_so(tmp_path: Path) -> None:
    results = tps_store(tmp_path / "r", {("tpcb-like", "local", 1): [100.0], ("tpcb-like", "on", 1): [90.0],
                                ("tpcb-like", "local", 8): [400.0], ("tpcb-like", "on", 8): [300.0]})
    figures = _figures(_html(results, tmp_path))
    assert figures
    for chart, (svg, caption) in figures.items():
        assert "error bars: 95 %" not in caption and "no error bars: fewer than 2 runs a point" in caption, chart
        assert not ERROR_BAR.search(svg), chart


def test_the_environment_shows_its_key_rows_and_folds_the_rest(page: str) -> None:
    section = page[page.index('<h2 id="environment">'):]
    key = section[: section.index("<details")]
    rows = re.findall(r'<tr><td class="text">([^<]+)</td>', key)
    assert set(rows) == {"pglab_version", "cpu.model", "cpu.count", "cpu.affinity", "memory.total_bytes",
                         "kernel.release", "kernel.machine", "postgres.version", "postgres.version_num",
                         "paths.n0.data.fstype", "paths.n0.data.source", "paths.n0.data.mount_options"}, rows
    folded = section[section.index("<details"): section.index("</details>")]
    assert "postgres.non_default_settings.setting_119" in folded and "setting_119" not in key
    assert len(re.findall(r"<tr><td", folded)) > 120


def test_comparison_tables_show_each_interval_once(page: str) -> None:
    table = page[page.index('<h2 id="durability-table">'):]
    table = table[: table.index("</table>")]
    assert "-16.7 % [-18.6, -14.7]" in table  # the interval, in the Δ's cell
    assert "ci95_low_pct" not in table and "ci95_high_pct" not in table
