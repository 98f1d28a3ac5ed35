"""Per-layer VJP replay: where a model's disagreement starts, and who is wrong there.

"46 leaves disagree" says little; a wrong VJP in layer *k* corrupts the
gradients of layer *k* and of everything before it.  ``localise`` replays
every layer *alone* on every backend, at exactly the point the float64
reference reached it, and finds the layer whose **own** backward disagrees.

1. **Record** (``record``).  A float64 forward on numpy (the referee's
   forward) with every module call intercepted (``module.intercepting``)
   records each layer's inputs, keyword arguments, output, and a snapshot of
   the layer as it was called (BatchNorm reassigns its running statistics
   during the call; the snapshot holds the values it started from).
2. **Cotangents.**  The same forward once more on the tape in float64, with
   a zero *probe* added to every recorded layer output
   (``out + p``, ``p`` a zero leaf of the tape): the loss's gradient with
   respect to ``p`` is exactly the cotangent arriving at that output, for
   every layer in one backward pass (asking for the outputs themselves would
   stop the tape's walk at the first one).  Parameters are constants there,
   so the pass computes no weight gradients.  Any cotangent serves a replay,
   as long as every backend gets the same one: even a tape with a wrong VJP
   gives the layers before it a valid (if different) cotangent.
3. **Replay** (``_replay``).  Each layer alone on every backend that ran:
   ``f(layer, inputs, kwargs, r) = (<r, layer(*inputs, **kwargs)>, output)``
   through ``get_backend(name).evaluate``; its parameter and input
   gradients, its output and its updated buffers are compared in float64
   (``compare.compare_leaf``, ``verdict.decide``).  ``f`` is one function
   for every layer, so jax compiles once per distinct layer configuration.
4. **Origin.**  The layer whose own VJP disagrees and that starts *last* in
   forward order is the origin (``Origin(kind="vjp")``): a child starts
   after its parent, so an inner layer wins over the block around it, and a
   later layer over an earlier one.  Its disagreeing leaves are refereed with
   float64 finite differences of the layer alone (cheap: one layer), and its
   blame is the referee's word or the majority's.  When no layer's own VJP
   disagrees, the disagreement comes from the forward pass: the origin is the
   first layer (in the order outputs are produced) whose output differs
   between backends on identical inputs (``kind="forward"``).  Model leaves
   whose own layer's replay agrees are marked ``inherited``.

**Granularity.**  Two kinds of unit:

* *layers*: modules that own a parameter themselves (Conv2d, BatchNorm,
  Dense, LayerNorm, Embedding, MultiheadAttention, whose ``out_proj`` is a
  layer of its own too) and parameter-free modules without children (ReLU,
  MaxPool2d, GELU, Flatten, Dropout).  Replayed always: together about one
  forward and backward of the model per backend.
* *blocks*: modules with children and no parameters of their own
  (BasicBlock, the transformer's Block, a Chain).  They hold the code
  between layers that no layer covers (ResNet's residual add and relus are
  ``ops`` calls in ``BasicBlock.__call__``).  Replayed only where they can
  change the answer: those that start after the deepest disagreeing layer,
  or all of them when no layer disagrees.  The root module is the model
  itself (already run) and is not replayed, unless it is a single layer.

A module called several times is replayed once per call (``LayerCall.call``).

**Options** (``RunOptions`` fields): ``per_layer`` replays a case that
agrees too (layers only: blocks can only change the answer for a case that
disagrees); ``keep_replays`` keeps every call's arrays (by default an
agreeing call's are dropped once judged, and only disagreeing calls can be
written as reproducers); ``rules`` are the tolerance rules the model was
judged by.

**Cost.**  Every layer is replayed once per backend, each replay about one
float64 forward and backward of that layer alone, so the layers together
cost about one forward and backward of the model per backend; jax compiles
once per distinct layer configuration (ResNet-18: 44 layer replays, 20
configurations).  A case that disagrees replays the layers and only the
blocks after the deepest wrong layer.  What ``--per-layer`` costs, measured,
is in BENCHMARKS.md ("What the optional checks cost"; "The per-layer
replay").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gradcheck import ops
from gradcheck.backends import get_backend, reference_rank
from gradcheck.backends.base import Evaluation, all_leaves, map_output
from gradcheck.backends.tape import tape
from gradcheck.case import cast_floats
from gradcheck.check import kinks, verdict
from gradcheck.check import referee as ref
from gradcheck.check.compare import MISSING, compare_leaf
from gradcheck.check.errors import short_error
from gradcheck.check.tolerance import ToleranceRules
from gradcheck.module import CHILD, PARAM, Module, buffer, child, intercepting
from gradcheck.results import LeafResult, Origin
from gradcheck.tree import (
    is_float_array,
    leaves_with_paths,
    map_leaves,
    module_paths,
    replace_leaves,
)

_NEUTRAL = ("layer", "input", "kwargs", "cotangent")
OFF = ("disagree", "nonfinite", "structural")  # a leaf verdict that says "these backends do not agree"

# The framework op a layer type's backward is, where a layer is one op (Origin.op).
LAYER_OPS = {
    "Conv1d": "conv", "Conv2d": "conv", "ConvTranspose1d": "conv_transpose", "ConvTranspose2d": "conv_transpose",
    "Dense": "linear", "Linear": "linear", "BatchNorm1d": "batch_norm", "BatchNorm2d": "batch_norm",
    "LayerNorm": "layer_norm", "GroupNorm": "group_norm", "RMSNorm": "rms_norm", "Embedding": "embedding",
    "ReLU": "relu", "GELU": "gelu", "Tanh": "tanh", "Sigmoid": "sigmoid", "MaxPool2d": "max_pool2d",
    "AvgPool2d": "avg_pool2d", "AdaptiveAvgPool2d": "adaptive_avg_pool2d",
}
# Layers made of several framework ops: the candidates, named in the origin's message.
LAYER_KERNELS = {"MultiheadAttention": ("linear", "scaled_dot_product_attention")}


# ---------------------------------------------------------------- what the replay holds
class _Held(Module):
    """One cotangent array, as a buffer: every backend receives it as a constant (no gradient)."""

    value: Any = buffer()


class _Cotangent(Module):
    items: list = child()


def _layer_loss(layer, inputs, kwargs, cotangent):
    """``<r, layer(*inputs, **kwargs)>`` and the output: one function for every replay (jax caches by it)."""
    out = layer(*inputs, **kwargs)
    loss = None
    for o, held in zip(float_arrays(out), cotangent.items, strict=True):
        term = ops.sum(ops.mul(o, held.value))
        loss = term if loss is None else ops.add(loss, term)
    return loss, out


def float_arrays(out) -> list:
    """The floating-point arrays of a layer's output (an array, or a tuple, list or dict of them), in order:
    what a replay's cotangent pairs with, and what a reproducer stores (``gradcheck.repro``)."""
    found = []
    map_output(out, lambda v: found.append(v) if is_float_array(v) else None)
    return found


