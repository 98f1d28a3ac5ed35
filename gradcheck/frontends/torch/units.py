"""A torch module's submodule calls as replay units: where inside the user's module a disagreement starts.

``gradcheck.check.localise`` replays each layer alone on every backend, at the
point the float64 reference reached it, and finds the one whose own
backward disagrees.  For a torch module the layers are its submodules, and
each backend runs a call its own way: torch runs the submodule itself (the
user's code, its ``autograd.Function`` backwards and custom kernels), the
tape and jax run that call's part of the exported graph.

1. **Units.**  Every node of the graph carries the stack of module calls it
   was traced in (``nn_module_stack``; a module's second call is
   ``path@1``).  A call's nodes, the values that flow into them from outside
   (its *inputs*), the parameters and buffers they read, and the values that
   leave them (its *outputs*) make one unit.
2. **Record.**  One float64 forward of the graph on numpy keeps every unit's
   input and output values; one float64 forward of the module itself under
   torch, with a hook on every submodule, keeps each call's arguments and
   return value.  Each tensor argument is matched to the unit input it is
   (by value: the two forwards agree to rounding), each unit output to the
   returned tensor it is, so torch's call and the graph's nodes are given the
   same values and named the same way.
3. **Cotangents.**  One float64 backward on the tape, with a zero probe added
   to every unit output, gives the cotangent arriving at each.
4. **Replay.**  ``UnitCall`` is the call as a gradcheck layer: on torch it
   calls the submodule (``functional_call`` on the unit's leaves) with the
   recorded arguments, the matched ones replaced by the replay's inputs; on
   the tape, jax and numpy it runs the unit's nodes.  Dropout masks and
   random draws are the ones the whole forward gave those nodes.

A unit whose outputs cannot all be matched to what the submodule returns
(a value that leaves it through an attribute) is not replayed, and the
case's notes say so.
"""

from __future__ import annotations

import copy
import enum
import operator
from dataclasses import dataclass, field

import numpy as np

from gradcheck.frontends.torch import capture, interpreter, randomness
from gradcheck.frontends.torch.eager import (
    TorchFacts,
    backend_of_values,
    call_torch,
    custom_backwards,
    float_dtype_of,
)
from gradcheck.frontends.torch.facts import CaseFacts
from gradcheck.tree import leaves_with_paths, owner_of

# How far a torch argument may sit from the graph value it is matched to, relative to the value's scale:
# the module's own float64 forward and the graph's differ by rounding alone, many orders below this.
MATCH_RTOL = 1e-6
LOOSE_RTOL = 1e-2  # ... and as far as this, where it is the only candidate that close (see _closest)
AMBIGUOUS = 100.0


@dataclass
class Unit:
    """One submodule call in the graph."""

    key: str  # the nn_module_stack key, "L__self__module.blocks.3@1"
    path: str  # the submodule's path in the user's module, "blocks.3"
    call: int  # which call of that submodule (0: the first)
    cls: str  # its class name
    parent: str | None  # the enclosing call's key
    nodes: list = field(default_factory=list)  # its call_function nodes, in graph order
    own: list = field(default_factory=list)  # those traced in no deeper call (the module's own code)
    inputs: list = field(default_factory=list)  # nodes from outside that its nodes read (not params/buffers/constants)
    leaves: dict = field(default_factory=dict)  # placeholder name -> leaf path, for the params and buffers it reads
    constants: list = field(default_factory=list)  # constant placeholders it reads
    outputs: list = field(default_factory=list)  # its nodes whose values are used outside it, in graph order
    buffers: dict = field(default_factory=dict)  # buffer path -> the node of its new value (a running statistic)
    first: int = 0  # graph position of its first node
    last: int = 0


