"""The lab tool's own pieces that need no lab: the provisioner's build key, as build.sh and kubelab.py compute it."""

from __future__ import annotations

import subprocess

from conftest import REPO
from kube_lab_support import kubelab


def test_the_provisioner_key_is_the_one_build_sh_computes() -> None:
    # the same command as tools/kube-lab/build.sh's prov_key: kubelab.py finds the provisioner build by this key
    here = REPO / "tools" / "kube-lab"
    script = ("find k8s/cmd/hostpath-provisioner k8s/go.mod k8s/go.sum -type f | LC_ALL=C sort | xargs sha256sum "
              "| sha256sum | cut -c1-16")
    assert script in (here / "build.sh").read_text().replace(" |\n    ", " | ")
    shell = subprocess.run(["bash", "-c", script], cwd=here, capture_output=True, text=True, check=True)
    assert kubelab.provisioner_key() == shell.stdout.strip()
