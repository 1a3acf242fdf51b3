"""fio on the paths PostgreSQL will use: profiles, one run per job, figures exactly as fio's JSON has them.

Each job runs as its own ``fio`` process (JSON output and 1 s-averaged IOPS/latency logs kept in ``out_dir``)
inside a fresh scratch folder ``.pglab-fio-<random>`` under the measured path, which is always removed, also
when the run is interrupted. The built-in profiles share one data file per scratch folder, laid out once with
real writes (``overwrite=1``): reads need data, and PostgreSQL's WAL segments are pre-written files that get
overwritten, so the commit profile must not pay for allocating blocks.

Profiles: docs/methodology.md's table (8 KiB: PostgreSQL's page). Their queue depths: 1 for one backend's
latency, 32 for the IOPS ceiling; 8 for 1 MiB (8 MiB in flight reaches the bandwidth of a cloud volume or an NVMe
drive, deeper adds latency, not MB/s); 16 for the mix (a loaded OLTP database). ``wal-fdatasync-8k`` is what a commit
does with ``wal_sync_method=fdatasync`` (Linux's default): fio reports the ``write()`` under ``write`` and the
``fdatasync`` under ``sync``; a commit costs both, so its write result carries the sync latency (``sync_lat_*``) and
its IOPS is the commit rate.

A custom job file (``custom_jobs``) gives one job per section, [global] merged in; pglab still decides
where fio writes (a scratch folder under the path: ``directory`` and absolute file names are refused) and
what it logs, and runs are time based; the file's own ``size``, ``runtime`` or ``ramp_time`` win over the
command's. ``numjobs`` > 1 is reported as one group (``group_reporting``), its series summed over threads.

Timestamps: fio writes its logs with ``log_unix_epoch=1``, so every per-second point is already on the epoch
clock (the end of its 1 s window). fio 3.33 does not log the last, unfinished window of the IOPS log, so a
job of N seconds usually yields N-1 or N points; latency points are paired with the IOPS point of the same
window. ``started`` is the start of fio's measured window (after ramp), ``ended`` its end.

Detection on a result (thresholds and why):

- **burst** — cloud volumes serve a burst allowance and then fall to their baseline. The series is split
  where a two-level step fits best (least squares, at least ``BURST_MIN_S`` = 3 s on each side); it is a burst
  when the mean after is more than ``BURST_DROP`` = 30 % below the mean before *and* the last 3 s are still
  that low (a dip that recovers is not a credit running out). 30 % is well outside the second-to-second noise
  of a steady device (a few %) and well inside the drops seen in practice (typically 3x-10x).
- **cache** — reads served from memory instead of the device. A read is "from a cache" when its median
  latency is below ``CACHE_P50_US`` = 10 µs: the page cache answers in 1-5 µs, while the fastest flash
  (Z-NAND, XL-Flash) needs 12-20 µs and ordinary NVMe 60-100 µs end to end. Or when the read bandwidth
  exceeds ``CACHE_READ_GIB_S`` = 16 GiB/s, above what a single PCIe 5.0 x4 device can transfer (~14 GB/s).
  A cache in front of a virtual disk on the host (30-60 µs) cannot be told from a fast device this way.
"""

from __future__ import annotations

import bisect
import configparser
import contextlib
import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pglab import interrupts
from pglab.errors import UserError
from pglab.plan.load import fio_job_file_problem
from pglab.targets.local import procs, registry
from pglab.units import human_bytes, parse_size

PROFILE_NAMES: tuple[str, ...] = (
    "randread-8k",
    "randwrite-8k",
    "wal-fdatasync-8k",
    "seqread-8k",
    "seqwrite-8k",
    "seqread-1m",
    "seqwrite-1m",
    "mixed-70-30-8k",
)
DEFAULT_PROFILES: tuple[str, ...] = ("randread-8k", "randwrite-8k", "wal-fdatasync-8k", "seqwrite-1m")

