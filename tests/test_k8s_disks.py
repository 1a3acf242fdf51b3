"""Disk figures of a Kubernetes run: the disk-sampler DaemonSet, its logs read back, and the figures computed by the
local disk probe's own functions; against the fake API server of tests/k8s_fake/."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client

from conftest import CHECKER, REPO
from k8s_fake import FakeAPI, diskstats_text, node_exporter_text, sampler_log
from k8s_support import JOB_S, Recorder, check, counters, k8s_plan, node_blocks, run, sample_latencies, timed_log
from pglab.drivers import kubernetes_figures
from pglab.plan.load import parse_plan
from pglab.probes.base import ProbeContext
from pglab.probes.disk import MIB, SECTOR, DiskProbe, _figures, parse_diskstats, read_diskstats, resolve_device
from pglab.store.sqlite import Store
from pglab.targets.kubernetes import disks, exporter
from pglab.targets.kubernetes.render import (
    disk_sampler,
    rbac,
    render,
    to_yaml,
    volume_probe,
)
from pglab.targets.kubernetes.scripts import DISK_SAMPLE_S, disk_sampler_script, volume_probe_script

PLAN = k8s_plan("matrix: {clients: [1], jobs: [1]}", "run: {duration: 4s, repeats: 2}")
DS = "/apis/apps/v1/namespaces/bench/daemonsets/pg-disk-sampler"
@pytest.fixture
def fake(fake: tuple[FakeAPI, client.ApiClient]) -> tuple[FakeAPI, client.ApiClient]:
    """conftest's fake, its disk sampler pods logging the counters of ``node_blocks``."""
    fake[0].diskstats_log = lambda node: sampler_log(node, node_blocks(node))
    return fake


# ------------------------------------------------------------------ the DaemonSet
def test_disk_sampler_is_unprivileged_on_the_database_nodes() -> None:
    plan = parse_plan((REPO / "examples" / "kubernetes-cnpg.yaml").read_text(), base_dir=REPO / "examples")
    m = disk_sampler(plan)
    assert m in render(plan, REPO / "examples") and m.kind == "DaemonSet"
    assert m.body["metadata"]["labels"]["pglab/component"] == "disk-sampler"
    assert m.body["metadata"]["namespace"] == plan.target.kubernetes.namespace  # type: ignore[union-attr]
    pod = m.body["spec"]["template"]["spec"]
    db = plan.target.kubernetes.database  # type: ignore[union-attr]
    assert pod["nodeSelector"] == dict(db.node_selector) == {"pglab.io/role": "database"}
    assert pod.get("tolerations", []) == [t.model_dump(exclude_none=True) for t in db.tolerations]
    assert not {"hostPID", "hostNetwork", "hostIPC", "volumes"} & pod.keys()  # no hostPath, no host namespaces
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert c["image"] == plan.target.kubernetes.clients.fio_image  # type: ignore[union-attr]
    assert c["securityContext"]["runAsNonRoot"] and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not c["securityContext"]["allowPrivilegeEscalation"] and "volumeMounts" not in c
    assert m.body["spec"]["selector"]["matchLabels"].items() <= m.body["spec"]["template"]["metadata"][
        "labels"].items()
    rules = rbac(plan)[1].body["rules"]
    assert {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get", "create", "delete"]} in rules
    assert {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]} in rules


def test_sampler_script_prints_this_machines_diskstats_in_blocks_pglab_reads(tmp_path: Path) -> None:
    proc = subprocess.run(["timeout", "1.6", "sh", "-c", disk_sampler_script()], capture_output=True, text=True,
                          env={"NODE_NAME": "node-a", "PATH": "/usr/bin:/bin"}, check=False)
    blocks = disks.parse_log(proc.stdout)
    assert len(blocks) >= 2 and {b.node for b in blocks} == {"node-a"}
    # each block is stamped in the middle of the epochs printed before and after its file was read
    marks = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("pglab-diskstats ")]
    heads = [float(m[0]) for m in marks if m[0] != "end"]
    ends = [float(m[1]) for m in marks if m[0] == "end"]
    assert [b.ts for b in blocks] == [(h + e) / 2 for h, e in zip(heads, ends, strict=False)]
    assert all(h <= e for h, e in zip(heads, ends, strict=False))
    assert {b.kernel for b in blocks} == {Path("/proc/sys/kernel/random/boot_id").read_text().strip()}
    assert DISK_SAMPLE_S * 0.9 < blocks[1].ts - blocks[0].ts < DISK_SAMPLE_S + 0.5
    assert set(blocks[0].counters) == set(read_diskstats())  # every device of this machine, parsed as disk.py does


