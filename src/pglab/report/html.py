"""The offline HTML report: one self-contained file (plotly's JavaScript embedded, no request leaves it)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from plotly.offline import get_plotlyjs

from pglab.analysis.compare import uplift_tables
from pglab.analysis.cost import cost_table
from pglab.analysis.flags import UNSTABLE_CV
from pglab.analysis.steady import find_dips
from pglab.report import tiers
from pglab.report.tables import (
    delta_text,
    durability_table,
    interval_columns,
    limits_note,
    point_table,
    run_table,
    storage_table,
)
from pglab.store.sqlite import Store

MAX_SERIES_RUNS = 24  # per-run time series charts; the rest of the runs are in the tables


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _section(sid: str, title: str, columns: list[str], rows: list[dict[str, Any]], note: str = "",
             headers: dict[str, str] | None = None) -> dict[str, Any]:
    text = {c for c in columns if rows and isinstance(rows[0].get(c), str)}
    long = {c for c in columns if c in ("bottleneck", "note", "dips", "reason")}
    return {"id": sid, "title": title, "columns": columns, "headers": headers or {}, "text": text, "long": long,
            "note": note,
            "rows": [{c: _cell(r.get(c)) for c in columns} for r in rows]}


def _line_chart(cid: str, title: str, traces: list[dict[str, Any]], xtitle: str, ytitle: str,
                css: str = "chart", shapes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    layout = {"xaxis": {"title": {"text": xtitle}}, "yaxis": {"title": {"text": ytitle}},
              "margin": {"t": 20}, "legend": {"orientation": "h"}, "shapes": shapes or []}
    return {"id": cid, "title": title, "css": css, "data": json.dumps(traces), "layout": json.dumps(layout)}


def _by_configuration(points: list[dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        extra = " ".join(f"{k.split('.', 1)[1]}={p[k]}" for k in p if k.startswith("parameters."))
        name = f"{p['workload']} {p['synchronous_commit']} {extra}".strip()
        groups.setdefault(name, []).append(p)
    traces = []
    for name, ps in groups.items():
        ps = sorted(ps, key=lambda p: p["clients"])
        traces.append({"type": "scatter", "mode": "lines+markers", "name": name,
                       "x": [p["clients"] for p in ps], "y": [p.get(metric) for p in ps]})
    return traces


def _delta(col: str, row: dict[str, Any]) -> str:
    """A Δ with its interval and verdict, as the terminal shows it: "−92.9 % [−190.2, +4.4] (no significant
    difference)"."""
    low, high, verdict = interval_columns(col) or ("", "", "")
    return f"{delta_text(row.get(col), row.get(low), row.get(high), row.get(verdict))} ({row.get(verdict)})"


