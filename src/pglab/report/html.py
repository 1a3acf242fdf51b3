"""The offline HTML report: one self-contained file, charts drawn as inline SVG (no script, no request leaves it)."""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader

from pglab import metrics
from pglab.analysis.capacity import Search, capacity_table, searches
from pglab.analysis.compare import HOST_FIELDS, STORAGE_FIELDS, uplift_tables
from pglab.analysis.cost import PART as COST_PART
from pglab.analysis.cost import cost_table
from pglab.analysis.flags import UNSTABLE_CV
from pglab.analysis.stats import estimate
from pglab.analysis.steady import find_dips
from pglab.plan.schema import Capacity
from pglab.report import svg, tiers
from pglab.report.tables import (
    AXIS_COLUMNS,
    DURABILITY_ORDER,
    STORAGE_HEADERS,
    STORAGE_SHOWN,
    delta_text,
    durability_headers,
    durability_table,
    interval_columns,
    limits_note,
    point_table,
    run_table,
    storage_table,
)
from pglab.report.tables import _extra_axes as extra_axes
from pglab.store.sqlite import Store
from pglab.units import money


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
    text = {c for c in columns if rows and isinstance(rows[0].get(c), str)
            and not re.match(r"[+−-]?[\d,.]+( ±| %|$)", rows[0][c])}  # a figure as text stays right-aligned
    long = {c for c in columns if c in ("bottleneck", "note", "dips", "reason", "query")}
    return {"id": sid, "title": title, "columns": columns, "headers": headers or {}, "text": text, "long": long,
            "note": note,
            "rows": [{c: _cell(r.get(c)) for c in columns} for r in rows]}


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
    _, fio_rows = storage_table(store, sweep_id)
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
    summary += [f"{r['storage'] + ' ' if 'storage' in r else ''}{r['workload']}: {money(r['per_tps'])} {r['currency']} "
                "per TPS·month at peak." for r in cost_rows if r["per_tps"] is not None]  # an unpriced value: TPS alone
    spec, found = searches(store, sweep_id)
    summary += _capacity_summary(spec, found)

    shown = [c for c in columns if not c.endswith("_ci95") and c != "bottleneck_tag"]
    tables = [_section("points", "Per configuration (means over repeats)", shown, [_with_ci(p) for p in points],
                       "Figures are means over the point's repeats, ± the half-width of their 95 % interval; the "
                       "bottleneck comes from the run's own figures.")]
    if dur_rows:
        tables.append(_section("durability-table", "Price of durability (table)", _formatted(dur_columns),
                               [_with_deltas(r) for r in dur_rows],
                               headers=durability_headers(dur_columns, "Δ {} % [95 %]")))
    for i, (up_title, up_columns, up_rows) in enumerate(uplifts):
        tables.append(_section(f"uplift{i}", up_title[0].upper() + up_title[1:], _formatted(up_columns),
                               [_with_deltas(r) for r in up_rows]))
    cap_columns, cap_rows = capacity_table(store, sweep_id)
    if cap_rows:
        tables.append(_section("capacity", "Capacity at the latency target", [c for c in cap_columns
                                                                             if not c.endswith("_ci95")],
                               [_with_ci(r) for r in cap_rows], CAPACITY_NOTE))
    if cost_rows:
        parts = [c for c in cost_columns if c.startswith(COST_PART)]  # cost.breakdown's parts, each a month
        tables.append(_section("cost", "Cost at peak TPS", cost_columns,
                               [{**r, **{c: money(r[c]) for c in ("per_tps", "monthly", *parts) if r[c] is not None}}
                                for r in cost_rows],
                               headers={"per_tps": "per TPS·month",
                                        **{c: f"{c.removeprefix(COST_PART)}/month" for c in parts}}))
    if fio_rows:
        tables.append(_section("storage", "Storage profiles (fio)", STORAGE_SHOWN, fio_rows,
                               "For WAL profiles the latency columns are the fdatasync after each write: what a "
                               "commit waits for; the write() alone is in the note.", headers=STORAGE_HEADERS))
    figures = [s for s in metrics.columns("html-runs") if any(r.get(s.key) is not None for r in runs)]
    tables.append(_section("runs", "Runs (every figure traces to its run id and folder)",
                           ["run_id", "status", "workload", "synchronous_commit", "clients", *(s.key for s in figures),
                            "dips", "dir", "reason"], runs, "; ".join(f"{s.header}: {s.metric.description}"
                                                                      for s in figures if s.header != s.key),
                           headers=metrics.headers("html-runs")))
    picked, why = _runs_that_matter(points, runs)
    if statements := _statements(store, picked):
        tables.append(_section("statements", "Top statements by total time in the window", *statements,
                               "pg_stat_statements, read at the measured window's start and end, of the runs charted "
                               "below; every statement of a run: runs/<id>/statements.json.",
                               headers=STATEMENT_HEADERS))
    charts = _durability_charts(points) + _capacity_charts(spec, found)
    # vs clients: a capacity search's closed-loop runs; its probes' rates are the hockey sticks'
    closed = [p for p in points if spec is None or p.get("rate") is None]
    charts += _facet_charts(_with_run_ci(store, sweep_id, closed, metrics.keys("chart")))
    run_charts = [c for c in (_run_chart(store, r, sweep_id) for r in picked) if c]
    notes = {"runs": why}
    return _render(sweep, sweep_id, summary, tables, [c for c in charts if c["svg"]], run_charts, notes)


