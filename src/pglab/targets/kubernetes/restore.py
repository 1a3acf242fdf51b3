"""The backup scenario's restore check on Kubernetes (``restore_check: true``): once the Backup completed and the
witness stopped, a new Cluster is bootstrapped from that backup (``bootstrap.recovery`` from the plugin's ObjectStore,
``recoveryTarget.backupID`` pinned to it, no recovery target: PostgreSQL replays all the WAL archived since), a Job
reads the witness's ids from it, and it is deleted with its volumes.

The writes it must hold are those the witness saw acknowledged before the backup's end LSN
(``witness.acked_before_lsn``): a restore of this backup cannot be consistent before replaying up to there. Those
acknowledged later are counted apart, as far as the archive's WAL carried the replay.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pglab.plan.schema import Plan
from pglab.scenarios.witness import Attempt, acked_before_lsn, parse_lsn
from pglab.targets.kubernetes.orchestrate import K8sError, Orchestrator
from pglab.targets.kubernetes.render import (
    BARMAN_PLUGIN,
    CNPG_API,
    MANAGED_BY,
    WITNESS_TABLE,
    Manifest,
    cluster,
    object_store_name,
    target_of,
)
from pglab.targets.kubernetes.scripts import RESULTS_DIR

RESTORE_MARK = "pglab-restore"  # the reader Job's lines pglab reads
READ_TRIES = 30  # the reader's tries, 2 s apart: the operator sets the app user's password once recovery is done
SOURCE = "origin"  # the externalClusters entry the recovery reads from


def restore_name(plan: Plan) -> str:
    """The recovered Cluster's name (CloudNativePG allows 50 characters; a cluster_name has 40 at most)."""
    return f"{target_of(plan).cluster_name}-restore"


def recovered_cluster(plan: Plan, backup_id: str) -> Manifest:
    """A Cluster of one instance bootstrapped from the backup ``backup_id`` in the plan's ObjectStore, as the
    Barman Cloud plugin's documentation has a restore: an ``externalClusters`` entry naming the plugin, the
    ObjectStore and the source Cluster's server name. The same image, volumes, resources, parameters and database
    placement as the source's (CloudNativePG advises its parameters for a recovery); no ``plugins`` entry, so it
    archives nothing into the source's store; no recovery target, so the replay goes to the end of the archive."""
    k8s = target_of(plan)
    source = cluster(plan)
    spec = {key: copy.deepcopy(value) for key, value in source["spec"].items()
            if key in ("imageName", "postgresql", "storage", "walStorage", "resources", "affinity")}
    spec["postgresql"].pop("synchronous", None)  # one instance: no standby to wait for
    spec["instances"] = 1
    spec["bootstrap"] = {"recovery": {"source": SOURCE, "recoveryTarget": {"backupID": backup_id}}}
    spec["externalClusters"] = [{"name": SOURCE, "plugin": {"name": BARMAN_PLUGIN, "parameters": {
        "barmanObjectName": object_store_name(k8s), "serverName": k8s.cluster_name}}}]
    name = restore_name(plan)
    meta = {"name": name, "namespace": k8s.namespace,
            "labels": {**MANAGED_BY, "pglab/cluster": k8s.cluster_name, "pglab/component": "restore"},
            "annotations": {"pglab/backup-id": backup_id}}
    return Manifest(f"restore-{name}.yaml", {"apiVersion": CNPG_API, "kind": "Cluster", "metadata": meta,
                                             "spec": spec})


def reader_script() -> str:
    """psql in a client pod: the witness's ids in the recovered Cluster, between two marked lines (retried while
    the Cluster's app user cannot log in yet)."""
    w = RESTORE_MARK
    return "\n".join([
        "set -u", f"cd {RESULTS_DIR}", "n=0",
        f"until psql -XAtq -v ON_ERROR_STOP=1 -d 'connect_timeout=5' -c 'SELECT id FROM {WITNESS_TABLE} ORDER BY id'"
        " > present.txt 2> read.err; do",
        f'  n=$((n+1)); [ "$n" -ge {READ_TRIES} ] && {{ echo "{w} read-failed $(tail -n 1 read.err)"; exit 1; }}',
        "  sleep 2", "done",
        f'echo "{w} present begin"; cat present.txt; echo "{w} present end"',
    ])