BURST_DROP = 0.30  # a fall of more than 30 % of the mean IOPS …
BURST_MIN_S = 3  # … with at least 3 s before and after the change, still low in the last 3 s
CACHE_P50_US = 10.0  # reads with a median latency below 10 µs come from memory
CACHE_READ_GIB_S = 16.0  # reads faster than any single device can transfer
SPACE_MARGIN = 64 * 1024 * 1024  # free space needed beyond the data file: logs, the filesystem's own needs
SEQ_IODEPTH = 8
MIXED_IODEPTH = 16
DATA_FILE = "pglab-fio.dat"
MIB = 1024 * 1024

_STOP_GRACE_S = 5.0
# options that decide where fio writes and what it logs: pglab sets them, a custom job file may not
_FORBIDDEN = ("directory", "opendir")
_PGLAB_OWNED = (
    "name", "output", "output-format", "write_iops_log", "write_lat_log", "write_bw_log", "log_avg_msec",
    "log_unix_epoch", "lat_percentiles", "eta",
)  # fmt: skip


@dataclass(frozen=True)
class JobSpec:
    """One fio job: its name (also the artifacts' names), the profile it belongs to, its fio options."""

    name: str
    profile: str
    options: dict[str, str]


@dataclass
class Finding:
    kind: str  # "burst" | "cache"
    ts: float | None  # epoch seconds where the change happens (burst); None for cache
    before: float | None
    after: float | None
    message: str


@dataclass
class FioResult:
    """One job x one direction that did I/O; the figures are fio's JSON ones, in ms and MiB/s."""

    path: str
    profile: str
    job: str
    direction: str  # "read" | "write"
    iops: float
    bw_mb_s: float
    lat_mean_ms: float
    lat_p50_ms: float
    lat_p99_ms: float
    lat_p999_ms: float
    started: float
    ended: float
    series: list[tuple[float, float, float | None]]  # (epoch ts at the end of the second, IOPS, mean lat ms)
    findings: list[Finding]
    json_file: Path
    log_files: list[Path]
    # the fdatasync after each write (wal-fdatasync-8k): fio's "sync" latency, None when the job did not sync
    sync_lat_mean_ms: float | None = None
    sync_lat_p50_ms: float | None = None
    sync_lat_p99_ms: float | None = None
    sync_lat_p999_ms: float | None = None
    options: dict[str, str] = field(default_factory=dict)


class FioError(Exception):
    """fio failed while running a job; the message carries fio's own last words."""


# ------------------------------------------------------------------ profiles
def _direct(rw: str, bs: str, iodepth: int) -> dict[str, str]:
    return {"rw": rw, "bs": bs, "iodepth": str(iodepth), "ioengine": "libaio", "direct": "1"}


def jobs_for(profile: str) -> list[JobSpec]:
    """The fio jobs of a built-in profile."""
    if profile in ("randread-8k", "randwrite-8k", "seqread-8k", "seqwrite-8k"):
        rw = {"seqread": "read", "seqwrite": "write"}.get(profile.split("-")[0], profile.split("-")[0])
        return [JobSpec(f"{profile}-qd{qd}", profile, _direct(rw, "8k", qd)) for qd in (1, 32)]
    if profile == "wal-fdatasync-8k":
        opts = {"rw": "write", "bs": "8k", "iodepth": "1", "ioengine": "sync", "direct": "0", "fdatasync": "1"}
        return [JobSpec(f"{profile}-qd1", profile, opts)]
    if profile in ("seqread-1m", "seqwrite-1m"):
        rw = "read" if profile == "seqread-1m" else "write"
        return [JobSpec(f"{profile}-qd{SEQ_IODEPTH}", profile, _direct(rw, "1m", SEQ_IODEPTH))]
    if profile == "mixed-70-30-8k":
        opts = {**_direct("randrw", "8k", MIXED_IODEPTH), "rwmixread": "70"}
        return [JobSpec(f"{profile}-qd{MIXED_IODEPTH}", profile, opts)]
    raise UserError(f"unknown fio profile {profile!r}; valid profiles are: {', '.join(PROFILE_NAMES)}.")


