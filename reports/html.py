"""The HTML report: one self-contained file (inline CSS, JS and SVG) that opens offline.

Two kinds of content, escaped two ways:

* static parts (header, tree, failing-leaf cards, charts) are rendered here,
  every user-provided string through ``html.escape``;
* the per-leaf table is built in the browser from a JSON block
  (``<script type="application/json">``, with ``<``, ``>`` and ``&`` written
  as ``\\u003c``…, so no string can close the block), and its strings reach
  the page through ``textContent`` only.

Each case shows both parts of its verdict: float64 (the comparison that
decides correctness: tree, table, failing-leaf cards) and float32 (each
backend's float32 gradients measured against float64, drawn as one line per
backend over the leaves in forward order, with the imprecise limit and the
kink sites).

A Content-Security-Policy in the page forbids every network request, so the
report cannot phone home or depend on a CDN even by accident.
"""

from __future__ import annotations

import json
import math
from html import escape as e
from importlib import resources

from gradcheck.results import FLOAT32_VERDICTS, VERDICTS, CaseResult, RunResult

from ._common import (
    SYMBOL,
    LeafNumbers,
    RunCounts,
    agreeing,
    backends_of,
    blame_text,
    case_headroom,
    compared,
    f32_leaves,
    f32_worst,
    failing_leaves,
    fmt,
    fmt_seconds,
    imprecise_fails,
    imprecise_leaves,
    incomplete,
    run_status,
    timing_parts,
    vacuous_leaves,
    write_text,
)
from .cards import leaf_card
from .svg import float32_svg, loss_svg, timings_svg
from .text import (
    HEADLINE,
    case_failure,
    coverage_label,
    error_parts,
    float32_worst_text,
    imprecise_sentence,
    kink_counts,
    kink_sentence,
    loss_sentence,
    origin_sentence,
    partial_sentence,
    pinning_sentence,
    run_sentence,
    second_order_sentence,
    trajectory_head,
    trajectory_steps,
    unavailable_notices,
    vacuous_head,
)
from .tree import badge, f32badge, tree_html, vclass

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


def _carded(case: CaseResult) -> list:
    """Leaves that get a card: failures first, then float32 warnings."""
    return failing_leaves(case) + imprecise_leaves(case)


def _anchors(run: RunResult) -> dict[int, str]:
    """Ids for leaf cards, made from positions: a path may hold any character."""
    out = {}
    for c, case in enumerate(run.cases):
        carded = {id(x) for x in _carded(case)}
        for k, leaf in enumerate(case.leaves):
            if id(leaf) in carded:
                out[id(leaf)] = f"c{c}-leaf{k}"
    return out


def _f32_backends(case: CaseResult) -> list[str]:
    leaves = [leaf for leaf in case.leaves if leaf.float32 is not None]
    return list(dict.fromkeys([b for b in case.backends if any(b in x.float32.errors for x in leaves)]
                              + [b for x in leaves for b in x.float32.errors]))


def _first_order(case: CaseResult) -> list:
    return [leaf for leaf in case.leaves if leaf.role != "hvp"]


def _hvp_slots(run: RunResult) -> dict[int, int]:
    """Case index -> the index of its second-order table's rows in the page's data (after every case's own)."""
    slots = {}
    for c, case in enumerate(run.cases):
        if any(leaf.role == "hvp" for leaf in case.leaves):
            slots[c] = len(run.cases) + len(slots)
    return slots