def build(store: Store, sweep_id: int | None = None) -> str:
    sweep_id = sweep_id if sweep_id is not None else store.latest_sweep_id()
    if sweep_id is None:
        raise ValueError("no sweep in this store")
    sweep = next(s for s in store.sweeps() if s["id"] == sweep_id)
    if tiers.is_tenants_sweep(store, sweep_id):
        return _render(sweep, sweep_id, *_tenants_parts(store, sweep_id))
    columns, points = point_table(store, sweep_id)
    _, runs = run_table(store, sweep_id)
    fio_columns, fio_rows = storage_table(store, sweep_id)
    dur_columns, dur_rows = durability_table(store, sweep_id)
    cost_columns, cost_rows = cost_table(store, sweep_id)
    uplifts = uplift_tables(store, sweep_id) if runs else []

    summary = [f"{len(points)} points, {sum(1 for r in runs if r['status'] == 'ok')} successful runs "
               f"({sum(1 for r in runs if r['status'] != 'ok')} failed or interrupted); sweep {sweep['status']}."]
    for wl in dict.fromkeys(p["workload"] for p in points):
        best = max((p for p in points if p["workload"] == wl and p["tps"] is not None), key=lambda p: p["tps"],
                   default=None)
        if best:
            summary.append(f"{wl}: peak {best['tps']:,.0f} TPS at {best['clients']} clients, "
                           f"synchronous_commit={best['synchronous_commit']}; bottleneck: {best['bottleneck']}.")
    for row in dur_rows:
        costs = [f"{k.removesuffix('_tps_vs_base_pct')} {_delta(k, row)}" for k, v in row.items()
                 if k.endswith("_tps_vs_base_pct") and v is not None]
        if costs:
            summary.append(f"price of durability, {row['workload']} at {row['clients']} clients (TPS vs "
                           f"{row['base']}, 95 % interval): {', '.join(costs)}"
                           + (f"; flagged: {row['flags']}." if row.get("flags") else "."))
    for up_title, _, up_rows in uplifts:
        parts = [f"{_delta('uplift_pct', r)} at {r['clients']} clients" + (f", {r['flags']}" if r.get("flags") else "")
                 for r in up_rows if r.get("uplift_pct") is not None]
        if parts:
            summary.append(f"{up_title.split(' (')[0]}: {', '.join(parts)}.")
    unsteady = [p for p in points if p.get("tps_dips")]
    if unsteady:
        at_checkpoint = sum(1 for p in unsteady if p.get("tps_dips_at_checkpoint"))
        summary.append(f"{len(unsteady)} point(s) had TPS dips (> 30 % below the run's median) inside the window: "
                       + ", ".join(f"{p['workload']} {p['synchronous_commit']} {p['clients']} clients"
                                   for p in unsteady[:6]) + ("…" if len(unsteady) > 6 else "")
                       + f"; in {at_checkpoint} of them a checkpoint had started just before (runs table: 'dips').")
    if note := limits_note(store, sweep_id):
        summary.insert(0, note[0].upper() + note[1:] + ".")
    flagged = [p for p in points if p.get("flags")]
    if flagged:
        summary.append(f"{len(flagged)} point(s) flagged (unstable: TPS CV over repeats > {UNSTABLE_CV * 100:g} %; "
                       "interfered: other load on the lab's CPU): "
                       + ", ".join(f"{p['workload']} {p['synchronous_commit']} {p['clients']} clients {p['flags']}"
                                   for p in flagged[:6]) + ("…" if len(flagged) > 6 else "") + ".")
    summary += [f"storage {r['path']} {r['profile']}: {r['note']}" for r in fio_rows if r.get("note")]
    summary += [f"{r['workload']}: {r['per_tps']:.4f} {r['currency']} per TPS·month at peak." for r in cost_rows]

    shown = [c for c in columns if not c.endswith("_ci95")]
    tables = [_section("points", "Per configuration (means over repeats)", shown, points,
                       "95 % intervals are in the CSV export; the bottleneck comes from the run's own figures.")]
    if dur_rows:
        tables.append(_section("durability", "Price of durability", dur_columns, dur_rows))
    for i, (up_title, up_columns, up_rows) in enumerate(uplifts):
        tables.append(_section(f"uplift{i}", up_title[0].upper() + up_title[1:], up_columns, up_rows))
    if not uplifts:
        tables.append(_section("uplift", "Uplift", [], [], "This sweep varies no configuration axis (a parameter "
                               "list, …); compare two result folders with 'pglab compare A B --uplift'."))
    if cost_rows:
        tables.append(_section("cost", "Cost at peak TPS", cost_columns, cost_rows))
    if fio_rows:
        tables.append(_section("storage", "Storage profiles (fio)", fio_columns, fio_rows))
    tables.append(_section("runs", "Runs (every figure traces to its run id and folder)",
                           ["run_id", "status", "workload", "synchronous_commit", "clients", "tps", "latency_p99_ms",
                            "dips", "dir", "reason"], runs))

    charts = [
        _line_chart("tps_vs_clients", "TPS vs clients", _by_configuration(points, "tps"), "clients", "TPS"),
        _line_chart("latency_vs_clients", "Latency p95 / p99 vs clients",
                    [{**t, "name": f"{t['name']} p95"} for t in _by_configuration(points, "latency_p95_ms")]
                    + [{**t, "name": f"{t['name']} p99", "line": {"dash": "dot"}}
                       for t in _by_configuration(points, "latency_p99_ms")], "clients", "ms"),
        _line_chart("iops_vs_clients", "Device IOPS and latency vs clients",
                    [{**t, "name": f"{t['name']} write IOPS"} for t in _by_configuration(points, "write_iops")]
                    + [{**t, "name": f"{t['name']} read IOPS"} for t in _by_configuration(points, "read_iops")]
                    + [{**t, "name": f"{t['name']} write latency ms", "yaxis": "y2", "line": {"dash": "dot"}}
                       for t in _by_configuration(points, "write_latency_ms")], "clients", "IOPS"),
    ]
    charts[-1]["layout"] = json.dumps({**json.loads(charts[-1]["layout"]),
                                       "yaxis2": {"title": {"text": "ms"}, "overlaying": "y", "side": "right"}})
    for run in [r for r in runs if r["status"] == "ok"][:MAX_SERIES_RUNS]:
        charts.append(_run_chart(store, run, sweep_id))
    return _render(sweep, sweep_id, summary, tables, charts)