STATEMENT_HEADERS = {"total_exec_time_ms": "total ms", "mean_exec_time_ms": "mean ms", "time_pct": "% of time"}
STATEMENT_COLUMNS = ["query", "calls", "total_exec_time_ms", "mean_exec_time_ms", "time_pct"]


def _statements(store: Store, runs: list[dict[str, Any]],
                tenants: bool = False) -> tuple[list[str], list[dict[str, Any]]] | None:
    """Each run's top statements by execution time in its window, from run.json's summary of statements.json
    (written where pg_stat_statements was loaded); with ``tenants``, each tenant's (``statements.tenants``, on a local
    lab and on Kubernetes alike), the tenants in order. None when no run has any."""
    keys = ["run_id", "arrangement", "tenant", "tier"] if tenants else ["run_id", "workload", "synchronous_commit",
                                                                         "clients"]
    rows: list[dict[str, Any]] = []
    for r in runs:
        with contextlib.suppress(OSError, TypeError, ValueError, AttributeError):  # no run.json: no statements
            record = json.loads((store.dir / r["dir"] / "run.json").read_text())
            statements = record.get("statements") or {}
            if not tenants:
                rows += [{**{c: r.get(c) for c in keys}, **s} for s in statements.get("top", [])]
                continue
            tiers = {name: (t or {}).get("tier") for name, t in (record.get("tenants") or {}).items()}
            per = statements.get("tenants") or {}
            rows += [{"run_id": r["run_id"], "arrangement": r.get("arrangement"), "tenant": name,
                      "tier": tiers.get(name), **s}
                     for name in sorted(per) for s in per[name].get("top", [])]
    return ([*keys, *STATEMENT_COLUMNS], rows) if rows else None


def _formatted(columns: list[str]) -> list[str]:
    """A comparison's columns as the page shows them: each interval is in its Δ's cell, not in raw columns."""
    return [c for c in columns if not c.endswith(("ci95_low_pct", "ci95_high_pct"))]


def _with_run_ci(store: Store, sweep_id: int, points: list[dict[str, Any]],
                 figures: tuple[str, ...]) -> list[dict[str, Any]]:
    """Points with the 95 % interval of ``figures`` the point table does not compute (a figure shown without ±,
    like the disk's write IOPS), from the point's ok runs, so that its chart draws error bars too."""
    runs = store.runs(sweep_id)
    keys = [*AXIS_COLUMNS, *extra_axes(runs)]
    by: dict[tuple[str, ...], list[Any]] = {}
    for r in runs:
        if r.status == "ok":
            by.setdefault(tuple(str(r.axes.get(k)) for k in keys), []).append(r)

    def intervals(p: dict[str, Any]) -> dict[str, float]:
        mine = by.get(tuple(str(p.get(k)) for k in keys), [])
        return {f"{m}_ci95": e.ci95 for m in figures if p.get(f"{m}_ci95") is None
                and (e := estimate([r.metrics.get(m) for r in mine])) is not None and e.ci95 is not None}

    return [{**p, **intervals(p)} for p in points]


