"""Plans are code (docs/reliability.md): pgbench runs a plan's custom scripts, whose ``\\shell`` runs anything, so
as root it runs as the unprivileged plan user (``pglab-run``), which owns nothing, not even the lab's data directories
(the server user's); fio job files may not carry commands at all."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from conftest import pglab, run_plan
from pglab.errors import PlanError, UserError
from pglab.plan.load import fio_job_file_problem, load_plan
from pglab.targets.base import Endpoint, PlanCodeUser
from pglab.workloads import fio
from pglab.workloads.pgbench import PgbenchError, PgbenchProcess

SERVER_USER = os.environ.get("PGLAB_RUN_AS") or "postgres"
LAB_USER = os.environ.get("PGLAB_PLAN_USER") or "pglab-run"  # who runs the plan's code


@pytest.mark.postgres
@pytest.mark.skipif(os.geteuid() != 0, reason="pglab demotes pgbench only when it runs as root")
def test_a_plans_shell_command_runs_as_the_plan_user_in_the_client_group(tmp_path: Path) -> None:
    """tmp_path (root's, 0700) holds the plan and the results: the plan user can reach neither, so this also
    proves pgbench finds its script and writes its -l logs relative to the run folder it starts in."""
    lab_user = pwd.getpwnam(LAB_USER)
    out = Path(tempfile.mkdtemp(prefix="pglab-plan-code-", dir="/var/tmp"))
    try:
        os.chmod(out, 0o1777)  # where the plan user may write what the script says
        lab = out / "lab"
        (tmp_path / "who.sql").write_text(f"\\shell id -u > {out}/uid\n"
                                          f"\\shell cat /proc/self/cgroup > {out}/cgroup\n"
                                          f"\\shell touch {lab}/n0/data/planted 2> {out}/data; true\nSELECT 1;\n")
        plan = tmp_path / "plan.yaml"
        plan.write_text("name: plan-code\n"
                        "target: {local: {instances: 1, synchronous: null, client: {cpus: 1}, "
                        f"paths: {{lab: {lab}}}}}}}\n"
                        "dataset: {scale: 1}\n"
                        "matrix: {workload: [{name: who, scripts: [{file: who.sql}]}], clients: [1]}\n"
                        "run: {duration: 2s, warmup: 0s, repeats: 1}\n")
        proc = run_plan(plan, tmp_path / "r", "--format", "json").proc
        assert (out / "uid").read_text().strip() == str(lab_user.pw_uid) != "0"
        assert lab_user.pw_uid != pwd.getpwnam(SERVER_USER).pw_uid  # not the user who owns the data directories:
        assert "Permission denied" in (out / "data").read_text()  # nothing planted in the primary's
        # \shell's process is pgbench's child: it is in the client's group, as pgbench is
        assert any(line.endswith("/client") for line in (out / "cgroup").read_text().splitlines())
        (row,) = json.loads(proc.stdout)
        assert row["tps"] > 0
        (run_dir,) = [p for p in (tmp_path / "r" / "runs").iterdir() if p.is_dir()]
        assert run_dir.stat().st_uid == 0  # the run folder is given back to pglab
        # pgbench wrote its -l logs there as the lab user; pglab summarised them and kept them compressed (its own)
        logs = list(run_dir.glob("pgbench_log.*"))
        assert logs and all(f.name.endswith(".gz") for f in logs)
        assert (run_dir / "scripts" / "who.sql").read_text() == (tmp_path / "who.sql").read_text()
        assert (run_dir / "pgbench.out").stat().st_uid == 0
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.mark.postgres
@pytest.mark.skipif(os.geteuid() != 0, reason="pglab demotes pgbench only when it runs as root")
def test_what_a_plans_shell_plants_in_the_run_folder_never_redirects_pglabs_own_writes(tmp_path: Path) -> None:
    """While pgbench runs the run folder is the lab user's: a \\shell may leave symlinks where pglab (root) writes
    next (the latency histogram, the next pgbench's output, the staged scripts). None of them may be followed."""
    out = Path(tempfile.mkdtemp(prefix="pglab-plan-code-", dir="/var/tmp"))
    try:
        os.chmod(out, 0o1777)
        planted = {"latency_histogram.json": out / "histogram", "pgbench.out": out / "out", "scripts": out / "dir"}
        # where pglab writes next: names not there yet, and the staged scripts' folder (root's, moved aside: the run
        # folder is the user's while pgbench runs); once each, so the run itself goes on
        lines = "".join(f"\\shell [ -e {name} -o -L {name} ] || ln -s {target} {name}\n"
                        for name, target in planted.items() if name != "scripts")
        lines += f"\\shell [ -L scripts ] || {{ mv scripts scripts.$$; ln -s {planted['scripts']} scripts; }}\n"
        (tmp_path / "plant.sql").write_text(lines + "\\shell mkfifo fifo 2>/dev/null; true\nSELECT 1;\n")
        plan = tmp_path / "plan.yaml"
        plan.write_text("name: plant\n"
                        "target: {local: {instances: 1, synchronous: null}}\n"
                        "dataset: {scale: 1}\n"
                        "matrix: {workload: [{name: plant, scripts: [{file: plant.sql}]}], clients: [1]}\n"
                        "run: {duration: 2s, warmup: 1s, repeats: 1}\n")
        run_plan(plan, tmp_path / "r", "--format", "json")
        assert sorted(p.name for p in out.iterdir()) == []  # root wrote nothing through the lab user's links
        (run_dir,) = [p for p in (tmp_path / "r" / "runs").iterdir() if p.is_dir()]
        for name in planted:
            assert not (run_dir / name).is_symlink(), name
        assert (run_dir / "latency_histogram.json").is_file() and not (run_dir / "fifo").exists()
        assert all(d.stat().st_uid == 0 for d in [run_dir, *(p for p in run_dir.rglob("*") if p.is_dir())])
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.mark.parametrize(("line", "named"), [
    ("exec_prerun=touch /tmp/owned", "exec_prerun"), ("exec_postrun = sh -c 'id'", "exec_postrun"),
    ("ioengine=exec", "ioengine=exec"), ("ioengine = external:/tmp/libevil.so", "ioengine=external"),
    ("include other.fio", "include"),
    ("write_iolog=/etc/cron.d/x", "write_iolog=/etc/cron.d/x, a path outside"),
    ("read_iolog=../../secret", "read_iolog=../../secret, a path outside"),
    ("filename=a:/dev/sdb", "filename=a:/dev/sdb, a path outside"),
])
def test_fio_job_files_that_run_code_or_reach_outside_are_refused(tmp_path: Path, line: str, named: str) -> None:
    """Refused, not run as the lab user: ``pglab fio`` and external targets have no lab user (see the docs)."""
    job = tmp_path / "jobs.fio"
    job.write_text(f"[global]\nbs=8k\n{line}\n[r]\nrw=randread\n")
    (tmp_path / "plan.yaml").write_text("name: p\ntarget: {local: {}}\nstorage: {job_files: [jobs.fio]}\n"
                                        "matrix: {workload: [select-only]}\n")
    with pytest.raises(PlanError, match=rf"storage\.job_files\[0\]: fio job file sets {re.escape(named)}"):
        load_plan(tmp_path / "plan.yaml")
    with pytest.raises(UserError, match=r"jobs\.fio: (fio job file|job \[r\]) sets"):  # pglab fio --job-file
        fio.custom_jobs(job)


@pytest.mark.parametrize("text", ["[r]\nrw=randread\nioengine=libaio\n", "[r]\n; exec_prerun=x\nrw=read\n",
                                  "[r]\nioengine=psync\nexecutable_name=x\n", "[r]\nfilename=a\\:b:c\nbs=4k\n",
                                  "[r]\ndescription=reads... then writes\nwrite_iolog=trace.log\n"])
def test_fio_job_files_without_either_pass(text: str) -> None:
    assert fio_job_file_problem(text) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="the check applies when pglab runs as root")
def test_as_root_a_plan_bindir_someone_else_can_change_is_refused(tmp_path: Path) -> None:
    """pgbench -i and the --version probes run from the plan's bindir as root: its files must be root's alone."""
    from pglab.targets.local.postgres_bin import find_bindir

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "pgbench").write_text("#!/bin/sh\nexit 0\n")
    os.chmod(bindir / "pgbench", 0o755)
    assert find_bindir(str(bindir), needed=("pgbench",)) == bindir
    os.chown(bindir / "pgbench", pwd.getpwnam(LAB_USER).pw_uid, 0)
    with pytest.raises(UserError, match=r"pgbench belongs to uid \d+, so its owner could run code as root"):
        find_bindir(str(bindir), needed=("pgbench",))
    os.chown(bindir / "pgbench", 0, 0)
    os.chmod(bindir, 0o777)
    with pytest.raises(UserError, match=rf"{bindir} is writable by others"):
        find_bindir(str(bindir), needed=("pgbench",))


