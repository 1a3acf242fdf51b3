"""The plan's grammar, validated strictly (unknown fields fail), one module per domain: ``base`` (limits, field types,
the strict model), the targets (``local``, ``external``, ``kubernetes``), ``run`` (parameters, dataset, workloads,
runs, probes, the storage phase), ``scenario``, ``tenants``, ``capacity`` (the capacity search, the cost),
``matrix`` (the axes) and ``plan`` (the whole plan and what its sections allow together). Import from here."""

from pglab.plan.schema.base import Strict, Synchronous, show
from pglab.plan.schema.capacity import Capacity, Cost
from pglab.plan.schema.external import ExternalTarget
from pglab.plan.schema.kubernetes import (
    K8sResources,
    K8sStorage,
    KubernetesTarget,
    NodeFault,
    Placement,
    PrometheusSource,
    Toleration,
)
from pglab.plan.schema.local import LabPaths, LocalTarget, Resources
from pglab.plan.schema.matrix import Matrix, StorageOption
from pglab.plan.schema.plan import Plan, Target
from pglab.plan.schema.run import BUILTIN_WORKLOADS, CustomWorkload, Dataset, Run, Storage, Workload
from pglab.plan.schema.scenario import Scenario
from pglab.plan.schema.tenants import Arrangement, Tenants, Tier

__all__ = ["BUILTIN_WORKLOADS", "Arrangement", "Capacity", "Cost", "CustomWorkload", "Dataset",
           "ExternalTarget", "K8sResources", "K8sStorage", "KubernetesTarget", "LabPaths", "LocalTarget", "Matrix",
           "NodeFault", "Placement", "Plan", "PrometheusSource", "Resources", "Run", "Scenario", "Storage",
           "StorageOption", "Strict", "Synchronous", "Target", "Tenants", "Tier", "Toleration", "Workload", "show"]
