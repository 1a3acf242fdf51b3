"""Tenants on Kubernetes: one CloudNativePG Cluster per tenant, each tier its resources, storage class and namespace.

A tenant is rendered as a plan of its own (``tenant_plan``): the plan's Kubernetes target with the tenant's Cluster
name, namespace, instances, resources and volumes, so that every manifest of a one-Cluster plan (the Cluster, the
dataset Job, a run's Job) is made by the functions that make them for any plan. What is the tenants' own: the names,
and a run Job that waits for a shared start time, so every tenant's pgbench starts in the same second.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pglab.plan.expand import Point
from pglab.plan.schema import Arrangement, K8sResources, Plan, Tier
from pglab.targets.kubernetes.render import Manifest, cpu_quantity, pgbench_run, target_of

MIB = 1 << 20


@dataclass(frozen=True)
class K8sTenant:
    """One tenant of an arrangement: its name (t01 … across the tiers in plan order, as on a local lab), its tier,
    and the plan its manifests are rendered from."""

    name: str
    tier: Tier
    plan: Plan

    @property
    def cluster(self) -> str:
        return target_of(self.plan).cluster_name

    @property
    def namespace(self) -> str:
        return target_of(self.plan).namespace


def tier_resources(plan: Plan, tier: Tier) -> K8sResources:
    """A tier's ``resources`` (cpus, memory, as on a local lab) as the instances' requests = limits; what it leaves
    out is target.kubernetes.resources'."""
    base = target_of(plan).resources
    r = tier.resources
    cpu = cpu_quantity(r.cpus) if r is not None and r.cpus is not None else base.cpu
    memory = f"{max(1, r.memory.bytes // MIB)}Mi" if r is not None and r.memory is not None else base.memory
    return K8sResources(cpu=cpu, memory=memory)


def tenant_plan(plan: Plan, name: str, tier: Tier) -> Plan:
    """The plan as one tenant's Cluster sees it: ``<cluster_name>-<tenant>`` in its tier's namespace, with
    tenants.instances instances, the tier's resources and volumes (data and WAL: the tier's, else the target's); a
    lone instance is asynchronous."""
    k8s = target_of(plan)
    assert plan.tenants is not None
    instances = plan.tenants.instances
    update = {"cluster_name": f"{k8s.cluster_name}-{name}", "namespace": tier.namespace or k8s.namespace,
              "instances": instances, "resources": tier_resources(plan, tier),
              "storage": tier.storage or k8s.storage, "wal_storage": tier.wal_storage or k8s.wal_storage,
              "synchronous": k8s.synchronous if instances > 1 else None}
    target = plan.target.model_copy(update={"kubernetes": k8s.model_copy(update=update)})
    return plan.model_copy(update={"target": target})


def tenants_of(plan: Plan, arrangement: Arrangement) -> list[K8sTenant]:
    width = max(2, len(str(arrangement.tenant_count)))
    out: list[K8sTenant] = []
    for tier in arrangement.tiers:
        for _ in range(tier.tenants):
            name = f"t{len(out) + 1:0{width}d}"
            out.append(K8sTenant(name, tier, tenant_plan(plan, name, tier)))
    return out


def tenant_point(point: Point, tier: Tier) -> Point:
    """The load of one tenant of ``point``'s arrangement: its tier's workload, clients, jobs, synchronous_commit."""
    return Point(point.index, tier.workload, tier.clients, tier.jobs, tier.synchronous_commit)


START_WAIT = "pglab: waiting for the common start of every tenant"


def tenant_run(tenant: K8sTenant, point: Point, repeat: int, start_at: int) -> Manifest:
    """The tenant's run Job (``render.pgbench_run``), its pgbench held after the dataset reset until ``start_at``
    (epoch s) so that every tenant's pgbench starts in the same second; a pod that is later begins at once."""
    m = pgbench_run(tenant.plan, tenant_point(point, tenant.tier), repeat)
    container = m.body["spec"]["template"]["spec"]["containers"][0]
    script = container["command"][-1]
    load = 'if [ "$rc" = 0 ]; then pgbench '
    assert script.count(load) == 1, "render.pgbench_run's script has one pgbench line"
    wait = (f"echo {shlex.quote(START_WAIT)} {start_at}\nnow=$(date +%s)\n"
            f"if [ \"$now\" -lt {start_at} ]; then sleep $(({start_at} - now)); fi\n")
    container["command"] = [*container["command"][:-1], script.replace(load, wait + load)]
    m.body["metadata"].setdefault("annotations", {}).update(
        {"pglab/tenant": tenant.name, "pglab/tier": tenant.tier.name, "pglab/start-at": str(start_at)})
    return Manifest(m.filename, m.body)
