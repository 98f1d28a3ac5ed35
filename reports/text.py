"""Every sentence a person reads about a result, in one place.

The terminal summary, the GitHub annotations, the JUnit messages, the
Markdown summary and ``assert_gradients_agree``'s message all say the same
things about the same leaf, so they are all made here: the run sentence, a
failing leaf's line, an error's headline (type and message first, frames
after), the float32 "imprecise" sentence, the kink sentence, the notices.

And one sanitiser, :func:`clean_line`, for every line that reaches a
terminal or a CI log: case names and layer paths come from user code, and a
newline, an escape sequence or a leading ``::`` in one must not start a line
of its own, recolour the log or become a GitHub workflow command.
"""

from __future__ import annotations

import math
import re

from gradcheck.results import CaseResult, KinkReport, LeafResult, RunResult

from ._common import (
    LeafNumbers,
    RunCounts,
    blame_text,
    case_f32_worst,
    compared,
    f32_flagged,
    f32_ratio,
    finite,
    fmt,
    fmt_index,
    imprecise_fails,
    imprecise_leaves,
    incomplete,
    reason,
    vacuous_leaves,
    worst_pair,
)

# Leaves listed by name on the summary line before "and N more".
SUMMARY_LEAVES = 5

# Headline per run status (``_common.run_status``).
HEADLINE = {
    "agree": "All gradients agree",
    "disagree": "Gradients disagree",
    "structural": "Gradients differ in structure",
    "nonfinite": "Gradients are not finite",
    "error": "The run hit errors",
    "imprecise": "float32 gradients are imprecise",
    "partial": "Some cases were checked on fewer backends than asked",
    "vacuous": "Some checks were vacuous",
    "skipped": "Everything was skipped",
    "interrupted": "The run was interrupted",
    "empty": "Nothing was checked",
}

# ---------------------------------------------------------------- the sanitiser
# C0 and C1 controls (ESC, NUL, BEL, CSI ...) except \t; Unicode line and paragraph separators, which
# some log viewers break lines at; bidi overrides, which can make a log line read as something else.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NEWLINES = re.compile(r"\r\n|[\r\n\x85]")
# GitHub's runner (and Azure's) read a line as a command when, after leading spaces, it starts so.
_COMMAND_START = re.compile(r"^(\s*)(::|##\[)")


def clean_line(text) -> str:
    """One printable, inert line: newlines become spaces, control characters visible ``\\xNN``,
    and a line start that a CI runner would read as a workflow command (``::error``, ``##[``) is
    defused with a backslash.  Idempotent; used for every line that reaches a terminal or a CI log.
    """
    text = _NEWLINES.sub(" ", str(text)).replace("\t", " ")
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)
    return _COMMAND_START.sub(lambda m: m.group(1) + "\\" + m.group(2), text)


def clean_lines(text) -> list[str]:
    """A block of text (an error's traceback) as clean lines, one each."""
    return [clean_line(ln) for ln in _NEWLINES.split(str(text))]


def _short_exp(text: str) -> str:
    # 3.2e-06 -> 3.2e-6: the form a sentence reads in.
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", text)


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _and(items) -> str:
    items = list(items)
    if not items:
        return "none"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ---------------------------------------------------------------- errors
_TB_HEAD = "Traceback (most recent call last)"
_TB_FILE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<name>.+))?$')


def _frame(line: str) -> str:
    m = _TB_FILE.match(line)
    if not m:
        return line.strip()
    file = m.group("file").split("site-packages/")[-1]
    return f"{file}:{m.group('line')}" + (f" in {m.group('name')}" if m.group("name") else "")


def error_parts(text) -> tuple[str, list[str]]:
    """An error's text as (headline, frames): ``TypeError: message`` first, where it was raised after.

    Understands the runner's own form (``Type: message`` then indented
    ``file:line in function`` frames) and Python's traceback (frames first,
    the exception last; for a chain, the last exception raised).
    """
    lines = [ln.rstrip() for ln in str(text).splitlines() if ln.strip()]
    if not lines:
        return "error (no message)", []
    starts = [i for i, ln in enumerate(lines) if ln.lstrip().startswith(_TB_HEAD)]
    if starts:
        frames, i = [], starts[-1] + 1
        while i < len(lines) and lines[i][:1] in (" ", "\t"):
            if _TB_FILE.match(lines[i]):
                frames.append(_frame(lines[i]))
            i += 1
        if i < len(lines):
            head = lines[i].strip()
            before = " ".join(ln.strip() for ln in lines[: starts[0]])
            if before and not before.startswith("During handling"):
                head = f"{head} ({before})"
            return head, frames
    return lines[0].strip(), [_frame(ln) for ln in lines[1:]]


