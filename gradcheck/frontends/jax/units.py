"""A jax model's modules and custom rules as replay units: which one a disagreement starts in.

``gradcheck.check.localise`` replays each unit alone on every backend, at the point the float64 reference
reached it, and finds the one whose own backward disagrees.  A jax model has two kinds of unit:

* **module calls** (``Region``): the equations jax recorded under one module path at one place of the jaxpr
  (``regions.Span``: linen's name stack, or the scopes gradcheck pushes for nnx, equinox and haiku modules,
  ``scopes``).  jax binds the span's equations; the tape, torch and numpy run their lowerings at that site
  (``interpreter.run_span``).  The model's parameters and buffers the span reads are leaves of its replay
  module (``SpanCall``) under the model's names; other float values are its inputs.  A wrong VJP anywhere,
  a lowering's on the tape or torch or a primitive's rule in jax, shows in the innermost module around it.
* **custom rule calls** (``Unit``): the user's ``custom_vjp``, ``jax.nn.relu``'s ``custom_jvp``, each an
  equation: where jax's gradient is the user's own code and the tape's and torch's the primal math.  jax binds
  the equation (the user's rule runs), the tape, torch and numpy run its primal body
  (``interpreter.run_equation``).

1. **Record.**  One float64 run of the jaxpr on numpy keeps every rule call's operands and outputs (a call in
   a loop once per step) and the values at every span's boundary; a unit is the child of the innermost unit
   holding it (``_order``).
2. **Cotangents.**  One float64 backward on the tape, with a zero probe added to every unit's float outputs
   (one per variable), gives the cotangent arriving at each.
3. **Replay.**  ``RuleCall`` and ``SpanCall`` are the calls as layers: float operands are the layer's inputs,
   integer and bool operands held as recorded.
4. **Reproducer.**  ``Unit.write_replay`` (``gradcheck.repro``) writes a script that loads the user's rule by
   its import path and replays the call with jax alone (``replay``); a span is no importable function, and
   ``Region.write_replay`` writes its numbers and a script that prints them.

A unit is named by its module path and, for a rule, the function the rule stands for (``LinenMLP/relu``,
``scaled_tanh``); its origin message says where the code is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gradcheck.frontends.jax import interpreter, regions, scopes
from gradcheck.frontends.jax.facts import RULES, rule_name
from gradcheck.frontends.jax.primitives import where
from gradcheck.module import Module, node_class, static


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
        self.slots = _slots(operands, [None] * len(operands))

    def __call__(self, inputs):
        operands = _operands(self.slots, inputs)
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


class Region:
    """A module's span of the jaxpr (``regions.Span``), and how each backend runs it alone: jax binds its
    equations as they are (the user's rules run inside it), the tape, torch and numpy run their lowerings.

    Its operands are the span's inputs: the model's own parameters and buffers it reads are leaves of its
    replay module (``SpanCall``) under the model's names, so that their gradients are compared as the model's;
    other float values (activations) are the replay's inputs, integer and bool ones (indices, masks) held."""

    def __init__(self, program, span, operands: list, leaf_names: dict):
        self.program = program
        self.span = span
        self.slots = _slots(operands, [leaf_names.get(v) for v in span.inputs])
        self._jax = None

    def __call__(self, module, inputs):
        operands = _operands(self.slots, inputs, module)
        if interpreter.backend_of_values([x for x, (kind, _) in zip(operands, self.slots) if kind != "held"]) == "jax":
            if self._jax is None:
                from jax.extend import core as jcore

                span = self.span
                info = jcore.DebugInfo("gradcheck's module replay", span.path, tuple(f"input.{k}" for k in range(
                    len(span.inputs))), tuple(f"output.{k}" for k in range(len(span.outputs))))
                body = jcore.Jaxpr([], span.inputs, span.outputs, [e for _, e in span.eqns], debug_info=info)
                self._jax = jcore.jaxpr_as_fun(jcore.ClosedJaxpr(body, []))
            return tuple(self._jax(*operands))
        floats = interpreter.float_dtype_of([x for x, (kind, _) in zip(operands, self.slots) if kind != "held"])
        # The span's equations are the float64 jaxpr's, so are the constants they read (a float32 replay
        # runs them at float32, as ``run_equation`` runs a rule's).
        known = self.program.traced("float64").known
        return tuple(interpreter.run_span(self.span.eqns, self.span.site, self.span.inputs, self.span.outputs,
                                          operands, floats, known))

    def module(self, layer: str, operands: list, kinds: dict) -> Module:
        """The replay's module: a ``SpanCall`` holding the model's leaves this span reads, at the values the
        float64 reference read (``operands``, one per slot)."""
        leaves = [(n, x) for (kind, n), x in zip(self.slots, operands) if kind == "leaf"]
        cls = node_class(layer, SpanCall, tuple((n, kinds[n]) for n, _ in leaves), __name__)
        node = object.__new__(cls)
        for n, x in leaves:
            object.__setattr__(node, n, np.array(x, copy=True))
        object.__setattr__(node, "_call", self)
        node.training = True
        return node


    def write_replay(self, where, rec) -> dict:
        """The reproducer folder of a module span: its numbers, and a script that prints them.

        A span is a piece of the model's jaxpr, not a function of the user's that a script could import and
        call, so the script (the custom rules' one) cannot rebuild it without the model; it says so, prints
        the stored reference and each backend's gradient, and exits 2.  ``gradcheck run`` with
        ``--per-layer`` replays it again."""
        from gradcheck.frontends.jax import replay

        return replay.write_stored(where, rec, function=self.span.path, kind="module", operands=[
            f"input.{k}" for k in range(sum(kind == "input" for kind, _ in self.slots))], why=(
            f"{self.span.path} is {len(self.span.eqns)} equations of the model's jaxpr under that module path, "
            "not a function of the model's code that can be imported and called alone; rerun gradcheck on the "
            "model to replay it (--per-layer replays every module)"))


class SpanCall(Module):
    """A module's span, as a layer holding the model's leaves it reads: ``call(*activations) -> outputs``."""

    _call: object = static()

    def __init__(self):
        raise TypeError("a SpanCall is made by gradcheck.frontends.jax.units")

    def __call__(self, *inputs):
        return self._call(self, inputs)

    @property
    def _unit(self):
        """The span as ``gradcheck.repro`` writes it (``Region.write_replay``)."""
        return self._call


def _slots(operands: list, leaves: list) -> list:
    """How a unit's operands reach it: a float one that is the model's leaf ``leaves[k]`` is read from the replay
    module (``("leaf", name)``), any other float one is the replay's input (``("input", None)``), the others
    (indices, masks) are held as the reference had them (``("held", value)``)."""
    return [("held", np.array(x, copy=True)) if not _is_float(x) else ("leaf", leaf) if leaf else ("input", None)
            for x, leaf in zip(operands, leaves)]


def _operands(slots: list, inputs, module=None) -> list:
    """A unit's operands from its slots: the replay's inputs in order, the module's leaves, the held values."""
    it = iter(inputs)
    return [next(it) if kind == "input" else getattr(module, value) if kind == "leaf" else value
            for kind, value in slots]


_KINDS = {"custom_jvp_call": "custom_jvp", "custom_vjp_call": "custom_vjp", "custom_vjp_call_jaxpr": "custom_vjp"}


def _is_float(x) -> bool:
    from gradcheck import ops

    return np.dtype(ops.dtype_of(x)).kind == "f"


def _function(eqn) -> tuple[str, str]:
    """``(name, "defined at file:line")`` of the function a rule equation stands for."""
    text = rule_name(eqn)
    name, _, where = text.partition(" at ")
    return name.rsplit(".", 1)[-1] or eqn.primitive.name, (f"defined at {where}" if where else "")


def _path(eqn, site_eqns: tuple, own: bool | None) -> str:
    """The call's name: the module path jax records (flax's name stack) and the function, ``LinenMLP/relu``."""
    stack = scopes.path(site_eqns + (eqn,), own)
    name, _ = _function(eqn)
    return f"{stack}/{name}" if stack else name


def record(program, cr) -> tuple[list, list[str]]:
    """Every custom rule call and module span of the case's float64 forward, as ``localise.LayerCall`` records,
    and notes."""
    from gradcheck import ops
    from gradcheck.backends.tape import tape
    from gradcheck.case import cast_floats
    from gradcheck.check import kinks
    from gradcheck.check.localise import LayerCall

    notes: list[str] = []
    if program.problems or program.unfaithful:
        notes.append("per-module replay: the tape and torch cannot run this model's jaxpr, so its modules and "
                     "custom rules cannot be replayed on them")
        return [], notes
    traced = program.traced("float64")
    spans = [s for s in regions.find(traced.closed, traced.known, _own_scopes(program))
             if not (len(s.eqns) == 1 and s.eqns[0][1].primitive.name in RULES)]  # a rule call alone: its own unit
    boundary: dict[tuple, set] = {}
    for span in spans:
        boundary.setdefault(span.site, set()).update(span.inputs + span.outputs)
    seen: dict[tuple, dict] = {}
    values: dict[tuple, np.ndarray] = {}

    def keep(site, i, eqn, invals, outs):
        if eqn.primitive.name in RULES:
            seen[(site, i)] = {"eqn": eqn, "site": site, "i": i,
                               "operands": [np.array(ops.to_numpy(x), copy=True) for x in invals],
                               "outputs": [np.array(ops.to_numpy(x), copy=True) for x in outs]}
        wanted = boundary.get(site)
        if wanted:
            for v, x in [*zip(eqn.invars, invals), *zip(eqn.outvars, outs)]:
                if interpreter.is_var(v) and v in wanted and (site, v) not in values:
                    values[(site, v)] = np.array(ops.to_numpy(x), copy=True)
        return outs

    reference = cast_floats(cr.args64, np.float64)
    with program.watching(keep), kinks.suspended():
        cr.forward(*reference)
    units: list[_Recorded] = []
    for (site, i), rec in seen.items():
        units.append(_Recorded(site, i, i, _rule_call(program, rec), outvars=list(rec["eqn"].outvars)))
    model = program.model
    top = traced.closed.jaxpr.invars
    leaf_names = dict(zip(top, program.leaf_names()))
    kinds = {**{n: "param" for n in model.params}, **{n: "buffer" for n in model.buffers}}
    for span in spans:
        if any((span.site, v) not in values for v in span.inputs + span.outputs):
            continue  # not reached by this forward (a module in a branch not taken)
        operands = [values[(span.site, v)] for v in span.inputs]
        region = Region(program, span, operands, leaf_names if span.site == () else {})
        layer = _layer_class(model.classes, span.stack)
        activations = [x for x, (kind, _) in zip(operands, region.slots) if kind == "input"]
        call = LayerCall(index=0, path=span.path, layer=layer, unit="layer",
                         module=region.module(layer, operands, kinds), args=tuple(activations), kwargs={},
                         output=tuple(values[(span.site, v)] for v in span.outputs), leaf_prefix="")
        call.source = f"the {len(span.eqns)} equations jax recorded under {span.path}, from {_line(span)}"
        units.append(_Recorded(span.site, span.first, span.last, call, depth=len(span.stack), outvars=span.outputs))
    if not units:
        return [], notes
    records = _order(units)
    _cotangents(program, cr, units, tape)
    return records, notes


def _rule_call(program, rec):
    """A rule call's ``localise.LayerCall``."""
    from gradcheck.check.localise import LayerCall

    eqn = rec["eqn"]
    around = _around(program, rec["site"])
    path = _path(eqn, around, _own_scopes(program))
    name, defined = _function(eqn)
    unit = Unit(program, eqn, rec["site"], rec["i"], rec["operands"])
    floats = [x for x in rec["operands"] if x.dtype.kind == "f"]
    call = LayerCall(index=0, path=path, layer=_KINDS.get(eqn.primitive.name, eqn.primitive.name), unit="layer",
                     module=RuleCall(unit), args=tuple(floats), kwargs={}, output=tuple(rec["outputs"]))
    call.op = name
    call.source = (f"{name} is a {call.layer} (jax runs its rule, the tape and torch its primal body)"
                   + (f", {defined}" if defined else "") + f"; called at {where(eqn, around).split(' at ', 1)[-1]}")
    return call


def _own_scopes(program) -> bool | None:
    """Whether module paths are gradcheck's scopes (nnx, equinox: ``scopes.module_scopes``) or linen's own; for
    a plain function, gradcheck's where it pushed any (haiku's modules), else the function's own named scopes."""
    return {"nnx": True, "equinox": True, "linen": False}.get(program.model.kind)


def _line(span) -> str:
    """Where a span's first equation is in the user's code (``where`` without the module path)."""
    text = where(span.eqns[0][1], span.around).split(" at ", 1)[-1]
    stack = scopes.path(span.around + (span.eqns[0][1],))
    return text[len(stack) + 2:] if stack and text.startswith(stack + ", ") else text


def _layer_class(classes: dict, stack: tuple) -> str:
    """The framework's class of the module a span's path names (``Model.classes``: linen's name stack starts
    with the model's own class name, nnx's and equinox's scopes with a child's path), else "module"."""
    return classes.get(scopes.join(stack)) or classes.get(scopes.join(stack[1:])) or "module"


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


_RULE = 1 << 30  # a rule call's depth in ``_Recorded``: deeper than any module path


@dataclass
class _Recorded:
    """A unit of the replay where the jaxpr has it: equations ``first``..``last`` at ``site``."""

    site: tuple
    first: int
    last: int
    call: object  # its localise.LayerCall
    depth: int = _RULE  # a module span's path length; a rule call is inside any span of the same equation
    outvars: list = field(default_factory=list)  # the variables its outputs are (probed for their cotangents)

    def key(self) -> tuple:
        """Forward order, comparable across sites: a unit before the ones inside it."""
        steps = tuple(x for i, part, t in self.site for x in (i, 1, part, t))
        return steps + (self.first, 0, "", -self.last, self.depth)

    def holds(self, other: _Recorded) -> bool:
        if other is self:
            return False
        if other.site == self.site:
            inside = self.first <= other.first and other.last <= self.last
            return inside and (self.first, -self.last, self.depth) < (other.first, -other.last, other.depth)
        n = len(self.site)
        return (len(other.site) > n and other.site[:n] == self.site
                and self.first <= other.site[n][0] <= self.last)


def _order(units: list[_Recorded]) -> list:
    """The calls in start order, with start and end ticks and their enclosing call (the innermost unit that
    holds one: a span holds the equations it runs and what runs inside them)."""
    units = sorted(units, key=_Recorded.key)
    children: dict = {}
    open_: list[int] = []  # the units around the current one, outermost first (forward order nests them)
    for k, u in enumerate(units):
        while open_ and not units[open_[-1]].holds(u):
            open_.pop()
        children.setdefault(open_[-1] if open_ else None, []).append(k)
        open_.append(k)
    for k, u in enumerate(units):  # a span holding other units is a block: replayed where it can change the answer
        if children.get(k) and u.depth < _RULE:
            u.call.unit = "block"
    records: list = []
    tick = [0]
    counts: dict[str, int] = {}

    def visit(k, parent_index):
        rec = units[k].call
        rec.index, rec.start, rec.parent = len(records), tick[0], parent_index
        rec.call = counts.get(rec.path, 0)
        counts[rec.path] = rec.call + 1
        tick[0] += 1
        records.append(rec)
        for child in children.get(k, []):
            visit(child, rec.index)
        rec.end = tick[0]
        tick[0] += 1

    for k in children.get(None, []):
        visit(k, None)
    return records


def _cotangents(program, cr, units: list, tape) -> None:
    """Each unit's output cotangents from one float64 backward on the tape, through zero probes at its outputs
    (one probe per variable: a module's output that a rule call computes is probed once)."""
    from gradcheck import ops
    from gradcheck.case import cast_floats
    from gradcheck.check import kinks

    wanted: dict[tuple, set] = {}
    for u in units:
        wanted.setdefault(u.site, set()).update(v for v in u.outvars if interpreter.is_var(v))
    probes: dict[tuple, object] = {}

    def probe(site, i, eqn, invals, outs):
        here = wanted.get(site)
        if not here:
            return outs
        out = []
        for v, x in zip(eqn.outvars, outs):
            if interpreter.is_var(v) and v in here and (site, v) not in probes and _is_float(x):
                p = tape.Tensor(np.zeros(ops.shape_of(x), ops.dtype_of(x)), requires_grad=True)
                probes[(site, v)] = p
                x = ops.add(x, p)
            out.append(x)
        return out

    reference = cast_floats(cr.args64, np.float64)
    with program.watching(probe), kinks.suspended():
        loss = cr.f64(*reference)[0]
    keys = list(probes)
    flat = [probes[k] for k in keys]
    grads = tape.grad(loss, flat) if flat and isinstance(loss, tape.Tensor) else [np.zeros_like(p.value) for p in flat]
    by_key = dict(zip(keys, grads))
    for u in units:
        u.call.cotangent = [np.asarray(by_key[(u.site, v)]) if (u.site, v) in by_key else np.zeros(v.aval.shape)
                            for v in u.outvars if regions.is_float_var(v)]
