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
import functools
import math
from dataclasses import dataclass

import numpy as np

from gradcheck import module as gmodule
from gradcheck import ops
from gradcheck.backends import backend_of
from gradcheck.check import conditioning
from gradcheck.check.tolerance import ToleranceRules
from gradcheck.frontends.torch import capture, interpreter, randomness
from gradcheck.frontends.torch.facts import CaseFacts
from gradcheck.module import Module, buffer, child, param, static
from gradcheck.tree import join, leaves_with_paths, owner_of

_RESERVED = frozenset(dir(Module)) | {"training", "_frozen", "_program", "_dropout_seed", "_unit", "record_calls"}


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
        from gradcheck.frontends.torch import units

        return units.record(self._program, cr)


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


_classes: dict = {}


def _node_class(name: str, base: type, fields: tuple[tuple[str, str], ...]) -> type:
    """A Module class named after the torch class, with these fields (cached per layout)."""
    key = (name, base, fields)
    if key not in _classes:
        make = {"param": param, "buffer": buffer, "child": child}
        namespace = {"__annotations__": {f: "object" for f, _ in fields}, "__module__": __name__,
                     "__qualname__": name}
        namespace.update({f: make[kind]() for f, kind in fields})
        _classes[key] = type(name, (base,), namespace)
    return _classes[key]


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
    def graph(self, training: bool) -> capture.Graph:
        if training not in self._graphs:
            import time

            t0 = time.perf_counter()
            ep = capture.export(self.wrapper, self.example_inputs, training, self.decompose, self.name)
            graph = capture.read_graph(ep, self.wrapper, len(self.example_inputs), training, self.references,
                                       self.decompose)
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
        return self._graphs[training]

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
            obj = object.__new__(_node_class(type(mod).__name__, base, tuple(fields)))
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
        backend = _backend(list(values.values()) + list(inputs))
        training = bool(root.training)
        graph = self.graph(training)
        if backend == "torch":
            return self._select(training, self._call_torch(root, values, inputs, training))
        if backend == "numpy":
            if not graph.verified:
                self._verify(root, graph, values, inputs)
            if graph.problems or graph.unfaithful:
                # The tape and jax cannot run this graph; the referee still can, on torch's float64 forward.
                return self._select(training, self._call_torch_numpy(root, values, inputs, training))
        return self._select(training, self._call_graph(root, graph, values, inputs))

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
        floats = _float_dtype(list(values.values()) + list(inputs))
        layer_of = _layers(root) if gmodule._calls is not None else None
        outs = interpreter.run(graph, self._placeholders(graph, values, inputs, floats), floats,
                               self._mask(root, graph), layer_of, self._watch)
        user = [None] * graph.user_outputs
        for (kind, target), value in zip(graph.outputs, outs):
            if kind == "output":
                user[target] = value
            elif kind == "buffer":
                owner, field = owner_of(root, target)
                setattr(owner, field, value)  # the drivers read updated buffers from the fields
        return user

    def _verify(self, root, graph, values, inputs) -> None:
        """Check each lowering against torch's op once, in float64, outside the caller's counting and kinks."""
        from gradcheck.check import cost, kinks

        floats = _float_dtype(list(values.values()) + list(inputs))
        if floats != np.float64:
            return  # only a float64 run can tell a wrong lowering from rounding
        with cost.counting(), kinks.suspended():
            found = interpreter.verify(graph, self._placeholders(graph, values, inputs, floats),
                                       self._mask(root, graph))
            graph.problems.update(found)
            if not graph.problems:
                graph.unfaithful = self._unfaithful(root, graph, values, inputs)
        graph.verified = True

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
            if not isinstance(t, torch.Tensor):
                continue
            want = t.detach().cpu().numpy()
            why = interpreter._differ(t, lo, rtol=math.inf) or _beyond(want, np.asarray(lo), tol)
            if why and t.is_floating_point():
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
        facts = _TorchFacts(root._dropout_seed, graph.draws.expected)
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


@dataclass
class _TorchFacts:
    """The random draws a torch call makes (dropout's among them), as numbers of the whole graph's."""

    seed: int
    draws: list  # (op, kind, shape) of each draw it makes, in order
    draw_indices: list | None = None  # their numbers in the whole graph (None: 0, 1, 2 ...)
    recorded: dict | None = None  # when given: "random_values" handed out, in order


