"""pglab.workloads.txlog against the former line-by-line reader, on logs in pgbench's -l format; the latency
histogram's bounded error when merged; compressed logs read back."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pglab.scenarios.figures import fault_phases, phase_metrics
from pglab.workloads import _txscan, pgbench, txlog
from pglab.workloads.pgbench import LogStats


def former_reader(files: Sequence[Path]) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """The reader pglab had before txlog (and kubernetes' _failed_after), verbatim: the reference."""
    lat: list[int] = []
    end: list[float] = []
    failed: list[float] = []
    for path in files:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[2] == "failed":
                    failed.append(int(parts[4]) + int(parts[5]) / 1e6)
                if len(parts) < 6 or not parts[2].isdigit():
                    continue
                lat.append(int(parts[2]))
                end.append(int(parts[4]) + int(parts[5]) / 1e6)
    return np.asarray(lat, dtype=np.float64) / 1000.0, np.asarray(end, dtype=np.float64), failed


def former_stats(latency_ms: np.ndarray, end_ts: np.ndarray) -> LogStats | None:
    """The figures pglab computed from :func:`former_reader`'s arrays (numpy's percentile): the reference."""
    if latency_ms.size == 0:
        return None
    pct = np.percentile(latency_ms, pgbench.PERCENTILES)
    return LogStats(
        count=int(latency_ms.size),
        latency_mean_ms=float(latency_ms.mean()),
        percentiles_ms={p: float(v) for p, v in zip(pgbench.PERCENTILES, pct, strict=True)},
        latency_max_ms=float(latency_ms.max()),
        first_start=float((end_ts - latency_ms / 1000.0).min()),
        last_end=float(end_ts.max()),
    )


def read_as_the_former_reader(path: Path) -> tuple[txlog.TxLog, np.ndarray, np.ndarray] | None:
    """txlog.read of the log, checked against the former reader's transactions (and None when both raise)."""
    try:
        lat, end, failed = former_reader([path])
    except ValueError:
        with pytest.raises(ValueError):
            txlog.read([path])
        return None
    got = txlog.read([path])
    assert np.array_equal(got.latency_ms, lat) and np.array_equal(got.end_ts(), end)
    assert np.array_equal(got.failed_end_ts, np.asarray(failed))
    return got, lat, end


def write_log(path: Path, n: int, seed: int, lag: bool, retries: bool, cut: bool = False) -> None:
    """n lines as pgbench writes them: ~1 % failed, ~1 % skipped, a long tail, optional lag and retries; ``cut``
    ends the file in the middle of a line (pgbench killed)."""
    rng = np.random.default_rng(seed)
    lat = np.maximum(1, rng.lognormal(np.log(800), 1.2, n)).astype(np.int64)
    lat[rng.random(n) < 0.001] = rng.integers(10**7, 10**9, 1)  # a few seconds-long transactions
    end = (1_763_900_000 * 10**6 + np.sort(rng.integers(0, 30 * 10**6, n))).astype(np.int64)
    kind = rng.random(n)
    lines = []
    for i in range(n):
        time = "failed" if kind[i] < 0.01 else "skipped" if kind[i] < 0.02 else str(lat[i])
        fields = [str(i % 7), str(i // 7), time, str(i % 2), str(end[i] // 10**6), str(end[i] % 10**6)]
        if lag:
            fields.append(str(int(rng.integers(0, 5000))))
        if retries:
            fields.append(str(int(rng.integers(0, 3))))
        lines.append(" ".join(fields))
    text = "\n".join(lines) + "\n"
    if cut:
        text += "3 999 1234 0 17639"
    path.write_text(text)


@pytest.fixture
def logs(tmp_path: Path) -> list[Path]:
    """pgbench_log.<pid>.<thread>: one per thread, each with its own optional columns."""
    files = []
    for i, (lag, retries) in enumerate([(False, False), (True, False), (True, True), (False, True)]):
        path = tmp_path / (f"pgbench_log.4242.{i}" if i else "pgbench_log.4242")
        write_log(path, 3000 + 500 * i, seed=i, lag=lag, retries=retries, cut=i == 3)
        files.append(path)
    return sorted(files)


def test_same_transactions_as_the_former_reader(logs: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(txlog, "BLOCK_BYTES", 4096)  # many blocks: lines cut across reads are joined back
    lat, end, failed = former_reader(logs)
    got = txlog.read(logs)
    assert got.end_offset_us.dtype == np.int32  # 4 bytes a transaction
    assert lat.size > 10_000 and len(failed) > 100
    assert np.array_equal(got.latency_ms, lat) and np.array_equal(got.end_ts(), end)
    assert np.array_equal(got.failed_end_ts, np.asarray(failed))
    assert got.skipped == sum(line.split()[2] == "skipped" for f in logs for line in f.read_text().splitlines())


def test_exact_figures_as_before(logs: list[Path]) -> None:
    lat, end, _ = former_reader(logs)
    before = former_stats(lat, end)
    now = pgbench.txlog_stats(txlog.read(logs))
    assert before is not None and now is not None
    assert now.percentiles_ms == before.percentiles_ms  # bit for bit: numpy's own interpolation
    assert {p: float(np.percentile(lat, p)) for p in pgbench.PERCENTILES} == now.percentiles_ms
    assert (now.count, now.latency_max_ms, now.first_start, now.last_end) == (
        before.count, before.latency_max_ms, before.first_start, before.last_end)
    assert now.latency_mean_ms == pytest.approx(before.latency_mean_ms, rel=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 101, 1001])
def test_percentiles_match_numpy_for_any_size(n: int) -> None:
    us = np.random.default_rng(n).integers(1, 10**6, n).astype(np.int32)
    qs = (0, 1, 25, 50, 90, 95, 99, 99.9, 100)
    assert txlog.percentiles_ms(us, qs) == [float(v) for v in np.percentile(us / 1000.0, qs)]


def test_phase_stats_the_same_from_microseconds(logs: list[Path]) -> None:
    lat, end, _ = former_reader(logs)
    log = txlog.read(logs)
    a, b = float(end.min()) + 5, float(end.min()) + 12
    assert pgbench.phase_stats(log.latency_us, log.end_ts(), a, b, scale=1000.0) == pgbench.phase_stats(lat, end, a, b)


def test_odd_lines_take_the_former_rule(tmp_path: Path) -> None:
    """A tab, a doubled space, a line of three fields first in the file, a latency over int32: as split() did."""
    path = tmp_path / "pgbench_log.1"
    path.write_text("0 1 2\n0 0 500 0 1763900000 100\n0  1 600 0 1763900000 200\n0\t2 700 0 1763900001 5\n"
                    "0 3 9999999999999 0 1763900001 6\n0 4 skipped 0 1763900001 7 3\n")
    lat, end, _ = former_reader([path])
    got = txlog.read([path])
    assert np.array_equal(got.latency_ms, lat) and np.array_equal(got.end_ts(), end) and got.skipped == 1
    assert got.latency_us.dtype == np.int64  # one latency over 35 min: no int32 wrap


def test_end_times_over_35_minutes_apart(tmp_path: Path) -> None:
    """Past int32 µs from the first end time, offsets are kept as int64: still exact."""
    path = tmp_path / "pgbench_log.1"
    path.write_text("0 0 500 0 1763900000 100\n0 1 600 0 1763990000 999999\n0 2 700 0 1763800000 5\n")
    got = txlog.read([path])
    assert got.end_offset_us.dtype == np.int64
    assert np.array_equal(got.end_ts(), former_reader([path])[1])
    assert got.last_end() == 1763990000 + 999999 / 1e6


def test_a_latency_beyond_int64_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pgbench_log.1"
    path.write_text("0 0 500 0 1763900000 100\n0 3 99999999999999999999 0 1763900001 6\n")
    with pytest.raises(ValueError, match="2\\*\\*63"):
        txlog.read([path])


def test_a_malformed_end_time_raises_as_before(tmp_path: Path) -> None:
    path = tmp_path / "pgbench_log.1"
    path.write_text("0 0 500 0 1763900000 100\n0 1 600 0 17639x0000 200\n")
    with pytest.raises(ValueError):
        former_reader([path])
    with pytest.raises(ValueError):
        txlog.read([path])


def test_compressed_logs_read_back(logs: list[Path]) -> None:
    plain = txlog.read(logs)
    packed = txlog.compress(logs)
    assert [p.name for p in packed] == [f"{f.name}.gz" for f in logs] and not any(f.exists() for f in logs)
    assert gzip.decompress(packed[0].read_bytes()).startswith(b"0 0 ")
    back = txlog.read(packed)
    assert np.array_equal(back.latency_us, plain.latency_us) and np.array_equal(back.end_ts(), plain.end_ts())
    assert txlog.compress(packed) == packed  # already compressed: left as is


def test_summarise_logs_keeps_histogram_and_compresses(logs: list[Path]) -> None:
    lat, end, _ = former_reader(logs)
    stats, files = pgbench.summarise_logs(logs[0].parent / "pgbench_log")
    assert isinstance(stats, LogStats) and stats.percentiles_ms == former_stats(lat, end).percentiles_ms  # type: ignore[union-attr]
    assert all(f.suffix == ".gz" for f in files) and len(files) == len(logs)
    hist = txlog.LatencyHistogram.load(logs[0].parent / txlog.HISTOGRAM_FILE)
    assert hist.count == lat.size and hist.max_us == round(lat.max() * 1000)
    assert json.loads((logs[0].parent / txlog.HISTOGRAM_FILE).read_text())["relative_error"] == txlog.RELATIVE_ERROR


def test_bucket_bounds() -> None:
    """Every integer µs value is within RELATIVE_ERROR of its bucket's representative; buckets are contiguous."""
    v = np.r_[np.arange(0, 70_000), np.random.default_rng(0).integers(1, 2**40, 200_000)]
    idx = txlog.bucket_of(v)
    rep = txlog.bucket_value(idx)
    assert np.all(np.abs(rep - v) <= txlog.RELATIVE_ERROR * np.maximum(v, 1))
    assert np.array_equal(rep[:256], np.arange(256))  # exact below 256 µs
    small = idx[:70_000]
    assert np.all(np.diff(small) >= 0) and np.all(np.diff(small) <= 1)  # monotonic, no bucket skipped


def test_merged_histograms_within_documented_error(tmp_path: Path) -> None:
    """Repeats / tenants / pgbench processes: their histograms added give percentiles within RELATIVE_ERROR of
    numpy's exact percentiles over all the raw latencies together."""
    rng = np.random.default_rng(7)
    parts = [np.maximum(1, rng.lognormal(np.log(m), s, n)).astype(np.int32)
             for m, s, n in [(300, 0.5, 20_000), (2_000, 1.0, 5_000), (50, 0.2, 30_000), (40_000, 0.8, 1_000)]]
    merged = txlog.LatencyHistogram({}, 0, 0)
    for i, p in enumerate(parts):  # through the JSON kept in each run folder
        txlog.LatencyHistogram.of(p).save(tmp_path / f"h{i}.json")
        merged = merged.merge(txlog.LatencyHistogram.load(tmp_path / f"h{i}.json"))
    everything = np.concatenate(parts) / 1000.0
    qs = (0, 1, 50, 90, 95, 99, 99.9, 100)
    exact = np.percentile(everything, qs)
    approx = np.asarray(merged.percentiles_ms(qs))
    assert merged.count == everything.size
    assert np.all(np.abs(approx - exact) <= txlog.RELATIVE_ERROR * exact)
    assert approx[0] == exact[0] and approx[-1] == exact[-1]  # min and max kept exactly


def test_pgbench_blocks_are_scanned_not_read_line_by_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines as pgbench writes them (with or without lag/retries columns, failed and skipped among them) never
    take the slow rule, and give what the former reader gives."""
    calls: list[int] = []
    slow = txlog._parse_lines

    def counted(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        calls.append(len(data))
        return slow(data)

    monkeypatch.setattr(txlog, "_parse_lines", counted)
    monkeypatch.setattr(txlog, "BLOCK_BYTES", 8192)
    for lag, retries in [(False, False), (True, True)]:
        path = tmp_path / f"pgbench_log.{int(lag)}"
        write_log(path, 4000, seed=11, lag=lag, retries=retries)
        lat, end, failed = former_reader([path])
        got = txlog.read([path])
        assert np.array_equal(got.latency_ms, lat) and np.array_equal(got.end_ts(), end)
        assert np.array_equal(got.failed_end_ts, np.asarray(failed)) and got.skipped > 10
        now, before = pgbench.log_figures([path], tmp_path / "h.json"), former_stats(lat, end)
        assert now == pgbench.txlog_stats(txlog.read([path])) and now is not None and before is not None
        assert now.percentiles_ms == before.percentiles_ms
    for words in (False, True):  # blocks with and without failed and skipped lines
        path = tmp_path / f"pgbench_log.w{int(words)}"
        write_log(path, 4000, seed=12, lag=True, retries=False)
        if not words:
            path.write_text("".join(line + "\n" for line in path.read_text().splitlines() if "ed" not in line))
        lat, end, _ = former_reader([path])
        now, before = pgbench.log_figures([path], tmp_path / "h.json"), former_stats(lat, end)
        assert now is not None and before is not None and now.percentiles_ms == before.percentiles_ms
        assert (now.count, now.first_start, now.last_end) == (before.count, before.first_start, before.last_end)
    assert calls == []


ODD_LINES = {
    "plus": "0 9 +600 0 1763900001 6",  # int("+600") reads, isdigit() refuses
    "minus": "0 9 -600 0 1763900001 6",
    "doubled space, five fields": "0  600 0 1763900001 6",  # split(): 5 fields, no transaction
    "tab, seven fields": "0\t9 600 0 1763900001 6 7",  # split(): 7 fields, latency 600
    "twenty digits in the first field": "99999999999999999999 9 600 0 1763900001 6",
    "nineteen-digit latency": "0 9 9000000000000000000 0 1763900001 6",  # below 2**63: the line rule keeps it
    "thirteen-digit end seconds": "0 9 600 0 1763900001000 6",
    "letters in the fourth field": "0 9 600 zero 1763900001 6",
    "a NUL byte in the first field": "0\x009 600 0 1763900001 6",  # no whitespace to split(): one field
    "no-break space": "0\u00a09 600 0 1763900001 6 7",
    "leading space": " 0 9 600 0 1763900001 6",
    "trailing space": "0 9 600 0 1763900001 6 ",
    "empty line": "",
    "seven fields among six": "0 9 600 0 1763900001 6 7",
    "five fields": "0 9 600 0 1763900001",
    "time neither number nor failed": "0 9 aborted 0 1763900001 6",
    "carriage return": "0 9 600 0 1763900001 6\r",
    "carriage return past the sixth field": "0 9 600 0 1763900001 6 7\r0 10 700 0 1763900001 7",  # two lines
    "tab past the sixth field": "0 9 600 0 1763900001 6 7\t8",
    "tab in the time field": "0 9 600\t0 1763900001 6",
    "vertical tab": "0 9 600 0 1763900001\x0b6",
    "unit separator in the first field": "0\x1f9 600 0 1763900001 6 7",  # split(): 7 fields, latency 600
    "form feed past the sixth field": "0 9 600 0 1763900001 6\x0c7",
    "failed, its end time malformed": "0 9 failed 0 17639x0001 6",  # the former reader raises
    "skipped, its end time malformed": "0 9 skipped 0 17639x0001 6",  # the former reader skips it
    "failed as the first field": "failed 9 600 0 1763900001 6",  # a transaction
    "failed as the fourth field": "0 9 600 failed 1763900001 6",
    "failed, four fields": "0 9 failed 0",
    "failed after a tab": "0\t9 x failed 0 1763900001 6",  # split(): failed is the fourth field
    "failed twice": "0 9 failed failed 1763900001 6",  # the former reader raises
}


@pytest.mark.parametrize("at", [0, 20])
@pytest.mark.parametrize("odd", ODD_LINES)
def test_an_odd_line_among_pgbench_lines_reads_as_before(tmp_path: Path, odd: str, at: int) -> None:
    """One line not as pgbench writes it, first or among lines as pgbench writes them: the scanner reads it as
    str.split() does, or gives the block to the former rule, so every figure is the former reader's."""
    path = tmp_path / "pgbench_log.1"
    good = [f"{i % 4} {i} {500 + i} 0 1763900000 {i * 7}" for i in range(50)]
    path.write_text("\n".join([*good[:at], ODD_LINES[odd], *good[at:]]) + "\n", encoding="utf-8")
    read = read_as_the_former_reader(path)
    if read is None:
        return
    _, lat, end = read
    now, before = pgbench.log_figures([path], tmp_path / "h.json"), former_stats(lat, end)
    assert now is not None and before is not None
    assert (now.count, now.percentiles_ms, now.latency_max_ms, now.first_start, now.last_end) == (
        before.count, before.percentiles_ms, before.latency_max_ms, before.first_start, before.last_end)


def test_summary_figures_as_the_former_reader(logs: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """pgbench.log_figures (no transaction kept) against the former reader and np.percentile, bit for bit, with
    many blocks, latencies counted in several batches and some over SMALL_US (the fixture's seconds-long ones)."""
    monkeypatch.setattr(txlog, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(txlog, "FLUSH", 1000)
    lat, end, _ = former_reader(logs)
    assert lat.max() * 1000 >= txlog.SMALL_US > np.median(lat) * 1000  # both ways of counting are used
    before = former_stats(lat, end)
    now = pgbench.log_figures(logs, logs[0].parent / "h.json")
    assert before is not None and now is not None
    assert now.percentiles_ms == before.percentiles_ms
    assert (now.count, now.latency_max_ms, now.first_start, now.last_end) == (
        before.count, before.latency_max_ms, before.first_start, before.last_end)
    assert now.latency_mean_ms == pytest.approx(before.latency_mean_ms, rel=1e-12)
    assert now == pgbench.txlog_stats(txlog.read(logs))  # the mean too: the same integer sum
    us = np.rint(lat * 1000).astype(np.int64)
    assert txlog.LatencyHistogram.load(logs[0].parent / "h.json") == txlog.LatencyHistogram.of(us)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 1001])
def test_summary_percentiles_match_numpy_for_any_size(tmp_path: Path, n: int) -> None:
    rng = np.random.default_rng(n)
    us = np.where(rng.random(n) < 0.2, rng.integers(txlog.SMALL_US, 10**10, n), rng.integers(0, 5000, n))
    path = tmp_path / "pgbench_log.1"
    path.write_text("".join(f"0 {i} {v} 0 1763900000 {i}\n" for i, v in enumerate(us.tolist())))
    qs = (0, 1, 25, 50, 90, 95, 99, 99.9, 100)
    summary = txlog.summarise([path])
    assert summary.percentiles_ms(qs) == [float(v) for v in np.percentile(us / 1000.0, qs)]
    assert summary.histogram() == txlog.LatencyHistogram.of(us)


def test_summary_of_no_transaction(tmp_path: Path) -> None:
    path = tmp_path / "pgbench_log.1"
    path.write_text("0 0 failed 0 1763900000 5\n0 1 skipped 0 1763900000 6\n")
    assert pgbench.log_figures([path], tmp_path / "h.json") is None and not (tmp_path / "h.json").exists()


def test_first_start_from_the_near_minimum_only_is_exact() -> None:
    """The summary's first start: the float formula over the transactions near the integer minimum gives what it
    gives over all of them, also with many starts within a µs or two of each other and epoch seconds far out,
    where the floats' rounding puts the smallest float elsewhere than the smallest integer start."""
    rng = np.random.default_rng(3)
    for base in (1_763_900_000 * 10**6, 4_000_000_000 * 10**6, 2**62):
        end = base + np.sort(rng.integers(0, 50, 100_000))
        lat = rng.integers(1, 60, end.size)
        everything = float((txlog._seconds(end) - lat / 1000.0 / 1000.0).min())
        assert txlog._first_start(lat, end) == everything
    end, lat = 2**62 + np.array([328, 823]), np.array([1251, 1465])  # starts -923 and -642 µs from 2**62
    f = txlog._seconds(end) - lat / 1000.0 / 1000.0
    assert f[1] < f[0]  # the later integer start is the smaller float
    assert txlog._first_start(lat, end) == float(f[1])


@pytest.mark.parametrize("block", [16, 64, 4096, 1 << 20])
def test_blocks_of_a_mapped_log_are_its_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    """A plain log is read from a memory map: blocks shorter than a line (each then runs to the next line end),
    a last line without its newline, and an empty log give the former reader's transactions."""
    monkeypatch.setattr(txlog, "BLOCK_BYTES", block)
    path = tmp_path / "pgbench_log.1"
    write_log(path, 300, seed=5, lag=True, retries=False, cut=True)
    blocks = list(txlog._file_blocks(path))
    assert b"".join(blocks) == path.read_bytes() + b"\n" and all(b.endswith(b"\n") for b in blocks)
    lat, end, failed = former_reader([path])
    got = txlog.read([path])
    assert np.array_equal(got.latency_ms, lat) and np.array_equal(got.end_ts(), end)
    assert np.array_equal(got.failed_end_ts, np.asarray(failed))
    empty = tmp_path / "pgbench_log.2"
    empty.write_bytes(b"")
    assert list(txlog._file_blocks(empty)) == [] and txlog.summarise([empty]).count == 0


def test_a_recovery_after_the_load_ended_leaves_no_after_phase_rather_than_zero_tps(logs: list[Path]) -> None:
    """The lab's backup test stored tps_after 0.0 when the backup ended after the 30 s load: an empty phase is not a
    stalled database. Clipped to the window, "during" runs to the load's end and "after" is not reported."""
    _, end, _ = former_reader(logs)
    start, stop = float(end.min()), float(end.max()) + 1e-6
    fault = start + 10
    out = phase_metrics(logs, 1.0, fault_phases(start, fault, stop + 5, stop)[0])
    assert "tps_after" not in out and "latency_after_ms" not in out
    assert out["tps_during"] == pytest.approx(((end >= fault) & (end < stop)).sum() / (stop - fault))
    assert fault_phases(start, fault, stop + 5, stop)[1] is not None  # said, in one sentence
    after = phase_metrics(logs, 1.0, fault_phases(start, fault, fault + 5, stop)[0])["tps_after"]
    assert after is not None and after > 0 and fault_phases(start, fault, fault + 5, stop)[1] is None
    assert after == pytest.approx(((end >= fault + 5) & (end < stop)).sum() / (stop - fault - 5))


def test_the_scanner_refuses_a_block_it_could_read_past() -> None:
    """The compiled scan reads up to a line end without looking for the buffer's end: a block without its last
    newline, or outputs without room for a transaction per line, are refused before any byte is read."""
    room = np.empty(8, np.int64)
    with pytest.raises(ValueError, match="whole lines"):
        _txscan.scan_into(b"0 0 500 0 1763900000 100", room, room.copy(), np.empty(8))
    with pytest.raises(ValueError, match="room"):
        _txscan.scan_into(b"0 0 5 0 1 1\n" * 40, room, room.copy(), np.empty(8))
    lat, end, failed = np.empty(5, np.int64), np.empty(5, np.int64), np.empty(5)
    assert _txscan.scan_into(b"0 0 500 0 1763900000 100\n0 1 failed 0 1763900001 5\n", lat, end, failed) == (
        1, 1, 0, True)
    assert (lat[0], end[0], failed[0]) == (500, 1763900000000100, 1763900001 + 5 / 1e6)


# bytes that decide how a line splits: separators str.split() knows, line ends, a byte past ASCII, signs, and the
# letters of the two words
_TRICKY = st.sampled_from([*"0123456789", " ", " ", "  ", "\t", "\r", "\x0b", "\x1f", "\x00", "+", "-", "é",
                           "failed", "skipped", "fail", "x"])

_GAP = st.sampled_from(["  ", "\t", "\x0b", "\x0c", "\x1c", "\x1f", "\r", " \t", "\u00a0", "\x85"])  # not one space


@st.composite
def _log_text(draw: st.DrawFn) -> str:
    """Lines as pgbench writes them, some of them bent: a field replaced by tricky bytes, fields apart by other
    than one space."""
    lines = []
    for i in range(draw(st.integers(1, 12))):
        time = draw(st.sampled_from([str(draw(st.integers(0, 10**7)))] * 3 + ["failed", "skipped"]))
        fields = [str(i % 3), str(i), time, "0", str(1763900000 + i % 2),
                  str(draw(st.integers(0, 999999)))][:draw(st.sampled_from([6, 6, 6, 5, 7]))]
        if draw(st.booleans()):
            at = draw(st.integers(0, len(fields) - 1))
            fields[at] = "".join(draw(st.lists(_TRICKY, min_size=0, max_size=4)))
        gaps = [draw(_GAP) if draw(st.integers(0, 3)) == 0 else " " for _ in fields[1:]]
        lines.append(fields[0] + "".join(g + f for g, f in zip(gaps, fields[1:], strict=True)))
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n"]))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_log_text())
def test_any_log_reads_as_the_former_reader_reads_it(tmp_path: Path, text: str) -> None:
    """Whatever the bytes, the scanner, with the line rule for the blocks it gives up on, gives what the former
    reader gives, or fails where it fails; the summary too."""
    path = tmp_path / "pgbench_log.1"
    path.write_text(text, encoding="utf-8")
    read = read_as_the_former_reader(path)
    if read is None:
        return
    got, lat, end = read
    assert got.skipped == sum(len(p) >= 6 and p[2] == "skipped" for p in (line.split() for line in
                                                                            path.open(encoding="utf-8")))
    summary, before = txlog.summarise([path]), former_stats(lat, end)
    if before is None:
        assert summary.count == 0
        return
    now = pgbench.txlog_stats(got)
    assert now is not None and summary.count == before.count
    assert summary.percentiles_ms(pgbench.PERCENTILES) == [before.percentiles_ms[p] for p in pgbench.PERCENTILES]
    assert (summary.first_start, summary.last_end) == (before.first_start, before.last_end) == (
        now.first_start, now.last_end)
