"""Each instance's own I/O, from its cgroup, beside the devices' figures: on a local lab every instance shares one
disk, so the disk probe's write IOPS are the primary's, the standby's and the host's together."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import run_plan
from helpers import run_files
from pglab.targets.local import cgroups

pytestmark = pytest.mark.postgres  # labs, and cgroups with a process in them

MIB = 1024 * 1024
IN_FLIGHT = 2 * MIB  # writes submitted before the last sample and completed after it: a queue's worth at most


def _device_bytes_written(run_dir: Path, since: float) -> float:
    """Bytes the lab's disk wrote from the probe's sample interval that holds ``since`` to its last sample (each
    sample's sectors are the device's counter delta since the one before: the intervals join end to end)."""
    with open(run_dir / "probes.csv") as f:
        return sum(float(r["value"]) * 512 for r in csv.DictReader(f)
                   if r["source"].startswith("disk:") and r["metric"] == "d_wsect" and float(r["ts"]) > since)


@pytest.mark.skipif(cgroups.io_accounting_problem() is not None, reason="needs root and a blkio/io controller")
@pytest.mark.parametrize("lab", ["{instances: 2}", "{instances: 2, ha: patroni}"], ids=["local", "patroni"])
def test_each_instance_writes_what_its_role_does_and_no_more_than_the_device(lab: str) -> None:
    base = Path(tempfile.mkdtemp(prefix="pglab-test-"))
    os.chmod(base, 0o711)  # the server user traverses it
    plan = base / "plan.yaml"
    # no resources: the instances' groups are accounting only; select-only first, so that no checkpoint of the
    # tpcb-like run's writes falls into its window
    plan.write_text(f"""
name: io-per-instance
target: {{local: {lab}}}
dataset: {{scale: 1}}
matrix: {{workload: [select-only, tpcb-like], clients: [4]}}
run: {{duration: 5s, repeats: 1}}
""")
    try:
        results = base / "r"
        run_plan(plan, results, "--format", "json")
        runs = {record["point"]["workload"]: (d, record) for d, record in run_files(results)}
        (_, tpcb), (_, select) = runs["tpcb-like"], runs["select-only"]
        for run_dir, record in runs.values():
            io = record["io"]
            assert io["scope"] == "per instance" and record["metrics"]["io_per_instance"] == 1.0
            assert {n: f["role"] for n, f in io["nodes"].items()} == {"n0": "primary", "n1": "standby"}
            # no limits were asked for: the groups only count, nothing says limits were applied
            assert "limits_applied" not in record["metrics"]
            assert not (run_dir / "limits.json").exists()
        m = tpcb["metrics"]
        # the primary flushes WAL at every commit; the standby writes the WAL it receives
        assert m["primary_write_iops"] > 0 and m["standby_write_iops"] > 0
        assert m["primary_write_mb_s"] > 0 and m["standby_write_mb_s"] > 0
        # a read-only load on a cached dataset commits nothing: the primary's writes are a sliver of tpcb-like's
        assert select["metrics"]["primary_write_iops"] < 0.1 * m["primary_write_iops"], select["metrics"]
        # bytes are what both sides count alike (IOs not: the instances' are bios before the block layer merges
        # them, and a flush counts as a write there). What an instance submitted in its window reached the device
        # by the time the sampler stopped, after the window, bar what was still in flight: the device's bytes
        # from the sample interval holding the window's start until then bound the instances' together.
        for run_dir, record in runs.values():
            start, end = record["io"]["window"]
            instances = sum(f["write_mb_s"] for f in record["io"]["nodes"].values()) * (end - start) * MIB
            assert instances <= _device_bytes_written(run_dir, start) + IN_FLIGHT, record["metrics"]
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(cgroups.io_accounting_problem() is not None, reason="needs root and a blkio/io controller")
def test_the_patroni_lab_gets_accounting_groups_that_limit_nothing() -> None:
    """The Patroni lab makes its groups with the same LabBase code: without resources, each node still gets one
    that counts its I/O, with no limit written, and nothing reports limits in force."""
    from pglab.plan.schema import LocalTarget
    from pglab.targets.local.ha.lab import HALab

    lab = HALab(LocalTarget.model_validate({"instances": 2}), Path("/tmp"))
    dirs: list[Path] = []
    try:
        lab._prepare_dirs()
        lab._make_groups()
        assert sorted(lab.limits.groups) == ["n0", "n1"] and lab.limits.client is None
        dirs = [d for g in lab.limits.groups.values() for d in g.dirs]
        assert lab.io_accounting() is None and lab.limits_in_force() == {} and lab.cpu_stats() == {}
        for g in lab.limits.groups.values():
            assert g.in_force()["cpus"] is None  # no CPU quota
            for d in g.dirs:
                for rule in d.glob("blkio.throttle.*_device"):
                    assert rule.read_text().strip() == "", rule  # no I/O limit either
        # a process of the group is counted: a write it flushes itself shows in its group's figures, not another's
        before = lab.io_stats()
        target = lab.nodes[0].data.parent / "probe"
        script = (f"import os; fd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT); "
                  "os.write(fd, b'x' * 65536); os.fsync(fd); os.close(fd)")
        subprocess.run(cgroups.wrap([sys.executable, "-c", script], lab.limits.groups["n0"].procs_files()), check=True)
        after = lab.io_stats()
        assert after["n0"]["write_bytes"] - before["n0"]["write_bytes"] >= 65536
        assert after["n1"]["write_bytes"] == before["n1"]["write_bytes"]
    finally:
        lab._remove_what_was_made()
    assert dirs and not any(d.exists() for d in dirs)


def test_without_groups_the_run_says_its_io_figures_are_device_wide_only() -> None:
    from pglab.drivers.local import io_metrics
    from pglab.targets.base import Unshaped

    figures, record = io_metrics({}, {}, (0.0, 10.0), "n0", "pglab does not run as root")
    assert figures == {"io_per_instance": 0.0}
    assert record == {"scope": "device-wide only", "reason": "pglab does not run as root"}
    assert "no cgroup per instance" in (Unshaped().io_accounting() or "")  # an external server's


def test_each_instances_rates_come_from_its_own_counters() -> None:
    """The primary is whichever node led when the window opened; a standby's figure is the mean of one standby."""
    from pglab.drivers.local import io_metrics

    zero = {"read_ios": 0.0, "write_ios": 0.0, "read_bytes": 0.0, "write_bytes": 0.0}
    before = {"n0": zero, "n1": zero, "n2": zero}
    after = {"n0": {**zero, "write_ios": 100.0, "write_bytes": 10 * MIB},
             "n1": {**zero, "write_ios": 1000.0, "write_bytes": 40 * MIB, "read_ios": 20.0},
             "n2": {**zero, "write_ios": 300.0, "write_bytes": 20 * MIB}}
    figures, record = io_metrics(before, after, (100.0, 110.0), primary_name="n1")
    assert figures["primary_write_iops"] == 100.0 and figures["primary_write_mb_s"] == 4.0
    assert figures["primary_read_iops"] == 2.0
    assert figures["standby_write_iops"] == 20.0 and figures["standby_write_mb_s"] == 1.5
    assert record["nodes"]["n1"]["role"] == "primary" and record["nodes"]["n0"]["role"] == "standby"
    assert record["window"] == [100.0, 110.0] and "primary_io_pressure_pct" not in figures
    # a failover during the window (n1 → n2): no node was the primary throughout, so no primary_* / standby_*
    moved, record = io_metrics(before, after, (100.0, 110.0), primary_name="n1", primary_at_end="n2")
    assert moved == {"io_per_instance": 1.0} and "n1 → n2" in record["note"]
    assert (record["nodes"]["n1"]["role"], record["nodes"]["n2"]["role"]) == ("primary at start", "primary at end")
    assert record["nodes"]["n2"]["write_iops"] == 30.0


