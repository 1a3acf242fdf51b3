"""Replication link latency through Toxiproxy: a synchronous commit pays the configured round trip, a local one
does not; each standby streams through its proxy."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import processes_mentioning, run_plan
from helpers import sweep_row

pytestmark = [pytest.mark.postgres, pytest.mark.quiet]

RTT_MS = 40


def test_synchronous_commit_pays_the_round_trip_and_local_does_not() -> None:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    os.chmod(base, 0o711)
    (base / "insert.sql").write_text("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) "
                                     "VALUES (1, 1, 1, 1, now());\n")
    plan = base / "plan.yaml"
    plan.write_text(f"""
name: network
target: {{local: {{instances: 2, synchronous: {{number: 1}}, network: {{latency_ms: {RTT_MS}}}}}}}
dataset: {{scale: 1}}
matrix:
  workload: [{{name: commit, scripts: [{{file: insert.sql}}]}}]
  clients: [1]
  synchronous_commit: [local, "on"]
run: {{duration: 3s, repeats: 1}}
""")
    results = base / "r"
    try:
        proc = run_plan(plan, results, "--format", "json").proc
        lat = {row["synchronous_commit"]: row["latency_avg_ms"] for row in json.loads(proc.stdout)}
        assert lat["local"] < RTT_MS / 4, lat  # a local commit does not cross the link
        # an 'on' commit waits one round trip (measured +45..55 ms for 40 ms on a loaded 2-core machine:
        # scheduling delays at each hop add up)
        assert 0.8 * RTT_MS <= lat["on"] - lat["local"] <= 1.75 * RTT_MS, lat
        links = [json.loads(p.read_text()) for p in (results / "runs").glob("*/network.json")]
        assert len(links) == 2 and all(link["n1"]["latency_ms"] == RTT_MS for link in links)
        target = sweep_row(results)["target"]
        assert target["nodes"][1]["via_proxy_port"] != target["nodes"][0]["port"]
        assert processes_mentioning(target["lab_dir"]) == []  # toxiproxy stopped with the lab
    finally:
        shutil.rmtree(base, ignore_errors=True)