@dataclass
class LayerCall:
    """One module call of the float64 reference forward, and its replay."""

    index: int  # position in start order (a parent before its children)
    path: str  # "layer3.1.bn2"; "" for the model itself
    layer: str  # the type, "BatchNorm2d"
    unit: str  # "layer" (owns parameters, or has no children) or "block" (children only)
    module: Module  # float64, as it was when called
    args: tuple
    kwargs: dict
    output: Any = None  # the reference's (numpy) output
    start: int = 0  # event ticks: starts and ends counted together
    end: int = 0
    parent: int | None = None  # the enclosing recorded call
    call: int = 0  # which call of this module (a module called twice is replayed twice)
    cotangent: list | None = None  # per float array of the output, from the float64 tape
    evaluations: dict[str, Evaluation] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    grads: list[LeafResult] = field(default_factory=list)  # the layer's own parameter and input gradients
    forward: list[LeafResult] = field(default_factory=list)  # its outputs and updated buffers
    replayed: bool = False
    dropped: bool = False  # its arrays were let go after judging (``drop``)
    op: str = ""  # the framework op the call's own code starts with, where the frontend can name it
    source: str = ""  # where that op is in the user's source, where the frontend can name it
    # The user's own backward code torch runs in this call's own code (a custom autograd.Function: "Name (file:line)"),
    # where the frontend can name it: torch's gradient there is that code's, not its forward's derivative.
    custom_backwards: list[str] = field(default_factory=list)
    # The prefix the module's leaves are named under in the replay, where it is not ``path``: a jax model's
    # module span holds the model's own leaves under the model's names (``frontends.jax.units``), prefix "".
    leaf_prefix: str | None = None

    @property
    def name(self) -> str:
        where = self.path or "(model)"
        return where if self.call == 0 else f"{where} (call {self.call + 1})"

    @property
    def input_prefix(self) -> str:
        return f"{self.path}:input" if self.path else "input"

    @property
    def kwargs_prefix(self) -> str:
        return f"{self.path}:kwargs" if self.path else "kwargs"

    def replay_args(self):
        """The replay's arguments and their prefixes: ``f``'s leaves are named as the model names them."""
        held = _Cotangent([_Held(np.asarray(c)) for c in self.cotangent])
        return ((self.module, tuple(self.args), dict(self.kwargs), held),
                (self.path if self.leaf_prefix is None else self.leaf_prefix, self.input_prefix, self.kwargs_prefix,
                 "cotangent"))

    def evaluate(self, backend) -> Evaluation:
        """The replay on one backend.  The leaves go in under neutral names, so that jax compiles once for
        every layer of one configuration (its cache keys on leaf paths), and come back under the model's."""
        args, prefixes = self.replay_args()
        ev = backend.evaluate(_layer_loss, args, _NEUTRAL)
        rename = {}
        for a, neutral, real in zip(args, _NEUTRAL, prefixes, strict=True):
            for n, r in zip(leaves_with_paths(a, neutral), leaves_with_paths(a, real), strict=True):
                rename[n.path] = r.path
        ev.grads = {rename[p]: g for p, g in ev.grads.items()}
        ev.buffers = {rename[p]: b for p, b in ev.buffers.items()}
        return ev

    def drop(self) -> None:
        """Forget the arrays (inputs, outputs, each backend's answers); the verdicts stay."""
        for ev in self.evaluations.values():
            ev.value, ev.grads, ev.buffers, ev.leaves = None, {}, {}, []
        self.args, self.kwargs, self.output, self.cotangent = (), {}, None, None
        self.dropped = True

    def vjp_off(self) -> list[LeafResult]:
        return [leaf for leaf in self.grads if leaf.verdict in OFF]

    def forward_off(self) -> list[LeafResult]:
        return [leaf for leaf in self.forward if leaf.verdict in OFF]

    @property
    def verdict(self) -> str:
        if not self.replayed:
            return "not replayed"
        if self.vjp_off():
            return "vjp"
        if self.forward_off():
            return "forward"
        return "agree"


