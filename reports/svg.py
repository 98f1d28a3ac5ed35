"""Small inline SVG charts for the HTML report: error histogram, per-backend timings, float32 precision.

Hand-written SVG rather than a plotting library: the report must be one file
that opens offline, and these pictures need a few dozen to a few hundred
elements each.  Every label goes through ``html.escape``; numbers are
formatted here.
"""

from __future__ import annotations

import math
from html import escape as e

from gradcheck.results import CaseResult, KinkReport

from ._common import f32_flagged, f32_leaves, finite, fmt, fmt_seconds, timing_parts
from .text import kink_counts, kink_sentence

# Okabe–Ito colours: distinguishable with the common colour-vision deficiencies.
WITHIN = "#009E73"  # bluish green
BEYOND = "#D55E00"  # vermillion
FIRST = "#0072B2"  # blue
SECOND = "#56B4E9"  # sky blue
FLOAT64 = "#CC79A7"  # reddish purple
INK = "#222"
MUTED = "#666"


def histogram_svg(histogram: dict, width: int = 340, height: int = 150) -> str:
    """Bars of log10(|a - b| / tolerance) over a leaf's elements; 0 marks the tolerance.

    Heights are on a log scale: the handful of elements beyond tolerance are
    the point of the picture and would vanish next to thousands within it.
    Returns "" when the histogram is missing or malformed.
    """
    edges = histogram.get("edges") or histogram.get("bins") or []
    counts = histogram.get("counts") or []
    if len(edges) != len(counts) + 1 or not counts or not all(finite(x) for x in edges):
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
    """Bars per backend: float32 first call (time to first gradient, compilation included), second call, float64 call."""
    names = list(dict.fromkeys([*case.backends, *case.timings, *case.unavailable]))
    if not names:
        return ""
    values = [s for t in case.timings.values() for s in timing_parts(t) if finite(s) and s > 0]
    vmax = max(values, default=0.0)
    label_w, value_w, bar_h, top = 60, 70, 9, 20
    rows = [max(1, sum(1 for s in timing_parts(case.timings[n]) if s is not None)) if n in case.timings else 1
            for n in names]
    height = top + sum(r * (bar_h + 2) + 10 for r in rows) + 4
    pw = width - label_w - value_w
    parts = [f'<svg class="timings" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="time per backend: float32 first and second call, float64 call">']
    legend = (("first call (incl. compile)", FIRST, 0), ("second call", SECOND, 150), ("float64", FLOAT64, 236))
    for label, colour, dx in legend:
        parts.append(f'<rect x="{label_w + dx}" y="4" width="10" height="8" fill="{colour}"/>'
                     f'<text x="{label_w + dx + 14}" y="12" class="ax">{e(label)}</text>')
    y = top
    for name, nrows in zip(names, rows, strict=True):
        parts.append(f'<text x="{label_w - 6}" y="{y + bar_h + 2}" class="lb" text-anchor="end">{e(name)}</text>')
        t = case.timings.get(name)
        if name in case.unavailable or t is None or all(s is None for s in timing_parts(t)):
            why = "unavailable" if name in case.unavailable else "error" if name in case.errors else "not timed"
            parts.append(f'<text x="{label_w}" y="{y + bar_h + 2}" class="ax">{e(why)}</text>')
            y += nrows * (bar_h + 2) + 10
            continue
        k = 0
        for s, colour, which in zip(timing_parts(t), (FIRST, SECOND, FLOAT64),
                                    ("float32 first", "float32 second", "float64"), strict=True):
            if s is None:  # an eager backend is called once in float32; older results have no float64
                continue
            yy = y + k * (bar_h + 2)
            w = pw * s / vmax if finite(s) and s > 0 and vmax > 0 else 0.0
            label = fmt_seconds(s)
            parts.append(f'<rect x="{label_w}" y="{yy}" width="{max(w, 1):.1f}" height="{bar_h}" fill="{colour}">'
                         f'<title>{e(f"{name} {which} call: {label}")}</title></rect>')
            parts.append(f'<text x="{label_w + w + 4:.1f}" y="{yy + bar_h - 1}" class="hl">{e(label)}</text>')
            k += 1
        y += nrows * (bar_h + 2) + 10
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------- float32 precision
# One colour, marker and dash per backend: colour is never the only cue.
LINE_STYLE = {"tape": ("#0072B2", "circle", ""), "torch": ("#E69F00", "square", "6 3"),
              "jax": ("#009E73", "diamond", "2 2")}