def _render(sweep: dict[str, Any], sweep_id: int, summary: list[str], tables: list[dict[str, Any]],
            charts: list[dict[str, Any]]) -> str:
    env = sweep.get("environment")
    environment = json.dumps(json.loads(env), indent=1) if env else "(not captured)"
    templates = Environment(loader=PackageLoader("pglab.report", "templates"), autoescape=select_autoescape())
    return templates.get_template("report.html.j2").render(
        title=sweep["plan_name"], subtitle=f"sweep {sweep_id}, pglab {sweep['pglab_version']}",
        summary=summary, tables=tables, charts=charts, environment=environment, plotly_js=get_plotlyjs())


def _tenants_parts(store: Store, sweep_id: int) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """A tenants plan: the tier table, the host view, every tenant; bars per tier; each run's TPS per tenant."""
    tier_columns, tier_rows = tiers.tier_table(store, sweep_id)
    host_columns, host_rows = tiers.host_table(store, sweep_id)
    tenant_columns, tenant_rows = tiers.tenant_table(store, sweep_id)
    headers = tiers.tier_headers(store, sweep_id)
    summary = []
    if note := limits_note(store, sweep_id):
        summary.append(note[0].upper() + note[1:] + ".")
    for h in host_rows:
        parts = [f"{r['tier']} {r['tps_per_instance']:,.1f} TPS per instance"
                 + (f" ({_delta('tps_vs_base_pct', r)} vs {headers['tps_vs_base_pct'][3:]})"
                    if r.get("tps_vs_base_pct") is not None else "")
                 for r in tier_rows if r["arrangement"] == h["arrangement"] and r.get("tps_per_instance") is not None]
        summary.append(f"{h['arrangement']}: {h['tenants']} tenants, host {h['tps'] or 0:,.0f} TPS; "
                       + "; ".join(parts) + ".")
    tables = [_section("tiers", "Tiers (per tenant, mean over the tier's tenants; median over repeats)",
                       tier_columns, tier_rows, "spread = (max − min) / mean TPS within the tier.", headers=headers),
              _section("host", "Host (every tenant added up, same window)", host_columns, host_rows,
                       headers=tiers.HOST_HEADERS),
              _section("tenants", "Every tenant of every run", tenant_columns, tenant_rows)]
    charts = []
    for metric, title, unit in (("tps_per_instance", "TPS per instance, per tier", "TPS"),
                                ("latency_p99_ms", "Latency p99 per tier", "ms")):
        traces = []
        for arrangement in dict.fromkeys(r["arrangement"] for r in tier_rows):
            rows = [r for r in tier_rows if r["arrangement"] == arrangement]
            traces.append({"type": "bar", "name": arrangement, "x": [r["tier"] for r in rows],
                           "y": [r.get(metric) for r in rows]})
        charts.append(_line_chart(f"tiers_{metric}", title, traces, "tier", unit))
    _, runs = run_table(store, sweep_id)
    for run in [r for r in runs if r["status"] == "ok"][:MAX_SERIES_RUNS]:
        charts.append(_run_chart(store, {**run, "workload": run.get("arrangement", ""), "synchronous_commit": "",
                                         "clients": "all"}, sweep_id, source="tenant:"))
    return summary, tables, charts


