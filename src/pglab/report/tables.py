"""The seed-style table: one row per point (means over repeats ± 95 % CI), or one row per run."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import textwrap
from collections import OrderedDict
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pglab import metrics
from pglab.analysis.bottleneck import attribute, describe, mean_metrics, storage_ceiling_share
from pglab.analysis.capacity import capacity_table
from pglab.analysis.compare import TOO_FEW_REPEATS, VERDICTS, delta_fields, difference, uplift_tables
from pglab.analysis.cost import PART as COST_PART
from pglab.analysis.cost import cost_table
from pglab.analysis.flags import UNSTABLE, flag_text, flags
from pglab.analysis.stats import estimate, within
from pglab.analysis.steady import Dip, find_dips, tie_to_checkpoints
from pglab.report.scenarios import DURABILITY_ORDER, loud_findings, scenario_table
from pglab.report.scenarios import HEADERS as SCENARIO_HEADERS
from pglab.store.sqlite import RunRow, Store
from pglab.units import money

AXIS_COLUMNS = ("workload", "synchronous_commit", "clients")
METRIC_COLUMNS = metrics.keys("points")  # the catalogue's, in its order; the per-run table shows the same
CI_COLUMNS = metrics.with_ci("points")
DURABILITY = metrics.columns("durability")  # per level: the figure (its metric's name), its Δ (the column's key)
DELTA_SUFFIXES = ("vs_base_pct", "ci95_low_pct", "ci95_high_pct", "verdict")  # a level's Δ against the base
WALL_TIME_WITH_WHAT = 130  # the time table says what each phase is only on a terminal this wide (its longest: 129)
# columns that are no stored run metric: the cost table's and fio's (the storage phase's own figures)
DECIMALS = {**metrics.decimals(), "peak_tps": 1, "a": 1, "b": 1, "iops": 0, "host_iops": 0, "mb_s": 1,
            "lat_mean_ms": 3, "lat_p99_ms": 3, "lat_p999_ms": 3,
            **{f"{s.key}_{side}": s.metric.decimals for s in metrics.columns("compare") for side in ("a", "b")},
            **{f"{lv}_{s.metric.name}": s.metric.decimals for s in DURABILITY for lv in DURABILITY_ORDER}}
MONEY_COLUMNS = ("per_tps", "monthly")
# the point table's columns for CSV/JSON (and the HTML's figures), not the terminal's
POINT_EXTRAS = ("tps_cv_pct", "unstable", "storage_ceiling_pct", "tps_dips", "tps_dips_at_checkpoint", "bottleneck_tag")


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
    columns = [*AXIS_COLUMNS, *extra, *METRIC_COLUMNS, "repeats", "failed_runs", "bottleneck", "flags"]
    columns += [f"{c}_ci95" for c in CI_COLUMNS] + list(POINT_EXTRAS)
    by_label = store.ceilings(sweep_id) if sweep_id is not None else {}
    cores = _cores(store, sweep_id)
    sweep_ceilings = volume_ceilings(by_label, "data") or next(iter(by_label.values()), None)
    recorded = store.sweep_schedule(sweep_id) if sweep_id is not None else None
    target_pct = recorded.get("target_ci_pct") if recorded else None  # adaptive repeats: the TPS interval wanted
    groups: OrderedDict[int, list[RunRow]] = OrderedDict()
    for r in runs:
        groups.setdefault(r.point_id, []).append(r)
    rows = []
    for group in groups.values():
        ok = [r for r in group if r.status == "ok"]
        point_flags = flags([r.metrics for r in ok])
        # the storage axis (Kubernetes): a point is read against its own value's data volume
        value = group[0].axes.get("storage")
        ceilings = volume_ceilings(by_label, f"{value}/data") or sweep_ceilings if value is not None else \
            sweep_ceilings
        if target_pct is not None and not within([r.metrics.get("tps") for r in ok], target_pct):
            point_flags.append(f"TPS interval wider than ±{target_pct:g} % after {len(ok)} runs")
        row: dict[str, Any] = {c: group[0].axes.get(c) for c in (*AXIS_COLUMNS, *extra)}
        for c in METRIC_COLUMNS:
            e = estimate([r.metrics.get(c) for r in ok])
            row[c] = e.mean if e else None
            if c in CI_COLUMNS:
                row[f"{c}_ci95"] = e.ci95 if e else None
            if c == "tps":
                cv = e.cv if e else None
                row["tps_cv_pct"] = cv * 100 if cv is not None else None
                row["unstable"] = UNSTABLE in point_flags
        row["repeats"] = len(ok)
        row["flags"] = flag_text([("", point_flags)])
        row["failed_runs"] = len(group) - len(ok)
        means = mean_metrics(ok)
        verdicts = attribute(means, cores, group[0].axes.get("jobs"), ceilings) if ok else []
        row["bottleneck"] = describe(verdicts) if ok else ""
        row["bottleneck_tag"] = bottleneck_tag(verdicts) if ok else ""
        dips = [_dips(store, r) for r in ok]
        row["tps_dips"] = sum(len(d) for d in dips) / len(dips) if dips else None
        row["tps_dips_at_checkpoint"] = (sum(sum(x.checkpoint is not None for x in d) for d in dips) / len(dips)
                                         if dips else None)
        share = storage_ceiling_share(means, ceilings) if ok else None
        row["storage_ceiling_pct"] = share * 100 if share is not None else None
        rows.append(row)
    return columns, rows


BOTTLENECK_LEGEND = {
    "cpu": "the host's (or the primary's quota of) CPU is saturated",
    "interference": "processes outside the lab took the CPU",
    "client": "pgbench is the limit (its CPU, or backends wait for it)",
    "sync-rep": "backends wait for the standbys (IPC:SyncRep)",
    "wal-flush": "backends wait on WAL write/flush",
    "locks": "backends wait on locks",
    "storage": "the device is saturated or near its fio ceiling",
    "checkpoints": "checkpoints requested in the window (max_wal_size) and many full-page images",
    "backend-writes": "backends wrote most buffers themselves (shared_buffers, background writer)",
    "none": "no rule fired: nothing stood out",
}
"""The short bottleneck tags of the compact table, each explained once in the legend below it."""


def bottleneck_tag(verdicts: list[Any]) -> str:
    """The two strongest verdicts' resources, short enough for a narrow column ("wal-flush+sync-rep"); the
    wide table and the CSV keep every verdict with its figures."""
    if not verdicts:
        return "none"
    return "+".join("sync-rep" if v.resource == "sync-replication" else v.resource for v in verdicts[:2])


def _dips(store: Store, run: RunRow) -> list[Dip]:
    """The run's TPS dips inside its window, each tied to the checkpoint that began just before it, if any."""
    window = store.run_window(run.id)
    if window is None:
        return []
    series = [(ts, v) for ts, _src, _m, v in store.series(run.id, "pgbench") if _m == "tps" and v is not None]
    dips = find_dips(series, *window)
    if not dips:
        return []
    # an "immediate" checkpoint is the one the reset before the run forces and waits for: done before the window
    checkpoints = [ts for ts, reason in store.sweep_events(run.sweep_id, "checkpoint-start", window[0] - 60, window[1])
                   if "immediate" not in (reason or "")]
    return tie_to_checkpoints(dips, checkpoints)