def _caption(title: str, series: list[svg.Series]) -> str:
    """A chart's caption promises error bars only when it draws some."""
    if any(e for s in series for e in s.errors):
        return f"{title} (error bars: 95 % interval)"
    return f"{title} (no error bars: fewer than 2 runs a point, no 95 % interval)"


def _with_ci(point: dict[str, Any]) -> dict[str, Any]:
    """A point's figures as the page shows them: the mean ± its 95 % interval where there is one."""
    out = dict(point)
    for c in list(point):
        half = point.get(f"{c}_ci95")
        if half is not None and isinstance(point.get(c), float) and not math.isnan(half):
            out[c] = f"{_cell(point[c])} ± {_cell(half)}"
    return out


def _with_deltas(row: dict[str, Any]) -> dict[str, Any]:
    """A comparison's row as the page shows it: each Δ with its interval in one cell, as the terminal shows it."""
    return {c: delta_text(v, *(row.get(k) for k in interval_columns(c) or ())) if interval_columns(c) and v is not None
            else v for c, v in row.items()}


def _config(p: dict[str, Any]) -> str:
    extra = " ".join(f"{k.split('.', 1)[1]}={p[k]}" for k in p if k.startswith("parameters."))
    return f"{p['synchronous_commit']} {extra}".strip()


def _series_over(points: list[dict[str, Any]], labels: list[str], key: str, metric: str) -> list[svg.Series]:
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for p in points:
        by.setdefault(str(p[key]) if key != "config" else _config(p), {})[str(p["clients"])] = p
    return [svg.Series(name, [at.get(c, {}).get(metric) for c in labels],
                       [at.get(c, {}).get(f"{metric}_ci95") for c in labels]) for name, at in by.items()]


def _clients(points: list[dict[str, Any]]) -> list[str]:
    return [str(c) for c in sorted({p["clients"] for p in points if p.get("clients") is not None})]


