"""Processes as /proc shows them, for the labs and their cleanup: alive (a zombie is not), descendants, a data
directory's postmaster, the processes using a lab's directories, and stopping them for good."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


def stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces and ')'): state, ppid, …;
    [] when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _parents() -> list[tuple[int, int]]:
    """(ppid, pid) of every process."""
    return [(int(fields[1]), int(entry.name)) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and (fields := stat_fields(entry.name))]


def alive(pid: int) -> bool:
    """Running and not a zombie (a killed postmaster is reparented to init, which may not reap it at once)."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def stopped(pid: int) -> bool:
    """Stopped by a signal (SIGSTOP: a hung VM as a lab plays it): it would not act on a shutdown request."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] in ("T", "t")


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren …)."""
    children: dict[int, list[int]] = {}
    for ppid, child in _parents():
        children.setdefault(ppid, []).append(child)
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


def end_group(proc: subprocess.Popen[Any], first: signal.Signals, grace_s: float) -> None:
    """End ``proc`` and its process group: ``first``, then SIGKILL if it has not exited within ``grace_s``; each
    waited for (5 s for the SIGKILL), and nothing sent once it has exited."""
    for sig, wait_s in ((first, grace_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)


def process_start_time(pid: int) -> int | None:
    """Clock ticks since boot at which ``pid`` started (field 22 of /proc/pid/stat); None when it is gone."""
    fields = stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 else None


def processes_using(paths: list[Path]) -> list[int]:
    """Pids (other than this process and its ancestors) whose command line, environment or working directory
    names one of ``paths``: servers, pgbench (PGHOST is the lab's socket directory), fio (its scratch folder)."""
    texts = [str(p) for p in paths if str(p) not in ("", "/")]
    mine = {os.getpid(), *_ancestors()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            env = (entry / "environ").read_bytes().decode(errors="replace")  # pgbench: PGHOST=<lab>/sock
        except OSError:
            cwd = env = ""
        if any(t in cmd or t in env or cwd == t or cwd.startswith(t + "/") for t in texts):
            found.append(int(entry.name))
    return found


def _ancestors() -> list[int]:
    out, pid = [], os.getppid()
    while pid > 1:
        out.append(pid)
        fields = stat_fields(pid)
        pid = int(fields[1]) if fields else 0
    return out


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(process_start_time(p) is not None and alive(p) for p in pids):
        time.sleep(0.05)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants (last resort when pg_ctl cannot stop a server)."""
    children = [child for ppid, child in _parents() if ppid == pid]
    for p in [pid, *children]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