_EXTRA_STYLES = [("#CC79A7", "triangle", "8 2 2 2"), ("#56B4E9", "circle", "4 4"), ("#000000", "square", "1 3")]
LIMIT = "#D55E00"  # the imprecise limit, and the points beyond it


def _legend(parts: list[str], names, left: float) -> float:
    """One legend entry per backend (its line, marker and name) from ``left``; returns where the next goes."""
    lx = left
    for k, b in enumerate(names):
        colour, shape, dash = _style(b, k)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<g class="legend"><line x1="{lx}" y1="14" x2="{lx + 22}" y2="14" stroke="{colour}" '
                     f'stroke-width="1.6"{dash_attr}/>' + _marker(shape, lx + 11, 14, 2.6, colour) + _close(shape)
                     + f'<text x="{lx + 27}" y="18" class="lb">{e(b)}</text></g>')
        lx += 40 + 8 * len(b)
    return lx


def _style(backend: str, k: int):
    return LINE_STYLE.get(backend) or _EXTRA_STYLES[k % len(_EXTRA_STYLES)]


def _marker(shape: str, x: float, y: float, r: float, colour: str, extra: str = "") -> str:
    if shape == "square":
        return (f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" fill="{colour}"'
                f'{extra}>')
    if shape == "diamond":
        return (f'<path d="M{x:.1f} {y - r * 1.3:.1f}L{x + r * 1.3:.1f} {y:.1f}L{x:.1f} {y + r * 1.3:.1f}'
                f'L{x - r * 1.3:.1f} {y:.1f}Z" fill="{colour}"{extra}>')
    if shape == "triangle":
        return (f'<path d="M{x:.1f} {y - r * 1.3:.1f}L{x + r * 1.2:.1f} {y + r:.1f}L{x - r * 1.2:.1f} {y + r:.1f}Z" '
                f'fill="{colour}"{extra}>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{colour}"{extra}>'


def _close(shape: str) -> str:
    return {"square": "</rect>", "circle": "</circle>"}.get(shape, "</path>")


def kink_span(kink: KinkReport, paths: list[str]) -> tuple[float, float] | None:
    """Where a kink's layer sits on the chart's x axis: (first, last) leaf index, fractional between leaves.

    The leaves under the layer's path when it has any; a layer without
    parameters (a ReLU module ``features.2``) goes after the sibling before it
    (``features.1.*``); failing both, the span of its nearest ancestor.
    """
    if not paths:
        return None
    layer = kink.layer
    while True:
        hits = [i for i, p in enumerate(paths) if not layer or p == layer or p.startswith(layer + ".")]
        if hits:
            return float(hits[0]), float(hits[-1])
        parent, _, last = layer.rpartition(".")
        if last.isdigit():
            prefix = parent + "." if parent else ""
            before = [i for i, p in enumerate(paths) if p.startswith(prefix)
                      and p[len(prefix):].split(".", 1)[0].isdigit()
                      and int(p[len(prefix):].split(".", 1)[0]) < int(last)]
            if before:
                return before[-1] + 0.5, before[-1] + 0.5
        if not layer:
            return None
        layer = parent


def float32_svg(case: CaseResult, width: int = 820, height: int = 300) -> str:
    """One line per backend: log10 of its float32 gradient's error against float64, leaf by leaf in forward order.

    The dashed line is the imprecise limit of each leaf (a multiple of the
    best backend's error, plus a floor); points above it are ringed.  Ticks
    above the plot mark the layers where a kink sat within float32's reach
    (the float32 runs took the float64 branch there); their tooltips give the
    counts.  An exact float32 result (error 0) sits on the bottom edge, a
    non-finite one on the top edge.  Returns "" when the case has no float32 part.
    """
    leaves = f32_leaves(case)
    if not leaves:
        return ""
    names = list(dict.fromkeys([b for b in case.backends if any(b in leaf.float32.errors for leaf in leaves)]
                               + [b for leaf in leaves for b in leaf.float32.errors]))
    logs = [math.log10(v) for leaf in leaves for v in [*leaf.float32.errors.values(), leaf.float32.limit]
            if finite(v) and v > 0]
    if not names or not logs:
        return ""
    lo, hi = math.floor(min(logs)), math.ceil(max(logs))
    if hi - lo < 2:
        lo, hi = lo - 1, hi + 1
    left, right, top, bottom = 58, 14, 46, 46
    pw, ph = width - left - right, height - top - bottom
    n = len(leaves)
    paths = [leaf.path for leaf in leaves]

    def x(i: float) -> float:
        return left + (i + 0.5) * pw / n

    def y(v: float) -> float:
        return top + (hi - v) / (hi - lo) * ph

    bottom_y, top_y = top + ph, top
    flagged = sum(1 for leaf in leaves if f32_flagged(leaf))
    label = (f"float32 gradient error against float64, per backend ({', '.join(names)}), over {n} leaves in forward "
             f"order; {flagged} imprecise; {len(case.kinks)} kink sites")
    parts = [f'<svg class="f32chart" viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="xMinYMin meet" '
             f'style="max-width:{width}px" role="img" aria-label="{e(label)}"><title>{e(label)}</title>']
    # grid and y axis: one line per power of ten
    for p in range(lo, hi + 1):
        yy = y(p)
        parts.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" stroke="#e3e6ea"/>')
        parts.append(f'<text x="{left - 6}" y="{yy + 3:.1f}" class="ax" text-anchor="end">1e{p}</text>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom_y}" stroke="{MUTED}"/>')
    parts.append(f'<line x1="{left}" y1="{bottom_y}" x2="{left + pw}" y2="{bottom_y}" stroke="{MUTED}"/>')
    parts.append(f'<text x="12" y="{top + ph / 2:.1f}" class="ax" text-anchor="middle" '
                 f'transform="rotate(-90 12 {top + ph / 2:.1f})">‖g32 − g64‖ ÷ ‖g64‖ (log scale)</text>')
    # x axis: leaf numbers, and the top-level layer groups when they fit
    step = max(1, math.ceil(n / 12))
    for i in range(0, n, step):
        parts.append(f'<line x1="{x(i):.1f}" y1="{bottom_y}" x2="{x(i):.1f}" y2="{bottom_y + 4}" stroke="{MUTED}"/>'
                     f'<text x="{x(i):.1f}" y="{bottom_y + 14}" class="ax" text-anchor="middle">{i + 1}</text>')
    groups: list[list] = []
    for i, pth in enumerate(paths):
        g = pth.split(".", 1)[0] + (".*" if "." in pth else "")  # a path prefix, not a leaf number
        if groups and groups[-1][0] == g:
            groups[-1][2] = i
        else:
            groups.append([g, i, i])
    if 1 < len(groups) <= 24:
        for g, a, b in groups:
            span = (b - a + 1) * pw / n
            if a:
                parts.append(f'<line x1="{x(a - 0.5):.1f}" y1="{top}" x2="{x(a - 0.5):.1f}" y2="{bottom_y}" '
                             'stroke="#eef0f2"/>')
            if span >= 7 * len(g) + 6:
                parts.append(f'<text x="{x((a + b) / 2):.1f}" y="{bottom_y + 27}" class="ax" '
                             f'text-anchor="middle">{e(g)}</text>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 4}" class="ax" text-anchor="middle">'
                 f'gradient leaves in forward order (1 … {n}; hover a point for its path)</text>')
    # kink sites
    for k in case.kinks:
        span = kink_span(k, paths)
        if span is None:
            continue
        a, b = span
        crossed = any(k.crossed.values())
        colour = LIMIT if crossed else MUTED
        tip = e(f"{kink_sentence(k)}\n{kink_counts(k)}")
        if b > a:
            parts.append(f'<rect x="{x(a - 0.5):.1f}" y="{top}" width="{(b - a + 1) * pw / n:.1f}" height="{ph}" '
                         f'fill="{colour}" fill-opacity="0.06"/>')
        xx = x(b)
        parts.append(f'<g class="kink" data-layer="{e(k.layer)}" data-crossed="{int(crossed)}"><title>{tip}</title>'
                     f'<line x1="{xx:.1f}" y1="{top - 4}" x2="{xx:.1f}" y2="{bottom_y}" stroke="{colour}" '
                     f'stroke-dasharray="1 3"/>'
                     f'<path d="M{xx - 5:.1f} {top - 12}L{xx + 5:.1f} {top - 12}L{xx:.1f} {top - 3}Z" '
                     f'fill="{colour if crossed else "#fff"}" stroke="{colour}"/></g>')
    # the imprecise limit
    pts = [(x(i), y(math.log10(leaf.float32.limit))) for i, leaf in enumerate(leaves)
           if finite(leaf.float32.limit) and leaf.float32.limit > 0]
    if pts:
        d = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
        parts.append(f'<polyline class="f32limit" points="{d}" fill="none" stroke="{LIMIT}" stroke-width="1.2" '
                     f'stroke-dasharray="5 3"><title>imprecise limit per leaf</title></polyline>')
    # one line per backend; a leaf the backend has no number for breaks the line
    marks = n <= 400
    for k, b in enumerate(names):
        colour, shape, dash = _style(b, k)
        seg: list[tuple[float, float]] = []
        segs = [seg]
        points = []
        for i, leaf in enumerate(leaves):
            f = leaf.float32
            v = f.errors.get(b)
            if v is None:
                seg = []
                segs.append(seg)
                continue
            if finite(v) and v > 0:
                py, what = y(math.log10(v)), fmt(v)
            elif finite(v):
                py, what = bottom_y, "exact (0)"
            else:
                py, what = top_y, fmt(v)
            seg.append((x(i), py))
            over = b in f.imprecise
            tip = f"{b} · {leaf.path}: {what}" + (f" (limit {fmt(f.limit)})" if f.limit else "") + (
                " — imprecise" if over else "")
            points.append((x(i), py, over, tip))
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<g class="f32line" data-backend="{e(b)}">')
        for sg in segs:
            if len(sg) > 1:
                parts.append(f'<polyline points="{" ".join(f"{px:.1f},{py:.1f}" for px, py in sg)}" fill="none" '
                             f'stroke="{colour}" stroke-width="1.6"{dash_attr}/>')
        for px, py, over, tip in points:
            if over:
                parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="6" fill="none" stroke="{LIMIT}" '
                             'stroke-width="1.6"/>')
            if marks or over:
                parts.append(_marker(shape, px, py, 2.6, colour) + f"<title>{e(tip)}</title>" + _close(shape))
        parts.append("</g>")
    lx = _legend(parts, names, left)
    parts.append(f'<line x1="{lx}" y1="14" x2="{lx + 22}" y2="14" stroke="{LIMIT}" stroke-dasharray="5 3"/>'
                 f'<text x="{lx + 27}" y="18" class="ax">imprecise limit</text>')
    lx += 112
    if case.kinks:
        parts.append(f'<path d="M{lx + 4} 9L{lx + 14} 9L{lx + 9} 18Z" fill="{LIMIT}"/>'
                     f'<text x="{lx + 19}" y="18" class="ax">kink crossed in float32 (pinned)</text>'
                     f'<path d="M{lx + 200} 9L{lx + 210} 9L{lx + 205} 18Z" fill="#fff" stroke="{MUTED}"/>'
                     f'<text x="{lx + 215}" y="18" class="ax">kink within reach</text>')
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------- training trajectories
def loss_svg(traj, width: int = 520, height: int = 230) -> str:
    """One line per backend: its loss after each optimiser step (step 0: the start), on a linear scale.

    A backend's line stops where it failed; the step where the trajectories part is a dashed
    vertical line.  Lines that coincide are drawn on top of each other with different dashes and
    markers, so three agreeing backends read as one line with three markers.  Returns "" when
    there is nothing to draw.
    """
    names = [b for b, losses in traj.losses.items() if losses]
    values = [v for b in names for v in traj.losses[b] if finite(v)]
    if not names or not values:
        return ""
    n = max(len(traj.losses[b]) for b in names)
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-12 * max(abs(hi), abs(lo), 1.0):
        pad = max(abs(hi), 1.0) * 0.05
        lo, hi = lo - pad, hi + pad
    left, right, top, bottom = 70, 14, 30, 40
    pw, ph = width - left - right, height - top - bottom

    def x(k: float) -> float:
        return left + (k / max(n - 1, 1)) * pw

    def y(v: float) -> float:
        return top + (hi - v) / (hi - lo) * ph

    part = f"; they part after step {traj.parted}" if traj.parted is not None else "; they agree at every step"
    label = (f"loss after each of {traj.steps} {traj.optimizer} steps, per backend ({', '.join(names)})" + part)
    parts = [f'<svg class="losschart" viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="xMinYMin meet" '
             f'style="max-width:{width}px" role="img" aria-label="{e(label)}"><title>{e(label)}</title>']
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        v = lo + frac * (hi - lo)
        parts.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + pw}" y2="{y(v):.1f}" stroke="#e3e6ea"/>'
                     f'<text x="{left - 6}" y="{y(v) + 3:.1f}" class="ax" text-anchor="end">{e(fmt(v, 4))}</text>')
    bottom_y = top + ph
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom_y}" stroke="{MUTED}"/>'
                 f'<line x1="{left}" y1="{bottom_y}" x2="{left + pw}" y2="{bottom_y}" stroke="{MUTED}"/>')
    step = max(1, math.ceil(n / 12))
    for k in range(0, n, step):
        parts.append(f'<text x="{x(k):.1f}" y="{bottom_y + 14}" class="ax" text-anchor="middle">{k}</text>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 6}" class="ax" text-anchor="middle">'
                 'optimiser steps taken (0: the start)</text>')
    if traj.parted is not None and 0 <= traj.parted < n:
        xx = x(traj.parted)
        parts.append(f'<g class="parted"><title>{e(traj.message)}</title><line x1="{xx:.1f}" y1="{top}" '
                     f'x2="{xx:.1f}" y2="{bottom_y}" stroke="{LIMIT}" stroke-dasharray="4 3"/>'
                     f'<text x="{xx + 4:.1f}" y="{top + 10}" class="ax" fill="{LIMIT}">part</text></g>')
    marks = n <= 60
    for k, b in enumerate(names):
        colour, shape, dash = _style(b, k)
        pts = [(x(i), y(v), v) for i, v in enumerate(traj.losses[b]) if finite(v)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<g class="lossline" data-backend="{e(b)}">')
        if len(pts) > 1:
            parts.append(f'<polyline points="{" ".join(f"{px:.1f},{py:.1f}" for px, py, _ in pts)}" fill="none" '
                         f'stroke="{colour}" stroke-width="1.6"{dash_attr}/>')
        for i, (px, py, v) in enumerate(pts):
            if marks:
                parts.append(_marker(shape, px, py, 2.8, colour) + f"<title>{e(f'{b}, step {i}: {v:.10g}')}</title>"
                             + _close(shape))
        parts.append("</g>")
    _legend(parts, names, left)
    parts.append("</svg>")
    return "".join(parts)