def _cores(store: Store, sweep_id: int | None) -> int:
    try:
        environment = store.sweep_environment(sweep_id)
        return int(environment["cpu"]["affinity"]) if environment else (os.cpu_count() or 1)
    except (KeyError, TypeError, ValueError):
        return os.cpu_count() or 1


def volume_ceilings(by_label: dict[str, dict[str, float]], volume: str) -> dict[str, float] | None:
    """A volume's ceilings: its own label's, or where fio ran on each instance's node (Kubernetes: labels
    ``<volume>@<node>``), the first node's: the primary's when it was measured."""
    if volume in by_label:
        return by_label[volume]
    return next((v for label, v in by_label.items() if label.split("@")[0] == volume), None)


def run_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    runs = store.runs(sweep_id)
    extra = _extra_axes(runs)
    run_metrics = metrics.keys("runs")
    columns = ["run_id", "repeat", "status", *AXIS_COLUMNS, *extra, *run_metrics, "dips", "dir", "reason"]
    rows = []
    for r in runs:
        window = store.run_window(r.id)
        dips = _dips(store, r) if r.status == "ok" and window else []
        row: dict[str, Any] = {"run_id": r.id, "repeat": r.repeat, "status": r.status, "dir": r.dir, "reason": r.reason,
                               "dips": "; ".join(d.describe(window[0]) for d in dips) if window else None}
        row.update({c: r.axes.get(c) for c in (*AXIS_COLUMNS, *extra)})
        row.update({c: r.metrics.get(c) for c in run_metrics})
        rows.append(row)
    return columns, rows


# CSV/JSON: lat_* is the latency the table shows (lat_of: fdatasync for a synced profile, what a commit waits for;
# else the I/O), io_lat_* the read() or write() call alone, fdatasync_lat_* the fdatasync after each write
STORAGE_COLUMNS = ["path", "device", "profile", "iops", "mb_s", "lat_of", "lat_mean_ms", "lat_p99_ms", "lat_p999_ms",
                   "note", "label", "job", "direction", "io_lat_mean_ms", "io_lat_p50_ms", "io_lat_p99_ms",
                   "io_lat_p999_ms", "fdatasync_lat_mean_ms", "fdatasync_lat_p99_ms", "fdatasync_lat_p999_ms",
                   "json_file"]
STORAGE_SHOWN = ["path", "device", "profile", "iops", "mb_s", "lat_of", "lat_mean_ms", "lat_p99_ms", "lat_p999_ms",
                 "note"]
STORAGE_HEADERS = {"iops": "IOPS", "mb_s": "MB/s", "lat_of": "latency of", "lat_mean_ms": "lat mean ms",
                   "lat_p99_ms": "p99 ms", "lat_p999_ms": "p99.9 ms", "host_iops": "host IOPS",
                   "pod_host": "pod/host"}
# Kubernetes with storage.host_path: where each row ran (pvc:<class>, host:<dir>), and on a PVC's row the same job's
# IOPS on the node's host path with the ratio in-pod / host (the volume layer's cost; 1: none)
HOST_COLUMNS = ["place", "host_iops", "pod_host"]
_BESIDE = re.compile(r" beside (\S+)$")
_PVC_CLASS = re.compile(r"^pvc/\S+ \((.*)\) on node ")


