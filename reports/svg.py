"""Small inline-SVG charts for the self-contained HTML report: no scripts,
no network, every label escaped."""

from __future__ import annotations

from html import escape

PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"]
W, H, PAD = 640, 240, 44


def _scale(values, low, high, out_low, out_high):
    span = (high - low) or 1
    return [out_low + (v - low) * (out_high - out_low) / span for v in values]


def line_chart(series: dict[str, list[tuple[float, float]]], y_label: str, x_labels: tuple[str, str] = ("", ""),
               hline: tuple[float, str] | None = None) -> str:
    """One line per series of (x, y) points; ``hline`` draws a labelled level."""
    points = [p for pts in series.values() for p in pts]
    if not points:
        return '<p class="empty">no data</p>'
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    y_high = max(ys + ([hline[0]] if hline else [])) * 1.1 or 1
    parts = [f'<svg viewBox="0 0 {W} {H}" role="img" aria-label="{escape(y_label)}">',
             f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="#999"/>',
             f'<line x1="{PAD}" y1="10" x2="{PAD}" y2="{H - PAD}" stroke="#999"/>',
             f'<text x="4" y="14" font-size="11">{escape(y_label)}</text>',
             f'<text x="{PAD - 40}" y="{H - PAD}" font-size="10">0</text>',
             f'<text x="{PAD - 40}" y="24" font-size="10">{y_high:.3g}</text>',
             f'<text x="{PAD}" y="{H - PAD + 16}" font-size="10">{escape(x_labels[0])}</text>',
             f'<text x="{W - 120}" y="{H - PAD + 16}" font-size="10">{escape(x_labels[1])}</text>']
    if hline:
        [y] = _scale([hline[0]], 0, y_high, H - PAD, 10)
        parts.append(f'<line x1="{PAD}" y1="{y:.1f}" x2="{W - 10}" y2="{y:.1f}" stroke="#f59e0b" stroke-dasharray="4"/>'
                     f'<text x="{W - 140}" y="{y - 4:.1f}" font-size="10">{escape(hline[1])}</text>')
    for i, (name, pts) in enumerate(sorted(series.items())):
        color = PALETTE[i % len(PALETTE)]
        px = _scale([p[0] for p in pts], min(xs), max(xs), PAD, W - 10)
        py = _scale([p[1] for p in pts], 0, y_high, H - PAD, 10)
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(px, py))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{path}"/>')
        parts.append(f'<text x="{PAD + 8 + 110 * i}" y="{H - 6}" font-size="11" fill="{color}">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(bars: list[tuple[str, float]], unit: str) -> str:
    """Horizontal bars, largest first as given."""
    if not bars:
        return '<p class="empty">no data</p>'
    top = max(v for _, v in bars) or 1
    row = 22
    height = row * len(bars) + 10
    parts = [f'<svg viewBox="0 0 {W} {height}" role="img" aria-label="{escape(unit)}">']
    for i, (label, value) in enumerate(bars):
        y = 5 + i * row
        width = (W - 330) * value / top  # room for the value label
        parts.append(f'<text x="0" y="{y + 14}" font-size="11">{escape(label[:32])}</text>'
                     f'<rect x="200" y="{y}" width="{width:.1f}" height="{row - 6}" '
                     f'fill="{PALETTE[i % len(PALETTE)]}"/>'
                     f'<text x="{205 + width:.1f}" y="{y + 13}" font-size="10">{value:,.1f} {escape(unit)}</text>')
    parts.append("</svg>")
    return "".join(parts)
