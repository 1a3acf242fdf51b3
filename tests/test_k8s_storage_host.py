"""storage.host_path on Kubernetes: the storage phase's fio jobs also run in a pod on a hostPath directory of each
instance's node, right after that node's PVC run, stored as rows of their own and compared in the storage table.

Against the fake API server of tests/k8s_fake/: its fio pods print what fio 3.33 printed (tests/data/k8s), the
host-path pod with each job's IOPS doubled, so the in-pod / host ratio the table shows is known: 0.5.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kubernetes import client

from k8s_fake import FakeAPI, results_log
from k8s_support import FIO, job_posts, k8s_plan, pod_log, posted_jobs, run
from pglab.plan.load import parse_plan
from pglab.report.tables import full_report, storage_table
from pglab.store.sqlite import Store
from pglab.targets.kubernetes.preflight import check_storage_classes

HOST = "/mnt/disks/{node}/fast"
PLAN = k8s_plan(f"storage: {{profiles: [randread-8k], runtime: 2s, size: 64MiB, paths: [data], host_path: '{HOST}'}}",
                "matrix: {clients: [1], jobs: [1]}", "run: {duration: 4s, repeats: 1}")


def host_log(job: str) -> str:
    """The host-path pod's output: fio's real JSON with every job's IOPS doubled; any other Job's as usual."""
    if not re.search(r"-fio-data-\d+-host$", job):
        return pod_log(job)
    files = {f.name: f.read_text() for f in FIO.iterdir()}
    for name in [n for n in files if n.endswith(".json")]:
        data = json.loads(files[name])
        data["jobs"][0]["read"]["iops"] *= 2
        files[name] = json.dumps(data)
    return results_log({**files, "fio-version.txt": "fio-3.33\n"}, text="")


@pytest.fixture
def fake(k8s_api: tuple[FakeAPI, client.ApiClient]) -> tuple[FakeAPI, client.ApiClient]:
    api, _ = k8s_api
    api.default_log = host_log
    return k8s_api


def test_host_path_runs_beside_each_pvc_run_and_the_table_compares_them(fake: tuple[FakeAPI, client.ApiClient],
                                                                        tmp_path: Path) -> None:
    api, api_client = fake
    result = run(api_client, tmp_path, PLAN)
    assert (result.ok, result.failed) == (1, 0)
    # per node, the primary's first: the PVC's Job, then the host path's, never at once
    assert posted_jobs(api)[:4] == ["pg-fio-data-1", "pg-fio-data-1-host", "pg-fio-data-2", "pg-fio-data-2-host"]
    for index, node in ((1, "node-1"), (2, "node-2")):
        [job] = [b for b in api.posted if b["kind"] == "Job" and b["metadata"]["name"] == f"pg-fio-data-{index}-host"]
        [pvc_job] = [b for b in api.posted if b["kind"] == "Job" and b["metadata"]["name"] == f"pg-fio-data-{index}"]
        pod, pvc_pod = job["spec"]["template"]["spec"], pvc_job["spec"]["template"]["spec"]
        # the same image, command and node as the PVC's pod; the claim replaced by the node's directory
        assert pod["containers"] == pvc_pod["containers"] and pod["affinity"] == pvc_pod["affinity"]
        assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        [volume] = [v for v in pod["volumes"] if v["name"] == "volume"]
        assert volume == {"name": "volume",
                          "hostPath": {"path": f"/mnt/disks/{node}/fast", "type": "DirectoryOrCreate"}}
        # the PVC was gone before the host-path Job began (the node's space back, nothing measured at once)
        deleted = api.requests.index(("DELETE", f"/api/v1/namespaces/bench/persistentvolumeclaims/pg-fio-data-{index}"))
        assert deleted < job_posts(api)[posted_jobs(api).index(f"pg-fio-data-{index}-host")]

    store = Store.open(tmp_path / "results", create=False)
    sweep = store.sweeps()[-1]["id"]
    real = {q: json.loads((FIO / f"randread-8k-{q}.json").read_text())["jobs"][0]["read"]["iops"]
            for q in ("qd1", "qd32")}
    rows = store.fio_results(sweep)
    assert [(r["label"], r["job"], r["iops"]) for r in rows] == [
        (label, f"randread-8k-{q}", real[q] * k) for node in ("node-1", "node-2")
        for label, k in ((f"data@{node}", 1), (f"host:/mnt/disks/{node}/fast@{node}", 2)) for q in ("qd1", "qd32")]
    assert rows[2]["path"] == "host:/mnt/disks/node-1/fast on node node-1 beside data@node-1"
    assert (store.dir / "storage/data/node-2/host/randread-8k-qd32.json").is_file()

    columns, table = storage_table(store, sweep)
    assert columns[-3:] == ["place", "host_iops", "pod_host"]
    assert [(r["path"], r["place"]) for r in table] == [
        (p, place) for node in ("node-1", "node-2")
        for p, place in ((f"data@{node}", "pvc:default"), (f"host@{node}", f"host:/mnt/disks/{node}/fast"))
        for _ in range(2)]
    assert [r["host_iops"] for r in table if r["place"] == "pvc:default"] == [real["qd1"] * 2, real["qd32"] * 2] * 2
    assert [r["pod_host"] for r in table if r["place"] == "pvc:default"] == [pytest.approx(0.5)] * 4
    assert all(r["host_iops"] is None for r in table if r["place"].startswith("host:"))
    text = full_report(store, "markdown", sweep, table="storage")
    assert "pod/host" in text and "host IOPS" in text and "0.50" in text
    store.close()


def test_host_path_grammar_and_its_refusals(tmp_path: Path) -> None:
    plan = parse_plan(k8s_plan("storage: {paths: [data], host_path: {lab-local: '/d/{node}/disk/'}}"))
    assert plan.storage is not None and plan.storage.host_path == {"lab-local": "/d/{node}/disk"}
    from pglab.drivers.fio import host_directory

    assert host_directory(plan.storage.host_path, "lab-local", "n1") == "/d/n1/disk"
    assert host_directory(plan.storage.host_path, None, "n1") is None  # no directory for the default class
    assert host_directory("/x/{node}", None, "n1") == "/x/n1"
    from pglab.errors import UserError

    local = ("name: t\ntarget: {local: {}}\nstorage: {host_path: /mnt}\n")
    with pytest.raises(UserError, match=r"storage\.host_path: .*Kubernetes target only"):
        parse_plan(local)
    for bad in ("relative/dir", "/a/../b", "/a/{nod}"):
        with pytest.raises(UserError, match=r"storage\.host_path: must be an absolute directory"):
            parse_plan(k8s_plan(f"storage: {{host_path: '{bad}'}}"))


def test_check_refuses_host_path_in_a_restricted_namespace(fake: tuple[FakeAPI, client.ApiClient],
                                                          tmp_path: Path) -> None:
    api, api_client = fake
    plan = parse_plan(PLAN)
    assert [f.level for f in check_storage_classes(plan, api_client)] == ["ok"]  # no namespace yet: pglab makes it
    for level, blocked in (("privileged", False), ("baseline", True), ("restricted", True)):
        api.objects["/api/v1/namespaces/bench"] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": "bench", "labels": {"pod-security.kubernetes.io/enforce": level}}}
        found = check_storage_classes(plan, api_client)
        assert [f.level for f in found] == ["ok", "FAIL"] if blocked else ["ok"]
    assert found[-1].text.startswith("storage.host_path: namespace bench enforces the restricted Pod Security "
                                     "Standard (label pod-security.kubernetes.io/enforce), which refuses the hostPath")


def test_render_refuses_host_path_in_one_sentence(tmp_path: Path) -> None:
    from pglab.errors import UserError
    from pglab.targets.kubernetes import folder
    from pglab.targets.kubernetes.render import render

    plan = parse_plan(PLAN)
    with pytest.raises(UserError, match=r"^storage\.host_path: its fio pod runs on each instance's node") as exc:
        folder.write(plan, render(plan, tmp_path), tmp_path / "out")
    assert "\n" not in str(exc.value) and not (tmp_path / "out").exists()
