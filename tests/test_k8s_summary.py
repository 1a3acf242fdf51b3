"""What a Kubernetes run does after its window, kept short: the reads that need not wait for the window's end run
beside something else. Against the fake API server of tests/k8s_fake/; the figures themselves are checked by
test_k8s_disks.py and test_k8s_axes.py against their oracles."""

from __future__ import annotations

import json
from pathlib import Path

from kubernetes import client

from k8s_fake import FakeAPI, sampler_log
from k8s_support import JOBS, k8s_plan, run
from pglab.store.sqlite import Store
from test_k8s_disks import node_blocks

PLAN = k8s_plan("matrix: {clients: [1], jobs: [1]}", "run: {duration: 4s, repeats: 2}")


def test_the_volume_probes_run_beside_the_dataset_load_not_after_a_window(fake: tuple[FakeAPI, client.ApiClient],
                                                                         tmp_path: Path) -> None:
    api, api_client = fake
    api.diskstats_log = lambda node: sampler_log(node, node_blocks(node))  # vdb busy
    result = run(api_client, tmp_path, PLAN)
    assert (result.ok, result.failed) == (2, 0)
    probes = [(i, n) for i, n in api.job_posts if "-volumes-" in n]
    assert [n for _, n in probes] == ["pg-volumes-1", "pg-volumes-2"]  # one per instance node, once
    init_deleted = api.requests.index(("DELETE", f"{JOBS}/pg-pgbench-init"))
    init_posted = next(i for i, n in api.job_posts if n == "pg-pgbench-init")
    # both created while the dataset's Job ran, before either was waited for, and before the first run started
    assert all(init_posted < i < init_deleted for i, _ in probes)
    first_read = min(i for i, (m, p) in enumerate(api.requests) if m == "GET" and p.startswith(f"{JOBS}/pg-volumes-"))
    assert max(i for i, _ in probes) < first_read
    assert max(i for i, _ in probes) < min(i for i, _, _ in api.execs)
    # and what they found is what the runs' disk figures name (the probe's device numbers, not a guess)
    store = Store.open(tmp_path / "results", create=False)
    for r in store.runs(store.sweeps()[-1]["id"]):
        info = json.loads((store.dir / r.dir / "disk" / "disk.json").read_text())
        for pod in ("pg-1", "pg-2"):
            (chosen,) = info["instances"][pod]["volumes"]
            assert chosen["claim"] == pod and chosen["how"].startswith("ext4 on device"), chosen
    store.close()


def test_without_a_disk_sampler_no_volume_probe_runs_with_the_dataset(fake: tuple[FakeAPI, client.ApiClient],
                                                                      tmp_path: Path) -> None:
    api, api_client = fake
    api.forbidden = {"/apis/apps/v1/namespaces/bench/daemonsets"}  # no sampler: no disk figure to probe for
    result = run(api_client, tmp_path, PLAN)
    assert (result.ok, result.failed) == (2, 0)
    assert not [n for _, n in api.job_posts if "-volumes-" in n]
