"""The long-lived pgbench client pods of a sweep, and the command that runs one run's Job script in them by exec.

A run's Job (``render.pgbench_run``: the settings wait, the dataset reset, pgbench, its files shipped between the
results markers) stays what the run does: ``pglab k8s render`` writes it, and ``pglab run`` runs its very script in
one of these pods instead of starting a pod for it. The pods are that Job's pod (image, resources, client nodes,
anti-affinity to the instances, the scripts' ConfigMap, the credentials from the app secret) with an idle command;
one per load pod (``run.load_pods``), apart from each other as the load Job's pods prefer to be."""

from __future__ import annotations

import json
import shlex
from typing import Any

from pglab.plan.expand import expand
from pglab.plan.schema import Plan
from pglab.targets.kubernetes.orchestrate import CLIENT_COMPONENT
from pglab.targets.kubernetes.render import (
    LOAD_INDEX,
    LOAD_LABEL,
    Manifest,
    client_cores,
    pgbench_run,
    target_of,
)
from pglab.targets.kubernetes.scripts import RESULTS_DIR

RUN_VAR = "PGLAB_RUN"  # the run's name (its Job's), exported to the exec'd script
PER_RUN_ENV = ("PGOPTIONS", "PGLAB_JOB_UID")  # a run's own (its point's level; its barrier's key), set by the exec
# PID 1 waits for nothing but its TERM (trapped: PID 1 has no default action); the runs are exec'd beside it
IDLE_SCRIPT = "trap 'exit 0' TERM INT\nwhile :; do sleep 3600 & wait $!; done"
GRACE_S = 2  # the pods' termination grace: their deletion at the sweep's end is quick


def pools_apart(plan: Plan) -> bool:
    """Whether no node can take both an instance and a client pod: their node selectors ask one label for different
    values. The client pods may then be created before every instance has its node, since their anti-affinity to
    the instances (which the scheduler honours both ways) cannot turn an instance away from a node."""
    k8s = target_of(plan)
    db, clients = k8s.database.node_selector, k8s.clients.node_selector
    return any(key in clients and clients[key] != value for key, value in db.items())


def client_pods(plan: Plan) -> list[Manifest]:
    """One pod per load pod, each the run Job's pod template with an idle command; a run's per-run environment
    (synchronous_commit's PGOPTIONS, the barrier's key) is left to the exec."""
    k8s = target_of(plan)
    n = plan.run.load_pods
    job = pgbench_run(plan, expand(plan, cores=client_cores(k8s))[0], 1)
    group = f"{k8s.cluster_name}-clients"
    out = []
    for index in range(n):
        template = json.loads(json.dumps(job.body["spec"]["template"]))
        pod: dict[str, Any] = template["spec"]
        container = pod["containers"][0]
        container["command"] = ["/bin/sh", "-c", IDLE_SCRIPT]
        container["env"] = [e for e in container.get("env", []) if e["name"] not in PER_RUN_ENV]
        pod["terminationGracePeriodSeconds"] = GRACE_S
        anti = pod.get("affinity", {}).get("podAntiAffinity", {})
        preferred = [t for t in anti.pop("preferredDuringSchedulingIgnoredDuringExecution", [])
                     if LOAD_LABEL not in t["podAffinityTerm"]["labelSelector"].get("matchLabels", {})]
        if n > 1:  # apart from each other, as the load Job's pods
            preferred.append({"weight": 50, "podAffinityTerm": {
                "labelSelector": {"matchLabels": {LOAD_LABEL: group}}, "topologyKey": "kubernetes.io/hostname"}})
        if preferred:
            pod.setdefault("affinity", {}).setdefault("podAntiAffinity", {})[
                "preferredDuringSchedulingIgnoredDuringExecution"] = preferred
        labels = {**template["metadata"]["labels"], "pglab/component": CLIENT_COMPONENT, LOAD_LABEL: group}
        meta = {"name": f"{group}-{index}", "namespace": k8s.namespace, "labels": labels,
                "annotations": {"pglab/load-index": str(index)}}
        out.append(Manifest(f"45-pgbench-client-{index}-pod.yaml",
                            {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod}))
    return out


def run_command(job: Manifest, index: int | None, token: str) -> list[str]:
    """The exec that runs ``job``'s script in a client pod as the Job's pod would: the Job's plain environment
    (the point's PGOPTIONS among it) exported, with the load pod's index and the run's barrier key (``token``,
    new for every attempt) where the Job controller would have set them; the results folder emptied first."""
    container = job.body["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    env[RUN_VAR] = job.name
    if index is not None:
        env[LOAD_INDEX] = str(index)
        env["PGLAB_JOB_UID"] = token
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    if "PGOPTIONS" not in env:
        lines.append("unset PGOPTIONS")
    lines += [f"rm -rf {RESULTS_DIR}/*", f"exec /bin/sh -c {shlex.quote(container['command'][2])}"]
    return ["/bin/sh", "-c", "\n".join(lines)]