def units_of(graph: capture.Graph) -> dict[str, Unit]:
    """Every submodule call of the graph, keyed by its nn_module_stack key, in the order the calls start."""
    units: dict[str, Unit] = {}
    position = {n: i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        # The first entry is gradcheck's wrapper (path ""), the second the user's module itself (``module``).
        stack = [(k, v) for k, v in (node.meta.get("nn_module_stack") or {}).items() if v[0]]
        parent = None
        for depth, (key, (path, kind)) in enumerate(stack):
            unit = units.get(key)
            if unit is None:
                kind = kind if isinstance(kind, str) else getattr(kind, "__qualname__", str(kind))
                unit = units[key] = Unit(key=key, path=capture.strip(path), call=_call_index(key),
                                         cls=kind.rsplit(".", 1)[-1], parent=parent, first=position[node])
            unit.nodes.append(node)
            unit.last = position[node]
            if depth == len(stack) - 1:
                unit.own.append(node)
            parent = key
    out_node = next(n for n in graph.nodes if n.op == "output")
    from torch.fx.node import map_arg

    graph_outputs: list = []
    map_arg(out_node.args[0], graph_outputs.append)
    buffer_of = {n: target for (kind, target), n in zip(graph.outputs, graph_outputs) if kind == "buffer"}
    # A mutation the check does not compare (a parameter renormalised in place): not a value the unit hands on.
    ignored = {n for (kind, _), n in zip(graph.outputs, graph_outputs) if kind == "ignore"}
    for unit in units.values():
        inside = set(unit.nodes)
        for node in unit.nodes:
            for arg in node.all_input_nodes:
                if arg in inside or arg in unit.inputs or arg.name in unit.leaves or arg in unit.constants:
                    continue
                binding = graph.inputs.get(arg.name) if arg.op == "placeholder" else None
                if binding is not None and binding.kind in ("param", "buffer"):
                    unit.leaves[arg.name] = binding.target
                elif binding is not None and binding.kind == "constant":
                    unit.constants.append(arg)
                else:
                    unit.inputs.append(arg)
        for node in unit.nodes:
            if node.target is not operator.getitem and _is_tuple(node):
                continue  # a multi-output op: its getitem nodes carry the values
            outside = [u for u in node.users if u not in inside]
            if node in buffer_of:
                unit.buffers[buffer_of[node]] = node
            if node in buffer_of or node in ignored:
                outside = [u for u in outside if u is not out_node]
            if outside:
                unit.outputs.append(node)
    return units


def _call_index(key: str) -> int:
    _, _, n = key.rpartition("@")
    return int(n) if "@" in key and n.isdigit() else 0


def _is_tuple(node) -> bool:
    return isinstance(node.meta.get("val"), (tuple, list))


def _val(node):
    return node.meta.get("val")


def first_own_node(unit: Unit, graph: capture.Graph):
    """The op of the unit's own code to name: a custom op if it calls one (a kernel of the model library's
    own is the likelier culprit), else the first node computing a float value from its inputs (not a view, a
    counter such as BatchNorm's ``num_batches_tracked``, or a constant); None if there is none."""
    custom = [n for n in unit.own if n.op == "call_function" and not capture.op_name(n).startswith("aten.")
              and n.target is not operator.getitem]
    if custom:
        return custom[0]
    for node in unit.own:
        name = capture.op_name(node)
        val = _val(node)
        if node.target is operator.getitem or name in _BOOKKEEPING or node.name in graph.constants:
            continue
        if not (hasattr(val, "dtype") and val.dtype.is_floating_point) and not _is_tuple(node):
            continue
        return node
    return None


_BOOKKEEPING = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.alias.default",
                          "aten.clone.default", "aten.permute.default", "aten.t.default", "aten.expand.default",
                          "aten.unsqueeze.default", "aten.squeeze.dim", "aten._to_copy.default",
                          "aten.detach.default", "aten._assert_tensor_metadata.default"})


# ---------------------------------------------------------------- matching torch's call to the unit
def _distance(a: np.ndarray, b: np.ndarray) -> float:
    """How far apart two values are, relative to ``b``'s scale (0 for equal integers, inf when incomparable)."""
    if a.shape != b.shape or (a.dtype.kind == "f") != (b.dtype.kind == "f"):
        return float("inf")
    if a.dtype.kind != "f":
        return 0.0 if np.array_equal(a, b) else float("inf")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        same = np.array_equal(np.isfinite(a), np.isfinite(b)) and np.allclose(
            a[np.isfinite(a)], b[np.isfinite(b)], rtol=0, atol=0) if a.size else True
        return 0.0 if same and np.array_equal(a[~np.isfinite(a)], b[~np.isfinite(b)]) else float("inf")
    scale = float(np.max(np.abs(b), initial=0.0))
    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def match(candidates: list, values: dict, tensors: list) -> list[int | None]:
    """For each torch tensor, the index of the candidate node whose recorded value it is (None: no match)."""
    arrays = [values.get(node.name) for node in candidates]
    return [_closest(np.asarray(t), arrays) for t in tensors]