def custom_jobs(job_file: Path) -> list[JobSpec]:
    """The jobs of a user's fio job file; [global] options are merged into each job (the job's own win)."""
    job_file = Path(job_file)
    where = f"fio job file {job_file}"
    parser = configparser.ConfigParser(allow_no_value=True, strict=False, interpolation=None,
                                       default_section="\0no default section")
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # fio option names are case-sensitive
    try:
        text = job_file.read_text()
    except FileNotFoundError:
        raise UserError(f"{where} does not exist; give the path of an existing fio job file.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{where} cannot be read ({exc}); give a readable text fio job file.") from None
    try:
        parser.read_string(text, source=str(job_file))
    except configparser.Error as exc:
        first = str(exc).splitlines()[0]
        raise UserError(f"{where} is not a valid fio job file ({first}); fix it or check it with fio.") from None
    glob: dict[str, str] = {}
    jobs: list[JobSpec] = []
    for section in parser.sections():
        options = {k: "" if v is None else v.strip() for k, v in parser.items(section)}
        if section == "global":
            glob.update(options)
            continue
        merged = {**glob, **options}
        for key in _FORBIDDEN:
            if key in merged:
                raise UserError(f"{where}: job [{section}] sets {key}=; remove it, pglab runs every job in a "
                                f"scratch folder under the measured path.")
        for key in ("filename", "filename_format"):
            for part in re.split(r"(?<!\\):", merged.get(key, "")):
                if part.startswith("/") or ".." in Path(part).parts:
                    raise UserError(f"{where}: job [{section}] sets {key}={merged[key]}; use a name relative "
                                    f"to the job's directory (pglab runs it in a scratch folder under the path).")
        for key in _PGLAB_OWNED:
            merged.pop(key, None)
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", section).strip("-") or "job"
        jobs.append(JobSpec(name, f"custom:{job_file.name}", merged))
    if problem := fio_job_file_problem(text):  # after the checks above, whose advice is more precise
        raise UserError(f"{where}: {problem}.")
    if not jobs:
        raise UserError(f"{where} has no job section; add one, e.g. [myjob] with rw=randread.")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise UserError(f"{where} has two jobs with the same name ({', '.join(names)}); rename one.")
    return jobs


# ------------------------------------------------------------------ checks
def find_fio() -> str:
    found = shutil.which("fio")
    if found is None:
        raise UserError("fio is not installed; install it with ./setup.sh install (or apt-get install fio).")
    return found


def check_path(path: Path, size_bytes: int, field: str = "--path") -> None:
    """UserError (one sentence naming the field and the path, and what to do) unless fio can write
    ``size_bytes`` in ``path``."""
    path = Path(path)
    what = f"{field} {path}"
    if not path.exists():
        raise UserError(f"{what} does not exist; create the directory or give an existing one.")
    if not path.is_dir():
        raise UserError(f"{what} is not a directory; give the directory PostgreSQL will use.")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{what} is not writable by this user; fix its permissions or mount, or give another "
                        f"directory.")
    try:  # os.access does not see everything (root on NFS, ACLs, a full inode table)
        fd, probe = tempfile.mkstemp(prefix=".pglab-fio-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(f"{what} is not writable ({exc.strerror}); fix its permissions or mount, or give "
                        f"another directory.") from None
    usage = shutil.disk_usage(path)
    free = usage.free
    need = size_bytes + SPACE_MARGIN
    if usage.total > 0 and free < need:  # a filesystem of no stated size (ramfs) cannot be checked
        raise UserError(f"{what} has {human_bytes(free)} free but the fio profiles need {human_bytes(need)} "
                        f"({human_bytes(size_bytes)} of data + {human_bytes(SPACE_MARGIN)} margin); free some space or "
                        f"use a smaller size.")


# ------------------------------------------------------------------ running
def _escape(path: Path | str) -> str:
    return str(path).replace(":", "\\:")  # fio splits directory and filename lists on ':'


def _ms(seconds: float) -> str:
    return f"{max(0, round(seconds * 1000))}ms"


