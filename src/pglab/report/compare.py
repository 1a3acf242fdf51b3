"""`pglab compare`'s presentation: what differs between the two sides, then the Δ (or uplift) table and its notes.

The figures are analysis.compare's; here they are only laid out, beside the other tables."""

from __future__ import annotations

import textwrap
from contextlib import closing
from pathlib import Path

from pglab import metrics
from pglab.analysis.capacity import searches
from pglab.analysis.compare import (
    METRIC_SUFFIXES,
    ONLY_IN_A,
    ONLY_IN_B,
    capacity_comparison,
    capacity_within,
    compare_stores,
    compare_within,
    side_differences,
    split_along,
    unmatched_reason,
    uplift_rows,
    workload_differs,
)
from pglab.analysis.cost import cost_comparison
from pglab.errors import UserError
from pglab.report.tables import TOO_FEW_NOTE, UPLIFT_HEADERS, compare_view, render
from pglab.store import Store


def compare_report(a: Path, b: Path | None, axis: str | None, value_a: str | None, value_b: str | None, fmt: str,
                   uplift: bool, width: int | None) -> tuple[list[str], str]:
    """(what differs between the folders, one line each, to print first; the table and its notes): B against A,
    or within A along ``axis``. A comparison where no point matches is refused in one sentence."""
    preface: list[str] = []
    cost_lines: list[str] = []
    capacity = ""
    with closing(Store.open(a, create=False)) as store_a:
        if b is None:
            assert axis is not None
            sides = split_along(store_a, axis, value_a, value_b)
            capacity = _capacities(store_a, None, axis, value_a, value_b, fmt, width)
            columns, rows = compare_within(store_a, axis, value_a, value_b)
            if rows and all(r.get("tps_verdict") in (ONLY_IN_A, ONLY_IN_B) for r in rows):
                raise UserError(unmatched_reason(sides, value_a, value_b))
            follow_a = "".join(f", {k}={va}" for k, (va, _) in sides.followers.items())
            follow_b = "".join(f", {k}={vb}" for k, (_, vb) in sides.followers.items())
            title = f"B ({axis}={value_b}{follow_b}) relative to A ({axis}={value_a}{follow_a}) in {a}"
        else:
            with closing(Store.open(b, create=False)) as store_b:
                columns, rows = compare_stores(store_a, store_b)
                cost_lines = cost_comparison(store_a, store_b)
                differences = side_differences(store_a, store_b)
                capacity = _capacities(store_a, store_b, None, None, None, fmt, width)
            title = f"B ({b}) relative to A ({a})"
            preface = differences_text(differences, workload_differs(differences))
            if rows and all(r.get("tps_verdict") in (ONLY_IN_A, ONLY_IN_B) for r in rows):
                raise UserError(f"compare: no point of '{b}' matches one of '{a}' (workload, synchronous_commit, "
                                "clients and the other axes must be equal); compare sweeps of the same matrix.")
    if any(r.get("tps_verdict") == "too few repeats" for r in rows):
        cost_lines.insert(0, TOO_FEW_NOTE.rstrip())
    notes = "".join(f"{line}\n" for line in cost_lines) if fmt in ("table", "markdown") else ""
    if capacity:  # capacity searches on both sides: their answers compared, not their probes' arbitrary rates
        return preface, capacity + notes
    if uplift:
        ucols, urows = uplift_rows(columns, rows)
        return preface, render(ucols, urows, fmt, title=f"uplift: {title}: TPS, Δ % = (B − A) / A [95 % interval]",
                               headers=UPLIFT_HEADERS, width=width, optional=("jobs", "flags")) + notes
    figures, headers, optional = compare_view()  # the catalogue's compare view: its figures, headers, cut order
    computed = {f"{k}_{s}" for k in metrics.keys("compare") for s in METRIC_SUFFIXES} | {"runs_a", "runs_b"}
    shown = [c for c in columns if c in figures or c not in computed]
    return preface, render(columns, rows, fmt, title=f"{title}: Δ % = (B − A) / A [95 % interval]", shown=shown,
                           headers=headers, width=width, optional=optional) + notes


CAPACITY_HEADERS = {"capacity_a": "A capacity", "low_a": "A low", "high_a": "A high", "capacity_b": "B capacity",
                    "low_b": "B low", "high_b": "B high", "uplift_pct": "Δ % [interval]", "runs_a": "A runs",
                    "runs_b": "B runs", "synchronous_commit": "sync commit"}
CAPACITY_NOTE = ("Each side's capacity lies between the highest rate that surely held (low) and the lowest that "
                 "surely failed (high), each rate's 95 % interval wholly on one side of the target; the Δ's interval "
                 "follows from both, and a direction needs B's low at or above A's high (or the reverse). With one "
                 "run per rate a side has no interval (\"no interval\"): its bracket says nothing of the noise; "
                 "repeat each probe (run.repeats) to compare.")


def _capacities(store_a: Store, store_b: Store | None, axis: str | None, value_a: str | None, value_b: str | None,
                fmt: str, width: int | None) -> str:
    """The capacity comparison when both sides are capacity searches ("" otherwise): B's capacity against A's per
    matching configuration, at the same target (a different target or percentile is refused)."""
    spec_a, found_a = searches(store_a)
    spec_b, found_b = searches(store_b) if store_b is not None else (spec_a, found_a)
    if spec_a is None or spec_b is None or not found_a or not found_b:
        return ""
    if (spec_a.percentile, spec_a.target) != (spec_b.percentile, spec_b.target):
        raise UserError(f"compare: A searched the capacity at p{spec_a.percentile} ≤ {spec_a.target * 1000:g} ms "
                        f"and B at p{spec_b.percentile} ≤ {spec_b.target * 1000:g} ms; compare searches of one "
                        "target.")
    if axis is not None:
        columns, rows = capacity_within(found_a, axis, value_a, value_b)
    else:
        columns, rows = capacity_comparison(found_a, found_b)
    if not any(r["verdict"] not in (ONLY_IN_A, ONLY_IN_B) for r in rows):
        return ""
    title = (f"capacity at p{spec_a.percentile} ≤ {spec_a.target * 1000:g} ms (tx/s), B relative to A: "
             "Δ % = (B − A) / A [interval from both sides' 95 % bounds]")
    note = f"{CAPACITY_NOTE}\n" if fmt in ("table", "markdown") else ""
    return render(columns, rows, fmt, title=title, headers=CAPACITY_HEADERS, width=width,
                  optional=("runs_b", "runs_a")) + note


def differences_text(differences: list[tuple[str, str, str]], measured: list[str]) -> list[str]:
    """What differs between A and B, one line each, and a warning when it changes what the points measure."""
    if not differences:
        return ["A and B: same plan (but its name) and same environment figures.", ""]
    lines = ["what differs between A and B:"]
    lines += [f"  {what}: A {va} · B {vb}" for what, va, vb in differences]
    if measured:
        lines += textwrap.wrap(f"warning: A and B differ in what each point measures ({', '.join(measured)}), not "
                               "only in the platform; the Δ below includes those differences.", 120,
                               subsequent_indent="  ", break_on_hyphens=False)
    return [*lines, ""]