def _closest(target: np.ndarray, arrays: list) -> int | None:
    """The index of the array in ``arrays`` that ``target`` is, or None.

    Within MATCH_RTOL of its scale, the closest; further (a point that
    amplifies float64's rounding, where two forwards of one module differ by
    1e-4), the closest only while it is unambiguous: within ``LOOSE_RTOL``,
    and every other candidate ``AMBIGUOUS`` times further away.
    """
    distances = sorted((_distance(np.asarray(a), target), i) for i, a in enumerate(arrays) if a is not None)
    distances = [d for d in distances if np.isfinite(d[0])]
    if not distances:
        return None
    best, index = distances[0]
    if best <= MATCH_RTOL:
        return index
    runner_up = distances[1][0] if len(distances) > 1 else np.inf
    return index if best <= LOOSE_RTOL and runner_up >= AMBIGUOUS * best else None


# ---------------------------------------------------------------- the unit as a layer call
class UnitCall:
    """One recorded submodule call, callable as a layer: ``unit(sub, inputs)`` with ``sub`` the unit's leaves.

    ``sub`` is a copy of the gradcheck tree at the submodule's path (its
    parameters and buffers on the backend that runs), ``inputs`` the values
    of the unit's matched inputs, in order.  Returns the unit's outputs, in
    order.
    """

    def __init__(self, program, graph, unit: Unit, matched: list, free: dict, slots: list, spec, picks: list,
                 foreign: dict, seed: int, training: bool):
        self.program = program
        self.graph = graph
        self.unit = unit
        self.matched = matched  # the unit's input nodes the torch call's arguments are, in order
        self.free = free  # node name -> recorded value: inputs no argument carries (a value read from elsewhere)
        self.slots = slots  # per flattened torch argument: ("input", j) | ("const", tensor) | ("static", value)
        self.spec = spec  # the torch call's (args, kwargs) pytree spec
        self.picks = picks  # per unit output: which flattened tensor of torch's return value it is
        self.foreign = foreign  # name in the submodule -> float64 value: a tied parameter owned elsewhere
        self.seed = seed
        self.training = training
        self._signature: tuple | None = None

    # -- identity: two calls that compute the same function of their leaves and inputs are equal, so jax compiles
    # their replay once (ResNet-18's blocks of one stage, a transformer's layers)
    def signature(self) -> tuple:
        if self._signature is None:
            self._signature = _structure(self)
        return self._signature

    def __hash__(self):
        return hash(self.signature())

    def __eq__(self, other):
        return isinstance(other, UnitCall) and (other is self or other.signature() == self.signature())

    def __call__(self, sub, inputs):
        values = [leaf.value for leaf in leaves_with_paths(sub)] + list(inputs)
        if backend_of_values(values) == "torch":
            return self._torch(sub, inputs)
        return self._graph(sub, inputs)

    # -- torch: the submodule itself
    def _torch(self, sub, inputs):
        import torch
        from torch.utils import _pytree as pytree

        module = self.program.wrapper.module
        if self.unit.path:
            module = module.get_submodule(self.unit.path)
        state = {leaf.path: leaf.value for leaf in leaves_with_paths(sub)}
        like = next(iter(state.values()), inputs[0] if inputs else None)
        for name, value in self.foreign.items():
            state[name] = torch.as_tensor(value, dtype=_float_of(state, inputs), device=like.device)
        args, kwargs = pytree.tree_unflatten(_arguments(self.slots, inputs), self.spec)
        graph = self.graph
        draws = [graph.draws.index[n.name] for n in self.unit.nodes if n.name in graph.draws.index]
        facts = TorchFacts.of(self.seed, graph.draws, draws)
        out = call_torch(module, state, tuple(args), dict(kwargs), self.training, facts)
        leaves = [t for t in pytree.tree_leaves(out)]
        return tuple(leaves[i] for i in self.picks)

    # -- the tape, jax, numpy: the unit's nodes
    def _graph(self, sub, inputs):
        values = {leaf.path: leaf.value for leaf in leaves_with_paths(sub)}
        floats = float_dtype_of(list(values.values()) + list(inputs))
        prefix = self.unit.path + "." if self.unit.path else ""
        env: dict = {}
        for node in self.unit.inputs:
            if node in self.matched:
                env[node] = inputs[self.matched.index(node)]
            else:
                env[node] = _cast(self.free[node.name], floats)
        for name, target in self.unit.leaves.items():
            node = self._placeholder(name)
            if target.startswith(prefix) and target[len(prefix):] in values:
                env[node] = values[target[len(prefix):]]
            else:
                env[node] = _cast(self.free[name], floats)
        for node in self.unit.constants:
            env[node] = _cast(self.graph.inputs[node.name].value, floats)
        interpreter.execute(self.graph, self.unit.nodes, env, floats, CaseFacts(self.seed, self.graph))
        for target, node in self.unit.buffers.items():
            if target.startswith(prefix):
                owner, name = owner_of(sub, target[len(prefix):])
                setattr(owner, name, env[node])  # the drivers read updated buffers from the fields
        return tuple(env[o] for o in self.unit.outputs)

    # -- a reproducer of this call (gradcheck.repro)
    def write_replay(self, where, rec) -> dict:
        """``module.pt`` (the submodule, pickled by its import path), ``call.pt`` (the call at the case point) and
        the replay script; returns what ``meta.json`` adds."""
        import importlib.resources
        import inspect

        import torch

        module = self.program.wrapper.module
        if self.unit.path:
            module = module.get_submodule(self.unit.path)
        state = {leaf.path: torch.from_numpy(np.array(leaf.value, dtype=np.asarray(leaf.value).dtype))
                 for leaf in leaves_with_paths(rec.module)}
        state.update({name: torch.from_numpy(np.array(v)) for name, v in self.foreign.items()})
        inputs = [torch.from_numpy(np.array(x)) for x in rec.args]
        slots = [(kind, v) for kind, v in self.slots]
        graph = self.graph
        draws = [graph.draws.index[n.name] for n in self.unit.nodes if n.name in graph.draws.index]
        recorded: dict = {}
        facts = TorchFacts.of(self.seed, graph.draws, draws, recorded)
        from torch.utils import _pytree as pytree

        args, kwargs = pytree.tree_unflatten(_arguments(slots, inputs), self.spec)
        with torch.no_grad():
            call_torch(module, state, tuple(args), dict(kwargs), self.training, facts)
        saved = {"slots": slots, "spec": self.spec, "picks": self.picks, "training": self.training,
                 "state": state, "inputs": inputs, "random_values": recorded.get("random_values", [])}
        torch.save(saved, where / "call.pt")
        problem = ""
        try:
            torch.save(copy.deepcopy(module), where / "module.pt")
        except Exception as exc:  # a hook or attribute that pickle cannot store (a lambda)
            problem = (f"the submodule could not be pickled ({type(exc).__name__}: {exc}); the script cannot load it "
                       "until it can")
        script = importlib.resources.files("gradcheck.frontends.torch.templates") / "replay_torch_module.py"
        (where / "repro_torch.py").write_text(script.read_text(encoding="utf-8"), encoding="utf-8")
        cls = type(module)
        return {"class": cls.__name__, "import_path": f"{cls.__module__}.{cls.__qualname__}",
                "source": inspect.getsourcefile(cls) or "", "random_ops": sorted(randomness.OPS),
                "scripts": ["repro_torch.py"], "unsupported": problem}

    def _placeholder(self, name):
        for node in self.graph.nodes:
            if node.op == "placeholder" and node.name == name:
                return node
        raise KeyError(name)


