"""Stopping and removing what a lab directory's ``lab.json`` names, without the lab object that wrote it.

For labs kept with ``--keep`` (``pglab lab clean``) and labs left behind by a pglab that was killed (the registry's
orphans). It reads ``lab.json`` only, so that the registry can clean any kind of lab without importing the labs:
a plain lab (``cluster.LocalLab``) and an HA lab (``ha.HALab``, ``kind: ha``: Patroni must be stopped first).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from pglab.errors import UserError
from pglab.targets.local import cgroups, procs
from pglab.targets.local.removal import remove_tree


def is_ha_lab(lab_dir: Path) -> bool:
    try:
        return bool(json.loads((lab_dir / "lab.json").read_text()).get("kind") == "ha")
    except (OSError, ValueError, AttributeError):
        return False


def stop_lab(lab_dir: Path) -> list[str]:
    """:func:`stop_ha_lab` or :func:`stop_plain_lab`, whichever the lab is. Returns what was stopped."""
    return stop_ha_lab(lab_dir) if is_ha_lab(lab_dir) else stop_plain_lab(lab_dir)


def read_state(lab_dir: Path) -> dict[str, Any]:
    """A lab's lab.json; UserError when the folder has none it can read."""
    try:
        state: dict[str, Any] = json.loads((lab_dir / "lab.json").read_text())
    except (OSError, ValueError):
        raise UserError(f"'{lab_dir}' is not a pglab lab (no readable lab.json).") from None
    return state


def stop_plain_lab(lab_dir: Path) -> list[str]:
    """Stop every server a plain lab's lab.json names, and any pgbench or fio still working on it, and remove the
    lab's files. Returns what was stopped."""
    lab_dir = lab_dir.resolve()
    state = read_state(lab_dir)
    node_dirs = [Path(n[k]).parent for n in state.get("nodes", []) for k in ("data", "wal")]
    procs.kill_all([p for p in procs.processes_using([lab_dir / "sock", lab_dir / "toxiproxy", *node_dirs])
                    if not _is_postmaster_child(p)])  # clients first: pgbench, fio
    stopped = []
    for n in state.get("nodes", []):
        data, wal = Path(n["data"]), Path(n["wal"])
        pid = procs.postmaster_pid(data)
        if pid is not None:
            procs.stop_postmaster(pid)
            stopped.append(f"{n['name']} (pid {pid})")
        for d in (data.parent, wal.parent):
            if d.is_dir() and not d.is_relative_to(lab_dir):
                remove_tree(d)
    remove_tree(lab_dir)
    with contextlib.suppress(OSError):
        cgroups.remove_named(cgroups.cgroup_name(lab_dir))
    return stopped


def _is_postmaster_child(pid: int) -> bool:
    """Server processes are stopped through their postmaster, not killed one by one."""
    comm = procs.comm(pid)
    return comm in ("postgres", "postmaster") or comm.startswith("postgres")


def stop_ha_lab(lab_dir: Path) -> list[str]:
    """Stop what an HA lab left running and remove its files: every Patroni first (it would restart a postgres
    stopped under it), then each postmaster, then etcd, then anything else still using the lab's directories.
    Returns what was stopped."""
    lab_dir = lab_dir.resolve()
    state = read_state(lab_dir)
    if state.get("kind") != "ha":
        raise UserError(f"'{lab_dir}' is not an HA lab (clean it with cluster.clean_lab).")
    nodes = state.get("nodes", [])
    parents = {Path(n[k]).parent for n in nodes for k in ("data", "wal")}
    outside = sorted(p for p in parents if not p.is_relative_to(lab_dir))
    stopped: list[str] = []
    configs = [n["config"] for n in nodes if n.get("config")]
    patronis = [p for p in procs.processes_using([Path(c) for c in configs])
                if not procs.comm(p).startswith("postgres")]
    procs.kill_all(patronis)
    stopped += [f"patroni (pid {p})" for p in patronis]
    for n in nodes:
        pid = procs.postmaster_pid(Path(n["data"]))
        if pid is None:
            continue
        procs.stop_postmaster(pid)
        stopped.append(f"{n['name']} (pid {pid})")
    others = sweep([lab_dir, *outside])  # etcd, toxiproxy, clients
    stopped += [f"{comm or 'process'} (pid {p})" for p, comm in others]
    with contextlib.suppress(OSError):
        cgroups.remove_named(cgroups.cgroup_name(lab_dir))  # its nodes' and pgbench's groups, empty by now
    for d in outside:
        remove_tree(d)
    remove_tree(lab_dir)
    return stopped


def sweep(paths: list[Path]) -> list[tuple[int, str]]:
    """Kill whatever still runs from the lab's directories (command line, environment or working directory);
    returns their pids and names."""
    killed: list[tuple[int, str]] = []
    for _round in range(5):
        pids = procs.processes_using(paths)
        if not pids:
            break
        killed += [(p, procs.comm(p)) for p in pids]
        procs.freeze_and_kill(pids)
        procs.kill_all(pids)
    return killed
