"""Inline SVG line charts for training curves, drawn by our own code.

Why not matplotlib or a JS charting library: the report must open from a file with no network, and a
few hundred bytes of SVG per chart keep a long run's report small; a chart is a polyline per series
with "nice" axis ticks, and every point carries a <title> so hovering shows the exact value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d", "#64748b",
          "#ca8a04"]
WIDTH, HEIGHT = 380, 210
LEFT, RIGHT, TOP, BOTTOM = 52, 10, 26, 30


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k steps) covering [low, high]; a flat range gets one tick."""
    if not math.isfinite(low) or not math.isfinite(high):
        return []
    if high == low:
        return [low]
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def fmt(value: float) -> str:
    """A short label: integers plainly, small or large values in compact scientific form."""
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.2g}"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def line_chart(title: str, x: Sequence[float], series: dict[str, Sequence[float | None]]) -> str:
    """One chart: ``series`` maps a legend name to y values aligned with ``x`` (None = missing point)."""
    points = [(xv, yv) for ys in series.values() for xv, yv in zip(x, ys, strict=False)
              if yv is not None and math.isfinite(yv)]
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
             f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
             f'<text x="{LEFT}" y="15" class="chart-title">{escape(title)}</text>']
    if not points:
        parts.append(f'<text x="{LEFT}" y="{HEIGHT / 2}" class="chart-empty">no values</text></svg>')
        return "".join(parts)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_ticks = nice_ticks(min(xs), max(xs))
    y_ticks = nice_ticks(min(ys), max(ys), 4)
    x0, x1 = x_ticks[0], x_ticks[-1]
    y0, y1 = y_ticks[0], y_ticks[-1]
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 1, y1 + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(v: float) -> float:
        return round(LEFT + (v - x0) / (x1 - x0) * plot_w, 1)

    def py(v: float) -> float:
        return round(TOP + (1 - (v - y0) / (y1 - y0)) * plot_h, 1)

    for t in y_ticks:
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(t)}" y2="{py(t)}"/>'
                     f'<text class="tick" x="{LEFT - 4}" y="{py(t) + 3}" text-anchor="end">{fmt(t)}</text>')
    for t in x_ticks:
        parts.append(f'<text class="tick" x="{px(t)}" y="{HEIGHT - BOTTOM + 13}" text-anchor="middle">{fmt(t)}</text>')
    parts.append(f'<text class="tick" x="{WIDTH - RIGHT}" y="{HEIGHT - 4}" text-anchor="end">step</text>')
    for n, (name, values) in enumerate(series.items()):
        color = COLORS[n % len(COLORS)]
        pts = [(xv, yv) for xv, yv in zip(x, values, strict=False) if yv is not None and math.isfinite(yv)]
        if not pts:
            continue
        coords = " ".join(f"{px(a)},{py(b)}" for a, b in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{coords}"/>')
        if len(pts) <= 200:  # hover targets; long runs keep only the line
            parts.extend(f'<circle cx="{px(a)}" cy="{py(b)}" r="2.2" fill="{color}">'
                         f'<title>{escape(name)} @ {fmt(a)}: {fmt(b)}</title></circle>' for a, b in pts)
        if len(series) > 1:
            lx = LEFT + 4 + (n % 3) * 108
            ly = TOP + 10 + (n // 3) * 12
            parts.append(f'<rect x="{lx}" y="{ly - 7}" width="8" height="8" fill="{color}"/>'
                         f'<text class="legend" x="{lx + 11}" y="{ly}">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def stacked_bars(title: str, x: Sequence[float], series: dict[str, Sequence[float | None]]) -> str:
    """One bar per ``x`` whose segments stack ``series`` (legend name -> a value per x; None counts as 0),
    in the order given, from the axis up: what a whole is made of, step by step."""
    totals = [sum(v[i] or 0.0 for v in series.values()) for i in range(len(x))]
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
             f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
             f'<text x="{LEFT}" y="15" class="chart-title">{escape(title)}</text>']
    if not x or max(totals, default=0.0) <= 0:
        parts.append(f'<text x="{LEFT}" y="{HEIGHT / 2}" class="chart-empty">no values</text></svg>')
        return "".join(parts)
    y_ticks = nice_ticks(0.0, max(totals), 4)
    top = y_ticks[-1] or 1.0
    legend_rows = (len(series) + 2) // 3
    plot_top = TOP + 12 * legend_rows
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - plot_top - BOTTOM
    slot = plot_w / len(x)
    width = max(1.0, round(slot * 0.7, 1))

    def py(v: float) -> float:
        return round(plot_top + (1 - v / top) * plot_h, 1)

    for t in y_ticks:
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py(t)}" y2="{py(t)}"/>'
                     f'<text class="tick" x="{LEFT - 4}" y="{py(t) + 3}" text-anchor="end">{fmt(t)}</text>')
    labelled = nice_ticks(min(x), max(x)) if len(x) > 12 else list(x)
    for i, xv in enumerate(x):
        left = round(LEFT + i * slot + (slot - width) / 2, 1)
        if xv in labelled:
            parts.append(f'<text class="tick" x="{round(left + width / 2, 1)}" y="{HEIGHT - BOTTOM + 13}" '
                         f'text-anchor="middle">{fmt(xv)}</text>')
        base = 0.0
        for n, (name, values) in enumerate(series.items()):
            value = values[i] or 0.0
            if value <= 0:
                continue
            color = COLORS[n % len(COLORS)]
            parts.append(f'<rect x="{left}" y="{py(base + value)}" width="{width}" '
                         f'height="{round(py(base) - py(base + value), 1)}" fill="{color}">'
                         f'<title>{escape(name)} @ {fmt(xv)}: {fmt(value)}</title></rect>')
            base += value
    parts.append(f'<text class="tick" x="{WIDTH - RIGHT}" y="{HEIGHT - 4}" text-anchor="end">step</text>')
    for n, name in enumerate(series):
        lx, ly = LEFT + 4 + (n % 3) * 108, TOP + 8 + (n // 3) * 12
        parts.append(f'<rect x="{lx}" y="{ly - 7}" width="8" height="8" fill="{COLORS[n % len(COLORS)]}"/>'
                     f'<text class="legend" x="{lx + 11}" y="{ly}">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)