def storage_shown(shown: list[str], rows: list[dict[str, Any]]) -> list[str]:
    """The storage table's shown columns, with the place and the host-path comparison when a host path ran."""
    if not any("place" in r for r in rows):
        return shown
    placed = {"path": ["path", "place"], "iops": ["iops", "host_iops", "pod_host"]}
    return [c2 for c in shown for c2 in placed.get(c, [c])]


def _place(label: str, path: str) -> str:
    if label.startswith("host:"):
        return label.rsplit("@", 1)[0]
    if m := _PVC_CLASS.match(path):
        return "pvc:" + ("default" if m.group(1) == "default storage class" else m.group(1))
    return path


def storage_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per fio job and direction: figures as fio's JSON has them (latencies in ms)."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    rows = []
    results = store.fio_results(sweep_id) if sweep_id is not None else []
    directions: dict[tuple[str, str], set[str]] = {}
    for r in results:
        directions.setdefault((r["label"], r["job"]), set()).add(r["direction"])
    for r in results:
        profile = r["job"]
        notes = [r["note"]] if r["note"] else []
        synced = r["sync_lat_mean_ms"] is not None
        if synced:  # fio reports write() and fdatasync() apart: a commit waits for the fdatasync, shown as latency
            notes.insert(0, f"write() alone: mean {r['lat_mean_ms']:.3f} ms, p99 {r['lat_p99_ms']:.3f} ms")
        shown = "sync_lat" if synced else "lat"
        rows.append({
            # data, wal, or <storage value>/data … on a storage axis
            "path": r["label"] if r["label"].split("@")[0].rsplit("/", 1)[-1] in ("data", "wal") else r["path"],
            "device": r["device"] or "(none)",
            "profile": f"{profile} {r['direction']}" if len(directions[r["label"], r["job"]]) > 1 else profile,
            "iops": r["iops"], "mb_s": r["bw_mb_s"], "lat_of": "fdatasync" if synced else "I/O",
            "lat_mean_ms": r[f"{shown}_mean_ms"], "lat_p99_ms": r[f"{shown}_p99_ms"],
            "lat_p999_ms": r[f"{shown}_p999_ms"], "note": "; ".join(notes), "label": r["label"], "job": r["job"],
            "direction": r["direction"], "io_lat_mean_ms": r["lat_mean_ms"], "io_lat_p50_ms": r["lat_p50_ms"],
            "io_lat_p99_ms": r["lat_p99_ms"], "io_lat_p999_ms": r["lat_p999_ms"],
            "fdatasync_lat_mean_ms": r["sync_lat_mean_ms"], "fdatasync_lat_p99_ms": r["sync_lat_p99_ms"],
            "fdatasync_lat_p999_ms": r["sync_lat_p999_ms"], "json_file": r["json_file"]})
    hosts = {(m.group(1), r["job"], r["direction"]): r["iops"] for r in results if r["label"].startswith("host:")
             and (m := _BESIDE.search(r["path"]))}
    if not hosts:
        return list(STORAGE_COLUMNS), rows
    for r, row in zip(results, rows, strict=True):
        host = hosts.get((r["label"], r["job"], r["direction"]))
        row["place"] = _place(r["label"], r["path"])
        if r["label"].startswith("host:"):  # the directory is in place: host@<node> beside <volume>@<node>
            row["path"] = "host@" + r["label"].rsplit("@", 1)[1]
        row["host_iops"] = host
        row["pod_host"] = r["iops"] / host if host and r["iops"] is not None else None
    return [*STORAGE_COLUMNS, *HOST_COLUMNS], rows


def ceilings_text(store: Store, sweep_id: int | None = None) -> str:
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    if sweep_id is None:
        return ""
    lines = []
    for label, values in store.ceilings(sweep_id).items():
        parts = ", ".join(f"{k} {v:,.3f}" if abs(v) < 10 else f"{k} {v:,.0f}" for k, v in values.items()
                          if v is not None)
        lines.append(f"storage ceilings ({label}): {parts}")
    return "\n".join(lines) + ("\n" if lines else "")