def test_a_block_is_stamped_when_its_file_was_read_and_a_garbled_end_leaves_it_out() -> None:
    text = sampler_log("n", [(10.0, {"vdb": [1] * 17})])
    both = text.replace("pglab-diskstats end 10.000000000", "pglab-diskstats end 10.5")
    assert [b.ts for b in disks.parse_log(both)] == [10.25]  # the middle of the epochs before and after the read
    older = text.replace("pglab-diskstats end 10.000000000", "pglab-diskstats end")
    assert [b.ts for b in disks.parse_log(older)] == [10.0]  # an older sampler's log: its one epoch
    for garbled in ("pglab-diskstats end 9.5", "pglab-diskstats end x", "pglab-diskstats end 11 12"):
        assert disks.parse_log(text.replace("pglab-diskstats end 10.000000000", garbled)) == [], garbled


def test_a_block_cut_short_is_left_out() -> None:
    text = sampler_log("n", [(10.0, {}), (11.0, {})])
    cut = text[: text.rindex("pglab-diskstats end")]
    assert [b.ts for b in disks.parse_log(cut)] == [10.0]
    assert [b.ts for b in disks.parse_log(text)] == [10.0, 11.0]


# ------------------------------------------------------------------ a run's figures
def test_run_stores_the_volumes_disk_figures_as_disk_py_computes_them(fake: tuple[FakeAPI, client.ApiClient],
                                                                      tmp_path: Path) -> None:
    api, api_client = fake
    ui = Recorder()
    result = run(api_client, tmp_path, PLAN, observer=ui)
    assert (result.ok, result.failed) == (2, 0)
    store = Store.open(tmp_path / "results", create=False)
    sweep = store.sweeps()[-1]
    for r in store.runs(sweep["id"]):
        m = r.metrics
        window = store.conn.execute("SELECT window_start, window_end FROM runs WHERE id = ?", (r.id,)).fetchone()
        # by hand: vdb of both nodes (distinct devices), constant rates, so the window's figures are those rates
        assert m["write_iops"] == pytest.approx(300 + 100, rel=1e-3)
        assert m["read_iops"] == pytest.approx(10 + 10, rel=1e-3)
        assert m["total_iops"] == pytest.approx(420, rel=1e-3)
        assert m["write_mb_s"] == pytest.approx((300 * 16 + 100 * 8) * SECTOR / MIB, rel=1e-3)
        assert m["write_latency_ms"] == pytest.approx((300 * 2 + 100 * 1) / 400)
        assert m["read_latency_ms"] == pytest.approx(0.5)
        assert m["util_pct_max"] == pytest.approx(40.0, rel=1e-3)
        # and exactly what the local disk probe's functions make of the same counters
        samples = []
        for node in ("node-1", "node-2"):
            blocks = node_blocks(node)
            for (t0, a), (t1, b) in itertools.pairwise(blocks):
                p, c = parse_diskstats(_text(a))["vdb"], parse_diskstats(_text(b))["vdb"]
                samples += _figures(t1, f"disk:{node}/vdb", p, c, t1 - t0)
        expected = DiskProbe(ProbeContext("")).summarize(samples, *window)
        assert {k: v for k, v in m.items() if k in expected} == expected
        assert m["disk.node-1/vdb.write_iops"] == pytest.approx(300, rel=1e-3)
        series = {(src, metric) for _ts, src, metric, _v in store.series(r.id)}
        assert ("disk:node-1/vdb", "w_s") in series and ("disk:node-2/vdb", "util_pct") in series
        run_dir = store.dir / r.dir
        info = json.loads((run_dir / "disk" / "disk.json").read_text())
        assert info["instances"]["pg-1"] == {"node": "node-1", "primary": True, "volumes": [
            {"claim": "pg-1", "device": "vdb", "how": "ext4 on device 254:16"}]}
        assert set(info["nodes"]["node-1"]["devices"]) == {"vda", "vdb", "zram0", *(f"loop{i}" for i in range(8))}
        assert (run_dir / "disk" / "node-2.log").read_text() == sampler_log("node-2", node_blocks("node-2"))
        run_json = json.loads((run_dir / "run.json").read_text())
        assert "disk/node-1.log" in run_json["files"] and run_json["disk"] == info
    store.close()
    # the logs were read for the run's time only (plus a margin), once per node and run
    since = [int(q["sinceSeconds"][0]) for _pod, q in api.log_queries]
    assert len(since) == 4 and all(1 <= s <= 60 for s in since)
    assert not [msg for msg in ui.messages if msg.startswith("disk figures")]
    assert DS not in api.objects and ("DELETE", DS) in api.requests  # cleanup deletes the DaemonSet
    # one volume probe per node, for the first run only: a claim stays on its device while it stays on its node
    assert probes(api) == [("node-1", ["pg-1"]), ("node-2", ["pg-2"])]


