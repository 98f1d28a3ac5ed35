"""The gradcheck Module standing for a torch module: its leaves by torch's names, and one call that dispatches.

``TorchModule`` mirrors the torch module's tree (one gradcheck module per
torch submodule, named after its class), with every parameter a ``param``
leaf and every buffer a ``buffer`` leaf at the path torch gives it, so the
runner, the reports and tolerance rules (``layer = "BatchNorm2d"``) see
torch's names.  A tied tensor is one leaf, at its first name.

Calling it dispatches on what its leaves hold:

* torch tensors (the torch backend): the user's module itself, with the
  leaves bound by ``torch.func.functional_call``, under torch autograd;
* tape tensors, jax arrays (the tape and jax backends) and numpy arrays
  (the reference forward, the referee): the exported ATen graph, each node
  lowered to ``gradcheck.ops``.

Dropout in training mode multiplies by the case's mask on every path: the
graph's dropout nodes take mask ``k`` in graph order, and on torch a
function mode replaces the ``k``-th ``F.dropout`` (and the dropout of
``F.scaled_dot_product_attention``) with the same mask, since no torch
dropout takes a given one.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from gradcheck import module as gmodule
from gradcheck.check import conditioning, cost, kinks
from gradcheck.check.tolerance import ToleranceRules
from gradcheck.frontends.torch import capture, interpreter, references, reuse, units
from gradcheck.frontends.torch.eager import (
    TorchFacts,
    backend_of_values,
    call_torch,
    float_dtype_of,
)
from gradcheck.frontends.torch.facts import CaseFacts
from gradcheck.module import Module, node_class, static
from gradcheck.tree import join, leaves_with_paths, owner_of

# How close a graph read from the capture cache must come to the module's own float64 forward, relative to the
# output's scale: far looser than float64's rounding of a decomposition, far tighter than another computation.
CACHE_CHECK_RTOL = 1e-6

_RESERVED = frozenset(dir(Module)) | {"training", "_frozen", "_program", "_dropout_seed", "_unit", "record_calls",
                                      "found_notes", "found_origin", "run_notes"}


class TorchModule(Module):
    """The root: a torch module as a gradcheck Module (made by ``gradcheck.from_torch``)."""

    _program: object = static()
    _dropout_seed: int = static()
    _unit: object = static()  # set on a replay's copy: one recorded call of the module (export.units.UnitCall)

    def __init__(self):
        raise TypeError("a TorchModule is made by gradcheck.from_torch(module, *inputs), not directly")

    def __call__(self, *inputs):
        if self._unit is not None:
            return self._unit(self, inputs)
        return self._program.call(self, inputs)

    def record_calls(self, cr) -> list:
        """Each submodule call as a replay unit, recorded at the case point (``gradcheck.check.localise``)."""
        return units.record(self._program, cr)

    def found_origin(self):
        """The origin a torch kernel found wrong on the reference forward names, or None: the first such node's
        module, a forward divergence blamed on torch (``capture.Graph.kernel_faults``)."""
        from gradcheck.results import Origin

        for graph in self._program.graphs():
            for node in graph.nodes:
                if node.name in graph.kernel_faults:
                    path, kind = capture.module_of(node)
                    return Origin(path=path, layer=kind, kind="forward", blame=["torch"], op=capture.op_name(node),
                                  message=f"forward divergence at {path or '(model)'} ({kind}): torch's own kernel "
                                          f"computes something else: {graph.kernel_faults[node.name]}")
        return None

    def run_notes(self) -> list[str]:
        """What torch's runs found that the case's notes must say: a recompute inside the backward that drew
        anew or wrote a buffer again (``randomness.Draws.recomputed``)."""
        return [message for graph in self._program.graphs() for message in graph.draws.recomputed]

    def found_notes(self) -> list[str]:
        """What the graph checks found on the run's first float64 call that the case's notes must say: a torch
        kernel found wrong (``capture.Graph.kernel_faults``)."""
        return [f"torch's own kernel is likely wrong: {why}" for graph in self._program.graphs()
                for why in graph.kernel_faults.values()]


class TorchSubmodule(Module):
    """One torch submodule's parameters, buffers and children; called alone only as a replay unit."""

    _unit: object = static()

    def __init__(self):
        raise TypeError("a TorchSubmodule is made by gradcheck.from_torch, not directly")

    def __call__(self, *inputs):
        if self._unit is None:
            raise TypeError(f"{type(self).__name__} is a part of a torch module's tree; call the root (the case's "
                            "model), or replay a recorded call (gradcheck.check.localise)")
        return self._unit(self, inputs)


