"""pgbench's per-transaction logs (``-l``), read in bounded memory, and a mergeable latency histogram.

A 60 s run at 170 k TPS writes 10 M lines; parsing them line by line in Python took ~47 s and ~1 GB, so the
logs are read in blocks of bytes and each block is scanned by compiled code (``_txscan.pyx``, built by Cython
at install: a CSV reader tokenises every field, and the summary built on polars' took 1.5× its CPU), two blocks
at a time in threads. :func:`read` keeps per successful transaction its latency (int32 µs) and its end
time (int32 µs from the first; as float64 epoch s on demand, computed as ``time_epoch + time_us / 1e6`` as
before): 10 M transactions, 80 MB, for the windowed figures. :func:`summarise` keeps none: the run's figures
need only the count of each latency value (exact percentiles), the sum, the extremes, the first start and the
last end. Logs may be gzip-compressed (``.gz``): they are compressed once summarised.

Line format (PostgreSQL docs, "Per-Transaction Logging"):
``client_id transaction_no time script_no time_epoch time_us [schedule_lag] [retries]``, ``time`` in µs, or
``failed`` / ``skipped`` for a transaction that did not complete. Lines with fewer than six fields (a line
cut short when pgbench was killed) and lines whose ``time`` is not a number are not transactions.

The histogram (:class:`LatencyHistogram`) is log-linear, as HdrHistogram: exact below 256 µs, then 128
buckets per power of two, so any value is within 1/256 (0.39 %) of its bucket's representative. Histograms
merge by adding counts, so percentiles over repeats, tenants or several pgbench processes need no raw log.
"""

from __future__ import annotations

import gzip
import json
import mmap
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

try:
    from pglab.workloads import _txscan
except ImportError as exc:  # a checkout used without its install (PYTHONPATH=src, git archive)
    raise ImportError("pglab's log scanner (src/pglab/workloads/_txscan.pyx) is not compiled: ./setup.sh install, "
                      "or pip install -e ., builds it") from exc

BLOCK_BYTES = 2 << 20  # bytes parsed at once (~55 k lines): the parse's arrays grow with it
_T = TypeVar("_T")
PARSERS = 2  # blocks summarised at the same time, in threads (the scanner and numpy let go of the GIL)


