"""Preflight (issue 20): what a plan cannot do on this host is refused before a lab is built or a results folder
is created, in one sentence naming the field, exit 2; a server that does not start says why in PostgreSQL's words.

The parameter checks ask the installed PostgreSQL (``postgres -C``, no server started), hence the postgres layer."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import pglab, processes_mentioning

pytestmark = pytest.mark.postgres


def _plan(tmp_path: Path, body: str, name: str = "plan.yaml") -> Path:
    plan = tmp_path / name
    plan.write_text(f"name: pre\ntarget: {{local: {{instances: 1}}}}\ndataset: {{scale: 1}}\n"
                    f"run: {{transactions: 10}}\n{body}")
    return plan


def _refused(proc: subprocess.CompletedProcess[str], *words: str) -> list[str]:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines, proc.stderr
    for w in words:
        assert any(w in line for line in lines), proc.stderr
    return lines


def test_a_misspelt_parameter_and_bad_values_are_refused_by_validate(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "postgres: {parameters: {shared_bufers: 128MB, wal_level: bogus, work_mem: 4MB}}\n"
                           "matrix: {parameters: {maintenance_work_mem: [64MB, lots]}}\n")
    proc = pglab("plan", "validate", str(plan))
    lines = _refused(proc, 'unrecognized configuration parameter "shared_bufers"', '"wal_level": "bogus"',
                     '"maintenance_work_mem": "lots"')
    fields = [line.split(":")[0] for line in lines]
    assert fields == ["postgres.parameters.shared_bufers", "postgres.parameters.wal_level",
                      "matrix.parameters.maintenance_work_mem[1]"]
    assert proc.stdout == ""


def test_valid_parameters_pass(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "postgres: {parameters: {shared_buffers: 64MB, 'pg_stat_statements.max': 1000}}\n"
                           "matrix: {parameters: {work_mem: [4MB, 64MB, 1GB]}}\n")
    proc = pglab("plan", "validate", str(plan))
    assert proc.returncode == 0, proc.stderr
    assert "valid" in proc.stdout and "not checked" not in proc.stderr


def test_clients_beyond_max_connections(tmp_path: Path) -> None:
    proc = pglab("plan", "validate", str(_plan(tmp_path, "matrix: {clients: [1, 5000]}\n")))
    _refused(proc, "matrix.clients[1]: 5000 clients", "max_connections")
    raised = _plan(tmp_path, "postgres: {parameters: {max_connections: 5005}}\nmatrix: {clients: [1, 5000]}\n",
                   "raised.yaml")
    assert pglab("plan", "validate", str(raised)).returncode == 0  # the plan's own max_connections counts


@pytest.mark.parametrize(("resources", "field"), [
    (f"resources: {{cpus: {(os.cpu_count() or 1) + 1}}}", "target.local.resources.cpus"),
    ("resources: {memory: 64TiB}", "target.local.resources.memory"),
    ("client: {cpuset: '1000'}", "target.local.client.cpuset"),
])
def test_limits_beyond_the_host_are_refused_before_anything(tmp_path: Path, resources: str, field: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: pre\ntarget: {{local: {{instances: 1, {resources}}}}}\nrun: {{transactions: 10}}\n")
    results = tmp_path / "r"
    proc = pglab("run", str(plan), "--results", str(results))
    lines = _refused(proc, field)
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), proc.stderr
    assert not results.exists()


def test_a_typo_is_refused_by_run_before_the_results_folder(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "postgres: {parameters: {shared_bufers: 128MB}}\n")
    results = tmp_path / "r"
    proc = pglab("run", str(plan), "--results", str(results))
    _refused(proc, "postgres.parameters.shared_bufers")
    assert not results.exists()
    assert processes_mentioning(str(tmp_path)) == []


def test_results_parent_must_exist(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "")
    results = tmp_path / "no" / "such" / "res"
    proc = pglab("run", str(plan), "--results", str(results))
    _refused(proc, "--results", str(tmp_path / "no" / "such"))
    assert not (tmp_path / "no").exists()
    proc = pglab("fio", "--path", str(tmp_path), "--results", str(results))
    _refused(proc, "--results")
    assert not (tmp_path / "no").exists()
    # ./results, the default home of runs, is the one parent pglab creates: the README's --results results/qs works
    # in a fresh clone; a folder below a missing one inside it is still refused
    proc = pglab("run", str(plan), "--results", "results/deep/res", cwd=tmp_path)
    _refused(proc, "--results", str(tmp_path / "results" / "deep"))
    proc = pglab("run", str(plan), "--results", "results/qs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "results" / "qs" / "results.db").is_file()


def test_a_lab_folder_in_use_is_refused_before_the_results_folder(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "someone-else").write_text("x")
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: pre\ntarget: {{local: {{instances: 1, paths: {{lab: {lab}}}}}}}\n"
                    "run: {transactions: 10}\n")
    proc = pglab("run", str(plan), "--results", str(tmp_path / "r"))
    _refused(proc, "target.local.paths.lab", "not empty")
    assert not (tmp_path / "r").exists()


def test_a_server_that_does_not_start_quotes_its_fatal_line(tmp_path: Path) -> None:
    # valid for postgres -C (the library is loaded only when the server starts): found at the start, not before
    plan = _plan(tmp_path, "postgres: {parameters: {shared_preload_libraries: no_such_lib}}\n")
    results = tmp_path / "r"
    proc = pglab("run", str(plan), "--results", str(results))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert 'PostgreSQL says "FATAL:  could not access file "no_such_lib"' in last, last
    assert "Examine the log output" not in proc.stderr
    log = last.rsplit("(server log: ", 1)[1].rstrip(")")
    assert Path(log).is_file() and Path(log).is_relative_to(results)  # the copy kept in the results, not the lab's
    assert "no_such_lib" in Path(log).read_text()


def test_no_coreutils_on_path(tmp_path: Path) -> None:
    """pglab calls its programs by absolute path: a PATH without coreutils is no traceback."""
    plan = _plan(tmp_path, "")
    results = tmp_path / "r"
    proc = pglab("run", str(plan), "--results", str(results), env={**os.environ, "PATH": str(tmp_path / "empty")})
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "1 ok, 0 failed" in proc.stderr


def test_an_unusable_environment_is_one_sentence(tmp_path: Path) -> None:
    """What the environment gets wrong is named like a field: the variable, or the folder that cannot be made."""
    plan = _plan(tmp_path, "")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "PGLAB_STATE_DIR": str(blocker / "state")}
    proc = pglab("run", str(plan), "--results", str(tmp_path / "r"), env=env)
    lines = _refused(proc, "PGLAB_STATE_DIR: cannot create")
    assert len(lines) == 1 and not (tmp_path / "r").exists()
    proc = pglab("lab", "list", env=env)
    _refused(proc, "PGLAB_STATE_DIR: cannot create")
    # a parent that exists but where nothing can be created (procfs): no traceback from the results folder either
    proc = pglab("run", str(plan), "--results", "/proc/pglab-test-results")
    _refused(proc, "--results: cannot create '/proc/pglab-test-results'")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "results.db").write_text("not a database\n")
    proc = pglab("run", str(plan), "--results", str(damaged))
    _refused(proc, f"results folder '{damaged}': its results.db cannot be read")
    assert sorted(p.name for p in damaged.iterdir()) == [".lock", "results.db"]  # nothing else written there


def test_validate_without_postgresql_says_what_it_did_not_check(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: pre\ntarget: {{local: {{bindir: {tmp_path / 'none'}}}}}\n"
                    "postgres: {parameters: {shared_bufers: 1GB}}\n")
    proc = pglab("plan", "validate", str(plan))
    assert proc.returncode == 0, proc.stderr  # a plan written for another host: its parameters are not refused here
    assert "note: postgres.parameters and max_connections not checked: PostgreSQL binaries" in proc.stderr


def test_when_postgresql_cannot_be_asked_the_plans_max_connections_counts(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    from pglab import preflight
    from pglab.errors import PlanError
    from pglab.plan.load import parse_plan

    monkeypatch.setattr(preflight, "check_parameters", lambda *_a, **_k: None)
    text = "name: a\ntarget: {local: {instances: 1}}\npostgres: {parameters: {max_connections: 300}}\n"
    notes = preflight.check_plan(parse_plan(text + "matrix: {clients: [250]}\n"), tmp_path)
    assert notes == ["postgres.parameters not checked: the installed PostgreSQL could not be asked"]
    with pytest.raises(PlanError) as refused:
        preflight.check_plan(parse_plan(text + "matrix: {clients: [1, 299]}\n"), tmp_path)
    assert refused.value.problems[0].startswith("matrix.clients[1]: 299 clients") and "allows 300" in str(refused.value)
