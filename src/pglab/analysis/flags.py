"""A point's warnings, computed in one place so that every view (terminal, markdown, HTML, CSV/JSON) shows the same.

``unstable``: its repeats' TPS coefficient of variation exceeds :data:`UNSTABLE_CV`, so its runs disagree more
than a comparison can bear. ``interfered``: something outside the benchmark used the lab's CPU during the runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pglab.analysis.bottleneck import interfered
from pglab.analysis.stats import estimate

UNSTABLE_CV = 0.05  # repeats whose TPS spread (coefficient of variation) exceeds 5 % are flagged

UNSTABLE = "unstable"
INTERFERED = "interfered"


def flags(runs: Sequence[Mapping[str, float | None]]) -> list[str]:
    """The flags of one point, from the metrics of its ok runs (one mapping per run)."""
    out = []
    tps = estimate([r.get("tps") for r in runs])
    if tps is not None and tps.cv is not None and tps.cv > UNSTABLE_CV:
        out.append(UNSTABLE)
    cores = estimate([r.get("interference_cpu_cores") for r in runs])
    if cores is not None and interfered({"interference_cpu_cores": cores.mean}):
        out.append(INTERFERED)
    return out


def flag_text(flags_by_side: Sequence[tuple[str, list[str]]]) -> str:
    """Flags of several points in one cell: "A: unstable; B: interfered" (no label when there is one point)."""
    parts = [(f"{label}: " if label else "") + ", ".join(fs) for label, fs in flags_by_side if fs]
    return "; ".join(parts)