def error_headline(text) -> str:
    return clean_line(error_parts(text)[0])


def error_line(text, limit: int = 300) -> str:
    """One line: the exception, then the innermost frame (``— at file:line in function``)."""
    head, frames = error_parts(text)
    if len(head) > limit:
        head = head[: limit - 1] + "…"
    return clean_line(head + (f" — at {frames[-1]}" if frames else ""))


# ---------------------------------------------------------------- a leaf
def leaf_numbers(leaf: LeafResult) -> str:
    """``max rel diff 0.93, max abs diff 0.0241 at [3, 1, 2, 2] (tape vs jax), headroom 2400``, or "".

    Every number is the worst pair's (the largest headroom), so the index and
    the pair named are where that pair's largest difference is.
    """
    pair = worst_pair(leaf)
    if pair is None or pair.headroom is None:
        return ""
    return (f"max rel diff {fmt(pair.max_rel)}, max abs diff {fmt(pair.max_abs)} at {fmt_index(pair.max_abs_index)}"
            f" ({pair.backend} vs {pair.reference}), headroom {fmt(pair.headroom)}")


def leaf_detail(leaf: LeafResult) -> str:
    """What is wrong with a failing leaf, after its path and verdict: numbers, blame, the reason."""
    if leaf.verdict == "imprecise":
        parts = [imprecise_sentence(leaf) or "float32 is imprecise"]
        n = LeafNumbers.of(leaf)
        if n.headroom is not None:
            parts.append(f"float64 agrees (headroom {fmt(n.headroom)})")
        return clean_line("; ".join(parts))
    parts = [p for p in (leaf_numbers(leaf),) if p]
    why = reason(leaf)
    parts.append(f"blamed: {blame_text(leaf)}" + (f" ({why})" if why else ""))
    if getattr(leaf, "inherited", False):
        parts.append("inherited: a layer after it in forward order is wrong")
    return clean_line("; ".join(parts))


def leaf_sentence(leaf: LeafResult) -> str:
    """``features.3.weight: disagree; max rel diff …; blamed: jax (tape and torch agree)``: one line."""
    return clean_line(f"{leaf.path}: {leaf.verdict}; {leaf_detail(leaf)}")


# ---------------------------------------------------------------- float32
def _ratio_text(r) -> str:
    return "∞" if r is not None and math.isinf(r) else fmt(r, 2)


def imprecise_sentence(leaf: LeafResult) -> str:
    """``jax float32 is 800× further from float64 than torch on layer1.0.conv1.weight (0.0041 vs 5.1e-06; limit 1.51e-04)``."""
    f = leaf.float32
    if f is None or not f32_flagged(leaf):
        return ""
    out = []
    for b in f.imprecise or [x for x in f.errors if x != f.best]:
        err, best = f.errors.get(b), f.errors.get(f.best)
        ratio = f32_ratio(f, b)
        if err is None or not finite(err):
            what = "not finite" if err is not None or f.verdict == "nonfinite" else f.verdict
            out.append(f"{b} float32 gradient of {leaf.path} is {what}" + (f": {f.message}" if f.message else ""))
        elif ratio is None or not f.best or f.best == b:
            out.append(f"{b} float32 is {fmt(err)} from float64 on {leaf.path} (limit {fmt(f.limit)})")
        elif best == 0:
            out.append(f"{b} float32 is {fmt(err)} from float64 on {leaf.path}, where {f.best}'s float32 is exact")
        else:
            out.append(f"{b} float32 is {_ratio_text(ratio)}× further from float64 than {f.best} on {leaf.path} "
                       f"({fmt(err)} vs {fmt(best)}; limit {fmt(f.limit)})")
    if not out and f.message:
        out.append(f"{f.message} on {leaf.path}")
    return clean_line("; ".join(out))


def float32_worst_text(case: CaseResult) -> str:
    """``jax 3.1×``: the backend furthest from the best one in float32, anywhere in the case; "" if none."""
    worst = case_f32_worst(case)
    return f"{worst[0]} {_ratio_text(worst[1])}×" if worst else ""


