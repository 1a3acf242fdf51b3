"""fio profiles against the real fio on the machine's disk: figures, series, cleanup, errors, detection.

Runs are kept short (2-3 s, 16-32 MiB); the figures asserted are fio's own, so no timing is asserted.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import pglab, processes_mentioning
from pglab.engine.sweep import interrupt_signals
from pglab.errors import RunInterrupted, UserError
from pglab.workloads import fio
from pglab.workloads.fio import FioResult, JobSpec

pytestmark = pytest.mark.postgres

RUNTIME = 3
SIZE = 32 * 1024 * 1024


@pytest.fixture
def disk_dir() -> Iterator[Path]:
    """A directory on the machine's disk (not tmpfs: the profiles use direct I/O)."""
    d = Path(tempfile.mkdtemp(prefix="pglab-fio-test-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _scratch_left(path: Path) -> list[str]:
    return [p.name for p in path.iterdir() if p.name.startswith(".pglab-fio")]


def _fio_json(result: FioResult) -> dict:
    return json.loads(result.json_file.read_text())


def _assert_figures_are_fios(r: FioResult) -> None:
    data = _fio_json(r)
    assert len(data["jobs"]) == 1
    d = data["jobs"][0][r.direction]
    assert r.iops == d["iops"]  # exactly
    assert r.bw_mb_s * 1048576 == pytest.approx(d["bw_bytes"], rel=1e-12)
    lat = d["lat_ns"]
    assert r.lat_mean_ms * 1e6 == pytest.approx(lat["mean"], rel=1e-9)
    assert r.lat_p50_ms * 1e6 == pytest.approx(lat["percentile"]["50.000000"], rel=1e-9)
    assert r.lat_p99_ms * 1e6 == pytest.approx(lat["percentile"]["99.000000"], rel=1e-9)
    assert r.lat_p999_ms * 1e6 == pytest.approx(lat["percentile"]["99.900000"], rel=1e-9)


def _assert_series_sane(r: FioResult, runtime: float) -> None:
    assert r.ended - r.started == pytest.approx(runtime, abs=0.3)
    assert runtime - 1 <= len(r.series) <= runtime + 1, r.series
    ts = [p[0] for p in r.series]
    assert all(r.started <= t <= r.ended for t in ts), (r.started, ts, r.ended)
    assert all(0.9 < b - a < 1.1 for a, b in itertools.pairwise(ts)), ts
    assert all(p[2] is not None and p[2] > 0 for p in r.series)
    # the series is fio's own: fio's JSON summarises the same per-second IOPS samples
    d = _fio_json(r)["jobs"][0][r.direction]
    iops = [p[1] for p in r.series]
    assert (len(iops), min(iops), max(iops)) == (d["iops_samples"], d["iops_min"], d["iops_max"])
    assert sum(iops) / len(iops) == pytest.approx(d["iops_mean"], rel=1e-6)


def test_default_profiles_store_fios_figures(disk_dir: Path, tmp_path: Path) -> None:
    jobs = [j for p in fio.DEFAULT_PROFILES for j in fio.jobs_for(p)]
    seen: list[str] = []
    out = tmp_path / "artifacts"
    results = fio.run_jobs(disk_dir, jobs, runtime_s=RUNTIME, size_bytes=SIZE, out_dir=out,
                           on_job=lambda j: seen.append(j.name))
    assert seen == [j.name for j in jobs]
    assert _scratch_left(disk_dir) == []
    assert processes_mentioning(str(disk_dir)) == []
    assert [(r.job, r.direction) for r in results] == [
        ("randread-8k-qd1", "read"), ("randread-8k-qd32", "read"),
        ("randwrite-8k-qd1", "write"), ("randwrite-8k-qd32", "write"),
        ("wal-fdatasync-8k-qd1", "write"), ("seqwrite-1m-qd8", "write"),
    ]  # fmt: skip
    for r in results:
        assert r.path == str(disk_dir)
        assert r.json_file.parent == out and r.json_file.exists()
        assert {f.name for f in r.log_files} >= {f"{r.job}_iops.1.log", f"{r.job}_lat.1.log"}
        assert all(f.parent == out for f in r.log_files)
        _assert_figures_are_fios(r)
        _assert_series_sane(r, RUNTIME)
        assert [f for f in r.findings if f.kind == "cache"] == []  # direct I/O reaches the device here
        options = _fio_json(r)["jobs"][0]["job options"]
        assert options["runtime"] == f"{RUNTIME * 1000}ms"
        assert options["size"] == str(SIZE) and options["lat_percentiles"] == "1"
    wal = next(r for r in results if r.profile == "wal-fdatasync-8k")
    sync = _fio_json(wal)["jobs"][0]["sync"]["lat_ns"]
    writes = _fio_json(wal)["jobs"][0]["write"]["total_ios"]
    # one fdatasync per write; a time-based job can stop between its last write and that write's fdatasync
    assert writes - 1 <= sync["N"] <= writes
    assert wal.sync_lat_mean_ms is not None and wal.sync_lat_p99_ms is not None
    assert wal.sync_lat_mean_ms * 1e6 == pytest.approx(sync["mean"], rel=1e-9)
    assert wal.sync_lat_p99_ms * 1e6 == pytest.approx(sync["percentile"]["99.000000"], rel=1e-9)
    assert all(r.sync_lat_mean_ms is None for r in results if r is not wal)

    ceil = fio.ceilings(results)
    assert set(ceil) == {"commit_flush_per_s", "commit_flush_lat_ms", "randread_iops_qd32", "randwrite_iops_qd32",
                         "randread_lat_qd1_ms", "randwrite_lat_qd1_ms", "seqwrite_mb_s"}
    assert ceil["commit_flush_per_s"] == wal.iops
    # the write loop is serial: one commit costs write() + fdatasync, so the rate is about 1 / that latency
    assert ceil["commit_flush_lat_ms"] == pytest.approx(1000 / wal.iops, rel=0.1)
    assert ceil["randread_iops_qd32"] == next(r.iops for r in results if r.job == "randread-8k-qd32")
    assert ceil["seqwrite_mb_s"] == next(r.bw_mb_s for r in results if r.job == "seqwrite-1m-qd8")
    print({k: round(v, 3) for k, v in ceil.items()})


def test_mixed_gives_a_read_and_a_write_result_and_seqread(disk_dir: Path, tmp_path: Path) -> None:
    jobs = fio.jobs_for("mixed-70-30-8k") + fio.jobs_for("seqread-1m") + fio.jobs_for("seqread-8k")
    results = fio.run_jobs(disk_dir, jobs, runtime_s=2, size_bytes=SIZE, out_dir=tmp_path, ramp_s=0.5)
    assert [(r.job, r.direction) for r in results] == [
        ("mixed-70-30-8k-qd16", "read"), ("mixed-70-30-8k-qd16", "write"), ("seqread-1m-qd8", "read"),
        ("seqread-8k-qd1", "read"), ("seqread-8k-qd32", "read")]
    for r in results[3:]:  # page-sized and sequential, as fio ran them
        options = _fio_json(r)["jobs"][0]["job options"]
        assert (options["rw"], options["bs"]) == ("read", "8k"), options
    for r in results:
        _assert_figures_are_fios(r)
        _assert_series_sane(r, 2)
    read, write = results[0], results[1]
    assert read.json_file == write.json_file
    assert read.iops / (read.iops + write.iops) == pytest.approx(0.70, abs=0.05)
    assert _fio_json(read)["jobs"][0]["job options"]["ramp_time"] == "500ms"
    assert fio.ceilings(results) == {"seqread_mb_s": results[2].bw_mb_s}
    assert _scratch_left(disk_dir) == []


def test_page_cache_reads_are_flagged(disk_dir: Path, tmp_path: Path) -> None:
    """Buffered random reads of a file fio has just written (so it sits in the page cache): a custom job."""
    job_file = tmp_path / "cached.fio"
    job_file.write_text(textwrap.dedent("""\
        ; reads that never reach the device
        [global]
        bs=8k
        ioengine=psync
        direct=0
        # a flag without a value
        norandommap

        [cached-reads]
        rw=randread
        """))
    jobs = fio.custom_jobs(job_file)
    assert jobs == [JobSpec("cached-reads", "custom:cached.fio",
                            {"bs": "8k", "ioengine": "psync", "direct": "0", "norandommap": "", "rw": "randread"})]
    (r,) = fio.run_jobs(disk_dir, jobs, runtime_s=2, size_bytes=16 * 1024 * 1024, out_dir=tmp_path / "out")
    _assert_figures_are_fios(r)
    assert r.profile == "custom:cached.fio"
    assert r.lat_p50_ms < fio.CACHE_P50_US / 1000, r.lat_p50_ms
    (finding,) = [f for f in r.findings if f.kind == "cache"]
    assert "page cache" in finding.message and "µs" in finding.message
    assert _scratch_left(disk_dir) == []
    print(finding.message)


def test_custom_job_with_two_threads_is_one_group(disk_dir: Path, tmp_path: Path) -> None:
    job_file = tmp_path / "threads.fio"
    job_file.write_text("[two]\nrw=randread\nbs=8k\ndirect=1\nioengine=libaio\niodepth=4\nnumjobs=2\n")
    (r,) = fio.run_jobs(disk_dir, fio.custom_jobs(job_file), runtime_s=2, size_bytes=SIZE, out_dir=tmp_path / "o")
    _assert_figures_are_fios(r)  # one group_reporting entry in the JSON
    assert {f.name for f in r.log_files} >= {"two_iops.1.log", "two_iops.2.log"}
    assert r.ended - r.started == pytest.approx(2, abs=0.3)
    assert 1 <= len(r.series) <= 3
    per_thread = [[v for _, v, _ in fio.read_log(tmp_path / "o" / f"two_iops.{i}.log")] for i in (1, 2)]
    assert [p[1] for p in r.series] == [a + b for a, b in zip(*per_thread, strict=False)][: len(r.series)]
    assert _scratch_left(disk_dir) == []


def test_custom_job_file_errors(tmp_path: Path) -> None:
    f = tmp_path / "jobs.fio"
    with pytest.raises(UserError, match=r"fio job file .*jobs\.fio does not exist"):
        fio.custom_jobs(f)
    f.write_text("rw=read\n")
    with pytest.raises(UserError, match=r"jobs\.fio is not a valid fio job file"):
        fio.custom_jobs(f)
    f.write_text("[global]\nrw=read\n")
    with pytest.raises(UserError, match=r"jobs\.fio has no job section"):
        fio.custom_jobs(f)
    f.write_text("[a]\nrw=read\ndirectory=/mnt/x\n")
    with pytest.raises(UserError, match=r"jobs\.fio: job \[a\] sets directory="):
        fio.custom_jobs(f)
    f.write_text("[a]\nrw=read\nfilename=/dev/sdb\n")
    with pytest.raises(UserError, match=r"jobs\.fio: job \[a\] sets filename=/dev/sdb"):
        fio.custom_jobs(f)
    # [global] merged into every job, the job's own value wins, pglab's own options are dropped
    f.write_text("[global]\nbs=4k\niodepth=4\n[one]\nrw=read\nbs=16k\n[two]\nrw=write\nwrite_iops_log=x\n")
    one, two = fio.custom_jobs(f)
    assert one.options == {"bs": "16k", "iodepth": "4", "rw": "read"}
    assert two.options == {"bs": "4k", "iodepth": "4", "rw": "write"}


def test_fio_failure_ends_in_fios_words(disk_dir: Path, tmp_path: Path) -> None:
    f = tmp_path / "bad.fio"
    f.write_text("[bad]\nrw=sideways\n")
    with pytest.raises(fio.FioError, match=r"fio job bad on .* failed \(exit code \d+\): .*sideways"):
        fio.run_jobs(disk_dir, fio.custom_jobs(f), runtime_s=1, size_bytes=SIZE, out_dir=tmp_path / "out")
    assert _scratch_left(disk_dir) == []


def test_profiles() -> None:
    assert fio.DEFAULT_PROFILES == ("randread-8k", "randwrite-8k", "wal-fdatasync-8k", "seqwrite-1m")
    assert set(fio.DEFAULT_PROFILES) <= set(fio.PROFILE_NAMES)
    for name in fio.PROFILE_NAMES:
        for job in fio.jobs_for(name):
            assert job.profile == name and job.name.startswith(name)
            assert job.options["bs"] in ("8k", "1m")
    (wal,) = fio.jobs_for("wal-fdatasync-8k")
    assert wal.options == {"rw": "write", "bs": "8k", "iodepth": "1", "ioengine": "sync", "direct": "0",
                           "fdatasync": "1"}
    assert [j.options["iodepth"] for j in fio.jobs_for("randread-8k")] == ["1", "32"]
    with pytest.raises(UserError, match=r"unknown fio profile 'randread-4k'; valid profiles are: randread-8k, "):
        fio.jobs_for("randread-4k")


@pytest.mark.parametrize(("text", "expected"), [
    ("256MiB", 256 * 2**20), ("1G", 2**30), ("512m", 512 * 2**20), (1048576, 1048576), ("1048576", 1048576),
    ("8k", 8192), ("8KB", 8192), ("1.5g", 3 * 2**29), ("64 MiB", 64 * 2**20), ("100b", 100),
])  # fmt: skip
def test_parse_size(text: str | int, expected: int) -> None:
    assert fio.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "1x", "-1", "0", 0, "1.3k", "MiB", "1iB", True, "1.0000000000000001G"])
