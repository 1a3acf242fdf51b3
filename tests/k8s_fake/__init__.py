"""A fake Kubernetes API server at the HTTP boundary, shared by the orchestration and the `pglab run` tests.

It is a real HTTP server speaking the REST paths the official client uses (namespaces, RBAC, CNPG clusters, Jobs,
PVCs, ConfigMaps, pods and their logs, the pod proxy, /version); it keeps the objects, plays the operator (a Cluster
turns healthy after a few reads; a merge PATCH of its resources or parameters starts a rolling update that recreates
the instance pods one by one, primary last, over a few reads; deleting the primary pod starts a failover that names
and promotes another instance over a few reads) and the Job controller (a Job ends after a read, its
pod's log carries a results tarball), each instance's metrics exporter behind the pod proxy, and the disk sampler
DaemonSet's controller (one pod on each instance's node, instance n on node-n, whose log is ``diskstats_log``).
For the preflight (``pglab k8s check``) it also serves what a cluster has before pglab comes: nodes with labels,
taints and conditions, storage classes, the CloudNativePG CRD and operator Deployment, API discovery, and answers
SelfSubjectAccessReviews (every permission granted unless listed in ``denied``); by default a cluster the tests'
plans pass on. Nothing is mocked inside pglab or the client.

Layout: ``server`` (``FakeAPI``: the knobs and records; its routing table, method + path pattern → controller;
``serve()``), one module per controller (``store``: objects and namespaces; ``operator``: CloudNativePG's Clusters,
instance pods and exporters; ``jobs``; ``daemonsets``: the disk sampler and node-exporter; ``discovery``: the
cluster-wide reads of the preflight), ``cluster`` (the objects a cluster has before pglab) and ``texts`` (what the
fake's pods print, which tests also use to build expected figures).
"""

from __future__ import annotations

from .cluster import ACCESS_REVIEWS, CNPG_CRD, CRDS, cnpg_crd, node, operator_deployment, storage_class
from .server import FakeAPI, serve
from .texts import (
    CAUGHT_UP,
    DEVICES,
    NODE_EXPORTER_NS,
    NODE_EXPORTER_SELECTOR,
    boot_id,
    diskstats_text,
    exporter_text,
    node_exporter_text,
    results_log,
    sampler_log,
)

__all__ = ["ACCESS_REVIEWS", "CAUGHT_UP", "CNPG_CRD", "CRDS", "DEVICES", "NODE_EXPORTER_NS", "NODE_EXPORTER_SELECTOR",
           "FakeAPI", "boot_id", "cnpg_crd", "diskstats_text", "exporter_text", "node", "node_exporter_text",
           "operator_deployment", "results_log", "sampler_log", "serve", "storage_class"]
