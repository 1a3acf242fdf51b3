"""The command line's conventions (issue 20): --version, -h everywhere, shell completion, choices shown and
completed, `pglab sweeps`, and empty listings that say so. Nothing here starts a server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import pglab, shell_complete
from pglab import __version__
from pglab.store import Store


def test_version() -> None:
    for flag in ("--version", "-V"):
        proc = pglab(flag)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"pglab {__version__}"


@pytest.mark.parametrize("command", [[], ["run"], ["plan", "validate"], ["cluster", "status"], ["lab", "list"],
                                     ["sweeps"], ["k8s", "render"]])
def test_short_help_everywhere(command: list[str]) -> None:
    proc = pglab(*command, "-h")
    assert proc.returncode == 0, proc.stderr
    assert "Usage: pglab" in proc.stdout
    assert proc.stdout == pglab(*command, "--help").stdout


def test_help_shows_choices_and_no_bool_for_flags() -> None:
    wide = {**os.environ, "COLUMNS": "200"}  # one option a line
    text = pglab("run", "-h", env=wide).stdout
    assert "<table|markdown|csv|json>" in text
    assert "--keep" in text and "<bool>" not in text  # a flag takes no value
    status = pglab("cluster", "status", "-h", env=wide).stdout
    assert "<table|json>" in status
    assert "--json" not in status  # the old spelling still works, unlisted


def test_a_value_not_among_the_choices_is_refused_with_them() -> None:
    proc = pglab("run", "plan.yaml", "--format", "xml")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "'xml' is not one of 'table', 'markdown', 'csv', 'json'" in proc.stderr


def test_shell_completion_completes_commands_and_choices() -> None:
    assert "sweeps" in shell_complete("pglab sw")
    assert shell_complete("pglab run plan.yaml --format ") == ["table", "markdown", "csv", "json"]
    assert "--install-completion" in pglab("--help").stdout


def _results(folder: Path) -> Path:
    store = Store.open(folder)
    try:
        done = store.begin_sweep("first", "name: first\n", "h1", __version__)
        ids = store.add_points(done, [(0, "a", {"clients": 1}), (1, "b", {"clients": 2})])
        for key, status in (("a", "ok"), ("b", "ok"), ("b", "failed")):
            run_id, _ = store.start_run(done, ids[key], 0 if key == "a" else 1, 1)
            store.finish_run(run_id, status)
        store.end_sweep(done, "done")
        store.begin_sweep("second", "name: second\n", "h2", __version__)  # left running: no points yet
    finally:
        store.close()
    return folder


def test_sweeps_lists_each_sweep(tmp_path: Path) -> None:
    results = _results(tmp_path / "r")
    proc = pglab("sweeps", str(results), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["sweep"], r["status"], r["plan"], r["points"], r["runs_ok"], r["runs_failed"]) for r in rows] == [
        (1, "done", "first", 2, 2, 1), (2, "running", "second", 0, 0, 0)]
    assert all(r["date"][:4].isdigit() for r in rows)
    table = pglab("sweeps", str(results)).stdout
    assert "first" in table and "second" in table and "failed runs" in table


def test_empty_listings_say_so(tmp_path: Path) -> None:
    Store.open(tmp_path / "empty").close()
    proc = pglab("sweeps", str(tmp_path / "empty"))
    assert proc.returncode == 0 and proc.stdout == ""
    assert "holds no sweep yet" in proc.stderr
    missing = pglab("sweeps", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "holds no pglab results" in missing.stderr
    # a registry of its own, empty: no lab of anyone else's is listed
    proc = pglab("lab", "list", env={**os.environ, "PGLAB_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and "no labs" in proc.stderr


def test_cluster_status_json_is_still_accepted() -> None:
    for spelling in (["--json"], ["--format", "json"]):
        proc = pglab("cluster", "status", "no-such-lab", *spelling)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "No such option" not in proc.stderr and "no-such-lab" in proc.stderr, proc.stderr


def test_the_base_install_needs_no_extra(tmp_path: Path) -> None:
    """Without the k8s and ha extras (their packages made unimportable here), help and a local plan work, and a
    Kubernetes plan says which extra to install."""
    shadow = tmp_path / "shadow"
    for module in ("kubernetes", "patroni"):
        (shadow / module).mkdir(parents=True)
        (shadow / module / "__init__.py").write_text("raise ImportError('not installed (test)')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}
    assert pglab("--help", env=env).returncode == 0
    local = tmp_path / "local.yaml"
    local.write_text("name: local\ntarget: {local: {instances: 1}}\n")
    proc = pglab("plan", "validate", str(local), env=env)
    assert proc.returncode == 0, proc.stderr
    repo = Path(__file__).resolve().parent.parent
    render = pglab("k8s", "render", str(repo / "examples" / "kubernetes-cnpg.yaml"), "-o", str(tmp_path / "m"), env=env)
    assert render.returncode == 0, render.stderr  # manifests need no client
    proc = pglab("k8s", "check", str(repo / "examples" / "kubernetes-cnpg.yaml"), env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ("error: target.kubernetes needs the Python package 'kubernetes', not in the base "
                                   "install; install it with ./setup.sh install k8s (or pip install -e '.[k8s]').")


def test_unreadable_or_unwritable_folders_are_one_sentence(tmp_path: Path) -> None:
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "results.db").write_text("not a database\n")
    proc = pglab("sweeps", str(damaged))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"error: results folder '{damaged}': its results.db cannot be read (file is not a "
                                   "database); give a folder pglab wrote, or a new one.")
    repo = Path(__file__).resolve().parent.parent
    proc = pglab("k8s", "render", str(repo / "examples" / "kubernetes-cnpg.yaml"), "-o", "/proc/pglab-test-manifests")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: -o: cannot write into '/proc/pglab-test-manifests'"), proc.stderr