def _data(run: RunResult, anchors: dict[int, str]) -> dict:
    cases, second = [], []
    for case in run.cases:
        rows = []
        hvp_rows = []
        for i, leaf in enumerate(case.leaves):
            n = LeafNumbers.of(leaf)
            f = leaf.float32
            worst = f32_worst(leaf)
            rows.append({"i": i, "p": leaf.path, "l": leaf.layer, "r": leaf.role,
                         "s": "×".join(str(s) for s in leaf.shape) if leaf.shape else "scalar",
                         "v": leaf.verdict, "b": list(leaf.blame), "h": n.headroom, "a": n.max_abs,
                         "x": n.max_rel, "anchor": anchors.get(id(leaf), ""),
                         "f": f.verdict if f is not None else "", "e": dict(f.errors) if f is not None else {},
                         "q": worst[1] if worst else None, "m": f.limit if f is not None else None,
                         "w": list(f.imprecise) if f is not None else [], "F": leaf.failing,
                         "n": bool(getattr(leaf, "inherited", False))})
            if leaf.role == "hvp":  # second order has a table of its own
                hvp_rows.append(rows.pop())
        cases.append({"name": case.name, "rows": rows})
        if hvp_rows:
            second.append({"name": f"{case.name} (second order)", "rows": hvp_rows})
    return {"verdicts": list(VERDICTS), "f32verdicts": list(FLOAT32_VERDICTS),
            "symbols": SYMBOL, "cases": cases + second}


# ---------------------------------------------------------------- header
def _stat(value, label: str, bad: bool = False, warn: bool = False) -> str:
    cls = " bad" if bad else " warn" if warn else ""
    return f"<div class='stat{cls}'><b>{e(str(value))}</b><span>{e(label)}</span></div>"


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
            head, frames = error_parts(text)
            where = f" <span class='muted small'>at {e(frames[-1][:160])}</span>" if frames else ""
            rows.append(f"<tr><td>{e(case.name)}</td><td><a href='#case-{c}'>{e(backend)} error</a>: "
                        f"<span class='small'>{e(head[:200])}</span>{where}</td><td>{badge('error')}</td>"
                        f"<td class='blame'>{e(backend)}</td><td class='n'>—</td><td class='n'>—</td></tr>")
        for leaf in failing_leaves(case):
            n = LeafNumbers.of(leaf)
            link = f"<a href='#{anchors[id(leaf)]}'>{e(leaf.path)}</a>"
            who = ", ".join(leaf.float32.imprecise) if leaf.verdict == "imprecise" and leaf.float32 else blame_text(leaf)
            rows.append(f"<tr><td>{e(case.name)}</td><td class='path'>{link}</td><td>{badge(leaf.verdict)}</td>"
                        f"<td class='blame'>{e(who or '—')}</td><td class='n'>{e(fmt(n.max_rel))}</td>"
                        f"<td class='n'>{e(fmt(n.headroom))}</td></tr>")
        if case.failed and not case.errors and not failing_leaves(case):
            rows.append(f"<tr><td>{e(case.name)}</td><td><a href='#case-{c}'>the case</a> "
                        f"<span class='small'>{e(case_failure(case))}</span></td><td>{badge(case.verdict)}</td>"
                        "<td class='blame'>—</td><td class='n'>—</td><td class='n'>—</td></tr>")
    if not rows:
        return ""
    more = len(rows) - TOP_FAILURES
    note = f"<p class='muted small'>… and {more} more in the cases below.</p>" if more > 0 else ""
    return ("<h3>Failing leaves and errors</h3><div class='tw'><table class='top'><thead><tr><th>case</th><th>leaf</th>"
            "<th>verdict</th><th>blamed</th><th>max rel diff</th><th>headroom</th></tr></thead><tbody>"
            + "".join(rows[:TOP_FAILURES]) + f"</tbody></table></div>{note}")


def _notices(run: RunResult) -> str:
    """Warnings and notices, after the failures: float32 warnings per case, unavailable backends once each."""
    items = []
    for c, case in enumerate(run.cases):
        flagged = imprecise_leaves(case)
        if flagged and not imprecise_fails(case):
            items.append(f"<li>{f32badge('imprecise')} <a href='#case-{c}'>{e(case.name)}</a>: "
                         f"{e(imprecise_sentence(flagged[0]))}"
                         + (f" <span class='muted'>(and {len(flagged) - 1} more leaves)</span>" if len(flagged) > 1
                            else "") + "</li>")
    for backend, why, n in unavailable_notices(run):
        items.append(f"<li>{badge('skipped')} <b>{e(backend)}</b> unavailable: {e(why)}"
                     + (f" <span class='muted'>({n} cases)</span>" if n > 1 else "") + "</li>")
    return f"<h3>Notices</h3><ul class='plain notices'>{''.join(items)}</ul>" if items else ""


