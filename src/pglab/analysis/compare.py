"""`pglab compare`: matching points of two result sets, the difference of their means with a Welch 95 % interval,
its percentage with a Fieller interval, and a verdict (faster / slower / no significant difference / too few
repeats) that never rests on a single run."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pglab import metrics
from pglab.analysis.capacity import Search
from pglab.analysis.flags import flag_text, flags
from pglab.analysis.stats import contrast
from pglab.errors import UserError
from pglab.store.sqlite import RunRow, Store

DEFAULT_METRICS = metrics.keys("compare")  # the catalogue's compare view

FASTER = "faster"
SLOWER = "slower"
BETTER = "better"  # a significant change of a metric with a better way that is no speed (CPU use, lag …)
WORSE = "worse"
NO_DIFFERENCE = "no significant difference"
HIGHER = "higher"  # a significant change of a metric neither way of which is better (IOPS, a count)
LOWER = "lower"
TOO_FEW_REPEATS = "too few repeats"  # a side with fewer than 2 runs: no interval, so no verdict
NO_DATA = "no data"
ONLY_IN_A = "only in A"
ONLY_IN_B = "only in B"
VERDICTS = (FASTER, SLOWER, BETTER, WORSE, HIGHER, LOWER, NO_DIFFERENCE)  # the ones an interval stands behind

METRIC_SUFFIXES = ("a", "b", "delta_pct", "ci95_low_pct", "ci95_high_pct", "p_value", "verdict")


@dataclass(frozen=True)
class Difference:
    metric: str
    a_mean: float
    b_mean: float
    a_n: int
    b_n: int
    delta_pct: float                        # (b - a) / a * 100; NaN when a_mean is 0
    ci95_pct: tuple[float, float] | None    # Fieller 95 % interval of b / a − 1, in %; None when n < 2
    p_value: float | None                   # Welch's t-test; None when a side has < 2 runs
    verdict: str                            # faster | slower | better | worse | higher | lower |
    #                                         no significant difference | too few repeats
    ci95: tuple[float, float] | None = None  # Welch 95 % interval of b − a, in the metric's unit


def _mean(values: Sequence[float | None]) -> float | None:
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return sum(xs) / len(xs) if xs else None


def verdict(metric: str, significant: bool | None, increase: bool) -> str:
    """The word for a change of ``metric``: faster/slower for throughput and latency, better/worse for another
    metric with a better way, higher/lower for one without; never a direction without an interval behind it."""
    if significant is None:
        return TOO_FEW_REPEATS
    if not significant:
        return NO_DIFFERENCE
    direction = metrics.lower_is_better(metric)  # the catalogue's word (None: neither way is better)
    if direction is None:
        return HIGHER if increase else LOWER
    better = increase != direction
    if metric.rsplit(".", 1)[-1].startswith("tps") or "latency" in metric:
        return FASTER if better else SLOWER
    return BETTER if better else WORSE


def difference(metric: str, a_values: Sequence[float | None], b_values: Sequence[float | None]) -> Difference | None:
    """B against A for one metric (see :func:`pglab.analysis.stats.contrast`); None when a side has no value.
    Every comparison pglab prints — compare, uplift, the price of durability, cost — comes from here."""
    c = contrast(a_values, b_values)
    if c is None:
        return None
    ma = c.a.mean
    delta_pct = (c.ratio - 1) * 100 if c.ratio is not None else math.nan
    word = verdict(metric, c.significant, c.diff > 0)
    if c.diff_ci is None:
        return Difference(metric, ma, c.b.mean, c.a.n, c.b.n, delta_pct, None, None, word)
    ci_pct = ((c.ratio_ci[0] - 1) * 100, (c.ratio_ci[1] - 1) * 100) if c.ratio_ci is not None else (math.nan,
                                                                                                    math.nan)
    return Difference(metric, ma, c.b.mean, c.a.n, c.b.n, delta_pct, ci_pct, c.p_value, word, c.diff_ci)


def _norm(value: Any) -> str:
    """Axis values compared as text, so that CLI input "on" matches a stored "on" (or a YAML true)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    text = str(value).strip().lower()
    return {"true": "on", "false": "off", "yes": "on", "no": "off"}.get(text, text)