def _command(fio: str, job: JobSpec, scratch: Path, out_dir: Path, runtime_s: float, size_bytes: int,
             ramp_s: float, builtin: bool) -> list[str]:
    cmd = [fio, f"--name={job.name}", f"--directory={_escape(scratch)}"]
    if builtin:
        cmd += [f"--filename={DATA_FILE}", "--overwrite=1"]
    cmd += ["--time_based", f"--runtime={_ms(runtime_s)}", f"--size={size_bytes}"]
    if ramp_s > 0:
        cmd.append(f"--ramp_time={_ms(ramp_s)}")
    cmd += [f"--{k}={v}" if v else f"--{k}" for k, v in job.options.items()]  # a custom job's runtime/size win
    if _numjobs(job) > 1:
        cmd.append("--group_reporting")
    prefix = out_dir / job.name
    cmd += [
        "--lat_percentiles=1",
        f"--write_iops_log={prefix}",
        f"--write_lat_log={prefix}",
        "--log_avg_msec=1000",
        "--log_unix_epoch=1",
        "--eta=never",
        "--output-format=json",
        f"--output={out_dir / (job.name + '.json')}",
    ]
    return cmd


def _numjobs(job: JobSpec) -> int:
    try:
        return max(1, int(job.options.get("numjobs", "1")))
    except ValueError:
        return 1


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """fio and whatever it forked, by process group: SIGTERM (fio removes its shared memory), then SIGKILL."""
    procs.end_group(proc, signal.SIGTERM, _STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):  # stragglers of the group after fio exited
        os.killpg(proc.pid, signal.SIGKILL)


def _check_direct_io(scratch: Path, jobs: Sequence[JobSpec], path: Path, field: str) -> None:
    needs = [j.name for j in jobs if j.options.get("direct", "0") not in ("0", "")]
    if not needs or not hasattr(os, "O_DIRECT"):
        return
    probe = scratch / ".direct-io-check"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
    except OSError as exc:
        probe.unlink(missing_ok=True)  # created even when O_DIRECT is refused
        if exc.errno != errno.EINVAL:
            raise
        raise UserError(f"{field} {path} is on a filesystem without direct I/O (tmpfs?), which job {needs[0]} "
                        f"needs; give a directory on a block device.") from None
    os.close(fd)
    probe.unlink()


def run_jobs(path: Path, jobs: Sequence[JobSpec], *, runtime_s: float, size_bytes: int, out_dir: Path,
             ramp_s: float = 0, on_job: Callable[[JobSpec], None] | None = None,
             field: str = "--path") -> list[FioResult]:
    """Run each job in sequence on ``path`` and parse its JSON and logs (kept in ``out_dir``).

    The scratch folder under ``path`` is removed at the end; on any exception (KeyboardInterrupt, and the
    RunInterrupted a recorded signal raises in the wait for fio) fio is stopped first, then the exception
    propagates."""
    if runtime_s <= 0:
        raise ValueError(f"runtime_s must be positive, not {runtime_s}")
    if size_bytes <= 0:
        raise ValueError(f"size_bytes must be positive, not {size_bytes}")
    path = Path(path)
    fio = find_fio()
    need = size_bytes
    for job in jobs:
        with contextlib.suppress(ValueError):  # "size=50%" and the like: fio decides
            need = max(need, parse_size(job.options.get("size", "1")) * _numjobs(job))
    check_path(path, need, field)
    largest_bs = max((parse_size(j.options["bs"]) for j in jobs if _is_size(j.options.get("bs"))), default=0)
    if size_bytes < largest_bs:
        raise UserError(f"size {human_bytes(size_bytes)} is smaller than the block size of the jobs "
                        f"({human_bytes(largest_bs)}); use a larger size.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[FioResult] = []
    scratch: Path | None = None
    try:
        scratch = Path(tempfile.mkdtemp(prefix=".pglab-fio-", dir=path))
        registry.register(scratch, [])  # if pglab is killed, the next pglab stops this fio and removes its files
        _check_direct_io(scratch, jobs, path, field)
        for job in jobs:
            if on_job is not None:
                on_job(job)
            builtin = not job.profile.startswith("custom:")
            cmd = _command(fio, job, scratch, out_dir, runtime_s, size_bytes, ramp_s, builtin)
            results += _run_one(cmd, job, path, out_dir)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
            registry.unregister(scratch)
    return results


def _is_size(text: str | None) -> bool:
    try:
        parse_size(text or "")
    except ValueError:
        return False
    return True


def _run_one(cmd: list[str], job: JobSpec, path: Path, out_dir: Path) -> list[FioResult]:
    json_file = out_dir / f"{job.name}.json"
    err_file = out_dir / f"{job.name}.stderr"
    for stale in [json_file, *_log_files(out_dir, job)]:
        stale.unlink(missing_ok=True)
    proc: subprocess.Popen[bytes] | None = None
    with open(err_file, "wb") as err:
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT,
                                    cwd=out_dir, start_new_session=True)
            rc = interrupts.wait(proc)  # a recorded Ctrl-C or SIGTERM ends the wait: fio is stopped below
        except BaseException:
            if proc is not None:
                _stop(proc)
            raise
    words = err_file.read_text(errors="replace").strip()
    if not words:
        err_file.unlink()
    data = _read_json(json_file)
    if rc != 0 or data is None or not data.get("jobs") or data["jobs"][0].get("error"):
        lines = [line.strip() for line in words.splitlines() if line.strip()]
        said = [line for line in lines if line.startswith("fio:")] or lines[-2:]
        last = " / ".join(said[:2]) or "no message"
        raise FioError(f"fio job {job.name} on {path} failed (exit code {rc}): {last}")
    return parse_results(data, job, str(path), json_file, _log_files(out_dir, job))


