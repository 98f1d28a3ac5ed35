"""One-line gradient cross-checks for tests: ``assert_gradients_agree(model, x)``.

The model is built already; the check wraps it and its inputs in a
:class:`gradcheck.case.Case` and runs it through the same runner as
``gradcheck run``, so a test failure and a CLI report say the same thing.

Inside a pytest test (with the gradcheck plugin loaded) the check also reads
the command-line options (``--gradcheck-backends``, ``--gradcheck-rtol`` ...)
and the test's ``@pytest.mark.gradcheck(...)`` marker, through the context
variable set around each test, and hands its result to the plugin so that
one session-wide report holds every check.  Precedence, most specific first:
the keyword arguments of the call, the marker, the command line, ini options,
``[tool.gradcheck]`` in ``pyproject.toml``, the defaults.

This module imports nothing heavy at import time: the pytest plugin imports
it while pytest starts, and that must not pull in torch or jax.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

BACKEND_NAMES = ("tape", "torch", "jax")
DTYPES = ("float32", "float64")
REFEREES = ("auto", "leaves", "joint", "off")
MODES = ("train", "eval")
# Leaves listed by name on the summary line before "and N more".
SUMMARY_LEAVES = 5


class GradientsDisagree(AssertionError):
    """A gradient cross-check failed; ``result`` is the :class:`CaseResult`."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class CheckSettings:
    """Options for a check; ``None`` means "not set here, ask the next layer"."""

    backends: tuple[str, ...] | None = None
    dtype: str | None = None
    seed: int | None = None
    rtol: float | None = None
    atol: float | None = None
    referee: str | None = None
    mode: str | None = None
    noise_probe: tuple[str, ...] | None = None  # () is "auto" (see gradcheck.runner.probed)

    def over(self, base: CheckSettings) -> CheckSettings:
        """These settings where set, ``base`` elsewhere."""
        return replace(base, **{f.name: getattr(self, f.name) for f in fields(self)
                                if getattr(self, f.name) is not None})

    @classmethod
    def parse(cls, where: str, **values) -> CheckSettings:
        """Validated settings from loosely typed values (option strings, marker kwargs)."""
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(
                f"{where}: unknown setting(s) {sorted(unknown)}; allowed: "
                + ", ".join(f.name for f in fields(cls))
            )
        out = {}
        for key, value in values.items():
            if value is None or value == "":
                continue
            if key == "backends":
                out[key] = parse_backends(value, where)
            elif key == "noise_probe":
                out[key] = () if value == "auto" else parse_backends(value, f"{where}: noise_probe")
            elif key in ("rtol", "atol"):
                try:
                    number = float(value)
                except (TypeError, ValueError):
                    raise ValueError(f"{where}: {key}={value!r} is not a number; e.g. {key}=1e-3") from None
                if not number >= 0:
                    raise ValueError(f"{where}: {key}={value!r} must be a non-negative number")
                out[key] = number
            elif key == "seed":
                try:
                    out[key] = int(value)
                except (TypeError, ValueError):
                    raise ValueError(f"{where}: seed={value!r} is not an integer") from None
            else:
                allowed = {"dtype": DTYPES, "referee": REFEREES, "mode": MODES}[key]
                if value not in allowed:
                    raise ValueError(f"{where}: {key}={value!r}; expected one of {', '.join(allowed)}")
                out[key] = value
        return cls(**out)


def parse_backends(value, where: str = "backends") -> tuple[str, ...]:
    """``"tape,torch"`` or ``["tape", "torch"]`` -> ``("tape", "torch")``, checked."""
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [str(n).strip() for n in names if str(n).strip()]
    if not names:
        raise ValueError(f"{where}: no backend named; choose from {', '.join(BACKEND_NAMES)}")
    for n in names:
        if n not in BACKEND_NAMES:
            raise ValueError(f"{where}: unknown backend {n!r}; choose from {', '.join(BACKEND_NAMES)}")
    return tuple(dict.fromkeys(names))