def reader_job(witness: Manifest, name: str, restored: str) -> Manifest:
    """The reader Job, made from the run's witness Job (its image, client placement and the app secret's keys)
    pointed at the recovered Cluster's service and its own app secret."""
    body = copy.deepcopy(witness.body)
    body["metadata"]["name"] = name
    body["metadata"]["labels"]["pglab/component"] = "restore-read"
    body["metadata"].pop("annotations", None)
    template = body["spec"]["template"]
    template["metadata"]["labels"]["pglab/component"] = "restore-read"
    container = template["spec"]["containers"][0]
    container["command"] = ["/bin/sh", "-c", reader_script()]
    env: list[dict[str, Any]] = []
    for var in container.get("env", []):
        if var["name"] == "PGOPTIONS":
            continue
        var = copy.deepcopy(var)
        if var["name"] == "PGHOST":
            var["value"] = f"{restored}-rw"
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            ref["name"] = f"{restored}-app"  # the operator makes it, and sets the app user's password from it
        env.append(var)
    container["env"] = env
    return Manifest(f"restore-read-{name}.yaml", body)


def parse_reader_log(text: str) -> list[int]:
    """The ids the reader printed; a log without them (it could not read) is refused in one line."""
    present: list[int] = []
    reading = False
    for line in text.splitlines():
        if line.strip() == f"{RESTORE_MARK} present begin":
            reading = True
        elif line.strip() == f"{RESTORE_MARK} present end":
            return present
        elif reading and line.strip():
            present.append(int(line))
        elif line.startswith(f"{RESTORE_MARK} read-failed"):
            raise K8sError(f"restore check: the recovered Cluster's witness table could not be read: "
                           f"{line.split('read-failed', 1)[1].strip() or 'no reason printed'}")
    raise K8sError("restore check: the reader's log ends before the ids it read (the pod ended early?)")


@dataclass
class RestoreCheck:
    """What the restore check found. ``acked``: ids the witness saw acknowledged before the backup's end LSN, all
    of which a restore of this backup must hold; ``after``: those acknowledged later (found as far as the archive's
    WAL reached); ``present``: the ids the recovered Cluster holds."""

    cluster: str
    backup_id: str
    end_lsn: str
    seconds: float  # from the recovered Cluster's creation until the operator reported it healthy
    acked: list[int]
    after: list[int]
    present: list[int]
    lost: list[int] = field(init=False)
    after_found: list[int] = field(init=False)

    def __post_init__(self) -> None:
        have = set(self.present)
        self.lost = [i for i in self.acked if i not in have]
        self.after_found = [i for i in self.after if i in have]

    def figures(self) -> dict[str, float | None]:
        return {"restore_s": self.seconds, "restore_acked": float(len(self.acked)),
                "restore_lost": float(len(self.lost)), "restore_after_acked": float(len(self.after)),
                "restore_after_found": float(len(self.after_found))}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check(orch: Orchestrator, backup_status: dict[str, Any], attempts: list[Attempt], witness: Manifest,
          dest: Path, timeout_s: float) -> RestoreCheck:
    """Recover a Cluster from the completed backup, read the witness's ids from it, delete it (and its volumes,
    waited for) whatever happened; ``dest`` keeps its manifest, the reader's log and restore.json."""
    plan = orch.plan
    backup_id, end = str(backup_status.get("backupId") or ""), str(backup_status.get("endLSN") or "")
    if not backup_id or not end:
        raise K8sError("restore check: the completed Backup reports no backupId or endLSN to recover from")
    acked, after = acked_before_lsn(attempts, parse_lsn(end))
    m = recovered_cluster(plan, backup_id)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "cluster.json").write_text(json.dumps(m.body, indent=1))
    orch.log(f"restore check: creating Cluster/{m.name} from backup {backup_id}")
    orch.create(m)
    try:
        created = time.time()
        try:
            orch.wait_cluster_ready(m.name, m.body["spec"]["instances"], timeout_s)
        except K8sError as exc:
            raise K8sError(f"restore check: {exc}", exc.status) from None
        seconds = time.time() - created
        orch.log(f"restore check: Cluster/{m.name} healthy {seconds:.1f} s after its creation")
        reader = reader_job(witness, f"{m.name}-read", m.name)
        outcome = orch.run_job(reader, dest)
        present = parse_reader_log(outcome.log)
    finally:
        orch.discard(m)
        orch.wait_cluster_gone(m.name)
    return RestoreCheck(m.name, backup_id, end, seconds, acked, after, present)