def call_torch(module, state: dict, args: tuple, kwargs: dict, training: bool, facts: _TorchFacts):
    """``module(*args, **kwargs)`` under torch with ``state`` bound (``functional_call``), as the case runs it.

    In ``training`` mode (restored after), with the case's dropout masks and
    random draws (``facts``, dropout's among them).  A module's own float constants
    (``torch.zeros(...)``, ``torch.tensor(0.5)`` in its forward) take the
    default dtype, and its casts name a float dtype (T5's and Llama's RMSNorm
    compute in ``.to(torch.float32)``): in a float64 run both are float64, as
    in the graph, whose float dtypes are the run's.
    """
    import torch

    # The inputs are the drivers' leaves: an in-place op of the module on an input must not touch them.
    clones: dict[int, object] = {}

    def clone(x):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return clones.setdefault(id(x), x.clone())
        return x

    args = tuple(clone(x) for x in args)
    kwargs = {k: clone(v) for k, v in kwargs.items()}
    was = [m.training for m in module.modules()]
    module.train(training)
    default = torch.get_default_dtype()
    floats = {v.dtype for v in list(state.values()) + list(args) + list(kwargs.values())
              if isinstance(v, torch.Tensor) and v.is_floating_point()}
    run_dtype = torch.float64 if floats == {torch.float64} else None
    try:
        if run_dtype is not None:
            torch.set_default_dtype(run_dtype)
        with TorchFunctions(run_dtype), \
                randomness.CaseRandom(facts.seed, facts.draws, facts.draw_indices, facts.recorded) as draws:
            out = torch.func.functional_call(module, state, args, kwargs, tie_weights=True, strict=False)
        draws.finish()
    finally:
        torch.set_default_dtype(default)
        for m, flag in zip(module.modules(), was):
            m.training = flag
    return out


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


def _backend(values) -> str:
    for v in values:
        b = backend_of(v)
        if b not in (None, "numpy"):
            return b
    return "numpy"


def _float_dtype(values) -> np.dtype:
    for v in values:
        if hasattr(v, "dtype") and np.dtype(ops.dtype_of(v)).kind == "f":
            return np.dtype(ops.dtype_of(v))
    return np.dtype(np.float32)


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


class TorchFunctions:
    """On torch, the function-level part of the case's run: the run's float dtype, and the pinned kinks.

    A ``TorchFunctionMode``.  In a float64 run, every float dtype a call
    names (``.float()``, ``.to(torch.float32)``, ``dtype=torch.float32``)
    becomes float64, as in the graph, whose float dtypes are the run's.

    While a float32 run is pinned to the float64 reference's kinks
    (``gradcheck.check.kinks``), relu and max pooling go through ``gradcheck.ops``
    too, which runs torch's own kernel and takes the reference's branch only
    where torch's differs; unpinned, torch would land on the other side of
    ResNet-18's near-zero relu inputs and its float32 error would measure
    that, not rounding.  The reference recorded the graph's kink ops in
    graph order; a module whose other kink ops (clamp, maximum) are not
    intercepted here misaligns the sequence, which the pin detects
    (``KinkMismatch``), and the run is repeated unpinned with a note.

    (The random draws, dropout's included, are the dispatch level's:
    ``randomness.CaseRandom``.)
    """

    def __init__(self, run_dtype=None):
        from torch.overrides import TorchFunctionMode

        outer = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return outer._handle(func, args, kwargs or {})

        from gradcheck.check import kinks

        state = kinks.active()
        self.pinning = state is not None and state.mode == "pin"
        self._mode = _Mode()
        self.run_dtype = run_dtype  # every float dtype a call names becomes this one (None: as the module says)

    def __enter__(self):
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)

    def _handle(self, func, args, kwargs):
        import torch.nn.functional as F

        if self.run_dtype is not None:
            if func in _float_casts():
                return args[0].to(self.run_dtype)
            args, kwargs = _run_dtype(args, self.run_dtype), {k: _run_dtype(v, self.run_dtype) for k, v in kwargs.items()}
        if self.pinning and any(func is f for f in _relus()):
            return ops.relu(args[0] if args else kwargs["input"])
        if self.pinning and func is F.max_pool2d:
            names = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
            bound = _bind(names, (None, None, None, 0, 1, False, False), args, kwargs)
            if bound["dilation"] in (1, (1, 1), [1, 1]) and not bound["return_indices"]:
                from gradcheck.frontends.torch.aten import max_pool2d_ceil

                return max_pool2d_ceil(bound["input"], bound["kernel_size"], bound["stride"] or bound["kernel_size"],
                                       bound["padding"], bool(bound["ceil_mode"]))
        return func(*args, **kwargs)


@functools.cache
def _float_casts() -> tuple:
    """The tensor methods that cast to one fixed float dtype."""
    import torch

    return (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.double)


def _run_dtype(value, run_dtype):
    """``value`` with every float torch dtype in it (nested in tuples and lists too) replaced by ``run_dtype``."""
    import torch

    if isinstance(value, torch.dtype):
        return run_dtype if value.is_floating_point else value
    if type(value) in (tuple, list):  # plain ones only: a named tuple or torch.Size holds no dtype to replace
        return type(value)(_run_dtype(v, run_dtype) for v in value)
    return value


@functools.cache
def _relus() -> tuple:
    """The relu entry points a torch module calls, as the function mode sees them."""
    import torch
    import torch.nn.functional as F

    return (F.relu, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_)


def _bind(names, defaults, args, kwargs) -> dict:
    bound = dict(zip(names, defaults))
    bound.update(zip(names, args))
    bound.update(kwargs)
    return bound
