"""The Kubernetes lab's own lifecycle (tools/kube-lab/kubelab.py, issue 32 item 1): ``down`` after a ready lab, and
``clean`` after ``up`` was killed with SIGKILL half-way, leave nothing of it on the machine: no process, mount,
network namespace (the nodes' nor the pods'), veth or bridge, loop device, cgroup, iptables rule or log link.

What is left is read here from the machine itself (/proc, ip, losetup, iptables, /sys/fs/cgroup), not from
anything the lab recorded. One lab runs per machine: this module starts labs of its own, so it runs before the
session's lab starts (its name sorts first among the kube_lab modules) and fails in one sentence if a lab runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from kube_lab_support import kubelab

pytestmark = pytest.mark.kube_lab

SCRIPT = REPO / "tools" / "kube-lab" / "kubelab.py"
NODES = 2  # a database node and a client node: every kind of node, at the least cost


def _out(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60).stdout


def cni_netns() -> set[str]:
    return {p.name for p in Path("/run/netns").glob("cni-*")} if Path("/run/netns").exists() else set()


def leftovers(root: Path, cni_before: set[str]) -> dict[str, list[str]]:
    """Everything of the lab in ``root`` still on this machine, by kind (empty lists left out)."""
    me = os.getpid()
    found = {
        "processes": [f"{p.name}: {cmd[:120]}" for p in Path("/proc").iterdir() if p.name.isdigit()
                      and int(p.name) != me and str(root) in (cmd := _cmdline(p))],
        "mounts": [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                   if line.split()[1].startswith(str(root))],
        "node network namespaces": [n for n in _out("ip", "netns", "list").split() if n.startswith("pglab-kl-")],
        "pod network namespaces": sorted(cni_netns() - cni_before),
        "links": [n for line in _out("ip", "-o", "link").splitlines()
                  if (n := line.split(": ")[1].split("@")[0]).startswith(("pglabkube", "pglabkl"))],
        "loop devices": [line for line in _out("losetup", "-a").splitlines() if str(root) in line],
        "cgroups": [str(h) for h in Path("/sys/fs/cgroup").glob(f"*/{kubelab.CGROUP}")],
        "iptables rules": [r for r in _out("iptables", "-S").splitlines() if "pglab-kube-lab" in r],
        "log links": [str(p) for p in Path("/var/log/containers").glob("*.log")
                      if os.readlink(p).startswith(str(root))] if Path("/var/log/containers").exists() else [],
        "folder": [str(root)] if root.exists() else [],
    }
    return {k: v for k, v in found.items() if v}


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kubelab_cmd(*args: str) -> list[str]:
    return [sys.executable, str(SCRIPT), *args]


def test_down_and_clean_after_a_killed_up_leave_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "PGLAB_STATE_DIR": str(state)}
    running = kubelab.state_file()
    if running.exists() and kubelab._running(Path(json.loads(running.read_text())["root"])):
        pytest.fail(f"a Kubernetes lab is running ({running}): this test needs the machine's only lab slot",
                    pytrace=False)
    cni_before = cni_netns()

    # a ready lab, then down
    up = subprocess.run(kubelab_cmd("up", "--nodes", str(NODES)), env=env, capture_output=True, text=True,
                        timeout=900, check=False)
    assert up.returncode == 0, up.stdout + up.stderr
    root = Path(json.loads((state / "kube-lab.json").read_text())["root"])
    lab_env = {**env, "KUBECONFIG": str(root / "admin.kubeconfig")}
    kubectl = Path(json.loads((root / "lab.json").read_text())["bin"]) / "kubectl"
    nodes = json.loads(subprocess.run([str(kubectl), "get", "nodes", "-o", "json"], env=lab_env, capture_output=True,
                                      text=True, check=True, timeout=60).stdout)["items"]
    assert sorted(n["metadata"]["labels"].get("pglab.io/role") for n in nodes) == ["client", "database"]
    running_parts = leftovers(root, cni_before)
    # the lab had all of these while it ran: pods (CoreDNS, the operator) in network namespaces of their own
    assert {"processes", "mounts", "node network namespaces", "pod network namespaces", "links", "loop devices",
            "cgroups", "iptables rules"} <= running_parts.keys(), running_parts
    down = subprocess.run(kubelab_cmd("down"), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    assert leftovers(root, cni_before) == {}

    # up killed with SIGKILL once its nodes' kubelets run: its processes outlive it, and clean removes them all
    proc = subprocess.Popen(kubelab_cmd("up", "--nodes", str(NODES)), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        killed_root: Path | None = None
        while True:
            assert proc.poll() is None, "up ended before it was killed"
            assert time.monotonic() < deadline, "up never started its nodes' kubelets"
            if killed_root is None and (state / "kube-lab.json").exists():
                killed_root = Path(json.loads((state / "kube-lab.json").read_text())["root"])
            if killed_root is not None and (killed_root / "pids.json").exists() and all(
                    f"{n.name}/kubelet" in json.loads((killed_root / "pids.json").read_text())
                    for n in kubelab.lab_nodes(NODES)):
                break
            time.sleep(0.2)
        time.sleep(3)  # the kubelets at work: registering, mounting
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert killed_root is not None
    left = leftovers(killed_root, cni_before)
    assert {"processes", "node network namespaces", "loop devices", "cgroups"} <= left.keys(), left
    clean = subprocess.run(kubelab_cmd("clean"), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert clean.returncode == 0 and "stopped and removed" in clean.stdout, clean.stdout + clean.stderr
    assert leftovers(killed_root, cni_before) == {}