def test_parse_size_rejects(bad: str | int) -> None:
    with pytest.raises(ValueError):
        fio.parse_size(bad)


# ------------------------------------------------------------------ errors a user can cause
def test_missing_path_and_file_instead_of_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^--path .*/nope does not exist; create the directory"):
        fio.check_path(tmp_path / "nope", SIZE)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"^storage\.paths\.data .*/file is not a directory"):
        fio.check_path(tmp_path / "file", SIZE, field="storage.paths.data")
    out = tmp_path / "out"
    with pytest.raises(UserError, match="does not exist"):
        fio.run_jobs(tmp_path / "nope", fio.jobs_for("randread-8k"), runtime_s=1, size_bytes=SIZE, out_dir=out)
    assert not out.exists() and not (tmp_path / "nope").exists()  # nothing half-started


@pytest.fixture
def read_only_dir() -> Iterator[Path]:
    """A read-only bind mount (as root; root writes through file modes), else a directory under /proc."""
    if os.geteuid() != 0:
        d = Path(tempfile.mkdtemp(prefix="pglab-ro-", dir="/var/tmp"))
        d.chmod(0o555)
        yield d
        d.chmod(0o755)
        d.rmdir()
        return
    d = Path(tempfile.mkdtemp(prefix="pglab-ro-", dir="/var/tmp"))
    ok = subprocess.run(["mount", "--bind", str(d), str(d)], capture_output=True).returncode == 0
    if ok and subprocess.run(["mount", "-o", "remount,bind,ro", str(d)], capture_output=True).returncode == 0:
        try:
            yield d
        finally:
            subprocess.run(["umount", str(d)], check=False)
            d.rmdir()
        return
    if ok:
        subprocess.run(["umount", str(d)], check=False)
    d.rmdir()
    yield Path("/proc/self")