def _structure(call: UnitCall) -> tuple:
    """Everything a replay's trace reads besides the leaves' and inputs' values: each node's op and arguments
    (graph nodes by their place in the unit), the constants it bakes in (by content), its draws, its outputs."""
    import hashlib

    from torch.fx import Node

    unit, graph = call.unit, call.graph
    local = {n: ("node", i) for i, n in enumerate(unit.nodes)}
    local.update({n: ("input", i) for i, n in enumerate(call.matched)})
    prefix = unit.path + "." if unit.path else ""

    def digest(v):
        a = np.ascontiguousarray(np.asarray(v))
        return ("array", a.shape, str(a.dtype), hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest())

    def ref(x):
        if isinstance(x, Node):
            if x in local:
                return local[x]
            if x.name in unit.leaves:
                target = unit.leaves[x.name]
                return ("leaf", target[len(prefix):]) if target.startswith(prefix) and x.name not in call.free else (
                    "free", digest(call.free[x.name]))
            if x.name in call.free:
                return ("free", digest(call.free[x.name]))
            binding = graph.inputs.get(x.name)
            return ("constant", digest(binding.value)) if binding is not None else ("unknown", x.name)
        if isinstance(x, (list, tuple)):
            return (type(x).__name__, tuple(ref(v) for v in x))
        if isinstance(x, dict):
            return ("dict", tuple((k, ref(v)) for k, v in x.items()))
        return ("value", repr(x))

    nodes = tuple((str(n.target), ref(n.args), ref(n.kwargs), n.name in graph.constants,
                   graph.draws.index.get(n.name), str(getattr(n.meta.get("val"), "dtype", ""))) for n in unit.nodes)
    buffers = tuple(sorted((t[len(prefix):], local[n]) for t, n in unit.buffers.items() if t.startswith(prefix)))
    lowerings = id(graph) if graph.lowerings else None  # a custom op's reference belongs to its graph
    return (nodes, tuple(local[o] for o in unit.outputs), buffers, call.seed, lowerings)