def _key(axes: dict[str, Any], ignore: Sequence[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, _norm(v)) for k, v in axes.items() if k not in ignore))


def _group(runs: Sequence[RunRow], ignore: Sequence[str]) -> OrderedDict[tuple[tuple[str, str], ...], list[RunRow]]:
    groups: OrderedDict[tuple[tuple[str, str], ...], list[RunRow]] = OrderedDict()
    for r in runs:
        if r.status == "ok":
            groups.setdefault(_key(r.axes, ignore), []).append(r)
    return groups


def none_if_nan(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else v


def delta_fields(d: Difference | None, prefix: str, delta: str = "vs_base_pct") -> dict[str, Any]:
    """A Δ's cells in a row: ``<prefix>_<delta>``, its 95 % interval and its verdict (None without a Δ)."""
    low, high = d.ci95_pct if d is not None and d.ci95_pct is not None else (None, None)
    return {f"{prefix}_{delta}": none_if_nan(d.delta_pct) if d is not None else None,
            f"{prefix}_ci95_low_pct": none_if_nan(low), f"{prefix}_ci95_high_pct": none_if_nan(high),
            f"{prefix}_verdict": d.verdict if d is not None else None}


def compare_runs(a: Sequence[RunRow], b: Sequence[RunRow], metrics: Sequence[str] = DEFAULT_METRICS,
                 ignore_axes: Sequence[str] = ()) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per point (axes minus ``ignore_axes``) of A or B, ``ok`` runs only; columns usable with
    :func:`pglab.report.tables.render`. Points on one side only get the verdict "only in A" / "only in B"."""
    ga, gb = _group(a, ignore_axes), _group(b, ignore_axes)
    axis_names: list[str] = []
    for r in (*a, *b):
        for k in r.axes:
            if k not in ignore_axes and k not in axis_names:
                axis_names.append(k)
    columns = [*axis_names, "runs_a", "runs_b"]
    for m in metrics:
        columns += [f"{m}_{s}" for s in METRIC_SUFFIXES]
    columns.append("flags")
    rows: list[dict[str, Any]] = []
    keys = list(ga) + [k for k in gb if k not in ga]
    for key in keys:
        ra, rb = ga.get(key, []), gb.get(key, [])
        first = (ra or rb)[0]
        row: dict[str, Any] = {n: first.axes.get(n) for n in axis_names}
        row["runs_a"], row["runs_b"] = len(ra), len(rb)
        row["flags"] = flag_text([("A", flags([r.metrics for r in ra])), ("B", flags([r.metrics for r in rb]))])
        for m in metrics:
            row.update({f"{m}_{s}": None for s in METRIC_SUFFIXES})
            va, vb = [r.metrics.get(m) for r in ra], [r.metrics.get(m) for r in rb]
            if not ra or not rb:
                row[f"{m}_{'a' if ra else 'b'}"] = _mean(va if ra else vb)
                row[f"{m}_verdict"] = ONLY_IN_A if ra else ONLY_IN_B
                continue
            d = difference(m, va, vb)
            if d is None:
                row[f"{m}_a"], row[f"{m}_b"], row[f"{m}_verdict"] = _mean(va), _mean(vb), NO_DATA
                continue
            row.update({f"{m}_a": d.a_mean, f"{m}_b": d.b_mean, f"{m}_p_value": d.p_value,
                        **delta_fields(d, m, "delta_pct")})
        rows.append(row)
    return columns, rows


def _sweep_runs(store: Store, sweep: int | None) -> list[RunRow]:
    sweep = sweep if sweep is not None else store.latest_sweep_id()
    if sweep is None:
        raise UserError(f"'{store.dir}' holds no sweep to compare; run a plan there first.")
    return store.runs(sweep)


def compare_stores(store_a: Store, store_b: Store, **kw: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """Two result folders, the latest sweep of each; B is measured against A."""
    return compare_runs(_sweep_runs(store_a, None), _sweep_runs(store_b, None), **kw)


@dataclass(frozen=True)
class Sides:
    """The runs of one folder on either side of ``axis``, and the axes that follow it: one value on each side, a
    different one (pglab's default jobs follow clients: min(clients, cores)). Matched on those, nothing would
    match, so they are compared along with the axis."""

    axis: str
    a: list[RunRow]
    b: list[RunRow]
    followers: dict[str, tuple[Any, Any]]


def split_along(store: Store, axis: str, value_a: Any, value_b: Any, sweep: int | None = None) -> Sides:
    """Runs with ``axes[axis] == value_a`` (A) and ``== value_b`` (B); values compare as text ("on" matches a
    stored "on"). UserError when the axis or a value is not there."""
    runs = _sweep_runs(store, sweep)
    present = [r.axes[axis] for r in runs if axis in r.axes]
    if not present:
        names = sorted({k for r in runs for k in r.axes})
        raise UserError(f"no run has the axis '{axis}'; axes present: {', '.join(names) or '(none)'}.")
    a = [r for r in runs if axis in r.axes and _norm(r.axes[axis]) == _norm(value_a)]
    b = [r for r in runs if axis in r.axes and _norm(r.axes[axis]) == _norm(value_b)]
    known = sorted({str(v) for v in present})
    for value, side in ((value_a, a), (value_b, b)):
        if not side:
            raise UserError(f"no run has {axis}={value}; values present: {', '.join(known)}.")
    followers: dict[str, tuple[Any, Any]] = {}
    for k in dict.fromkeys(k for r in (*a, *b) for k in r.axes if k != axis):
        va, vb = {_norm(r.axes.get(k)) for r in a}, {_norm(r.axes.get(k)) for r in b}
        if len(va) == 1 and len(vb) == 1 and va != vb:
            followers[k] = (a[0].axes.get(k), b[0].axes.get(k))
    return Sides(axis, a, b, followers)


def compare_within(store: Store, axis: str, value_a: Any, value_b: Any, sweep: int | None = None,
                   **kw: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """Two configurations in one result folder: runs with ``axes[axis] == value_a`` (A) against ``== value_b``
    (B), matched on the other axes but those that follow ``axis`` (:class:`Sides`)."""
    sides = split_along(store, axis, value_a, value_b, sweep)
    ignore = tuple(dict.fromkeys((*kw.pop("ignore_axes", ()), axis, *sides.followers)))
    return compare_runs(sides.a, sides.b, ignore_axes=ignore, **kw)


def unmatched_reason(sides: Sides, value_a: Any, value_b: Any) -> str:
    """Why no point of A matches one of B, in one sentence: the first other axis whose values differ."""
    axis = sides.axis
    for k in dict.fromkeys(k for r in (*sides.a, *sides.b) for k in r.axes):
        if k == axis or k in sides.followers:
            continue
        va = sorted({str(r.axes.get(k)) for r in sides.a})
        vb = sorted({str(r.axes.get(k)) for r in sides.b})
        if va != vb:
            return (f"compare: no point with {axis}={value_a} matches one with {axis}={value_b}: {k} is "
                    f"{', '.join(va)} with {axis}={value_a} and {', '.join(vb)} with {axis}={value_b}; compare values "
                    f"of {axis} measured at the same {k}.")
    return (f"compare: no point with {axis}={value_a} matches one with {axis}={value_b}: a side has no run that "
            "ended ok; see 'pglab report --per-run'.")


def uplift_rows(columns: list[str], rows: list[dict[str, Any]], metric: str = "tps",
                ) -> tuple[list[str], list[dict[str, Any]]]:
    """The published "uplift" table for one metric: per point, A, B, Δ % with its interval and the verdict."""
    axes = columns[: columns.index("runs_a")]  # compare_runs' columns: the axes, then runs_a …
    names = {"a": "a", "b": "b", "uplift_pct": "delta_pct", "ci95_low_pct": "ci95_low_pct",
             "ci95_high_pct": "ci95_high_pct", "verdict": "verdict"}
    out = [{**{c: r.get(c) for c in axes}, **{k: r.get(f"{metric}_{s}") for k, s in names.items()},
            "flags": r.get("flags", "")} for r in rows]
    return [*axes, *names, "flags"], out


# sweeps, or axes with tables of their own: not configurations
UPLIFT_SKIPPED_AXES = ("scenario", "clients", "jobs", "rate", "workload", "synchronous_commit")


def uplift_tables(store: Store, sweep: int | None = None) -> list[tuple[str, list[str], list[dict[str, Any]]]]:
    """Within one sweep, every configuration axis (a parameter, later a CPU limit …) with several values: each
    value against the first, per client count — the published "config B vs A" table, one per pair."""
    runs = _sweep_runs(store, sweep)
    values: dict[str, list[Any]] = {}
    for r in runs:
        for k, v in r.axes.items():
            if k not in UPLIFT_SKIPPED_AXES and _norm(v) not in [_norm(x) for x in values.setdefault(k, [])]:
                values[k].append(v)
    out = []
    for axis, vs in values.items():
        for other in vs[1:]:
            columns, rows = compare_within(store, axis, vs[0], other, sweep, metrics=("tps",))
            ucols, urows = uplift_rows(columns, rows)
            out.append((f"uplift: {axis}={other} vs {axis}={vs[0]} (TPS, Δ % [95 % interval])", ucols, urows))
    return out


# plan fields that change what a matched point measures besides the platform (the dataset, the run's lengths,
# the server's parameters): a Δ over these mixes that difference in, so `pglab compare` warns before its figures;
# the matrix decides which points match, repeats only how sure the Δ is, the storage phase runs apart
WORKLOAD_FIELDS = ("dataset.", "run.", "postgres.")
NOT_WORKLOAD = ("run.repeats", "run.seed", "run.target_ci_pct", "run.max_repeats")
HOST_FIELDS = {"postgres.version_num": "PostgreSQL version", "pgbench": "pgbench", "cpu.model": "host CPU model",
               "cpu.count": "host CPUs", "cpu.affinity": "CPUs available", "memory.total_bytes": "host memory bytes",
               "kernel.release": "kernel"}
STORAGE_FIELDS = ("fstype", "source", "mount_options")


def _flat(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested plan or environment as dotted keys and their values as text."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): ", ".join(map(str, value)) if isinstance(value, list) else str(value)}


def _sweep_row(store: Store) -> dict[str, Any]:
    latest = store.latest_sweep_id()
    return next((s for s in store.sweeps() if s["id"] == latest), {})


def side_differences(store_a: Store, store_b: Store) -> list[tuple[str, str, str]]:
    """What differs between the two sides' plans (every field but the name: scale, instances, durations,
    parameters, matrix …) and environments (PostgreSQL version, host, the disk of each path both sides have), as
    (what, A, B); "(none)" where one side has no such field."""
    import json

    import yaml

    sides = [_sweep_row(store_a), _sweep_row(store_b)]
    plans, envs = [], []
    for s in sides:
        try:
            plan = yaml.safe_load(s.get("plan_text") or "") or {}
        except yaml.YAMLError:
            plan = {}
        plans.append(_flat(plan if isinstance(plan, dict) else {}))
        try:
            env = json.loads(s.get("environment") or "{}") or {}
        except ValueError:
            env = {}
        flat_env = {HOST_FIELDS[k]: v for k, v in _flat(env).items() if k in HOST_FIELDS}
        for label, about in (env.get("paths") or {}).items():
            for field in STORAGE_FIELDS:
                if isinstance(about, dict) and about.get(field) is not None:
                    flat_env[f"disk of {label}: {field}"] = str(about[field])
        envs.append(flat_env)
    out = []
    for a, b in ((plans[0], plans[1]), (envs[0], envs[1])):
        for key in dict.fromkeys([*a, *b]):
            one_sided_disk = key.startswith("disk of ") and (key not in a or key not in b)  # an instance more
            if key != "name" and a.get(key) != b.get(key) and not one_sided_disk:
                out.append((key, a.get(key, "(none)"), b.get(key, "(none)")))
    return out


def workload_differs(differences: list[tuple[str, str, str]]) -> list[str]:
    """The differing fields that change what a point measures (dataset, run lengths, workload scripts, server
    parameters, PostgreSQL version), as opposed to the platform being compared."""
    return [k for k, _, _ in differences
            if (k.startswith(WORKLOAD_FIELDS) and not k.startswith(NOT_WORKLOAD))
            or k in ("PostgreSQL version", "pgbench")]


NO_INTERVAL = "no interval"  # a side probed each rate once: its bracket says nothing of the noise
CAPACITY_COLUMNS = ["capacity_a", "low_a", "high_a", "capacity_b", "low_b", "high_b", "uplift_pct", "ci95_low_pct",
                    "ci95_high_pct", "verdict", "runs_a", "runs_b"]


def capacity_comparison(a: Sequence[Search], b: Sequence[Search], ignore_axes: Sequence[str] = ()
                        ) -> tuple[list[str], list[dict[str, Any]]]:
    """Capacities of matching configurations (:class:`pglab.analysis.capacity.Search`, axes minus ``ignore_axes``),
    B against A. Each side's capacity C lies in [low, high) (the highest rate that surely held, the lowest that
    surely failed, each at 95 %), so B/A lies in (low_B/high_A, high_B/low_A): that is the Δ's interval, and B is
    higher when low_B ≥ high_A (a rate B surely held and A surely failed), lower when low_A ≥ high_B. A side with
    one run per rate has no such interval: "no interval", never a direction."""
    def key(axes: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        return _key(axes, ignore_axes)

    ga, gb = {key(s.axes): s for s in a}, {key(s.axes): s for s in b}
    names = list(dict.fromkeys(k for s in (*a, *b) for k in s.axes if k not in ignore_axes))
    rows: list[dict[str, Any]] = []
    for k in list(ga) + [k for k in gb if k not in ga]:
        sa, sb = ga.get(k), gb.get(k)
        first = sa or sb
        assert first is not None
        row: dict[str, Any] = {n: first.axes.get(n) for n in names}
        row.update(dict.fromkeys(CAPACITY_COLUMNS))
        for side, s in (("a", sa), ("b", sb)):
            if s is not None:
                row[f"capacity_{side}"], row[f"low_{side}"], row[f"high_{side}"] = (s.answer.capacity, s.answer.low,
                                                                                   s.answer.high)
                row[f"runs_{side}"] = s.runs
        if sa is None or sb is None:
            row["verdict"] = ONLY_IN_A if sa is not None else ONLY_IN_B
        elif not row["capacity_a"] or row["capacity_b"] is None:
            row["verdict"] = NO_DATA  # no rate held on a side: no ratio to give
        else:
            row["uplift_pct"] = (row["capacity_b"] / row["capacity_a"] - 1) * 100
            row["verdict"] = _capacity_verdict(row)
            if row["verdict"] != NO_INTERVAL and row["low_a"] and row["high_a"] and row["high_b"] is not None:
                row["ci95_low_pct"] = (row["low_b"] / row["high_a"] - 1) * 100
                row["ci95_high_pct"] = (row["high_b"] / row["low_a"] - 1) * 100
        rows.append(row)
    return [*names, *CAPACITY_COLUMNS], rows


def capacity_within(found: Sequence[Search], axis: str, value_a: Any, value_b: Any
                    ) -> tuple[list[str], list[dict[str, Any]]]:
    """Two configurations of one capacity sweep: the searches with ``axis`` = ``value_a`` (A) against ``value_b``
    (B), matched on the other axes but those that follow ``axis`` (one value on each side, a different one)."""
    a = [s for s in found if _norm(s.axes.get(axis)) == _norm(value_a)]
    b = [s for s in found if _norm(s.axes.get(axis)) == _norm(value_b)]
    followers = [k for k in dict.fromkeys(k for s in (*a, *b) for k in s.axes if k != axis)
                 if len(va := {_norm(s.axes.get(k)) for s in a}) == 1 == len(vb := {_norm(s.axes.get(k)) for s in b})
                 and va != vb]
    return capacity_comparison(a, b, (axis, *followers))


def _capacity_verdict(row: dict[str, Any]) -> str:
    """higher / lower / no significant difference from the two sides' intervals; "no interval" without them."""
    if row["low_a"] is None or row["low_b"] is None:
        return NO_INTERVAL
    if row["high_a"] is not None and row["low_b"] >= row["high_a"]:
        return HIGHER
    if row["high_b"] is not None and row["low_a"] >= row["high_b"]:
        return LOWER
    return NO_DIFFERENCE
