"""Without --results a run writes results/<plan name> (issue 20), so the README's `pglab report results/NAME`
finds it: a second run of the same plan resumes there (nothing run twice), a changed plan is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import pglab
from helpers import read_store
from pglab import __version__

pytestmark = pytest.mark.postgres

PLAN = "name: by-name\ntarget: {local: {instances: 1}}\ndataset: {scale: 1}\nrun: {transactions: 10}\n"


def test_default_results_folder_is_the_plan_name(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    first = pglab("run", str(plan), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    results = tmp_path / "results" / "by-name"
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["by-name"]
    assert pglab("report", "results/by-name", cwd=tmp_path).returncode == 0
    again = pglab("run", str(plan), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "completed before this resume" in again.stderr
    with read_store(results) as store:
        (sweep,) = store.sweeps()
        environment = store.sweep_environment(sweep["id"])
        assert sweep["pglab_version"] == __version__ and environment is not None
        assert environment["pglab_version"] == __version__  # = --version
        assert len(store.runs()) == 1  # nothing run twice
    plan.write_text(PLAN.replace("transactions: 10", "transactions: 20"))
    changed = pglab("run", str(plan), cwd=tmp_path)
    assert changed.returncode == 2 and "holds a sweep of a different plan" in changed.stderr, changed.stderr
