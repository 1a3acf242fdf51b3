"""Shell completion of --format on every command that takes it, and "did you mean" for a misspelt plan field
(issue 31). Nothing here starts a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import pglab, shell_complete


@pytest.mark.parametrize(("words", "expected"), [
    ("pglab report results --format ", ["table", "markdown", "csv", "json"]),
    ("pglab compare a b --format ", ["table", "markdown", "csv", "json"]),
    ("pglab export results --format ", ["csv", "json", "parquet"]),
    ("pglab export results --format p", ["parquet"]),
    ("pglab report results --format m", ["markdown"]),
])
def test_format_is_completed_everywhere(words: str, expected: list[str]) -> None:
    assert shell_complete(words) == expected


def test_export_completes_what_it_accepts() -> None:
    from pglab.cli import EXPORT_FORMATS
    from pglab.report.export import FORMATS

    assert EXPORT_FORMATS == FORMATS


@pytest.mark.parametrize(("body", "line"), [
    ("matrix: {clents: [1, 4]}", "matrix.clents: unknown field; did you mean 'clients'?"),
    ("rn: {duration: 5}", "rn: unknown field; did you mean 'run'?"),
    ("target: {local: {instnces: 2}}", "target.local.instnces: unknown field; did you mean 'instances'?"),
    ("target: {local: {resources: {cpu: 1}}}", "target.local.resources.cpu: unknown field; did you mean 'cpus'?"),
    ("matrix: {workload: [{name: w, scripts: [{file: a.sql, wieght: 2}]}]}",
     "matrix.workload[0].scripts[0].wieght: unknown field; did you mean 'weight'?"),
    ("bogus: 1", "bogus: unknown field; remove it or check its spelling"),  # nothing close: no guess
])
def test_an_unknown_field_gets_the_closest_name(tmp_path: Path, body: str, line: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: t\n{body}\n")
    proc = pglab("plan", "validate", str(plan))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [line]
