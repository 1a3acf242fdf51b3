"""``pglab noise``: the host's noise floor, from identical runs of a plan's first point in one real lab.

The figures printed are checked against the test's own arithmetic on the TPS the store holds (statistics from
numpy and scipy, not pglab's); the A/A plan is checked as a plan: one point, no storage phase, no scenario."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from conftest import pglab
from pglab.errors import UserError
from pglab.plan.expand import expand
from pglab.plan.noise import noise_plan
from pglab.store.sqlite import Store

PLAN = """
name: tiny
target: {local: {instances: 1}}
dataset: {scale: 1}
matrix:
  workload: [select-only, tpcb-like]
  clients: [2, 4]
  parameters: {work_mem: [4MB, 8MB]}
  scenario: [{kind: backup, at: 1s}]
run: {duration: 3s, repeats: 2, seed: 5}
storage: {size: 64MiB}
"""


@pytest.mark.unit
def test_the_aa_plan_is_the_first_point_only_without_storage_or_scenario_repeated_in_sequence() -> None:
    plan, text = noise_plan(PLAN, 6)
    [point] = expand(plan)
    assert (point.workload_name, point.clients, point.parameters, point.scenario) == (
        "select-only", 2, {"work_mem": "4MB"}, None)
    assert plan.storage is None and plan.run.repeats == 6 and plan.run.order == "sequential"
    assert plan.run.duration == 3 and plan.name == "tiny-noise" and "seed" not in text
    for repeats in (3, 2, 7):
        with pytest.raises(UserError, match="--repeats"):
            noise_plan(PLAN, repeats)


@pytest.mark.postgres
def test_pglab_noise_prints_the_spread_of_identical_runs_as_the_store_holds_them(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    results = tmp_path / "res"
    proc = pglab("noise", str(plan), "--repeats", "4", "--results", str(results), timeout=300)
    assert proc.returncode == 0, proc.stderr
    store = Store.open(results, create=False)
    try:
        runs = store.runs(store.latest_sweep_id())
    finally:
        store.close()
    tps = np.array([r.metrics["tps"] for r in runs if r.status == "ok"], dtype=float)
    assert len(tps) == 4 and {r.axes["clients"] for r in runs} == {2}
    cv = tps.std(ddof=1) / tps.mean() * 100
    assert f"TPS of 4 identical runs: mean {tps.mean():.1f}, run-to-run CV {cv:.2f} %" in proc.stdout, proc.stdout
    odd, even = tps[0::2], tps[1::2]
    delta = (even.mean() - odd.mean()) / odd.mean() * 100
    assert f"A/A (even runs vs odd runs, 2 each): {delta:+.2f} % [" in proc.stdout, proc.stdout
    half = stats.t.ppf(0.975, 4) * tps.std(ddof=1) * math.sqrt(2 / 3) / tps.mean() * 100
    assert f"±{half:.1f} % with 3 runs per side" in proc.stdout


@pytest.mark.unit
def test_pglab_noise_refuses_an_odd_repeat_count_before_anything_starts(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    proc = pglab("noise", str(plan), "--repeats", "5", "--results", str(tmp_path / "res"), timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--repeats" in proc.stderr
    assert not (tmp_path / "res").exists()