def test_read_only_path(read_only_dir: Path) -> None:
    with pytest.raises(UserError, match=r"^--path .* is not writable"):
        fio.check_path(read_only_dir, SIZE)


@pytest.fixture
def tiny_fs() -> Iterator[tuple[Path, int]]:
    """A 1 MiB tmpfs when we may mount one, else /var/tmp with its free space: (dir, bytes that do not fit)."""
    d = Path(tempfile.mkdtemp(prefix="pglab-tiny-", dir="/var/tmp"))
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)],
                                            capture_output=True).returncode == 0:
        try:
            yield d, 16 * 1024 * 1024
        finally:
            subprocess.run(["umount", str(d)], check=False)
            d.rmdir()
        return
    yield d, shutil.disk_usage(d).free + 1
    d.rmdir()


def test_too_little_space(tiny_fs: tuple[Path, int]) -> None:
    d, size = tiny_fs
    with pytest.raises(UserError, match=r"^--path .* has .* free but the fio profiles need .*; free some space"):
        fio.check_path(d, size)


def test_fio_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    msg = "fio is not installed; install it with ./setup.sh install (or apt-get install fio)."
    with pytest.raises(UserError) as err:
        fio.find_fio()
    assert str(err.value) == msg
    with pytest.raises(UserError, match="fio is not installed"):
        fio.run_jobs(tmp_path, fio.jobs_for("randread-8k"), runtime_s=1, size_bytes=SIZE, out_dir=tmp_path / "o")


