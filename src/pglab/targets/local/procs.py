"""Processes as /proc shows them, for the labs and their cleanup: alive (a zombie is not), descendants, a data
directory's postmaster, and stopping one for good."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Running and not a zombie (a killed postmaster is reparented to init, which may not reap it at once)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren …)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def postmaster_pid(data: Path) -> int | None:
    """The live postmaster of a data directory, from its postmaster.pid."""
    try:
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive(pid) else None


def freeze_and_kill(pids: list[int]) -> None:
    """SIGSTOP all first, then SIGKILL: none of them can react to the others' death (a power cut, not a shutdown)."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def stop_postmaster(pid: int, grace: float = 10.0, signalled: bool = False) -> None:
    """Immediate shutdown (SIGQUIT: the postmaster takes its children down); after ``grace`` seconds, kill what is
    left. ``signalled``: SIGQUIT was already sent."""
    if not signalled:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)
    end = time.monotonic() + grace
    while alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if alive(pid):
        freeze_and_kill([pid, *descendants(pid)])