def _interrupted(run: RunResult) -> str:
    if not incomplete(run):
        return ""
    missing = f" {run.planned - len(run.cases)} never ran." if run.planned is not None else ""
    return (f"<div class='callout v-interrupted' role='alert'><b>{e(run_sentence(run).split(';')[0])}</b>."
            f"{e(missing)} This is not a pass: what is below covers only the cases that finished.</div>")


def _header(run: RunResult, anchors: dict[int, str]) -> str:
    n = RunCounts.of(run)
    status = run_status(run)
    seed = run.env.get("seed")
    if seed is None:
        seeds = sorted({c.seed for c in run.cases})
        seed = ", ".join(str(s) for s in seeds) if seeds else "—"
    cases = f"{n.cases} of {run.planned}" if incomplete(run) and run.planned is not None else n.cases
    stats = [_stat(cases, "cases ran" if incomplete(run) else "cases", bad=incomplete(run)),
             _stat(n.failed_cases, "failing cases", n.failed_cases > 0),
             _stat(n.compared, "leaves compared"), _stat(n.agreeing, "leaves agree"),
             _stat(n.failing_leaves, "leaves failing", n.failing_leaves > 0)]
    partial = sum(1 for c in run.cases if c.partial)
    if partial:
        stats.append(_stat(partial, "partial cases (fewer backends than asked)", warn=True))
    if n.vacuous:
        stats.append(_stat(n.vacuous, "vacuous leaves (not failures)", warn=True))
    if any(c.float32 for c in run.cases):
        stats.append(_stat(n.imprecise, "float32 imprecise", warn=n.imprecise > 0))
    if n.kinks_crossed:
        stats.append(_stat(n.kinks_crossed, "kinks crossed (pinned)"))
    stats += [_stat(seed, "seed"), _stat(", ".join(backends_of(run)) or "—", "backends")]
    command = run.env.get("command") or ""
    cmd = (f"<div class='cmd'><span class='label'>Reproduce</span><pre id='cmd-run'>{e(str(command))}</pre>"
           "<button type='button' data-copy='cmd-run'>Copy</button></div>") if command else ""
    sym = {"interrupted": "⏹", "empty": "!"}.get(status, SYMBOL.get(status, "?"))
    big = f"<span class='badge big {vclass(status)}'>{sym} {e(status.upper())}</span>"
    return (f"<header class='top {vclass(status)}'><div class='hrow'>{big}<div><h1>{e(HEADLINE.get(status, status))}</h1>"
            f"<p class='sentence'>{e(run_sentence(run))}</p></div></div>{_interrupted(run)}"
            f"<div class='stats'>{''.join(stats)}</div>{cmd}{_env(run.env)}{_top_failures(run, anchors)}"
            f"{_notices(run)}</header>")


