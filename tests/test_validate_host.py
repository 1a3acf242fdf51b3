"""`pglab plan validate` judges a plan on this host as `pglab run` would (issue 31): what run refuses before it
builds anything, validate refuses in the same sentence (exit 2); what it cannot judge here it says in a note.

The checks ask the installed PostgreSQL (``postgres -C``), hence the postgres layer."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import pglab, run_plan
from pglab.preflight import online_cpus

pytestmark = pytest.mark.postgres


def _plan(tmp_path: Path, local: str, body: str = "") -> Path:
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: here\ntarget: {{local: {{{local}}}}}\ndataset: {{scale: 1}}\nrun: {{transactions: 10}}\n"
                    f"{body}")
    return plan


def _one_sentence(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "valid" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


MISSING_CPU = max(online_cpus() or {0}) + 1000

CASES = {
    "memory": ("instances: 1, resources: {memory: 64TiB}", "", {},
               "error: target.local.resources.memory: 64.0 TiB is more than this host's memory"),
    "cpuset": (f"instances: 1, client: {{cpuset: '{MISSING_CPU}'}}", "", {},
               f"error: target.local.client.cpuset: CPU {MISSING_CPU} is not on this host"),
    "toxiproxy": ("instances: 2, network: {latency_ms: 1}", "", {"PGLAB_TOXIPROXY": "/nonexistent/toxiproxy-server"},
                  "error: PGLAB_TOXIPROXY: '/nonexistent/toxiproxy-server' is not an executable file"),
    "wal_level": ("instances: 1", "postgres: {parameters: {wal_level: minimal}}\n", {},
                  "postgres.parameters.wal_level: PostgreSQL refuses minimal next to max_wal_senders 10"),
    "wal_level axis": ("instances: 1", "matrix: {parameters: {wal_level: [replica, minimal]}}\n", {},
                       "matrix.parameters.wal_level[1]: PostgreSQL refuses minimal next to max_wal_senders 10"),
    "wal_level standbys": ("instances: 2", "postgres: {parameters: {wal_level: minimal, max_wal_senders: 0}}\n", {},
                           "postgres.parameters.wal_level: minimal leaves the 1 standby(s) of "
                           "target.local.instances: 2 no WAL to replay"),
}


@pytest.mark.parametrize("case", CASES)
def test_validate_refuses_what_run_refuses_in_the_same_sentence(tmp_path: Path, case: str) -> None:
    local, body, env, sentence = CASES[case]
    plan = _plan(tmp_path, local, body)
    environ = {**os.environ, **env}
    validated = _one_sentence(pglab("plan", "validate", str(plan), env=environ))
    assert validated.startswith(sentence), validated
    results = tmp_path / "r"
    ran = _one_sentence(pglab("run", str(plan), "--results", str(results), env=environ))
    assert ran == validated  # one check, written once, refusing before anything exists
    assert not results.exists()


def test_a_cpuset_run_would_not_apply_is_a_note(tmp_path: Path) -> None:
    plan = _plan(tmp_path, f"instances: 1, limits: best-effort, client: {{cpuset: '{MISSING_CPU}'}}")
    proc = pglab("plan", "validate", str(plan))
    assert proc.returncode == 0, proc.stderr
    assert "valid" in proc.stdout
    assert (f"note: target.local.client.cpuset: CPU {MISSING_CPU} is not on this host" in proc.stderr
            and "without the limits" in proc.stderr), proc.stderr


def test_without_postgresql_the_host_checks_are_named_as_not_done(tmp_path: Path) -> None:
    # a plan for another host: its memory limit is not judged against this one, and validate says so
    plan = _plan(tmp_path, f"instances: 1, bindir: {tmp_path / 'none'}, resources: {{memory: 64TiB}}")
    proc = pglab("plan", "validate", str(plan))
    assert proc.returncode == 0, proc.stderr
    assert "note: this host's programs, CPUs, memory and paths not checked either" in proc.stderr
    refused = pglab("run", str(plan), "--results", str(tmp_path / "r"))
    assert refused.returncode == 2 and "PostgreSQL binaries" in refused.stderr, refused.stderr


def test_minimal_wal_without_wal_senders_on_one_instance_runs(tmp_path: Path) -> None:
    # what the refusal offers instead of replica is true: one instance with max_wal_senders 0 starts and runs
    plan = _plan(tmp_path, "instances: 1", "postgres: {parameters: {wal_level: minimal, max_wal_senders: 0}}\n")
    proc = pglab("plan", "validate", str(plan))
    assert proc.returncode == 0 and "valid" in proc.stdout, proc.stderr
    run = run_plan(plan, tmp_path / "r", "--format", "csv").proc
    assert "1 ok, 0 failed" in run.stderr
