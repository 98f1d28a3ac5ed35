"""One card per failing leaf in the HTML report: the numbers, who is blamed and why, the evidence.

The order inside a card follows the questions a reader asks: which backend is
wrong and on whose word (blame, referee), by how much against which rule
(pairs, tolerance), where (worst elements), and is it a few outliers or
everything (histogram).
"""

from __future__ import annotations

from html import escape as e

from gradcheck.results import LeafResult

from ._common import LeafNumbers, fmt, fmt_index
from .svg import histogram_svg
from .tree import badge, vclass


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
    for r in leaf.referee:
        verdict = "agree" if r.agrees else "disagree"
        rows.append(f"<tr{'' if r.agrees else ' class=bad'}><td>{e(r.backend)}</td>"
                    f"<td class='n'>{e(fmt(r.directional, 6))}</td><td class='n'>{e(fmt(r.numeric, 6))}</td>"
                    f"<td class='n'>{e(fmt(r.error))}</td><td>{badge(verdict)}</td></tr>")
    return ("<h4>Referee <span class='sub'>float64 central differences along a random direction v</span></h4>"
            + _table(["backend", "⟨g, v⟩", "finite difference", "error ÷ tol", "verdict"], rows))


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


def leaf_card(leaf: LeafResult, anchor: str, opened: bool, is_start: bool) -> str:
    n = LeafNumbers.of(leaf)
    shape = "×".join(str(s) for s in leaf.shape) if leaf.shape else "scalar"
    blamed = (f"<span class='blame'>blamed: <b>{e(', '.join(leaf.blame))}</b></span>" if leaf.blame
              else "<span class='blame muted'>nobody blamed</span>")
    start = "<span class='start'>disagreement starts here</span>" if is_start else ""
    head = (f"<summary>{badge(leaf.verdict)}<span class='path'>{e(leaf.path)}</span>"
            f"<span class='tmeta'>{e(leaf.layer)} · {e(shape)} · {e(leaf.dtype)}</span>{blamed}"
            f"<span class='hr'>headroom <b>{e(fmt(n.headroom))}</b></span>{start}</summary>")
    body = []
    if leaf.message:
        body.append(f"<p class='why'>{e(leaf.message)}</p>")
    if leaf.tolerance is not None:
        t = leaf.tolerance
        body.append(f"<p class='tol'>Tolerance: |a − b| ≤ atol + rtol·|b| with rtol <b>{e(fmt(t.rtol))}</b>, "
                    f"atol <b>{e(fmt(t.atol))}</b> <span class='rule'>rule: {e(t.rule)}</span></p>")
    if leaf.tie:
        body.append("<p class='note'>A max/ReLU tie (a kink) was involved: at a kink each AD may legitimately "
                    "pick a different subgradient.</p>")
    body.append(_pairs(leaf))
    body.append(f"<div class='cols'><div>{_referee(leaf)}{_worst(leaf)}</div><div>{_histogram(leaf)}</div></div>")
    if leaf.norms:
        norms = " · ".join(f"{e(b)} {e(fmt(v, 4))}" for b, v in leaf.norms.items())
        body.append(f"<p class='muted small'>‖gradient‖: {norms}</p>")
    return (f"<details class='card {vclass(leaf.verdict)}' id='{e(anchor)}'{' open' if opened else ''}>{head}"
            f"<div class='cbody'>{''.join(body)}</div></details>")