def float32_cell(case: CaseResult) -> str:
    """The case's float32 status in a few characters: ``ok, jax 3.1×``, ``imprecise: jax 800×``, ``—``."""
    if not case.float32:
        return "—"
    worst = float32_worst_text(case)
    if not worst:
        return case.float32
    return f"{case.float32}{', ' if case.float32 == 'ok' else ': '}{worst}"


def _count_phrase(n: int, what: str) -> str:
    return f"{n} {what} input" if n == 1 else f"{n} {what} inputs"


def kink_sentence(kink: KinkReport) -> str:
    """``1 relu input in layer3.1 is 3.2e-6 from its kink; jax's float32 forward crossed it (pinned to the float64 branch)``."""
    where = f" in {kink.layer}" if kink.layer else ""
    near = kink.near if kink.near else kink.below_float64
    dist = _short_exp(fmt(kink.min_distance, 2))
    if near == 1:
        head = f"1 {kink.op} input{where} is {dist} from its kink"
    else:
        head = f"{_count_phrase(near, kink.op)}{where} are within float32's reach of their kink (closest {dist})"
    crossed = {b: n for b, n in kink.crossed.items() if n}
    if crossed:
        it = "it" if near == 1 else None
        who = [f"{b}'s" for b in crossed]
        names = who[0] if len(who) == 1 else ", ".join(who[:-1]) + " and " + who[-1]
        forwards = "forward" if len(who) == 1 else "forwards"
        if it and all(n == 1 for n in crossed.values()):
            tail = f"{names} float32 {forwards} crossed it"
        else:
            tail = "; ".join(f"{b}'s float32 forward crossed {n}" for b, n in crossed.items())
        head += f"; {tail} (pinned to the float64 branch)"
    else:
        head += "; no float32 forward crossed " + ("it" if near == 1 else "them")
    if kink.below_float64:
        head += f"; {kink.below_float64} closer than float64 resolves"
    return clean_line(head)


def pinning_sentence(case: CaseResult) -> str:
    """What the float32 runs did at a case's kinks: all pinned to the float64 branch, or all but some."""
    if not case.unpinned:
        return "every float32 run took the float64 branch at these; a crossing does not count against float32"
    names = ", ".join(f"{b}'s" for b in case.unpinned)
    return clean_line(f"every float32 run but {names} took the float64 branch at these; {names} could not be "
                      "pinned (see the notes), so its float32 error may include crossings")


def kink_counts(kink: KinkReport) -> str:
    """The numbers behind a kink, for a tooltip: elements, near, closest, below float64, crossings."""
    crossed = ", ".join(f"{b} {n}" for b, n in kink.crossed.items()) or "none"
    return (f"{kink.op} call {kink.call}" + (f" in {kink.layer}" if kink.layer else "") + f": {kink.elements} elements, "
            f"{kink.near} within float32's reach, closest {_short_exp(fmt(kink.min_distance, 2))}, "
            f"{kink.below_float64} below float64's resolution; crossed in float32: {crossed}")


def origin_sentence(case: CaseResult) -> str:
    """Where the disagreement starts, from the per-layer replay (``CaseResult.origin``); "" without one."""
    o = getattr(case, "origin", None)
    if o is None:
        return ""
    layer = f" ({o.layer})" if o.layer else ""
    if o.kind == "forward":
        line = (f"the disagreement starts in the forward pass at {o.path}{layer}: no layer's own backward "
                "disagrees when replayed alone")
    else:
        line = (f"the disagreement starts in {o.path}{layer}: its own backward disagrees when replayed alone "
                "on the same inputs and cotangent")
    if o.op:
        line += f"; op {o.op}"
    if o.blame:
        line += f"; blamed: {', '.join(o.blame)}"
    if o.message:
        line += f" ({o.message})"
    return clean_line(line)


# ---------------------------------------------------------------- a partial check
def _checked_on(ran: list[str]) -> str:
    """What a partial case was held against: one backend has only the referee (a case whose one backend ran
    with the referee off compares nothing and is an error, never a partial pass)."""
    if not ran:
        return "no backend"
    return f"{ran[0]} and the referee" if len(ran) == 1 else _and(ran)


def coverage_label(case: CaseResult) -> str:
    """``torch only`` on a partial case's row (a backend asked for was unavailable); "" for the full check."""
    if not case.partial:
        return ""
    return clean_line(f"{_and(case.checked_on) if case.checked_on else 'no backend'} only")


