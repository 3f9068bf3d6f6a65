# SPDX-License-Identifier: Apache-2.0
"""Hand-written inline SVG for the self-contained HTML report: no scripts, no
fonts or files fetched, every string escaped (host and process names are
chosen by whoever runs a process).

Every chart has labelled axes with ticks and gridlines; latency axes are
logarithmic (powers of 10, or of 2 over a narrow range), because tails span
decades. Lines differ in colour *and* dash and are named in a legend, and
lines drawn later are thinner, so equal series still show each other. Text
is sized from its character count (``text_width``) and placed or shortened
so that it fits its box. Each tick label carries ``data-value`` and each axis
``data-scale``, which is what the report tests read back from the rendered
DOM. A hand-written ~300 lines beat a plotting library here: the report stays
one small file that any browser renders offline.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from html import escape

PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"]
DASHES = ["", "6 3", "2 3", "9 3 2 3"]
W = 720
FONT = 11  # px in viewBox units, for every label
CHAR_W = 0.62  # average glyph width of system-ui as a share of the font size (a little generous)
LEFT, RIGHT, TOP, BOTTOM = 70, 18, 30, 46
GRID = "#e5e7eb"
AXIS = "#6b7280"


def text_width(text: str, size: float = FONT) -> float:
    return len(text) * size * CHAR_W


def fit(text: str, width: float, size: float = FONT) -> str:
    """``text`` shortened with an ellipsis to fit ``width``."""
    room = int(width / (size * CHAR_W) + 1e-6)
    return text if len(text) <= room else text[:max(room - 1, 1)] + "…"


def _text(x: float, y: float, text: str, anchor: str = "start", cls: str = "", value: float | None = None,
          fill: str = "#111", rotate: bool = False, size: float = FONT) -> str:
    attrs = f' class="{cls}"' if cls else ""
    if value is not None:
        attrs += f' data-value="{value:.6g}"'
    if rotate:
        attrs += f' transform="rotate(-90 {x:.1f} {y:.1f})"'
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size:g}" text-anchor="{anchor}" fill="{fill}"{attrs}>'
            f'{escape(text)}</text>')


def _dash(dash: str) -> str:
    return f' stroke-dasharray="{dash}"' if dash else ""


# -- scales ---------------------------------------------------------------------

def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1, 2, 2.5 or 5 x 10^n apart)."""
    if high <= low:
        high = low + (abs(low) or 1)
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks, v = [], first
    while v < high + step * 0.999:
        ticks.append(round(v, 12))
        v += step
    return ticks


def log_ticks(low: float, high: float) -> list[float]:
    """Powers of 10 covering [low, high]; powers of 2 when that gives fewer than 3."""
    low = max(low, 1e-9)
    high = max(high, low * 1.0001)
    tens = [10.0 ** e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)]
    if len(tens) >= 3:
        return tens
    return [2.0 ** e for e in range(math.floor(math.log2(low)), math.ceil(math.log2(high)) + 1)]


TIME_STEPS = [3600 * h for h in (1, 2, 3, 6, 12, 24, 48, 168)]