class Program:
    """Everything one ``from_torch`` call captured: the module, its graphs per mode, its outputs' names."""

    def __init__(self, wrapper, example_inputs: tuple, decompose: str, name: str, device=None,
                 references: dict | None = None):
        self.wrapper = wrapper
        self.references = references or {}  # custom op -> its reference function (export.references)
        self.device = device  # where the module's own tensors live (the numpy path's torch forward runs there)
        self.example_inputs = example_inputs
        self.decompose = decompose
        self.name = name
        self._graphs: dict[bool, capture.Graph] = {}
        self._outputs: dict[bool, tuple[list[str], list[bool]]] = {}
        self._watch = None  # (node, value) -> value, while a replay records or probes the graph (``watching``)

    @contextlib.contextmanager
    def watching(self, watch):
        """Inside the block the graph's runs pass every node's value through ``watch(node, value)``."""
        previous, self._watch = self._watch, watch
        try:
            yield
        finally:
            self._watch = previous

    # -- capture, on demand per mode -------------------------------------------
    def graphs(self) -> list:
        """The graphs captured so far (train mode's, eval mode's)."""
        return list(self._graphs.values())

    def graph(self, training: bool) -> capture.Graph:
        if training not in self._graphs:
            self._capture(training)
        return self._graphs[training]

    def _capture(self, training: bool, cached: bool = True) -> capture.Graph:
        """Export (or read from the capture cache) the graph of one mode, and the eager output's leaves.

        A graph read from the cache is used only if torch, running it node by
        node, computes what the module's own forward computes (``_cache_mismatch``);
        otherwise its entry is deleted and the module exported afresh.
        """
        import time

        from gradcheck.frontends.torch import capture_cache

        t0 = time.perf_counter()
        lowerings = references.lowerings(self.references, training, self.decompose)
        where = capture_cache.folder() if cached else None
        name = capture_cache.key(self.wrapper, self.example_inputs, training, self.decompose,
                                 self.references) if where else None
        graph = None
        loaded = capture_cache.load(name, where) if name else None
        if loaded is not None:
            ep, held = loaded
            self.wrapper.held.update(held)
            self.wrapper.__dict__["_held_probed"] = True
            graph = capture.read_graph(ep, self.wrapper, len(self.example_inputs), training, lowerings)
            graph.entry, graph.from_cache = (name, where), True
            why = self._cache_mismatch(graph, training)
            if why:
                capture_cache.discard(name, where, why)
                graph = None
        if graph is None:
            ep = capture.export(self.wrapper, self.example_inputs, training, self.decompose, self.name)
            if name and not isinstance(ep, capture._Traced):  # a graph traced at the example is not an export
                capture_cache.store(name, where, ep, self.wrapper.held)
            graph = capture.read_graph(ep, self.wrapper, len(self.example_inputs), training, lowerings)
            graph.entry = (name, where) if name and not isinstance(ep, capture._Traced) else None
        graph.export_s = time.perf_counter() - t0
        names, floats = capture.example_outputs(self.wrapper, self.example_inputs, training)
        if len(names) != graph.user_outputs:
            raise capture.CaptureError(
                f"{self.name}: the module returns {len(names)} leaves but its graph {graph.user_outputs}; "
                "return tensors (in a tuple, list, dict or registered dataclass)")
        if not any(floats):
            raise capture.CaptureError(
                f"{self.name} returns no float tensor ({', '.join(names) or 'nothing'}); a gradient check "
                "needs one: return the logits (or the loss), or pass forward= that does")
        self._graphs[training] = graph
        self._outputs[training] = (names, floats)
        return graph

    def _cache_mismatch(self, graph, training: bool) -> str:
        """Why a graph read from the capture cache is not the module's (its outputs, run by torch node by node in
        float64, differ from the module's own float64 forward), or "".  Both take the same draws (seed 0)."""
        import torch
        from torch.utils import _pytree as pytree

        from gradcheck.frontends.torch.eager import TorchFacts

        def f64(t):
            return t.detach().cpu().double().numpy() if t.is_floating_point() else t.detach().cpu().numpy()

        user = self.wrapper.module
        values = {n: f64(t) for n, t in list(user.named_parameters()) + list(user.named_buffers())}
        inputs = tuple(f64(x) for x in self.example_inputs)
        try:
            outs = interpreter.torch_run(graph, self._placeholders(graph, values, inputs, np.float64),
                                         CaseFacts(0, graph))
            state = {join(capture.ROOT, p): torch.from_numpy(np.array(v)).to(self.device) for p, v in values.items()}
            with torch.no_grad():
                module = pytree.tree_leaves(call_torch(self.wrapper, state, tuple(self._tensor(x) for x in inputs),
                                                       {}, training, TorchFacts.of(0, graph.draws)))
        except Exception as exc:  # noqa: BLE001 - a graph that cannot be checked is not used
            return f"it could not be checked against the module ({type(exc).__name__}: {str(exc)[:200]})"
        graph_user = [v for (kind, _), v in zip(graph.outputs, outs) if kind == "output"]
        if len(graph_user) != len(module):
            return f"its graph returns {len(graph_user)} outputs, the module {len(module)}"
        for k, (want, got) in enumerate(zip(module, graph_user)):
            if not isinstance(want, torch.Tensor):
                continue
            a, b = want.detach().cpu().numpy(), got.detach().cpu().numpy()
            if a.shape != b.shape:
                return f"output {k} has shape {b.shape} in its graph, {a.shape} in the module"
            if a.dtype.kind != "f":
                if not np.array_equal(a, b):
                    return f"output {k} differs from the module's"
                continue
            scale = max(1.0, float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)))
            if not np.allclose(b, a, rtol=0.0, atol=CACHE_CHECK_RTOL * scale, equal_nan=True):
                return (f"output {k} differs from the module's float64 forward by up to "
                        f"{float(np.nanmax(np.abs(b - a))):.3g} (scale {scale:.3g})")
        return ""

    def output_names(self, training: bool) -> list[str]:
        self.graph(training)
        names, floats = self._outputs[training]
        return [n or "output" for n, f in zip(names, floats) if f]

    # -- the tree of leaves -------------------------------------------------------
    def tree(self, seed: int) -> TorchModule:
        """A fresh gradcheck tree holding the torch module's current parameter and buffer values."""
        user = self.wrapper.module
        params = {id(p): n for n, p in user.named_parameters()}
        buffers = {id(b): n for n, b in user.named_buffers()}

        def make(mod, prefix, base):
            fields, values, frozen = [], {}, set()
            for kind, table, owned in (("param", params, mod._parameters), ("buffer", buffers, mod._buffers)):
                for name, t in owned.items():
                    path = join(prefix, name)
                    if t is None or table.get(id(t)) != path:
                        continue  # None (a disabled bias), or a tied alias: its leaf is at its first name
                    fields.append((name, kind))
                    values[name] = _numpy(t)
                    if kind == "param" and not t.requires_grad:
                        frozen.add(name)
            for name, sub in mod._modules.items():
                if sub is None:
                    continue
                fields.append((name, "child"))
                values[name] = make(sub, join(prefix, name), TorchSubmodule)
            for name, _ in fields:
                if name in _RESERVED:
                    raise TypeError(
                        f"{self.name}: {join(prefix, name)!r} has the name of a gradcheck Module attribute; "
                        "rename it in the torch module (or wrap the module) to check it")
            obj = object.__new__(node_class(type(mod).__name__, base, tuple(fields), __name__))
            for name, value in values.items():
                object.__setattr__(obj, name, value)
            if frozen:
                obj._frozen = frozen
            obj.training = mod.training
            return obj

        root = make(user, "", TorchModule)
        root._program = self
        root._dropout_seed = int(seed)
        return root

    # -- calls ------------------------------------------------------------------
    def call(self, root: TorchModule, inputs: tuple):
        values = {leaf.path: leaf.value for leaf in leaves_with_paths(root)}
        backend = backend_of_values(list(values.values()) + list(inputs))
        training = bool(root.training)
        graph = self.graph(training)
        if backend == "torch":
            return self._select(training, self._call_torch(root, values, inputs, training))
        if backend == "numpy":
            if not graph.verified:
                self._verify(root, graph, values, inputs)
                graph = self.graph(training)  # a graph from the capture cache that failed a check: the fresh one
            if graph.problems or graph.unfaithful:
                # The tape and jax cannot run this graph; the referee still can, on torch's float64 forward.
                return self._select(training, self._call_torch_numpy(root, values, inputs, training))
            try:
                return self._select(training, self._call_graph(root, graph, values, inputs))
            except interpreter.UnsupportedOp:
                # A lowering that refuses at this point only: the referee's step wrote two different values at
                # one position where the case's point wrote equal ones (max_unpool of overlapping windows).  The
                # function is torch's there as everywhere, and torch's float64 forward computes it.
                return self._select(training, self._call_torch_numpy(root, values, inputs, training))
        outs = self._call_graph(root, graph, values, inputs)
        return self._select(training, [_on_the_tape(v) for v in outs] if backend == "tape" else outs)

    def _select(self, training: bool, leaves: list):
        names, floats = self._outputs[training]
        picked = [v for v, f in zip(leaves, floats) if f]
        return picked[0] if len(picked) == 1 else tuple(picked)

    def _placeholders(self, graph, values, inputs, floats) -> dict:
        out = {}
        for name, b in graph.inputs.items():
            if b.kind in ("param", "buffer"):
                out[name] = values[b.target]
            elif b.kind == "constant":
                v = b.value
                out[name] = v.astype(floats) if v.dtype.kind == "f" else v
            else:
                out[name] = inputs[b.index]
        return out

    def _mask(self, root, graph) -> CaseFacts:
        return CaseFacts(root._dropout_seed, graph)

    def _call_graph(self, root, graph, values, inputs) -> list:
        floats = float_dtype_of(list(values.values()) + list(inputs))
        layer_of = _layers(root) if gmodule._calls is not None else None
        placeholders = self._placeholders(graph, values, inputs, floats)
        keep, reused = self._reuse(root, graph, placeholders, floats)
        outs = interpreter.run(graph, placeholders, floats, self._mask(root, graph), layer_of, self._watch, keep, reused)
        user = [None] * graph.user_outputs
        for (kind, target), value in zip(graph.outputs, outs):
            if kind == "output":
                user[target] = value
            elif kind == "buffer":
                owner, field = owner_of(root, target)
                setattr(owner, field, value)  # the drivers read updated buffers from the fields
        return user

    def _reuse(self, root, graph, placeholders: dict, floats):
        """``(keep, reuse)`` for ``interpreter.run``: a float64 reference forward keeps its node values in its
        kink recording; a pass made under that recording reuses those no moved leaf reaches (``reuse``)."""
        state = kinks.active()
        if self._watch is not None or np.dtype(floats) != np.float64 or state is None or state.mode != "record":
            return None, None
        if state.hold is None:
            kept = reuse.Kept(graph, root._dropout_seed, placeholders)
            state.recording.kept.append(kept)
            return kept, None
        kept = next((k for k in state.hold.kept if k.graph is graph), None)
        if kept is None or not kept.whole or kept.seed != root._dropout_seed:
            return None, None
        return None, (kept, kept.reusable(placeholders))

    def _verify(self, root, graph, values, inputs) -> None:
        """Check each lowering against torch's op once, in float64, outside the caller's counting and kinks."""
        floats = float_dtype_of(list(values.values()) + list(inputs))
        if floats != np.float64:
            return  # only a float64 run can tell a wrong lowering from rounding
        with cost.counting(), kinks.suspended():
            found, faults = interpreter.verify(graph, self._placeholders(graph, values, inputs, floats),
                                               self._mask(root, graph))
            graph.problems.update(found)
            graph.kernel_faults.update(faults)
            # A kernel of torch's found wrong makes the module differ from the graph by design: the graph is the
            # one that computes the ops, so it is not held to the module.
            if not graph.problems and not graph.kernel_faults:
                graph.unfaithful = self._unfaithful(root, graph, values, inputs)
        graph.verified = True
        if graph.entry and (found or graph.unfaithful):
            # An entry whose graph fails a check is never used again; one read from the cache gives way to a
            # fresh capture, which is checked in its turn and decides the case.
            from gradcheck.frontends.torch import capture_cache

            capture_cache.discard(*graph.entry, "the lowering check or the float64 graph-against-module check "
                                                "found something")
            graph.entry = None
            if graph.from_cache:
                self._verify(root, self._capture(graph.training, cached=False), values, inputs)

    def _unfaithful(self, root, graph, values, inputs) -> str:
        """Why the whole graph's float64 forward differs from the module's, or "".

        Every node can match torch's op while the graph still differs from the
        module: a decomposition traced in float32 keeps the values it computed
        then (``F.rms_norm``'s default eps is float32's machine epsilon in the
        captured graph, float64's in the module run in float64).  The tape and
        jax would then agree with each other and with the referee, which runs
        the same graph, and torch would be blamed for being right.
        """
        outs = interpreter.run(graph, self._placeholders(graph, values, inputs, np.float64), np.float64,
                               self._mask(root, graph))
        graph_user = [v for (kind, _), v in zip(graph.outputs, outs) if kind == "output"]
        import torch

        module_user = self._module_outputs(root, values, inputs)
        # Held to what the output comparison tolerates: a graph closer to the module than that cannot move a
        # verdict, and a deep network's float64 rounding, amplified by BatchNorm over a few values, can reach
        # far past a single op's.  Where the point amplifies rounding further still, the module's own forward
        # with every value moved by a unit roundoff says how far float64 reaches there (gradcheck.check.conditioning).
        tol = ToleranceRules().resolve("output", "float64")
        reach = None
        for k, (t, lo) in enumerate(zip(module_user, graph_user)):
            # An output the lowering does not compute (a kernel's saved statistics, ``Unavailable``) holds nothing
            # to compare: the node-by-node check has judged its node already.
            if not isinstance(t, torch.Tensor) or lo is None or isinstance(lo, interpreter.Unavailable):
                continue
            want = t.detach().cpu().numpy()
            why = interpreter._differ(t, lo, rtol=math.inf) or _beyond(want, np.asarray(lo), tol)
            # Only a difference in value can lie within float64's reach: a shape or dtype is not rounding.
            if why and t.is_floating_point() and np.shape(want) == np.shape(lo):
                if reach is None:
                    moved_values = {**values, **conditioning.perturbed(_floats(values), root._dropout_seed)}
                    moved = self._module_outputs(root, moved_values, inputs)
                    reach = [conditioning.spread(a.detach().cpu().numpy(), b.detach().cpu().numpy())
                             if isinstance(a, torch.Tensor) and a.is_floating_point() else 0.0
                             for a, b in zip(module_user, moved)]
                if conditioning.spread(want, np.asarray(lo)) <= conditioning.SPREAD_FACTOR * reach[k]:
                    continue  # within float64's reach at this point: rounding alone moves the module this far
            if why:
                return (f"the exported graph's float64 forward differs from the module's at output {k} ({why}), "
                        "although every node's lowering matches torch's op: torch's decomposition kept a value "
                        "computed at the capture's dtype (float32); torch alone is checked, against the referee "
                        "on the module's own float64 forward")
        return ""

    def _module_outputs(self, root, values, inputs) -> list:
        """The torch module's own float64 forward at ``values`` (numpy), without gradients."""
        import torch

        tvalues = {p: self._tensor(v) for p, v in values.items()}
        with torch.no_grad():
            return self._call_torch(root, tvalues, tuple(self._tensor(x) for x in inputs), bool(root.training))

    def _tensor(self, v):
        import torch

        return torch.from_numpy(np.array(v, copy=True)).to(self.device) if isinstance(v, np.ndarray) else v

    def _call_torch(self, root, values, inputs, training) -> list:
        from torch.utils import _pytree as pytree

        state = {join(capture.ROOT, path): v for path, v in values.items()}
        graph = self.graph(training)
        facts = TorchFacts.of(root._dropout_seed, graph.draws)
        out = call_torch(self.wrapper, state, tuple(inputs), {}, training, facts)
        return pytree.tree_leaves(out)

    def _call_torch_numpy(self, root, values, inputs, training) -> list:
        """The torch module's float64 forward on numpy values (for the referee when the graph cannot run)."""
        import torch

        tvalues = {p: self._tensor(v) for p, v in values.items()}
        tinputs = tuple(self._tensor(x) for x in inputs)
        with torch.no_grad():
            leaves = self._call_torch(root, tvalues, tinputs, training)
        for leaf in leaves_with_paths(root):
            if leaf.kind == "buffer":
                owner, field = owner_of(root, leaf.path)
                setattr(owner, field, tvalues[leaf.path].cpu().numpy())
        return [v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v for v in leaves]