def partial_sentence(case: CaseResult) -> str:
    """``checked on torch and the referee alone: tape, jax unavailable``; "" for the full check."""
    if not case.partial:
        return ""
    return clean_line(f"checked on {_checked_on(case.checked_on)} alone: {', '.join(case.unavailable)} unavailable")


def partial_runs(run: RunResult) -> list[str]:
    """``7 of 24 cases checked on torch and the referee alone: tape, jax unavailable``, one per kind of gap."""
    groups: dict[tuple, int] = {}
    for case in run.cases:
        if case.partial:
            key = (tuple(case.checked_on), tuple(case.unavailable))
            groups[key] = groups.get(key, 0) + 1
    total = _plural(len(run.cases), "case")
    return [clean_line(f"{n} of {total} checked on {_checked_on(list(ran))} alone: {', '.join(missing)} unavailable")
            for (ran, missing), n in groups.items()]


def partial_warning(case: CaseResult) -> str:
    """The warning of a check that passed partially: what it ran on, why each other backend did not, the fix."""
    why = "; ".join(f"{b}: {text}" for b, text in case.unavailable.items())
    return clean_line(f"{case.name}: {partial_sentence(case)}, not the cross-check asked for ({why}); "
                      "unavailable=\"fail\" makes this a failure")


# ---------------------------------------------------------------- notices
def vacuous_head(case: CaseResult) -> str:
    """``2 leaves are vacuous (≈0 on every backend; not failures, not in the headroom)``; "" when none is."""
    vac = vacuous_leaves(case)
    if not vac:
        return ""
    if case.verdict == "vacuous":
        return (f"every gradient leaf is vacuous ({len(vac)} ≈0 on every backend): the check cannot fail, "
                "so the case does")
    verb = "is" if len(vac) == 1 else "are"
    return f"{_plural(len(vac), 'leaf', 'leaves')} {verb} vacuous (≈0 on every backend; not failures, not in the headroom)"


def vacuous_sentence(case: CaseResult, names: int = SUMMARY_LEAVES) -> str:
    """:func:`vacuous_head` and the leaves' paths (the first ``names``); "" when none is vacuous."""
    vac = vacuous_leaves(case)
    if not vac:
        return ""
    listed = ", ".join(leaf.path for leaf in vac[:names]) + (f", and {len(vac) - names} more" if len(vac) > names else "")
    return clean_line(f"{vacuous_head(case)}: {listed}")


def unavailable_notices(run: RunResult) -> list[tuple[str, str, int]]:
    """(backend, why, cases) once per backend, however many cases noted it."""
    seen: dict[str, list] = {}
    for case in run.cases:
        for b, why in case.unavailable.items():
            entry = seen.setdefault(b, [why, 0])
            entry[1] += 1
    return [(b, why, n) for b, (why, n) in seen.items()]


def unavailable_sentence(backend: str, why: str, cases: int) -> str:
    return clean_line(f"{backend} — {why}" + (f" ({_plural(cases, 'case')})" if cases > 1 else ""))