@pytest.mark.parametrize("version", [1, 2])
def test_a_groups_counters_are_read_for_its_own_devices_only(tmp_path: Path, version: int) -> None:
    """The kernel's own formats: v1's blkio.throttle tables, v2's io.stat and io.pressure (the stall time)."""
    g = cgroups.Group.__new__(cgroups.Group)  # a group over files laid out as the kernel writes them
    g.name, g.limits, g.devices, g.version, g.dirs = "n0", cgroups.Limits(), ["254:0"], version, [tmp_path]
    if version == 1:
        (tmp_path / "blkio.throttle.io_serviced").write_text(
            "254:0 Read 2\n254:0 Write 128\n254:0 Sync 100\n254:0 Discard 7\n254:0 Total 137\n"
            "253:0 Write 999\nTotal 1136\n")
        (tmp_path / "blkio.throttle.io_service_bytes").write_text(
            "254:0 Read 8192\n254:0 Write 1048576\n254:0 Discard 4096\n253:0 Write 999\nTotal 1\n")
        stall = {}
    else:
        (tmp_path / "io.stat").write_text("254:0 rbytes=8192 wbytes=1048576 rios=2 wios=128 dbytes=4096 dios=7\n"
                                          "253:0 rbytes=1 wbytes=999 rios=1 wios=999 dbytes=0 dios=0\n")
        (tmp_path / "io.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=2500000\n"
                                              "full avg10=0.00 avg60=0.00 avg300=0.00 total=1000000\n")
        stall = {"io_stall_s": 2.5}
    assert g.io_stat() == {"read_ios": 2.0, "write_ios": 128.0, "read_bytes": 8192.0, "write_bytes": 1048576.0,
                           **stall}