def _durability_charts(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload, grouped bars: TPS and mean latency per synchronous_commit level at each client count."""
    levels = [lv for lv in DURABILITY_ORDER if any(p["synchronous_commit"] == lv for p in points)]
    if len(levels) < 2:
        return []
    charts = []
    for wl in dict.fromkeys(p["workload"] for p in points):
        mine = sorted((p for p in points if p["workload"] == wl), key=lambda p: levels.index(p["synchronous_commit"])
                      if p["synchronous_commit"] in levels else 99)
        labels = _clients(mine)
        for s in metrics.columns("durability-chart"):
            series = _series_over(mine, labels, "synchronous_commit", s.key)
            title = _caption(f"{wl}: {s.header} per synchronous_commit level", series)
            charts.append({"id": f"durability-{wl}-{s.key}", "title": title, "group": "durability",
                           "svg": svg.categories(title, labels, series, s.header, "clients", bars=True)})
    return charts


CAPACITY_NOTE = ("capacity: the highest probed rate whose percentile (mean over its repeats) held the target; "
                 "failed_at: the lowest above it that did not; with repeats, capacity_low/high: the highest rate "
                 "that surely held and the lowest that surely failed (each rate's 95 % interval wholly on one side "
                 "of the target), blank with one run per rate.")
OFF_SCALE = 4  # the hockey stick's y axis stops at this many times the target: a collapse flattens nothing


def _capacity_summary(spec: Capacity | None, found: list[Search]) -> list[str]:
    """One line per configuration of a capacity search: its capacity, the rate that failed, the interval."""
    if spec is None:
        return []
    lines = []
    for s in found:
        a = s.answer
        config = " ".join(f"{k}={v}" for k, v in s.axes.items() if v is not None)
        if a.capacity is None:
            text = "no probed rate held it"
        else:
            text = f"{a.capacity:g} tx/s" + (f" (failed at {a.failing:g})" if a.failing is not None else "")
            if a.low is not None:
                text += f", 95 % interval [{a.low:g}, {'unbounded' if a.high is None else f'{a.high:g}'})"
            else:
                text += ", no interval (one run per rate)"
        lines.append(f"capacity at p{spec.percentile} ≤ {spec.target * 1000:g} ms, {config}: {text}; {s.runs} runs.")
    return lines


def _capacity_charts(spec: Capacity | None, found: list[Search]) -> list[dict[str, Any]]:
    """Per configuration of a capacity search, the hockey stick: each probed rate's percentile (mean over its
    repeats, with its 95 % interval) against the TPS it achieved, the target as a line, the capacity marked and
    its interval shaded (with repeats)."""
    if spec is None:
        return []
    target, pct = spec.target * 1000, f"p{spec.percentile}"
    charts = []
    for i, s in enumerate(found):
        config = " ".join(f"{k}={v}" for k, v in s.axes.items() if v is not None)
        points = []
        for rate, v in sorted(s.verdicts.items()):
            if v.tps is None:
                continue
            e = f" ± {v.latency.ci95:.1f}" if v.latency.ci95 is not None else ""
            points.append(svg.Point(v.tps.mean, v.latency.mean, v.latency.ci95,
                                    f"rate {rate:g} tx/s: {v.tps.mean:.1f} tx/s achieved, {pct} {v.latency.mean:.1f}"
                                    f"{e} ms, {'held' if v.held else 'missed'} ({v.latency.n} runs)"))
        a = s.answer
        achieved = {rate: v.tps.mean if v.tps is not None else rate for rate, v in s.verdicts.items()}
        achieved[0.0] = 0.0  # the x axis is the TPS achieved: a rate is drawn where its probe was
        vline = None
        if a.capacity is not None:
            vline = (achieved[a.capacity], f"capacity {a.capacity:g} tx/s (achieved {achieved[a.capacity]:.1f})")
        band = (achieved[a.low], achieved[a.high]) if a.low is not None and a.high is not None else None
        title = (f"{config}: {pct} latency vs achieved TPS per probed rate; target {target:g} ms, capacity "
                 + (f"{a.capacity:g} tx/s" if a.capacity is not None else "not found")
                 + (f", 95 % interval [{a.low:g}, {a.high:g}) shaded" if band else "")
                 + (" (error bars: 95 % interval)" if any(p.error for p in points) else
                    " (no error bars: one run per rate)"))
        charts.append({"id": f"capacity-{i}", "title": title, "group": "capacity",
                       "svg": svg.xy(title, points, "achieved TPS", f"{pct} latency ms",
                                     (target, f"target {target:g} ms"), vline, band, OFF_SCALE * target)})
    return charts


def _facet_charts(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The catalogue's chart view vs clients (TPS, p99 latency, the disk's write IOPS), one chart per workload and
    figure (clients as categories; a storage figure in the disk group); a figure no point has draws nothing."""
    charts = []
    for wl in dict.fromkeys(p["workload"] for p in points):
        mine = [p for p in points if p["workload"] == wl]
        labels = _clients(mine)
        for s in metrics.columns("chart"):
            group = "disk" if s.metric.layer == "storage" else "scaling"
            series = _series_over(mine, labels, "config", s.key)
            title = _caption(f"{wl}: {s.header} vs clients", series)
            charts.append({"id": f"{group}-{wl}-{s.key}", "title": title, "group": group,
                           "svg": svg.categories(title, labels, series, s.header, "clients")})
    return charts


MAX_SERIES_RUNS = 12  # per-run charts: the runs that matter first, then a sample of the rest