@dataclass
class CheckContext:
    """What the pytest plugin provides to the checks made inside one test."""

    settings: CheckSettings = field(default_factory=CheckSettings)
    rules: Any = None  # gradcheck.tolerance.ToleranceRules from [tool.gradcheck], or None
    rule_name: str = "pytest options"
    nodeid: str = ""
    record: Callable[[Any], None] | None = None  # called with each CaseResult
    replay: Callable[[str], str] | None = None  # case name -> command that re-runs it
    checks: int = 0

    def next_name(self, name: str | None) -> str:
        if name:
            return name
        if in_property_test():  # every example of a hypothesis test is the same check
            return self.nodeid
        self.checks += 1
        return self.nodeid if self.checks == 1 else f"{self.nodeid}#{self.checks}"


def in_property_test() -> bool:
    """Inside a running hypothesis test (without importing hypothesis when nobody else did)."""
    import sys

    control = sys.modules.get("hypothesis.control")
    return bool(control and control.currently_in_test_context())


_context: contextvars.ContextVar[CheckContext | None] = contextvars.ContextVar("gradcheck_check_context",
                                                                             default=None)


def current_context() -> CheckContext | None:
    """The context of the running pytest test, or None outside one."""
    return _context.get()


def set_context(ctx: CheckContext | None):
    """Install ``ctx`` for the checks that follow; returns a token for :func:`reset_context`."""
    return _context.set(ctx)


def reset_context(token) -> None:
    _context.reset(token)


# ---------------------------------------------------------------- the check
def check_gradients(model, *inputs, forward=None, loss=None, backends=None, rtol=None, atol=None, dtype=None,
                    seed=None, mode=None, referee=None, noise_probe=None, name=None):
    """Cross-check the gradients of ``model`` at ``inputs``; returns the CaseResult without raising.

    See :func:`assert_gradients_agree` for the arguments.  Raises
    :class:`GradientsDisagree` only when fewer than two of the requested
    backends are installed.
    """
    __tracebackhide__ = True
    from gradcheck.case import Case
    from gradcheck.module import Module
    from gradcheck.runner import run_case

    if not isinstance(model, Module):
        raise TypeError(
            f"assert_gradients_agree: model is a {type(model).__name__}; pass a gradcheck Module "
            "(a layer from gradcheck.layers or your own Module subclass)"
        )
    if forward is not None and loss is not None:
        raise TypeError("assert_gradients_agree: pass forward= or loss= (the same thing), not both")
    forward = forward if forward is not None else loss
    if not inputs:
        raise TypeError("assert_gradients_agree: no inputs; call it as assert_gradients_agree(model, x, ...)")
    ctx = current_context()
    call = CheckSettings.parse("assert_gradients_agree", backends=backends, rtol=rtol, atol=atol, dtype=dtype,
                               seed=seed, mode=mode, referee=referee, noise_probe=noise_probe)
    settings = call.over(ctx.settings) if ctx else call
    requested = _require_backends(settings.backends)

    modules = list(model.modules())
    was_training = [m.training for m in modules]
    if settings.mode is not None:
        case_mode = settings.mode
    else:
        case_mode = "train" if model.training else "eval"
    case_dtype = settings.dtype or _model_dtype(model)
    arrays = tuple(_to_numpy(x) for x in inputs)
    case_name = ctx.next_name(name) if ctx else (name or type(model).__name__)
    case = Case(name=case_name, build=lambda rng: model, inputs=lambda rng: arrays, dtype=case_dtype,
                mode=case_mode, seed=settings.seed if settings.seed is not None else 0, forward=forward,
                model=type(model).__name__)

    options = _options(requested, settings, ctx, call)
    try:
        result = run_case(case, options)
    finally:
        for m, flag in zip(modules, was_training, strict=True):  # materialise() set the mode in place
            m.training = flag
    if ctx and ctx.record:
        ctx.record(result)
    return result


def run_suite_case(case, ctx: CheckContext | None = None):
    """Run a ready-made Case under a context's settings (suites collected as pytest items)."""
    __tracebackhide__ = True
    from gradcheck.runner import run_case

    settings = ctx.settings if ctx else CheckSettings()
    requested = _require_backends(settings.backends)
    result = run_case(case, _options(requested, settings, ctx, CheckSettings()))
    if ctx and ctx.record:
        ctx.record(result)
    return result


