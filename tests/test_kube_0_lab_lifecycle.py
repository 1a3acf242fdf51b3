"""The Kubernetes lab's own lifecycle (tools/kube-lab/kubelab.py, issue 32 item 1): ``clean`` after ``up`` was
killed with SIGKILL half-way leaves nothing of it on the machine: no process, mount, network namespace (the nodes'
nor the pods'), veth or bridge, loop device, cgroup, iptables rule or log link. ``down`` after a ready lab is
tests/test_kube_z_lab_down.py, on the session's lab once every other real-cluster test is done with it.

What is left is read from the machine itself (``kube_lab_support.leftovers``), not from anything the lab recorded.
One lab runs per machine: this module starts a lab of its own, so it runs before the session's lab starts (its name
sorts first among the kube_lab modules) and fails in one sentence if a lab runs.
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
from kube_lab_support import cni_netns, kubelab, leftovers

pytestmark = pytest.mark.kube_lab

SCRIPT = REPO / "tools" / "kube-lab" / "kubelab.py"
NODES = 2  # a database node and a client node: every kind of node, at the least cost


def kubelab_cmd(*args: str) -> list[str]:
    return [sys.executable, str(SCRIPT), *args]


def test_clean_after_a_killed_up_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "PGLAB_STATE_DIR": str(state)}
    running = kubelab.state_file()
    if running.exists() and kubelab._running(Path(json.loads(running.read_text())["root"])):
        pytest.fail(f"a Kubernetes lab is running ({running}): this test needs the machine's only lab slot",
                    pytrace=False)
    cni_before = cni_netns()

    # up killed with SIGKILL once its nodes' kubelets run: its processes outlive it, and clean removes them all
    log = tmp_path / "up.log"  # what up said before it was killed, for a failure to be read
    with open(log, "w") as out:
        proc = subprocess.Popen(kubelab_cmd("up", "--nodes", str(NODES)), env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        killed_root: Path | None = None
        while True:
            assert proc.poll() is None, ("up ended before it was killed", log.read_text()[-3000:])
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
    assert {"processes", "node network namespaces", "loop devices", "cgroups"} <= left.keys(), (
        left, log.read_text()[-3000:])
    clean = subprocess.run(kubelab_cmd("clean"), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert clean.returncode == 0 and "stopped and removed" in clean.stdout, clean.stdout + clean.stderr
    assert leftovers(killed_root, cni_before) == {}