@dataclass
class Localisation:
    """Everything one replay found: what ``localise`` returns, and ``check`` keeps on the case's
    ``CaseRun.localisation`` for the checks after it (``gradcheck.repro`` writes reproducers from it)."""

    calls: list[LayerCall]
    backends: list[str]
    origin_call: LayerCall | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # record, cotangents, replay, referee

    def layers(self) -> list[dict]:
        """One row per replayed call, in forward order: what a per-layer table shows."""
        rows = []
        for c in self.calls:
            if not c.replayed:
                continue
            worst = max(c.grads + c.forward, key=lambda leaf: leaf.headroom, default=None)
            rows.append({"path": c.name, "layer": c.layer, "unit": c.unit, "verdict": c.verdict,
                         "blame": sorted({b for leaf in c.vjp_off() + c.forward_off() for b in leaf.blame},
                                         key=reference_rank),
                         "leaves": len(c.grads), "headroom": worst.headroom if worst else 0.0,
                         "seconds": dict(c.seconds), "errors": dict(c.errors)})
        return rows


# ---------------------------------------------------------------- 1. record
def _owns_params(m: Module) -> bool:
    return any(kind == PARAM and getattr(m, name) is not None for name, kind, _ in m.field_kinds())


def _has_children(m: Module) -> bool:
    for name, kind, _ in m.field_kinds():
        if kind == CHILD:
            value = getattr(m, name)
            if any(isinstance(v, Module) for v in (value if isinstance(value, (list, tuple)) else [value])):
                return True
    return False


def _unit_of(m: Module, path: str) -> str | None:
    """"layer", "block", or None for a call that is not replayed (the model itself, when it has children)."""
    if _owns_params(m) or not _has_children(m):
        return "layer"
    return None if path == "" else "block"


def _walk_calls(model: Module, on_call: Callable):
    """An ``around`` hook calling ``on_call(module, path, unit, run, args, kwargs)`` for every recorded call."""
    paths = module_paths(model)
    units: dict[int, str | None] = {}

    def around(m, run, args, kwargs):
        path = paths.get(id(m))
        if path is None:  # a module made inside the forward, or handed in: not part of the model's tree
            return run(*args, **kwargs)
        if id(m) not in units:
            units[id(m)] = _unit_of(m, path)
        unit = units[id(m)]
        if unit is None:
            return run(*args, **kwargs)
        return on_call(m, path, unit, run, args, kwargs)

    return around


def record(cr) -> list[LayerCall]:
    """Every layer call of a float64 forward on numpy: inputs, outputs, the layer as it was called."""
    reference = cast_floats(cr.args64, np.float64)  # a copy: layers reassign their buffers
    calls: list[LayerCall] = []
    stack: list[int] = []
    seen: dict[int, int] = {}
    tick = [0]

    def on_call(m, path, unit, run, args, kwargs):
        snapshot = map_leaves(m, lambda p, v, k: v)  # the fields as they are now, before the call reassigns any
        rec = LayerCall(index=len(calls), path=path, layer=type(m).__name__, unit=unit, module=snapshot,
                        args=tuple(args), kwargs=dict(kwargs), start=tick[0],
                        parent=stack[-1] if stack else None, call=seen.get(id(m), 0))
        seen[id(m)] = rec.call + 1
        tick[0] += 1
        calls.append(rec)
        stack.append(rec.index)
        try:
            out = run(*args, **kwargs)
        finally:
            stack.pop()
        rec.output, rec.end = out, tick[0]
        tick[0] += 1
        return out

    with intercepting(_walk_calls(reference[0], on_call)), kinks.suspended():
        cr.forward(*reference)
    return calls