def _read_json(json_file: Path) -> dict[str, Any] | None:
    try:
        text = json_file.read_text()
    except FileNotFoundError:
        return None
    start = text.find("{")  # fio may print a warning before the JSON
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except json.JSONDecodeError:
        return None


def _log_files(out_dir: Path, job: JobSpec) -> list[Path]:
    found = []
    for kind in ("iops", "lat", "clat", "slat"):
        for i in range(1, _numjobs(job) + 1):
            f = out_dir / f"{job.name}_{kind}.{i}.log"
            if f.exists():
                found.append(f)
    return found


# ------------------------------------------------------------------ parsing
_DIR_CODE = {"read": 0, "write": 1}


def read_log(file: Path) -> list[tuple[float, float, int]]:
    """(epoch s, value, direction code) per line of a fio log written with ``log_unix_epoch=1``."""
    out = []
    for line in file.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            out.append((int(parts[0]) / 1000.0, float(parts[1]), int(parts[2])))
        except ValueError:
            continue
    return out


def _series(log_files: Sequence[Path], job: str, direction: str) -> list[tuple[float, float, float | None]]:
    """Per-second (ts, IOPS, mean latency ms) of one direction, summed over the job's threads."""
    code = _DIR_CODE[direction]
    per_thread: list[list[tuple[float, float, float | None]]] = []
    files = {f.name: f for f in log_files}
    thread = 1
    while f"{job}_iops.{thread}.log" in files:
        iops = [(t, v) for t, v, d in read_log(files[f"{job}_iops.{thread}.log"]) if d == code]
        lat_file = files.get(f"{job}_lat.{thread}.log")
        lat = sorted((t, k, v) for k, (t, v, d) in enumerate(read_log(lat_file) if lat_file else []) if d == code)
        lat_ts = [t for t, _, _ in lat]
        points: list[tuple[float, float, float | None]] = []
        for t, v in iops:
            # the latency sample of the same window: the nearest in time, the earlier of two at the same time
            # (fio writes the last window's remainder at exit with the same timestamp)
            lo = bisect.bisect_left(lat_ts, t - 0.5)
            near = [(abs(lat[j][0] - t), j) for j in range(lo, min(lo + 4, len(lat))) if abs(lat[j][0] - t) < 0.5]
            points.append((t, v, lat[min(near)[1]][2] / 1e6 if near else None))
        per_thread.append(points)
        thread += 1
    if not per_thread:
        return []
    if len(per_thread) == 1:
        return per_thread[0]
    merged = []
    for k in range(min(len(p) for p in per_thread)):
        row = [p[k] for p in per_thread]
        total = sum(r[1] for r in row)
        lats = [(r[1], r[2]) for r in row if r[2] is not None]
        weight = sum(w for w, _ in lats)
        lat_ms = sum(w * v for w, v in lats) / weight if lats and weight > 0 else None
        merged.append((max(r[0] for r in row), total, lat_ms))
    return merged


def _pct(lat: dict[str, Any], key: str) -> float:
    return float(lat.get("percentile", {}).get(key, math.nan)) / 1e6


