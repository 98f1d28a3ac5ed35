"""The HTML report: one self-contained file (inline CSS, JS and SVG) that opens offline.

Two kinds of content, escaped two ways:

* static parts (header, tree, failing-leaf cards, charts) are rendered here,
  every user-provided string through ``html.escape``;
* the per-leaf table is built in the browser from a JSON block
  (``<script type="application/json">``, with ``<``, ``>`` and ``&`` written
  as ``\\u003c``…, so no string can close the block), and its strings reach
  the page through ``textContent`` only.

A Content-Security-Policy in the page forbids every network request, so the
report cannot phone home or depend on a CDN even by accident.
"""

from __future__ import annotations

import json
import math
from html import escape as e
from importlib import resources

from gradcheck.results import FAILING, VERDICTS, CaseResult, RunResult

from ._common import (
    HEADLINE,
    SYMBOL,
    LeafNumbers,
    RunCounts,
    backends_of,
    blame_text,
    case_headroom,
    compared,
    failing_leaves,
    fmt,
    fmt_seconds,
    is_failing,
    run_sentence,
    write_text,
)
from .cards import leaf_card
from .svg import timings_svg
from .tree import badge, tree_html, vclass

CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
       "base-uri 'none'; form-action 'none'")
OPEN_CARDS = 6  # failing-leaf cards open by default per case; the rest are one click away
TOP_FAILURES = 12  # failing leaves listed in the header


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _jsonable(x):
    """JSON has no NaN/inf: send them as strings the page's ``num()`` understands."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def script_json(data) -> str:
    """JSON safe to place inside a <script> element, whatever strings it holds."""
    text = json.dumps(_jsonable(data), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return (text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _anchors(run: RunResult) -> dict[int, str]:
    """Ids for failing-leaf cards, made from positions: a path may hold any character."""
    out = {}
    for c, case in enumerate(run.cases):
        for k, leaf in enumerate(case.leaves):
            if is_failing(leaf.verdict):
                out[id(leaf)] = f"c{c}-leaf{k}"
    return out


def _data(run: RunResult, anchors: dict[int, str]) -> dict:
    cases = []
    for case in run.cases:
        rows = []
        for i, leaf in enumerate(case.leaves):
            n = LeafNumbers.of(leaf)
            rows.append({"i": i, "p": leaf.path, "l": leaf.layer, "r": leaf.role,
                         "s": "×".join(str(s) for s in leaf.shape) if leaf.shape else "scalar",
                         "v": leaf.verdict, "b": list(leaf.blame), "h": n.headroom, "a": n.max_abs,
                         "x": n.max_rel, "anchor": anchors.get(id(leaf), "")})
        cases.append({"name": case.name, "rows": rows})
    return {"verdicts": list(VERDICTS), "failing": list(FAILING), "symbols": SYMBOL, "cases": cases}


# ---------------------------------------------------------------- header
def _stat(value, label: str, bad: bool = False) -> str:
    return f"<div class='stat{' bad' if bad else ''}'><b>{e(str(value))}</b><span>{e(label)}</span></div>"


def _env(env: dict) -> str:
    items = []
    for key, value in env.items():
        if key == "command":
            continue
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        elif value is None:
            value = "not installed" if key in ("torch", "jax") else "—"
        items.append(f"<dt>{e(str(key))}</dt><dd>{e(str(value))}</dd>")
    versions = [f"{k} {env[k]}" for k in ("gradcheck", "python", "numpy", "torch", "jax") if env.get(k)]
    summary = "Environment" + (": " + " · ".join(versions) if versions else "")
    return f"<details class='env'><summary>{e(summary)}</summary><dl class='kv'>{''.join(items)}</dl></details>"


def _top_failures(run: RunResult, anchors: dict[int, str]) -> str:
    rows = []
    for c, case in enumerate(run.cases):
        for backend, text in case.errors.items():
            last = next((ln for ln in reversed(str(text).splitlines()) if ln.strip()), "")
            rows.append(f"<tr><td>{e(case.name)}</td><td><a href='#case-{c}'>{e(backend)} error</a> "
                        f"<span class='muted small'>{e(last[:160])}</span></td><td>{badge('error')}</td>"
                        f"<td class='blame'>{e(backend)}</td><td class='n'>—</td><td class='n'>—</td></tr>")
        for leaf in failing_leaves(case):
            n = LeafNumbers.of(leaf)
            link = f"<a href='#{anchors[id(leaf)]}'>{e(leaf.path)}</a>"
            rows.append(f"<tr><td>{e(case.name)}</td><td class='path'>{link}</td><td>{badge(leaf.verdict)}</td>"
                        f"<td class='blame'>{e(blame_text(leaf))}</td><td class='n'>{e(fmt(n.max_rel))}</td>"
                        f"<td class='n'>{e(fmt(n.headroom))}</td></tr>")
    if not rows:
        return ""
    more = len(rows) - TOP_FAILURES
    note = f"<p class='muted small'>… and {more} more in the cases below.</p>" if more > 0 else ""
    return ("<h3>Failing leaves and errors</h3><div class='tw'><table class='top'><thead><tr><th>case</th><th>leaf</th>"
            "<th>verdict</th><th>blamed</th><th>max rel diff</th><th>headroom</th></tr></thead><tbody>"
            + "".join(rows[:TOP_FAILURES]) + f"</tbody></table></div>{note}")


def _header(run: RunResult, anchors: dict[int, str]) -> str:
    n = RunCounts.of(run)
    verdict = run.verdict if run.failed else "agree"
    seed = run.env.get("seed")
    if seed is None:
        seeds = sorted({c.seed for c in run.cases})
        seed = ", ".join(str(s) for s in seeds) if seeds else "—"
    stats = [_stat(n.cases, "cases"), _stat(n.failed_cases, "failing cases", n.failed_cases > 0),
             _stat(n.compared, "leaves compared"), _stat(n.agreeing, "leaves agree"),
             _stat(n.failing_leaves, "leaves failing", n.failing_leaves > 0), _stat(seed, "seed"),
             _stat(", ".join(backends_of(run)) or "—", "backends")]
    command = run.env.get("command") or ""
    cmd = (f"<div class='cmd'><span class='label'>Reproduce</span><pre id='cmd-run'>{e(str(command))}</pre>"
           "<button type='button' data-copy='cmd-run'>Copy</button></div>") if command else ""
    big = f"<span class='badge big {vclass(verdict)}'>{SYMBOL.get(verdict, '?')} {e(verdict.upper())}</span>"
    return (f"<header class='top {vclass(verdict)}'><div class='hrow'>{big}<div><h1>{e(HEADLINE.get(verdict, verdict))}</h1>"
            f"<p class='sentence'>{e(run_sentence(run))}</p></div></div>"
            f"<div class='stats'>{''.join(stats)}</div>{cmd}{_env(run.env)}{_top_failures(run, anchors)}</header>")


# ---------------------------------------------------------------- cases
def _overview(run: RunResult) -> str:
    backends = backends_of(run)
    head = ("<tr><th>case</th><th>verdict</th><th>agree / compared</th><th>worst headroom</th>"
            "<th>disagreement starts at</th>" + "".join(f"<th>{e(b)} 1st / 2nd</th>" for b in backends) + "</tr>")
    rows = []
    for c, case in enumerate(run.cases):
        times = []
        for b in backends:
            t = case.timings.get(b)
            if b in case.unavailable:
                times.append("<td class='muted'>n/a</td>")
            elif t is None or (t.first is None and t.second is None):
                times.append(f"<td class='muted'>{'error' if b in case.errors else '—'}</td>")
            else:
                times.append(f"<td class='n'>{e(fmt_seconds(t.first))} / {e(fmt_seconds(t.second))}</td>")
        start = e(case.first_disagreement) if case.first_disagreement else "<span class='muted'>—</span>"
        rows.append(f"<tr{' class=bad' if case.failed else ''}><td><a href='#case-{c}'>{e(case.name)}</a></td>"
                    f"<td>{badge(case.verdict)}</td><td class='n'>{case.count('agree')} / {compared(case)}</td>"
                    f"<td class='n'>{e(fmt(case_headroom(case)))}</td><td class='path'>{start}</td>{''.join(times)}</tr>")
    return (f"<section class='panel'><h3 style='margin-top:0'>Cases</h3><div class='tw'><table>"
            f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div></section>")


def _leaf_table(c: int, case: CaseResult) -> str:
    present = [v for v in VERDICTS if case.count(v)] + sorted({x.verdict for x in case.leaves} - set(VERDICTS))
    vopts = "".join(f"<option value='{e(v)}'>{e(v)} ({case.count(v)})</option>" for v in present)
    names = list(dict.fromkeys([*case.backends, *(b for leaf in case.leaves for b in leaf.blame)]))
    bopts = "".join(f"<option value='{e(b)}'>{e(b)}</option>" for b in names)
    cols = [("i", "#"), ("p", "leaf"), ("l", "layer"), (None, "shape"), ("v", "verdict"), ("b", "blamed"),
            ("h", "headroom"), ("a", "max abs diff"), ("x", "max rel diff")]
    th = "".join(f"<th data-k='{k}' aria-sort='none'><button type='button'>{e(label)}</button></th>" if k
                 else f"<th>{e(label)}</th>" for k, label in cols)
    return (f"<div class='leaftable' data-case='{c}'><div class='controls'>"
            f"<label>Verdict <select data-f='verdict'><option value=''>all</option>{vopts}</select></label>"
            f"<label>Blamed <select data-f='blame'><option value=''>any</option>{bopts}</select></label>"
            "<label>Filter <input type='search' data-f='text' placeholder='leaf path or layer'></label>"
            "<label><input type='checkbox' data-f='failing'> only failing</label>"
            "<span class='shown' aria-live='polite'></span></div>"
            f"<div class='tw scroll'><table class='leaves'><thead><tr>{th}</tr></thead><tbody></tbody></table></div>"
            "<noscript><p class='muted'>The sortable table needs JavaScript; the tree above and the cards "
            "below show every leaf.</p></noscript></div>")


def _problems(case: CaseResult) -> str:
    parts = []
    if case.errors:
        parts.append("<h3>Errors</h3>" + "".join(
            f"<h4>{e(b)}</h4><pre class='err'>{e(str(t))}</pre>" for b, t in case.errors.items()))
    if case.unavailable:
        parts.append("<h3>Unavailable backends</h3><ul class='plain'>" + "".join(
            f"<li><b>{e(b)}</b>: {e(why)}</li>" for b, why in case.unavailable.items()) + "</ul>")
    if case.notes:
        parts.append("<h3>Notes</h3><ul class='plain'>" + "".join(f"<li>{e(n)}</li>" for n in case.notes) + "</ul>")
    return "".join(parts)


def _case(c: int, case: CaseResult, anchors: dict[int, str]) -> str:
    failing = failing_leaves(case)
    meta = " · ".join(x for x in (
        case.model and f"model {case.model}", f"{case.dtype}", f"{case.mode}", f"seed {case.seed}",
        case.params and f"{case.params:,} parameters", case.referee_passes and f"{case.referee_passes} referee passes",
    ) if x)
    summary = (f"<summary>{badge(case.verdict)}<h2>{e(case.name)}</h2><span class='meta'>{e(meta)}</span>"
               f"<span class='meta' style='margin-left:auto'>{case.count('agree')} of {compared(case)} leaves agree"
               f" · headroom {e(fmt(case_headroom(case)))}</span></summary>")
    body = []
    if case.first_disagreement:
        leaf = next((x for x in case.leaves if x.path == case.first_disagreement), None)
        target = anchors.get(id(leaf)) if leaf is not None else None
        name = e(case.first_disagreement)
        name = f"<a href='#{target}'>{name}</a>" if target else name
        layer = f" ({e(leaf.layer)})" if leaf is not None and leaf.layer else ""
        blamed = f" — blamed: <b>{e(blame_text(leaf))}</b>" if leaf is not None and leaf.blame else ""
        body.append(f"<div class='callout {vclass(leaf.verdict if leaf is not None else case.verdict)}'>"
                    f"Disagreement starts at <span class='path'>{name}</span>{layer}{blamed}."
                    "<br><span class='muted small'>The last failing parameter in forward order is the first "
                    "the backward pass reaches; the layers before it may only inherit its error.</span></div>")
    elif case.failed and not case.leaves:
        body.append("<div class='callout v-error'>No leaf was compared for this case.</div>")
    body.append(_problems(case))
    if case.replay:
        body.append(f"<div class='cmd'><span class='label'>Re-run this case</span><pre id='replay-{c}'>"
                    f"{e(case.replay)}</pre><button type='button' data-copy='replay-{c}'>Copy</button></div>")
    if case.leaves:
        timing = timings_svg(case)
        body.append(f"<div class='two'><div><h3>Model tree</h3>{tree_html(case.leaves, anchors)}</div>"
                    f"<div><h3>Time per backend</h3>{timing or '<p class=muted>not timed</p>'}</div></div>")
        body.append(f"<h3>Leaves</h3>{_leaf_table(c, case)}")
    elif case.timings:
        body.append(f"<h3>Time per backend</h3>{timings_svg(case)}")
    if failing:
        body.append(f"<h3>Failing leaves ({len(failing)})</h3>")
        body += [leaf_card(leaf, anchors[id(leaf)], opened=k < OPEN_CARDS or leaf.path == case.first_disagreement,
                           is_start=leaf.path == case.first_disagreement) for k, leaf in enumerate(failing)]
    opened = " open" if case.failed or len(case.leaves) == 0 else ""
    return (f"<details class='case {vclass(case.verdict)}' id='case-{c}'{opened}>{summary}"
            f"<div class='cbody'>{''.join(body)}</div></details>")


# ---------------------------------------------------------------- page
def render_html(run: RunResult) -> str:
    anchors = _anchors(run)
    verdict = run.verdict if run.failed else "agree"
    title = f"gradcheck: {verdict} — {run_sentence(run)}"
    cases = "".join(_case(c, case, anchors) for c, case in enumerate(run.cases))
    if not run.cases:
        cases = "<section class='panel'><p>No case ran: nothing was checked.</p></section>"
    version = run.env.get("gradcheck") or ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="color-scheme" content="light">
<title>{e(title)}</title>
<style>
{_asset("report.css")}
</style>
</head>
<body>
<main>
{_header(run, anchors)}
{_overview(run) if run.cases else ""}
{cases}
<footer>gradcheck {e(str(version))} · results schema {e(run.schema)} · verdict colours: Okabe–Ito palette</footer>
</main>
<script type="application/json" id="gradcheck-data">{script_json(_data(run, anchors))}</script>
<script>
{_asset("report.js")}
</script>
</body>
</html>
"""


def write_html(run: RunResult, path):
    return write_text(path, render_html(run))