def _has_direct_io(directory: Path) -> bool:
    probe = directory / ".odirect"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600))
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)  # the file is created even when O_DIRECT is refused
    return True


@pytest.fixture
def no_direct_io_dir() -> Iterator[Path]:
    """A directory on a filesystem without O_DIRECT: ramfs (as root), or tmpfs before Linux 6.6."""
    d = Path(tempfile.mkdtemp(prefix="pglab-ramfs-", dir="/var/tmp"))
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "ramfs", "ramfs", str(d)],
                                            capture_output=True).returncode == 0:
        try:
            yield d
        finally:
            subprocess.run(["umount", str(d)], check=False)
            d.rmdir()
        return
    d.rmdir()
    shm = Path(tempfile.mkdtemp(prefix="pglab-fio-shm-", dir="/dev/shm"))
    try:
        if _has_direct_io(shm):
            pytest.skip("no filesystem without direct I/O at hand (not root, and tmpfs has O_DIRECT here)")
        yield shm
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_path_without_direct_io_is_a_clear_error(no_direct_io_dir: Path, tmp_path: Path) -> None:
    assert not _has_direct_io(no_direct_io_dir)
    with pytest.raises(UserError, match=r"^--path .* is on a filesystem without direct I/O \(tmpfs\?\), which "
                                        r"job randread-8k-qd1 needs; give a directory on a block device\.$"):
        fio.run_jobs(no_direct_io_dir, fio.jobs_for("randread-8k"), runtime_s=1, size_bytes=SIZE, out_dir=tmp_path)
    assert list(no_direct_io_dir.iterdir()) == []


