"""``kubelab.py down`` after a ready lab leaves nothing of it on the machine (tools/kube-lab, issue 32 item 1): no
process, mount, network namespace (the nodes' nor the pods'), veth or bridge, loop device, cgroup, iptables rule or
log link, read from the machine itself (``kube_lab_support.leftovers``).

The lab is the session's, after every other real-cluster test used it (this module's name sorts last among the
kube_lab modules): its parts are all there (every kind of node, the operator, the object store and the pods the
tests left behind), and no lab of its own is started for this check. ``clean`` after a killed ``up`` is
tests/test_kube_0_lab_lifecycle.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import POD_NETNS_BEFORE_LAB, REPO
from kube_lab_support import kubelab, leftovers

pytestmark = pytest.mark.kube_lab


def test_down_after_the_sessions_lab_leaves_nothing(lab: kubelab.KubeLab) -> None:
    running = leftovers(lab.root, POD_NETNS_BEFORE_LAB)
    # the lab has all of these while it runs: pods (CoreDNS, the operator) in network namespaces of their own
    assert {"processes", "mounts", "node network namespaces", "pod network namespaces", "links", "loop devices",
            "cgroups", "iptables rules"} <= running.keys(), running
    down = subprocess.run([sys.executable, str(REPO / "tools" / "kube-lab" / "kubelab.py"), "down"],
                          env=dict(os.environ), capture_output=True, text=True, timeout=300, check=False)
    assert down.returncode == 0 and f"stopped and removed {lab.root}" in down.stdout, down.stdout + down.stderr
    assert leftovers(lab.root, POD_NETNS_BEFORE_LAB) == {}
    assert not kubelab.state_file().exists()