def _on_the_tape(v):
    """A float output no leaf reaches (a piecewise-constant graph: floor, sign, a fill) comes out of the lowerings as
    numpy: on the tape, a constant, whose gradient is zero there as on torch and jax.  The tape itself refuses a loss
    off the tape, which a user's own loss function gets by mistake (np.sum for ops.sum)."""
    from gradcheck.backends.tape import tape

    if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype.kind == "f":
        return tape.Tensor(np.asarray(v))
    return v


def _beyond(want: np.ndarray, got: np.ndarray, tol) -> str:
    """Where ``got`` leaves the float64 output tolerance around ``want`` (elementwise), or ""."""
    if want.dtype.kind != "f":
        return ""
    finite = np.isfinite(want)
    w, g = want[finite].astype(np.float64), got[finite].astype(np.float64)
    if not w.size:
        return ""
    diff = np.abs(g - w)
    allowed = tol.rtol * np.abs(w) + tol.absolute(float(np.max(np.abs(w))))
    bad = diff > allowed
    if not bad.any():
        return ""
    return (f"{int(bad.sum())} of {w.size} elements beyond the float64 tolerance, max |difference| "
            f"{float(diff.max()):.3g} where max |torch| is {float(np.max(np.abs(w))):.3g}")


def _floats(values: dict) -> dict:
    return {p: v for p, v in values.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"}


def _numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def _layers(root):
    """node -> the gradcheck submodule it was traced in, for kink reports (only while someone listens)."""
    by_path = {"": root}

    def walk(node, path):
        for name, kind, _ in node.field_kinds():
            if kind == "child":
                sub = getattr(node, name)
                by_path[join(path, name)] = sub
                walk(sub, join(path, name))

    walk(root, "")
    return lambda fx_node: by_path.get(capture.module_of(fx_node)[0])
