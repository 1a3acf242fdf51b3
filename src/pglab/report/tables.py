"""The seed-style table: one row per point (means over repeats ± 95 % CI), or one row per run."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import OrderedDict
from typing import Any

from rich.console import Console
from rich.table import Table

from pglab.analysis.stats import estimate
from pglab.store.sqlite import RunRow, Store

AXIS_COLUMNS = ("workload", "synchronous_commit", "clients")
METRIC_COLUMNS = (
    "tps", "latency_avg_ms", "latency_p95_ms", "latency_p99_ms", "read_iops", "write_iops", "total_iops",
    "read_latency_ms", "write_latency_ms", "cpu_pct", "wal_mb_s", "replay_lag_max_ms",
)
CI_COLUMNS = ("tps", "latency_avg_ms", "latency_p95_ms", "latency_p99_ms")
DECIMALS = {"tps": 1, "read_iops": 1, "write_iops": 1, "total_iops": 1, "cpu_pct": 1, "wal_mb_s": 2}


def _extra_axes(runs: list[RunRow]) -> list[str]:
    """Axes beyond the seed columns: parameters always, jobs only when it varies independently."""
    names: list[str] = []
    for r in runs:
        for k in r.axes:
            if k not in AXIS_COLUMNS and k not in names and k != "jobs":
                names.append(k)
    combos = {(r.axes.get("clients"), r.axes.get("jobs")) for r in runs}
    clients = {c for c, _ in combos}
    if len(combos) > len(clients):
        names.insert(0, "jobs")
    return names


def point_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    runs = store.runs(sweep_id)
    extra = _extra_axes(runs)
    columns = [*AXIS_COLUMNS, *extra, *METRIC_COLUMNS, "repeats", "failed_runs"]
    columns += [f"{c}_ci95" for c in CI_COLUMNS]
    groups: OrderedDict[int, list[RunRow]] = OrderedDict()
    for r in runs:
        groups.setdefault(r.point_id, []).append(r)
    rows = []
    for group in groups.values():
        ok = [r for r in group if r.status == "ok"]
        row: dict[str, Any] = {c: group[0].axes.get(c) for c in (*AXIS_COLUMNS, *extra)}
        for c in METRIC_COLUMNS:
            e = estimate([r.metrics.get(c) for r in ok])
            row[c] = e.mean if e else None
            if c in CI_COLUMNS:
                row[f"{c}_ci95"] = e.ci95 if e else None
        row["repeats"] = len(ok)
        row["failed_runs"] = len(group) - len(ok)
        rows.append(row)
    return columns, rows


def run_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    runs = store.runs(sweep_id)
    extra = _extra_axes(runs)
    columns = ["run_id", "repeat", "status", *AXIS_COLUMNS, *extra, *METRIC_COLUMNS, "dir", "reason"]
    rows = []
    for r in runs:
        row: dict[str, Any] = {"run_id": r.id, "repeat": r.repeat, "status": r.status, "dir": r.dir,
                               "reason": r.reason}
        row.update({c: r.axes.get(c) for c in (*AXIS_COLUMNS, *extra)})
        row.update({c: r.metrics.get(c) for c in METRIC_COLUMNS})
        rows.append(row)
    return columns, rows


def _fmt(col: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.{DECIMALS.get(col, 2)}f}"
    return str(value)


def _cell(col: str, row: dict[str, Any]) -> str:
    text = _fmt(col, row.get(col))
    half = row.get(f"{col}_ci95")
    if text and half is not None:
        text += f" ± {_fmt(col, half)}"
    return text


def display_columns(columns: list[str]) -> list[str]:
    return [c for c in columns if not c.endswith("_ci95")]


def render(columns: list[str], rows: list[dict[str, Any]], fmt: str, title: str | None = None) -> str:
    if fmt == "json":
        return json.dumps([{c: r.get(c) for c in columns} for r in rows], indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({c: ("" if r.get(c) is None else r.get(c)) for c in columns})
        return buf.getvalue()
    shown = display_columns(columns)
    if fmt == "markdown":
        lines = ["| " + " | ".join(shown) + " |", "|" + "|".join("---" for _ in shown) + "|"]
        lines += ["| " + " | ".join(_cell(c, r) for c in shown) + " |" for r in rows]
        return "\n".join(lines) + "\n"
    table = Table(title=title, title_justify="left", show_lines=False, header_style="bold")
    for c in shown:
        left = c in ("workload", "synchronous_commit", "status", "run_id", "dir", "reason")
        table.add_column(c, justify="left" if left else "right", no_wrap=True, min_width=len(c))
    for r in rows:
        table.add_row(*(_cell(c, r) for c in shown))
    console = Console(width=1000, record=True, file=io.StringIO())
    console.print(table)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"