def parse_results(data: dict[str, Any], job: JobSpec, path: str, json_file: Path,
                  log_files: list[Path]) -> list[FioResult]:
    """The results of one fio JSON (one job, or one group with group_reporting) and its logs."""
    j = data["jobs"][0]
    # each direction's "runtime" (ms): job_runtime is summed over the threads under group_reporting
    runtime_s = max(float(j.get(d, {}).get("runtime", 0)) for d in ("read", "write", "trim")) / 1000.0
    ended = float(data.get("timestamp_ms", data.get("timestamp", time.time()) * 1000)) / 1000.0
    first_iops = [t for f in log_files if "_iops." in f.name for t, _, _ in read_log(f)]
    started = ended - runtime_s
    if first_iops:  # the log's zero is the start of fio's measured window; its first point ends second one
        started = min(started, min(first_iops) - 1.0)
    all_ts = [t for f in log_files for t, _, _ in read_log(f)]
    if all_ts:
        ended = max(ended, max(all_ts))
    sync = j.get("sync", {}).get("lat_ns", {})
    results = []
    for direction in ("read", "write"):
        d = j.get(direction, {})
        if not d.get("total_ios") and not d.get("io_bytes"):
            continue
        lat = d["lat_ns"]
        series = _series(log_files, job.name, direction)
        has_sync = direction == "write" and sync.get("N", 0) > 0
        result = FioResult(
            path=path,
            profile=job.profile,
            job=job.name,
            direction=direction,
            iops=d["iops"],
            bw_mb_s=d["bw_bytes"] / MIB,
            lat_mean_ms=lat["mean"] / 1e6,
            lat_p50_ms=_pct(lat, "50.000000"),
            lat_p99_ms=_pct(lat, "99.000000"),
            lat_p999_ms=_pct(lat, "99.900000"),
            started=started,
            ended=ended,
            series=series,
            findings=[],
            json_file=json_file,
            log_files=list(log_files),
            sync_lat_mean_ms=sync["mean"] / 1e6 if has_sync else None,
            sync_lat_p50_ms=_pct(sync, "50.000000") if has_sync else None,
            sync_lat_p99_ms=_pct(sync, "99.000000") if has_sync else None,
            sync_lat_p999_ms=_pct(sync, "99.900000") if has_sync else None,
            options=dict(job.options),
        )
        result.findings = detect(series, direction, job.options, lat_p50_ms=result.lat_p50_ms)
        results.append(result)
    return results


