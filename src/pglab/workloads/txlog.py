"""pgbench's per-transaction logs (``-l``), read in bounded memory, and a mergeable latency histogram.

A 60 s run at 170 k TPS writes 10 M lines; parsing them line by line in Python took ~47 s and ~1 GB, so the
logs are read in blocks of bytes and each block is parsed by polars' CSV reader (no Python loop per line). What is
kept per successful transaction is its latency (int32 µs) and its end time (int32 µs from the first; as float64
epoch s on demand, computed as ``time_epoch + time_us / 1e6`` as before): the run's percentiles stay exact (all
latencies), the windowed figures need the end times. 10 M transactions: 80 MB. Logs may be gzip-compressed
(``.gz``): they are compressed once summarised.

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
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import polars as pl

BLOCK_BYTES = 2 << 20  # bytes parsed at once (~55 k lines): polars' working memory grows with it (4 MB: +24 MB)


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


def open_log(path: Path) -> IO[bytes]:
    """A log as bytes, whether kept as written or gzip-compressed."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # type: ignore[return-value]


def _blocks(f: IO[bytes]) -> Iterator[bytes]:
    """Whole lines, about BLOCK_BYTES at a time (the last one may lack its newline)."""
    rest = b""
    while chunk := f.read(BLOCK_BYTES):
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            rest = data
            continue
        yield data[:cut]
        rest = data[cut:]
    if rest:
        yield rest + b"\n"


_ODD = (b"\t", b"\r", b"\x0b", b"\x0c", b"  ", b"\n ", b" \n")


def _parse_block(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """One block of whole lines: latencies (µs), end times (int64 µs), failed end times (s), skipped count.

    Parsed by polars' CSV reader (single spaces, as pgbench writes); a block with any other whitespace, or a
    field int() would refuse, is left to the former line-by-line rule (:func:`_parse_lines`)."""
    if data.startswith(b" ") or any(o in data for o in _ODD):
        return _parse_lines(data)
    try:
        df = pl.read_csv(data, separator=" ", has_header=False, columns=[2, 4, 5], infer_schema=False,
                         quote_char=None, truncate_ragged_lines=True)
    except pl.exceptions.PolarsError:  # e.g. the block's first line has fewer than six fields
        return _parse_lines(data)
    df.columns = ["t", "s", "us"]
    t = pl.col("t")
    df = df.filter(pl.col("us").is_not_null()).select(  # fewer than six fields: not a transaction
        lat=pl.when(t.str.contains(r"^[0-9]+$")).then(t.cast(pl.Int64, strict=False)),
        failed=t == "failed", skipped=t == "skipped", kept=t.str.contains(r"^[0-9]+$") | (t == "failed"),
        end=pl.col("s").cast(pl.Int64, strict=False).cast(pl.Float64)
        + pl.col("us").cast(pl.Int64, strict=False) / 1e6,
        end_us=pl.col("s").cast(pl.Int64, strict=False) * 1_000_000 + pl.col("us").cast(pl.Int64, strict=False))
    bad = df.select(((pl.col("kept") & pl.col("end").is_null())
                     | (pl.col("kept") & ~pl.col("failed") & pl.col("lat").is_null())).any()).item()
    if bad:  # a number beyond int64, or an end time int() would refuse (and raise on): the former rule
        return _parse_lines(data)
    ok = df.filter(pl.col("lat").is_not_null())
    latency = ok["lat"].to_numpy()
    if latency.size and latency.max() < 2**31:
        latency = latency.astype(np.int32)
    return (latency, ok["end_us"].to_numpy(), df.filter(pl.col("failed"))["end"].to_numpy(),
            int(df["skipped"].sum()))


def _parse_lines(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The former reader's rule, line by line: six fields or more, ``time`` all digits (int() raising on a
    malformed end time included)."""
    lat: list[int] = []
    end: list[int] = []
    failed: list[float] = []
    skipped = 0
    for raw in data.decode(errors="replace").splitlines():
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


def read(files: Sequence[Path]) -> TxLog:
    """All successful transactions of pgbench's -l logs (plain or .gz), in file order, in bounded memory."""
    lat, end, failed = _Growing(np.int32), _Growing(np.int32), _Growing(np.float64)
    base: int | None = None
    skipped = 0
    for path in files:
        with open_log(path) as f:
            for data in _blocks(f):
                la, en, fa, sk = _parse_block(data)
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
    n = latency_us.size
    q = np.asarray(qs, dtype=np.float64) / 100
    virtual = (n - 1) * q
    lo = np.floor(virtual).astype(np.intp)
    hi = np.minimum(lo + 1, n - 1)
    kth = np.unique(np.r_[lo, hi])
    if in_place:
        latency_us.partition(kth)
        part = latency_us
    else:
        part = np.partition(latency_us, kth)
    a, b = part[lo] / 1000.0, part[hi] / 1000.0
    t = virtual - lo
    diff = b - a
    out = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    return [float(v) for v in out]


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
            c = np.bincount(bucket_of(latency_us[i:i + step]))
            if c.size > counts.size:
                c[:counts.size] += counts
                counts = c
            else:
                counts[:c.size] += c
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
        virtual = (n - 1) * (np.asarray(qs, dtype=np.float64) / 100)
        lo = np.floor(virtual).astype(np.int64)
        hi = np.minimum(lo + 1, n - 1)

        def at(rank: np.ndarray) -> np.ndarray:
            value = rep[np.searchsorted(cum, rank, side="right")]
            return np.where(rank == 0, self.min_us, np.where(rank == n - 1, self.max_us, value))

        a, b = at(lo), at(hi)
        t = virtual - lo
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