def _run_chart(store: Store, run: dict[str, Any], sweep_id: int, source: str = "pgbench") -> dict[str, Any]:
    """TPS, latency, write IOPS and replay lag of one run, its warm-up and window marked (``source``: whose TPS,
    pgbench's, or each tenant's with "tenant:")."""
    rows = store.series(run["run_id"])
    events = dict(store.run_event_times(run["run_id"]))
    t0 = events.get("warmup-start", events.get("window-start", rows[0][0] if rows else 0.0))

    def traces_of(source_prefix: str, metric: str, name: str, axis: str = "y") -> list[dict[str, Any]]:
        by_source: dict[str, list[tuple[float, float | None]]] = {}
        for ts, src, m, v in rows:
            if src.startswith(source_prefix) and m == metric:
                by_source.setdefault(src, []).append((ts - t0, v))
        return [{"type": "scatter", "mode": "lines", "yaxis": axis, "x": [p[0] for p in pts], "y": [p[1] for p in pts],
                 "name": name if len(by_source) == 1 else f"{name} {src.split(':', 1)[-1]}"}
                for src, pts in by_source.items()]

    traces = [*traces_of(source, "tps", "TPS"), *traces_of(source, "latency_ms", "latency ms", "y2"),
              *traces_of("disk:", "w_s", "write IOPS"), *traces_of("repl:", "replay_lag_ms", "replay lag ms", "y2")]
    shapes = [{"type": "line", "x0": ts - t0, "x1": ts - t0, "yref": "paper", "y0": 0, "y1": 1,
               "line": {"dash": "dash", "width": 1}} for kind, ts in events.items()
              if kind in ("warmup-end", "window-start", "window-end")]
    if rows:
        for ts, reason in store.sweep_events(sweep_id, "checkpoint-start", rows[0][0] - 1, rows[-1][0]):
            shapes.append({"type": "line", "x0": ts - t0, "x1": ts - t0, "yref": "paper", "y0": 0, "y1": 1,
                           "line": {"dash": "dot", "width": 2, "color": "purple"}, "name": f"checkpoint ({reason})"})
    if "window-start" in events and "window-end" in events:
        tps = [(ts, v) for ts, src, m, v in rows if src == "pgbench" and m == "tps" and v is not None]
        for dip in find_dips(tps, events["window-start"], events["window-end"]):  # shaded: TPS dips
            shapes.append({"type": "rect", "x0": dip.start - t0, "x1": dip.end - t0, "yref": "paper", "y0": 0,
                           "y1": 1, "fillcolor": "red", "opacity": 0.12, "line": {"width": 0}})
    chart = _line_chart(f"run_{run['run_id'].replace('-', '_')}",
                        f"run {run['run_id']}: {run['workload']} {run['synchronous_commit']} "
                        f"{run['clients']} clients (dashed: warm-up end, measured window; "
                        "dotted: checkpoint starts; shaded: TPS dips)",
                        traces, "seconds", "TPS / IOPS", css="small", shapes=shapes)
    chart["layout"] = json.dumps({**json.loads(chart["layout"]),
                                  "yaxis2": {"title": {"text": "ms"}, "overlaying": "y", "side": "right"}})
    return chart


def write(store: Store, path: Path, sweep_id: int | None = None) -> Path:
    text = build(store, sweep_id)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