# ---------------------------------------------------------------- 2. cotangents
def cotangents(cr, calls: list[LayerCall]) -> None:
    """Each call's output cotangent from one float64 backward on the tape (see the module doc)."""
    reference = cast_floats(cr.args64, np.float64)
    probes: list[list] = []

    def on_call(m, path, unit, run, args, kwargs):
        mine: list = []
        probes.append(mine)
        out = run(*args, **kwargs)

        def probe(o):
            if not is_float_array(o):
                return o
            p = tape.Tensor(np.zeros(ops.shape_of(o), ops.dtype_of(o)), requires_grad=True)
            mine.append(p)
            return ops.add(o, p)

        return map_output(out, probe)

    with intercepting(_walk_calls(reference[0], on_call)), kinks.suspended():
        loss = cr.f64(*reference)[0]
    if len(probes) != len(calls):
        raise RuntimeError(f"the model's forward called {len(probes)} layers on the tape and {len(calls)} on numpy; "
                           "a forward that changes from call to call cannot be replayed layer by layer")
    flat = [p for mine in probes for p in mine]
    grads = tape.grad(loss, flat) if flat and isinstance(loss, tape.Tensor) else [np.zeros_like(p.value) for p in flat]
    it = iter(grads)
    for rec, mine in zip(calls, probes, strict=True):
        rec.cotangent = [np.asarray(next(it)) for _ in mine]


# ---------------------------------------------------------------- 3. replay
CHUNK = 8  # calls replayed per backend before switching to the next backend


def _replay(recs: list[LayerCall], names: list[str], rules: ToleranceRules, keep: bool) -> None:
    """Each call's layer alone on every backend, then compared in float64.

    Backend by backend over a chunk of calls, not layer by layer:
    alternating frameworks call after call hands the cores from one
    framework's thread pool to the other's, and is several times slower
    than batching them (BENCHMARKS.md, "The per-layer replay").
    Chunks bound what is held at once: after judging, an agreeing call's
    arrays are dropped unless ``keep`` (every layer's inputs, outputs and
    gradients otherwise, a model's worth of them per backend).
    """
    todo = [r for r in recs if r.cotangent and len(r.cotangent) == len(float_arrays(r.output))]
    for start in range(0, len(todo), CHUNK):
        chunk = todo[start:start + CHUNK]
        for name in names:
            driver = get_backend(name)
            for rec in chunk:
                t0 = time.perf_counter()
                try:
                    rec.evaluations[name] = rec.evaluate(driver)
                except Exception as exc:  # one backend failing on one layer is that layer's note, not the case's end
                    rec.errors[name] = short_error(exc)
                rec.seconds[name] = time.perf_counter() - t0
        for rec in chunk:
            _judge(rec, rules)
            if not keep and rec.verdict == "agree":
                rec.drop()


def _first_pass(res, names: list[str], keep: bool) -> list[str]:
    """The backends every layer is replayed on: those the model's verdict blames, and the cheapest one it does
    not (a backend that does not compile first, then the reference order).

    A wrong backward in one layer shows as that layer's blamed backend against any right one, so the other
    backends are replayed only where the first pass disagrees (``_localise``).  Every backend replays every
    layer when that cannot be known: a disagreeing leaf nobody is blamed for, every backend blamed, a model that
    agrees (``per_layer``), or every call's arrays kept (``keep_replays``).
    """
    off = [leaf for leaf in res.leaves if leaf.verdict in OFF and leaf.role != "referee"]
    blamed = _blamed(res)
    if keep or not off or any(not leaf.blame for leaf in off) or all(b in blamed for b in names):
        return list(names)
    clear = min((b for b in names if b not in blamed), key=lambda b: (get_backend(b).compiles, reference_rank(b)))
    return sorted([b for b in names if b in blamed] + [clear], key=reference_rank)


def _blamed(res) -> set[str]:
    return {b for leaf in res.leaves if leaf.verdict in OFF for b in leaf.blame}


