"""``run-jobs.sh`` on the real lab (issue 28 item 5): ``pglab k8s render`` writes a plan's manifests and the POSIX sh
script that applies them in order (targets/kubernetes/folder.py); here sh runs that script against the lab with the
lab's kubectl, as a user would by hand, and what it did is read back without pglab: its own lines in order, the run
Job's results from its log (pgbench's output and -l logs), and the database the Cluster it made holds (psql in the
primary pod: the dataset's rows, and a pgbench_history row for each transaction pgbench counted).

The smallest plan the lab starts quickly: one instance, scale 1, one 5 s run of 2 clients.
"""

from __future__ import annotations

import base64
import io
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import pglab
from kube_lab_support import kubelab, namespace_gone, pgbench_tps, small_plan, txn_latencies_ms
from pglab.targets.kubernetes.scripts import CHECKPOINT_REFUSED

pytestmark = pytest.mark.kube_lab

NS, NAME = "pglab-e2e-render", "rj"
LOAD = """matrix: {clients: [2], jobs: [1]}
run: {duration: 5s}
"""
BEGIN, END = "----- pglab results begin -----", "----- pglab results end -----"


def job_results(lab: kubelab.KubeLab, job: str, into: Path) -> Path:
    """A Job's results, from its log: the base64 tarball between the pglab results markers, unpacked into ``into``."""
    log = lab.kubectl("-n", NS, "logs", f"job/{job}", timeout=60).stdout.splitlines()
    assert BEGIN in log and END in log, log[-20:]
    data = base64.b64decode("".join(log[log.index(BEGIN) + 1:log.index(END)]))
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()  # files of the Job's /results, no link or path out of it
        assert all(m.isdir() or m.isfile() for m in members) and not any(
            Path(m.name).is_absolute() or ".." in Path(m.name).parts for m in members), [m.name for m in members]
        tar.extractall(into, members)
    return into


def psql(lab: kubelab.KubeLab, sql: str) -> str:
    """One query in the app database, by psql in the Cluster's one instance pod (no pglab)."""
    return lab.kubectl("-n", NS, "exec", f"{NAME}-1", "-c", "postgres", "--", "psql", "-XtAq", "-d", "app", "-c",
                       sql, timeout=60).stdout.strip()


def test_run_jobs_sh_runs_the_rendered_plan_on_the_lab(lab: kubelab.KubeLab, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(small_plan(lab, NAME, NS, LOAD))
    out = tmp_path / "m"
    pglab("k8s", "render", str(plan), "-o", str(out), check=True)
    env = {**os.environ, "KUBECTL": f"{lab.bin / 'kubectl'} --kubeconfig {lab.kubeconfig}", "POLL_S": "2"}
    try:
        proc = subprocess.run(["sh", str(out / "run-jobs.sh")], capture_output=True, text=True, env=env,
                              timeout=1200, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # its steps in order: the Cluster healthy, the dataset's Job, the run's Job, done
        said = [line.split(" run-jobs: ", 1)[1] for line in proc.stdout.splitlines() if " run-jobs: " in line]
        steps = [f"the environment (cluster/): Cluster/{NAME} is healthy", f"Job/{NAME}-pgbench-init complete",
                 f"Job/{NAME}-run-0000-1 complete",
                 "done: every Job of jobs/ complete; their results are in their logs"]
        assert [s for s in said if s in steps] == steps, proc.stdout

        # the run's results, as its Job's log carries them: pgbench's own output and its per-transaction logs
        results = job_results(lab, f"{NAME}-run-0000-1", tmp_path / "run")
        text = (results / "pgbench.out").read_text()
        assert pgbench_tps(text) > 0, text
        found = re.search(r"^number of transactions actually processed: (\d+)", text, re.M)
        assert found, text
        processed = int(found[1])
        assert "number of clients: 2" in text and "duration: 5 s" in text, text
        assert len(txn_latencies_ms(results)) == processed > 0
        # the reset before it ended with a CHECKPOINT, which the app role may run as the Cluster granted it
        reset = (results / "reset.log").read_text()
        assert "CHECKPOINT" in reset and CHECKPOINT_REFUSED not in reset, reset
        # on a client node, against the Cluster the script made: its history table holds a row per transaction
        # (the Job truncates it first), its accounts the scale-1 dataset the dataset's Job loaded
        node = lab.kubectl("-n", NS, "get", "pods", "-l", f"job-name={NAME}-run-0000-1", "-o",
                           "jsonpath={.items[0].spec.nodeName}").stdout
        assert lab.node(node).role == "client", node
        assert int(psql(lab, "SELECT count(*) FROM pgbench_history")) == processed
        assert int(psql(lab, "SELECT count(*) FROM pgbench_accounts")) == 100_000
    finally:
        lab.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=false", check=False)
    namespace_gone(lab, NS)
