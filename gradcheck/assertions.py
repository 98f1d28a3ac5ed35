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
``[tool.gradcheck]`` in ``pyproject.toml``, the defaults (``gradcheck.app.settings``
reads and checks every layer).

This module imports nothing heavy at import time: the pytest plugin imports
it while pytest starts, and that must not pull in torch or jax.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gradcheck.app.settings import NothingToCompare, Settings, from_values, require_comparison


class GradientsDisagree(AssertionError):
    """A gradient cross-check failed; ``result`` is the :class:`CaseResult`."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


class PartialCheck(UserWarning):
    """A check passed on fewer backends than asked for (some unavailable); ``unavailable="fail"`` fails it."""


@dataclass
class CheckContext:
    """What the pytest plugin provides to the checks made inside one test."""

    # Every layer below the call's arguments, stacked: [tool.gradcheck], ini, command line, marker.
    settings: Settings = field(default_factory=Settings)
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
                    seed=None, mode=None, referee=None, imprecise=None, unavailable=None, name=None, order=None,
                    steps=None, optimizer=None, lr=None, **model_kwargs):
    """Cross-check the gradients of ``model`` at ``inputs``; returns the CaseResult without raising.

    See :func:`assert_gradients_agree` for the arguments.  Raises
    :class:`GradientsDisagree` only when the backends cannot compare
    anything (see ``gradcheck.app.settings.require_comparison``).
    """
    __tracebackhide__ = True
    from gradcheck.case import Case
    from gradcheck.check.runner import run_case
    from gradcheck.frontends import jax as jax_frontend
    from gradcheck.frontends import torch as export
    from gradcheck.module import Module

    torch_module = export.is_torch_module(model)
    jax_model = not torch_module and jax_frontend.is_jax_target(model)
    if not torch_module and not jax_model and not isinstance(model, Module):
        raise TypeError(
            f"assert_gradients_agree: model is a {type(model).__name__}; pass a torch.nn.Module or a gradcheck "
            "Module (a layer from gradcheck.layers or your own Module subclass), or a jax model (a flax or equinox "
            "module, or a function fn(params, *inputs))"
        )
    if model_kwargs and not jax_model:
        raise TypeError(f"assert_gradients_agree: unexpected keyword(s) {', '.join(sorted(model_kwargs))}; only a jax "
                        "model's call takes keywords of its own (from_jax's state=, call=, linen's apply keywords)")
    if jax_model and (forward is not None or loss is not None):
        raise TypeError("assert_gradients_agree: a jax model is checked as its framework calls it; pass forward= "
                        "as equinox's call=, or check a function of your own, from_jax(fn, params, *inputs)")
    if forward is not None and loss is not None:
        raise TypeError("assert_gradients_agree: pass forward= or loss= (the same thing), not both")
    forward = forward if forward is not None else loss
    if not inputs and not jax_model:
        raise TypeError("assert_gradients_agree: no inputs; call it as assert_gradients_agree(model, x, ...)")
    ctx = current_context()
    call = from_values(dict(backends=backends, rtol=rtol, atol=atol, dtype=dtype, seed=seed, mode=mode,
                            referee=referee, imprecise=imprecise, unavailable=unavailable, order=order, steps=steps,
                            optimizer=optimizer, lr=lr), "assert_gradients_agree",
                       rule_name="assert_gradients_agree arguments")
    settings = call.over(ctx.settings) if ctx else call
    _require_comparison(settings)

    seed = settings.seed if settings.seed is not None else 0
    if jax_model:  # checked as it is: jax differentiates the user's function, the tape and torch its jaxpr
        case = jax_frontend.from_jax(model, *inputs, name=ctx.next_name(name) if ctx else name, seed=seed,
                                     dtype=settings.dtype, **model_kwargs)
        result = run_case(case, _options(settings, ctx))
        if ctx and ctx.record:
            ctx.record(result)
        return result
    case_mode = settings.mode if settings.mode is not None else ("train" if model.training else "eval")
    case_name = ctx.next_name(name) if ctx else (name or type(model).__name__)
    if torch_module:  # checked as it is: torch runs the module, the tape and jax its torch.export graph
        case = export.from_torch(model, *inputs, forward=forward, name=case_name, mode=case_mode, seed=seed,
                                 dtype=settings.dtype)
        result = run_case(case, _options(settings, ctx))
        if ctx and ctx.record:
            ctx.record(result)
        return result
    modules = list(model.modules())
    was_training = [m.training for m in modules]
    case_dtype = settings.dtype or _model_dtype(model)
    arrays = tuple(_to_numpy(x) for x in inputs)
    case = Case(name=case_name, build=lambda rng: model, inputs=lambda rng: arrays, dtype=case_dtype,
                mode=case_mode, seed=seed, forward=forward, model=type(model).__name__)

    try:
        result = run_case(case, _options(settings, ctx))
    finally:
        for m, flag in zip(modules, was_training, strict=True):  # materialise() set the mode in place
            m.training = flag
    if ctx and ctx.record:
        ctx.record(result)
    return result


def run_suite_case(case, ctx: CheckContext | None = None):
    """Run a ready-made Case under a context's settings (suites collected as pytest items)."""
    __tracebackhide__ = True
    from gradcheck.check.runner import run_case

    settings = ctx.settings if ctx else Settings()
    _require_comparison(settings)
    result = run_case(case, _options(settings, ctx))
    if ctx and ctx.record:
        ctx.record(result)
    return result


