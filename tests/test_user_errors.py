"""User errors outside the plan's own fields: missing binaries, a path the servers cannot use, a full disk during
the build, a port taken meanwhile. Each ends in one clear sentence (exit 2) with nothing left behind, or is
worked around when pglab can do so safely."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import pglab, processes_mentioning
from helpers import scalar

pytestmark = pytest.mark.postgres


def _plan(tmp_path: Path, local: str) -> Path:
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"name: errors\ntarget: {{local: {{{local}}}}}\ndataset: {{scale: 1}}\n"
                    "run: {transactions: 10}\n")
    return plan


def _refused(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr  # one sentence, last
    for w in words:
        assert w in errors[0], errors[0]


def test_missing_postgresql_binaries(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    for bindir in (empty, tmp_path / "nonesuch"):
        proc = pglab("run", str(_plan(tmp_path, f"instances: 1, synchronous: null, bindir: {bindir}")),
                     "--results", str(tmp_path / "r"))
        _refused(proc, "PostgreSQL binaries", str(bindir))
        assert not (tmp_path / "r").exists()  # refused before anything was created


def test_a_path_the_servers_cannot_reach(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir()
    os.chmod(closed, 0o700 if os.geteuid() == 0 else 0o500)  # root's servers run as another user
    try:
        proc = pglab("run", str(_plan(tmp_path, f"instances: 1, synchronous: null, paths: {{wal: {closed}/wal}}")),
                     "--results", str(tmp_path / "r"))
    finally:
        os.chmod(closed, 0o700)
    _refused(proc, "target.local.paths.wal", str(closed))
    assert not (tmp_path / "r").exists()  # refused at preflight, before the results folder
    assert processes_mentioning(str(tmp_path)) == []


def _as_root(*cmd: str) -> None:
    subprocess.run(list(cmd) if os.geteuid() == 0 else ["sudo", "-n", *cmd], check=True)


def test_disk_full_during_the_build(tmp_path: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))  # the server user must reach it: not under pytest's 0700
    os.chmod(base, 0o711)
    small = base / "small"
    small.mkdir()
    _as_root("mount", "-t", "tmpfs", "-o", "size=12m,mode=0777", "tmpfs", str(small))
    try:
        proc = pglab("run", str(_plan(tmp_path, f"instances: 1, synchronous: null, paths: {{data: {small}}}")),
                     "--results", str(tmp_path / "r"))
        _refused(proc, "target.local.paths.data", "no space left", str(small))
        assert list(small.iterdir()) == []  # the half-built data directory was removed
        assert processes_mentioning(str(small)) == []
    finally:
        _as_root("umount", str(small))
        shutil.rmtree(base, ignore_errors=True)


def test_a_port_taken_after_it_was_chosen_moves_the_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pglab.plan.schema import LocalTarget
    from pglab.targets.local import cluster

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    real = cluster.free_port
    ports = iter([taken])
    monkeypatch.setattr(cluster, "free_port", lambda: next(ports, None) or real())
    messages: list[str] = []
    lab = cluster.LocalLab(LocalTarget(instances=1, synchronous=None), tmp_path, log=messages.append)
    try:
        lab.provision({})
        assert lab.nodes[0].port != taken and lab.health() is None
        assert f"port {taken} is taken by another program; n0 moves to port {lab.nodes[0].port}" in messages
        with lab.connect(lab.nodes[0]) as conn:
            assert scalar(conn, "SHOW port") == str(lab.nodes[0].port)
    finally:
        lab.teardown()
        busy.close()
