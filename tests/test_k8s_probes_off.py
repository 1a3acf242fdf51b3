"""``probes: {enabled: false}`` on Kubernetes, as on a local lab: pgbench's own figures only. No disk sampler
DaemonSet is rendered or made, no exporter is read, the run Job reads no view, and a run's figures are pgbench's
(checked against the fake API server)."""

from __future__ import annotations

import json
from pathlib import Path

from kubernetes import client

from k8s_fake import FakeAPI
from k8s_support import k8s_plan, run
from pglab.plan.load import parse_plan
from pglab.store.sqlite import Store
from pglab.targets.kubernetes.render import render

ON = k8s_plan("postgres:\n  parameters: {pg_stat_statements.max: '1000'}", "matrix: {clients: [1]}",
              "run: {duration: 4s}")
OFF = ON + "probes: {enabled: false}\n"
PLAIN = k8s_plan("matrix: {clients: [1]}", "run: {duration: 4s}")  # the fake's run Job ships no settings.txt


def test_no_sampler_is_rendered_and_no_view_read_with_the_probes_off(tmp_path: Path) -> None:
    on, off = render(parse_plan(ON), tmp_path), render(parse_plan(OFF), tmp_path)
    assert [m.kind for m in on if m.kind == "DaemonSet"] == ["DaemonSet"]  # the disk sampler, probes on
    assert [m.kind for m in off] == [m.kind for m in on if m.kind != "DaemonSet"]
    (job,) = [m for m in off if m.body["metadata"]["labels"].get("pglab/component") == "pgbench-run"]
    assert "statements_read" not in job.body["spec"]["template"]["spec"]["containers"][0]["command"][2]


def test_a_run_with_the_probes_off_reads_no_exporter_and_makes_no_sampler(fake: tuple[FakeAPI, client.ApiClient],
                                                                          tmp_path: Path) -> None:
    api, api_client = fake
    result = run(api_client, tmp_path, PLAIN + "probes: {enabled: false}\n")
    assert (result.ok, result.failed) == (1, 0), result.failures
    assert not [b for b in api.posted if b["kind"] == "DaemonSet"]
    # the instances' exporter read once: the replay wait before the run (a step: the standbys caught up), no probe
    assert len(api.scrapes) == 1
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    assert (r.metrics["tps"] or 0) > 0 and "commits_s" not in r.metrics and "write_iops" not in r.metrics
    record = json.loads((store.dir / r.dir / "run.json").read_text())
    assert record["exporter"] is None and record["disk"] is None
    assert not (store.dir / r.dir / "exporter").exists() and not (store.dir / r.dir / "disk").exists()
    store.close()

    # the same plan with the probes on reads the exporter during the run (what the test above tells apart)
    on = tmp_path / "on"
    on.mkdir()
    result = run(api_client, on, PLAIN)
    assert (result.ok, result.failed) == (1, 0), result.failures
    assert len(api.scrapes) - 1 >= 3  # the replay wait's, the reads at the run's start and end