def _as_lab_user() -> PlanCodeUser:
    pw = pwd.getpwnam(LAB_USER)
    return PlanCodeUser(pw.pw_name, pw.pw_uid, pw.pw_gid, Path("/nonexistent/pgpass"))


ENDPOINT = Endpoint("n0", "primary", "/nonexistent", 5432, "u", "d", Path("/nonexistent/pgpass"))


@pytest.mark.skipif(os.geteuid() != 0, reason="pglab demotes pgbench only when it runs as root")
def test_the_run_folder_is_the_lab_users_only_while_the_client_runs(tmp_path: Path) -> None:
    """The client waits at the door until pglab wrote its pid into the group's procs file, runs as the lab user in
    its folder (its own files are that user's), and the folder is root's again afterwards."""
    procs = tmp_path / "cgroup.procs"  # a stand-in: pglab writes the pid, as into a real group's file
    procs.write_text("")
    run = tmp_path / "run"
    run.mkdir()
    proc = PgbenchProcess(["sh", "-c", 'id -u > uid; echo "$PGPASSFILE" > passfile; echo $$ > pid'], ENDPOINT, run,
                          "client", run_as=_as_lab_user(), procs_files=[procs])
    assert proc.wait() == 0
    assert (run / "uid").read_text().strip() == str(pwd.getpwnam(LAB_USER).pw_uid)
    assert (run / "uid").stat().st_uid == pwd.getpwnam(LAB_USER).pw_uid
    assert (run / "passfile").read_text().strip() == "/nonexistent/pgpass"
    assert procs.read_text() == (run / "pid").read_text().strip() == str(proc.pid)
    assert run.stat().st_uid == 0 and (run / "client.out").stat().st_uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="pglab demotes pgbench only when it runs as root")
