"""`pglab run --keep` says how to connect (issue 20): the psql command it prints, pasted into a shell, reaches the
kept lab's primary; so does a bare psql after the environment line it prints."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import pglab, processes_mentioning

pytestmark = pytest.mark.postgres


def test_keep_prints_a_psql_command_that_works(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: keep\ntarget: {local: {instances: 1}}\ndataset: {scale: 1}\nrun: {transactions: 10}\n")
    proc = pglab("run", str(plan), "--results", str(tmp_path / "r"), "--keep")
    lines = proc.stderr.splitlines()
    kept = next((line for line in lines if "lab kept running in " in line), None)
    assert proc.returncode == 0 and kept is not None, proc.stderr
    lab = kept.split("lab kept running in ", 1)[1].split(" ", 1)[0]
    try:
        command = next(line for line in lines if line.startswith("connect: ")).removeprefix("connect: ")
        env_line = next(line for line in lines if line.startswith("or set: ")).removeprefix("or set: ")
        for shell in (f"{command} -Atc 'SELECT count(*) FROM pgbench_branches'",
                      f"{env_line}; psql -Atc 'SELECT count(*) FROM pgbench_branches'"):
            out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60,
                                 env={"PATH": "/usr/bin:/bin"})
            assert out.returncode == 0 and out.stdout.strip() == "1", (shell, out.stderr)
    finally:
        pglab("lab", "clean", lab)
    assert processes_mentioning(lab) == []