# ---------------------------------------------------------------- second order and trajectories
def _loss_text(x, digits: int) -> str:
    if x is None or not finite(x):
        return "failed" if x is None else fmt(x)
    whole = len(str(int(abs(x)))) if abs(x) >= 1 else 1
    if abs(x) >= 1e7 or (x != 0 and abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    if abs(x) < 1:
        return f"{x:#.{digits}g}"
    return f"{x:.{max(digits - whole, 1)}f}"


def loss_sentence(traj, step: int) -> str:
    """``loss after step 1: tape -19.78, torch -19.78, jax -4792.6`` (step 0: ``loss at the start: ...``).

    Four significant digits (and one decimal at least), more where two
    backends' losses differ beyond float64's tolerance but would print alike.
    """
    values = {b: (losses[step] if len(losses) > step else None) for b, losses in traj.losses.items()}
    present = [v for v in values.values() if v is not None and finite(v)]
    digits = 4
    if present and max(present) - min(present) > 1e-7 * max(abs(v) for v in present):
        while digits < 12 and len({_loss_text(v, digits) for v in present}) < 2:
            digits += 1
    head = "loss at the start" if step == 0 else f"loss after step {step}"
    return clean_line(f"{head}: " + ", ".join(f"{b} {_loss_text(v, digits)}" for b, v in values.items()))


def trajectory_message(traj, parting: list[LeafResult], diverged: int | None) -> str:
    """``Trajectory.message``, written once from the trajectory's numbers (``gradcheck.check.trajectory``).

    Where the trajectories part (``parting``: what disagrees after step
    ``traj.parted``), that they diverged alike (non-finite on every backend
    from step ``diverged``), which backend failed, or "" when they agree.
    """
    if traj.parted is not None:
        worst = max(parting, key=lambda leaf: leaf.headroom)
        pair = max(worst.pairs, key=lambda p: p.headroom, default=None)
        detail = pair.message if pair is not None and pair.message else worst.message or worst.verdict
        what = ", ".join(leaf.path for leaf in parting[:3]) + (f" and {len(parting) - 3} more" if len(parting) > 3
                                                                 else "")
        who = (f"{', '.join(traj.blame)} {'leaves' if len(traj.blame) == 1 else 'leave'} the others (by majority)"
               if traj.blame else "no majority says which backend is off")
        return (f"the trajectories part after step {traj.parted}: {who} on {what} — {detail}; "
                f"{loss_sentence(traj, traj.parted)}")
    if diverged:
        return (f"the training diverged alike on every backend: losses or parameters are not finite after "
                f"step {diverged} (a smaller --lr keeps them finite); what stayed finite agrees")
    if traj.verdict == "error":
        return "; ".join(f"{b} failed at {t.splitlines()[0]}" for b, t in traj.errors.items())
    return ""


def trajectory_head(traj) -> str:
    """``3 adam steps (lr 0.001): the trajectories agree`` or where they part."""
    what = f"{traj.steps} {traj.optimizer} step{'s' if traj.steps != 1 else ''} (lr {fmt(traj.lr)})"
    if traj.parted is not None:
        return clean_line(f"{what}: {traj.message}")
    if traj.verdict == "error" or traj.message:
        return clean_line(f"{what}: {traj.message or 'a backend failed'}")
    worst = max(traj.headroom, default=0.0)
    return clean_line(f"{what}: the trajectories agree at every step (parameters, buffers and losses; worst "
                      f"headroom {fmt(worst)})")


def trajectory_steps(traj, limit: int = 12) -> list[int]:
    """The steps whose losses a summary shows: the start, the first few, the parting step, the last."""
    n = max((len(v) for v in traj.losses.values()), default=0)
    steps = list(range(n))
    if n <= limit:
        return steps
    keep = set(steps[: limit - 3]) | {n - 1}
    if traj.parted is not None:
        keep |= {traj.parted - 1, traj.parted} & set(steps)
    return sorted(keep)


def second_order_sentence(case: CaseResult) -> str:
    """``second order: 6 Hessian-vector products over torch, jax, none failing; tape: max_pool2d has no second derivative``."""
    so = getattr(case, "second_order", None)
    if so is None:
        return ""
    hv = [leaf for leaf in case.leaves if leaf.role == "hvp"]
    bad = [leaf for leaf in hv if leaf.failing]
    line = f"second order: {_plural(len(hv), 'Hessian-vector product')} over {', '.join(so.backends) or 'no backend'}"
    line += f", {len(bad)} failing" if bad else (", none failing" if hv else "")
    if so.unavailable:
        line += "; " + "; ".join(so.unavailable.values())
    return clean_line(line)


# ---------------------------------------------------------------- a case
def case_failure(case: CaseResult) -> str:
    """Why a failed case failed, in one line (JUnit's summary failure message, Markdown, HTML)."""
    bad = case.failing_leaves()
    if bad:
        kinds = list(dict.fromkeys(leaf.verdict for leaf in bad))
        msg = f"{len(bad)} of {compared(case)} leaves failed ({', '.join(kinds)})"
        if case.first_disagreement:
            msg += f"; starts at {case.first_disagreement}"
        blamed = sorted({b for leaf in bad for b in leaf.blame})
        if blamed:
            msg += f"; blamed: {', '.join(blamed)}"
        return clean_line(msg)
    if case.errors:
        source, text = next(iter(case.errors.items()))
        return clean_line(f"{source}: {error_line(text)}")
    traj = getattr(case, "trajectory", None)
    if traj is not None and traj.verdict != "agree":
        return trajectory_head(traj)
    if case.verdict == "vacuous":
        return vacuous_sentence(case) or "every gradient leaf is vacuous: the check cannot fail, so it does"
    if case.verdict == "imprecise":
        flagged = imprecise_leaves(case)
        first = imprecise_sentence(flagged[0]) if flagged else ""
        return clean_line(f"float32 imprecise on {_plural(len(flagged), 'leaf', 'leaves')}" + (f": {first}" if first else ""))
    if case.verdict == "partial":
        return clean_line(f"{partial_sentence(case)}, which fails under the unavailable = \"fail\" policy")
    return clean_line(f"case verdict {case.verdict}")


def precision_sentence(case: CaseResult) -> str:
    """The case's float32 part in one line (``float32: ok, jax 3.1×``: the worst backend's ratio to the best), "" when not run."""
    if not case.float32:
        return ""
    flagged = imprecise_leaves(case)
    line = f"float32: {float32_cell(case)}"
    if flagged:
        word = "failure" if imprecise_fails(case) else "warning"
        line += f"; {_plural(len(flagged), 'imprecise leaf', 'imprecise leaves')} ({word}, policy {case.imprecise})"
    crossed = sum(1 for k in case.kinks if any(k.crossed.values()))
    if case.kinks:
        line += f"; {_plural(len(case.kinks), 'kink site')}" + (f", {crossed} crossed and pinned" if crossed else "")
    return clean_line(line)


# ---------------------------------------------------------------- a run
def run_sentence(run: RunResult) -> str:
    """One line a person can read out: what happened overall.  Never "all passed" for a run that stopped."""
    n = RunCounts.of(run)
    ran = len(run.cases)
    cases = _plural(ran, "case")
    if incomplete(run):
        word = "interrupted" if run.interrupted else "incomplete"
        if run.planned is not None:
            first = f"{word}: {ran} of {_plural(run.planned, 'case')} ran"
        else:
            first = f"{word}: {cases} ran (how many were planned is not recorded)"
        if ran:
            first += f"; {n.failed_cases} of them failed" if n.failed_cases else "; none of those failed"
    elif not run.cases:
        return "no case results: nothing was checked"
    else:
        first = (f"{n.failed_cases} of {cases} failed" if n.failed_cases
                 else "the 1 case passed" if ran == 1 else f"all {cases} passed")
    # Right after the pass or fail: a check on fewer backends than asked is not the cross-check.
    parts = [first, *partial_runs(run)]
    if ran:
        roles: dict[str, int] = {}
        for case in run.cases:
            for leaf in case.leaves:
                if leaf.compared:
                    roles[leaf.role] = roles.get(leaf.role, 0) + 1
        # Say what the compared leaves are: "62 parameter gradients" is what a reader counts on.
        names = {"param": "parameter gradient", "input": "input gradient", "output": "output", "buffer": "buffer",
                 "hvp": "Hessian-vector product", "referee": "joint-direction check"}
        detail = ", ".join(f"{roles[r]} {names[r]}{'s' if roles[r] != 1 else ''}" for r in names if roles.get(r))
        parts.append(f"{n.agreeing} of {n.compared} leaves agree" + (f" ({detail})" if detail else ""))
    if n.vacuous:
        parts.append(f"{n.vacuous} vacuous")
    if n.imprecise:
        word = "failing" if any(imprecise_fails(c) and imprecise_leaves(c) for c in run.cases) else "warnings"
        parts.append(f"float32 imprecise: {_plural(n.imprecise, 'leaf', 'leaves')} ({word})")
    if n.blamed:
        parts.append("blamed: " + ", ".join(f"{b} ×{k}" for b, k in sorted(n.blamed.items(), key=lambda kv: -kv[1])))
    return clean_line("; ".join(parts))


# ---------------------------------------------------------------- the assertion message
def failing_leaves(result: CaseResult) -> list[LeafResult]:
    """Leaves that fail (``LeafResult.failing``): a vacuous leaf is not one, even in a vacuous case."""
    return result.failing_leaves()


def _who(leaf, result) -> str:
    if leaf.verdict == "imprecise" and leaf.float32 is not None and leaf.float32.imprecise:
        return f"{', '.join(leaf.float32.imprecise)}; imprecise"
    ran = [b for b in result.backends if b not in result.unavailable and b not in result.errors]
    if len(ran) == 1 and leaf.referee:  # one backend: whatever is blamed, it was held against the referee alone
        who = f"{ran[0]} vs referee"
    elif leaf.blame:
        who = ", ".join(leaf.blame)
    else:
        who = "unresolved"
    return who if leaf.verdict == "disagree" else f"{who}; {leaf.verdict}"


def summary_line(result) -> str:
    """One line: what failed, where, and who is blamed."""
    bad = failing_leaves(result)
    total = compared(result)
    if bad:
        verb = "disagree" if all(leaf.verdict == "disagree" for leaf in bad) else "fail"
        named = ", ".join(f"{leaf.path} ({_who(leaf, result)})" for leaf in bad[:SUMMARY_LEAVES])
        more = f", and {len(bad) - SUMMARY_LEAVES} more" if len(bad) > SUMMARY_LEAVES else ""
        line = f"{len(bad)}/{total} leaves {verb}: {named}{more}"
        if result.errors:
            line += f"; errors in {', '.join(result.errors)}"
        return clean_line(line)
    if result.errors:
        source, text = next(iter(result.errors.items()))
        where = "the case" if source == "case" else f"backend {source}"
        return clean_line(f"{where} failed: {error_parts(text)[0]}" + (
            f" (and {len(result.errors) - 1} more errors)" if len(result.errors) > 1 else ""))
    if result.verdict in ("vacuous", "imprecise", "partial"):
        return case_failure(result)
    return clean_line(f"case verdict {result.verdict} over {total} leaves")


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x else "0"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]


