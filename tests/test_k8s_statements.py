"""pg_stat_statements on a Kubernetes run (issue 29 item 5): the run Job reads the view around pgbench when a
``pg_stat_statements.*`` parameter makes CloudNativePG load it, and the sweep keeps statements.json as a local run
does. The reads' SQL and shell are run against a real server in tests/test_probes_why.py; here the rendered Job and
the sweep against the fake API, whose run Job ships two reads as psql prints them."""

from __future__ import annotations

import json
import subprocess
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


# ------------------------------------------------------------------ several load pods: pod 0 reads for all
LOAD = PLAN.replace("duration: 4s", "duration: 4s, load_pods: 2").replace("clients: [1]", "clients: [3]")
LOAD_STUBS = {
    # psql: logs its SQL; the barriers' counts answer how many pods entered each (a file of rows per barrier); the
    # view's reads answer an empty view
    "psql": r"""#!/bin/sh
for a in "$@"; do sql=$a; done
echo "$POD psql $sql" >> "$LOG"
case "$sql" in
  *"INSERT INTO pglab_load_barrier"*"-end'"*) echo row >> "$ROWS.end" ;;
  *"SELECT count(*) FROM pglab_load_barrier"*"-end'"*) cat "$ROWS.end" 2>/dev/null | wc -l | tr -d ' ' ;;
  *"INSERT INTO pglab_load_barrier"*) echo row >> "$ROWS" ;;
  *"SELECT count(*) FROM pglab_load_barrier"*) wc -l < "$ROWS" | tr -d ' ' ;;
  *"FROM (VALUES"*) echo 'pg_stat_statements.max|1000||f|t' ;;
  *"jsonb_build_object"*) echo '{"version": "1.10", "statements": []}' ;;
  *"pg_stat_statements_info"*) echo 0 ;;
esac
""",
    # pgbench: pod 1's runs a second longer than pod 0's
    "pgbench": r"""#!/bin/sh
echo "$POD pgbench start" >> "$LOG"
[ -n "${FAIL:-}" ] && exit 1
[ "$POD" = 1 ] && sleep 1.5
echo "$POD pgbench end" >> "$LOG"
echo "tps = 1.0 (without initial connection time)"
""",
}


def _load_script(text: str, tmp_path: Path) -> str:
    (script,) = _scripts(text, tmp_path)
    return script