# ------------------------------------------------------------------ detection
def _fmt(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def detect(series: Sequence[tuple[float, float, float | None]], direction: str, options: dict[str, str], *,
           lat_p50_ms: float | None = None) -> list[Finding]:
    """Burst and cache findings of one direction's per-second series (see the module's docstring).

    ``lat_p50_ms`` (fio's median) is the cache test's evidence when given; otherwise the IOPS-weighted mean
    of the per-second latencies is used."""
    findings = []
    burst = _burst(series)
    if burst is not None:
        findings.append(burst)
    if direction == "read":
        cache = _cache(series, options, lat_p50_ms)
        if cache is not None:
            findings.append(cache)
    return findings


def _burst(series: Sequence[tuple[float, float, float | None]]) -> Finding | None:
    ys = [float(p[1]) for p in series]
    n = len(ys)
    if n < 2 * BURST_MIN_S:
        return None
    prefix = [0.0]
    prefix_sq = [0.0]
    for y in ys:
        prefix.append(prefix[-1] + y)
        prefix_sq.append(prefix_sq[-1] + y * y)

    def sse(a: int, b: int) -> float:  # squared error of ys[a:b] around its mean
        s = prefix[b] - prefix[a]
        return prefix_sq[b] - prefix_sq[a] - s * s / (b - a)

    k = min(range(BURST_MIN_S, n - BURST_MIN_S + 1), key=lambda i: sse(0, i) + sse(i, n))
    before = prefix[k] / k
    after = (prefix[n] - prefix[k]) / (n - k)
    tail = sum(ys[-BURST_MIN_S:]) / BURST_MIN_S
    limit = (1 - BURST_DROP) * before
    if before <= 0 or after >= limit or tail >= limit:
        return None
    ts = series[k - 1][0]  # end of the last second at the higher level
    elapsed = ts - (series[0][0] - 1.0)
    drop = (after - before) / before * 100
    return Finding("burst", ts, before, after,
                   f"IOPS fell from {_fmt(before)} to {_fmt(after)} ({drop:+.0f} %) after {elapsed:.0f} s and "
                   f"stayed there: a burst credit running out?")


def _cache(series: Sequence[tuple[float, float, float | None]], options: dict[str, str],
           lat_p50_ms: float | None) -> Finding | None:
    where = "the page cache (direct=0)" if options.get("direct", "0") in ("0", "") else "a cache"
    lat_ms = lat_p50_ms
    label = "median"
    if lat_ms is None or math.isnan(lat_ms):
        pairs = [(iops, lat) for _, iops, lat in series if lat is not None and iops > 0]
        total = sum(i for i, _ in pairs)
        lat_ms = sum(i * v for i, v in pairs) / total if total > 0 else None
        label = "mean"
    if lat_ms is not None and lat_ms * 1000 < CACHE_P50_US:
        return Finding("cache", None, None, None,
                       f"reads' {label} latency is {lat_ms * 1000:.1f} µs, below any device's "
                       f"({CACHE_P50_US:.0f} µs): served from {where}, not the storage.")
    bs = options.get("bs")
    if series and _is_size(bs):
        ys = sorted(p[1] for p in series)
        median_iops = ys[len(ys) // 2]
        gib_s = median_iops * parse_size(bs or "") / 1024**3
        if gib_s > CACHE_READ_GIB_S:
            return Finding("cache", None, None, None,
                           f"reads run at {gib_s:.1f} GiB/s ({_fmt(median_iops)} IOPS), beyond what a single "
                           f"device transfers ({CACHE_READ_GIB_S:.0f} GiB/s): served from {where}.")
    return None


# ------------------------------------------------------------------ ceilings
def ceilings(results: Sequence[FioResult]) -> dict[str, float]:
    """The storage roofline of one path from its results: only the figures that were measured.

    commit_flush_per_s (and commit_flush_lat_ms: write + fdatasync), randread/randwrite IOPS at QD 32 and
    latency at QD 1, seqread/seqwrite MB/s (MiB/s). Repeated results of a job are averaged. Results of several
    paths raise ValueError: call it once per path."""
    paths = {r.path for r in results}
    if len(paths) > 1:
        raise ValueError(f"ceilings() takes the results of one path, got {sorted(paths)}")

    def mean_of(profile: str, job: str, direction: str, value: Callable[[FioResult], float | None]) -> float | None:
        vals = [value(r) for r in results if r.profile == profile and r.job == job and r.direction == direction]
        got = [float(v) for v in vals if v is not None]
        return sum(got) / len(got) if got else None

    wanted: dict[str, float | None] = {
        "commit_flush_per_s": mean_of("wal-fdatasync-8k", "wal-fdatasync-8k-qd1", "write", lambda r: r.iops),
        "commit_flush_lat_ms": mean_of(
            "wal-fdatasync-8k", "wal-fdatasync-8k-qd1", "write",
            lambda r: None if r.sync_lat_mean_ms is None else r.lat_mean_ms + r.sync_lat_mean_ms),
        "randread_iops_qd32": mean_of("randread-8k", "randread-8k-qd32", "read", lambda r: r.iops),
        "randwrite_iops_qd32": mean_of("randwrite-8k", "randwrite-8k-qd32", "write", lambda r: r.iops),
        "randread_lat_qd1_ms": mean_of("randread-8k", "randread-8k-qd1", "read", lambda r: r.lat_mean_ms),
        "randwrite_lat_qd1_ms": mean_of("randwrite-8k", "randwrite-8k-qd1", "write", lambda r: r.lat_mean_ms),
        "seqread_mb_s": mean_of("seqread-1m", f"seqread-1m-qd{SEQ_IODEPTH}", "read", lambda r: r.bw_mb_s),
        "seqwrite_mb_s": mean_of("seqwrite-1m", f"seqwrite-1m-qd{SEQ_IODEPTH}", "write", lambda r: r.bw_mb_s),
    }
    return {k: v for k, v in wanted.items() if v is not None}