def _cast(value, floats):
    value = np.asarray(value)
    return value.astype(floats) if value.dtype.kind == "f" else value


def _float_of(state, inputs):
    import torch

    for v in list(state.values()) + list(inputs):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.dtype
    return torch.get_default_dtype()


# ---------------------------------------------------------------- recording every call at the case point
def _kind(module, path: str) -> str:
    """"layer" (owns a parameter itself, or has no children) or "block".

    The root is a block too: replayed only when no call inside it disagrees
    (``gradcheck.check.localise``), where its own code between the submodules is
    what is left to name.
    """
    owns = any(p is not None for p in module._parameters.values())
    children = any(m is not None for m in module._modules.values())
    return "layer" if (owns and path) or not children else "block"


def _torch_calls(program, root64, inputs64, training):
    """Every submodule call of torch's own float64 forward at the case point: (path, n) -> (args, spec, outputs,
    the custom autograd.Functions it applies in its own code, not its submodules')."""
    import torch
    from torch.utils import _pytree as pytree

    user = program.wrapper.module
    paths = {id(m): name for name, m in user.named_modules()}
    counts: dict[str, int] = {}
    calls: dict[tuple[str, int], list] = {}
    pending: dict[int, list] = {}
    active: list[list] = []  # the calls under way, innermost last

    def applied(name):
        if active and name not in active[-1][3]:
            active[-1][3].append(name)

    def pre(module, args, kwargs):
        path = paths.get(id(module))
        if path is None:
            return
        n = counts.get(path, 0)
        counts[path] = n + 1
        flat, spec = pytree.tree_flatten((args, kwargs))
        record = [[_as_called(x) for x in flat], spec, None, []]
        calls[(path, n)] = record
        pending.setdefault(id(module), []).append(record)
        active.append(record)

    def post(module, args, kwargs, output):
        stack = pending.get(id(module))
        if stack:
            record = stack.pop()
            record[2] = [_detached(x) for x in pytree.tree_leaves(output)]
            active[:] = [r for r in active if r is not record]

    handles = []
    for m in user.modules():
        handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(m.register_forward_hook(post, with_kwargs=True))
    values = {leaf.path: torch.from_numpy(np.array(leaf.value, copy=True)).to(program.device)
              for leaf in leaves_with_paths(root64)}
    state = {(capture.ROOT + "." + p): v for p, v in values.items()}
    tinputs = tuple(torch.from_numpy(np.array(x, copy=True)).to(program.device) for x in inputs64)
    graph = program.graph(training)
    try:
        with torch.no_grad(), custom_backwards(applied):
            call_torch(program.wrapper, state, tinputs, {}, training,
                       TorchFacts.of(root64._dropout_seed, graph.draws))
    finally:
        for h in handles:
            h.remove()
    return calls


def _detached(x):
    import torch

    return x.detach().clone() if isinstance(x, torch.Tensor) else x


_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), enum.Enum, type, range, slice)


