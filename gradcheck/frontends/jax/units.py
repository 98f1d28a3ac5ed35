"""A jax model's custom rules as replay units: which ``custom_vjp`` or ``custom_jvp`` a disagreement starts in.

``gradcheck.check.localise`` replays each unit alone on every backend, at the point the float64 reference
reached it, and finds the one whose own backward disagrees.  For a jax model the units are the calls of its
custom rules (the user's ``custom_vjp``, ``jax.nn.relu``'s ``custom_jvp``), each an equation of the jaxpr:
that is where jax's gradient is the user's own code and the tape's and torch's the primal math, so where a
wrong rule shows.  Each backend runs a call its own way: jax binds the equation (the user's rule runs), the
tape, torch and numpy run its primal body (``interpreter.run_equation``).

1. **Record.**  One float64 run of the jaxpr on numpy keeps every rule call's operands and outputs (a call in
   a loop once per step); nested calls are children of the call around them.
2. **Cotangents.**  One float64 backward on the tape, with a zero probe added to every call's float outputs,
   gives the cotangent arriving at each.
3. **Replay.**  ``RuleCall`` is the call as a layer: its float operands are the layer's inputs, its integer
   and bool operands held as recorded.
4. **Reproducer.**  ``Unit.write_replay`` (``gradcheck.repro``) writes a script that loads the user's rule by
   its import path and replays the call with jax alone (``replay``).

A call is named by the module path jax records for it (flax's name stack) and the function the rule stands
for (``LinenMLP/relu``, ``scaled_tanh``); its origin message says where the function is defined.
"""

from __future__ import annotations

import numpy as np

from gradcheck.frontends.jax import interpreter
from gradcheck.frontends.jax.facts import RULES, rule_name
from gradcheck.module import Module, static


class RuleCall(Module):
    """One recorded call of a custom rule, as a layer: ``call(*float_operands) -> outputs``."""

    _call: object = static()

    def __init__(self, call):
        object.__setattr__(self, "_call", call)
        self.training = True

    def __call__(self, *inputs):
        return self._call(inputs)

    @property
    def _unit(self):
        """The call as ``gradcheck.repro`` writes it (``Unit.write_replay``)."""
        return self._call


class Unit:
    """A custom rule's equation at one site of the jaxpr, and how each backend runs it alone."""

    def __init__(self, program, eqn, site: tuple, i: int, operands: list):
        self.program = program
        self.eqn = eqn
        self.site = site
        self.i = i
        # Float operands are the replay's inputs; the others (indices, masks) are held as the reference had them.
        self.slots = [("input", None) if _is_float(x) else ("held", np.array(x, copy=True)) for x in operands]

    def __call__(self, inputs):
        it = iter(inputs)
        operands = [next(it) if kind == "input" else value for kind, value in self.slots]
        if interpreter.backend_of_values(list(inputs)) == "jax":
            params = self.eqn.primitive.get_bind_params(self.eqn.params)
            outs = self.eqn.primitive.bind(*operands, **params)  # the user's rule, under jax's differentiation
            return tuple(outs) if self.eqn.primitive.multiple_results else (outs,)
        floats = interpreter.float_dtype_of(list(inputs))
        known = self.program.traced(floats).known
        return tuple(interpreter.run_equation(self.eqn, self.site, self.i, operands, floats, known))

    def write_replay(self, where, rec) -> dict:
        """A reproducer of this call with jax alone: the user's rule by its import path (``replay``)."""
        from gradcheck.frontends.jax import replay

        return replay.write_replay(self, where, rec)


_KINDS = {"custom_jvp_call": "custom_jvp", "custom_vjp_call": "custom_vjp", "custom_vjp_call_jaxpr": "custom_vjp"}


def _is_float(x) -> bool:
    from gradcheck import ops

    return np.dtype(ops.dtype_of(x)).kind == "f"


def _function(eqn) -> tuple[str, str]:
    """``(name, "defined at file:line")`` of the function a rule equation stands for."""
    text = rule_name(eqn)
    name, _, where = text.partition(" at ")
    return name.rsplit(".", 1)[-1] or eqn.primitive.name, (f"defined at {where}" if where else "")


def _path(eqn, site_eqns: tuple) -> str:
    """The call's name: the module path jax records (flax's name stack) and the function, ``LinenMLP/relu``."""
    stack = "/".join(str(e.source_info.name_stack) for e in site_eqns + (eqn,) if str(e.source_info.name_stack))
    name, _ = _function(eqn)
    return f"{stack}/{name}" if stack else name


