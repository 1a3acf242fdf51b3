"""Study 001's backup half on the multi-node lab, run and read without pglab: the sweep tests/test_kube_lab_backup.py
checks (its docstring says what), run by that module, or beside the interrupted sweep of tests/test_kube_lab.py
(``kube_lab_support.Beside``) when both run."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from conftest import REPO, pglab
from kube_lab_support import built_beside, kubelab, namespace_gone, study_plan

STUDY = "study-backup-under-load.yaml"
EXAMPLE = yaml.safe_load((REPO / "examples" / STUDY).read_text())
NS, NAME = EXAMPLE["target"]["kubernetes"]["namespace"], EXAMPLE["target"]["kubernetes"]["cluster_name"]


def backup_plan(lab: kubelab.KubeLab, destination: str) -> str:
    """Study 001's backup plan at its smallest, archiving to ``destination`` of the lab's object store (the example's
    endpoint and credentials are the lab's: tests/test_study_examples.py), on the lab's PostgreSQL image."""
    assert EXAMPLE["target"]["kubernetes"]["image"] == lab.image_names["postgresql"]
    return study_plan(STUDY, lab.kubeconfig, destination=destination)


def store_data(lab: kubelab.KubeLab) -> Path:
    """versitygw's data folder (an emptyDir, its posix backend's root) on the system node's disk, as the kubelet made
    it."""
    pod = lab.kubectl("-n", kubelab.OBJECTSTORE_NS, "get", "pod", "-l", "app=versitygw", "-o",
                      "jsonpath={.items[0].metadata.uid} {.items[0].spec.nodeName}").stdout.split()
    uid, node = pod
    path = kubelab.node_root(lab.root, node) / "var/kubelet/pods" / uid / "volumes/kubernetes.io~empty-dir/data"
    assert path.is_dir(), path
    return path


def objects(folder: Path) -> dict[str, int]:
    """The objects versitygw stores under a prefix folder, read from its posix backend's layout: the bucket is a
    top-level folder, an object the file at its key's path (a multipart upload's parts joined into it once
    complete; its metadata in the file's xattrs). Key → its bytes."""
    return {str(f.relative_to(folder)): f.stat().st_size for f in folder.rglob("*") if f.is_file()}


@dataclass
class ArchiverReads:
    """pg_stat_archiver read with psql in the primary pod every 2 s while pglab runs: the oracle of the archived and
    failed counts."""

    lab: kubelab.KubeLab
    rows: list[tuple[float, int, int]] = field(default_factory=list)
    halt: threading.Event = field(default_factory=threading.Event)
    completed: float | None = None  # when this thread's first read of the Backup's phase as completed returned
    pending: float | None = None  # when its last read that found the Backup not completed (or absent) began

    def run(self) -> None:
        while not self.halt.wait(1):
            if self.completed is None:
                asked = time.time()
                phase = self.lab.kubectl("-n", NS, "get", "backups", "-o", "jsonpath={.items[*].status.phase}",
                                         check=False, timeout=20).stdout.strip()
                if phase == "completed":
                    self.completed = time.time()
                else:
                    self.pending = asked
            proc = self.lab.kubectl("-n", NS, "exec", f"{NAME}-1", "-c", "postgres", "--", "psql", "-tAq", "-d",
                                    "postgres", "-c", "SELECT archived_count, failed_count FROM pg_stat_archiver",
                                    check=False, timeout=20)
            with contextlib.suppress(ValueError):
                archived, failed = (int(v) for v in proc.stdout.strip().split("|"))
                self.rows.append((time.time(), archived, failed))


@dataclass
class Sweep:
    results: Path
    destination: str
    listing: dict[str, int]  # the object store's objects under the destination after the run, key → bytes
    archiver: ArchiverReads
    seconds: float


def backup_sweep(lab: kubelab.KubeLab, tmp: Path, beside: tuple[str, ...] = ()) -> Sweep:
    """The study's sweep into ``tmp``, with this module's readings beside it; ``beside``: the namespaces of sweeps
    running beside this one (what they hold is theirs when this one's leftovers are looked for)."""
    build = built_beside("objectstore")  # from nothing, ./setup.sh test builds it beside the lab's first tests
    t0 = time.monotonic()
    timings = lab.objectstore(build)
    print(f"kube-lab: object store and plugin {timings}")
    prefix = f"{NAME}-{uuid.uuid4().hex[:8]}"  # an empty path: barman refuses to archive over another server's WAL
    plan = tmp / "plan.yaml"
    plan.write_text(backup_plan(lab, f"s3://pglab/{prefix}"))
    results = tmp / "results"
    reads = ArchiverReads(lab)
    reader = threading.Thread(target=reads.run, daemon=True)
    reader.start()
    try:
        proc = pglab("run", str(plan), "--results", str(results), timeout=1200)
    finally:
        reads.halt.set()
        reader.join()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the preflight found the real plugin where the operator looks for it, and the Secret the plan names
    assert (f"ok    Barman Cloud plugin: Service cnpg-system/barman-cloud; Secret {kubelab.OBJECTSTORE_NS}/"
            f"{kubelab.OBJECTSTORE_SECRET} present") in proc.stderr.splitlines(), proc.stderr[:3000]
    listing = objects(store_data(lab) / "pglab" / prefix / NAME)
    namespace_gone(lab, NS, proc.stderr, beside)
    seconds = time.monotonic() - t0
    print(f"backup test: the sweep {seconds:.0f} s")
    return Sweep(results, prefix, listing, reads, seconds)
