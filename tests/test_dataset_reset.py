"""The lab loads the dataset on its primary alone, snapshots it, builds the standbys from the snapshot, and
``dataset.reset: snapshot`` puts every instance back to it between runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import processes_mentioning
from helpers import Ran
from pglab.plan.schema import Dataset, LocalTarget
from pglab.targets.local.cluster import LocalLab, Node

pytestmark = pytest.mark.postgres

ACCOUNTS = """SELECT count(*), md5(string_agg(aid || ':' || bid || ':' || abalance, ',' ORDER BY aid))
FROM pgbench_accounts"""


def _content(lab: LocalLab, node: Node) -> tuple[Any, ...]:
    with lab.connect(node) as conn:
        row = conn.execute(ACCOUNTS).fetchone()
        history = conn.execute("SELECT count(*) FROM pgbench_history").fetchone()
    assert row is not None and history is not None
    return (*row, history[0])


def _wait_replayed(lab: LocalLab) -> None:
    with lab.connect(lab.nodes[0]) as conn:
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
    deadline = time.monotonic() + 30
    for node in lab.nodes[1:]:
        with lab.connect(node) as conn:
            while conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", lsn).fetchone() != (True,):
                assert time.monotonic() < deadline, f"{node.name} did not replay"
                time.sleep(0.1)


def test_reset_puts_every_instance_back_to_the_snapshot() -> None:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    os.chmod(base, 0o711)
    lab = LocalLab(LocalTarget(instances=2, synchronous={"method": "any", "number": 1}), base,
                   dataset=Dataset(scale=2))
    try:
        endpoints = lab.provision({})
        primary, standby = lab.nodes
        info = lab.describe()["dataset"]
        assert info["snapshot_bytes"] > 0 and info["load_s"] > 0
        assert not lab.log_tail(standby, 200).count("pg_basebackup")
        _wait_replayed(lab)
        loaded = _content(lab, primary)
        assert loaded[0] == 200_000 and loaded[2] == 0
        assert _content(lab, standby) == loaded  # the standby is the snapshot, streaming
        # a run's writes
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | endpoints.primary.env()
        subprocess.run([str(lab.bindir / "pgbench"), "-n", "-c", "2", "-t", "300"], env=env, check=True,
                       capture_output=True)
        _wait_replayed(lab)
        written = _content(lab, primary)
        assert written != loaded and written[2] == 600

        report = lab.reset_dataset()
        assert set(report["method"]) == {"n0", "n1"}
        assert _content(lab, primary) == loaded  # byte for byte the snapshot's rows, no history
        _wait_replayed(lab)
        assert _content(lab, standby) == loaded
        lab.wait_streaming(10)
        with lab.connect(primary) as conn:  # synchronous replication works again: a commit waits for n1
            assert conn.execute("SHOW synchronous_standby_names").fetchone() == ("ANY 1 (n1)",)
            conn.execute("UPDATE pgbench_branches SET bbalance = 5 WHERE bid = 1")
            row = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
            assert row == ("quorum",)
        _wait_replayed(lab)
        with lab.connect(standby) as conn:
            assert conn.execute("SELECT bbalance FROM pgbench_branches WHERE bid = 1").fetchone() == (5,)
        events = [e[1] for e in lab.take_events()]
        assert events == ["dataset-reset"]
    finally:
        lab_dir = lab.lab_dir
        lab.teardown()
        shutil.rmtree(base, ignore_errors=True)
    assert lab_dir is not None and not lab_dir.exists()
    assert processes_mentioning(str(lab_dir)) == []


def test_a_sweep_with_snapshot_resets_starts_every_run_from_the_loaded_dataset(
        tmp_path: Path, run_in_tmp: Callable[..., Ran]) -> None:
    os.chmod(tmp_path, 0o711)
    ran = run_in_tmp("""
name: snapshot-reset
target: {local: {instances: 2, synchronous: {number: 1}}}
dataset: {scale: 1, reset: snapshot}
matrix: {workload: [tpcb-like], clients: [2]}
run: {duration: 2s, repeats: 2}
""")
    assert "NOT applied" not in ran.proc.stdout + ran.proc.stderr  # no limits asked, none reported missing
    resets = ran.events("dataset-reset")
    assert len(resets) == 2, resets
    for run in (ran.results / "runs").iterdir():
        assert json.loads((run / "dataset-reset.json").read_text())["method"].keys() == {"n0", "n1"}
    assert ran.sweep()["target"]["dataset"]["snapshot_method"]
