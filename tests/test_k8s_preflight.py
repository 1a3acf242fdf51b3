"""`pglab k8s check PLAN` (and the same checks at the start of `pglab run`), against the fake API server.

The fake serves a cluster as it is before pglab comes (tests/k8s_fake/: nodes, storage classes, the CRD, the
operator's Deployment, access reviews); each test breaks one thing and reads the one line that names it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from k8s_fake import CNPG_CRD, FakeAPI, node, operator_deployment, serve, storage_class
from k8s_support import cli, kubeconfig
from pglab.plan.expand import expand
from pglab.plan.load import parse_plan
from pglab.plan.schema import Toleration
from pglab.targets.kubernetes.preflight import Node, Version, image_tag, parse_version, refusal, tolerates
from pglab.targets.kubernetes.render import pgbench_run, rbac

PLAN = """
name: pf
target:
  kubernetes:
    kubeconfig: {config}
    namespace: bench
    cluster_name: pg
    instances: 3
    resources: {{cpu: 1, memory: 1Gi}}
    storage: {{class: fast, size: 1Gi}}
    wal_storage: {{size: 1Gi}}
    synchronous: {{method: any, number: 1, data_durability: preferred}}
    database:
      node_selector: {{pglab.io/role: database}}
      tolerations: [{{key: dedicated, value: database, effect: NoSchedule}}]
    clients: {{node_selector: {{pglab.io/role: client}}}}