def time_ticks(low: float, high: float, room: float) -> list[float]:
    """Whole hours/days that fit ``room`` px with their labels apart."""
    most = max(2, int(room // (text_width("11-30 00:00") + 16)))
    step = next((s for s in TIME_STEPS if (high - low) / s <= most), TIME_STEPS[-1])
    first = math.ceil(low / step) * step
    return [float(t) for t in range(int(first), int(high) + 1, step)] or [low]


def fmt_number(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e6:
        return f"{v / 1e6:g}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def fmt_ms(v: float) -> str:
    """A latency in ms as people write it: 1 µs, 0.5 ms, 10 ms, 2 s."""
    if v >= 1000:
        return f"{v / 1000:g} s"
    if v < 0.01:
        return f"{v * 1000:g} µs"
    return f"{v:g} ms"


def fmt_seconds(v: float) -> str:
    """A duration in seconds as people write it: 0.5 s, 10 s, 2k s."""
    return f"{fmt_number(v)} s"


def fmt_time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%m-%d %H:%M")


class Axis:
    """Maps data values to pixels and draws ticks, labels and gridlines."""

    def __init__(self, low: float, high: float, out_low: float, out_high: float, kind: str, fmt=fmt_number):
        self.kind, self.fmt = kind, fmt  # kind: "linear", "log" or "time"
        if kind == "log":
            self.ticks = log_ticks(low, high)
        elif kind == "time":
            self.ticks = time_ticks(low, high, abs(out_high - out_low))
        else:
            self.ticks = nice_ticks(min(low, 0.0), high)
        if kind == "time":
            self.low, self.high = low, high
        else:
            self.low, self.high = min(self.ticks[0], low), max(self.ticks[-1], high)
        self.out_low, self.out_high = out_low, out_high

    def __call__(self, v: float) -> float:
        if self.kind == "log":
            lo, hi, v = math.log10(self.low), math.log10(self.high), math.log10(max(v, self.low))
        else:
            lo, hi = self.low, self.high
        span = (hi - lo) or 1
        return self.out_low + (v - lo) * (self.out_high - self.out_low) / span

    def scale(self) -> str:
        return "log" if self.kind == "log" else "linear"


def _frame(x: Axis, y: Axis, height: float, x_label: str, y_label: str, x_limit: float = W - 2) -> list[str]:
    """Gridlines, axis lines, tick labels and axis titles; an x tick whose
    label would pass ``x_limit`` is left out."""
    right = x.out_high
    parts = [f'<g class="axis x" data-scale="{x.scale()}">']
    for t in x.ticks:
        px = x(t)
        if px + text_width(x.fmt(t)) / 2 > x_limit:
            continue
        parts.append(f'<line x1="{px:.1f}" y1="{TOP}" x2="{px:.1f}" y2="{height - BOTTOM}" stroke="{GRID}"/>')
        parts.append(_text(px, height - BOTTOM + 15, x.fmt(t), "middle", "tick", t))
    parts.append(f'<line x1="{LEFT}" y1="{height - BOTTOM}" x2="{right}" y2="{height - BOTTOM}" stroke="{AXIS}"/>')
    parts.append(_text((LEFT + right) / 2, height - BOTTOM + 32, x_label, "middle", "title"))
    parts.append(f'</g><g class="axis y" data-scale="{y.scale()}">')
    for t in y.ticks:
        py = y(t)
        parts.append(f'<line x1="{LEFT}" y1="{py:.1f}" x2="{right}" y2="{py:.1f}" stroke="{GRID}"/>')
        parts.append(_text(LEFT - 6, py + 4, y.fmt(t), "end", "tick", t))
    parts.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{height - BOTTOM}" stroke="{AXIS}"/>')
    parts.append(_text(LEFT, TOP - 12, y_label, "start", "title"))
    parts.append("</g>")
    return parts


def _legend(names: list[str], y: float) -> tuple[list[str], float]:
    """Swatches (colour and dash of each line) with names, wrapped to the
    width; returns the parts and the height used."""
    parts, x, row = ['<g class="legend">'], LEFT, 0
    for i, name in enumerate(names):
        label = fit(name, W - LEFT - RIGHT - 34)
        width = 34 + text_width(label) + 18
        if x + width > W - RIGHT and x > LEFT:
            x, row = LEFT, row + 1
        ly = y + row * 18
        dash = DASHES[i % len(DASHES)]
        parts.append(f'<line x1="{x}" y1="{ly - 4}" x2="{x + 26}" y2="{ly - 4}" stroke="{PALETTE[i % len(PALETTE)]}" '
                     f'stroke-width="2.5"{_dash(dash)}/>')
        parts.append(_text(x + 32, ly, label))
        x += width
    parts.append("</g>")
    return parts, (row + 1) * 18


def _same_line(pts: list[tuple[float, float]], theirs: list[tuple[float, float]]) -> bool:
    """The same x values, and y within 2% at each."""
    return len(theirs) == len(pts) and all(a == c and abs(b - d) <= 0.02 * max(abs(b), abs(d), 1e-12)
                                           for (a, b), (c, d) in zip(pts, theirs))


def coinciding(series: dict[str, list[tuple[float, float]]]) -> list[tuple[str, str]]:
    """(name, earlier name) for each series whose line lies on an earlier
    one, in the order ``line_chart`` draws them (points sorted by x)."""
    ordered = {name: sorted(pts) for name, pts in series.items() if pts}
    names = list(ordered)
    found = []
    for i, name in enumerate(names):
        other = next((o for o in names[:i] if _same_line(ordered[name], ordered[o])), None)
        if other is not None:
            found.append((name, other))
    return found


def _coinciding(name: str, series: dict[str, list[tuple[float, float]]], earlier: list[str]) -> str:
    """The legend entry of ``name``, saying so when its line lies on an
    earlier one (same points within 2%): the reader sees one band, not a
    missing line."""
    other = next((o for o in earlier if _same_line(series[name], series[o])), None)
    return name if other is None else f"{name} (= {other})"


def line_chart(series: dict[str, list[tuple[float, float]]], *, x_label: str, y_label: str, x_kind: str = "time",
               y_log: bool = True, hline: tuple[float, str] | None = None, markers: bool = False,
               height: int = 300, y_fmt=fmt_ms) -> str:
    """One line per named series of (x, y) points; ``hline`` is a labelled
    level (an alert threshold). ``x_kind``: "time" (epoch seconds) or
    "linear" (a number, e.g. load)."""
    series = {name: sorted(p for p in pts if not y_log or p[1] > 0) for name, pts in series.items()}
    series = {name: pts for name, pts in series.items() if pts}
    if not series:
        return '<p class="empty">no data</p>'
    names = list(series)
    labels = [_coinciding(name, series, names[:i]) for i, name in enumerate(names)]
    legend, legend_h = _legend(labels, 0)  # measured first: the plot gives it room
    total = height + legend_h
    xs = [p[0] for pts in series.values() for p in pts]
    ys = [p[1] for pts in series.values() for p in pts] + ([hline[0]] if hline else [])
    x = Axis(min(xs), max(xs), LEFT, W - RIGHT, x_kind, fmt_time if x_kind == "time" else fmt_number)
    y_low = min(ys) if y_log else 0.0
    y = Axis(y_low, max(ys) * (1 if y_log else 1.05), height - BOTTOM, TOP, "log" if y_log else "linear", y_fmt)
    parts = [f'<svg class="chart" viewBox="0 0 {W} {total}" role="img" aria-label="{escape(y_label)}">',
             *_frame(x, y, height, x_label, y_label)]
    if hline:
        py = y(hline[0])
        label = fit(hline[1], W / 3)
        parts.append(f'<line x1="{LEFT}" y1="{py:.1f}" x2="{W - RIGHT}" y2="{py:.1f}" stroke="#f59e0b" '
                     f'stroke-width="1.5" stroke-dasharray="5 4"/>')
        parts.append(_text(W - RIGHT - 4, py - 5, label, "end", fill="#b45309"))
    for i, name in enumerate(names):
        color, dash = PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)]
        width = 1.6 + 1.2 * (len(names) - 1 - i)  # earlier lines wider: equal series stay visible
        points = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in series[name])
        parts.append(f'<polyline class="series" fill="none" stroke="{color}" stroke-width="{width:.1f}" '
                     f'stroke-opacity="0.85" stroke-linejoin="round"{_dash(dash)} '
                     f'points="{points}"><title>{escape(name)}</title></polyline>')
        if markers or len(series[name]) == 1:
            parts.extend(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{color}"/>' for a, b in series[name])
    legend, _ = _legend(labels, height + 4)
    parts.extend(legend)
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(bars: list[tuple[str, float]], *, unit: str, x_label: str) -> str:
    """Horizontal bars in the given order, each labelled with its value; the
    name column and the value labels are sized so that all text fits."""
    if not bars:
        return '<p class="empty">no data</p>'
    row, pad_top = 24, 8
    values = [f"{v:,.1f} {unit}" for _, v in bars]
    name_w = min(max(text_width(n) for n, _ in bars) + 12, W * 0.32)
    left = name_w
    value_w = max(text_width(v) for v in values) + 10
    right = W - RIGHT - value_w  # the longest bar still has room for its label after it
    height = pad_top + row * len(bars) + BOTTOM
    axis = Axis(0, max(v for _, v in bars) or 1, left, right, "linear")
    bottom = height - BOTTOM
    parts = [f'<svg class="chart bars" viewBox="0 0 {W} {height}" role="img" aria-label="{escape(x_label)}">',
             '<g class="axis x" data-scale="linear">']
    for t in axis.ticks:
        px = axis(t)
        parts.append(f'<line x1="{px:.1f}" y1="{pad_top - 4}" x2="{px:.1f}" y2="{bottom}" stroke="{GRID}"/>')
        parts.append(_text(px, bottom + 15, fmt_number(t), "middle", "tick", t))
    parts.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="{AXIS}"/>')
    parts.append(_text((left + right) / 2, bottom + 32, x_label, "middle", "title"))
    parts.append('</g><g class="axis y" data-scale="band">')
    for i, ((name, value), label) in enumerate(zip(bars, values)):
        y0 = pad_top + i * row
        width = axis(value) - left
        parts.append(_text(left - 8, y0 + 15, fit(name, name_w - 12), "end", "tick"))
        parts.append(f'<rect x="{left}" y="{y0 + 3}" width="{max(width, 0.5):.1f}" height="{row - 8}" '
                     f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(name)}</title></rect>')
        parts.append(_text(left + width + 5, y0 + 15, label, "start", "value"))
    parts.append("</g></svg>")
    return "".join(parts)


def _shade(share: float) -> str:
    """White (none) to dark blue (most), for a share in [0, 1]."""
    low, high = (247, 251, 255), (8, 48, 107)
    r, g, b = (round(a + (c - a) * share) for a, c in zip(low, high))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(cells: dict[tuple[float, int], int], *, title: str, step_s: int = 3600, height: int = 300) -> str:
    """Latency over time from log2 histograms: a column per ``step_s``, a row
    per slot ([2^slot, 2^(slot+1)) µs), shaded by the log of its count. The
    latency axis is log2 by construction; ticks fall on powers of 10 µs."""
    if not cells:
        return '<p class="empty">no data</p>'
    times = sorted({t for t, _ in cells})
    slots = [s for _, s in cells]
    s_low, s_high = min(slots), max(slots) + 1
    t_low, t_high = times[0], times[-1] + step_s
    kx = W - RIGHT - 30  # the colour key's left edge
    x = Axis(t_low, t_high, LEFT, kx - 50, "time", fmt_time)
    # the y axis in ms, log scale: slot s spans [2^s, 2^(s+1)) µs
    y = Axis(2.0 ** s_low / 1000, 2.0 ** s_high / 1000, height - BOTTOM, TOP, "log", fmt_ms)
    y.low, y.high = 2.0 ** s_low / 1000, 2.0 ** s_high / 1000  # the cells, not the ticks, set the range
    y.ticks = [t for t in y.ticks if y.low <= t <= y.high] or [y.low, y.high]
    if len(y.ticks) < 3:  # a narrow range: every slot boundary
        y.ticks = [2.0 ** s / 1000 for s in range(s_low, s_high + 1)]
    most = math.log10(max(cells.values()) + 1)
    parts = [f'<svg class="chart heatmap" viewBox="0 0 {W} {height}" role="img" aria-label="{escape(title)}">']
    cell_w = max(x(t_low + step_s) - x(t_low), 0.5)
    for (t, slot), count in sorted(cells.items()):
        top, bottom = y(2.0 ** (slot + 1) / 1000), y(2.0 ** slot / 1000)
        parts.append(f'<rect x="{x(t):.1f}" y="{top:.1f}" width="{cell_w + 0.3:.1f}" height="{bottom - top + 0.3:.1f}" '
                     f'fill="{_shade(math.log10(count + 1) / most if most else 0)}"/>')
    parts.extend(_frame(x, y, height, "time (UTC)", title, x_limit=kx - 6))
    # the colour key: counts on a log scale, top = most
    k_top, k_bottom = TOP, height - BOTTOM
    parts.append('<g class="key">')
    for i in range(20):
        y0 = k_bottom - (i + 1) * (k_bottom - k_top) / 20
        parts.append(f'<rect x="{kx}" y="{y0:.1f}" width="12" height="{(k_bottom - k_top) / 20 + 0.3:.1f}" '
                     f'fill="{_shade((i + 0.5) / 20)}"/>')
    peak = max(cells.values())
    parts.append(_text(kx + 6, k_top - 6, fmt_number(float(peak)), "middle", size=10))
    parts.append(_text(kx + 6, k_bottom + 13, "0", "middle", size=10))
    parts.append(_text(kx + 20, (k_top + k_bottom) / 2, "waits per hour", "middle", rotate=True, size=10))
    parts.append("</g></svg>")
    return "".join(parts)
