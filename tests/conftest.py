"""Shared helpers for tests that run the real thing: pglab's CLI, PostgreSQL servers, pgbench."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def pglab(*args: str, timeout: float = 600, check: bool = False, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run the pglab CLI as a user would, in a subprocess."""
    proc = subprocess.run([sys.executable, "-m", "pglab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    if check and proc.returncode != 0:
        raise AssertionError(f"pglab {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that mention ``text`` (e.g. a lab directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{entry.name}: {cmd.strip()}")
    return found


def write_plan(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def plan_file(tmp_path: Path):
    def make(text: str, name: str = "plan.yaml") -> Path:
        return write_plan(tmp_path / name, text)

    return make
