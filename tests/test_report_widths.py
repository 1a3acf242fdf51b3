"""Widths (issue 31): every line `pglab report` and `pglab compare` print fits the terminal (COLUMNS), or 120
columns when piped, titles included; what is left out to fit says so, and `--wide` (which both commands take)
shows it all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import pglab
from helpers import views_store


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a long folder name, as a real results path is: titles that name it must wrap, not overflow
    return views_store(tmp_path_factory.mktemp("widths") / ("results-of-a-sweep-with-a-long-name-" + "x" * 40))


def _env(columns: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return env


def _widest(text: str, path: Path | None = None) -> int:
    """The widest line; with ``path``, a line that is only that path (a title wraps between words, never in a
    path) does not count."""
    return max(len(line) for line in text.splitlines() if path is None or line.strip(" :") != str(path))


def test_the_whole_report_fits_80_columns(results: Path) -> None:
    text = pglab("report", str(results), env=_env(80), check=True).stdout
    assert "price of durability" in text and "cost at peak TPS" in text  # the durability and cost tables are there
    assert _widest(text) <= 80, "\n".join(line for line in text.splitlines() if len(line) > 80)
    durability = pglab("report", str(results), "--table", "durability", env=_env(80), check=True).stdout
    assert _widest(durability) <= 80
    assert "--wide shows every column" in durability
    wide = pglab("report", str(results), "--table", "durability", "--wide", env=_env(80), check=True).stdout
    assert "remote_apply tps verdict" in wide and _widest(wide) > 80


@pytest.mark.parametrize("uplift", [False, True])
def test_compare_fits_the_terminal_and_a_pipe(results: Path, uplift: bool) -> None:
    args = ["compare", str(results), "--axis", "synchronous_commit", "--a", "local", "--b", "remote_apply"]
    if uplift:
        args.append("--uplift")
    piped = pglab(*args, env=_env(None), check=True).stdout
    assert "-16.7 % [-18.6, -14.7]" in piped and str(results) in piped.replace("\n  ", " ")
    assert _widest(piped) <= 120
    narrow = pglab(*args, env=_env(80), check=True).stdout
    assert _widest(narrow, results) <= 80 and "-16.7 % [-18.6, -14.7]" in narrow
    assert "--wide shows every column" in narrow  # and compare takes --wide:
    wide = pglab(*args, "--wide", env=_env(80), check=True).stdout
    assert _widest(wide) > 80
    for header in (("jobs", "flags") if uplift else ("A runs", "B runs", "Δ lat % [95 %]", "lat verdict")):
        assert header in wide and header not in narrow.split("(left out")[0], header
