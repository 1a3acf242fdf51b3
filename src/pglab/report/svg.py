"""Charts as inline SVG: no script, no bundle, nothing to fetch, so the HTML report stays small and offline.

Four shapes cover the report: lines over categories (TPS vs clients, with 95 % error bars), grouped bars
(the price of durability, with error bars), time series in stacked panels (one run, each figure on its own
axis so TPS is not flattened under IOPS) and points over a numeric axis (a capacity search's hockey stick: latency
vs achieved TPS, with the target and the capacity marked).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22")
WIDTH, LEFT, RIGHT, TOP = 640, 64, 16, 34


@dataclass
class Series:
    name: str
    values: list[float | None]
    errors: list[float | None] = field(default_factory=list)  # half-widths of the 95 % interval, per value


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * step:
            step *= mult
            break
    ticks = [round(math.floor(low / step) * step, 10)]
    while ticks[-1] < high:  # the last tick at or above the top: nothing drawn outside the frame
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 10_000:
        return f"{value / 1000:,.0f}k"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _plain(value: float) -> str:
    """A figure for a tooltip as a table shows it: 10,399.7, never 1.04e+04."""
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"


def _legend(names: Sequence[str], y: float = 14) -> str:
    parts, x = [], float(LEFT)
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{x:.0f}" y="{y - 9:.0f}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{x + 14:.0f}" y="{y:.0f}">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    return "".join(parts)


def _frame(height: int, plot_h: float, top: float, ticks: list[float], ytitle: str, scale: float,
           low: float) -> str:
    bottom = top + plot_h
    out = [f'<line x1="{LEFT}" y1="{bottom:.1f}" x2="{WIDTH - RIGHT}" y2="{bottom:.1f}" stroke="#444"/>',
           f'<line x1="{LEFT}" y1="{top:.1f}" x2="{LEFT}" y2="{bottom:.1f}" stroke="#444"/>',
           f'<text transform="translate(14,{top + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle">'
           f'{escape(ytitle)}</text>']
    for t in ticks:
        y = bottom - (t - low) * scale
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(t)}</text>')
    return "".join(out)


def _svg(height: int, body: str, title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {height}" '
            f'width="{WIDTH}" height="{height}" role="img" font-family="sans-serif" font-size="12">'
            f"<title>{escape(title)}</title>{body}</svg>")


def _range(series: Sequence[Series]) -> tuple[float, float]:
    pairs = [(v, (s.errors[i] if i < len(s.errors) else None) or 0.0) for s in series
             for i, v in enumerate(s.values) if v is not None]
    tops = [v + e for v, e in pairs]
    if all(v >= 0 for v, _ in pairs):  # a figure that cannot go below zero: its error bars stop at the axis
        return 0.0, max(tops) if tops else 1.0
    lows = [v - e for v, e in pairs]
    return min(0.0, *lows), max(tops) if tops else 1.0


def categories(title: str, labels: Sequence[str], series: Sequence[Series], ytitle: str, xtitle: str,
               bars: bool = False, height: int = 300) -> str:
    """Lines (or grouped bars) over categorical x positions, each value with its 95 % error bar; "" when no
    series has a value (a figure not measured draws no empty frame)."""
    if not any(v is not None for s in series for v in s.values):
        return ""
    plot_h = height - TOP - 44
    low, high = _range(series)
    ticks = _ticks(low, high)
    low, high = ticks[0], ticks[-1]
    scale = plot_h / (high - low or 1.0)
    bottom = TOP + plot_h
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(labels))
    body = [_legend([s.name for s in series]), _frame(height, plot_h, TOP, ticks, ytitle, scale, low)]
    for i, label in enumerate(labels):
        body.append(f'<text x="{LEFT + slot * (i + 0.5):.1f}" y="{bottom + 16:.1f}" text-anchor="middle">'
                    f"{escape(label)}</text>")
    body.append(f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2:.0f}" y="{height - 6}" text-anchor="middle">'
                f"{escape(xtitle)}</text>")
    bar_w = min(slot * 0.8 / max(1, len(series)), 70.0)
    for k, s in enumerate(series):
        color = PALETTE[k % len(PALETTE)]
        points = []
        for i, v in enumerate(s.values):
            if v is None:
                continue
            offset = (k - (len(series) - 1) / 2) * (bar_w if bars else min(10.0, slot * 0.3 / len(series)))
            x = LEFT + slot * (i + 0.5) + offset  # lines too are dodged, so error bars do not hide each other
            y = bottom - (v - low) * scale
            tip = f"{s.name}, {labels[i]}: {_plain(v)}"
            e = s.errors[i] if i < len(s.errors) else None
            if e:
                tip += f" ± {_plain(e)}"
            if bars:
                body.append(f'<rect x="{x - bar_w / 2 + 1:.1f}" y="{min(y, bottom):.1f}" width="{bar_w - 2:.1f}" '
                            f'height="{abs(bottom - y):.1f}" fill="{color}" fill-opacity="0.8">'
                            f"<title>{escape(tip)}</title></rect>")
            else:
                points.append(f"{x:.1f},{y:.1f}")
                body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">'
                            f"<title>{escape(tip)}</title></circle>")
            if e:
                y1, y2 = min(bottom, bottom - (v - e - low) * scale), bottom - (v + e - low) * scale
                body.append(f'<path d="M{x:.1f},{y1:.1f}V{y2:.1f}M{x - 4:.1f},{y1:.1f}h8M{x - 4:.1f},{y2:.1f}h8" '
                            f'stroke="{"#222" if bars else color}" fill="none"/>')
        if len(points) > 1:
            body.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" stroke-width="2"/>')
    return _svg(height, "".join(body), title)


@dataclass
class Panel:
    ytitle: str
    lines: list[tuple[str, list[float], list[float | None]]]  # name, x (seconds), y


def time_panels(title: str, panels: Sequence[Panel], marks: Sequence[tuple[float, str]] = (),
                shades: Sequence[tuple[float, float]] = (), panel_h: int = 110) -> str:
    """Panels stacked over one time axis, each figure on its own y axis; ``marks``: vertical lines (x, dash
    pattern), ``shades``: x spans shaded (TPS dips)."""
    xs = [x for p in panels for _, px, _ in p.lines for x in px] + [m for m, _ in marks]
    if not xs:
        return ""
    x0, x1 = min(xs), max(xs)
    span = (x1 - x0) or 1.0
    plot_w = WIDTH - LEFT - RIGHT
    gap = 22
    height = TOP + len(panels) * (panel_h + gap) + 20
    names = list(dict.fromkeys(name for p in panels for name, _, _ in p.lines))
    body = [_legend(names)]

    def sx(x: float) -> float:
        return LEFT + (x - x0) / span * plot_w

    for n, panel in enumerate(panels):
        top = TOP + n * (panel_h + gap)
        values = [y for _, _, py in panel.lines for y in py if y is not None]
        low, high = (min(0.0, *values), max(values)) if values else (0.0, 1.0)
        ticks = _ticks(low, high, 3)
        low, high = ticks[0], ticks[-1]
        scale = panel_h / (high - low or 1.0)
        body.append(_frame(height, panel_h, top, ticks, panel.ytitle, scale, low))
        for a, b in shades:
            body.append(f'<rect x="{sx(a):.1f}" y="{top}" width="{max(1.0, sx(b) - sx(a)):.1f}" height="{panel_h}" '
                        'fill="#d62728" fill-opacity="0.12"/>')
        for m, dash in marks:
            body.append(f'<line x1="{sx(m):.1f}" y1="{top}" x2="{sx(m):.1f}" y2="{top + panel_h}" stroke="#555" '
                        f'stroke-dasharray="{dash}"/>')
        for name, px, py in panel.lines:
            color = PALETTE[names.index(name) % len(PALETTE)]
            pts = " ".join(f"{sx(x):.1f},{top + panel_h - (y - low) * scale:.1f}"
                           for x, y in zip(px, py, strict=True) if y is not None)
            body.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    body += [f'<text x="{sx(t):.1f}" y="{height - 8}" text-anchor="middle">{_label(t)} s</text>'
             for t in _ticks(x0, x1, 8) if x0 <= t <= x1]
    return _svg(height, "".join(body), title)


@dataclass
class Point:
    x: float
    y: float
    error: float | None = None  # half-width of y's 95 % interval
    tip: str = ""


def xy(title: str, points: Sequence[Point], xtitle: str, ytitle: str, hline: tuple[float, str] | None = None,
       vline: tuple[float, str] | None = None, band: tuple[float, float] | None = None, y_max: float | None = None,
       height: int = 320) -> str:
    """Points over a numeric x axis, joined in x order, each with its y error bar: the hockey stick of latency vs
    throughput. ``hline``/``vline``: a dashed line at y (the target) or x (the capacity) with its label; ``band``:
    an x span shaded (the capacity's interval); ``y_max``: the top of the y axis, points above it drawn as a
    triangle on the top edge (their value in the tooltip), so that a collapse does not flatten the rest."""
    if not points:
        return ""
    plot_h, plot_w = height - TOP - 44, WIDTH - LEFT - RIGHT
    top_y = max([p.y + (p.error or 0.0) for p in points] + ([hline[0]] if hline else []))
    ticks = _ticks(0.0, min(top_y, y_max) if y_max else top_y)
    x_ticks = _ticks(0.0, max([p.x for p in points] + [v for v in (vline[0] if vline else None,
                                                                    band[1] if band else None) if v is not None]))
    scale, xscale = plot_h / (ticks[-1] or 1.0), plot_w / (x_ticks[-1] or 1.0)
    bottom = TOP + plot_h

    def sx(x: float) -> float:
        return LEFT + x * xscale

    def sy(y: float) -> float:
        return bottom - min(y, ticks[-1]) * scale

    body = [_frame(height, plot_h, TOP, ticks, ytitle, scale, 0.0)]
    body += [f'<text x="{sx(t):.1f}" y="{bottom + 16:.1f}" text-anchor="middle">{_label(t)}</text>' for t in x_ticks]
    body.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{height - 6}" text-anchor="middle">{escape(xtitle)}</text>')
    if band is not None:
        width = max(1.0, sx(band[1]) - sx(band[0]))
        body.append(f'<rect class="band" x="{sx(band[0]):.1f}" y="{TOP}" width="{width:.1f}" height="{plot_h}" '
                    'fill="#2ca02c" fill-opacity="0.12"/>')
    if hline is not None:
        body.append(f'<line class="target" x1="{LEFT}" y1="{sy(hline[0]):.1f}" x2="{WIDTH - RIGHT}" '
                    f'y2="{sy(hline[0]):.1f}" stroke="{PALETTE[1]}" stroke-dasharray="6,4"/>'
                    f'<text x="{WIDTH - RIGHT - 4}" y="{sy(hline[0]) - 5:.1f}" text-anchor="end" '
                    f'fill="{PALETTE[1]}">{escape(hline[1])}</text>')
    if vline is not None:
        body.append(f'<line class="capacity" x1="{sx(vline[0]):.1f}" y1="{TOP}" x2="{sx(vline[0]):.1f}" '
                    f'y2="{bottom:.1f}" stroke="{PALETTE[2]}" stroke-dasharray="6,4"/>'
                    f'<text x="{sx(vline[0]) - 4:.1f}" y="{TOP + 12}" text-anchor="end" '
                    f'fill="{PALETTE[2]}">{escape(vline[1])}</text>')
    color = PALETTE[0]
    ordered = sorted(points, key=lambda p: p.x)
    body.append(f'<polyline points="{" ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in ordered)}" fill="none" '
                f'stroke="{color}" stroke-width="2"/>')
    for p in ordered:
        x, y = sx(p.x), sy(p.y)
        tip = f"<title>{escape(p.tip)}</title>"
        if p.y > ticks[-1]:  # off the scale: a triangle on the top edge
            body.append(f'<path class="off-scale" d="M{x - 5:.1f},{y + 8:.1f}L{x:.1f},{y:.1f}L{x + 5:.1f},'
                        f'{y + 8:.1f}Z" fill="{color}">{tip}</path>')
            continue
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">{tip}</circle>')
        if p.error:
            y1, y2 = sy(max(0.0, p.y - p.error)), sy(p.y + p.error)
            body.append(f'<path d="M{x:.1f},{y1:.1f}V{y2:.1f}M{x - 4:.1f},{y1:.1f}h8M{x - 4:.1f},{y2:.1f}h8" '
                        f'stroke="{color}" fill="none"/>')
    return _svg(height, "".join(body), title)