def _stubs(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in LOAD_STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_a_pod_zero_whose_pgbench_failed_does_not_wait_for_the_others_end(tmp_path: Path) -> None:
    """Pod 0's pgbench failed (pod 1 entered the start barrier, as the row there says): pod 0 enters the end barrier
    and ends with pgbench's exit code, without waiting for pod 1 there, nor reading the view again."""
    bin_dir, log, rows = _stubs(tmp_path), tmp_path / "log", tmp_path / "rows"
    rows.write_text("row\n")  # pod 1's
    results = tmp_path / "results-0"
    results.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log), "ROWS": str(rows), "POD": "0", "FAIL": "1",
           "JOB_COMPLETION_INDEX": "0", "PGLAB_JOB_UID": "uid-1"}
    proc = subprocess.run(["sh", "-c", _load_script(LOAD, tmp_path).replace("/results", str(results))], env=env,
                          text=True, capture_output=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = log.read_text().splitlines()
    assert any("INSERT" in line and "-end'" in line for line in lines), lines
    assert not any("SELECT count(*)" in line and "-end'" in line for line in lines), lines
    assert (results / START_FILE).is_file() and not (results / END_FILE).exists()


def test_with_load_pods_pod_zero_reads_before_any_pgbench_and_after_every_pods_end(tmp_path: Path) -> None:
    """The load Job's script itself, by sh for both pods with stand-ins for psql and pgbench: pod 0 reads the view
    before it enters the start barrier (so before any pod's pgbench), and again only once pod 1, whose pgbench ends
    later, said it ended; pod 1 reads nothing. The barrier's statements are marked as pglab's own."""
    bin_dir, log, rows = _stubs(tmp_path), tmp_path / "log", tmp_path / "rows"
    rows.touch()
    script = _load_script(LOAD, tmp_path)
    assert script.count("statements_read") == 3  # pod 0's: its definition and its two reads
    procs = []
    for index in (0, 1):
        results = tmp_path / f"results-{index}"
        results.mkdir()
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log), "ROWS": str(rows), "POD": str(index),
               "JOB_COMPLETION_INDEX": str(index), "PGLAB_JOB_UID": "uid-1"}
        procs.append(subprocess.Popen(["sh", "-c", script.replace("/results", str(results))], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, (out, err)
    lines = log.read_text().splitlines()

    def at(pred: Callable[[str], bool]) -> list[int]:
        return [i for i, line in enumerate(lines) if pred(line)]

    reads = at(lambda x: x.startswith("0 psql") and "pg_stat_statements_info" in x)  # each read's last query
    assert len(reads) == 2 and not at(lambda x: x.startswith("1 psql") and "pg_stat_statements" in x), lines
    assert reads[0] < min(at(lambda x: "pgbench start" in x)), lines
    assert reads[0] < min(at(lambda x: x.startswith("0 psql INSERT INTO pglab_load_barrier") and "-end'" not in x))
    assert reads[1] > max(at(lambda x: "pgbench end" in x)), lines  # pod 1's too, 1.5 s after pod 0's
    assert reads[1] > at(lambda x: x.startswith("1 psql INSERT") and "-end'" in x)[0], lines
    assert all(MARK in line for line in lines if "pglab_load_barrier" in line), lines
    assert (tmp_path / "results-0" / START_FILE).is_file() and (tmp_path / "results-0" / END_FILE).is_file()
    assert not (tmp_path / "results-1" / START_FILE).exists()


def test_with_load_pods_the_runs_statements_are_pod_zeros_reads(fake: tuple[FakeAPI, client.ApiClient],
                                                                 tmp_path: Path) -> None:
    """The sweep over two load pods (their scripts exec'd in the client pods): statements.json is the run's, from
    the two reads pod 0 shipped (the fake gives each pod the same files, as it cannot tell the pods apart)."""
    api, api_client = fake
    api.default_log = with_reads(api)
    result = run(api_client, tmp_path, LOAD)
    assert (result.ok, result.failed) == (1, 0), result.failures
    run_dir = next((tmp_path / "results" / "runs").iterdir())
    assert (run_dir / "load-0" / START_FILE).is_file()
    doc = json.loads((run_dir / "statements.json").read_text())
    assert doc["window"] == [1700000000.5, 1700000004.5]
    assert [s["query"] for s in doc["statements"]] == [UPDATE, INSERT, SELECT]
    record = json.loads((run_dir / "run.json").read_text())["statements"]
    assert record["count"] == 3 and record["top"][0]["query"] == UPDATE


# ------------------------------------------------------------------ scenarios
@pytest.mark.parametrize(("kind", "read"), [("standby-loss", True), ("failover", False), ("switchover", False),
                                            ("node-drain", False)])
def test_through_a_scenario_the_view_is_read_unless_the_primary_moves(tmp_path: Path, kind: str,
                                                                      read: bool) -> None:
    """A scenario that keeps the primary: the Job reads around pgbench's segments as without one. One that moves it
    (the -rw Service then leads to another server, its own history in the view): no read, and the Job ships why."""
    text = PLAN.replace("matrix: {clients: [1]}", f"matrix: {{clients: [1], scenario: [{{kind: {kind}, at: 2}}]}}"
                        ).replace("duration: 4s", "duration: 10s")
    script = _load_script(text, tmp_path)
    assert ("statements_read" in script) is read
    assert (NOT_READ_FILE in script) is not read
    if read:
        assert (script.index(f"statements_read {START_FILE}") < script.index("pglab: pgbench start")
                < script.index(f"statements_read {END_FILE}"))
    else:
        assert f"not read through a {kind}: the -rw Service leads to another server" in script


def test_a_run_whose_job_did_not_read_says_why_in_run_json(fake: tuple[FakeAPI, client.ApiClient],
                                                            tmp_path: Path) -> None:
    """What the Job shipped instead of its reads (a failover's run): run.json's statements say why, and no
    statements.json is made."""
    api, api_client = fake
    why = "not read through a failover: the -rw Service leads to another server afterwards"

    def log(job: str) -> str:
        if "-run-" not in job:
            return pod_log(job)
        files = {name: (PGBENCH / name).read_text() for name in ("pgbench.out", "pgbench.err", *TXN_LOGS)}
        return results_log({**files, "settings.txt": "pg_stat_statements.max|1000||f|t\n", NOT_READ_FILE: why + "\n"},
                           text="")

    api.default_log = log
    result = run(api_client, tmp_path, PLAN)
    assert (result.ok, result.failed) == (1, 0), result.failures
    run_dir = next((tmp_path / "results" / "runs").iterdir())
    assert json.loads((run_dir / "run.json").read_text())["statements"] == {"not_read": why}
    assert not (run_dir / "statements.json").exists()