def _require_comparison(settings: Settings) -> None:
    """The same rule as ``gradcheck run``'s, raised as a failed check (what to install or enable)."""
    __tracebackhide__ = True
    try:
        require_comparison(settings.backends_or_default(), settings.referee_or_default())
    except NothingToCompare as exc:
        raise GradientsDisagree(str(exc)) from None


def _options(settings: Settings, ctx: CheckContext | None):
    replay = (lambda c: ctx.replay(c.name)) if ctx and ctx.replay else None
    # One call is one case: no second, timing-only call of a compiling backend.
    return settings.run_options(replay=replay, repeat=False)


def assert_gradients_agree(model, *inputs, forward=None, loss=None, backends=None, rtol=None, atol=None,
                           dtype=None, seed=None, mode=None, referee=None, imprecise=None, unavailable=None, name=None,
                           order=None, steps=None, optimizer=None, lr=None, **model_kwargs):
    """Assert that every backend computes the same gradients of ``model`` at ``inputs``.

    * ``model``: a built gradcheck ``Module``; ``inputs``: numpy arrays (or
      anything ``numpy.asarray`` takes; torch tensors are detached).  Float
      inputs are differentiated too, integer inputs are constants.
      A ``torch.nn.Module`` is checked as ``gradcheck.from_torch`` checks it;
      a jax model (a flax.linen, flax.nnx or equinox module, or a function)
      takes ``gradcheck.from_jax``'s arguments, ``model_kwargs`` included
      (``assert_gradients_agree(module, variables, x, train=True)``).
    * ``forward(model, *inputs)`` (or its alias ``loss``): what to
      differentiate; default ``model(*inputs)``.  The loss is a random
      projection of its output, so its shape does not matter.
    * ``backends``: default all of tape, torch, jax (or ``--gradcheck-backends``).
      Backends that are not installed are skipped and noted in the result
      while two of those requested remain; otherwise the check fails and
      says what to install.  One backend asked for alone is checked against
      the float64 referee, so it needs the referee on.
    * ``rtol``/``atol``: one tolerance for every leaf, on top of the defaults
      per dtype and ``[tool.gradcheck]`` rules.
    * ``dtype``: ``float32`` (checked in float64, which decides, and measured
      in float32 against float64) or ``float64`` (float64 only); default the
      model's parameter dtype.
    * ``seed``: the loss cotangent and referee directions (default 0).
    * ``mode``: ``train``/``eval``; default the model's own mode.  The
      model's mode is restored afterwards.
    * ``referee``: ``auto`` (default), ``leaves``, ``joint``, ``off``.
    * ``imprecise``: ``warn`` (default) or ``fail``: whether a float32
      result too far from float64 fails the check.
    * ``unavailable``: ``warn`` (default) or ``fail``: whether a backend
      asked for but unavailable (not installed, or unable to run this
      model: an op without a lowering) fails the check.  Under ``warn`` a
      passing check that ran on fewer backends than asked issues a
      :class:`PartialCheck` warning saying which ("checked on torch and the
      referee alone: tape, jax unavailable").
    * ``name``: the case name in reports (default: the test id in pytest).
    * ``order``: 2 checks Hessian-vector products per leaf too (``gradcheck.check.second_order``).
    * ``steps``, ``optimizer`` (``sgd``/``adam``), ``lr``: train each backend's copy for ``steps``
      optimiser steps and compare the trajectories (``gradcheck.check.trajectory``).

    Returns the :class:`gradcheck.results.CaseResult` when the gradients
    agree; raises :class:`GradientsDisagree` (an AssertionError) whose first
    line summarises which leaves disagree and who is blamed, followed by a
    table per leaf.
    """
    __tracebackhide__ = True
    result = check_gradients(model, *inputs, forward=forward, loss=loss, backends=backends, rtol=rtol, atol=atol,
                             dtype=dtype, seed=seed, mode=mode, referee=referee, imprecise=imprecise,
                             unavailable=unavailable, name=name, order=order, steps=steps, optimizer=optimizer, lr=lr,
                             **model_kwargs)
    if result.failed:
        raise GradientsDisagree(format_failure(result), result)
    if result.partial:  # a pass, but not the cross-check that was asked for: say so where a test run shows it
        import warnings

        warnings.warn(PartialCheck(partial_warning(result)), stacklevel=2)
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
# The sentences live with the reports (reports/text.py), so a test failure and a CLI report say the
# same thing; these names stay importable from here.
from gradcheck.reports.text import _fmt, _headroom, _table, _who, failing_leaves, format_failure, summary_line  # noqa: E402, F401, I001
from gradcheck.reports.text import partial_warning  # noqa: E402
