"""One card per failing (or float32-imprecise) leaf in the HTML report: the numbers, who is blamed and why.

The order inside a card follows the questions a reader asks: which backend is
wrong and on whose word (blame, referee), by how much against which rule
(pairs, tolerance), where (worst elements), and is it a few outliers or
everything (histogram); then the float32 part: each backend's float32
gradient against float64, and the limit it was held to.
"""

from __future__ import annotations

from html import escape as e

from gradcheck.results import LeafResult

from ._common import LeafNumbers, f32_ratio, fmt, fmt_index
from .svg import histogram_svg
from .text import imprecise_sentence
from .tree import badge, f32badge, vclass


def _table(head: list[str], rows: list[str], cls: str = "") -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    return f'<div class="tw"><table class="mini {cls}"><thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def _pairs(leaf: LeafResult) -> str:
    if not leaf.pairs:
        return ""
    rows = []
    for p in leaf.pairs:
        bad = ' class="bad"' if p.verdict != "agree" else ""
        rows.append(
            f"<tr{bad}><td>{e(p.backend)} <span class='vs'>vs</span> {e(p.reference)}</td><td>{badge(p.verdict)}</td>"
            f"<td class='n'>{p.mismatched:,} / {p.total:,}</td>"
            f"<td class='n'>{e(fmt(p.max_abs))} <span class='idx'>{e(fmt_index(p.max_abs_index))}</span></td>"
            f"<td class='n'>{e(fmt(p.max_rel))} <span class='idx'>{e(fmt_index(p.max_rel_index))}</span></td>"
            f"<td class='n'>{e(fmt(p.rel_err_norm))}</td><td class='n'>{e(fmt(p.cosine, 6))}</td>"
            f"<td class='n'><b>{e(fmt(p.headroom))}</b></td></tr>")
    return ("<h4>Backend pairs</h4>" + _table(
        ["pair", "verdict", "mismatched", "max abs diff [at]", "max rel diff [at]", "‖a−b‖ ÷ ‖b‖", "cosine",
         "headroom"], rows))


def _referee(leaf: LeafResult) -> str:
    if not leaf.referee:
        return ""
    rows = []
    resolved = any(getattr(r, "resolution", 0.0) for r in leaf.referee)
    for r in leaf.referee:
        verdict = "agree" if r.agrees else "disagree"
        if not getattr(r, "stable", True):
            # The finite difference moved when the step was doubled, or no step avoided a kink: the referee abstained.
            verdict = "skipped"
        res = f"<td class='n'>{e(fmt(getattr(r, 'resolution', 0.0)))}</td>" if resolved else ""
        rows.append(f"<tr{'' if r.agrees else ' class=bad'}><td>{e(r.backend)}</td>"
                    f"<td class='n'>{e(fmt(r.directional, 6))}</td><td class='n'>{e(fmt(r.numeric, 6))}</td>"
                    f"{res}<td class='n'>{e(fmt(r.error))}</td><td>{badge(verdict)}</td></tr>")
    head = ["backend", "⟨g, v⟩", "finite difference"] + (["resolution"] if resolved else []) + [
        "error ÷ resolution" if resolved else "error ÷ tol", "verdict"]
    return ("<h4>Referee <span class='sub'>float64 central differences along a random direction v</span></h4>"
            + _table(head, rows))


def _worst(leaf: LeafResult) -> str:
    if not leaf.worst:
        return ""

    def values(w: dict) -> dict:
        v = w.get("values")
        return v if isinstance(v, dict) else {k: x for k, x in w.items() if k not in ("index", "ratio")}

    names = list(dict.fromkeys(b for w in leaf.worst for b in values(w)))
    has_ratio = any("ratio" in w for w in leaf.worst)
    head = ["index"] + (["error ÷ tol"] if has_ratio else []) + [
        f"{e(b)}{' <span class=blamed>blamed</span>' if b in leaf.blame else ''}" for b in names]
    rows = []
    for w in leaf.worst:
        v = values(w)
        cells = [f"<td class='idx'>{e(fmt_index(w.get('index', [])))}</td>"]
        if has_ratio:
            cells.append(f"<td class='n'>{e(fmt(w.get('ratio')))}</td>")
        cells += [f"<td class='n{' blamedcell' if b in leaf.blame else ''}'>{e(fmt(v.get(b), 6))}</td>" for b in names]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return "<h4>Worst elements</h4>" + _table(head, rows)


