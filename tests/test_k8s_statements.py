"""pg_stat_statements on a Kubernetes run (issue 29 item 5): the run Job reads the view around pgbench when a
``pg_stat_statements.*`` parameter makes CloudNativePG load it, and the sweep keeps statements.json as a local run
does. The reads' SQL and shell are run against a real server in tests/test_probes_why.py; here the rendered Job and
the sweep against the fake API, whose run Job ships two reads as psql prints them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from k8s_fake import FakeAPI, results_log
from k8s_support import PGBENCH, TXN_LOGS, k8s_plan, pod_log, run
from k8s_support import statements_read as _read
from k8s_support import statements_row as _row
from pglab.plan.load import parse_plan
from pglab.targets.kubernetes.render import render
from pglab.targets.kubernetes.statements import END_FILE, ERR_FILE, MARK, NOT_READ_FILE, START_FILE

PLAN = k8s_plan("postgres:\n  parameters: {pg_stat_statements.max: '1000'}", "matrix: {clients: [1]}",
                "run: {duration: 4s}")
UPDATE, SELECT, INSERT = "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2", \
    "SELECT abalance FROM pgbench_accounts WHERE aid = $1", "INSERT INTO pgbench_history VALUES ($1, $2, $3, $4)"


def _scripts(text: str, tmp_path: Path) -> list[str]:
    plan = parse_plan(text, base_dir=tmp_path)
    return [m.body["spec"]["template"]["spec"]["containers"][0]["command"][2] for m in render(plan, tmp_path)
            if m.body["metadata"]["labels"].get("pglab/component") == "pgbench-run"]


def test_the_run_job_reads_the_view_around_pgbench_only_when_it_is_loaded(tmp_path: Path) -> None:
    (script,) = _scripts(PLAN, tmp_path)
    assert (script.index("settings.txt") < script.index("TRUNCATE") < script.index(f"statements_read {START_FILE}")
            < script.index("pgbench -n") < script.index(f"statements_read {END_FILE}") < script.index("base64"))
    assert f"2>> {ERR_FILE} || true" in script  # a read that fails fails nothing
    (warm,) = _scripts(PLAN.replace("duration: 4s", "duration: 4s, warmup: 2s"), tmp_path)
    reader = next(line for line in warm.splitlines() if line.startswith("(until [ -e pgbench.err ]"))
    assert f"sleep 2; statements_read {START_FILE}) &" in reader  # the warm-up's end, pgbench running
    assert warm.index(reader) < warm.index("pgbench -n") < warm.index('wait "$window_reader"')
    for other in (PLAN.replace("{pg_stat_statements.max: '1000'}", "{work_mem: 8MB}"),  # not loaded
                  PLAN + "probes: {enabled: false}\n"):
        assert all("statements_read" not in s for s in _scripts(other, tmp_path)), other
        assert all(NOT_READ_FILE not in s for s in _scripts(other, tmp_path)), other


START = _read(1700000000.5, [_row(16385, 11, UPDATE, 10, 5.0, wal_bytes=1000), _row(16385, 12, SELECT, 5, 1.0),
                             _row(None, None, "<insufficient privilege>", 40, 9.0)], 0)
END = _read(1700000004.5, [_row(16385, 11, UPDATE, 110, 65.0, wal_bytes=11000), _row(16385, 12, SELECT, 55, 11.0),
                           _row(16385, 13, INSERT, 100, 24.0),
                           _row(16385, 14, f"SELECT /* {MARK} */ jsonb_build_object($1, ...)", 1, 0.5),
                           _row(None, None, "<insufficient privilege>", 80, 18.0)], 0)


def with_reads(api: FakeAPI) -> Callable[[str], str]:
    """The plan's Jobs; a run Job's also ships settings.txt (the parameter in force) and the two reads."""

    def log(job: str) -> str:
        if "-run-" not in job:
            return pod_log(job)
        files = {name: (PGBENCH / name).read_text() for name in ("pgbench.out", "pgbench.err", *TXN_LOGS)}
        return results_log({**files, "settings.txt": "pg_stat_statements.max|1000||f|t\n",
                            START_FILE: START, END_FILE: END, ERR_FILE: ""}, text="")

    return log


def test_a_kubernetes_run_keeps_the_window_statements_as_a_local_run_does(fake: tuple[FakeAPI, client.ApiClient],
                                                                          tmp_path: Path) -> None:
    api, api_client = fake
    api.default_log = with_reads(api)
    result = run(api_client, tmp_path, PLAN)
    assert (result.ok, result.failed) == (1, 0), result.failures
    (created,) = [b for b in api.posted if b["kind"] == "Cluster"]
    assert created["spec"]["postgresql"]["parameters"] == {"pg_stat_statements.max": "1000"}  # CNPG loads it
    run_dir = next((tmp_path / "results" / "runs").iterdir())
    doc = json.loads((run_dir / "statements.json").read_text())
    assert doc["window"] == [1700000000.5, 1700000004.5] and doc["source"] == "pg_stat_statements 1.10"
    assert doc["evicted"] == 0 and "other roles' statements" in doc["note"]
    got = {s["query"]: s for s in doc["statements"]}
    assert list(got) == [UPDATE, INSERT, SELECT]  # most time first; neither the reads' own nor the hidden rows
    assert (got[UPDATE]["calls"], got[UPDATE]["total_exec_time"], got[UPDATE]["wal_bytes"]) == (100, 60.0, 10000.0)
    assert (got[SELECT]["calls"], got[SELECT]["rows"], got[SELECT]["shared_blks_hit"]) == (50, 50, 200)
    assert got[INSERT]["calls"] == 100 and got[INSERT]["mean_exec_time"] == 0.24  # new in the window: from zero
    assert got[UPDATE]["userid"] == 16385 and got[UPDATE]["queryid"] == 11 and got[UPDATE]["toplevel"] is True
    assert [s["time_pct"] for s in doc["statements"]] == pytest.approx([60 / 94 * 100, 24 / 94 * 100, 10 / 94 * 100])
    record = json.loads((run_dir / "run.json").read_text())["statements"]
    assert record["count"] == 3 and record["top"][0] == {"query": UPDATE, "calls": 100, "total_exec_time_ms": 60.0,
                                                         "mean_exec_time_ms": 0.6, "time_pct": 60 / 94 * 100}
    assert not (run_dir / "probe-errors.txt").exists()


def test_a_view_that_did_not_answer_leaves_no_artifact_and_no_error(fake: tuple[FakeAPI, client.ApiClient],
                                                                     tmp_path: Path) -> None:
    """The extension not there yet (psql's error in statements.err, the epoch alone in the read): no statements,
    the run ok."""
    api, api_client = fake
    base = with_reads(api)

    def log(job: str) -> str:
        text = base(job)
        return text if "-run-" not in job else results_log(
            {**{n: (PGBENCH / n).read_text() for n in ("pgbench.out", "pgbench.err", *TXN_LOGS)},
             "settings.txt": "pg_stat_statements.max|1000||f|t\n", START_FILE: "1700000000.5\n",
             END_FILE: "1700000004.5\n",
             ERR_FILE: 'ERROR:  relation "pg_stat_statements" does not exist\n' * 2}, text="")

    api.default_log = log
    result = run(api_client, tmp_path, PLAN)
    assert (result.ok, result.failed) == (1, 0), result.failures
    run_dir = next((tmp_path / "results" / "runs").iterdir())
    assert not (run_dir / "statements.json").exists() and not (run_dir / "probe-errors.txt").exists()
    assert "statements" not in json.loads((run_dir / "run.json").read_text())