# ---------------------------------------------------------------- cases
def _overview(run: RunResult) -> str:
    backends = backends_of(run)
    head = ("<tr><th>case</th><th>float64</th><th>agree / compared</th><th>worst headroom</th><th>float32</th>"
            "<th>disagreement starts at</th>"
            + "".join(f"<th>{e(b)} <span class='sub'>1st / 2nd · f64</span></th>" for b in backends) + "</tr>")
    rows = []
    for c, case in enumerate(run.cases):
        times = []
        for b in backends:
            t = case.timings.get(b)
            if b in case.unavailable:
                times.append("<td class='muted'>n/a</td>")
            elif t is None or all(s is None for s in timing_parts(t)):
                times.append(f"<td class='muted'>{'error' if b in case.errors else '—'}</td>")
            else:
                first, second, f64 = timing_parts(t)
                times.append(f"<td class='n'>{e(fmt_seconds(first))} / {e(fmt_seconds(second))} · "
                             f"{e(fmt_seconds(f64))}</td>")
        start = e(case.first_disagreement) if case.first_disagreement else "<span class='muted'>—</span>"
        f32 = (f"{f32badge(case.float32)} <span class='small'>{e(float32_worst_text(case))}</span>"
               if case.float32 else "<span class='muted'>—</span>")
        rows.append(f"<tr{' class=bad' if case.failed else ''}><td><a href='#case-{c}'>{e(case.name)}</a></td>"
                    f"<td>{badge(case.verdict)}{_coverage(case)}</td><td class='n'>{agreeing(case)} / {compared(case)}</td>"
                    f"<td class='n'>{e(fmt(case_headroom(case)))}</td><td class='nw'>{f32}</td>"
                    f"<td class='path'>{start}</td>{''.join(times)}</tr>")
    return (f"<section class='panel'><h3 style='margin-top:0'>Cases</h3><div class='tw'><table>"
            f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div></section>")


def _leaf_table(c: int, case: CaseResult, leaves: list | None = None) -> str:
    leaves = _first_order(case) if leaves is None else leaves
    count = {v: sum(1 for x in leaves if x.verdict == v) for v in {x.verdict for x in leaves}}
    present = [v for v in VERDICTS if count.get(v)] + sorted(set(count) - set(VERDICTS))
    vopts = "".join(f"<option value='{e(v)}'>{e(v)} ({count[v]})</option>" for v in present)
    names = list(dict.fromkeys([*case.backends, *(b for leaf in leaves for b in leaf.blame)]))
    bopts = "".join(f"<option value='{e(b)}'>{e(b)}</option>" for b in names)
    f32 = [leaf.float32.verdict for leaf in leaves if leaf.float32 is not None]
    f32opts = "".join(f"<option value='{e(v)}'>{e(v)} ({f32.count(v)})</option>"
                      for v in [*FLOAT32_VERDICTS, *sorted(set(f32) - set(FLOAT32_VERDICTS))] if v in f32)
    f32b = _f32_backends(case)
    cols = [("i", "#"), ("p", "leaf"), ("l", "layer"), ("s", "shape"), ("v", "float64"), ("b", "blamed"),
            ("h", "headroom"), ("a", "max abs diff"), ("x", "max rel diff")]
    if f32:
        cols += [("f", "float32")] + [(f"e:{b}", f"{b} f32 err") for b in f32b] + [("q", "× best"), ("m", "limit")]
    sortable = {"i", "p", "l", "v", "b", "h", "a", "x", "f", "q", "m"} | {f"e:{b}" for b in f32b}
    th = "".join(f"<th data-k='{e(k)}' aria-sort='none'><button type='button'>{e(label)}</button></th>" if k in sortable
                 else f"<th data-k='{e(k)}'>{e(label)}</th>" for k, label in cols)
    f32filter = (f"<label>float32 <select data-f='float32'><option value=''>all</option>{f32opts}</select></label>"
                 if f32 else "")
    return (f"<div class='leaftable' data-case='{c}'><div class='controls'>"
            f"<label>Verdict <select data-f='verdict'><option value=''>all</option>{vopts}</select></label>"
            f"<label>Blamed <select data-f='blame'><option value=''>any</option>{bopts}</select></label>"
            f"{f32filter}"
            "<label>Filter <input type='search' data-f='text' placeholder='leaf path or layer'></label>"
            "<label><input type='checkbox' data-f='failing'> only failing</label>"
            "<span class='shown' aria-live='polite'></span></div>"
            f"<div class='tw scroll'><table class='leaves'><thead><tr>{th}</tr></thead><tbody></tbody></table></div>"
            "<noscript><p class='muted'>The sortable table needs JavaScript; the tree above and the cards "
            "below show every leaf.</p></noscript></div>")


def _problems(case: CaseResult) -> str:
    parts = []
    if case.errors:
        blocks = []
        for b, t in case.errors.items():
            head, frames = error_parts(t)
            where = (f"<p class='muted small'>raised at {e(frames[-1])}</p>") if frames else ""
            blocks.append(f"<h4>{e(b)}</h4><p class='errhead'>{e(head)}</p>{where}"
                          f"<details class='tb'><summary>full text</summary><pre class='err'>{e(str(t))}</pre></details>")
        parts.append("<h3>Errors</h3>" + "".join(blocks))
    if case.unavailable:
        parts.append("<h3>Unavailable backends</h3><ul class='plain'>" + "".join(
            f"<li><b>{e(b)}</b>: {e(why)}</li>" for b, why in case.unavailable.items()) + "</ul>")
    if case.notes:
        parts.append("<h3>Notes</h3><ul class='plain'>" + "".join(f"<li>{e(n)}</li>" for n in case.notes) + "</ul>")
    return "".join(parts)


def _precision(case: CaseResult, anchors: dict[int, str]) -> str:
    """The float32 part of a case: the chart, the imprecise leaves, the kinks."""
    if not case.float32 and not case.kinks and not f32_leaves(case):
        return ""
    body = [f"<h3>float32 precision <span class='sub'>each backend's float32 gradients against its own float64 ones, "
            "‖g32 − g64‖ ÷ ‖g64‖; "
            f"policy: imprecise {'fails' if imprecise_fails(case) else 'warns'}</span></h3>"]
    chart = float32_svg(case)
    body.append(f"<div class='chart'>{chart}</div>" if chart else "<p class='muted'>No float32 gradient was measured.</p>")
    flagged = [leaf for leaf in case.leaves if leaf.verdict == "imprecise"] + imprecise_leaves(case)
    if flagged:
        word = "failures" if imprecise_fails(case) else "warnings: float64 agrees, the case passes"
        items = "".join(
            f"<li><a href='#{anchors[id(leaf)]}'>{e(leaf.path)}</a>: {e(imprecise_sentence(leaf))}</li>"
            if id(leaf) in anchors else f"<li>{e(imprecise_sentence(leaf))}</li>" for leaf in flagged)
        body.append(f"<h4>Imprecise leaves ({len(flagged)}) <span class='sub'>{e(word)}</span></h4>"
                    f"<ul class='plain'>{items}</ul>")
    if case.kinks:
        items = "".join(f"<li class='{'crossed' if any(k.crossed.values()) else ''}' title='{e(kink_counts(k))}'>"
                        f"{e(kink_sentence(k))}</li>" for k in case.kinks)
        body.append(f"<h4>Kinks ({len(case.kinks)}) <span class='sub'>{e(pinning_sentence(case))}</span></h4>"
                    f"<ul class='plain kinks'>{items}</ul>")
    return f"<section class='precision'>{''.join(body)}</section>"


def _second_order(slot: int | None, case: CaseResult) -> str:
    """The second-order leaves' own section: what was checked, who could not, and their table."""
    so = getattr(case, "second_order", None)
    if so is None:
        return ""
    hv = [leaf for leaf in case.leaves if leaf.role == "hvp"]
    body = ["<h3>Second order <span class='sub'>Hessian-vector products H·v per leaf, for one random direction v "
            "(rows hvp:&lt;leaf&gt;); float64 decides, float32 is measured</span></h3>",
            f"<p>{e(second_order_sentence(case))}.</p>"]
    if so.referee:
        body.append(f"<p class='muted small'>Referee: {e(so.referee)} ({so.referee_passes} gradient calls).</p>")
    if so.unavailable:
        body.append("<ul class='plain'>" + "".join(
            f"<li>{badge('skipped')} {e(why)}: its second order is not compared</li>" for why in so.unavailable.values())
            + "</ul>")
    if hv and slot is not None:
        body.append(_leaf_table(slot, case, hv))
    return f"<section class='second-order'>{''.join(body)}</section>"


def _trajectory(case: CaseResult) -> str:
    """The training trajectories: the sentence, the loss plot, the loss per step, the leaves that parted."""
    traj = getattr(case, "trajectory", None)
    if traj is None:
        return ""
    cls = vclass(traj.verdict if traj.verdict in ("agree", "disagree", "error") else "error")
    body = ["<h3>Training trajectory <span class='sub'>each backend trains its own copy from the same start on "
            "the same batches; the optimiser runs in float64, the same code for every backend</span></h3>",
            f"<div class='callout {cls}'>{badge(traj.verdict)} {e(trajectory_head(traj))}</div>"]
    chart = loss_svg(traj)
    steps = trajectory_steps(traj, limit=40)
    names = list(traj.losses)
    head = "".join(f"<th>{e(b)}</th>" for b in names)
    rows = []
    for k in steps:
        cells = "".join(f"<td class='n'>{e(_loss_cell(traj.losses[b], k))}</td>" for b in names)
        mark = " class=bad" if traj.parted is not None and k >= traj.parted else ""
        hr = fmt(traj.headroom[k - 1]) if 0 < k <= len(traj.headroom) else "—"
        rows.append(f"<tr{mark}><td class='n'>{k}</td>{cells}<td class='n'>{e(hr)}</td></tr>")
    table = (f"<div class='tw'><table class='losses'><thead><tr><th>step</th>{head}<th>headroom</th></tr></thead>"
             f"<tbody>{''.join(rows)}</tbody></table></div>")
    body.append(f"<div class='two'><div class='chart'>{chart}</div><div>{table}"
                f"<p class='muted small'>{e(loss_sentence(traj, len(traj.headroom)))}</p></div></div>")
    off = [leaf for leaf in traj.leaves if leaf.verdict != "agree"]
    agree = len(traj.leaves) - len(off)
    body.append(f"<p>After {traj.steps} step{'s' if traj.steps != 1 else ''}: {agree} of {len(traj.leaves)} "
                "parameters and buffers agree in float64.</p>")
    if off:
        body.append("<ul class='plain'>" + "".join(
            f"<li>{badge(leaf.verdict)} <span class='path'>{e(leaf.path)}</span> "
            f"<span class='blame'>{e(', '.join(leaf.blame) or '—')}</span> "
            f"<span class='small'>{e(leaf.message)}</span></li>" for leaf in off[:20]) + "</ul>")
    for b, text in traj.errors.items():
        body.append(f"<p>{badge('error')} <b>{e(b)}</b>: {e(text.splitlines()[0] if text else '')}</p>")
    return f"<section class='trajectory'>{''.join(body)}</section>"


def _loss_cell(losses: list, k: int) -> str:
    return f"{losses[k]:.10g}" if k < len(losses) else "—"


def _vacuous(case: CaseResult) -> str:
    vac = vacuous_leaves(case)
    if not vac or case.verdict == "vacuous":
        return ""
    items = "".join(f"<li><span class='path'>{e(leaf.path)}</span>"
                    + (f" <span class='muted small'>{e(leaf.message)}</span>" if leaf.message else "") + "</li>"
                    for leaf in vac)
    return (f"<div class='callout v-vacuous'>{e(vacuous_head(case))}."
            f"<ul class='plain'>{items}</ul></div>")


def _coverage(case: CaseResult) -> str:
    """`` torch only`` beside a partial case's badge; "" for the full check."""
    label = coverage_label(case)
    return f" <span class='badge v-partial coverage'>{e(label)}</span>" if label else ""


def _case(c: int, case: CaseResult, anchors: dict[int, str], alone: bool = False, hvp_slot: int | None = None) -> str:
    failing = failing_leaves(case)
    warned = imprecise_leaves(case)
    meta = " · ".join(x for x in (
        case.model and f"model {case.model}", f"{case.dtype}", f"{case.mode}", f"seed {case.seed}",
        case.params and f"{case.params:,} parameters", case.referee_passes and f"{case.referee_passes} referee passes",
    ) if x)
    f32 = f" · float32 {f32badge(case.float32)}" if case.float32 else ""
    summary = (f"<summary>{badge(case.verdict)}{_coverage(case)}<h2>{e(case.name)}</h2><span class='meta'>{e(meta)}</span>"
               f"<span class='meta' style='margin-left:auto'>{agreeing(case)} of {compared(case)} leaves agree"
               f" · headroom {e(fmt(case_headroom(case)))}{f32}</span></summary>")
    body = []
    if case.partial:  # first: everything below was checked on fewer backends than asked
        policy = "fails the case" if case.unavailable_policy == "fail" else "is a warning (unavailable = \"fail\" fails it)"
        body.append(f"<div class='callout v-partial' role='note'><b>Partial check:</b> {e(partial_sentence(case))}; "
                    f"not the cross-check asked for, which {e(policy)}. Why each is unavailable is below.</div>")
    if case.first_disagreement:
        leaf = next((x for x in case.leaves if x.path == case.first_disagreement), None)
        target = anchors.get(id(leaf)) if leaf is not None else None
        name = e(case.first_disagreement)
        name = f"<a href='#{target}'>{name}</a>" if target else name
        layer = f" ({e(leaf.layer)})" if leaf is not None and leaf.layer else ""
        blamed = f" — blamed: <b>{e(blame_text(leaf))}</b>" if leaf is not None and leaf.blame else ""
        origin = origin_sentence(case)
        origin = f"<br><b>Replayed layer by layer:</b> {e(origin)}." if origin else ""
        body.append(f"<div class='callout {vclass(leaf.verdict if leaf is not None else case.verdict)}'>"
                    f"Disagreement starts at <span class='path'>{name}</span>{layer}{blamed}.{origin}"
                    "<br><span class='muted small'>The last failing parameter in forward order is the first "
                    "the backward pass reaches; the layers before it may only inherit its error.</span></div>")
    elif case.failed and not case.leaves:
        body.append("<div class='callout v-error'>No leaf was compared for this case.</div>")
    elif case.failed and not failing and not case.errors:
        body.append(f"<div class='callout {vclass(case.verdict)}'>{e(case_failure(case))}</div>")
    body.append(_problems(case))
    body.append(_vacuous(case))
    if case.replay:
        body.append(f"<div class='cmd'><span class='label'>Re-run this case</span><pre id='replay-{c}'>"
                    f"{e(case.replay)}</pre><button type='button' data-copy='replay-{c}'>Copy</button></div>")
    if case.leaves:
        timing = timings_svg(case)
        tree = tree_html(_first_order(case), anchors, case.origin.path if case.origin else "")
        body.append(f"<div class='two'><div><h3>Model tree</h3>{tree}</div>"
                    f"<div><h3>Time per backend</h3>{timing or '<p class=muted>not timed</p>'}</div></div>")
        body.append(_precision(case, anchors))
        body.append(f"<h3>Leaves</h3>{_leaf_table(c, case)}")
    elif case.timings:
        body.append(f"<h3>Time per backend</h3>{timings_svg(case)}")
    body.append(_second_order(hvp_slot, case))
    body.append(_trajectory(case))
    if failing:
        body.append(f"<h3>Failing leaves ({len(failing)})</h3>")
        body += [leaf_card(leaf, anchors[id(leaf)], opened=k < OPEN_CARDS or leaf.path == case.first_disagreement,
                           is_start=leaf.path == case.first_disagreement) for k, leaf in enumerate(failing)]
    if warned:
        title = "float32 failures" if imprecise_fails(case) else "float32 warnings"
        body.append(f"<h3>{title} ({len(warned)})</h3>")
        body += [leaf_card(leaf, anchors[id(leaf)], opened=k < OPEN_CARDS and not failing, is_start=False)
                 for k, leaf in enumerate(warned)]
    # A report of one case (``gradcheck run resnet18``) opens it: its tree and precision chart are the report.
    opened = " open" if alone or case.failed or len(case.leaves) == 0 or warned else ""
    return (f"<details class='case {vclass(case.verdict)}' id='case-{c}'{opened}>{summary}"
            f"<div class='cbody'>{''.join(body)}</div></details>")


# ---------------------------------------------------------------- page
def render_html(run: RunResult) -> str:
    anchors = _anchors(run)
    status = run_status(run)
    title = f"gradcheck: {status} — {run_sentence(run)}"
    slots = _hvp_slots(run)
    cases = "".join(_case(c, case, anchors, alone=len(run.cases) == 1, hvp_slot=slots.get(c))
                    for c, case in enumerate(run.cases))
    if not run.cases:
        cases = f"<section class='panel'><p>{e(run_sentence(run)).capitalize()}.</p></section>"
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
