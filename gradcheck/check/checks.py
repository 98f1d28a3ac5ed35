"""The optional checks after the cross-check: each declared once, registered here, run in order.

Once a case's leaves are compared and its verdict is reached
(``gradcheck.check.runner``), ``run_case`` hands the case to every registered
check whose options ask for it, in the order registered.  The built-in ones:

1. ``localise`` (``gradcheck.check.localise``): where a disagreement starts,
   each layer replayed alone; ``CaseResult.origin`` (and ``inherited`` on the
   leaves it explains), and ``CaseRun.localisation`` for the checks after it.
   It runs whenever the case disagrees, and on every case with ``per_layer``.
2. ``repro`` (``gradcheck.repro``): a standalone reproducer folder of the
   origin layer, written from ``CaseRun.localisation`` (``--repro DIR``); a
   note names each folder.
3. ``second order`` (``gradcheck.check.second_order``): Hessian-vector
   products per leaf (``--order 2``); ``CaseResult.second_order`` and leaves of
   role ``hvp``, folded into the verdict.
4. ``trajectory`` (``gradcheck.check.trajectory``): N optimiser steps per
   backend (``--steps N``); ``CaseResult.trajectory``, folded into the verdict.

A check is a :class:`Check`: its name, the ``RunOptions`` fields it reads, the
``CaseResult`` field it fills, ``wanted(options)``, and its entry point
``run(cr, runs, options, res)``: ``cr`` the case's ``runner.CaseRun``,
``runs`` each backend's ``runner.BackendRun`` by name (only backends that
ran), ``res`` the ``CaseResult`` it adds to.  An exception escaping ``run`` is
a bug in gradcheck, recorded on the case as the check declares
(``Check.on_failure``), and the next check runs.  ``docs/decisions.md``
("Adding a check kind") lists every place a new kind touches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gradcheck import repro
from gradcheck.check import localise, second_order, trajectory
from gradcheck.check.errors import internal_error
from gradcheck.results import CaseResult

FAILURES = ("error", "note")
_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(CaseResult))


@dataclass(frozen=True)
class Check:
    """One optional check of a case, as the runner sees it."""

    name: str  # "second order"; also the key of its entry in CaseResult.errors when it fails
    reads: tuple[str, ...]  # the RunOptions fields it reads
    fills: str  # the CaseResult field it fills ("origin", "second_order", "trajectory", "notes", ...)
    wanted: Callable[[Any], bool]  # wanted(options): whether this run asks for it
    run: Callable[[Any, dict, Any, CaseResult], None]  # run(cr, runs, options, res)
    validate: Callable[[Any], None] | None = None  # validate(options): a ValueError naming a wrong option
    # How an exception escaping ``run`` is recorded: "error" (the case's error under ``name``, verdict "error":
    # the check is part of the verdict) or "note" (a diagnosis that fails leaves the verdict as it was).
    on_failure: str = "error"
    failed: str = ""  # the failure's head ("per-layer replay failed"); by default "internal error in the <name> check"

    def __post_init__(self):
        if not self.name:
            raise ValueError("a check needs a name (Check(name='...')): it keys its error on the case")
        if self.fills not in _RESULT_FIELDS:
            raise ValueError(f"check {self.name!r}: fills={self.fills!r} is not a CaseResult field; expected one "
                             f"of {', '.join(_RESULT_FIELDS)} (a new kind of result is a new field in "
                             "gradcheck/results.py)")
        if self.on_failure not in FAILURES:
            raise ValueError(f"check {self.name!r}: on_failure={self.on_failure!r}; expected one of "
                             f"{', '.join(FAILURES)}")

    def record_failure(self, res: CaseResult, exc: BaseException) -> None:
        """An exception that escaped ``run``: the case's error, or a note, as ``on_failure`` says."""
        text = internal_error(self.failed or f"internal error in the {self.name} check", exc)
        if self.on_failure == "note":
            res.notes.append(text)
        else:
            res.errors[self.name] = text
            res.verdict = "error"


_REGISTRY: list[Check] = []


def register(check: Check, before: str | None = None) -> Check:
    """Add a check to the ones every case runs: last, or just before the check named ``before``."""
    names = [c.name for c in _REGISTRY]
    if check.name in names:
        raise ValueError(f"a check named {check.name!r} is already registered; unregister({check.name!r}) it "
                         "first, or give the new one another name")
    if before is not None and before not in names:
        raise ValueError(f"register(before={before!r}): no check of that name; registered: {', '.join(names)}")
    _REGISTRY.insert(names.index(before) if before is not None else len(_REGISTRY), check)
    return check


def unregister(name: str) -> Check:
    """Remove the check named ``name`` (a ValueError naming the registered ones when there is none)."""
    for i, c in enumerate(_REGISTRY):
        if c.name == name:
            return _REGISTRY.pop(i)
    raise ValueError(f"no check named {name!r}; registered: {', '.join(c.name for c in _REGISTRY)}")


def registered() -> tuple[Check, ...]:
    """The registered checks, in the order every case runs them."""
    return tuple(_REGISTRY)


def validate(options) -> None:
    """Each registered check's own options (``RunOptions.__post_init__``): a ValueError naming the wrong one."""
    for check in _REGISTRY:
        if check.validate is not None:
            check.validate(options)


# ---------------------------------------------------------------- the built-in checks, in the order they run
register(Check("localise", reads=("per_layer", "keep_replays", "rules"), fills="origin",
               wanted=lambda options: True, run=localise.check, on_failure="note",
               failed="per-layer replay failed"))
register(Check("repro", reads=("repro",), fills="notes", wanted=lambda options: bool(options.repro),
               run=repro.check, on_failure="note", failed="writing the reproducer failed"))
register(Check("second order", reads=("order", "referee", "rules", "imprecise"), fills="second_order",
               wanted=lambda options: options.order > 1, run=second_order.check,
               validate=lambda options: second_order.check_options(options.order),
               failed="internal error in the second-order check"))
register(Check("trajectory", reads=("steps", "optimizer", "lr", "backends", "rules"), fills="trajectory",
               wanted=lambda options: bool(options.steps), run=trajectory.check,
               validate=lambda options: trajectory.check_options(options.steps, options.optimizer, options.lr)))
