"""Tenants on Kubernetes: one CloudNativePG Cluster per tenant, each tier its resources, storage class and namespace.

A tenant is rendered as a plan of its own (``tenant_plan``): the plan's Kubernetes target with the tenant's Cluster
name, namespace, instances, resources and volumes, so that every manifest of a one-Cluster plan (the Cluster, the
dataset Job, a run's Job) is made by the functions that make them for any plan. What is the tenants' own: the names,
and a run Job that waits for a shared start time, so every tenant's pgbench starts in the same second, and reads its
primary's WAL, checkpoint and backend-write counters around its window (``pgstats``); and each tenant's primary's
CPU, memory and disk figures over its window, asked of the cluster's Prometheus (``primary_figures``).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from pglab.plan.expand import Point
from pglab.plan.schema import Arrangement, K8sResources, Plan, Tier
from pglab.targets.kubernetes import disks, prometheus
from pglab.targets.kubernetes.render import Manifest, cpu_quantity, pgbench_run, target_of
from pglab.targets.kubernetes.scripts import START_WAIT as START_WAIT

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


def tenant_run(tenant: K8sTenant, point: Point, repeat: int, start_at: int) -> Manifest:
    """The tenant's run Job (``render.pgbench_run``), its pgbench held after the dataset reset until ``start_at``
    (epoch s) so that every tenant's pgbench starts in the same second (a pod that is later begins at once), its
    primary's WAL, checkpoint and backend-write counters read at its window's edges (``pgstats``)."""
    m = pgbench_run(tenant.plan, tenant_point(point, tenant.tier), repeat, start_at=start_at, with_pgstats=True)
    m.body["metadata"].setdefault("annotations", {}).update(
        {"pglab/tenant": tenant.name, "pglab/tier": tenant.tier.name, "pglab/start-at": str(start_at)})
    return Manifest(m.filename, m.body)


# ------------------------------------------------------------------ each tenant's primary: CPU, memory, disk
MEMORY_METRIC = "container_memory_working_set_bytes"  # cAdvisor's: what the kubelet evicts and the OOM killer counts
DISK_FIGURES = ("read_iops", "write_iops", "total_iops", "read_mb_s", "write_mb_s")


@dataclass
class PrimaryFigures:
    """One tenant's primary over its window: the figures (``cpu_cores`` …), what they were read from (``info``, for
    tenants.json), the raw series kept (name → series) and the series of the run's charts (their source left
    empty: the caller names the tenant)."""

    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, prometheus.Series] = field(default_factory=dict)
    series: list[tuple[float, str, str, float | None]] = field(default_factory=list)


def cpu_cores(quantity: str) -> float:
    """Cores of a (validated) Kubernetes CPU quantity: 2, 1.5 or 500m."""
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def primary_figures(client: prometheus.Client, namespace: str, primary: str, node: str, container: str,
                    window: tuple[float, float], volumes: dict[str, list[disks.Volume] | str],
                    cpu_limit: float) -> PrimaryFigures:
    """The primary's container CPU and memory (cAdvisor's) and its volumes' devices' I/O on its node (node-exporter's)
    over ``window``, each figure as docs/kubernetes.md's tenants' "Each tenant's CPU, memory and disk" defines it
    (``info['disk']`` names the devices). A part Prometheus has no samples for is left out (``info`` says why);
    PrometheusError propagates."""
    cfg = client.cfg
    w = prometheus.Window(window[0], window[1], cfg.interval)
    seconds = window[1] - window[0]
    out = PrimaryFigures(info={"source": "prometheus", "primary": primary, "node": node, "window": list(window)})
    cpu, out.raw["cpu"] = prometheus.container_cpu(client, namespace, {"server": (re.escape(primary), container)},
                                                   primary, w)
    if (cores := cpu.metrics.get("primary_cpu_cores")) is not None:
        out.metrics.update(cpu_cores=cores, cpu_s=cores * seconds, cpu_limit_pct=cores / cpu_limit * 100)
        if (throttled := cpu.metrics.get("cpu_throttled_pct")) is not None:
            out.metrics["cpu_throttled_pct"] = throttled
        out.series += [(t, "", "cpu_cores", v) for t, _, _, v in cpu.series]
    out.info["cpu"] = cpu.info.get("groups", {}).get("server", {}).get("per_pod", {}).get(primary) or \
        cpu.info.get("note")

    on = client.matchers(**{cfg.namespace_label: namespace, cfg.pod_label: primary, cfg.container_label: container})
    memory = client.samples(f"{MEMORY_METRIC}{on}", f"timestamp({MEMORY_METRIC}{on})", None, *w.span, w.step)
    out.raw["memory"] = memory
    inside = [(t, v) for points in memory.values() for t, v in points if w.start <= t <= w.end]
    if inside:
        out.metrics["memory_mb"] = statistics.fmean(v for _, v in inside) / MIB
        out.series += [(t, "", "memory_mb", v / MIB) for t, v in sorted(inside)]
        out.info["memory"] = {"samples": len(inside), "max_mb": max(v for _, v in inside) / MIB}
    else:
        out.info["memory"] = f"no sample of {MEMORY_METRIC} of pod/{primary} inside the window"

    blocks, out.raw["disk"] = prometheus.node_blocks(client, [node], w)
    disk = disks.summarize(blocks, {primary: node}, primary, window, volumes,
                           " (node-exporter's diskstats filter leaves partitions, loop and ram devices out)")
    if disk.problems or not disk.metrics:
        out.info["disk"] = disk.info.get("note") or "no disk figures"
    else:
        out.metrics.update({k: disk.metrics[k] for k in DISK_FIGURES if k in disk.metrics})
        instances: dict[str, Any] = disk.info["instances"]  # type: ignore[assignment]
        out.info["disk"] = instances[primary]
    return out


def mark_shared(figures: dict[str, PrimaryFigures]) -> None:
    """Tenants whose volumes are on the same device of the same node: each one's ``info['disk']['shared_with']``
    names the others (their disk figures are that device's, not theirs alone)."""
    devices: dict[tuple[str, str], list[str]] = {}  # (node, device) → the tenants with a volume on it
    for name, f in figures.items():
        disk = f.info.get("disk")
        for v in disk.get("volumes", []) if isinstance(disk, dict) else []:
            if v.get("device"):
                devices.setdefault((str(f.info["node"]), str(v["device"])), []).append(name)
    for names in devices.values():
        for name in names:
            disk = figures[name].info["disk"]
            disk["shared_with"] = sorted({*disk.get("shared_with", []), *(set(names) - {name})})
            if not disk["shared_with"]:
                del disk["shared_with"]