def _runs_that_matter(points: list[dict[str, Any]], runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """Runs with TPS dips, runs of unstable points and failed runs first, then an even sample of the others."""
    unstable = {(p["workload"], p["synchronous_commit"], p["clients"]) for p in points if p.get("unstable")}
    def rank(r: dict[str, Any]) -> int:
        return (0 if r["status"] != "ok" else 1 if r.get("dips") else
                2 if (r["workload"], r["synchronous_commit"], r["clients"]) in unstable else 3)

    first = sorted((r for r in runs if rank(r) < 3), key=rank)  # failed, then dips, then unstable
    rest = [r for r in runs if r not in first]
    room = max(0, MAX_SERIES_RUNS - len(first))
    step = len(rest) / room if room and rest else 0
    sample = [rest[int(i * step)] for i in range(min(room, len(rest)))] if step else []
    picked = (first + sample)[:MAX_SERIES_RUNS]
    why = (f"{len(picked)} of {len(runs)} runs: those with TPS dips, of unstable points or failed "
           f"({len(first)}), then an even sample of the others; every run is in the runs table.")
    return sorted(picked, key=runs.index), why


def _environment_rows(env_text: str | None) -> list[dict[str, str]]:
    """The captured environment as (what, value) rows; server settings as "value unit (source)"."""
    if not env_text:
        return []
    env = json.loads(env_text)
    rows: list[dict[str, str]] = []

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict) and {"setting", "source"} <= set(value):
            unit = f" {value['unit']}" if value.get("unit") else ""
            rows.append({"what": key, "value": f"{value['setting']}{unit} ({value['source']})"})
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list):
            rows.append({"what": key, "value": ", ".join(map(str, value))})
        else:
            rows.append({"what": key, "value": "" if value is None else str(value)})

    walk({k: v for k, v in env.items() if k != "plan"}, "")
    return rows


KEY_ENVIRONMENT = ("pglab_version", "postgres.version", *HOST_FIELDS, "kernel.machine")