_INTERRUPTED = """
import signal
import sys
from pathlib import Path
from pglab.workloads import fio
# a shell's background jobs start with SIGINT ignored, and Python then keeps it ignored: restore the default
signal.signal(signal.SIGINT, signal.default_int_handler)
print("ready", flush=True)
try:
    fio.run_jobs(Path(sys.argv[1]), fio.jobs_for("randread-8k"), runtime_s=30, size_bytes=32 << 20,
                 out_dir=Path(sys.argv[2]))
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_sigint_removes_the_scratch_folder_and_fio(disk_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTED, str(disk_dir), str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(1.0)
        assert len(_scratch_left(disk_dir)) == 1
        assert any("fio" in p for p in processes_mentioning(str(disk_dir)))
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and out == "interrupted\n"
    assert _scratch_left(disk_dir) == []
    assert processes_mentioning(str(disk_dir)) == []


def test_run_interrupted_stops_fio(disk_dir: Path, tmp_path: Path) -> None:
    """The sweep's SIGINT/SIGTERM handler only records the signal; the wait for fio acts on it (RunInterrupted from
    pglab's own code): same cleanup."""
    with interrupt_signals():
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))  # a real signal, to this process
        timer.start()
        try:
            with pytest.raises(RunInterrupted, match="SIGTERM"):
                fio.run_jobs(disk_dir, fio.jobs_for("randwrite-8k"), runtime_s=30, size_bytes=SIZE,
                             out_dir=tmp_path)
        finally:
            timer.cancel()
    assert _scratch_left(disk_dir) == []
    assert processes_mentioning(str(disk_dir)) == []


# ------------------------------------------------------------------ detection on synthetic series
def _series(values: list[int] | list[float], lat: float | None = 0.1,
            t0: float = 1_700_000_000.0) -> list[tuple[float, float, float | None]]:
    return [(t0 + i + 1, v, lat) for i, v in enumerate(values)]


def test_burst_is_found_where_throughput_falls() -> None:
    series = _series([1000.0] * 10 + [300.0] * 10)
    (f,) = fio.detect(series, "write", {"rw": "randwrite", "bs": "8k"})
    assert f.kind == "burst"
    assert f.ts == series[9][0]  # the end of the 10th second, the last one at 1000
    assert f.before == pytest.approx(1000) and f.after == pytest.approx(300)
    assert f.message == "IOPS fell from 1000 to 300 (-70 %) after 10 s and stayed there: a burst credit running out?"


def test_burst_with_noise_is_found() -> None:
    noisy = [1000 + (37 * i % 11 - 5) * 20 for i in range(40)] + [250 + (17 * i % 7 - 3) * 10 for i in range(30)]
    (f,) = fio.detect(_series(noisy), "read", {"rw": "randread", "bs": "8k", "direct": "1"})
    assert f.kind == "burst" and f.before == pytest.approx(1000, rel=0.05) and f.after == pytest.approx(250, rel=0.1)
    assert f.ts == _series(noisy)[39][0]


