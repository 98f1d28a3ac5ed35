"""Small inline SVG charts for the HTML report: error histogram and per-backend timings.

Hand-written SVG rather than a plotting library: the report must be one file
that opens offline, and these two pictures need a few dozen elements each.
Every label goes through ``html.escape``; numbers are formatted here.
"""

from __future__ import annotations

import math
from html import escape as e

from gradcheck.results import CaseResult

from ._common import fmt, fmt_seconds

# Okabe–Ito colours: distinguishable with the common colour-vision deficiencies.
WITHIN = "#009E73"  # bluish green
BEYOND = "#D55E00"  # vermillion
FIRST = "#0072B2"  # blue
SECOND = "#56B4E9"  # sky blue
INK = "#222"
MUTED = "#666"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def histogram_svg(histogram: dict, width: int = 340, height: int = 150) -> str:
    """Bars of log10(|a - b| / tolerance) over a leaf's elements; 0 marks the tolerance.

    Heights are on a log scale: the handful of elements beyond tolerance are
    the point of the picture and would vanish next to thousands within it.
    Returns "" when the histogram is missing or malformed.
    """
    edges = histogram.get("edges") or histogram.get("bins") or []
    counts = histogram.get("counts") or []
    if len(edges) != len(counts) + 1 or not counts or not all(_finite(x) for x in edges):
        return ""
    left, right, top, bottom = 34, 10, 22, 34
    pw, ph = width - left - right, height - top - bottom
    lo, hi = float(edges[0]), float(edges[-1])
    if hi <= lo:
        return ""

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * pw

    cmax = max(max(counts), 1)
    scale = math.log10(1 + cmax)
    beyond = sum(c for c, a in zip(counts, edges[:-1], strict=True) if a >= 0)
    total = sum(counts)
    parts = [f'<svg class="hist" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="{e(f"error histogram: {beyond} of {total} elements beyond the tolerance")}">']
    parts.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="{MUTED}"/>')
    for i, c in enumerate(counts):
        a, b = float(edges[i]), float(edges[i + 1])
        colour = BEYOND if a >= 0 else WITHIN if b <= 0 else "#E69F00"
        h = 0.0 if c <= 0 else max(1.5, ph * math.log10(1 + c) / scale)
        x0, x1 = x(a) + 1, x(b) - 1
        parts.append(f'<rect x="{x0:.1f}" y="{top + ph - h:.1f}" width="{max(x1 - x0, 1):.1f}" height="{h:.1f}" '
                     f'fill="{colour}"><title>{e(f"[{fmt(a)}, {fmt(b)}): {c} elements")}</title></rect>')
        if c > 0:
            parts.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{top + ph - h - 3:.1f}" class="hl" '
                         f'text-anchor="middle">{e(_short_count(c))}</text>')
    step = max(1, math.ceil(len(edges) / 8))
    for i in range(0, len(edges), step):
        v = float(edges[i])
        parts.append(f'<text x="{x(v):.1f}" y="{top + ph + 12}" class="ax" text-anchor="middle">{e(fmt(v))}</text>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 4}" class="ax" text-anchor="middle">'
                 'log₁₀(error ÷ tolerance)</text>')
    if lo < 0 < hi:
        x0 = x(0.0)
        parts.append(f'<line x1="{x0:.1f}" y1="{top - 8}" x2="{x0:.1f}" y2="{top + ph}" stroke="{INK}" '
                     'stroke-dasharray="3 2"/>')
        parts.append(f'<text x="{x0 + 3:.1f}" y="{top - 10}" class="ax">tolerance</text>')
    parts.append(f'<text x="{left - 4}" y="{top + 4}" class="ax" text-anchor="end">{e(_short_count(cmax))}</text>')
    parts.append(f'<text x="{left - 4}" y="{top + ph}" class="ax" text-anchor="end">0</text>')
    parts.append("</svg>")
    return "".join(parts)


def _short_count(c: int) -> str:
    return f"{c / 1e6:.1f}M" if c >= 1e6 else f"{c / 1e3:.1f}k" if c >= 1e4 else str(int(c))


def timings_svg(case: CaseResult, width: int = 380) -> str:
    """Two bars per backend: first call (time to first gradient, compilation included) and second call."""
    names = list(dict.fromkeys([*case.backends, *case.timings, *case.unavailable]))
    if not names:
        return ""
    values = [s for t in case.timings.values() for s in (t.first, t.second) if _finite(s) and s > 0]
    vmax = max(values, default=0.0)
    label_w, value_w, row_h, bar_h, top = 60, 70, 30, 10, 20
    pw = width - label_w - value_w
    height = top + row_h * len(names) + 4
    parts = [f'<svg class="timings" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="time per backend: first and second call">']
    parts.append(f'<rect x="{label_w}" y="4" width="10" height="8" fill="{FIRST}"/>'
                 f'<text x="{label_w + 14}" y="12" class="ax">first call (incl. compile)</text>'
                 f'<rect x="{label_w + 160}" y="4" width="10" height="8" fill="{SECOND}"/>'
                 f'<text x="{label_w + 174}" y="12" class="ax">second call</text>')
    for i, name in enumerate(names):
        y = top + i * row_h
        parts.append(f'<text x="{label_w - 6}" y="{y + bar_h + 4}" class="lb" text-anchor="end">{e(name)}</text>')
        t = case.timings.get(name)
        if name in case.unavailable or t is None or (t.first is None and t.second is None):
            why = "unavailable" if name in case.unavailable else "error" if name in case.errors else "not timed"
            parts.append(f'<text x="{label_w}" y="{y + bar_h + 4}" class="ax">{e(why)}</text>')
            continue
        for k, (s, colour, which) in enumerate(((t.first, FIRST, "first"), (t.second, SECOND, "second"))):
            if k == 1 and s is None:  # an eager backend is called once
                continue
            yy = y + k * (bar_h + 2)
            w = pw * s / vmax if _finite(s) and s > 0 and vmax > 0 else 0.0
            label = fmt_seconds(s)
            parts.append(f'<rect x="{label_w}" y="{yy}" width="{max(w, 1):.1f}" height="{bar_h}" fill="{colour}">'
                         f'<title>{e(f"{name} {which} call: {label}")}</title></rect>')
            parts.append(f'<text x="{label_w + w + 4:.1f}" y="{yy + bar_h - 1}" class="hl">{e(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