def _headroom(leaf) -> float:
    # With one backend there is no pair; the referee's error ÷ resolution is the headroom then.
    return leaf.headroom if leaf.pairs else max((c.error for c in leaf.referee), default=0.0)


def format_failure(result) -> str:
    """The AssertionError text: a summary line, the case, a table per failing leaf, notices, errors, replay."""
    lines = [summary_line(result)]
    ran = [b for b in result.backends if b not in result.unavailable]
    head = f"case {result.name!r}: {result.dtype}, {result.mode}, seed {result.seed}, backends {', '.join(ran)}"
    if result.first_disagreement:
        head += f"; the disagreement starts at {result.first_disagreement} (first in backward order)"
    lines.append(clean_line(head))
    if result.partial and result.verdict != "partial":  # a partial verdict's summary line says it already
        lines.append(f"  {partial_sentence(result)}: not the cross-check asked for")
    bad = failing_leaves(result)
    if bad:
        rows = [["leaf", "verdict", "blamed", "max abs", "max rel", "headroom", "message"]]
        for leaf in bad:
            message = imprecise_sentence(leaf) if leaf.verdict == "imprecise" else (
                leaf.message.splitlines()[0] if leaf.message else "")
            rows.append([
                clean_line(leaf.path), leaf.verdict, ", ".join(leaf.blame) or "-",
                _fmt(max((p.max_abs for p in leaf.pairs), default=0.0)),
                _fmt(max((p.max_rel for p in leaf.pairs), default=0.0)),
                _fmt(_headroom(leaf)),
                clean_line(message),
            ])
        lines += _table(rows)
    rest = [leaf for leaf in result.leaves if leaf.compared and not leaf.failing and leaf.verdict != "vacuous"]
    if rest:
        tight = max(rest, key=_headroom)
        lines.append(clean_line(f"  {len(rest)} other leaves agree (largest headroom {_fmt(_headroom(tight))} at "
                                f"{tight.path}; headroom = error / tolerance, over 1 fails)"))
    origin = origin_sentence(result)
    if origin:
        lines.append(f"  {origin}")
    vacuous = vacuous_sentence(result)
    if vacuous:
        lines.append(f"  {vacuous}")
    word = "failure" if imprecise_fails(result) else "warning"
    for leaf in imprecise_leaves(result):
        lines.append(f"  float32 {word}: {imprecise_sentence(leaf)}")
    for kink in result.kinks:
        lines.append(f"  kink: {kink_sentence(kink)}")
    for source, text in result.errors.items():
        headline, frames = error_parts(text)
        lines.append(clean_line(f"error in {source}: {headline}"))
        lines += ["    " + clean_line(f) for f in frames]
    for b, why in result.unavailable.items():
        lines.append(clean_line(f"skipped backend {b}: {why}"))
    if result.replay:
        lines.append(clean_line(f"replay: {result.replay}"))
    return "\n".join(lines)