def _judge(rec: LayerCall, rules: ToleranceRules) -> None:
    evs = rec.evaluations
    rec.grads, rec.forward = [], []  # judged afresh when a later pass adds backends
    ran = sorted(evs, key=reference_rank)
    rec.replayed = len(ran) >= 2
    if not rec.replayed:
        return
    paths: list[str] = []
    for ev in evs.values():
        paths += [p for p in ev.grads if p not in paths]
    scale = 0.0
    for ev in evs.values():
        for g in ev.grads.values():
            a = np.abs(np.asarray(g, np.float64))
            if a.size:
                scale = max(scale, float(np.max(a, where=np.isfinite(a), initial=0.0)))
    for p in paths:
        role = "param" if not p.startswith((rec.input_prefix, rec.kwargs_prefix)) else "input"
        leaf = compare_leaf(p, role, {b: evs[b].grads.get(p, MISSING) for b in ran}, dtype="float64", rules=rules,
                            layer=rec.layer, case_scale=scale)
        rec.grads.append(verdict.decide(leaf, ran))
    n_out = len(float_arrays(rec.output))
    for k in range(n_out):
        path = f"{rec.name}:output" + ("" if n_out == 1 else f".{k}")
        leaf = compare_leaf(path, "output", {b: _nth_float(evs[b].value[1], k) for b in ran}, dtype="float64",
                            rules=rules, layer=rec.layer)
        rec.forward.append(verdict.decide(leaf, ran))
    for p in evs[ran[0]].buffers:
        values = {b: evs[b].buffers.get(p, MISSING) for b in ran}
        if all(v is not MISSING and np.asarray(v).dtype.kind == "f" for v in values.values()):
            leaf = compare_leaf(p, "buffer", values, dtype="float64", rules=rules, layer=rec.layer)
            rec.forward.append(verdict.decide(leaf, ran))


def _nth_float(value, k):
    arrays = float_arrays(value)
    return arrays[k] if k < len(arrays) else MISSING


# ---------------------------------------------------------------- the layer's own referee
def _layer_referee(rec: LayerCall, leaves: list[LeafResult], names: list[str], rules: ToleranceRules,
                   seed: int, eps: float = ref.EPS) -> int:
    """Float64 central differences of the layer alone for ``leaves``; re-decides their blame.  Returns passes."""
    args, prefixes = rec.replay_args()
    point_leaves = {leaf.path: leaf for a, p in zip(args, prefixes) for leaf in leaves_with_paths(a, p)}
    wanted = [leaf for leaf in leaves if leaf.path in point_leaves and leaf.verdict == "disagree"]
    if not wanted:
        return 0

    def evaluate(replaced):
        new = [replace_leaves(a, replaced, p) for a, p in zip(args, prefixes)]
        return _layer_loss(*new)

    with kinks.recording() as reference:
        loss, out = evaluate({})
    loss_abs = float(sum(np.sum(np.abs(np.asarray(o) * np.asarray(c)))
                         for o, c in zip(float_arrays(out), rec.cotangent)))

    def loss64(replaced):
        with kinks.recording(hold=reference) as got:
            value = float(evaluate(replaced)[0])
        return value, kinks.differing(reference, got)

    point = {leaf.path: np.asarray(point_leaves[leaf.path].value, np.float64) for leaf in wanted}
    dirs = ref.directions(point, seed)
    grads = {b: ev.grads for b, ev in rec.evaluations.items()}
    passes = 0
    for leaf in wanted:
        rtol = rules.resolve(leaf.path, "float64", rec.layer).referee_rtol
        checks, n = ref.check(loss64, point, {leaf.path: dirs[leaf.path]}, grads, rtol, loss_abs, eps=eps)
        passes += n
        verdict.decide(leaf, names, checks)
    return passes


# ---------------------------------------------------------------- 4. the origin
def disagrees(res) -> bool:
    """Whether a case has something to localise: a float64 leaf the backends do not agree on."""
    return any(leaf.verdict in OFF for leaf in res.leaves)


def check(cr, runs: dict, options, res) -> None:
    """The check's entry point (``gradcheck.check.checks``): ``localise``, its result kept on the case's
    ``CaseRun.localisation`` for the checks after it.  A failure of the replay itself is a note on the
    case, never the case's end (the check is registered so)."""
    cr.localisation = localise(cr, runs, res, options)


def localise(cr, runs: dict, res, options) -> Localisation | None:
    """Replay each layer alone on every backend in ``runs``; set ``res.origin`` and mark inherited leaves.

    Runs when the case disagrees, or always with ``options.per_layer``; returns what the replay found
    (None when it did not run).
    """
    if not (options.per_layer or disagrees(res)):
        return None
    names = sorted(runs, key=reference_rank)
    if len(names) < 2:
        res.notes.append(f"per-layer replay: needs two backends, only {', '.join(names) or 'none'} ran")
        return None
    return _localise(cr, names, res, options.rules or ToleranceRules(), options.keep_replays)


@runtime_checkable
class RecordsItsCalls(Protocol):
    """A model that records its own calls as replay units (a torch module: its submodule calls in its graph)."""

    def record_calls(self, cr) -> tuple[list[LayerCall], list[str]]: ...


