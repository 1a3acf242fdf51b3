"""The reset before a run skips VACUUM and ANALYZE when every run since the last full reset only read (issue 33,
item 1: nothing between windows that is not needed). The primary's own statement log is the oracle: between two
runs' transactions it shows what the reset sent, and each run's transactions show whether that run wrote."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import run_plan
from pglab.plan.expand import expand
from pglab.plan.load import parse_plan

pytestmark = pytest.mark.postgres

PLAN = """
name: reads
target:
  local:
    instances: 2
    synchronous: {method: any, number: 1}
postgres:
  parameters: {log_statement: all}
dataset: {scale: 1}
matrix:
  workload: [select-only, tpcb-like]
  clients: [1]
run: {transactions: 20, repeats: 2, order: sequential}
"""


def _tokens(log: str) -> list[str]:
    """The primary's statements, in order, as W (a transaction's write to pgbench_accounts), R (a read of it),
    V (the reset's VACUUM) and C (its CHECKPOINT); every other statement left out."""
    out = []
    for line in log.splitlines():
        statement = line.partition("statement: ")[2]
        if statement.startswith("UPDATE pgbench_accounts"):
            out.append("W")
        elif statement.startswith("SELECT abalance FROM pgbench_accounts"):
            out.append("R")
        elif statement.startswith("VACUUM"):
            out.append("V")
        elif statement.strip() == "CHECKPOINT":
            out.append("C")
    return out


def test_a_reset_after_runs_that_only_read_is_the_checkpoint_alone(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    results = tmp_path / "r"
    run_plan(plan, results)
    tokens = "".join(_tokens((results / "server-logs" / "n0.log").read_text(errors="replace")))
    runs = re.findall(r"[WR]+", tokens)  # each run's transactions; resets lie between them
    resets = re.split(r"[WR]+", tokens)[:-1]  # what came before each run (the last piece: after the last run)
    assert len(runs) == 4 and len(resets) == 4, tokens
    assert sorted("W" in r for r in runs) == [False, False, True, True], tokens  # 2 select-only, 2 tpcb-like
    assert resets[0].endswith("VC"), tokens  # the first run after the full reset
    for before, reset in zip(runs[:-1], resets[1:], strict=True):
        wrote = "W" in before
        assert reset.endswith("VC" if wrote else "C") and reset.count("V") == int(wrote), (before, reset, tokens)


def test_only_the_builtin_select_only_reads_only(tmp_path: Path) -> None:
    (tmp_path / "w.sql").write_text("SELECT 1;\n")
    text = """
name: ro
target: {local: {instances: 2}}
matrix:
  workload:
    - select-only
    - tpcb-like
    - {name: two-reads, scripts: [{builtin: select-only, weight: 3}, {builtin: select-only}]}
    - {name: mixed, scripts: [{builtin: select-only, weight: 9}, {builtin: simple-update}]}
    - {name: file, scripts: [{file: w.sql}]}
  clients: [1]
"""
    points = expand(parse_plan(text, base_dir=tmp_path))
    assert {p.workload_name: p.reads_only for p in points} == {
        "select-only": True, "tpcb-like": False, "two-reads": True, "mixed": False, "file": False}
    with_backup = text.replace("  clients: [1]", "  clients: [1]\n  scenario: [{kind: backup, at: 5s}]")
    assert [p.reads_only for p in expand(parse_plan(with_backup, base_dir=tmp_path))] == [False] * 5
