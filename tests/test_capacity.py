"""The capacity search (issue 29 item 2) against a server of known capacity: every transaction is a 50 ms
pg_sleep, and four clients can finish at most 80 of them a second, so no rate above that can be held, and at a
quarter of it a transaction rarely waits for a client (the target, 200 ms, leaves room for a loaded machine's
jitter). The search's answer is checked against its own stored probe runs (each a run whose
figures tests/test_rate.py checks against pgbench)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import pglab, run_plan
from helpers import Ran

pytestmark = pytest.mark.postgres

SERVICE_S = 0.050
CLIENTS = 4

PLAN = f"""
name: capacity
target: {{local: {{instances: 1}}}}
dataset: {{scale: 1}}
matrix:
  workload: [{{name: sleep, scripts: [{{file: sleep.sql}}]}}]
  clients: [{CLIENTS}]
run: {{duration: 4s, repeats: 1, order: sequential}}
probes: {{enabled: false}}
capacity: {{percentile: 99, target: TARGET, precision_pct: 10, max_probes: PROBES}}
"""


def _search(tmp_path: Path, run_in_tmp: Callable[..., Ran], target: str, probes: int) -> tuple[Ran, str]:
    (tmp_path / "sleep.sql").write_text(f"SELECT pg_sleep({SERVICE_S});\n")
    ran = run_in_tmp(PLAN.replace("TARGET", target).replace("PROBES", str(probes)))
    events = ran.events("capacity")
    assert len(events) == 1, events
    return ran, events[0][2] or ""


def test_the_search_finds_the_highest_rate_that_holds_the_target(tmp_path: Path,
                                                                  run_in_tmp: Callable[..., Ran]) -> None:
    ran, detail = _search(tmp_path, run_in_tmp, "200ms", 8)
    runs = ran.runs()
    assert all(r.status == "ok" for r in runs) and 3 <= len(runs) <= 8
    closed, *probes = runs
    # the progress lines count against the search's most runs, which it may not need
    announced = re.findall(r"^run (\d+) of at most 8: ", ran.proc.stderr + ran.proc.stdout, re.MULTILINE)
    assert announced == [str(i) for i in range(1, len(runs) + 1)], ran.proc.stderr[-2000:]
    assert "rate" not in closed.axes  # the closed loop first: the clients' own pace
    top = closed.metrics["tps"]
    assert top is not None and top <= CLIENTS / SERVICE_S
    rates = [r.axes["rate"] for r in probes]
    assert rates[0] == round(top) and len(set(rates)) == len(rates)  # then its pace, then new rates only
    held = {r.axes["rate"]: (r.metrics["latency_p99_ms"] or 1e9) <= 200 and (r.metrics.get("skipped_pct") or 0) <= 1
            for r in probes}
    m = re.search(r": (\d+) tx/s \(below (\d+)\)", detail)
    assert m is not None, detail
    capacity, failing = float(m.group(1)), float(m.group(2))
    # the answer is the highest rate that held, the bound the lowest that did not, and nothing held above it
    assert held[capacity] and not held[failing] and capacity < failing
    assert capacity == max(r for r, ok in held.items() if ok)
    assert failing == min(r for r, ok in held.items() if not ok and r > capacity)
    assert failing - capacity <= failing * 0.10 or len(runs) == 8
    # the server's known limits: below its service rate, and well above a quarter of it
    assert CLIENTS / SERVICE_S / 4 <= capacity < CLIENTS / SERVICE_S

    # the report's capacity table says the same, read back from the stored probes
    table = pglab("report", str(ran.results), "--table", "capacity", "--format", "csv", check=True).stdout
    row = dict(zip(*(line.split(",") for line in table.splitlines()), strict=True))
    assert (float(row["capacity_tps"]), float(row["failed_at_tps"]), int(row["runs"])) == (capacity, failing,
                                                                                            len(runs))
    assert float(row["closed_loop_tps"]) == top and float(row["target_ms"]) == 200
    assert row["capacity_low_tps"] == row["capacity_high_tps"] == "" and row["repeats"] == "1"  # one run a rate
    # compare on capacities: one run per rate gives no interval, so no direction, even against itself
    compared = pglab("compare", str(ran.results), str(ran.results), "--uplift", "--format", "csv", check=True).stdout
    crow = dict(zip(*(line.split(",") for line in compared.splitlines()), strict=True))
    assert (float(crow["capacity_a"]), float(crow["capacity_b"]), crow["verdict"]) == (capacity, capacity,
                                                                                       "no interval")
    run_plan(tmp_path / "plan.yaml", ran.results)  # the same plan again: every probe is stored, none runs again
    assert [r.id for r in ran.runs()] == [r.id for r in runs]


def test_a_target_no_rate_can_hold_finds_no_capacity(tmp_path: Path, run_in_tmp: Callable[..., Ran]) -> None:
    ran, detail = _search(tmp_path, run_in_tmp, "20ms", 3)  # every transaction takes 50 ms
    assert "no capacity found" in detail and "3 runs" in detail, detail
    assert len(ran.runs()) == 3
    assert all((r.metrics["latency_p99_ms"] or 0) > 20 for r in ran.runs())
