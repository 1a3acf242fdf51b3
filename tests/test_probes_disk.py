"""The disk probe against the real kernel counters, fio and iostat.

The write-count test runs on a fresh ext4 filesystem on a loop device (when we may create one) so that no
other process on the machine writes to the measured device and the bound can be tight; elsewhere the
comparisons with iostat run on the real disk behind /var/tmp.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import fmean as mean

import pytest

from helpers import own_diskstats, steady_writes
from pglab.probes import DiskProbe, ProbeContext, Sample, Sampler, now, resolve_device
from pglab.probes._util import counter_delta, rows, rows_in_window
from pglab.probes.disk import describe_block

pytestmark = pytest.mark.postgres

FIO_WRITES = 1024  # 8 MiB in 8 KiB writes


def _kname_of_mount_source(directory: Path) -> str:
    """The kernel name of the device findmnt says the directory is on, as lsblk names it."""
    source = subprocess.run(
        ["findmnt", "-no", "SOURCE", "--target", str(directory)], capture_output=True, text=True, check=True
    ).stdout.strip()
    return subprocess.run(
        ["lsblk", "-ndo", "KNAME", source], capture_output=True, text=True, check=True
    ).stdout.strip()


def _sleep_to_next_second() -> float:
    t = now()
    time.sleep(int(t) + 1.0 - t)
    return now()


@pytest.fixture
def scratch() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="pglab-disk-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def loop_fs() -> Iterator[tuple[Path, str, Path]]:
    """A fresh ext4 on a loop device: (mount point, loop device name, backing file). Skips if impossible."""
    if os.geteuid() != 0 or shutil.which("losetup") is None or shutil.which("mkfs.ext4") is None:
        pytest.skip("creating a loop device needs root, losetup and mkfs.ext4")
    base = Path(tempfile.mkdtemp(prefix="pglab-loop-", dir="/var/tmp"))
    image, mnt = base / "disk.img", base / "mnt"
    mnt.mkdir()
    dev = ""
    mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(64 * 1024 * 1024)
        got = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True)
        if got.returncode != 0:
            pytest.skip(f"losetup failed: {got.stderr.strip()}")
        dev = got.stdout.strip()
        # no lazy init: otherwise ext4lazyinit writes to the device in the background while we count
        subprocess.run(["mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev], check=True)
        got = subprocess.run(["mount", dev, str(mnt)], capture_output=True, text=True)
        if got.returncode != 0:
            pytest.skip(f"mounting a loop device failed: {got.stderr.strip()}")
        mounted = True
        yield mnt, Path(dev).name, image
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=False)
        if dev:
            subprocess.run(["losetup", "-d", dev], check=False)
        shutil.rmtree(base, ignore_errors=True)


def _fio(directory: Path, *extra: str) -> dict:
    cmd = [
        "fio",
        "--name=burst",
        f"--directory={directory}",
        "--rw=write",
        "--bs=8k",
        "--size=8m",
        "--fdatasync=1",
        "--direct=1",
        "--ioengine=sync",
        "--output-format=json",
        *extra,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("{") :])


def test_tmpfs_path_has_no_block_device() -> None:
    info = resolve_device("/dev/shm")
    assert info.device is None
    assert info.kind == "none"
    assert info.reason == "tmpfs has no block device"
    probe = DiskProbe(ProbeContext("", paths={"shm": Path("/dev/shm")}))
    probe.open()
    assert probe.describe()["shm"]["device"] is None
    time.sleep(0.05)
    assert probe.sample(now()) == []  # no zeros pretending the storage was idle
    assert probe.summarize([], 0, now()) == {}


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    from pglab.errors import UserError

    probe = DiskProbe(ProbeContext("", paths={"data": tmp_path / "nope"}))
    with pytest.raises(UserError, match=r"disk probe .* data \("):
        probe.open()


def test_device_is_the_one_findmnt_shows(scratch: Path) -> None:
    info = resolve_device(scratch)
    assert info.device == _kname_of_mount_source(scratch)
    assert info.kind in {"disk", "partition", "dm", "loop"}
    assert info.chain[0] == info.device
    # two labels on the same device are sampled once
    probe = DiskProbe(ProbeContext("", paths={"data": scratch, "wal": scratch.parent}))
    probe.resolve()
    assert list(probe.devices) == [info.device]
    assert probe.describe()["wal"]["labels"] == ["data", "wal"]


def test_loop_device_resolution(loop_fs: tuple[Path, str, Path]) -> None:
    mnt, dev, image = loop_fs
    info = resolve_device(mnt)
    assert info.device == dev == _kname_of_mount_source(mnt)
    assert info.kind == "loop"
    assert info.backing_file == str(image)
    # the chain goes on to the device holding the image file
    assert info.chain[:2] == (dev, f"file:{image}")
    assert info.chain[2] == resolve_device(image.parent).device


def test_fio_synced_writes_are_all_counted(request: pytest.FixtureRequest, scratch: Path) -> None:
    """Every synced 8 KiB write fio completes reaches the device once, plus ext4's journal writes.

    Measured on ext4 (data=ordered): a synced write into freshly allocated space costs exactly 3 device
    writes (the data, the journal's descriptor+metadata, the commit record; 3082 for 1024 writes here);
    overwriting costs ~2. So on a device only fio writes to, the count lies in [N, 3N + a few writes for
    file creation and fio's layout]. Without a loop device of our own (not root), the test runs on the disk
    behind /var/tmp, where other processes' writes make only the lower bound meaningful.
    """
    try:
        mnt, _, _ = request.getfixturevalue("loop_fs")
        target, isolated = mnt / "fio", True
    except pytest.skip.Exception:
        target, isolated = scratch / "fio", False
    target.mkdir()
    dev = resolve_device(target).device
    probe = DiskProbe(ProbeContext("", paths={"data": target}))
    sampler = Sampler([probe])
    sampler.start()
    try:
        time.sleep(0.3)
        t0 = now()
        result = _fio(target)
        t1 = now()
        time.sleep(1.3)  # let the tick after fio's last write happen
    finally:
        samples = sampler.stop()
    assert not sampler.errors
    issued = result["jobs"][0]["write"]["total_ios"]
    assert issued == FIO_WRITES
    # every tick overlapping fio's run has its middle in [t0 - 1, t1 + 1]
    window = [r for r in rows_in_window(samples, t0 - 1, t1 + 1, rate=True) if r.source == f"disk:{dev}"]
    counted = sum(r.get("d_writes") for r in window)
    print(f"fio writes {issued}, device writes {counted} ({counted / issued:.2f}x)")
    assert counted >= issued, (issued, counted)
    if isolated:
        assert counted <= 3 * issued + 64, (issued, counted)
    # a summary covers exactly its window: over the span of the whole ticks above it counts what they count. A
    # tick's interval [ts - dt, ts] is the span between the reads its deltas come from, so the summary's fine
    # reads meet its edges exactly (only float rounding is left; a tick stamped apart from its read was 0.69 off)
    start, end = window[0].ts - window[0].get("dt"), window[-1].ts
    summary = probe.summarize(samples, start, end)
    window_s = end - start
    assert summary["write_iops"] * window_s == pytest.approx(counted, abs=0.01)
    assert summary[f"disk.{dev}.write_iops"] == pytest.approx(summary["write_iops"])
    assert summary["write_mb_s"] * window_s >= 8  # at least fio's 8 MiB of data reached the device


def test_ticks_tile_time_so_a_span_of_whole_ticks_is_summarised_as_they_count(scratch: Path) -> None:
    """Each tick begins where the one before it ended (``ts - dt`` is the previous ``ts``): a tick is the span
    between the two reads its deltas come from. So a summary over any span of whole ticks adds up exactly what
    those ticks count, whatever the writes did near the edges (synced writes keep coming here throughout).

    Not so when a tick carried the sampler's time and a ``dt`` from a clock read after the counters: its
    edges were 0.1-0.3 ms (under load, ms) off the reads, and the summary then took a share of the writes
    of the finer interval across each edge."""
    dev = resolve_device(scratch).device
    assert dev is not None
    probe = DiskProbe(ProbeContext("", paths={"data": scratch}))
    sampler = Sampler([probe])
    sampler.start()
    try:
        end = time.monotonic() + 4.5
        with open(scratch / "synced", "wb") as f:
            while time.monotonic() < end:
                f.write(os.urandom(8192))
                f.flush()
                os.fsync(f.fileno())
                time.sleep(0.002)
    finally:
        samples = sampler.stop()
    assert not sampler.errors
    ticks = [r for r in rows(samples) if r.source == f"disk:{dev}"]
    assert len(ticks) >= 4
    for before, tick in itertools.pairwise(ticks):
        assert tick.ts - tick.get("dt") == pytest.approx(before.ts, abs=1e-6), (before.ts, tick.ts, tick.get("dt"))
    assert sum(t.get("d_writes") for t in ticks) > 0
    for first in range(len(ticks)):
        for last in range(first, len(ticks)):
            span = ticks[first : last + 1]
            start, stop = span[0].ts - span[0].get("dt"), span[-1].ts
            got = probe.summarize(samples, start, stop)
            assert got["write_iops"] * (stop - start) == pytest.approx(sum(t.get("d_writes") for t in span),
                                                                       abs=0.01), (first, last)


def test_agrees_with_iostat_second_by_second(scratch: Path) -> None:
    """Same device, same seconds: our r/s, w/s, r_await and w_await match ``iostat -dxy 1`` within 5 %.

    Two fio jobs run side by side at a steady rate: synced 8 KiB direct writes, and 8 KiB direct random
    reads of a file written and synced beforehand (direct I/O bypasses the page cache, so every read reaches
    the device whatever the machine's memory). iostat prints two decimals, so await values (~0.1 ms on a
    fast disk) also get ±0.005 ms of slack.
    """
    seconds = 5
    dev = resolve_device(scratch).device
    assert dev is not None
    data = scratch / "reads.dat"
    with open(data, "wb") as f:  # written and synced now, so no writeback lands inside the window
        block = os.urandom(1024 * 1024)
        for _ in range(64):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    probe = DiskProbe(ProbeContext("", paths={"data": scratch}))
    sampler = Sampler([probe])
    sampler.start()
    fio = subprocess.Popen(
        [
            "fio",
            "--time_based",
            f"--runtime={seconds + 4}",
            "--bs=8k",
            "--direct=1",
            "--rate_iops=250",
            "--output-format=json",
            "--name=steady",
            f"--directory={scratch}",
            "--rw=write",
            "--size=8m",
            "--fdatasync=1",
            "--ioengine=sync",
            "--name=reads",
            f"--filename={data}",
            "--rw=randread",
            "--ioengine=psync",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        # fio is running steadily after two whole seconds: its rate limit catches up on what its start delayed
        # within them (a first second of 693 r/s, iostat's 563, was seen on a loaded machine after one)
        _sleep_to_next_second()
        _sleep_to_next_second()
        t0 = _sleep_to_next_second()  # iostat's seconds then start on the sampler's whole seconds
        out = subprocess.run(
            ["iostat", "-dxy", "-o", "JSON", "1", str(seconds), dev],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        time.sleep(0.2)
    finally:
        fio.wait(timeout=30)
        samples = sampler.stop()
    stats = json.loads(out)["sysstat"]["hosts"][0]["statistics"]
    ours = [r for r in rows(samples) if r.source == f"disk:{dev}" and t0 + 0.5 < r.ts <= t0 + seconds + 0.5]
    assert len(ours) == len(stats) == seconds
    for ios, key, unit in (("r/s", "r_s", "r_await"), ("w/s", "w_s", "w_await")):
        io_rate = [s["disk"][0][ios] for s in stats]
        io_await = [s["disk"][0][unit] for s in stats]
        our_rate = [r.get(key) for r in ours]
        our_await = [r.get(f"{unit}_ms") for r in ours]
        print(f"{ios} iostat {mean(io_rate):.1f} ours {mean(our_rate):.1f}", end="; ")
        print(f"{unit} iostat {mean(io_await):.4f} ours {mean(our_await):.4f}", end="; ")
        assert mean(io_rate) > 200
        assert mean(our_rate) == pytest.approx(mean(io_rate), rel=0.05), (ios, our_rate, io_rate)
        assert abs(mean(our_await) - mean(io_await)) <= 0.05 * mean(io_await) + 0.005, (unit, our_await, io_await)


def _disk_samples(ts: float, dev: str, **raw: float) -> list[Sample]:
    return [Sample(ts, f"disk:{dev}", k, v) for k, v in raw.items()]


def test_window_figures_are_ratios_of_sums() -> None:
    """Latency over a window is Σticks/Σios, not the mean of per-second latencies; rates use Σdt."""
    probe = DiskProbe(ProbeContext(""))
    samples = [
        *_disk_samples(10.0, "vda", d_reads=0, d_writes=100, d_read_ticks=0, d_write_ticks=100, d_rsect=0,
                       d_wsect=1600, d_io_ticks=500, dt=1.0, util_pct=50.0),
        *_disk_samples(11.0, "vda", d_reads=10, d_writes=300, d_read_ticks=50, d_write_ticks=900, d_rsect=80,
                       d_wsect=4800, d_io_ticks=900, dt=1.0, util_pct=90.0),
        *_disk_samples(12.0, "vda", d_reads=99, d_writes=99, d_read_ticks=99, d_write_ticks=99, d_rsect=0,
                       d_wsect=0, d_io_ticks=0, dt=1.0, util_pct=0.0),  # outside the window
        *_disk_samples(11.0, "vdb", d_reads=20, d_writes=0, d_read_ticks=20, d_write_ticks=0, d_rsect=160,
                       d_wsect=0, d_io_ticks=100, dt=0.5, util_pct=20.0),
    ]  # fmt: skip
    s = probe.summarize(samples, 9.0, 11.0)
    assert s["disk.vda.write_iops"] == pytest.approx(200.0)
    assert s["disk.vda.write_latency_ms"] == pytest.approx(1000 / 400)
    assert s["disk.vda.util_pct"] == pytest.approx(1400 / 2000 * 100)
    assert s["disk.vdb.read_iops"] == pytest.approx(40.0)
    assert s["read_iops"] == pytest.approx(5.0 + 40.0)
    assert s["read_latency_ms"] == pytest.approx(70 / 30)
    assert s["write_mb_s"] == pytest.approx(6400 * 512 / 2**20 / 2)
    assert s["util_pct_max"] == 90.0
    assert s["total_iops"] == pytest.approx(s["read_iops"] + s["write_iops"])


def _fake_block(sysfs: Path, path: str, majmin: str | None = None, **files: str) -> Path:
    d = sysfs / "devices" / path
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        f = d / name.replace("__", "/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text + "\n")
    if majmin:
        (sysfs / "dev" / "block").mkdir(parents=True, exist_ok=True)
        (sysfs / "dev" / "block" / majmin).symlink_to(d)
    return d


def test_partition_and_device_mapper_chains(tmp_path: Path) -> None:
    """This kernel has neither partition tables on loop devices nor device-mapper, so the sysfs layout the
    kernel exposes for them (a partition is a subdirectory of its disk with a ``partition`` file; a dm
    device has ``dm/name`` and ``slaves/``) is built here as files and resolved."""
    sysfs = tmp_path / "sys"
    disk = _fake_block(sysfs, "pci0/block/sda", "8:0")
    part = _fake_block(sysfs, "pci0/block/sda/sda2", "8:2", partition="2")
    dm = _fake_block(sysfs, "virtual/block/dm-0", "253:0", dm__name="vg0-pgdata")
    (dm / "slaves").mkdir()
    (dm / "slaves" / "sda2").symlink_to(part)
    assert disk.exists()

    got = describe_block(8, 2, sysfs=sysfs)
    assert got is not None
    name, kind, chain, _ = got
    assert (name, kind, chain) == ("sda2", "partition", ("sda2", "sda"))

    got = describe_block(253, 0, sysfs=sysfs)
    assert got is not None
    name, kind, chain, extras = got
    assert (name, kind, chain) == ("dm-0", "dm", ("dm-0", "sda2", "sda"))
    assert extras["dm_name"] == "vg0-pgdata"
    assert describe_block(9, 9, sysfs=sysfs) is None


def test_counter_wrap_and_reset() -> None:
    """32-bit millisecond counters wrap (iostat's rule); a 64-bit count that goes back was reset: 0."""
    assert counter_delta(5, 2**32 - 5, 32) == 10
    assert counter_delta(7, 3, 32) == 4
    assert counter_delta(3, 10**12, 64) == 0
    assert counter_delta(3, 2**40, 32) == 0


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def test_window_figures_match_reads_at_the_exact_edges(request: pytest.FixtureRequest, scratch: Path) -> None:
    """5 s and 15 s windows whose edges fall mid-tick: the probe's write IOPS, MB/s and w_await are within 2 %
    of the counters read by the test itself at the windows' edges.

    fio writes at a steady 250 synced 8 KiB writes/s. Keeping or dropping whole edge ticks (by their middle) would
    be off by up to half a tick at each edge: up to 20 % of a 5 s window's writes.
    """
    try:
        mnt, _, _ = request.getfixturevalue("loop_fs")
        target = mnt / "edges"
    except pytest.skip.Exception:
        target = scratch / "edges"
    target.mkdir()
    dev = resolve_device(target).device
    assert dev is not None
    probe = DiskProbe(ProbeContext("", paths={"data": target}))
    sampler = Sampler([probe])
    fio = steady_writes(target, 22)
    sampler.start()
    reads: dict[float, tuple[float, dict[str, int]]] = {}
    try:
        t0 = _sleep_to_next_second() + 1.0  # fio is writing steadily from here on
        windows = [(t0 + 0.37, 5.0), (t0 + 1.61, 15.0)]  # edges at .37, .61 of a tick: never on one
        for edge in sorted({e for a, length in windows for e in (a, a + length)}):
            _sleep_until(edge)
            reads[edge] = own_diskstats(dev)
        time.sleep(1.3)  # the tick closing the last window
    finally:
        fio.wait(timeout=60)
        samples = sampler.stop()
    assert not sampler.errors
    for a, length in windows:
        (ta, ca), (tb, cb) = reads[a], reads[a + length]
        dt = tb - ta
        writes = cb["writes"] - ca["writes"]
        want = {"write_iops": writes / dt,
                "write_mb_s": (cb["wsect"] - ca["wsect"]) * 512 / 2**20 / dt,
                "write_latency_ms": (cb["wticks"] - ca["wticks"]) / writes}
        got = probe.summarize(samples, ta, tb)
        # what keeping whole ticks by their middle gave before
        old = [r for r in rows_in_window(samples, ta, tb, rate=True) if r.source == f"disk:{dev}"]
        old_iops = sum(r.get("d_writes") for r in old) / sum(r.get("dt") for r in old)
        print(f"{length:g} s window on {dev}: independent {want}, probe "
              f"{ {k: got[k] for k in want} }, whole ticks' write IOPS {old_iops:.1f}")
        assert want["write_iops"] > 200
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=0.02), (length, k, got[k], v)