def _key_environment(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows a reader compares first (pglab, PostgreSQL, CPU, memory, kernel, each path's disk); the page shows
    them and folds every captured figure (server settings, cgroups …) away."""
    def key(what: str) -> bool:
        return what in KEY_ENVIRONMENT or (what.startswith("paths.") and what.rsplit(".", 1)[1] in STORAGE_FIELDS)

    return [r for r in rows if key(r["what"])]


def _render(sweep: dict[str, Any], sweep_id: int, summary: list[str], tables: list[dict[str, Any]],
            charts: list[dict[str, Any]], run_charts: list[dict[str, Any]] | None = None,
            notes: dict[str, str] | None = None) -> str:
    environment = _environment_rows(sweep.get("environment"))
    groups = [("capacity", "Capacity: latency vs throughput"), ("durability", "Price of durability"),
              ("scaling", "TPS and latency vs clients"),
              ("disk", "Disk vs clients"), ("tiers", "Tiers")]
    chart_groups = [{"id": gid, "title": title, "charts": [c for c in charts if c.get("group") == gid and c["svg"]]}
                    for gid, title in groups]
    chart_groups = [g for g in chart_groups if g["charts"]]
    toc = [("summary", "Summary"), *((g["id"], g["title"]) for g in chart_groups)]
    if run_charts:
        toc.append(("runs-charts", "Runs over time"))
    toc += [(t["id"], t["title"]) for t in tables]
    toc += [("plan", "Plan"), ("environment", "Environment")]
    templates = Environment(loader=PackageLoader("pglab.report", "templates"), autoescape=True)  # .j2: not guessed
    return templates.get_template("report.html.j2").render(
        title=sweep["plan_name"], subtitle=f"sweep {sweep_id}, pglab {sweep['pglab_version']}",
        summary=summary, tables=tables, chart_groups=chart_groups, run_charts=run_charts or [], toc=toc,
        notes=notes or {}, environment=environment, key_environment=_key_environment(environment),
        plan=sweep.get("plan_text") or "(not stored)",
        disk_note="" if any(g["id"] == "disk" for g in chart_groups) or any(c.get("group") == "tiers"
                                                                             for c in charts)
        else "The disk was not measured for this sweep (an existing server, or no device found): no disk chart.")


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
    _, runs = run_table(store, sweep_id)
    charted = [r for r in runs if r["status"] == "ok"][:MAX_SERIES_RUNS]
    if statements := _statements(store, charted, tenants=True):
        tables.append(_section("statements", "Top statements by total time in the window, per tenant", *statements,
                               "pg_stat_statements of each tenant's own server, read at its measured window's start "
                               "and end, of the runs charted below; every statement of a tenant: "
                               "runs/<id>/tenants/<tenant>/statements.json.", headers=STATEMENT_HEADERS))
    charts = []
    tier_names = list(dict.fromkeys(str(r["tier"]) for r in tier_rows))
    for s in metrics.columns("tier-chart"):  # the tier table's figures, bars per arrangement
        series = []
        for arrangement in dict.fromkeys(r["arrangement"] for r in tier_rows):
            at = {str(r["tier"]): r.get(s.key) for r in tier_rows if r["arrangement"] == arrangement}
            series.append(svg.Series(str(arrangement), [at.get(t) for t in tier_names]))
        unit = "TPS" if s.metric.unit == "tx/s" else s.metric.unit
        charts.append({"id": f"tiers-{s.key}", "title": s.header, "group": "tiers",
                       "svg": svg.categories(s.header, tier_names, series, unit, "tier", bars=True)})
    for run in charted:
        chart = _run_chart(store, {**run, "workload": run.get("arrangement", ""), "synchronous_commit": "",
                                   "clients": "all"}, sweep_id, source="tenant:")
        if chart:
            charts.append({**chart, "group": "tiers"})
    return summary, tables, charts


def _run_chart(store: Store, run: dict[str, Any], sweep_id: int, source: str = "pgbench") -> dict[str, Any] | None:
    """One run over time, each figure on its own axis: TPS, latency, the disk's writes and replay lag (when
    measured); warm-up end and the window dashed, checkpoint starts dotted, TPS dips shaded (``source``: whose
    TPS, pgbench's, or each tenant's with "tenant:")."""
    rows = store.series(run["run_id"])
    if not rows:
        return None
    events = dict(store.run_event_times(run["run_id"]))
    t0 = events.get("warmup-start", events.get("window-start", rows[0][0]))

    def lines(source_prefix: str, metric: str, name: str) -> list[tuple[str, list[float], list[float | None]]]:
        by_source: dict[str, tuple[list[float], list[float | None]]] = {}
        for ts, src, m, v in rows:
            if src.startswith(source_prefix) and m == metric:
                xs, ys = by_source.setdefault(src, ([], []))
                xs.append(ts - t0)
                ys.append(v)
        return [(name if len(by_source) == 1 else f"{name} {src.split(':', 1)[-1]}", xs, ys)
                for src, (xs, ys) in by_source.items()]

    panels = [svg.Panel(unit, got) for unit, got in (
        ("TPS", lines(source, "tps", "TPS")), ("latency ms", lines(source, "latency_ms", "latency ms")),
        ("write IOPS", lines("disk:", "w_s", "write IOPS")), ("replay lag ms", lines("repl:", "replay_lag_ms",
                                                                                     "replay lag ms"))) if got]
    if not panels:
        return None
    marks = [(ts - t0, "6,4") for kind, ts in events.items() if kind in ("warmup-end", "window-start", "window-end")]
    marks += [(ts - t0, "2,3") for ts, _ in store.sweep_events(sweep_id, "checkpoint-start", rows[0][0] - 1,
                                                               rows[-1][0])]
    shades = []
    if "window-start" in events and "window-end" in events:
        tps = [(ts, v) for ts, src, m, v in rows if src == "pgbench" and m == "tps" and v is not None]
        shades = [(d.start - t0, d.end - t0) for d in find_dips(tps, events["window-start"], events["window-end"])]
    title = (f"run {run['run_id']} ({run['status']}): {run['workload']} {run['synchronous_commit']} "
             f"{run['clients']} clients")
    return {"id": f"run-{run['run_id']}", "title": title, "svg": svg.time_panels(title, panels, marks, shades)}


def write(store: Store, path: Path, sweep_id: int | None = None) -> Path:
    text = build(store, sweep_id)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
