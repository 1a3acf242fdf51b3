"""Tenants on Kubernetes without a cluster: a tier's storage classes (data and WAL volumes) in each tenant's Cluster,
checked by `pglab k8s check` against the fake API server's classes and refused where they mean nothing; each
tenant's CPU, memory and disk figures from the cluster's Prometheus over the tenant's window.

The real thing runs in tests/test_kube_lab_clusters.py, on the lab (a tier on its throttled class)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from conftest import pglab
from k8s_fake import FakeAPI, storage_class
from k8s_support import cli, kubeconfig
from pglab.plan.load import parse_plan
from pglab.targets.kubernetes.render import cluster

TIERS = """
name: mt
target:
  kubernetes:
    namespace: bench
    cluster_name: mt
    resources: {cpu: 1, memory: 1Gi}
    storage: {class: standard, size: 10Gi}
tenants:
  arrangements:
    - name: io-tiers
      tiers:
        - {name: fast, tenants: 1, storage: {class: premium, size: 20Gi}, wal_storage: {class: premium, size: 4Gi}}
        - {name: slow, tenants: 1, storage: {class: throttled, size: 20Gi}}
        - {name: plain, tenants: 1}
run: {duration: 10s}
"""


def plan_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def test_a_tiers_storage_classes_are_its_tenants_clusters_volumes() -> None:
    from pglab.targets.kubernetes.tenants import tenants_of

    plan = parse_plan(TIERS)
    assert plan.tenants is not None
    specs = {t.tier.name: cluster(t.plan)["spec"] for t in tenants_of(plan, plan.tenants.arrangements[0])}
    assert specs["fast"]["storage"] == {"size": "20Gi", "storageClass": "premium"}
    assert specs["fast"]["walStorage"] == {"size": "4Gi", "storageClass": "premium"}
    assert specs["slow"]["storage"] == {"size": "20Gi", "storageClass": "throttled"}
    assert "walStorage" not in specs["slow"] and "walStorage" not in specs["plain"]  # WAL on the data volume
    assert specs["plain"]["storage"] == {"size": "10Gi", "storageClass": "standard"}  # the target's

    # a target with WAL volumes: a tier without wal_storage keeps the target's, a tier's own replaces it
    with_wal = parse_plan(TIERS.replace("    storage: {class: standard, size: 10Gi}\n",
                                        "    storage: {class: standard, size: 10Gi}\n"
                                        "    wal_storage: {class: standard, size: 2Gi}\n"))
    assert with_wal.tenants is not None
    specs = {t.tier.name: cluster(t.plan)["spec"] for t in tenants_of(with_wal, with_wal.tenants.arrangements[0])}
    assert specs["slow"]["walStorage"] == {"size": "2Gi", "storageClass": "standard"}
    assert specs["fast"]["walStorage"] == {"size": "4Gi", "storageClass": "premium"}


@pytest.mark.parametrize(("text", "message"), [
    ("name: l\ntarget: {local: {}}\ntenants:\n  arrangements:\n    - name: a\n      tiers:\n"
     "        - {name: gold, wal_storage: {class: fast, size: 1Gi}}\n",
     "tenants.arrangements[0].tiers[0].wal_storage: is for a Kubernetes target; on a local lab remove it"),
    ("name: l\ntarget: {local: {}}\ntenants:\n  arrangements:\n    - name: a\n      tiers:\n"
     "        - {name: gold, storage: {class: fast}}\n",
     "tenants.arrangements[0].tiers[0].storage: is for a Kubernetes target; on a local lab remove it"),
    (TIERS + "postgres: {parameters: {max_wal_size: 4GB}}\n",
     "postgres.parameters.max_wal_size: max_wal_size 4GB is not below the WAL volume "
     "(tenants.arrangements.0.tiers.0.wal_storage.size: 4Gi), which CloudNativePG refuses; lower it or make the "
     "volume larger"),
])
def test_a_tiers_volumes_where_they_mean_nothing_are_refused_in_one_sentence(tmp_path: Path, text: str,
                                                                              message: str) -> None:
    proc = pglab("plan", "validate", str(plan_file(tmp_path, text)))
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.strip() == message, proc.stderr


def test_k8s_check_finds_each_tiers_classes(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    text = TIERS.replace("    namespace: bench\n",
                         f"    namespace: bench\n    kubeconfig: {kubeconfig(tmp_path, api_client)}\n")
    path = plan_file(tmp_path, text)
    api.storage_classes = [storage_class("standard", default=True), storage_class("premium")]
    rc = cli(monkeypatch, "k8s", "check", str(path))
    out = capsys.readouterr().out.splitlines()
    assert rc == 2
    assert out[-1] == ("FAIL  storage class 'throttled' (tenants.arrangements[0].tiers[1].storage.class): not found; "
                       "existing: premium, standard (default)"), out
    api.storage_classes.append(storage_class("throttled"))
    rc = cli(monkeypatch, "k8s", "check", str(path))
    out = capsys.readouterr().out.splitlines()
    assert rc == 0, out
    (line,) = [x for x in out if x.startswith("ok    storage classes:")]
    assert line == ("ok    storage classes: data on standard, tier fast on premium, tier fast WAL on premium, "
                    "tier slow on throttled"), line
    # the WAL class of a tier is checked as its data class is
    path.write_text(text.replace("wal_storage: {class: premium", "wal_storage: {class: ultra"))
    rc = cli(monkeypatch, "k8s", "check", str(path))
    out = capsys.readouterr().out.splitlines()
    assert rc == 2 and out[-1].startswith("FAIL  storage class 'ultra' (tenants.arrangements[0].tiers[0]"
                                          ".wal_storage.class): not found"), out
