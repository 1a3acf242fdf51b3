"""What a Kubernetes run does after its window, kept short: the reads that need not wait for the window's end run
beside something else. Against the fake API server of tests/k8s_fake/; the figures themselves are checked by
test_k8s_disks.py and test_k8s_axes.py against their oracles."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client

from k8s_fake import FakeAPI, sampler_log
from k8s_support import JOBS, k8s_plan, node_blocks, run
from pglab.store.sqlite import Store
from pglab.targets.kubernetes import exporter
from pglab.targets.kubernetes.orchestrate import Orchestrator

PLAN = k8s_plan("matrix: {clients: [1], jobs: [1]}", "run: {duration: 4s, repeats: 2}")


def test_the_volume_probes_run_beside_the_dataset_load_not_after_a_window(fake: tuple[FakeAPI, client.ApiClient],
                                                                         tmp_path: Path) -> None:
    api, api_client = fake
    api.diskstats_log = lambda node: sampler_log(node, node_blocks(node))  # vdb busy
    api.no_sampler_pods = True  # as on the lab: the DaemonSet's pods come a little after it, here once the dataset

    def volume_read(requests: list[tuple[str, str]]) -> bool:
        return any(m == "GET" and p.startswith(f"{JOBS}/pg-volumes-") for m, p in requests)

    def sampler_pods_later() -> None:  # is loaded (the probes then read)
        deadline = time.monotonic() + 60
        while not volume_read(list(api.requests)) and time.monotonic() < deadline:
            time.sleep(0.01)
        api.no_sampler_pods = False

    later = threading.Thread(target=sampler_pods_later)
    later.start()
    result = run(api_client, tmp_path, PLAN)
    later.join(60)
    assert (result.ok, result.failed) == (2, 0)
    probes = [(i, n) for i, n in api.job_posts if "-volumes-" in n]
    assert [n for _, n in probes] == ["pg-volumes-1", "pg-volumes-2"]  # one per instance node, once
    [init] = [i for i, n, _ in api.execs if n == "pg-pgbench-init"]  # the dataset's load, exec'd in a client pod
    # both created once the dataset's load was under way, read after it, before the first run started
    first_read = min(i for i, (m, p) in enumerate(api.requests) if m == "GET" and p.startswith(f"{JOBS}/pg-volumes-"))
    assert init < min(i for i, _ in probes) and max(i for i, _ in probes) < first_read
    assert first_read < min(i for i, n, _ in api.execs if n != "pg-pgbench-init")
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


# ------------------------------------------------------------------ the exporters' reader
METRICS = "cnpg_collector_up 1\n"


def test_the_closing_read_asks_every_pod_at_once() -> None:
    """``final`` (after the window, while nothing else runs) reads the pods together: each read here waits for the
    other two to have begun, which one read after another never would (the barrier then breaks: an error)."""
    barrier = threading.Barrier(3, timeout=10)

    def read(pod: str) -> str:
        barrier.wait()
        return METRICS

    scraper = exporter.Scraper(read, ["a", "b", "c"], 60.0, "a")
    scraper.final()
    assert sorted(s.pod for s in scraper.scrapes) == ["a", "b", "c"]
    assert scraper.errors() == [] and all(s.values == exporter.parse(METRICS) for s in scraper.scrapes)


def test_a_reading_round_stops_at_the_pod_it_was_reading_when_the_reader_is_stopped() -> None:
    """Stopping the reader waits for the read under way, not for the rest of its round: those reads would begin
    after the window, and ``final`` reads every pod just after."""
    entered, release = threading.Event(), threading.Event()
    asked: list[str] = []

    def read(pod: str) -> str:
        asked.append(pod)
        entered.set()
        release.wait(10)
        return METRICS

    scraper = exporter.Scraper(read, ["a", "b", "c"], 60.0, "a")
    scraper.start()
    assert entered.wait(10)
    stopping = threading.Thread(target=scraper.stop)
    stopping.start()
    deadline = time.monotonic() + 10
    while not scraper._stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    stopping.join(10)
    assert not stopping.is_alive()
    assert asked == ["a"] and [s.pod for s in scraper.scrapes] == ["a"]


def test_the_disk_samplers_logs_are_read_together(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """After the window the two nodes' sampler logs are asked for together: each read here waits for the other to
    have begun before it goes to the API server (one after the other, the barrier breaks and the sweep with it)."""
    api, api_client = fake
    api.diskstats_log = lambda node: sampler_log(node, node_blocks(node))
    barrier = threading.Barrier(2, timeout=10)
    real = Orchestrator.pod_log

    def pod_log(self: Orchestrator, name: str, since_seconds: int | None = None) -> str:
        barrier.wait()
        return real(self, name, since_seconds)

    monkeypatch.setattr(Orchestrator, "pod_log", pod_log)
    result = run(api_client, tmp_path, PLAN.replace("repeats: 2", "repeats: 1"))
    assert (result.ok, result.failed) == (1, 0)
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs(store.sweeps()[-1]["id"])
    assert r.metrics["write_iops"] == pytest.approx(300 + 100, rel=1e-3)  # both nodes' vdb, as test_k8s_disks has it
    store.close()