def _localise(cr, names, res, rules, keep: bool) -> Localisation:
    t0 = time.perf_counter()
    if isinstance(cr.model, RecordsItsCalls):
        calls, notes = cr.model.record_calls(cr)
        res.notes.extend(notes)
        loc = Localisation(calls=calls, backends=list(names))
        loc.seconds["record"] = time.perf_counter() - t0
    else:
        calls = record(cr)
        loc = Localisation(calls=calls, backends=list(names))
        loc.seconds["record"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cotangents(cr, calls)
        loc.seconds["cotangents"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    first = _first_pass(res, names, keep)
    layers = [c for c in calls if c.unit == "layer"]
    _replay(layers, first, rules, keep)
    deepest = max((c for c in layers if c.vjp_off()), key=lambda c: c.start, default=None)
    # Blocks hold the code between layers; only those starting after the deepest disagreeing layer can
    # hold a deeper origin (see the module doc).
    blocks = [c for c in calls if c.unit == "block" and (deepest is None or c.start > deepest.start)]
    if disagrees(res):
        _replay(blocks, first, rules, keep)
    rest = [n for n in names if n not in first]
    if rest:  # every backend where the first pass found something: the origin's verdict is the full one
        _replay([c for c in calls if c.replayed and c.verdict != "agree"], rest, rules, keep)
        res.notes.append(f"per-layer replay: every layer on {verdict.joined(first)} (the model's verdict blames "
                         f"{verdict.joined(b for b in first if b in _blamed(res))}); {verdict.joined(rest)} only where they disagree")
    loc.seconds["replay"] = time.perf_counter() - t0
    replayed = [c for c in calls if c.replayed]
    failed = [f"{c.name}: {b} failed ({c.errors[b].splitlines()[0]})" for c in calls for b in c.errors]
    if failed:
        res.notes.append("per-layer replay: " + "; ".join(failed)[:2000])
    if not disagrees(res):
        off = [c for c in replayed if c.verdict != "agree"]
        res.notes.append(f"per-layer replay: {len(replayed)} layers replayed alone on {', '.join(names)}; " + (
            "every layer's own backward and forward agree" if not off else
            "the model agrees, but these layers alone do not: " + ", ".join(f"{c.name} ({c.verdict})" for c in off)))
        return loc
    if not replayed:  # no origin can be named from nothing: the model itself is not blamed for it
        res.origin = _found_origin(cr, res)
        res.notes.append(f"per-layer replay: no layer could be replayed alone on {', '.join(names)}, so no "
                         "origin is named" + (" by a replay" if res.origin else ""))
        return loc
    vjp = [c for c in replayed if c.vjp_off()]
    t0 = time.perf_counter()
    if vjp:
        origin = max(vjp, key=lambda c: c.start)
        passes = _layer_referee(origin, origin.vjp_off(), names, rules, cr.case.seed, cr.eps)
        res.referee_passes += passes
        res.origin = _vjp_origin(origin, names)
    else:
        fwd = [c for c in replayed if c.forward_off()]
        origin = min(fwd, key=lambda c: c.end, default=None)
        res.origin = _forward_origin(origin, replayed, cr, res)
    loc.seconds["referee"] = time.perf_counter() - t0
    found = _found_origin(cr, res)
    if found is not None:
        res.origin, origin = found, None
    loc.origin_call = origin
    _mark_inherited(res, loc, origin)
    n_blocks = sum(1 for c in replayed if c.unit == "block")
    res.notes.append(
        f"per-layer replay: {len(replayed) - n_blocks} layers and {n_blocks} blocks replayed alone on "
        f"{', '.join(names)} in {sum(loc.seconds.values()):.1f} s; "
        + (f"origin {res.origin.kind} at {res.origin.path or '(model)'}" if res.origin else "no origin")
        + f", {sum(1 for leaf in res.leaves if leaf.inherited)} leaves inherit it")
    return loc


def _found_origin(cr, res) -> Origin | None:
    """The origin the model's own checks found on the reference forward, where the case's verdict blames the
    backend it names, or None.

    A from_torch graph's torch kernel found wrong (``TorchModule.found_origin``): every difference of torch's
    follows from that node, which the replay of whole submodules cannot see once the kernel's values have moved
    what torch's own forward hands on.
    """
    found = getattr(cr.model, "found_origin", None)
    found = found() if callable(found) else None
    return found if found is not None and set(found.blame) & set(_blame_of(res)) else None


def _blame_of(res) -> list[str]:
    """The backends the case's disagreeing leaves blame."""
    return sorted({b for leaf in res.leaves if leaf.verdict in OFF for b in leaf.blame}, key=reference_rank)


def _blame(leaves: list[LeafResult]) -> list[str]:
    return sorted({b for leaf in leaves for b in leaf.blame}, key=reference_rank)


def _short(leaf: LeafResult, prefix: str) -> str:
    """A replay leaf's name within its layer: ``weight``, ``input.0``, ``output``."""
    for sep in (".", ":"):
        if prefix and leaf.path.startswith(prefix + sep):
            return leaf.path[len(prefix) + 1:]
    return leaf.path.rsplit(":", 1)[-1] if ":" in leaf.path else leaf.path


def _vjp_origin(c: LayerCall, names) -> Origin:
    off = c.vjp_off()
    blame = _blame(off)
    which = ", ".join(_short(leaf, c.path) for leaf in off)
    worst = max(off, key=lambda leaf: leaf.headroom)
    kernels = LAYER_KERNELS.get(c.layer)
    op = c.op or LAYER_OPS.get(c.layer, "")
    who = (f"{', '.join(blame)}'s" if blame else "the backends'")
    msg = (f"{c.name} ({c.layer}): {who} own backward of this layer disagrees when it is replayed alone on the "
           f"float64 reference's inputs and output cotangent ({len(off)} of {len(c.grads)} gradients off: {which})"
           f"; {worst.message}")
    if kernels:
        msg += f" (the layer's own framework ops: {', '.join(kernels)})"
    if c.unit == "block":
        msg += "; every layer inside it agrees alone, so the code between them (its own __call__) is where it starts"
    if c.source:
        msg += f"; {c.source}"
    if c.custom_backwards and "torch" in blame:
        msg += (f"; torch's gradient here comes from the backward of the custom autograd.Function "
                f"{', '.join(c.custom_backwards)} that this call applies, while the tape and jax differentiate its "
                "forward: a backward that is not its forward's derivative (a wrong one, or a straight-through "
                "estimator or gradient reversal by design) is found here")
        if any(f.startswith("CheckpointFunction ") for f in c.custom_backwards):
            msg += ("; CheckpointFunction is torch.utils.checkpoint(use_reentrant=True), which recomputes the "
                    "segment in its backward: the parameters inside get no gradient when none of the segment's "
                    "tensor inputs requires one (torch warns \"None of the inputs have requires_grad=True\"; "
                    "checkpoint with use_reentrant=False, or make an input require a gradient, transformers: "
                    "enable_input_require_grads()), and a wrong one when the recompute differs from the forward "
                    "(state that the forward changes)")
    return Origin(path=c.path, layer=c.layer, kind="vjp", blame=blame, op=op, message=msg)


def _forward_origin(c: LayerCall | None, replayed, cr, res) -> Origin:
    if c is None:
        root = type(cr.model).__name__
        blame = _blame_of(res)
        return Origin(path="", layer=root, kind="vjp", blame=blame, message=(
            f"no layer's own backward or forward disagrees when replayed alone ({len(replayed)} replayed); the "
            f"disagreement comes from code outside every replayed layer: the model's own code between its layers "
            f"({root}'s __call__ or forward) or the case's forward function"))
    off = c.forward_off()
    blame = _blame(off)
    worst = max(off, key=lambda leaf: leaf.headroom)
    msg = (f"forward divergence at {c.name} ({c.layer}): no layer's own backward disagrees when replayed alone, "
           f"but on identical float64 inputs this layer's {', '.join(_short(leaf, c.path) for leaf in off)} differs "
           f"between backends ({worst.message}); every gradient difference follows from the forward values")
    return Origin(path=c.path, layer=c.layer, kind="forward", blame=blame, op=LAYER_OPS.get(c.layer, ""), message=msg)


def _mark_inherited(res, loc: Localisation, origin: LayerCall | None) -> None:
    """A disagreeing model leaf whose own layer's replay agrees on it only inherits the origin's error."""
    if res.origin is None or origin is None:
        return
    # Model leaf path -> its replays by the innermost layer owning it (every call of that layer): a nested
    # layer (MultiheadAttention's out_proj) is replayed inside its parent's replay too.
    own: dict[str, list[tuple[LayerCall, LeafResult]]] = {}
    for c in loc.calls:
        if c.replayed and c.unit == "layer":
            for leaf in c.grads + c.forward:
                if leaf.role in ("param", "buffer"):
                    mine = own.setdefault(leaf.path, [])
                    depth = c.path.count(".")
                    if mine and mine[0][0].path.count(".") < depth:
                        mine.clear()
                    if not mine or mine[0][0].path.count(".") == depth:
                        mine.append((c, leaf))
    forward = res.origin.kind == "forward"
    for leaf in res.leaves:
        if leaf.verdict != "disagree" or leaf.role == "referee":
            continue
        if leaf.role in ("param", "buffer"):
            found = own.get(leaf.path)
            if not found:
                # No replayed layer owns it (the model's own code uses it, as GPT slices its position table):
                # with an origin found, a second error in that code is the less likely reading.
                leaf.inherited = True
                continue
            if any(mine.verdict in OFF for _, mine in found):
                continue
            first = min(c.start for c, _ in found)
            if forward or first < origin.end:  # before the origin, or inside it (a block's own layers)
                leaf.inherited = True
        elif leaf.role == "input":
            if origin.path and not _fed_directly(loc, origin, leaf.path):
                leaf.inherited = True
        elif leaf.role == "output" and forward and origin.path:
            leaf.inherited = True


def _fed_directly(loc: Localisation, origin: LayerCall, path: str) -> bool:
    """Whether the origin's own input gradient is off and the origin is the first layer (it took the model input)."""
    first = min((c for c in loc.calls if c.unit == "layer"), key=lambda c: c.start, default=None)
    return origin is first and any(leaf.role == "input" and leaf.verdict in OFF for leaf in origin.grads)


# ---------------------------------------------------------------- inputs handed to a backend stay unchanged
def snapshot(args, prefixes) -> dict[str, np.ndarray]:
    """A copy of every array leaf of ``args`` by path: what ``check_unchanged`` compares against."""
    return {leaf.path: np.array(ops.to_numpy(leaf.value), copy=True) for leaf in all_leaves(args, prefixes)}


class Widened(Mapping):
    """A float32 ``snapshot`` read as the snapshot of the same arguments widened to float64, one leaf at a time.

    A float32 case's float64 arguments are its float32 ones widened exactly
    (``runner.CaseRun``), so a second, float64 snapshot would be a copy of
    every parameter that says nothing the float32 one does not; each leaf is
    widened when it is read instead (what ``cast_floats`` does to it).
    """

    def __init__(self, narrow: dict[str, np.ndarray]):
        self._narrow = narrow

    def __getitem__(self, path: str) -> np.ndarray:
        v = self._narrow[path]
        return v.astype(np.float64) if v.dtype.kind == "f" else v

    def stored(self, path: str) -> tuple[np.ndarray, np.dtype]:
        """The float32 snapshot of a leaf as stored, and the dtype it stands for (compared without widening it)."""
        v = self._narrow[path]
        return v, np.dtype(np.float64) if v.dtype.kind == "f" else v.dtype

    def __iter__(self):
        return iter(self._narrow)

    def __len__(self) -> int:
        return len(self._narrow)


def check_unchanged(before, after_args, prefixes) -> list[str]:
    """Leaves of ``after_args`` that differ from ``before`` (a ``snapshot`` taken before the call): one line each.

    Call it with the snapshot taken before a backend's ``evaluate`` and the
    arguments after it: a backend that writes into the arrays it was handed,
    or reassigns a field of the caller's module, is reported.  ``before``
    may also be a (deep-copied) argument tuple with the same prefixes.
    """
    if not isinstance(before, Mapping):
        before = snapshot(before, prefixes)
    after = {leaf.path: leaf.value for leaf in all_leaves(after_args, prefixes)}
    problems = []
    for path in before:
        if path not in after:
            problems.append(f"{path}: gone after the call (the field was set to None or removed)")
            continue
        old, dtype = before.stored(path) if isinstance(before, Widened) else (before[path], before[path].dtype)
        new = np.asarray(ops.to_numpy(after[path]))
        if new.shape != old.shape or new.dtype != dtype:
            problems.append(f"{path}: was {dtype}{list(old.shape)}, is {new.dtype}{list(new.shape)} after the call")
            continue
        # One comparison pass (a float32 snapshot against float64 values widens exactly, element by element);
        # only arrays that differ there are looked at again for NaNs that stayed NaNs (four passes more).
        if np.array_equal(new, old):
            continue
        old = before[path]
        nan = old.dtype.kind in "fc"
        if nan and np.array_equal(new, old, equal_nan=True):
            continue
        differs = ~((new == old) | (np.isnan(new) & np.isnan(old))) if nan else new != old
        count = int(np.count_nonzero(differs))
        flat = int(np.flatnonzero(differs)[0])
        where = [int(i) for i in np.unravel_index(flat, old.shape)]
        problems.append(f"{path}: {count} of {old.size} elements changed by the call (first at {where}: "
                        f"{old.ravel()[flat]!r} -> {new.ravel()[flat]!r}); the backend wrote into an array it was "
                        "handed, which every other backend then sees")
    for path in after:
        if path not in before:
            problems.append(f"{path}: appeared during the call (a field that was None was assigned)")
    return problems


def restored(args, before: dict, prefixes) -> tuple:
    """``args`` rebuilt from ``before`` (a ``snapshot``): what the next backend gets after one changed them."""
    return tuple(replace_leaves(a, {path: np.array(v, copy=True) for path, v in before.items()}, p)
                 for a, p in zip(args, prefixes, strict=True))