def _histogram(leaf: LeafResult) -> str:
    svg = histogram_svg(leaf.histogram or {})
    if not svg:
        return ""
    pair = leaf.histogram.get("pair")
    caption = f"{e(pair[0])} vs {e(pair[1])}, all elements" if isinstance(pair, list) and len(pair) == 2 else ""
    return f"<h4>Error distribution <span class='sub'>{caption}</span></h4>{svg}"


def _tolerance(leaf: LeafResult) -> str:
    t = leaf.tolerance
    if t is None:
        return ""
    if getattr(t, "criterion", "elementwise") == "norm":
        rule = f"‖a − b‖ ÷ ‖b‖ ≤ <b>{e(fmt(t.norm_rtol))}</b>"
    else:
        rule = f"|a − b| ≤ atol + rtol·|b| with rtol <b>{e(fmt(t.rtol))}</b>, atol <b>{e(fmt(t.atol))}</b>"
    noise = getattr(t, "noise", None)
    old = f" <span class='muted small'>(measured float32 noise {e(fmt(noise))}, older results)</span>" if noise else ""
    return f"<p class='tol'>Tolerance: {rule} <span class='rule'>rule: {e(t.rule)}</span>{old}</p>"


def _float32(leaf: LeafResult) -> str:
    f = leaf.float32
    if f is None or not f.errors:
        return ""
    rows = []
    for b, err in f.errors.items():
        over = b in f.imprecise
        ratio = f32_ratio(f, b)
        rows.append(f"<tr{' class=bad' if over else ''}><td>{e(b)}{' <span class=blamed>imprecise</span>' if over else ''}"
                    f"{' <span class=muted>(best)</span>' if b == f.best else ''}</td><td class='n'>{e(fmt(err))}</td>"
                    f"<td class='n'>{e(fmt(ratio, 2))}×</td></tr>")
    sentence = imprecise_sentence(leaf)
    return (f"<h4>float32 against float64 {f32badge(f.verdict)} <span class='sub'>‖g32 − g64‖ ÷ ‖g64‖ per backend; "
            f"limit {e(fmt(f.limit))}</span></h4>" + (f"<p class='why'>{e(sentence)}</p>" if sentence else "")
            + _table(["backend", "error against float64", "× best"], rows))


def leaf_card(leaf: LeafResult, anchor: str, opened: bool, is_start: bool) -> str:
    n = LeafNumbers.of(leaf)
    shape = "×".join(str(s) for s in leaf.shape) if leaf.shape else "scalar"
    f = leaf.float32
    if leaf.blame:
        blamed = f"<span class='blame'>blamed: <b>{e(', '.join(leaf.blame))}</b></span>"
    elif f is not None and f.imprecise:
        blamed = f"<span class='blame'>float32 imprecise: <b>{e(', '.join(f.imprecise))}</b></span>"
    else:
        blamed = "<span class='blame muted'>nobody blamed</span>"
    f32 = f32badge(f.verdict) if f is not None and f.verdict not in ("ok", leaf.verdict) else ""
    start = "<span class='start'>disagreement starts here</span>" if is_start else ""
    head = (f"<summary>{badge(leaf.verdict)}{f32}<span class='path'>{e(leaf.path)}</span>"
            f"<span class='tmeta'>{e(leaf.layer)} · {e(shape)} · {e(leaf.dtype)}</span>{blamed}"
            f"<span class='hr'>headroom <b>{e(fmt(n.headroom))}</b></span>{start}</summary>")
    body = []
    if leaf.message:
        body.append(f"<p class='why'>{e(leaf.message)}</p>")
    body.append(_tolerance(leaf))
    body.append(_pairs(leaf))
    body.append(f"<div class='cols'><div>{_referee(leaf)}{_worst(leaf)}</div><div>{_histogram(leaf)}</div></div>")
    body.append(_float32(leaf))
    if leaf.norms:
        norms = " · ".join(f"{e(b)} {e(fmt(v, 4))}" for b, v in leaf.norms.items())
        body.append(f"<p class='muted small'>‖gradient‖: {norms}</p>")
    return (f"<details class='card {vclass(leaf.verdict)}' id='{e(anchor)}'{' open' if opened else ''}>{head}"
            f"<div class='cbody'>{''.join(body)}</div></details>")
