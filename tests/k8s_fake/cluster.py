"""The cluster as it is before pglab comes (what the preflight reads): nodes, storage classes, the CloudNativePG CRD
and operator Deployment."""

from __future__ import annotations

from typing import Any

ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CNPG_CRD = "clusters.postgresql.cnpg.io"


def node(name: str, labels: dict[str, str] | None = None, taints: list[tuple[str, str, str]] | None = None, *,
         unschedulable: bool = False, ready: bool = True) -> dict[str, Any]:
    """A Node as the API serves it: the kubelet's hostname label, the given labels, taints (key, value, effect),
    a cordon, the Ready condition."""
    spec: dict[str, Any] = {"podCIDR": "10.244.0.0/24"}
    if taints:
        spec["taints"] = [{"key": k, **({"value": v} if v else {}), "effect": e} for k, v, e in taints]
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  **(labels or {})}},
            "spec": spec,
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": "True" if ready else "False"}]}}


def storage_class(name: str, default: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if default:
        meta["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": meta,
            "provisioner": "rancher.io/local-path", "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer"}


def cnpg_crd(versions: tuple[str, ...] = ("v1",)) -> dict[str, Any]:
    """CloudNativePG's Cluster CRD, its schema left out."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": CNPG_CRD},
            "spec": {"group": "postgresql.cnpg.io", "scope": "Namespaced",
                     "names": {"kind": "Cluster", "listKind": "ClusterList", "plural": "clusters",
                               "singular": "cluster"},
                     "versions": [{"name": v, "served": True, "storage": True} for v in versions]}}


def operator_deployment(version: str = "1.27.1", *, image: str | None = None, labelled: bool = True,
                        namespace: str = "cnpg-system") -> dict[str, Any]:
    """The operator's Deployment as the release manifest installs it (its label, its manager container)."""
    meta: dict[str, Any] = {"name": "cnpg-controller-manager", "namespace": namespace}
    if labelled:
        meta["labels"] = {"app.kubernetes.io/name": "cloudnative-pg"}
    container = {"name": "manager", "image": image or f"ghcr.io/cloudnative-pg/cloudnative-pg:{version}",
                 "command": ["/manager"]}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 1, "template": {"spec": {"containers": [container]}}}}