matrix: {{clients: [1]}}
run: {{duration: 4s}}
"""
DB_TAINT = ("dedicated", "database", "NoSchedule")
CONTROL_PLANE = node("cp", {"node-role.kubernetes.io/control-plane": ""},
                     [("node-role.kubernetes.io/control-plane", "", "NoSchedule")])


def lab_nodes() -> list[dict[str, object]]:
    """Three tainted database nodes, one client node, a control plane."""
    db = [node(f"db-{i}", {"pglab.io/role": "database"}, [DB_TAINT]) for i in (1, 2, 3)]
    return [CONTROL_PLANE, *db, node("client-1", {"pglab.io/role": "client"})]


@pytest.fixture
def fake(fake: tuple[FakeAPI, client.ApiClient]) -> tuple[FakeAPI, client.ApiClient]:
    """conftest's fake on the lab's nodes, with a storage class ``fast`` beside the default one."""
    api, _ = fake
    api.nodes = lab_nodes()
    api.storage_classes = [storage_class("fast"), storage_class("standard", default=True)]
    return fake


def write_plan(tmp_path: Path, api_client: client.ApiClient, text: str = PLAN, **replace: str) -> Path:
    text = text.format(config=kubeconfig(tmp_path, api_client))
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def check(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], plan: Path) -> tuple[int, list[str]]:
    """`pglab k8s check PLAN` in this process: its exit code and its printed lines."""
    rc = cli(monkeypatch, "k8s", "check", str(plan))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return rc, captured.out.splitlines()


def only(lines: list[str], prefix: str) -> str:
    found = [line for line in lines if line.startswith(prefix)]
    assert len(found) == 1, lines
    return found[0]


def assert_nothing_created(api: FakeAPI) -> None:
    assert api.created == [] and api.objects == {}
    assert {m for m, _ in api.requests} <= {"GET", "POST"}
    assert {p for m, p in api.requests if m == "POST"} <= {"/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"}


# ------------------------------------------------------------------ a cluster the plan fits
def test_a_fitting_cluster_passes_with_one_line_per_check(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 0, lines
    host = api_client.configuration.host
    assert lines[0] == f"ok    kubeconfig: {host} reachable (Kubernetes v1.33.1-fake)"
    assert lines[1] == ("ok    CloudNativePG: CRD clusters.postgresql.cnpg.io present, operator 1.27.1 (Deployment "
                        "cnpg-system/cnpg-controller-manager)")
    assert lines[2] == "ok    nodes: database: 3 match (db-1, db-2, db-3), one instance per kubernetes.io/hostname"
    assert lines[3] == "ok    nodes: clients: 1 match (client-1), one at least apart from the instances"
    # every node, and which of the plan's pods its placement lets go there
    assert lines[4] == ("info  nodes: 5: client-1: clients; cp: neither (no label pglab.io/role=database); "
                        "db-1: instances; db-2: instances; db-3: instances")
    assert lines[5] == "ok    storage classes: data on fast, WAL on the default standard"
    assert lines[6].startswith("ok    RBAC: ") and "permissions granted" in lines[6]
    plan = parse_plan(Path(tmp_path / "plan.yaml").read_text(), base_dir=tmp_path)
    assert plan.target.kubernetes is not None
    fio_image = plan.target.kubernetes.clients.fio_image  # read from the plan, whatever its default is
    assert lines[7] == ("info  images (not pulled here, the nodes must pull them): database "
                        "ghcr.io/cloudnative-pg/postgresql:17.5; pgbench, psql, witness "
                        "ghcr.io/cloudnative-pg/postgresql:17.5 (the database image); fio, disk sampler, volume "
                        f"probe {fio_image}")
    assert len(lines) == 8
    assert_nothing_created(api)


def reviewed(api: FakeAPI) -> set[tuple[str, str, str, str]]:
    return {(a["verb"], a.get("group", ""), a["resource"] + ("/" + a["subresource"] if a.get("subresource") else ""),
             a.get("namespace", "")) for a in api.access_reviews}


def test_every_permission_of_the_role_and_of_pglab_itself_is_reviewed(fake: tuple[FakeAPI, client.ApiClient],
                                                                       tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    path = write_plan(tmp_path, api_client)
    assert check(monkeypatch, capsys, path)[0] == 0
    plan = parse_plan(path.read_text(), base_dir=tmp_path)
    role = next(m for m in rbac(plan) if m.kind == "Role").body
    from_role = {(verb, group, resource, "bench") for rule in role["rules"] for group in rule["apiGroups"]
                 for resource in rule["resources"] for verb in rule["verbs"]}
    pglab_own = {(verb, group, resource, "bench") for verb in ("create", "delete")
                 for group, resource in (("", "serviceaccounts"), ("rbac.authorization.k8s.io", "roles"),
                                         ("rbac.authorization.k8s.io", "rolebindings"))}
    namespace = {("create", "", "namespaces", ""), ("delete", "", "namespaces", "bench")}  # it does not exist yet
    proxy = {("get", "", "pods/proxy", "bench")}
    assert reviewed(api) == from_role | pglab_own | namespace | proxy
    assert ("patch", "postgresql.cnpg.io", "clusters/status", "bench") in from_role  # subresources included
    own_ns = next(a for a in api.access_reviews if a["resource"] == "namespaces" and a["verb"] == "get")
    assert own_ns["name"] == "bench"  # a Role grants its own namespace by name


def test_an_existing_namespace_needs_no_cluster_wide_create(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.objects["/api/v1/namespaces/bench"] = {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": "bench"}, "status": {"phase": "Active"}}
    api.denied = {("create", "", "namespaces"), ("delete", "", "namespaces")}
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 0, lines
    assert not {r for r in reviewed(api) if r[2] == "namespaces" and r[0] != "get"}


# ------------------------------------------------------------------ each check's blocking case
def test_an_unreachable_api_server_fails_the_first_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with serve() as (_, api_client):
        path = write_plan(tmp_path, api_client)
        host = api_client.configuration.host
    # the fake is gone: its port refuses connections
    rc, lines = check(monkeypatch, capsys, path)
    assert rc == 2
    assert lines == [f"FAIL  kubeconfig: {host} does not answer ([Errno 111] Connection refused); check that the "
                     "cluster is up, or check target.kubernetes.kubeconfig and context"]


def test_a_missing_crd_blocks_and_nothing_after_it_is_asked(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.crds.clear()
    api.storage_classes = []  # also wrong, but the first blocking problem is the one said
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2
    assert lines[-1] == ("FAIL  CloudNativePG: CRD clusters.postgresql.cnpg.io not found, the operator is not "
                         "installed; install CloudNativePG 1.25.1 or newer (docs/kubernetes.md, 'On a real cluster')")
    assert len(lines) == 2 and lines[0].startswith("ok    kubeconfig:")
    assert api.access_reviews == [] and not any("/nodes" in p or "storageclasses" in p for _, p in api.requests)


def test_without_permission_on_crds_api_discovery_tells(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.forbidden_gets.add(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CNPG_CRD}")
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 0 and lines[1].startswith("ok    CloudNativePG: CRD clusters.postgresql.cnpg.io present, "), lines
    api.crds.clear()  # discovery then lists no postgresql.cnpg.io group
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2
    assert lines[-1].startswith("FAIL  CloudNativePG: the API server serves no postgresql.cnpg.io/v1, the operator "
                                "is not installed")


def test_an_operator_too_old_for_data_durability_preferred_blocks(fake: tuple[FakeAPI, client.ApiClient],
                                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.deployments = [operator_deployment("1.24.3")]
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2
    assert lines[-1] == ("FAIL  CloudNativePG 1.24.3 (Deployment cnpg-system/cnpg-controller-manager): "
                         "synchronous.data_durability: preferred (older operators drop dataDurability without a "
                         "word: it would silently be required) needs 1.25.0 or newer; upgrade the operator "
                         "(docs/kubernetes.md, 'On a real cluster')")
    # required is what 1.24 does anyway: only the WAL figures' warning, the sweep may go on
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client, **{"preferred": "required"}))
    assert rc == 0, lines
    assert only(lines, "warn  CloudNativePG 1.24.3").endswith("the WAL figures (1.24.x and 1.25.0 lose them after "
                                                              "an instance restart: every CPU step, a failover) "
                                                              "needs 1.25.1 or newer")
    # the synchronous stanza itself came with 1.24: older operators would replicate asynchronously
    api.deployments = [operator_deployment("v1.23.6")]
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client, **{"preferred": "required"}))
    assert rc == 2 and lines[-1].startswith("FAIL  CloudNativePG 1.23.6 (Deployment cnpg-system/cnpg-controller-"
                                            "manager): target.kubernetes.synchronous (.spec.postgresql.synchronous")
    # a release candidate sorts before its release
    api.deployments = [operator_deployment("1.25.0-rc1")]
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2 and "1.25.0 (pre-release)" in lines[-1]


@pytest.mark.parametrize(("deployments", "forbidden", "said"), [
    ([operator_deployment(image="ghcr.io/cloudnative-pg/cloudnative-pg:latest")], False,
     "the operator's version cannot be read from its image ghcr.io/cloudnative-pg/cloudnative-pg:latest (Deployment "
     "cnpg-system/cnpg-controller-manager); the plan needs 1.25.0 or newer for target.kubernetes.synchronous"),
    ([operator_deployment()], True,
     "the operator's version cannot be read (listing deployments: 403 Forbidden); the plan needs 1.25.0 or newer"),
    ([], False, "no operator Deployment found"),
])
def test_an_operator_version_that_cannot_be_read_is_a_warning(fake: tuple[FakeAPI, client.ApiClient],
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str],
                                                              deployments: list[dict[str, object]], forbidden: bool,
                                                              said: str) -> None:
    api, api_client = fake
    api.deployments = deployments
    if forbidden:
        api.forbidden_gets.add("/apis/apps/v1/deployments")
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 0, lines
    assert said in only(lines, "warn  CloudNativePG: CRD clusters.postgresql.cnpg.io present")


def test_an_operator_without_its_label_is_found_by_its_image(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    operand = operator_deployment(image="ghcr.io/cloudnative-pg/postgresql:17.5", labelled=False, namespace="apps")
    api.deployments = [operand, operator_deployment("1.26.0", image="registry.local/mirror/cloudnative-pg:1.26.0",
                                                    labelled=False, namespace="operators")]
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 0, lines
    assert lines[1].endswith("operator 1.26.0 (Deployment operators/cnpg-controller-manager)")


def test_too_few_nodes_for_a_required_anti_affinity_block(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.nodes = [n for n in lab_nodes() if n["metadata"]["name"] != "db-3"]  # type: ignore[index]
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2
    assert lines[-1] == ("FAIL  target.kubernetes.database: 3 instance(s) need 3 schedulable nodes apart by "
                         "kubernetes.io/hostname (anti_affinity: required) matching pglab.io/role=database and 1 "
                         "toleration(s); 2 match (db-1, db-2); refused: client-1 (no label pglab.io/role=database); "
                         "cp (no label pglab.io/role=database); label or untaint more nodes, or set "
                         "database.anti_affinity: preferred")
    # preferred: the instances share a node, said, not refused
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client, **{
        "tolerations: [{key: dedicated, value: database, effect: NoSchedule}]":
            "tolerations: [{key: dedicated, value: database, effect: NoSchedule}]\n      anti_affinity: preferred"}))
    assert rc == 0, lines
    assert only(lines, "warn  nodes: database:") == ("warn  nodes: database: 3 instances on 2 node(s) (db-1, db-2): "
                                                     "with anti_affinity: preferred some will share a node")


@pytest.mark.parametrize(("taint", "blocks"), [
    (("maintenance", "true", "NoSchedule"), True),
    (("maintenance", "", "NoExecute"), True),
    (("dedicated", "other", "NoSchedule"), True),  # same key, another value: Equal does not tolerate it
    (("maintenance", "true", "PreferNoSchedule"), False),  # a preference, not a filter
])
def test_an_untolerated_taint_makes_a_node_not_match(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str], taint: tuple[str, str, str],
                                                     blocks: bool) -> None:
    api, api_client = fake
    api.nodes = [*lab_nodes()[:3], node("db-3", {"pglab.io/role": "database"}, [DB_TAINT, taint]),
                 lab_nodes()[-1]]
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    if not blocks:
        assert rc == 0, lines
        return
    assert rc == 2
    key, value, effect = taint
    assert lines[-1].startswith("FAIL  target.kubernetes.database: 3 instance(s) need 3 schedulable nodes")
    assert f"refused: db-3 (taint {key}{'=' + value if value else ''}:{effect} not tolerated); " in lines[-1]


def test_cordoned_and_not_ready_nodes_do_not_match(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.nodes = [*lab_nodes()[:2], node("db-2", {"pglab.io/role": "database"}, [DB_TAINT], unschedulable=True),
                 node("db-3", {"pglab.io/role": "database"}, [DB_TAINT], ready=False), lab_nodes()[-1]]
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2
    assert "1 match (db-1); refused: db-2 (cordoned); db-3 (not Ready); " in lines[-1]


def test_clients_need_a_node(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.nodes = lab_nodes()[:-1]
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2
    assert lines[-1].startswith("FAIL  target.kubernetes.clients: no schedulable node matches pglab.io/role=client; "
                                "refused: ")
    assert lines[-1].endswith("label or untaint a node for pgbench, or change clients.node_selector")


def test_clients_required_apart_need_a_node_the_instances_leave_free(fake: tuple[FakeAPI, client.ApiClient],
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """pgbench on database nodes (same selector, tolerating their taint): 3 instances one per node leave none of 3
    free, always one of 4; of 2 database nodes pgbench may use, they may take both (warned)."""
    api, api_client = fake
    shared = {"clients: {node_selector: {pglab.io/role: client}}":
              "clients: {node_selector: {pglab.io/role: database}, tolerations: [{key: dedicated, operator: "
              "Exists}]}"}
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client, **shared))
    assert rc == 2
    assert lines[-1] == ("FAIL  target.kubernetes.clients: anti_affinity: required keeps pgbench off every "
                         "kubernetes.io/hostname holding an instance, and each node it may use (db-1, db-2, db-3) is "
                         "needed for the 3 instance(s); give the clients a node of their own (clients.node_selector) "
                         "or set clients.anti_affinity: preferred")
    api.nodes = [*lab_nodes(), node("db-4", {"pglab.io/role": "database"}, [DB_TAINT])]
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client, **shared))
    assert rc == 0, lines
    assert only(lines, "ok    nodes: clients:") == ("ok    nodes: clients: 4 match (db-1, db-2, db-3, db-4), one at "
                                                      "least apart from the instances")
    for n in api.nodes:  # db-3 and db-4 also take pgbench
        if n["metadata"]["name"] in ("db-3", "db-4"):
            n["metadata"]["labels"]["pglab.io/client"] = "yes"
    some = {"clients: {node_selector: {pglab.io/role: client}}":
            "clients: {node_selector: {pglab.io/client: 'yes'}, tolerations: [{key: dedicated, operator: Exists}]}"}
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client, **some))
    assert rc == 0, lines
    assert only(lines, "warn  nodes: clients:") == ("warn  nodes: clients: 2 match (db-3, db-4) but the instances "
                                                    "may land there too (they are database nodes as well): pgbench "
                                                    "then finds no node; give the clients a node of their own "
                                                    "(clients.node_selector)")


def test_the_clients_topology_key_is_the_one_rendered(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Apart by zone: the client node's zone holds a database node the instances need."""
    api, api_client = fake
    zone = "topology.kubernetes.io/zone"
    api.nodes = [node(f"db-{i}", {"pglab.io/role": "database", zone: z}, [DB_TAINT])
                 for i, z in ((1, "a"), (2, "b"), (3, "c"))]
    api.nodes.append(node("client-1", {"pglab.io/role": "client", zone: "a"}))
    by_zone = {"clients: {node_selector: {pglab.io/role: client}}":
               f"clients: {{node_selector: {{pglab.io/role: client}}, topology_key: {zone}}}"}
    path = write_plan(tmp_path, api_client, **by_zone)
    plan = parse_plan(path.read_text(), base_dir=tmp_path)
    term = pgbench_run(plan, expand(plan)[0]).body["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert term["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == zone  # what the check reads
    rc, lines = check(monkeypatch, capsys, path)
    assert rc == 2 and lines[-1].startswith(f"FAIL  target.kubernetes.clients: anti_affinity: required keeps "
                                            f"pgbench off every {zone} holding an instance")
    api.nodes.append(node("db-4", {"pglab.io/role": "database", zone: "b"}, [DB_TAINT]))  # zone a can stay free
    rc, lines = check(monkeypatch, capsys, path)
    assert rc == 0 and only(lines, "warn  nodes: clients:")


def test_a_missing_storage_class_blocks(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.storage_classes = [storage_class("lab-local", default=True)]
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2
    assert lines[-1] == ("FAIL  storage class 'fast' (target.kubernetes.storage.class): not found; existing: "
                         "lab-local (default)")
    api.storage_classes = [storage_class("fast")]  # the WAL volume names none: the default class is needed
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2
    assert lines[-1] == ("FAIL  target.kubernetes.wal_storage.class: not given and the cluster has no default "
                         "storage class (existing: fast); name one")
    api.storage_classes = [storage_class("fast"), storage_class("old", default=False)]
    api.storage_classes[1]["metadata"]["annotations"] = {
        "storageclass.beta.kubernetes.io/is-default-class": "true"}
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 0 and "WAL on the default old" in only(lines, "ok    storage classes:")


def test_a_denied_verb_blocks_and_names_the_resource(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.denied = {("create", "batch", "jobs"), ("delete", "batch", "jobs"), ("patch", "postgresql.cnpg.io",
                                                                             "clusters/status"),
                  ("get", "", "pods/proxy")}
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2
    fails = [line for line in lines if line.startswith("FAIL")]
    assert fails == [
        "FAIL  RBAC: the kubeconfig's identity cannot patch postgresql.cnpg.io/clusters/status in namespace bench "
        "(the Role pglab creates); grant it (docs/kubernetes.md, 'RBAC pglab needs')",
        "FAIL  RBAC: the kubeconfig's identity cannot create, delete batch/jobs in namespace bench (the Role pglab "
        "creates); grant it (docs/kubernetes.md, 'RBAC pglab needs')"]
    assert lines[-1] == ("warn  RBAC: the kubeconfig's identity cannot get pods/proxy in namespace bench: without it "
                         "no PostgreSQL figures and no wait for the standbys to catch up")
    assert not any(line.startswith("info  images") for line in lines)  # stopped at the blocking check
    api.denied = {("create", "", "namespaces")}  # the namespace does not exist: pglab must create it
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 2
    assert lines[-1] == ("FAIL  RBAC: the kubeconfig's identity cannot create namespaces at cluster scope (namespace "
                         "bench does not exist yet); grant it (docs/kubernetes.md, 'RBAC pglab needs')")


def test_missing_pods_proxy_alone_is_a_warning(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.denied = {("get", "", "pods/proxy")}
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 0, lines
    assert only(lines, "warn  RBAC:").startswith("warn  RBAC: the kubeconfig's identity cannot get pods/proxy")
    assert only(lines, "ok    RBAC:").startswith("ok    RBAC: 40 of 41 permissions granted")


def test_what_cannot_be_listed_is_a_warning_not_a_failure(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.forbidden_gets |= {"/api/v1/nodes", "/apis/storage.k8s.io/v1/storageclasses"}
    api.forbidden.add("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client))
    assert rc == 0, lines
    assert only(lines, "warn  nodes:") == "warn  nodes: cannot be listed (403 Forbidden): the placement is not checked"
    assert only(lines, "warn  storage classes:").startswith("warn  storage classes: cannot be listed (403")
    assert only(lines, "warn  RBAC:").startswith("warn  RBAC: the permissions cannot be reviewed")


def test_the_images_line_names_the_clients_image_when_given(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    _, api_client = fake
    rc, lines = check(monkeypatch, capsys, write_plan(tmp_path, api_client, **{
        "clients: {node_selector: {pglab.io/role: client}}":
            "clients: {node_selector: {pglab.io/role: client}, image: example.org/pgbench:17, "
            "fio_image: example.org/fio:3}"}))
    assert rc == 0, lines
    assert lines[-1] == ("info  images (not pulled here, the nodes must pull them): database "
                         "ghcr.io/cloudnative-pg/postgresql:17.5; pgbench, psql, witness example.org/pgbench:17; fio, "
                         "disk sampler, volume probe example.org/fio:3")


# ------------------------------------------------------------------ pglab run
def test_run_checks_first_and_stops_before_a_folder_or_an_object(fake: tuple[FakeAPI, client.ApiClient],
                                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    api.storage_classes = [storage_class("lab-local", default=True)]
    rc = cli(monkeypatch, "run", str(write_plan(tmp_path, api_client)), "--results", str(tmp_path / "r"))
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.err.splitlines()[-1] == ("FAIL  storage class 'fast' (target.kubernetes.storage.class): not "
                                             "found; existing: lab-local (default)")
    assert "Traceback" not in captured.err and captured.out == ""
    assert not (tmp_path / "r").exists()
    assert_nothing_created(api)


def test_run_on_a_fitting_cluster_prints_the_checks_then_sweeps(fake: tuple[FakeAPI, client.ApiClient],
                                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    api, api_client = fake
    path = write_plan(tmp_path, api_client, **{"instances: 3": "instances: 2"})
    assert cli(monkeypatch, "run", str(path), "--results", str(tmp_path / "r"), "--format", "csv") == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert err[0].startswith("ok    kubeconfig: ") and any(line.startswith("info  images") for line in err)
    assert captured.out.startswith("workload,") and "ok    " not in captured.out  # the table alone on stdout
    assert (tmp_path / "r" / "results.db").is_file()
    assert api.created and api.objects == {}  # swept, then cleaned up


# ------------------------------------------------------------------ the rules themselves
@pytest.mark.parametrize(("toleration", "taint", "tolerated"), [
    ({"key": "dedicated", "value": "db", "effect": "NoSchedule"}, ("dedicated", "db", "NoSchedule"), True),
    ({"key": "dedicated", "value": "db"}, ("dedicated", "db", "NoExecute"), True),  # no effect: every effect
    ({"key": "dedicated", "value": "db", "effect": "NoExecute"}, ("dedicated", "db", "NoSchedule"), False),
    ({"key": "dedicated", "operator": "Exists"}, ("dedicated", "anything", "NoSchedule"), True),
    ({"operator": "Exists"}, ("whatever", "", "NoExecute"), True),  # no key with Exists: every taint
    ({"key": "dedicated", "value": "db"}, ("dedicated", "", "NoSchedule"), False),
    ({"key": "gpu"}, ("gpu", "", "NoSchedule"), True),  # Equal with no value matches an empty value
])
def test_tolerations_follow_the_kubernetes_rule(toleration: dict[str, str], taint: tuple[str, str, str],
                                                tolerated: bool) -> None:
    assert tolerates([Toleration.model_validate(toleration)], *taint) is tolerated


def test_a_node_is_refused_for_its_first_reason() -> None:
    plan = parse_plan(PLAN.format(config="/dev/null"))
    assert plan.target.kubernetes is not None
    db = plan.target.kubernetes.database
    assert refusal(Node("n", {"pglab.io/role": "database"}, (DB_TAINT,)), db) is None
    assert refusal(Node("n", {"pglab.io/role": "client"}), db) == "no label pglab.io/role=database"
    assert refusal(Node("n", {"pglab.io/role": "database"}, (("x", "", "NoSchedule"),)), db) == \
        "taint x:NoSchedule not tolerated"


@pytest.mark.parametrize(("image", "version"), [
    ("ghcr.io/cloudnative-pg/cloudnative-pg:1.27.0", Version(1, 27, 0)),
    ("ghcr.io/cloudnative-pg/cloudnative-pg:1.28.2@sha256:" + "0" * 64, Version(1, 28, 2)),
    ("registry:5000/cloudnative-pg:v1.25.1", Version(1, 25, 1)),
    ("pglab.local/cloudnative-pg:1.26.0-rc2", Version(1, 26, 0, final=False)),
    ("ghcr.io/cloudnative-pg/cloudnative-pg@sha256:" + "0" * 64, None),  # by digest alone
    ("registry:5000/cloudnative-pg", None),
    ("ghcr.io/cloudnative-pg/cloudnative-pg:latest", None),
])
def test_the_operator_version_comes_from_its_image_tag(image: str, version: Version | None) -> None:
    assert parse_version(image_tag(image)) == version
    assert Version(1, 25, 0, final=False) < Version(1, 25, 0) < Version(1, 25, 1)
