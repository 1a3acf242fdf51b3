"""Exports: a sweep's tables as files (CSV, JSON, Parquet) for notebooks, spreadsheets and other tools.

One file per table in the output folder: ``points``, ``runs``, ``series`` (long form: one row per sample),
``events``, ``storage`` and, when fio ran, ``fio_series``. Columns keep their types (numbers stay numbers,
``unstable`` stays a boolean). JSON is one array of records per file, the shape ``pglab report --format json``
prints; each file is written under a temporary name, flushed to disk and renamed, so a crash never leaves a half
file behind.
"""

from __future__ import annotations

import json
import math
import os
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl

from pglab import metrics
from pglab.store.sqlite import Store

FORMATS = ("csv", "json", "parquet")

SERIES_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.String(), "ts": pl.Float64(), "t_s": pl.Float64(), "source": pl.String(), "metric": pl.String(),
    "value": pl.Float64()}
EVENTS_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Float64(), "kind": pl.String(), "detail": pl.String(), "run_id": pl.String(), "scope": pl.String()}
FIO_SERIES_SCHEMA: dict[str, pl.DataType] = {
    "fio_id": pl.Int64(), "label": pl.String(), "job": pl.String(), "direction": pl.String(), "ts": pl.Float64(),
    "t_s": pl.Float64(), "iops": pl.Float64(), "lat_ms": pl.Float64()}


def export(store: Store, out_dir: Path, fmt: str, sweep_id: int | None = None) -> list[Path]:
    """Write the sweep's tables into ``out_dir`` as ``<table>.<fmt>``; return the files written, in order."""
    if fmt not in FORMATS:
        raise ValueError(f"format '{fmt}' is not one of {', '.join(FORMATS)}")
    from pglab.report.tables import point_table, run_table, storage_table  # scipy behind: only when exporting

    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    frames = {
        "points": table_frame(*point_table(store, sweep_id)),
        "runs": table_frame(*run_table(store, sweep_id)),
        "series": pl.DataFrame(store.sweep_series(sweep_id), schema=SERIES_SCHEMA, orient="row"),
        "events": pl.DataFrame(store.sweep_and_run_events(sweep_id), schema=EVENTS_SCHEMA, orient="row"),
        "storage": table_frame(*storage_table(store, sweep_id)),
    }
    fio = pl.DataFrame(store.fio_series(sweep_id), schema=FIO_SERIES_SCHEMA, orient="row")
    if fio.height:
        frames["fio_series"] = fio
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write(df, out_dir / f"{name}.{fmt}", fmt) for name, df in frames.items()]


def table_frame(columns: list[str], rows: list[dict[str, Any]]) -> pl.DataFrame:
    """A report table as a typed frame: each column gets the one type its values share (text as a last resort)."""
    return pl.DataFrame([_column(c, [r.get(c) for r in rows]) for c in columns])


def _column(name: str, values: list[Any]) -> pl.Series:
    values = [None if isinstance(v, float) and math.isnan(v) else v for v in values]
    present = [v for v in values if v is not None]
    known = _known().get(name)
    dtype = _infer(present) if present else (known or pl.String())
    if dtype == pl.Int64() and known == pl.Float64():
        dtype = pl.Float64()  # a metric that happens to be whole is still a metric
    if dtype == pl.String():
        values = [v if v is None or isinstance(v, str) else
                  json.dumps(v) if isinstance(v, dict | list) else str(v) for v in values]
    elif dtype == pl.Float64():
        values = [None if v is None else float(v) for v in values]
    return pl.Series(name, values, dtype=dtype)


@cache
def _known() -> dict[str, pl.DataType]:
    """Types of the known columns, so that an empty table or a column of nulls still gets its numeric type."""
    floats = (*metrics.keys("points"), *metrics.keys("runs"), *(f"{c}_ci95" for c in metrics.with_ci("points")),
              "tps_cv_pct", "storage_ceiling_pct", "tps_dips",
              "iops", "mb_s", "lat_mean_ms", "lat_p99_ms", "lat_p999_ms", "io_lat_mean_ms", "io_lat_p50_ms",
              "io_lat_p99_ms", "io_lat_p999_ms", "fdatasync_lat_mean_ms", "fdatasync_lat_p99_ms",
              "fdatasync_lat_p999_ms")
    ints = ("clients", "jobs", "repeat", "repeats", "failed_runs")
    return {**{c: pl.Float64() for c in floats}, **{c: pl.Int64() for c in ints}, "unstable": pl.Boolean(),
            "flags": pl.String()}


def _infer(present: list[Any]) -> pl.DataType:
    if all(isinstance(v, bool) for v in present):
        return pl.Boolean()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pl.Int64()
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return pl.Float64()
    return pl.String()  # mixed or other values: their text, JSON for dicts and lists


def write(df: pl.DataFrame, path: Path, fmt: str) -> Path:
    """Write to a temporary name beside ``path``, sync, then rename: readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            if fmt == "csv":
                df.write_csv(f)
            elif fmt == "json":
                df.write_json(f)
            else:
                df.write_parquet(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