def _require_backends(backends) -> tuple[str, ...]:
    """The backends to run; fails (with the install hint) when fewer than two of them are installed."""
    __tracebackhide__ = True
    from gradcheck.backends import get_backend
    from gradcheck.runner import DEFAULT_BACKENDS

    requested = tuple(backends or DEFAULT_BACKENDS)
    missing = {}
    for b in requested:
        ok, why = get_backend(b).available()
        if not ok:
            missing[b] = why
    present = [b for b in requested if b not in missing]
    # An explicit single backend is checked against the referee alone; otherwise a
    # cross-check needs two frameworks, and a missing one is only skipped if two remain.
    if missing and len(present) < min(2, len(requested)):
        raise GradientsDisagree(
            f"gradcheck needs two backends to compare; of {', '.join(requested)} only "
            f"{', '.join(present) or 'none'} {'is' if len(present) == 1 else 'are'} installed\n"
            + "\n".join(f"  {b}: {why}" for b, why in missing.items())
            + "\nInstall the missing framework, or choose backends=... that are installed."
        )
    return requested


def _options(requested, settings: CheckSettings, ctx: CheckContext | None, call: CheckSettings):
    from gradcheck.runner import RunOptions
    from gradcheck.tolerance import ToleranceRules

    rules = ctx.rules if ctx and ctx.rules is not None else ToleranceRules()
    if ctx:
        rules = rules.with_overrides(ctx.settings.rtol, ctx.settings.atol, name=ctx.rule_name)
    rules = rules.with_overrides(call.rtol, call.atol, name="assert_gradients_agree arguments")
    replay = (lambda c: ctx.replay(c.name)) if ctx and ctx.replay else None
    return RunOptions(backends=requested, rules=rules, referee=settings.referee or "auto", repeat=False,
                      noise_probe=settings.noise_probe or None, replay=replay)


def assert_gradients_agree(model, *inputs, forward=None, loss=None, backends=None, rtol=None, atol=None,
                           dtype=None, seed=None, mode=None, referee=None, noise_probe=None, name=None):
    """Assert that every backend computes the same gradients of ``model`` at ``inputs``.

    * ``model``: a built gradcheck ``Module``; ``inputs``: numpy arrays (or
      anything ``numpy.asarray`` takes; torch tensors are detached).  Float
      inputs are differentiated too, integer inputs are constants.
    * ``forward(model, *inputs)`` (or its alias ``loss``): what to
      differentiate; default ``model(*inputs)``.  The loss is a random
      projection of its output, so its shape does not matter.
    * ``backends``: default all of tape, torch, jax (or ``--gradcheck-backends``).
      Backends that are not installed are skipped and noted in the result,
      unless fewer than two of those requested remain: then the check fails
      and says what to install.
    * ``rtol``/``atol``: one tolerance for every leaf, on top of the defaults
      per dtype and ``[tool.gradcheck]`` rules.
    * ``dtype``: ``float32``/``float64``; default the model's parameter dtype.
    * ``seed``: the loss cotangent and referee directions (default 0).
    * ``mode``: ``train``/``eval``; default the model's own mode.  The
      model's mode is restored afterwards.
    * ``referee``: ``auto`` (default), ``leaves``, ``joint``, ``off``.
    * ``noise_probe``: the backends whose float32 rounding noise (each
      against itself in float64) sets float32 tolerances: ``auto`` (default:
      the tape, and torch if it runs, else jax) or a list.
    * ``name``: the case name in reports (default: the test id in pytest).

    Returns the :class:`gradcheck.results.CaseResult` when the gradients
    agree; raises :class:`GradientsDisagree` (an AssertionError) whose first
    line summarises which leaves disagree and who is blamed, followed by a
    table per leaf.
    """
    __tracebackhide__ = True
    result = check_gradients(model, *inputs, forward=forward, loss=loss, backends=backends, rtol=rtol, atol=atol,
                             dtype=dtype, seed=seed, mode=mode, referee=referee, noise_probe=noise_probe,
                             name=name)
    if result.failed:
        raise GradientsDisagree(format_failure(result), result)
    return result


def _model_dtype(model) -> str:
    import numpy as np

    floats = [np.asarray(v).dtype for _, v in model.named_parameters() if np.asarray(v).dtype.kind == "f"]
    return "float64" if floats and all(d == np.float64 for d in floats) else "float32"