def test_a_client_that_cannot_enter_its_group_never_runs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(PgbenchError, match="could not enter its cgroup"):
        PgbenchProcess(["touch", "ran"], ENDPOINT, run, "client", run_as=_as_lab_user(),
                       procs_files=[tmp_path / "no-such-group" / "cgroup.procs"])
    assert not (run / "ran").exists()
    assert run.stat().st_uid == 0


@pytest.mark.postgres
@pytest.mark.skipif(os.geteuid() != 0, reason="pglab demotes pgbench only when it runs as root")
def test_a_plan_user_missing_or_unable_to_reach_the_lab_is_refused_before_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pglab.targets.local import postgres_bin

    plan = tmp_path / "plan.yaml"
    plan.write_text("name: who\ntarget: {local: {instances: 1}}\ndataset: {scale: 1}\nrun: {transactions: 10}\n")
    for command in (["plan", "validate", str(plan)], ["run", str(plan), "--results", str(tmp_path / "r")]):
        proc = pglab(*command, env={**os.environ, "PGLAB_PLAN_USER": "pglab-no-such-user"})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "error: PGLAB_PLAN_USER: user 'pglab-no-such-user' does not exist; name an unprivileged user, or unset "
            "it for pglab-run."]
    assert not (tmp_path / "r").exists()
    monkeypatch.delenv("PGLAB_PLAN_USER", raising=False)
    monkeypatch.setattr(postgres_bin, "PLAN_USER", "pglab-no-such-user")  # a host where setup.sh did not run
    with pytest.raises(UserError, match=r"useradd --system --no-create-home --shell /usr/sbin/nologin "
                                        r"pglab-no-such-user\.$"):
        postgres_bin.resolve_plan_user()
    # a lab folder the server user can reach (its group) and the plan user cannot
    door = Path(tempfile.mkdtemp(prefix="pglab-plan-code-", dir="/var/tmp"))
    try:
        os.chown(door, 0, pwd.getpwnam(SERVER_USER).pw_gid)
        os.chmod(door, 0o710)
        plan.write_text(f"name: who\ntarget: {{local: {{instances: 1, paths: {{lab: {door / 'lab'}}}}}}}\n"
                        "dataset: {scale: 1}\nrun: {transactions: 10}\n")
        proc = pglab("run", str(plan), "--results", str(tmp_path / "r"))
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"error: target.local.paths.lab: the plan user '{LAB_USER}', who runs pgbench, cannot reach "
            f"'{door / 'lab'}' (a parent directory is not searchable); choose a directory under a world-searchable "
            "path such as /var/tmp."], proc.stderr
        assert not (tmp_path / "r").exists() and not (door / "lab").exists()
    finally:
        shutil.rmtree(door, ignore_errors=True)
