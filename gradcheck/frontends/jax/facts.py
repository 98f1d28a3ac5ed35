"""The facts of a jax model's case: what every backend is handed alike, and what the report says was held.

A gradient check compares backends on one function.  What the model draws at random (dropout masks, any
``jax.random`` draw) and the rules a user declares (``custom_jvp``, ``custom_vjp``) are part of that
function: every backend gets the same draws, jax runs the user's rules while the tape and torch differentiate
the primal math they stand for, and a narrower float the float64 run still computes in is said.  ``describe``
writes the case's notes; ``unlowered`` finds, before anything runs, the primitives the tape and torch cannot
run.
"""

from __future__ import annotations

from jax.extend import core as jcore

from gradcheck.frontends.jax import frameworks as fw
from gradcheck.frontends.jax import interpreter
from gradcheck.frontends.jax.primitives import FOLLOWED, LOWERINGS, RANDOM, where

DRAWS = frozenset({"random_bits"})  # a draw of random values (the rest of RANDOM derives keys)
RULES = ("custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")


def describe(program) -> list[str]:
    """One note per fact the case holds: outputs, draws, custom rules, narrow floats, unlowered primitives."""
    model = program.model
    traced = program.traced("float64")
    notes = []
    if len(model.output_names) > 1:
        notes.append("outputs: " + ", ".join(f"output.{k} = {n}" for k, n in enumerate(model.output_names)))
    draws = sum(1 for eqn, _ in _equations(traced.closed.jaxpr) if eqn.primitive.name in DRAWS)
    if draws:
        given = "given by the model" if _users_keys(model) else f"split from the case seed {model.seed}"
        notes.append(f"{draws} random draw{'s' if draws > 1 else ''} (jax.random, dropout) from the key"
                     f"{'s' if len(model.streams) > 1 else ''} of {', '.join(model.streams)} ({given}): jax evaluates "
                     "the key-dependent part of the function once, and the tape and torch get its values (the "
                     "dropout masks) as constants; every backend sees the masks the model's own call draws")
    rules = {}
    for eqn, outer in _equations(traced.closed.jaxpr):
        if eqn.primitive.name in RULES:
            rules.setdefault(rule_name(eqn), (eqn, where(eqn, outer)))
    for name, (eqn, at) in rules.items():
        called = at.split(" at ", 1)[-1]
        if eqn.primitive.name == "custom_jvp_call" and interpreter._is_relu(eqn.params["call_jaxpr"]):
            notes.append(f"jax.nn.relu (called at {called}): its gradient at 0 is 0 by its rule, where its body "
                         "max(x, 0) would split it; the tape and torch follow the rule (ops.relu), a kink the float32 "
                         "runs are pinned at")
            continue
        what = "custom_vjp" if "vjp" in eqn.primitive.name else "custom_jvp"
        notes.append(f"{what} {name}: jax differentiates it by its rule, the tape and torch by its primal math "
                     f"(called at {called})")
    narrow = fw.narrow_floats(traced.closed)
    if narrow:
        narrowest = program.float64_computes_in
        followed = ("every backend follows the cast" if narrowest in FOLLOWED else
                    f"jax follows the cast; the tape and torch compute in float64 there (numpy has no {narrowest} "
                    "arithmetic)")
        notes.append(f"the float64 run still computes in a narrower float at {len(narrow)} place"
                     f"{'s' if len(narrow) > 1 else ''} the model itself casts ({'; '.join(narrow[:3])}"
                     f"{'; ...' if len(narrow) > 3 else ''}): {followed}, so float64 cannot be sharper there, and "
                     f"where backends differ they are held to {narrowest}'s reach at this point (float64's rounding "
                     "probe moves the inputs by its unit roundoff)")
    wide = _widened_in_float32(program) if model.case_dtype == "float32" else []
    if wide:
        notes.append(f"jax's float32 run computes in float64 from {len(wide)} place{'s' if len(wide) > 1 else ''} "
                     f"where float32 values meet jax's default float dtype ({'; '.join(wide[:3])}"
                     f"{'; ...' if len(wide) > 3 else ''}): gradcheck turns x64 on for its float64 check, and "
                     "under it the default is float64 (jnp.ones, jnp.zeros, one_hot, jax.random draws without a "
                     "dtype). With x64 off, as the model is usually run, those values are float32, and so they "
                     "are on the tape and torch. jax's float32 results are taken as float32 and measured, "
                     "less rounded than the model's own there; give those values the data's dtype "
                     "(jnp.ones(n, x.dtype)) to measure jax's float32 run as it is run")
    missing = unlowered(traced.closed, traced.known)
    for why in missing.values():
        notes.append(f"tape and torch cannot run this model (jax only): {why}")
    return notes


def _widened_in_float32(program) -> list[str]:
    """``frameworks.widened_floats`` of the float32 program; [] where it does not trace (its run says why)."""
    try:
        return fw.widened_floats(program.traced("float32").closed)
    except fw.TraceError:
        return []


def rule_name(eqn) -> str:
    """The function a custom rule stands for and where it is defined: ``scaled_tanh at models.py:12``."""
    body = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
    info = getattr(getattr(body, "jaxpr", body), "debug_info", None)
    source = getattr(info, "func_src_info", None) or ""
    return source or eqn.primitive.name


def unlowered(closed, known: dict) -> dict[str, str]:
    """The primitives of the part the tape and torch run that have no lowering, one message per primitive.

    An equation whose outputs jax's constant part computes (a random draw from the case's keys) is not run
    by the tape and torch, and needs no lowering; a random draw that depends on a differentiated value is
    run, and named.
    """
    found: dict[str, str] = {}
    sites = {k[0] if isinstance(k, tuple) else () for k in known}
    by_site = {s: {v for k, v in ((k, k[1] if isinstance(k, tuple) else k) for k in known)
                   if (k[0] if isinstance(k, tuple) else ()) == s} for s in sites}

    def visit(jaxpr, site, outer):
        here = by_site.get(site, set())
        live = interpreter._live(jaxpr, here)
        for i, (eqn, alive) in enumerate(zip(jaxpr.eqns, live)):
            if not alive:
                continue
            name = eqn.primitive.name
            if name in interpreter.HIGHER:
                for part, k, sub in _subjaxprs(eqn):
                    visit(getattr(sub, "jaxpr", sub), site + ((i, part, k),), outer + (eqn,))
            elif name not in LOWERINGS and name not in found:
                found[name] = interpreter.unknown_primitive(eqn, outer)

    visit(closed.jaxpr, (), ())
    return found


def _subjaxprs(eqn):
    """``(param name, step, jaxpr)`` of a higher-order equation, as the interpreter keys its sites: a loop's
    body at its first step, a cond's branches by their index."""
    for name, v in eqn.params.items():
        if isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr)):
            yield name, 0, v
        elif isinstance(v, (tuple, list)):
            for k, x in enumerate(v):
                if isinstance(x, (jcore.Jaxpr, jcore.ClosedJaxpr)):
                    yield name, k, x


def _equations(jaxpr, outer: tuple = ()):
    """``(equation, the higher-order equations around it)`` for every equation, sub-jaxprs too."""
    for eqn in jaxpr.eqns:
        yield eqn, outer
        for sub in jcore.jaxprs_in_params(eqn.params):
            yield from _equations(sub, outer + (eqn,))


def _users_keys(model) -> bool:
    import numpy as np

    return not np.array_equal(model.key, model.key_for(model.seed))


__all__ = ["DRAWS", "RANDOM", "RULES", "describe", "rule_name", "unlowered"]