def _fmt(col: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if col in MONEY_COLUMNS or col.startswith(COST_PART):
            return money(value)
        if col.endswith("_pct") and ("_vs_" in col or "delta" in col or "ci95" in col or col == "uplift_pct"):
            return f"{value:+.1f} %"
        decimals = 1 if col.endswith("_tps") else DECIMALS.get(col, 2)
        return f"{value:.{decimals}f}"
    return str(value)


def _cell(col: str, row: dict[str, Any]) -> str:
    interval = interval_columns(col)
    if interval is not None and interval[0] in row:
        return delta_text(row.get(col), row.get(interval[0]), row.get(interval[1]), row.get(interval[2]))
    text = _fmt(col, row.get(col))
    half = row.get(f"{col}_ci95")
    if text and half is not None:
        text += f" ± {_fmt(col, half)}"
    return text


def interval_columns(col: str) -> tuple[str, str, str] | None:
    """For a Δ % column (``tps_delta_pct``, ``uplift_pct``, ``on_tps_vs_base_pct``), the columns of its 95 %
    interval and verdict, which tables and markdown show in the Δ's cell."""
    for suffix in ("_delta_pct", "_vs_base_pct", "uplift_pct"):
        if col.endswith(suffix):
            prefix = col[: -len(suffix)] + ("_" if suffix.startswith("_") else "")
            return f"{prefix}ci95_low_pct", f"{prefix}ci95_high_pct", f"{prefix}verdict"
    return None


def delta_text(delta: float | None, low: float | None, high: float | None, verdict: str | None) -> str:
    """A Δ % as every view prints it: "+3.9 % [−8.1, +15.9]" with its interval, "[unbounded]" when the interval
    has no bounds, and no interval but the verdict's "too few repeats" when there is none to compute."""
    if delta is None or (isinstance(delta, float) and math.isnan(delta)):
        return ""
    text = f"{delta:+.1f} %"
    if low is not None and high is not None:
        return f"{text} [{low:+.1f}, {high:+.1f}]"
    if verdict in VERDICTS:
        return f"{text} [unbounded]"
    if verdict == TOO_FEW_REPEATS:  # said in the cell: the compact tables show no verdict column
        return f"{text} (too few repeats)"
    return text


def display_columns(columns: list[str]) -> list[str]:
    """The columns a terminal or markdown table shows: intervals go into their figure's cell, not columns."""
    return [c for c in columns if not c.endswith(("_ci95", "ci95_low_pct", "ci95_high_pct", "p_value"))
            and c not in POINT_EXTRAS]


def durability_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """The price of durability: TPS and latency per synchronous_commit level side by side, with the % change
    against 'off' when it was measured, else against 'local', its 95 % interval and verdict (the same
    :func:`~pglab.analysis.compare.difference` as `pglab compare`: one run a side is "too few repeats").
    One row per workload × clients (× other axes); ``flags`` names the levels whose points are flagged."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    columns, points = point_table(store, sweep_id)
    levels = [lv for lv in DURABILITY_ORDER if any(p["synchronous_commit"] == lv for p in points)]
    if len(levels) < 2:
        return [], []
    base = "off" if "off" in levels else ("local" if "local" in levels else levels[0])
    keys = [c for c in columns[: columns.index("repeats")] if c not in (*METRIC_COLUMNS, "synchronous_commit")]
    groups: OrderedDict[tuple[Any, ...], dict[str, dict[str, Any]]] = OrderedDict()
    for p in points:
        groups.setdefault(tuple(p.get(k) for k in keys), {})[p["synchronous_commit"]] = p
    runs: dict[tuple[Any, ...], list[RunRow]] = {}
    for r in store.runs(sweep_id):
        if r.status == "ok":
            runs.setdefault((*(r.axes.get(k) for k in keys), r.axes.get("synchronous_commit")), []).append(r)
    out_columns = [*keys, "base"]
    for lv in levels:
        out_columns += [f"{lv}_{s.metric.name}" for s in DURABILITY]
        if lv != base:
            out_columns += [f"{lv}_{s.key}_{x}" for s in DURABILITY for x in DELTA_SUFFIXES]
    out_columns.append("flags")
    rows = []
    for key, by_level in groups.items():
        row: dict[str, Any] = dict(zip(keys, key, strict=True))
        row["base"] = base
        ref = runs.get((*key, base), [])
        for lv in levels:
            p = by_level.get(lv, {})
            row.update({f"{lv}_{s.metric.name}": p.get(s.metric.name) for s in DURABILITY})
            if lv == base:
                continue
            mine = runs.get((*key, lv), [])
            for s in DURABILITY:
                m = s.metric.name
                d = difference(m, [r.metrics.get(m) for r in ref], [r.metrics.get(m) for r in mine])
                row.update(delta_fields(d, f"{lv}_{s.key}"))
        row["flags"] = flag_text([(lv, by_level[lv]["flags"].split(", ")) for lv in levels
                                  if by_level.get(lv, {}).get("flags")])
        rows.append(row)
    return out_columns, rows


def durability_headers(columns: list[str], delta: str = "Δ {}") -> dict[str, str]:
    """A level's columns titled "<level> <title>": the catalogue's header of its figure, ``delta`` of the figure's
    short name for its Δ (the terminal's "Δ lat"), "<short name> verdict" for its verdict."""
    titles = {**{s.metric.name: s.header for s in DURABILITY}, **{f"{s.key}_vs_base_pct": delta.format(s.short)
                                                                  for s in DURABILITY},
              **{f"{s.key}_verdict": f"{s.short} verdict" for s in DURABILITY}}
    return {c: f"{lv} {titles[rest]}" for c in columns for lv in DURABILITY_ORDER
            if c.startswith(f"{lv}_") and (rest := c[len(lv) + 1:]) in titles}


def durability_view(columns: list[str], rows: list[dict[str, Any]],
                    ) -> tuple[list[str], tuple[str | tuple[str, ...], ...]]:
    """The compact price of durability: the first figure of the catalogue's view at the base level, its Δ and
    verdict at the others, the flags, then the other figures' Δ; what is left out (the last first) to fit: each
    other figure's Δ (the last figure first), the flags, the verdicts, every level's at once."""
    base = rows[0]["base"]
    others = [lv for lv in DURABILITY_ORDER if lv != base and f"{lv}_{DURABILITY[0].key}_vs_base_pct" in columns]
    head, rest = DURABILITY[0], DURABILITY[1:]
    verdicts = tuple(f"{lv}_{head.key}_verdict" for lv in others)
    flagged = ("flags",) if any(r.get("flags") for r in rows) else ()
    deltas = [tuple(f"{lv}_{s.key}_vs_base_pct" for lv in others) for s in rest]
    shown = [*columns[: columns.index("base")], f"{base}_{head.metric.name}",
             *(f"{lv}_{head.key}_vs_base_pct" for lv in others), *verdicts, *flagged, *(c for g in deltas for c in g)]
    return shown, (verdicts, *flagged, *deltas)


def compare_view() -> tuple[list[str], dict[str, str], tuple[str, ...]]:
    """`pglab compare`'s figures from the catalogue's compare view (after the axes): the runs, the first figure's A,
    B, Δ and verdict, the others' Δ and verdict; their headers; the columns left out (the last first) to fit: jobs,
    the runs, the others' verdicts, the flags, the others' Δ (the last figure first)."""
    head, rest = metrics.columns("compare")[0], metrics.columns("compare")[1:]
    deltas, verdicts = [f"{s.key}_delta_pct" for s in rest], [f"{s.key}_verdict" for s in rest]
    shown = ["runs_a", "runs_b", *(f"{head.key}_{x}" for x in ("a", "b", "delta_pct", "verdict")),
             *(c for s in rest for c in (f"{s.key}_delta_pct", f"{s.key}_verdict"))]
    headers = {"runs_a": "A runs", "runs_b": "B runs", "synchronous_commit": "sync commit",
               f"{head.key}_a": f"A {head.header}", f"{head.key}_b": f"B {head.header}",
               f"{head.key}_verdict": "verdict", **{f"{s.key}_delta_pct": f"Δ {s.short} % [95 %]"
                                                   for s in (head, *rest)},
               **{f"{s.key}_verdict": f"{s.short} verdict" for s in rest}}
    return shown, headers, (*deltas, "flags", *verdicts, "runs_b", "runs_a", "jobs")


def render(columns: list[str], rows: list[dict[str, Any]], fmt: str, title: str | None = None,
           shown: list[str] | None = None, headers: dict[str, str] | None = None, width: int | None = None,
           optional: tuple[str | tuple[str, ...], ...] = (), plain: tuple[str, ...] = ()) -> str:
    """One table as text. In the terminal format every row stays on one line (no cell wraps): with ``width``,
    the ``optional`` columns (or groups of columns, left out together) are left out, the last first, until the
    table fits (and a line says which);
    without, nothing is cut. ``plain`` columns show their mean without its ± interval."""
    if fmt == "json":
        return json.dumps([{c: r.get(c) for c in columns} for r in rows], indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({c: ("" if r.get(c) is None else r.get(c)) for c in columns})
        return buf.getvalue()
    shown = list(shown or display_columns(columns))
    headers = headers or {}
    if fmt == "markdown":
        lines = ["| " + " | ".join(headers.get(c, c) for c in shown) + " |", "|" + "|".join("---" for _ in shown) + "|"]
        lines += ["| " + " | ".join(_cell(c, r) for c in shown) + " |" for r in rows]
        return "\n".join(lines) + "\n"
    droppable = [g for g in ((o,) if isinstance(o, str) else o for o in optional) if set(g) & set(shown)]
    left_out: list[str] = []
    while True:
        text = _rich_table(shown, rows, headers, plain)
        if width is None or not droppable or max(map(len, text.splitlines()), default=0) <= width:
            break
        for c in droppable.pop():
            if c in shown:
                left_out.append(c)
                shown.remove(c)
    if title:  # a line of its own, wrapped to the width the table fits (between words: a path is never cut)
        text = (textwrap.fill(title, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)
                if width is not None else title) + "\n" + text
    if left_out:
        text += _prose(f"(left out to fit {width} columns: {', '.join(headers.get(c, c) for c in left_out)}; "
                       "--wide shows every column)", width)
    return text


def _rich_table(shown: list[str], rows: list[dict[str, Any]], headers: dict[str, str], plain: tuple[str, ...]) -> str:
    table = Table(show_lines=False, header_style="bold")
    for c in shown:
        left = c in ("workload", "synchronous_commit", "status", "run_id", "dir", "reason", "path", "device", "profile",
                     "note", "dips", "flags", "bottleneck_tag", "lat_of", "place") or c.endswith("verdict")
        name = headers.get(c, c)
        table.add_column(name, justify="left" if left else "right", no_wrap=True, min_width=len(name))
    for r in rows:
        table.add_row(*(Text(_fmt(c, r.get(c)) if c in plain else _cell(c, r)) for c in shown))  # text, not markup
    console = Console(width=100_000, record=True, file=io.StringIO())
    console.print(table)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def compact_view(per_run: bool) -> tuple[list[str], dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """The default terminal table's figures after the axes, from the catalogue's compact view (TPS ± its interval,
    p99, CPU, the disk's write IOPS and latency), then a short bottleneck tag and the flags (per run: the dips);
    their headers, those left out (the last first) when the terminal is narrower, those shown without ±."""
    view = [s for s in metrics.columns("compact") if s.column.per_run or not per_run]
    headers = {"synchronous_commit": "sync commit", "bottleneck_tag": "bottleneck", **{
        s.key: s.header + (" ± 95 %" if s.column.interval and not per_run else "") for s in metrics.columns("compact")}}
    optional = tuple(s.key for s in view if s.column.optional)
    return ([s.key for s in view] + (["dips"] if per_run else ["bottleneck_tag", "flags"]), headers,
            (*optional, "dips") if per_run else ("bottleneck_tag", *optional, "flags"),
            tuple(s.key for s in view if not s.column.interval))


def database_columns(columns: list[str], rows: list[dict[str, Any]], chosen: list[str] | None, wide: bool,
                     per_run: bool) -> list[str]:
    """The database table's terminal columns: the axes (and run id) always, then ``chosen`` (``--columns``),
    every column (``--wide``), or the compact default."""
    if wide:
        return display_columns(columns)
    fixed = [c for c in columns if c in ("run_id", "status", *AXIS_COLUMNS, "rate", "storage")
             or c.startswith("parameters.") or (c == "jobs" and c in columns[:8])]
    figures = chosen if chosen is not None else [c for c in compact_view(per_run)[0] if c in columns]
    if chosen is None and "load_pods" in columns and any(r.get("load_pods") for r in rows):
        fixed.append("load_pods")  # a point driven by several pgbench pods says so (Kubernetes run.load_pods)
    if chosen is None and not any(r.get("flags") for r in rows):
        figures = [c for c in figures if c != "flags"]
    return [*fixed, *(c for c in figures if c not in fixed)]


def selectable_columns(store: Store, sweep_id: int | None, per_run: bool) -> list[str]:
    """The names ``--columns`` accepts for this sweep's database table."""
    columns, _ = (run_table if per_run else point_table)(store, sweep_id)
    return [c for c in columns if not c.endswith("_ci95")]


def bottleneck_legend(rows: list[dict[str, Any]]) -> str:
    """One line per bottleneck tag the table shows: what the short column means."""
    seen = dict.fromkeys(t for r in rows for t in (r.get("bottleneck_tag") or "").split("+") if t)
    lines = [f"  {t}: {BOTTLENECK_LEGEND[t]}" for t in seen if t in BOTTLENECK_LEGEND]
    out = ["bottleneck (the figures behind each: --wide, or --format csv):", *lines] if lines else []
    by_flag: dict[str, list[str]] = {}
    for r in rows:
        for flag in (r.get("flags") or "").split(", "):
            if flag:
                by_flag.setdefault(flag, []).append(" ".join(str(r.get(c)) for c in AXIS_COLUMNS))
    for flag, where in by_flag.items():
        out.append(f"flagged {flag}: " + (f"every point ({len(rows)})" if len(where) == len(rows) > 1
                                          else "; ".join(where)))
    return "\n".join(out) + "\n" if out else ""


def limits_note(store: Store, sweep_id: int | None = None) -> str | None:
    """A warning when the plan's resource limits were not in force (limits: best-effort) for some runs."""
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    runs = store.runs(sweep_id)
    missing = [r for r in runs if r.metrics.get("limits_applied") == 0.0]
    if not missing:
        return None
    return (f"resource limits were NOT applied in {len(missing)} of {len(runs)} run(s) (limits: best-effort); "
            "their figures are those of an unlimited lab; see limits.json in each run folder")


TOO_FEW_NOTE = (f"{TOO_FEW_REPEATS}: a Δ with fewer than 2 runs on a side has no interval, so it says nothing yet "
                "about a difference;\n  set run.repeats to 3 or more\n")
TABLES = ("database", "storage", "durability", "scenarios", "capacity", "cost", "uplift", "tiers", "tenants", "time")
UPLIFT_HEADERS = {"a": "A tps", "b": "B tps", "uplift_pct": "uplift % [95 %]", "ci95_low_pct": "95 % low",
                  "ci95_high_pct": "95 % high"}


def uplift_table(store: Store, sweep_id: int | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """Every uplift table of the sweep in one, each row naming its comparison (for CSV/JSON)."""
    columns: list[str] = ["comparison"]
    rows: list[dict[str, Any]] = []
    for title, cols, table_rows in uplift_tables(store, sweep_id):
        columns += [c for c in cols if c not in columns]
        rows += [{"comparison": title.split(" (")[0].removeprefix("uplift: "), **r} for r in table_rows]
    return (columns, rows) if rows else ([], [])


def _prose(text: str, width: int | None) -> str:
    """Notes below the tables wrapped to the terminal (120 columns when piped), each paragraph apart."""
    limit = min(width or 120, 120)
    return "".join(textwrap.fill(line, limit, subsequent_indent="  ", break_on_hyphens=False) + "\n"
                   for line in text.splitlines())


def full_report(store: Store, fmt: str, sweep_id: int | None = None, per_run: bool = False,
                table: str | None = None, title: str | None = None, width: int | None = None, wide: bool = False,
                columns: list[str] | None = None) -> str:
    """What `pglab report` and the end of `pglab run` print: the storage table (when fio ran), its ceilings,
    the database table, the price of durability (when several synchronous_commit levels ran) … and where the wall
    time went (the ``time`` table).
    CSV and JSON hold one table: the database one unless ``table`` names another. The terminal tables are
    compact and fit ``width`` unless ``wide``; ``columns`` chooses the database table's figures."""
    from pglab.report import tiers

    if table == "time":
        return time_report(store, fmt, sweep_id, width)
    fio_columns, fio_rows = storage_table(store, sweep_id)
    if tiers.is_tenants_sweep(store, sweep_id):
        text = _tenants_report(store, fmt, sweep_id, table, fio_columns, fio_rows)
        if table is None and fmt in ("table", "markdown"):  # where the wall time went, below the tenants' tables
            text = "\n".join(p for p in (text, time_report(store, fmt, sweep_id, width)) if p)
        return text
    db_columns, db_rows = (run_table if per_run else point_table)(store, sweep_id)
    dur_columns, dur_rows = durability_table(store, sweep_id)
    cost_columns, cost_rows = cost_table(store, sweep_id)
    if fmt in ("csv", "json"):
        which = table or ("database" if db_rows or not fio_rows else "storage")
        read = {"uplift": uplift_table, "scenarios": scenario_table, "capacity": capacity_table}.get(which)
        chosen = read(store, sweep_id) if read else {
            "storage": (fio_columns, fio_rows), "durability": (dur_columns, dur_rows),
            "cost": (cost_columns, cost_rows)}.get(which, (db_columns, db_rows))
        return render(*chosen, fmt)
    compact = fmt == "table" and not wide
    width = None if wide else width
    parts = []
    compared: list[dict[str, Any]] = []  # the rows of the comparison tables printed, for the note below
    if fio_rows and table in (None, "storage"):
        shown = storage_shown([c for c in STORAGE_SHOWN if c != "note"] if compact else STORAGE_SHOWN, fio_rows)
        parts.append(render(fio_columns, fio_rows, fmt, title="storage (fio)", shown=shown, headers=STORAGE_HEADERS,
                            width=width, optional=("lat_p999_ms", "mb_s", "device") if compact else ()))
        if compact:
            parts.append(_prose("".join(f"{r['path']} {r['profile']}: {r['note']}\n" for r in fio_rows if r["note"]),
                                width))
        parts.append(_prose(ceilings_text(store, sweep_id), width))
    if (db_rows or not fio_rows) and table in (None, "database"):
        shown = database_columns(db_columns, db_rows, columns, wide or (fmt != "table" and columns is None), per_run)
        _, headers, droppable, plain = compact_view(per_run)
        parts.append(render(db_columns, db_rows, fmt, title=title, shown=shown, headers=headers if compact else None,
                            width=width, optional=droppable if compact and columns is None else (),
                            plain=plain if compact and columns is None else ()))
        if compact and not per_run:
            parts.append(_prose(bottleneck_legend(db_rows), width))
        if compact and per_run and columns is None:  # why a run failed: below the table, not in a wide column
            parts.append(_prose("".join(f"{r['run_id']} {r['status']}: {r['reason']}\n" for r in db_rows
                                        if r.get("reason")), width))
    if dur_rows and table in (None, "durability") and not per_run:
        compared += dur_rows
        base = dur_rows[0]["base"]
        shown = [c for c in display_columns(dur_columns) if c != "base"]
        optional: tuple[str | tuple[str, ...], ...] = ()
        if compact:
            shown, optional = durability_view(dur_columns, dur_rows)
        parts.append(render(dur_columns, dur_rows, fmt, title="price of durability: synchronous_commit levels side "
                            f"by side, Δ = % vs {base} [95 % interval]", shown=shown,
                            headers=durability_headers(dur_columns),
                            width=width, optional=optional))
    sc_columns, sc_rows = scenario_table(store, sweep_id)
    if sc_rows and table in (None, "scenarios") and not per_run:
        parts.append(render(sc_columns, sc_rows, fmt, title="scenarios: outage (RTO), acknowledged writes lost and "
                            "in doubt (witness writer), load before / during / after", headers=SCENARIO_HEADERS))
        parts += [f"{line}\n" for line in loud_findings(sc_rows)]
    cap_columns, cap_rows = capacity_table(store, sweep_id)
    if cap_rows and table in (None, "capacity") and not per_run:
        parts.append(render(cap_columns, cap_rows, fmt, title="capacity: the highest rate (tx/s) whose latency "
                            "percentile held the target, and the lowest that did not", width=width))
    if table in (None, "uplift") and not per_run and db_rows:
        for up_title, up_columns, up_rows in uplift_tables(store, sweep_id):
            compared += up_rows
            parts.append(render(up_columns, up_rows, fmt, title=up_title, headers=UPLIFT_HEADERS))
    if (note := limits_note(store, sweep_id)) and table in (None, "database"):
        parts.append(_prose(note, width))
    if any(v == TOO_FEW_REPEATS for r in compared for v in r.values()):
        parts.append(_prose(TOO_FEW_NOTE, width))
    if cost_rows and table in (None, "cost") and not per_run:
        breakdown = tuple(c for c in cost_columns if c.startswith(COST_PART))  # cost.breakdown's parts, monthly
        parts.append(render(cost_columns, cost_rows, fmt, title="cost at peak TPS", width=width,
                            headers={"per_tps": f"{next(r['currency'] for r in cost_rows if r['currency'])}/TPS·month",
                                     "peak_tps": "peak tps", "at_clients": "clients",
                                     "at_synchronous_commit": "sync commit",
                                     **{c: f"{c.removeprefix(COST_PART)}/month" for c in breakdown}},
                            optional=("monthly", "currency", breakdown) if compact else ()))
    if table is None and not per_run:  # last: where the sweep's wall time went, and its duty cycle
        parts.append(time_report(store, fmt, sweep_id, width))
    return "\n".join(p for p in parts if p)


def time_report(store: Store, fmt: str, sweep_id: int | None, width: int | None = None) -> str:
    """Where the sweep's wall time went, phase by phase, and its duty cycle ('' for a sweep without phases)."""
    from pglab.report.walltime import duty_cycle_line, wall_time, wall_time_rows

    sid = sweep_id if sweep_id is not None else store.latest_sweep_id()
    account = wall_time(store, sid) if sid is not None else None
    if account is None:
        return ""
    columns, rows = wall_time_rows(account)
    if fmt in ("csv", "json"):
        return render(columns, rows, fmt)
    shown = [{**r, "seconds": f"{r['seconds']:.1f}", "share_pct": f"{r['share_pct']:.1f}" if r["share_pct"] is not None
              else "", "per_run_s": f"{r['per_run_s']:.2f}" if r["per_run_s"] is not None else ""} for r in rows]
    table = render(columns, shown, fmt, headers={"share_pct": "share %", "per_run_s": "per run s"},
                   shown=columns if fmt == "markdown" or width is None or width >= WALL_TIME_WITH_WHAT
                   else columns[:-1])
    return _prose(f"where the wall time went: {duty_cycle_line(account)}", width) + table


def table_problem(store: Store, sweep_id: int | None, table: str | None) -> str | None:
    """Why ``--table`` has nothing to show for this sweep, in one sentence, or None when it has."""
    from pglab.report import tiers

    if table is None:
        return None
    tenants = tiers.is_tenants_sweep(store, sweep_id)
    have = {"storage": lambda: bool(storage_table(store, sweep_id)[1]),
            "database": lambda: sweep_id is not None and bool(store.point_ids(sweep_id)),
            "durability": lambda: not tenants and bool(durability_table(store, sweep_id)[1]),
            "scenarios": lambda: not tenants and bool(scenario_table(store, sweep_id)[1]),
            "cost": lambda: not tenants and bool(cost_table(store, sweep_id)[1]),
            "capacity": lambda: not tenants and bool(capacity_table(store, sweep_id)[1]),
            "uplift": lambda: not tenants and bool(uplift_tables(store, sweep_id)),
            "tiers": lambda: tenants and bool(tiers.tier_table(store, sweep_id)[1]),
            "tenants": lambda: tenants and bool(tiers.tenant_table(store, sweep_id)[1]),
            "time": lambda: bool(time_report(store, "csv", sweep_id))}
    why = {"storage": "the plan ran no storage (fio) phase",
           "database": "it measured storage alone (pglab fio), no pgbench point",
           "durability": "it needs two or more synchronous_commit levels",
           "scenarios": "the plan ran no scenario",
           "cost": "the plan has no cost section",
           "capacity": "the plan has no capacity section",
           "uplift": "the sweep varies no configuration axis (compare two folders with 'pglab compare A B --uplift')",
           "tiers": "it is for tenants plans", "tenants": "it is for tenants plans",
           "time": "it was run by a pglab that did not record where the wall time went"}
    if have[table]():
        return None
    return f"--table: sweep {sweep_id} has no {table} table: {why[table]}; see the tables it has with no --table."


def _tenants_report(store: Store, fmt: str, sweep_id: int | None, table: str | None, fio_columns: list[str],
                    fio_rows: list[dict[str, Any]]) -> str:
    """A tenants plan: the tier table and the host view instead of the matrix's database table."""
    from pglab.report import tiers

    if fmt in ("csv", "json"):
        which = {"storage": (fio_columns, fio_rows), "tenants": tiers.tenant_table(store, sweep_id),
                 "database": tiers.host_table(store, sweep_id)}
        return render(*which.get(table or "tiers", tiers.tier_table(store, sweep_id)), fmt)
    parts = []
    if fio_rows and table in (None, "storage"):
        parts.append(render(fio_columns, fio_rows, fmt, title="storage (fio)",
                            shown=storage_shown(STORAGE_SHOWN, fio_rows), headers=STORAGE_HEADERS))
        parts.append(ceilings_text(store, sweep_id))
    tier_columns, tier_rows = tiers.tier_table(store, sweep_id)
    if table in (None, "tiers") and tier_rows:
        parts.append(render(tier_columns, tier_rows, fmt, headers=tiers.tier_headers(store, sweep_id),
                            title="tiers: per tenant, mean over the tier's tenants (median over repeats); spread = "
                            "(max − min) / mean TPS within the tier"))
        if any(r.get("tps_verdict") == TOO_FEW_REPEATS for r in tier_rows):
            parts.append(TOO_FEW_NOTE)
    host_columns, host_rows = tiers.host_table(store, sweep_id)
    if table in (None, "database") and host_rows:
        parts.append(render(host_columns, host_rows, fmt, headers=tiers.HOST_HEADERS,
                            title="host: every tenant added up, same window"))
    if not tier_rows and table in (None, "tiers", "database"):
        parts.append("no run of this sweep has ended yet\n")
    if table == "tenants":
        parts.append(render(*tiers.tenant_table(store, sweep_id), fmt, title="tenants"))
    if (note := limits_note(store, sweep_id)) and table in (None, "tiers"):
        parts.append(note + "\n")
    return "\n".join(p for p in parts if p)