@pytest.mark.parametrize("values", [
    [1000.0] * 20,                                    # flat
    [1000 + (i % 3 - 1) * 100 for i in range(30)],   # ±10 % noise
    [1000.0] * 8 + [200.0] * 3 + [1000.0] * 8,       # a dip that recovers
    [1000.0] * 8 + [600.0] * 7 + [1000.0] * 3,       # -40 % … but it comes back at the end
    [1000.0] * 8 + [750.0] * 10,                     # -25 %: below the threshold
    [1000.0, 1000.0, 1000.0, 100.0, 100.0],          # too short to tell
    [100.0] * 10 + [1000.0] * 10,                    # a rise, not a fall
])  # fmt: skip
def test_no_burst(values: list[float]) -> None:
    assert fio.detect(_series(values), "write", {"bs": "8k"}) == []


def test_cache_findings() -> None:
    opts = {"rw": "randread", "bs": "8k", "direct": "1"}
    fast = _series([200_000.0] * 5, lat=0.004)
    (f,) = fio.detect(fast, "read", opts)
    assert f.kind == "cache" and f.ts is None and "4.0 µs" in f.message and "a cache" in f.message
    (f,) = fio.detect(fast, "read", {**opts, "direct": "0"}, lat_p50_ms=0.002)
    assert "median latency is 2.0 µs" in f.message and "page cache" in f.message
    assert fio.detect(fast, "read", opts, lat_p50_ms=0.080) == []  # fio's median wins over the series
    assert fio.detect(fast, "write", opts) == []  # a write cache is a different story
    assert fio.detect(_series([40_000.0] * 5, lat=0.8), "read", opts) == []
    huge = _series([20_000.0] * 5, lat=0.4)  # 20 000 x 1 MiB/s = 19.5 GiB/s
    (f,) = fio.detect(huge, "read", {"rw": "read", "bs": "1m", "direct": "1"})
    assert f.kind == "cache" and "GiB/s" in f.message


def _result(path: str, profile: str, job: str, direction: str, iops: float, **kw: float) -> FioResult:
    figures = {"bw_mb_s": 0.0, "lat_mean_ms": 0.0, "lat_p50_ms": 0.0, "lat_p99_ms": 0.0, "lat_p999_ms": 0.0, **kw}
    return FioResult(path=path, profile=profile, job=job, direction=direction, iops=iops, started=0.0, ended=1.0,
                     series=[], findings=[], json_file=Path("x.json"), log_files=[], **figures)  # type: ignore[arg-type]


def test_ceilings_only_what_was_measured() -> None:
    results = [
        _result("/d", "randread-8k", "randread-8k-qd1", "read", 9000, lat_mean_ms=0.11),
        _result("/d", "randread-8k", "randread-8k-qd32", "read", 40000),
        _result("/d", "randread-8k", "randread-8k-qd32", "read", 30000),  # a repeat: averaged
        _result("/d", "mixed-70-30-8k", "mixed-70-30-8k-qd16", "read", 15000),
    ]
    assert fio.ceilings(results) == {"randread_iops_qd32": 35000, "randread_lat_qd1_ms": 0.11}
    assert fio.ceilings([]) == {}
    with pytest.raises(ValueError, match="one path"):
        fio.ceilings([*results, _result("/wal", "randread-8k", "randread-8k-qd32", "read", 1)])


def test_fio_left_by_a_killed_pglab_is_stopped_by_the_next_command(disk_dir: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "pglab.cli", "fio", "--path", str(disk_dir), "--profile",
                             "randwrite-8k", "--runtime", "60s", "--size", "16MiB", "--results", str(tmp_path / "r")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    def fio_running() -> bool:
        for line in processes_mentioning(str(disk_dir)):
            try:
                if Path(f"/proc/{line.split(':', 1)[0]}/comm").read_text().strip() == "fio":
                    return True
            except OSError:
                continue
        return False

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not fio_running():
        time.sleep(0.1)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert processes_mentioning(str(disk_dir)), "fio should outlive the killed pglab"
    assert _scratch_left(disk_dir)
    cleaned = pglab("lab", "clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert f"left behind by pglab pid {proc.pid}" in cleaned.stderr and "fio process" in cleaned.stderr
    assert processes_mentioning(str(disk_dir)) == []
    assert _scratch_left(disk_dir) == []