@dataclass
class TxLog:
    """The successful transactions of one or more -l logs, in file order; failed ones keep only their end time,
    skipped ones are counted. End times are kept as int32 µs from the first one (int64 past ±35 min): 4 bytes
    a transaction instead of a float64's 8, and still exact."""

    latency_us: np.ndarray  # int32 (int64 if a latency exceeded 35 min)
    end_offset_us: np.ndarray  # int32 (or int64): end time in µs minus end_base_us
    end_base_us: int
    failed_end_ts: np.ndarray  # float64 epoch s, end times of the ``failed`` lines
    skipped: int

    @property
    def latency_ms(self) -> np.ndarray:
        """float64 ms, bit-identical to the former line-by-line reader's (µs / 1000.0)."""
        return self.latency_us / 1000.0

    @property
    def count(self) -> int:
        return int(self.latency_us.size)

    def end_ts(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """End times (float64 epoch s) of transactions [start:stop], as the former reader computed them:
        ``time_epoch + time_us / 1e6``."""
        return _seconds(self.end_base_us + self.end_offset_us[start:stop].astype(np.int64))

    def last_end(self) -> float:
        return float(_seconds(np.array([self.end_base_us + int(self.end_offset_us.max())]))[0])

    def select(self, keep: np.ndarray) -> TxLog:
        """The transactions where ``keep`` (a boolean mask) holds."""
        return TxLog(self.latency_us[keep], self.end_offset_us[keep], self.end_base_us, self.failed_end_ts,
                     self.skipped)


def _seconds(end_us: np.ndarray) -> np.ndarray:
    s, us = np.divmod(end_us, 1_000_000)
    return s.astype(np.float64) + us / 1e6


class _Growing:
    """A 1-D array grown in place (realloc/mremap: no copy of what is there, no doubled peak)."""

    def __init__(self, dtype: Any) -> None:
        self.a = np.empty(1 << 16, dtype=dtype)
        self.n = 0

    def extend(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        need = self.n + values.size
        if need > self.a.size:
            if values.dtype.itemsize > self.a.dtype.itemsize:  # int32 latencies meet one over 2^31 µs
                self.a = self.a.astype(values.dtype)
            # numpy zero-fills what it grows (resident at once): grow by an eighth, not double (realloc moves
            # the pages, it does not copy them)
            self.a.resize(need + max(need // 8, 1 << 16), refcheck=False)
        elif values.dtype.itemsize > self.a.dtype.itemsize:
            self.a = self.a.astype(values.dtype)
        self.a[self.n:need] = values
        self.n = need

    def done(self) -> np.ndarray:
        self.a.resize(self.n, refcheck=False)
        return self.a


def _blocks(f: IO[bytes]) -> Iterator[bytes]:
    """Whole lines, about BLOCK_BYTES at a time (a newline added to a last line without one)."""
    while chunk := f.read(BLOCK_BYTES):
        if not chunk.endswith(b"\n"):
            chunk += f.readline()
        yield chunk if chunk.endswith(b"\n") else chunk + b"\n"


def _file_blocks(path: Path) -> Iterator[bytes]:
    """:func:`_blocks` of a log. A plain one is mapped and each block copied once from the map (a read() and the
    readline() joined to it copied it twice), its pages let go once copied (they would count in the RSS)."""
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as f:
            yield from _blocks(f)  # type: ignore[arg-type]
        return
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = done = 0
            while pos < size:
                stop = min(pos + BLOCK_BYTES, size)
                if stop < size:  # up to the last line end in the block, or past a line longer than a block
                    cut = mm.rfind(b"\n", pos, stop)
                    stop = cut + 1 if cut >= 0 else mm.find(b"\n", stop) + 1 or size
                data = mm[pos:stop]
                below = stop - stop % mmap.PAGESIZE
                if below > done:
                    mm.madvise(mmap.MADV_DONTNEED, done, below - done)
                    done = below
                pos = stop
                yield data if data.endswith(b"\n") else data + b"\n"


_Parsed = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # latencies, end times (µs), failed end times, skipped
SHORTEST_LINE = 12  # "0 0 0 0 0 0\n": a block of n bytes holds at most n // 12 + 1 transactions


def _scanned(data: bytes) -> _Parsed:
    """One block of whole lines, scanned by compiled code (:mod:`pglab.workloads._txscan`: a single pass over the
    bytes, only ``time``, ``time_epoch`` and ``time_us`` converted, without the GIL), or by the line rule when a
    line is not as pgbench writes it (any byte where ``str.split()`` or a text file would cut other than a single
    space or a newline, a number too long for 64 bits, an end time that is no plain integer): rare, and exact by
    construction. The arrays have room for a transaction per line; only the pages written become resident."""
    room = len(data) // SHORTEST_LINE + 1
    latency, end, failed = np.empty(room, np.int64), np.empty(room, np.int64), np.empty(room, np.float64)
    ok, lost, skipped, plain = _txscan.scan_into(data, latency, end, failed)
    if not plain:
        return _parse_lines(data)
    return latency[:ok], end[:ok], failed[:lost], skipped


def _parse_block(data: bytes) -> _Parsed:
    """One block of whole lines: latencies (µs; int32 when they fit), end times (int64 µs), failed end times
    (s), skipped count."""
    latency, end, failed, skipped = _scanned(data)
    if latency.size and latency.max() < 2**31:
        latency = latency.astype(np.int32)
    return latency, end, failed, skipped


def _parse_lines(data: bytes) -> _Parsed:
    """The former reader's rule, line by line: six fields or more, ``time`` all digits (int() raising on a
    malformed end time included); lines end where a file opened as text ends them (not also at a vertical tab,
    a form feed or a Unicode line separator, where str.splitlines() would)."""
    lat: list[int] = []
    end: list[int] = []
    failed: list[float] = []
    skipped = 0
    text = data.decode(errors="replace")
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):  # lines as open() cuts them
        parts = raw.split()
        if len(parts) < 6:
            continue
        if parts[2].isdigit():
            lat.append(int(parts[2]))
            end.append(int(parts[4]) * 1_000_000 + int(parts[5]))
        elif parts[2] == "failed":
            failed.append(int(parts[4]) + int(parts[5]) / 1e6)
        elif parts[2] == "skipped":
            skipped += 1
    try:
        latency = np.asarray(lat, dtype=np.int64)
    except OverflowError:
        raise ValueError(f"a latency of over 2**63 µs in a pgbench log: {max(lat)}") from None
    if latency.size and latency.max() < 2**31:
        latency = latency.astype(np.int32)
    return latency, np.asarray(end, dtype=np.int64), np.asarray(failed, dtype=np.float64), skipped


def _parsed(files: Sequence[Path], parse: Callable[[bytes], _T], parsers: int) -> Iterator[_T]:
    """``parse`` of every block of the files, in file order, ``parsers`` blocks at a time (in threads, while the
    next block is read)."""
    with ThreadPoolExecutor(parsers) as pool:
        pending: deque[Future[_T]] = deque()
        for path in files:
            for data in _file_blocks(path):
                pending.append(pool.submit(parse, data))
                if len(pending) > parsers:
                    yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def read(files: Sequence[Path]) -> TxLog:
    """All successful transactions of pgbench's -l logs (plain or .gz), in file order, in bounded memory."""
    lat, end, failed = _Growing(np.int32), _Growing(np.int32), _Growing(np.float64)
    base: int | None = None
    skipped = 0
    for la, en, fa, sk in _parsed(files, _parse_block, PARSERS):  # two at a time: 155 MB for 10 M (148 MB with one)
        if base is None and en.size:
            base = int(en[0])
        off = en - (base or 0)
        if off.size and off.min() >= -(2**31) and off.max() < 2**31:
            off = off.astype(np.int32)
        lat.extend(la)
        end.extend(off)
        failed.extend(fa)
        skipped += sk
    return TxLog(lat.done(), end.done(), base or 0, failed.done(), skipped)


def concat(logs: Sequence[TxLog]) -> TxLog:
    """Several processes' logs as one (several pgbench pods of one run): their transactions one log after the
    other, end times on the first's base (int64 offsets where int32 would not hold them)."""
    if not logs:
        return TxLog(np.empty(0, np.int32), np.empty(0, np.int32), 0, np.empty(0, np.float64), 0)
    base = next((log.end_base_us for log in logs if log.count), 0)
    offsets = [log.end_offset_us.astype(np.int64) + (log.end_base_us - base) for log in logs]
    off = np.concatenate(offsets) if offsets else np.empty(0, np.int64)
    if off.size and off.min() >= -(2**31) and off.max() < 2**31:
        off = off.astype(np.int32)
    lat = np.concatenate([log.latency_us for log in logs])
    return TxLog(lat, off, base, np.concatenate([log.failed_end_ts for log in logs]),
                 sum(log.skipped for log in logs))


def first_start(log: TxLog) -> float:
    """When the first transaction began (epoch s): min(end - latency), in blocks (no 80 MB temporary), with the
    former reader's arithmetic (µs / 1000 / 1000), so the same float."""
    step = 1 << 18
    return min(float((log.end_ts(i, i + step) - log.latency_us[i:i + step] / 1000.0 / 1000.0).min())
               for i in range(0, log.count, step))


# ------------------------------------------------------------------ exact percentiles
def percentiles_ms(latency_us: np.ndarray, qs: Sequence[float], in_place: bool = False) -> list[float]:
    """numpy's default percentile (linear between closest ranks) of ``latency_us / 1000.0``, from a partial
    sort of the int32 µs (no float64 copy): µs → ms is monotonic, so the order statistics are the same, and
    the interpolation is numpy's own ``_lerp``. ``in_place`` partitions the array itself (no copy; its order,
    and so its pairing with end times, is lost)."""
    lo, hi, t = _ranks(latency_us.size, qs)
    kth = np.unique(np.r_[lo, hi])
    if in_place:
        latency_us.partition(kth)
        part = latency_us
    else:
        part = np.partition(latency_us, kth)
    return _lerp_ms(part[lo], part[hi], t)


def _ranks(n: int, qs: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The order statistics (0-based ranks) each percentile lies between, and how far between: numpy's."""
    virtual = (n - 1) * (np.asarray(qs, dtype=np.float64) / 100)
    lo = np.floor(virtual).astype(np.intp)
    return lo, np.minimum(lo + 1, n - 1), virtual - lo


def _lerp_ms(low_us: np.ndarray, high_us: np.ndarray, t: np.ndarray) -> list[float]:
    """numpy's ``_lerp`` between two order statistics (µs), in ms."""
    a, b = low_us / 1000.0, high_us / 1000.0
    diff = b - a
    out = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    return [float(v) for v in out]


# ------------------------------------------------------------------ summary without the transactions kept
SMALL_US = 1 << 20  # latencies below this (1.05 s) are counted by value; the rarer longer ones kept, sorted later
FLUSH = 1 << 20  # latencies gathered before they are counted at once (one bincount, not one per block)


@dataclass
class _BlockSummary:
    latency_us: np.ndarray
    total_us: int
    min_us: int
    max_us: int
    first_start: float
    last_end_us: int


def _summarise_block(data: bytes) -> _BlockSummary:
    """A block's share of :class:`Summary`, in the parsing thread: start and end as :func:`first_start` and
    :meth:`TxLog.last_end` compute them."""
    latency, end, _failed, _skipped = _scanned(data)
    if not latency.size:
        return _BlockSummary(latency, 0, 0, 0, float("inf"), -(2**63))
    return _BlockSummary(latency, int(latency.sum(dtype=np.int64)), int(latency.min()), int(latency.max()),
                         _first_start(latency, end), int(end.max()))


def _first_start(latency_us: np.ndarray, end_us: np.ndarray) -> float:
    """min(end - latency) as :func:`first_start` computes it in floats (s + µs / 1e6 - latency / 1000 / 1000),
    computed only where end - latency in integer µs is within the floats' rounding of its minimum: elsewhere the
    float is larger (the rounding is below half a µs for epoch seconds below 2**31, below ``margin`` in general)."""
    start = end_us - latency_us
    low = int(start.min())
    top = float(max(abs(int(end_us.max())), abs(int(end_us.min())), abs(low))) / 1e6
    margin = 2 + int(8e6 * float(np.spacing(top)))
    near = start <= low + margin
    return float((_seconds(end_us[near]) - latency_us[near] / 1000.0 / 1000.0).min())


@dataclass
class Summary:
    """What a run's figures need of its logs, gathered block by block without keeping each transaction: the
    count of every latency value below SMALL_US (exact percentiles from them), the longer ones themselves, the
    integer sum, the extremes, the first start and the last end."""

    count: int
    total_us: int
    min_us: int
    max_us: int
    first_start: float
    last_end: float
    by_value: np.ndarray  # by_value[v]: how many latencies of v µs (v < SMALL_US), int64
    long_us: np.ndarray  # the latencies of SMALL_US or more, sorted

    def percentiles_ms(self, qs: Sequence[float]) -> list[float]:
        """:func:`percentiles_ms` of all the latencies, exactly: the same order statistics, read off the
        cumulative counts."""
        lo, hi, t = _ranks(self.count, qs)
        return _lerp_ms(self._order_statistic(lo), self._order_statistic(hi), t)

    def _order_statistic(self, rank: np.ndarray) -> np.ndarray:
        cum = np.cumsum(self.by_value)
        small = int(cum[-1]) if cum.size else 0
        out = np.empty(rank.size, dtype=np.int64)
        below = rank < small
        out[below] = np.searchsorted(cum, rank[below], side="right")
        out[~below] = self.long_us[rank[~below] - small]
        return out

    def histogram(self) -> LatencyHistogram:
        """:meth:`LatencyHistogram.of` all the latencies: the same counts."""
        if not self.count:
            return LatencyHistogram({}, 0, 0)
        values = np.flatnonzero(self.by_value)
        counts = np.bincount(bucket_of(values), weights=self.by_value[values]).astype(np.int64)  # exact below 2**53
        if self.long_us.size:
            counts = _added(counts, np.bincount(bucket_of(self.long_us)))
        idx = np.flatnonzero(counts)
        return LatencyHistogram(dict(zip(idx.tolist(), counts[idx].tolist(), strict=True)), self.min_us, self.max_us)


def _added(counts: np.ndarray, more: np.ndarray) -> np.ndarray:
    """Two bincounts added, the shorter as if padded with zeros (one of them is reused)."""
    if more.size > counts.size:
        more[:counts.size] += counts
        return more
    counts[:more.size] += more
    return counts


def summarise(files: Sequence[Path]) -> Summary:
    """The :class:`Summary` of pgbench's -l logs (plain or .gz): the same figures as :func:`read` then
    :func:`first_start`, :meth:`TxLog.last_end`, :func:`percentiles_ms` and :meth:`LatencyHistogram.of`, in
    memory that does not grow with the number of transactions (unless many last over SMALL_US)."""
    by_value = np.zeros(0, dtype=np.int64)
    long_us, gathered = _Growing(np.int32), list[np.ndarray]()
    count = total = size = 0
    low, high, first, last = 2**63, -1, float("inf"), -(2**63)

    def flush() -> None:
        nonlocal by_value, gathered, size
        if gathered:
            by_value = _added(by_value, np.bincount(np.concatenate(gathered)))
        gathered, size = [], 0

    for b in _parsed(files, _summarise_block, PARSERS):
        if not b.latency_us.size:
            continue
        count += b.latency_us.size
        total += b.total_us
        low, high = min(low, b.min_us), max(high, b.max_us)
        first, last = min(first, b.first_start), max(last, b.last_end_us)
        if b.max_us < SMALL_US:
            gathered.append(b.latency_us)
        else:
            is_long = b.latency_us >= SMALL_US
            long_us.extend(b.latency_us[is_long])
            gathered.append(b.latency_us[~is_long])
        size += b.latency_us.size
        if size >= FLUSH:
            flush()
    flush()
    long_sorted = long_us.done()
    long_sorted.sort()
    if not count:
        return Summary(0, 0, 0, 0, float("nan"), float("nan"), by_value, long_sorted)
    return Summary(count, total, low, high, first, float(_seconds(np.array([last]))[0]), by_value, long_sorted)


# ------------------------------------------------------------------ histogram
SUB_BITS = 8  # exact below 2**SUB_BITS µs, then 2**(SUB_BITS-1) buckets per power of two
HALF = 1 << (SUB_BITS - 1)
RELATIVE_ERROR = 1.0 / (1 << SUB_BITS)  # of a value against its bucket's representative: 0.39 %


def bucket_of(us: np.ndarray) -> np.ndarray:
    """Log-linear bucket index of integer µs values: the value's top SUB_BITS bits and its magnitude."""
    v = np.asarray(us, dtype=np.int64)
    _, exp = np.frexp(np.maximum(v, 1).astype(np.float64))  # v < 2**exp, exact below 2**53
    shift = np.maximum(exp.astype(np.int64) - SUB_BITS, 0)
    return shift * HALF + (v >> shift)


def bucket_value(index: np.ndarray) -> np.ndarray:
    """The representative (midpoint, µs) of each bucket."""
    i = np.asarray(index, dtype=np.int64)
    shift = np.maximum(i // HALF - 1, 0)
    low = (i - shift * HALF) << shift
    return low + ((1 << shift) - 1) / 2


@dataclass
class LatencyHistogram:
    """Counts of latencies (µs) per log-linear bucket; merge by adding, percentiles within RELATIVE_ERROR."""

    counts: dict[int, int]
    min_us: int
    max_us: int

    @classmethod
    def of(cls, latency_us: np.ndarray) -> LatencyHistogram:
        if latency_us.size == 0:
            return cls({}, 0, 0)
        step = 1 << 18  # in blocks: bucket_of's int64/float64 temporaries for 10 M values would be ~300 MB
        counts = np.zeros(0, dtype=np.int64)
        for i in range(0, latency_us.size, step):
            counts = _added(counts, np.bincount(bucket_of(latency_us[i:i + step])))
        idx = np.flatnonzero(counts)
        return cls(dict(zip(idx.tolist(), counts[idx].tolist(), strict=True)), int(latency_us.min()),
                   int(latency_us.max()))

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def merge(self, other: LatencyHistogram) -> LatencyHistogram:
        if not other.count:
            return LatencyHistogram(dict(self.counts), self.min_us, self.max_us)
        if not self.count:
            return LatencyHistogram(dict(other.counts), other.min_us, other.max_us)
        counts = dict(self.counts)
        for k, v in other.counts.items():
            counts[k] = counts.get(k, 0) + v
        return LatencyHistogram(counts, min(self.min_us, other.min_us), max(self.max_us, other.max_us))

    def percentiles_ms(self, qs: Sequence[float]) -> list[float]:
        """numpy's linear percentile with each order statistic replaced by its bucket's representative (the
        smallest and largest by the exact min/max): within RELATIVE_ERROR of the exact percentile of the raw
        latencies, since each order statistic is, and the interpolation between two positive values keeps it."""
        n = self.count
        if n == 0:
            return [float("nan")] * len(qs)
        idx = np.array(sorted(self.counts), dtype=np.int64)
        cum = np.cumsum([self.counts[i] for i in idx.tolist()])
        rep = np.clip(bucket_value(idx), self.min_us, self.max_us)
        lo, hi, t = _ranks(n, qs)

        def at(rank: np.ndarray) -> np.ndarray:
            value = rep[np.searchsorted(cum, rank, side="right")]
            return np.where(rank == 0, self.min_us, np.where(rank == n - 1, self.max_us, value))

        a, b = at(lo), at(hi)
        return [float(v) for v in (a + (b - a) * t) / 1000.0]

    def as_dict(self) -> dict[str, Any]:
        keys = sorted(self.counts)
        return {"unit": "us", "sub_bucket_bits": SUB_BITS, "relative_error": RELATIVE_ERROR, "count": self.count,
                "min": self.min_us, "max": self.max_us, "bucket": keys, "n": [self.counts[k] for k in keys]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LatencyHistogram:
        if d.get("sub_bucket_bits") != SUB_BITS or d.get("unit") != "us":
            raise ValueError(f"latency histogram with unit {d.get('unit')}, {d.get('sub_bucket_bits')} bits: "
                             f"this pglab reads µs with {SUB_BITS}")
        return cls(dict(zip(d["bucket"], d["n"], strict=True)), int(d["min"]), int(d["max"]))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.as_dict()) + "\n")

    @classmethod
    def load(cls, path: Path) -> LatencyHistogram:
        return cls.from_dict(json.loads(path.read_text()))


HISTOGRAM_FILE = "latency_histogram.json"


# ------------------------------------------------------------------ compression
def compress(files: Sequence[Path], level: int = 1) -> list[Path]:
    """gzip each plain log in place (``x`` → ``x.gz``), once it has been read; returns the files as now named.

    Level 1: ~3-4x smaller for a fraction of the time of the default level, which users would wait for."""
    out = []
    for path in files:
        if path.suffix == ".gz":
            out.append(path)
            continue
        gz = path.with_name(path.name + ".gz")
        tmp = gz.with_name(gz.name + ".part")
        with open(path, "rb") as src, gzip.open(tmp, "wb", compresslevel=level) as dst:
            shutil.copyfileobj(src, dst, BLOCK_BYTES)
        os.replace(tmp, gz)
        path.unlink()
        out.append(gz)
    return out