def probes(api: FakeAPI) -> list[tuple[str, list[str]]]:
    """(node, claims) of every volume probe Job created, in order."""
    return [(b["metadata"]["annotations"]["pglab/node"],
             [v["persistentVolumeClaim"]["claimName"] for v in b["spec"]["template"]["spec"]["volumes"]])
            for b in api.posted if b["kind"] == "Job" and b["metadata"]["labels"]["pglab/component"] == "volume-probe"]


def _text(c: dict[str, list[int]]) -> str:
    return diskstats_text(c)


def test_a_log_without_its_sample_after_the_window_is_read_again_until_it_has_one(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """pgbench's end is seen at once; the sampler's block after it may not be in its log yet. Each node's first read
    here ends before the window does: the figures are those of the whole log, read a second time."""
    api, api_client = fake
    _lat, ends = sample_latencies()
    reads: dict[str, int] = {}

    def log(node: str) -> str:
        reads[node] = reads.get(node, 0) + 1
        blocks = node_blocks(node)
        first_read_of_a_run = reads[node] % 2 == 1
        return sampler_log(node, [b for b in blocks if b[0] < float(ends.min())] if first_read_of_a_run else blocks)

    api.diskstats_log = log
    ui = Recorder()
    result = run(api_client, tmp_path, PLAN, observer=ui)
    assert (result.ok, result.failed) == (2, 0)
    assert reads == {"node-1": 4, "node-2": 4}  # twice per run
    store = Store.open(tmp_path / "results", create=False)
    for r in store.runs(store.sweeps()[-1]["id"]):
        assert r.metrics["write_iops"] == pytest.approx(300 + 100, rel=1e-3)
        assert (store.dir / r.dir / "disk" / "node-1.log").read_text() == sampler_log("node-1", node_blocks("node-1"))
    store.close()
    assert not [msg for msg in ui.messages if msg.startswith("disk figures")]


def test_a_log_that_never_reaches_past_the_window_gives_no_figures(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure over part of the window only would be wrong: none, said once, once the wait is over."""
    api, api_client = fake
    _lat, ends = sample_latencies()
    monkeypatch.setattr(kubernetes_figures, "DISK_LOG_WAIT_S", 1.0)
    api.diskstats_log = lambda node: sampler_log(node, [b for b in node_blocks(node) if b[0] < float(ends.max())])
    ui = Recorder()
    result = run(api_client, tmp_path, PLAN, observer=ui)
    assert (result.ok, result.failed) == (2, 0)
    store = Store.open(tmp_path / "results", create=False)
    for r in store.runs(store.sweeps()[-1]["id"]):
        assert "write_iops" not in r.metrics and r.metrics["tps"] == 832.861729
    store.close()
    told = [msg for msg in ui.messages if msg.startswith("disk figures")]
    assert len(told) == 1 and "printed no sample after the run's window" in told[0], ui.messages
    assert len(api.log_queries) > 4  # read again while it waited


@pytest.mark.parametrize("break_it", ["no pods", "log forbidden", "no DaemonSet permission", "empty log"])
def test_without_readable_samples_no_figures_are_stored_and_the_run_goes_on(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path, break_it: str) -> None:
    api, api_client = fake
    if break_it == "no pods":
        api.no_sampler_pods = True
    elif break_it == "log forbidden":
        api.sampler_log_forbidden = {"node-2"}  # one node unreadable: a partial sum would be a wrong total
    elif break_it == "no DaemonSet permission":
        api.forbidden = {"/apis/apps/v1/namespaces/bench/daemonsets"}
    else:
        api.diskstats_log = lambda node: ""
    ui = Recorder()
    result = run(api_client, tmp_path, PLAN, observer=ui)
    assert (result.ok, result.failed) == (2, 0)
    store = Store.open(tmp_path / "results", create=False)
    for r in store.runs(store.sweeps()[-1]["id"]):
        assert not {k for k in r.metrics if k.endswith("_iops") or k.startswith("disk.") or k == "util_pct_max"}
        assert not [s for s in store.series(r.id) if s[1].startswith("disk:")]
        assert r.metrics["tps"] == 832.861729
    store.close()
    told = [msg for msg in ui.messages if msg.startswith("disk figures")]
    assert len(told) == 1, ui.messages  # said once for the sweep's two runs
    assert DS not in api.objects


# ------------------------------------------------------------------ which device is the volume's
def test_volume_probe_is_unprivileged_pinned_to_the_node_and_mounts_the_claims_read_only(tmp_path: Path) -> None:
    plan = parse_plan((REPO / "examples" / "kubernetes-cnpg.yaml").read_text(), base_dir=REPO / "examples")
    m = volume_probe(plan, "pg-volumes-1", "worker-7", ["pg-1", "pg-1-wal"])
    body = m.body
    assert body["kind"] == "Job" and body["spec"]["activeDeadlineSeconds"] > 0 and body["spec"]["backoffLimit"] == 0
    pod = body["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["worker-7"]}]}]
    db = plan.target.kubernetes.database  # type: ignore[union-attr]
    assert pod.get("tolerations", []) == [t.model_dump(exclude_none=True) for t in db.tolerations]
    assert [v["persistentVolumeClaim"] for v in pod["volumes"]] == [{"claimName": "pg-1", "readOnly": True},
                                                                   {"claimName": "pg-1-wal", "readOnly": True}]
    (c,) = pod["containers"]
    assert [(v["mountPath"], v["readOnly"]) for v in c["volumeMounts"]] == [("/volumes/pg-1", True),
                                                                            ("/volumes/pg-1-wal", True)]
    assert c["securityContext"]["runAsNonRoot"] and not c["securityContext"]["allowPrivilegeEscalation"]
    assert not {"hostPID", "hostNetwork", "hostIPC"} & pod.keys() and pod["automountServiceAccountToken"] is False
    (tmp_path / m.filename).write_text(to_yaml(body))
    assert CHECKER.is_file(), "./setup.sh test builds tools/cnpg-check"
    proc = check(CHECKER, tmp_path / m.filename)  # batch/v1 Job, strictly decoded as every rendered manifest
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_volume_probe_script_prints_the_device_number_of_each_mount(tmp_path: Path) -> None:
    """Run for real in a private mount namespace: a bind mount of a directory of this machine (the claim on a
    block device) and a tmpfs (a claim without one)."""
    root, src = tmp_path / "volumes", tmp_path / "src"
    for d in (root / "pg-1", root / "pg-1-wal", src):
        d.mkdir(parents=True)
    script = volume_probe_script(str(root))
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "sh", "-c",
                           f"mount --bind {src} {root}/pg-1 && mount -t tmpfs pglab {root}/pg-1-wal && {script}"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    found = disks.parse_probe_log(proc.stdout)
    st = os.stat(src)
    assert found["pg-1"].number == f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    assert found["pg-1-wal"].fstype == "tmpfs" and found["pg-1-wal"].source == "pglab"
    # and that number is how /proc/diskstats names the device (the local probe's resolution agrees)
    names = {f"{f[0]}:{f[1]}": f[2] for line in Path("/proc/diskstats").read_text().splitlines() if (f := line.split())}
    assert names.get(found["pg-1"].number) == resolve_device(src).device


WAL_PLAN = k8s_plan("matrix: {clients: [1], jobs: [1]}", "run: {duration: 4s, repeats: 2}",
                    kubernetes=("wal_storage: {size: 1Gi}",))


def test_the_probed_devices_are_measured_not_the_busiest(fake: tuple[FakeAPI, client.ApiClient],
                                                         tmp_path: Path) -> None:
    """Data on vda (the quiet device), WAL on vdb: both are the instance's, vda is not the busiest."""
    api, api_client = fake
    api.volume_mount = lambda claim: (("254:16", "xfs", "/dev/vdb") if claim.endswith("-wal") else
                                      ("254:0", "ext4", "/dev/vda"))
    result = run(api_client, tmp_path, WAL_PLAN)
    assert (result.ok, result.failed) == (2, 0)
    store = Store.open(tmp_path / "results", create=False)
    for r in store.runs(store.sweeps()[-1]["id"]):
        m = r.metrics
        assert m["disk.node-1/vda.read_iops"] == pytest.approx(1.0, rel=1e-3)  # vda reads one a second
        assert m["read_iops"] == pytest.approx(2 * 1 + 10 + 10, rel=1e-3)  # vda on 2 nodes + vdb on 2
        info = json.loads((store.dir / r.dir / "disk" / "disk.json").read_text())
        assert [(v["claim"], v["device"]) for v in info["instances"]["pg-2"]["volumes"]] == [("pg-2", "vda"),
                                                                                           ("pg-2-wal", "vdb")]
    store.close()
    assert probes(api) == [("node-1", ["pg-1", "pg-1-wal"]), ("node-2", ["pg-2", "pg-2-wal"])]


def test_without_a_probe_the_busiest_device_is_taken_and_said_to_be_a_guess(fake: tuple[FakeAPI, client.ApiClient],
                                                                            tmp_path: Path) -> None:
    api, api_client = fake
    api.failing_jobs = {f"pg-volumes-{n}" for n in range(1, 9)}  # every probe's pod fails (cannot mount, say)
    api.volume_mount = lambda claim: ("254:0", "ext4", "/dev/vda")  # never used: the probes failed
    ui = Recorder()
    result = run(api_client, tmp_path, PLAN.replace("repeats: 2", "repeats: 3"), observer=ui)
    assert (result.ok, result.failed) == (3, 0)
    store = Store.open(tmp_path / "results", create=False)
    for r in store.runs(store.sweeps()[-1]["id"]):
        assert r.metrics["write_iops"] == pytest.approx(300 + 100, rel=1e-3)  # vdb, the busiest
        info = json.loads((store.dir / r.dir / "disk" / "disk.json").read_text())
        (chosen,) = info["instances"]["pg-1"]["volumes"]
        assert chosen["device"] == "vdb" and chosen["how"].startswith("busiest device of the node in the window")
    store.close()
    assert sum("are a guess" in m for m in ui.messages) == 1  # said once for the sweep
    assert len(probes(api)) == 4  # a failed probe is tried once more (a passing API error), not at every run


def test_a_volume_without_a_block_device_gives_no_figures(fake: tuple[FakeAPI, client.ApiClient],
                                                          tmp_path: Path) -> None:
    api, api_client = fake
    api.volume_mount = lambda claim: ("0:52", "nfs4", "filer:/export/" + claim)
    ui = Recorder()
    result = run(api_client, tmp_path, PLAN, observer=ui)
    assert (result.ok, result.failed) == (2, 0)
    store = Store.open(tmp_path / "results", create=False)
    for r in store.runs(store.sweeps()[-1]["id"]):
        assert not {k for k in r.metrics if k.endswith("_iops") or k.startswith("disk.")}
        info = json.loads((store.dir / r.dir / "disk" / "disk.json").read_text())
        assert "nfs4 (filer:/export/pg-1) has no block device on the node" in info["note"]
    store.close()
    told = [m for m in ui.messages if m.startswith("disk figures")]
    assert len(told) == 1 and "no block device" in told[0]


# ------------------------------------------------------------------ node-exporter instead of the sampler
NE_PLAN = k8s_plan("matrix: {clients: [1], jobs: [1]}", "run: {duration: 4s, repeats: 1}",
                   kubernetes=("node_exporter: {}",))


def test_node_exporter_counters_give_the_disk_probes_figures_without_a_daemonset(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """The node-exporter pods of the instances' nodes are read while the run's Job runs; their counters (bytes and
    seconds) are the kernel's again, and the figures those of the disk probe on the same counters."""
    api, api_client = fake
    base = time.time() - 100
    served: dict[str, list[tuple[float, dict[str, list[int]]]]] = {"node-1": [], "node-2": []}

    def text(node: str, t: float) -> str:
        c = {dev: [int(v) for v in values] for dev, values in counters(t - base, node).items()}  # type: ignore[arg-type]
        served[node].append((t, c))
        return node_exporter_text(c)

    api.node_exporter = text
    api.job_seconds = JOB_S
    api.default_log = timed_log(api)
    ui = Recorder()
    result = run(api_client, tmp_path, NE_PLAN, observer=ui, scrape_s=0.05)
    assert (result.ok, result.failed) == (1, 0), result.failures
    assert not [b for b in api.posted if b["kind"] == "DaemonSet"]  # no sampler of pglab's own
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    m = r.metrics
    window = store.conn.execute("SELECT window_start, window_end FROM runs WHERE id = ?", (r.id,)).fetchone()
    run_dir = store.dir / r.dir
    samples = []
    for node, reads in served.items():  # the oracle: the disk probe's functions on the integer counters served,
        kept = (run_dir / "disk" / f"{node}.prom").read_text()  # at the times pglab stamped its reads with
        stamps = [float(line.split("=")[1]) for line in kept.splitlines() if line.startswith("# pglab scrape ts=")]
        assert len(stamps) == len(reads) >= 10
        for (t0, (_, a)), (t1, (_, b)) in itertools.pairwise(zip(stamps, reads, strict=True)):
            p, c = parse_diskstats(_text(a))["vdb"], parse_diskstats(_text(b))["vdb"]
            samples += _figures(t1, f"disk:{node}/vdb", p, c, t1 - t0)
    expected = DiskProbe(ProbeContext("")).summarize(samples, *window)
    # vdb of both nodes, the probed device: two machines (two boot ids from the probe), though both node-exporters
    # report the same boot time (machines started in one second are not one host)
    assert expected["write_iops"] == pytest.approx(400, rel=0.05)
    assert {k: m[k] for k in expected} == pytest.approx(expected, rel=1e-4)  # the stamps kept to the µs
    info = json.loads((run_dir / "disk" / "disk.json").read_text())
    assert [v["device"] for v in info["instances"]["pg-2"]["volumes"]] == ["vdb"]
    kept = (run_dir / "disk" / "node-1.prom").read_text()
    assert "node_disk_written_bytes_total" in kept and "node_load1" not in kept  # the disk lines only
    store.close()
    assert not [msg for msg in ui.messages if msg.startswith("disk figures")]
    assert api.node_exporter_schemes == {"http"}


def test_a_node_without_node_exporter_gives_no_disk_figures(fake: tuple[FakeAPI, client.ApiClient],
                                                            tmp_path: Path) -> None:
    api, api_client = fake
    api.node_exporter = lambda node, t: node_exporter_text(counters(int(t), node))
    api.no_node_exporter_on = {"node-2"}
    ui = Recorder()
    result = run(api_client, tmp_path, NE_PLAN.replace("node_exporter: {}", "node_exporter: {scheme: https}"),
                 observer=ui, scrape_s=0.05)
    assert api.node_exporter_schemes == {"https"}  # the pod proxy's https:<pod>:<port>
    assert (result.ok, result.failed) == (1, 0)
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    assert not {k for k in r.metrics if k.endswith("_iops") or k.startswith("disk.")}
    store.close()
    (told,) = [msg for msg in ui.messages if msg.startswith("disk figures")]
    assert "no node-exporter pod on node node-2" in told


def test_nodes_on_one_kernel_count_its_devices_once(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    """kind and k3d nodes are containers of one host: each node's /proc/diskstats is the host's, and the two
    instances' volumes are one device seen twice (same boot id): counted once, not doubled."""
    api, api_client = fake
    boot = "6a5b1c2d-0000-4000-8000-000000000001"
    api.diskstats_log = lambda node: sampler_log(node, node_blocks("node-1"), kernel=boot)
    api.boot_id = lambda node: boot
    result = run(api_client, tmp_path, PLAN.replace("repeats: 2", "repeats: 1"))
    assert (result.ok, result.failed) == (1, 0)
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    assert r.metrics["write_iops"] == pytest.approx(300, rel=1e-3)  # the host's vdb, once (not 600)
    assert not [k for k in r.metrics if k.startswith("disk.node-2/")]
    info = json.loads((store.dir / r.dir / "disk" / "disk.json").read_text())
    assert info["instances"]["pg-2"]["volumes"][0]["counted_as"] == "disk:node-1/vdb"
    store.close()


def test_a_node_exporter_scrape_is_the_kernels_counters_again() -> None:
    c = counters(7, "node-1")
    block = disks.node_exporter_block(exporter.parse(node_exporter_text(c)), 5.0, "n")
    assert block.counters["vdb"] == parse_diskstats(_text(c))["vdb"]  # bytes ÷ 512, seconds × 1000: exact
    assert block.numbers["254:16"] == "vdb" and "loop0" not in block.counters  # node-exporter's filter


def test_every_devices_figures_come_from_the_blocks_near_the_window_and_equal_the_whole_logs() -> None:
    """``node_devices`` reads only the intervals that reach into the window: its figures are those of the whole
    log's intervals, bit for bit, wherever the window falls (inside, across an edge of, or outside the log)."""
    blocks: list[disks.Block] = []
    rng = list(itertools.accumulate([0.2 + 0.013 * (i % 7) for i in range(300)], initial=1000.0))
    for i, ts in enumerate(rng):
        text = diskstats_text({"vdb": [i * 3, 0, i * 40, i * 5, i * 2 + i % 5, 0, i * 30, i * 7, 0, i * 9, i * 11,
                                       0, 0, 0, 0, 0, 0],
                               "vda": [i, 0, i * 8, i, 0, 0, 0, 0, 0, i, i, 0, 0, 0, 0, 0, 0]})
        blocks.append(disks.Block(ts, "n", parse_diskstats(text), {}))

    def whole_log(window: tuple[float, float]) -> dict[str, float]:
        samples = [s for d in sorted(blocks[0].counters) for s in disks.device_samples(blocks, d, f"disk:{d}")]
        return DiskProbe(ProbeContext("")).summarize(samples, *window)

    for window in ((1010.0, 1040.0), (1010.05, 1010.31), (990.0, 1003.3), (1050.0, 1200.0),
                   (blocks[5].ts, blocks[40].ts)):
        expected = {k[5:]: v for k, v in whole_log(window).items() if k.startswith("disk.")}
        got = {f"{dev}.{name}": v for dev, figures in disks.node_devices(blocks, window).items()
               for name, v in figures.items()}
        assert got and got == expected, window
    near = disks.near_window(blocks, (1010.0, 1011.0))
    assert len(near) < 20 and near[0].ts < 1009.0 and near[-1].ts > 1012.0  # a few, bounding the window and more
