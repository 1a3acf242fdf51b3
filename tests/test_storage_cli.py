"""`pglab fio`: the profile table from real fio on this machine's disk, figures as fio's JSON has them."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import pglab

pytestmark = pytest.mark.postgres


@pytest.fixture
def scratch() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="pglab-fio-cli-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_pglab_fio_prints_the_profile_table_with_fio_figures(scratch: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    args = ["fio", "--path", str(scratch), "--profile", "randread-8k", "--profile", "wal-fdatasync-8k",
            "--runtime", "2s", "--size", "16MiB", "--results", str(results)]
    table = pglab(*args, check=True).stdout
    for header in ("path", "device", "profile", "IOPS", "MB/s", "latency of", "lat mean ms", "p99 ms", "p99.9 ms"):
        assert header in table
    assert "randread-8k-qd32" in table and "wal-fdatasync-8k" in table
    wal = next(line for line in table.splitlines() if "wal-fdatasync-8k" in line and "│" in line)
    assert "│ fdatasync " in wal  # its latency columns are what a commit waits for; the write() alone below
    assert "wal-fdatasync-8k-qd1: write() alone: mean" in table
    listed = pglab("report", str(results), "--format", "csv", check=True).stdout
    rows = list(csv.DictReader(io.StringIO(listed)))
    assert {r["profile"] for r in rows} == {"randread-8k-qd1", "randread-8k-qd32", "wal-fdatasync-8k-qd1"}
    for row in rows:
        whole = json.loads((results / row["json_file"]).read_text())["jobs"][0]
        job = whole[row["direction"]]
        assert float(row["iops"]) == job["iops"]
        assert float(row["io_lat_mean_ms"]) == pytest.approx(job["lat_ns"]["mean"] / 1e6, rel=1e-12)
        assert float(row["io_lat_p99_ms"]) == pytest.approx(job["lat_ns"]["percentile"]["99.000000"] / 1e6,
                                                            rel=1e-12)
        # the latency the table shows: the fdatasync's for the WAL profile (what a commit waits for), named so
        shown = whole["sync"]["lat_ns"] if row["profile"].startswith("wal-") else job["lat_ns"]
        assert row["lat_of"] == ("fdatasync" if row["profile"].startswith("wal-") else "I/O")
        assert float(row["lat_mean_ms"]) == pytest.approx(shown["mean"] / 1e6, rel=1e-12)
        assert (float(row["fdatasync_lat_mean_ms"]) == pytest.approx(whole["sync"]["lat_ns"]["mean"] / 1e6, rel=1e-12)
                if row["profile"].startswith("wal-") else row["fdatasync_lat_mean_ms"] == "")
        assert float(row["mb_s"]) == pytest.approx(job["bw_bytes"] / 1048576, rel=1e-12)
    assert not list(scratch.iterdir())  # test files removed


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--path", "/nonexistent/pglab"], "--path /nonexistent/pglab does not exist"),
        (["--profile", "bogus"], "--profile"),
        (["--size", "1000000GiB"], "free"),
        (["--runtime", "soon"], "runtime"),
    ],
)
def test_pglab_fio_bad_input_is_one_sentence_and_exit_2(scratch: Path, tmp_path: Path, extra: list[str],
                                                        expected: str) -> None:
    args = ["fio", "--results", str(tmp_path / "r")]
    if "--path" not in extra:
        args += ["--path", str(scratch)]
    proc = pglab(*args, *extra)
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
    assert not list(scratch.iterdir())


def test_pglab_fio_as_the_readme_writes_it(scratch: Path, tmp_path: Path) -> None:
    """A relative --path and the default results folder: fio runs inside the results folder, so the path given
    must still name the folder the user meant."""
    relative = os.path.relpath(scratch, tmp_path)
    proc = pglab("fio", "--path", relative, "--profile", "randread-8k", "--runtime", "1s", "--size", "16MiB",
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "failed" not in proc.stderr and "randread-8k-qd32" in proc.stdout
    results = proc.stderr.strip().splitlines()[-1].removeprefix("results: ")
    assert results.startswith("results/fio-") and (tmp_path / results / "results.db").is_file()
    assert not list(scratch.iterdir())  # test files removed


def test_a_storage_only_folder_has_no_database_table(scratch: Path, tmp_path: Path) -> None:
    """`report --table database` on a `pglab fio` folder says so in one sentence, exit 2 (it printed nothing, 0)."""
    results = tmp_path / "results"
    pglab("fio", "--path", str(scratch), "--profile", "randread-8k", "--runtime", "1s", "--size", "8MiB",
          "--results", str(results), check=True)
    for fmt in ("table", "csv"):
        proc = pglab("report", str(results), "--table", "database", "--format", fmt)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stdout == "" and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "error: --table: sweep 1 has no database table: it measured storage alone (pglab fio), no pgbench point; "
            "see the tables it has with no --table."]
    assert "randread-8k-qd1" in pglab("report", str(results), "--table", "storage", check=True).stdout


def test_pglab_fio_holds_its_folder_and_resumes_after_an_interrupt(scratch: Path, tmp_path: Path) -> None:
    """`pglab fio` is a sweep as `pglab run`'s: while one writes a folder, a second is refused in one sentence
    (exit 2, nothing measured); Ctrl-C ends the first (exit 130), and the same command again resumes its sweep:
    one sweep, done, each job stored once."""
    results = tmp_path / "r"
    # 10 s a job: long enough for a second pglab to start and be refused on a loaded machine
    args = ["fio", "--path", str(scratch), "--profile", "randwrite-8k", "--runtime", "10s", "--size", "16MiB",
            "--results", str(results)]
    first = subprocess.Popen([sys.executable, "-m", "pglab.cli", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # fio's own scratch folder: the storage phase has begun, under the lock
        while time.monotonic() < deadline and not [p for p in scratch.iterdir() if p.is_dir()]:
            time.sleep(0.05)
        second = pglab(*args)
        assert second.returncode == 2, second.stderr
        assert second.stderr.splitlines() == [
            f"error: --results: '{results}' is being written by another pglab (pid {first.pid}); wait for it to end "
            "or choose another folder."]
        assert first.poll() is None, "the first pglab fio ended before it could be interrupted"
        first.send_signal(signal.SIGINT)
        _, stderr = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, stderr
    assert stderr.splitlines()[-1] == "interrupted: fio stopped and its test files removed."
    assert not list(scratch.iterdir())
    [sweep] = json.loads(pglab("sweeps", str(results), "-f", "json", check=True).stdout)
    assert (sweep["sweep"], sweep["status"], sweep["plan"]) == (1, "interrupted", "fio")

    again = pglab(*args, "-f", "csv", check=True)  # the format is no part of the sweep's identity
    assert again.stderr.splitlines()[-1] == f"results: {results} (sweep 1 resumed; --force-new starts a new one)"
    assert sorted(r["profile"] for r in csv.DictReader(io.StringIO(again.stdout))) == [
        "randwrite-8k-qd1", "randwrite-8k-qd32"]
    [sweep] = json.loads(pglab("sweeps", str(results), "-f", "json", check=True).stdout)
    assert (sweep["sweep"], sweep["status"]) == (1, "done")
    assert not list(scratch.iterdir())
