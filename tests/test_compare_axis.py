"""`pglab compare --axis` along an axis that other axes follow (issue 31): pglab's default jobs follow clients
(min(clients, cores)), so clients 1 against 8 is also jobs 1 against 2; the comparison takes them along, and when
nothing can match it says why in one sentence (exit 2)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from conftest import pglab
from helpers import make_store, tps_runs
from pglab.analysis.compare import compare_within


def _sweep(path: Path, jobs: dict[int, list[int]]) -> Path:
    points = []
    for sc in ("local", "on"):
        for clients, js in jobs.items():
            for j in js:
                base = 100.0 * clients * (1 if sc == "local" else 0.5)
                points.append(({"workload": "tpcb-like", "synchronous_commit": sc, "clients": clients, "jobs": j},
                               tps_runs(base, base * 1.01, base * 0.99)))
    make_store(path, points).close()
    return path


def test_jobs_that_follow_clients_are_compared_along(tmp_path: Path) -> None:
    results = _sweep(tmp_path / "r", {1: [1], 8: [2]})
    from pglab.store import Store

    columns, rows = compare_within(Store.open(results, create=False), "clients", "1", "8", metrics=("tps",))
    assert "jobs" not in columns and "clients" not in columns
    assert [(r["synchronous_commit"], r["tps_verdict"]) for r in rows] == [("local", "faster"), ("on", "faster")]
    assert [r["tps_delta_pct"] for r in rows] == [pytest.approx(700.0), pytest.approx(700.0)]
    proc = pglab("compare", str(results), "--axis", "clients", "--a", "1", "--b", "8", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    table = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert len(table) == 2 and {r["tps_verdict"] for r in table} == {"faster"}
    text = pglab("compare", str(results), "--axis", "clients", "--a", "1", "--b", "8", check=True).stdout
    assert "B (clients=8, jobs=2) relative to A (clients=1, jobs=1)" in text
    assert "only in" not in text


def test_nothing_matching_is_one_sentence(tmp_path: Path) -> None:
    # jobs a real axis (jobs: [4, 8]): at 1 client it is 1, at 8 clients 4 and 8; no point of one matches the other
    results = _sweep(tmp_path / "r", {1: [1], 8: [4, 8]})
    proc = pglab("compare", str(results), "--axis", "clients", "--a", "1", "--b", "8")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: compare: no point with clients=1 matches one with clients=8: jobs is 1 with clients=1 and 4, 8 with "
        "clients=8; compare values of clients measured at the same jobs."]