def record(program, cr) -> tuple[list, list[str]]:
    """Every custom rule call of the case's float64 forward, as ``localise.LayerCall`` records, and notes."""
    from gradcheck import ops
    from gradcheck.backends.tape import tape
    from gradcheck.case import cast_floats
    from gradcheck.check import kinks
    from gradcheck.check.localise import LayerCall
    from gradcheck.frontends.jax.primitives import where

    notes: list[str] = []
    if program.problems or program.unfaithful:
        notes.append("per-rule replay: the tape and torch cannot run this model's jaxpr, so its custom rules cannot "
                     "be replayed on them")
        return [], notes
    seen: dict[tuple, dict] = {}

    def keep(site, i, eqn, invals, outs):
        if eqn.primitive.name in RULES:
            seen[site + ((i,),)] = {"eqn": eqn, "site": site, "i": i,
                                   "operands": [np.array(ops.to_numpy(x), copy=True) for x in invals],
                                   "outputs": [np.array(ops.to_numpy(x), copy=True) for x in outs]}
        return outs

    reference = cast_floats(cr.args64, np.float64)
    with program.watching(keep), kinks.suspended():
        cr.forward(*reference)
    if not seen:
        return [], notes
    keys = sorted(seen)
    built: dict[tuple, LayerCall] = {}
    counts: dict[str, int] = {}
    for key in keys:
        rec = seen[key]
        eqn = rec["eqn"]
        around = _around(program, rec["site"])
        path = _path(eqn, around)
        name, defined = _function(eqn)
        unit = Unit(program, eqn, rec["site"], rec["i"], rec["operands"])
        floats = [x for x in rec["operands"] if x.dtype.kind == "f"]
        call = LayerCall(index=0, path=path, layer=_KINDS.get(eqn.primitive.name, eqn.primitive.name), unit="layer",
                         module=RuleCall(unit), args=tuple(floats), kwargs={}, output=tuple(rec["outputs"]),
                         call=counts.get(path, 0))
        counts[path] = call.call + 1
        call.op = name
        call.source = (f"{name} is a {call.layer} (jax runs its rule, the tape and torch its primal body)"
                       + (f", {defined}" if defined else "") + f"; called at {where(eqn, around).split(' at ', 1)[-1]}")
        built[key] = call
    records = _order(built)
    _cotangents(program, cr, built, tape)
    return records, notes


def _around(program, site: tuple) -> tuple:
    """The higher-order equations a site is inside, outermost first."""
    jaxpr = program.traced("float64").closed.jaxpr
    found = []
    for i, part, k in site:
        eqn = jaxpr.eqns[i]
        found.append(eqn)
        sub = eqn.params[part]
        sub = sub[k] if isinstance(sub, (tuple, list)) else sub
        jaxpr = getattr(sub, "jaxpr", sub)
    return tuple(found)


def _order(built: dict) -> list:
    """The calls in start order, with start and end ticks and their enclosing call (by site: a call inside
    another's body has a key that the outer's key prefixes, with the body's step in place of its index)."""
    keys = sorted(built)

    def parent(key):
        for j in range(len(key) - 1, 0, -1):
            i, *_ = key[j - 1]
            candidate = key[:j - 1] + ((i,),)
            if candidate in built:
                return candidate
        return None

    children: dict = {}
    for key in keys:
        children.setdefault(parent(key), []).append(key)
    records: list = []
    tick = [0]

    def visit(key, parent_index):
        rec = built[key]
        rec.index, rec.start, rec.parent = len(records), tick[0], parent_index
        tick[0] += 1
        records.append(rec)
        for child in children.get(key, []):
            visit(child, rec.index)
        rec.end = tick[0]
        tick[0] += 1

    for key in children.get(None, []):
        visit(key, None)
    return records


def _cotangents(program, cr, built: dict, tape) -> None:
    """Each call's output cotangents from one float64 backward on the tape, through zero probes at the outputs."""
    from gradcheck import ops
    from gradcheck.case import cast_floats
    from gradcheck.check import kinks

    probes: dict[tuple, list] = {}

    def probe(site, i, eqn, invals, outs):
        key = site + ((i,),)
        if key not in built:
            return outs
        mine, out = [], []
        for x in outs:
            if np.dtype(ops.dtype_of(x)).kind == "f":
                p = tape.Tensor(np.zeros(ops.shape_of(x), ops.dtype_of(x)), requires_grad=True)
                mine.append(p)
                x = ops.add(x, p)
            out.append(x)
        probes[key] = mine
        return out

    reference = cast_floats(cr.args64, np.float64)
    with program.watching(probe), kinks.suspended():
        loss = cr.f64(*reference)[0]
    flat = [p for key in built for p in probes.get(key, [])]
    grads = tape.grad(loss, flat) if flat and isinstance(loss, tape.Tensor) else [np.zeros_like(p.value) for p in flat]
    it = iter(grads)
    for key, rec in built.items():
        rec.cotangent = [np.asarray(next(it)) for _ in probes.get(key, [])]