def _to_numpy(x):
    import numpy as np

    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        return x.detach().cpu().numpy()
    if hasattr(x, "numpy") and callable(x.numpy) and not isinstance(x, np.ndarray):  # a tape tensor
        return np.asarray(x.numpy())
    return np.asarray(x)


# ---------------------------------------------------------------- the message
FAILING_LEAF = ("error", "structural", "nonfinite", "disagree")


def failing_leaves(result) -> list:
    """Leaves that make the case fail (vacuous ones only when every gradient is vacuous)."""
    bad = [leaf for leaf in result.leaves if leaf.verdict in FAILING_LEAF]
    if result.verdict == "vacuous":
        bad += [leaf for leaf in result.leaves if leaf.verdict == "vacuous"]
    return bad


def _who(leaf, result) -> str:
    if leaf.blame:
        who = ", ".join(leaf.blame)
    else:
        ran = [b for b in result.backends if b not in result.unavailable and b not in result.errors]
        who = f"{ran[0]} vs referee" if len(ran) == 1 and leaf.referee else "unresolved"
    return who if leaf.verdict == "disagree" else f"{who}; {leaf.verdict}"


def summary_line(result) -> str:
    """One line: what failed, where, and who is blamed."""
    bad = failing_leaves(result)
    total = sum(1 for leaf in result.leaves if leaf.verdict != "skipped")
    if bad:
        verb = "disagree" if all(leaf.verdict == "disagree" for leaf in bad) else "fail"
        named = ", ".join(f"{leaf.path} ({_who(leaf, result)})" for leaf in bad[:SUMMARY_LEAVES])
        more = f", and {len(bad) - SUMMARY_LEAVES} more" if len(bad) > SUMMARY_LEAVES else ""
        line = f"{len(bad)}/{total} leaves {verb}: {named}{more}"
        if result.errors:
            line += f"; errors in {', '.join(result.errors)}"
        return line
    if result.errors:
        source, text = next(iter(result.errors.items()))
        first = text.strip().splitlines()[0] if text.strip() else "failed"
        where = "the case" if source == "case" else f"backend {source}"
        return f"{where} failed: {first}" + (f" (and {len(result.errors) - 1} more errors)"
                                             if len(result.errors) > 1 else "")
    return f"case verdict {result.verdict} over {total} leaves"


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x else "0"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]


def _headroom(leaf) -> float:
    # With one backend there is no pair; the referee's error/tolerance is the headroom then.
    return leaf.headroom if leaf.pairs else max((c.error for c in leaf.referee), default=0.0)


def format_failure(result) -> str:
    """The AssertionError text: a summary line, the case, a table per failing leaf, errors, replay."""
    lines = [summary_line(result)]
    ran = [b for b in result.backends if b not in result.unavailable]
    head = f"case {result.name!r}: {result.dtype}, {result.mode}, seed {result.seed}, backends {', '.join(ran)}"
    if result.first_disagreement:
        head += f"; the disagreement starts at {result.first_disagreement} (first in backward order)"
    lines.append(head)
    bad = failing_leaves(result)
    if bad:
        rows = [["leaf", "verdict", "blamed", "max abs", "max rel", "headroom", "message"]]
        for leaf in bad:
            rows.append([
                leaf.path, leaf.verdict, ", ".join(leaf.blame) or "-",
                _fmt(max((p.max_abs for p in leaf.pairs), default=0.0)),
                _fmt(max((p.max_rel for p in leaf.pairs), default=0.0)),
                _fmt(_headroom(leaf)),
                leaf.message.splitlines()[0] if leaf.message else "",
            ])
        lines += _table(rows)
    bad_ids = {id(leaf) for leaf in bad}
    rest = [leaf for leaf in result.leaves if id(leaf) not in bad_ids and leaf.verdict != "skipped"]
    if rest:
        tight = max(rest, key=_headroom)
        lines.append(f"  {len(rest)} other leaves agree (largest headroom {_fmt(_headroom(tight))} at {tight.path}; "
                     "headroom = error / tolerance, over 1 fails)")
    for source, text in result.errors.items():
        lines.append(f"error in {source}:")
        lines += ["    " + t for t in text.splitlines()]
    for b, why in result.unavailable.items():
        lines.append(f"skipped backend {b}: {why}")
    if result.replay:
        lines.append(f"replay: {result.replay}")
    return "\n".join(lines)