def _as_called(x):
    """An argument of a submodule call as it was when the call was made: a tensor detached and copied, an object
    that is not a plain value copied whole (``_fresh``)."""
    return _fresh(_detached(x))


def _arguments(slots: list, inputs) -> list:
    """A replayed call's flattened arguments (``UnitCall.slots``): the replay's inputs where they go, a fresh copy
    of each stateful argument, the recorded tensors as they are."""
    return [inputs[v] if kind == "input" else _fresh(v) if kind == "static" else v for kind, v in slots]


def _fresh(x):
    """A copy of a stateful argument, for one call: transformers' caches are arguments that a call fills and
    the next call reads (a cross-attention computes its keys once, marks the cache updated, and later calls take
    them from it).  Replayed with the object the forward left behind, or one an earlier replay filled, a call
    reads keys computed elsewhere instead of computing them from its own inputs, and its gradient is another
    function's: Whisper's decoder cross-attention was blamed on torch so.  A value that cannot be copied is
    passed as it is."""
    import torch

    if isinstance(x, (*_IMMUTABLE, torch.dtype, torch.device, torch.Tensor)) or callable(x):
        return x
    try:
        return copy.deepcopy(x)
    except Exception:  # an object holding what cannot be copied (a lock, a file): as it is
        return x


def _numpy(x):
    return x.detach().cpu().numpy()


def record(program, cr) -> tuple[list, list[str]]:
    """Every replayable submodule call of the case's float64 forward, as ``localise.LayerCall`` records.

    Returns the calls, with their inputs, outputs and cotangents, and notes:
    a call that cannot be replayed is left out and a note says why.
    """
    import torch

    from gradcheck.case import cast_floats
    from gradcheck.check import kinks
    from gradcheck.check.localise import LayerCall
    from gradcheck.tree import map_leaves

    root64 = cr.args64[0]
    training = bool(root64.training)
    graph = program.graph(training)
    notes: list[str] = []
    if graph.problems or graph.unfaithful:
        notes.append("per-submodule replay: the tape and jax cannot run this module's graph, so its submodules "
                     "cannot be replayed on them")
        return [], notes
    units = units_of(graph)
    wanted = {n.name for u in units.values() for n in u.inputs + u.outputs}
    values: dict[str, np.ndarray] = {}

    def keep(node, value):
        if node.name in wanted:
            values[node.name] = np.array(value, copy=True)
        return value

    reference = cast_floats(cr.args64, np.float64)
    with program.watching(keep), kinks.suspended():
        cr.forward(*reference)
    calls = _torch_calls(program, root64, cr.args64[1:], training)
    user = program.wrapper.module
    canonical = {id(t): n for n, t in list(user.named_parameters()) + list(user.named_buffers())}
    leaves64 = {leaf.path: leaf.value for leaf in leaves_with_paths(root64)}

    built: dict[str, tuple] = {}  # unit key -> (LayerCall, Unit)
    for key, unit in units.items():
        module = user.get_submodule(unit.path) if unit.path else user
        kind = _kind(module, unit.path)
        seen = calls.get((unit.path, unit.call))
        if seen is None or seen[2] is None:
            notes.append(f"per-submodule replay: {unit.path or '(model)'} call {unit.call + 1} is in the graph but "
                         "torch's own forward made no such call; not replayed")
            continue
        flat, spec, out_flat, functions = seen
        tensors = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        found = match(unit.inputs, values, [_numpy(flat[i]) for i in tensors])
        matched: list = []
        slots: list = [("static", x) for x in flat]
        for i, j in zip(tensors, found):
            if j is None:
                slots[i] = ("const", flat[i])
                continue
            node = unit.inputs[j]
            if node not in matched:
                matched.append(node)
            slots[i] = ("input", matched.index(node))
        out_arrays = [_numpy(x) if isinstance(x, torch.Tensor) else None for x in out_flat]
        picks = [_closest(values[o.name], out_arrays) if o.name in values else None for o in unit.outputs]
        if any(p is None for p in picks):
            lost = [o.name for o, p in zip(unit.outputs, picks) if p is None]
            moved = (f" (torch's own forward is moved by its kernel found wrong at node "
                     f"{', '.join(sorted(graph.kernel_faults))})" if graph.kernel_faults else "")
            notes.append(f"per-submodule replay: {unit.path or '(model)'} ({unit.cls}) hands values on other than "
                         f"through what it returns (nodes {', '.join(lost[:3])}){moved}; not replayed")
            continue
        free = {n.name: values[n.name] for n in unit.inputs if n not in matched and n.name in values}
        prefix = unit.path + "." if unit.path else ""
        foreign = {}
        for name, target in unit.leaves.items():
            if not target.startswith(prefix):
                free[name] = leaves64[target]
        for rel, t in list(module.named_parameters(remove_duplicate=False)) + list(
                module.named_buffers(remove_duplicate=False)):
            owner = canonical.get(id(t), "")
            if owner and not owner.startswith(prefix) and owner in leaves64:
                foreign[rel] = np.asarray(leaves64[owner], np.float64)
        sub = _subtree(root64, unit.path)
        call = UnitCall(program, graph, unit, matched, free, slots, spec, picks, foreign, root64._dropout_seed,
                        training)
        snapshot = map_leaves(sub, lambda p, v, k: v)
        object.__setattr__(snapshot, "_unit", call)
        rec = LayerCall(index=0, path=unit.path, layer=unit.cls, unit=kind, module=snapshot,
                        args=tuple(values[n.name] for n in matched), kwargs={},
                        output=tuple(values[o.name] for o in unit.outputs), call=unit.call,
                        custom_backwards=list(functions))
        first = first_own_node(unit, graph)
        if first is not None:
            rec.op = capture.spelled(capture.op_name(first))
            what = "the custom op it calls" if not rec.op.startswith("aten::") else "first op of its own code"
            rec.source = f"{what}: {rec.op} (node {first.name}) at {capture.source_line(first)}"
        built[key] = (rec, unit)
    records = _order(built, units)
    _cotangents(program, cr, built)
    return records, notes


def _subtree(root, path: str):
    node = root
    for part in path.split(".") if path else []:
        node = getattr(node, part)
    return node


def _order(built: dict, units: dict) -> list:
    """The calls in start order, with start and end ticks and their enclosing call (the unit tree, by graph order)."""
    children: dict = {}
    for key, (_, unit) in built.items():
        parent = unit.parent
        while parent is not None and parent not in built:  # a call that is not replayed: its parent encloses
            parent = units[parent].parent
        children.setdefault(parent, []).append(key)
    records: list = []
    tick = [0]

    def visit(key, parent_index):
        rec, _ = built[key]
        rec.index, rec.start, rec.parent = len(records), tick[0], parent_index
        tick[0] += 1
        records.append(rec)
        for child in sorted(children.get(key, []), key=lambda k: built[k][1].first):
            visit(child, rec.index)
        rec.end = tick[0]
        tick[0] += 1

    for key in sorted(children.get(None, []), key=lambda k: built[k][1].first):
        visit(key, None)
    return records


def _cotangents(program, cr, built: dict) -> None:
    """Each call's output cotangents from one float64 backward on the tape, through zero probes at the outputs.

    The parameters are constants there: the pass computes no weight
    gradient, only what arrives at each probe (see ``gradcheck.check.localise``).
    """
    from gradcheck import ops
    from gradcheck.backends.tape import tape
    from gradcheck.case import cast_floats
    from gradcheck.check import kinks

    probes: dict[str, object] = {}
    wanted = {o.name for _, unit in built.values() for o in unit.outputs}

    def probe(node, value):
        if node.name not in wanted or np.dtype(ops.dtype_of(value)).kind != "f":
            return value
        p = probes[node.name] = tape.Tensor(np.zeros(ops.shape_of(value), ops.dtype_of(value)), requires_grad=True)
        return ops.add(value, p)

    reference = cast_floats(cr.args64, np.float64)
    with program.watching(probe), kinks.suspended():
        loss = cr.f64(*reference)[0]
    names = list(probes)
    grads = tape.grad(loss, [probes[n] for n in names]) if names and isinstance(loss, tape.Tensor) else []
    by_name = {n: np.asarray(g) for n, g in zip(names, grads)}
    for rec, unit in built.values():
        rec.cotangent = [by_name.get(o.name, np.zeros(np.shape(v))) for o, v in zip(unit.outputs, rec.output)
                         if np.asarray(v).dtype.kind == "f"]
