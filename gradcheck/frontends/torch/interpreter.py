"""Run an exported graph with ``gradcheck.ops``, and check each lowering against torch's own op once.

``run`` walks the graph's nodes in order and calls each node's lowering
(``gradcheck.frontends.torch.aten``) on whatever backend the values are on: tape
tensors (the tape AD), jax arrays or tracers (jax), numpy float64 (the
reference forward and the referee).

``verify`` runs once per graph, on the first float64 numpy forward (the
runner's reference forward): every node is run by torch (the ATen op
itself) and by its lowering on the same inputs, torch's values, and the two
outputs are compared.  A lowering that computes something else than its op
is then gradcheck's bug, named with the node; without this check a wrong
lowering would make the tape, jax and the referee agree among themselves
against torch, and torch would be blamed.
"""

from __future__ import annotations

import functools
import operator

import numpy as np

from gradcheck import module as gmodule
from gradcheck.backends.base import BackendUnavailable
from gradcheck.check import kinks
from gradcheck.check.kinks import KinkMismatch
from gradcheck.frontends.arrays import array_differ
from gradcheck.frontends.torch import capture, randomness, third_opinion
from gradcheck.frontends.torch.aten import (
    LOWERINGS,
    PARTLY_UNINITIALISED,
    LoweringError,
    Unavailable,
)
from gradcheck.ops import BackendOpMissing

# Relative error (max |lowering - torch| / max |torch|) a float64 lowering may have: kernels that sum in
# another order differ by a few ulps times the reduction length, ten thousand times below this.  The
# scale it is relative to is at least that of the op's inputs (``_input_scale``): an output that is
# cancellation noise (a mean of centred values) is rounding of the inputs' size, not of its own.
VERIFY_RTOL = 1e-8
# Magnitudes from here up are a float type's extremes, which masks fill with (finfo.min), not data.
EXTREME = 1e30
# Ops whose values are whatever memory held (torch's) or zeros (the lowering's): only their shape is theirs, and
# what they become (a random fill, an in-place copy) is the next node's to check.
UNINITIALISED = frozenset({"aten.empty.memory_format", "aten.empty.default", "aten.empty_like.default",
                           "aten.new_empty.default", "aten.empty_strided.default", "aten.empty_permuted.default"})


class UnsupportedOp(BackendOpMissing, BackendUnavailable):
    """The graph has an op, or a form of one, the tape and jax cannot run: they are unavailable for the case.

    The torch backend, which runs the module itself, still runs, and so does
    the referee (on torch's float64 forward).
    """


class GraphRunError(RuntimeError):
    """A lowering raised while running a node; the message names the node, its module and source line."""


class Context:
    """What a lowering knows besides its arguments."""

    __slots__ = ("floats", "node", "op", "_mask")

    def __init__(self, floats, mask):
        self.floats = np.dtype(floats)
        self._mask = mask
        self.node = None
        self.op = ""

    def draw(self, kind, shape) -> np.ndarray:
        """This random node's draw from the case seed (``gradcheck.frontends.torch.randomness``)."""
        return self._mask.draw(self.node.name, kind, tuple(shape))


def numpy_dtype(dtype, floats):
    """A torch dtype as numpy's; every float dtype is the run's float dtype."""
    import torch

    if dtype.is_floating_point:
        return np.dtype(floats)
    if dtype == torch.bool:
        return np.dtype(bool)
    return np.dtype(str(dtype).replace("torch.", ""))


def _arguments(node, lookup, floats):
    from torch.fx.node import map_arg

    return _arguments_from(map_arg(node.args, lookup), map_arg(node.kwargs, lookup), floats)


def _unavailable_in(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, Unavailable):
            return v
        if isinstance(v, (list, tuple)):
            found = _unavailable_in(v, {})
            if found is not None:
                return found
    return None


def lowering_of(graph: capture.Graph, op: str):
    """The lowering that runs ``op`` in ``graph``: the graph's own (a custom op's reference), else the table's."""
    own = graph.lowerings.get(op)
    return own if own is not None else LOWERINGS[op]


def run(graph: capture.Graph, values: dict, floats, mask, layer_of=None, watch=None, keep=None, reuse=None) -> list:
    """The graph's outputs, in the order of its output specs, from placeholder values.

    ``watch(node, value) -> value``, when given, sees every node's value as it
    is computed and may replace it (the per-submodule replay records values
    and adds its cotangent probes so).  ``keep`` (a ``reuse.Kept``) keeps every
    node's value and kink calls of a float64 reference forward; ``reuse``,
    ``(kept, names)``, gives the nodes in ``names`` the kept values instead of
    running them (``gradcheck.frontends.torch.reuse``).
    """
    if graph.unfaithful:
        raise UnsupportedOp(graph.unfaithful)
    env: dict = {}
    for node in graph.nodes:
        if node.op == "placeholder":
            env[node] = values[node.name]
            if watch is not None:
                env[node] = watch(node, env[node])
    execute(graph, [n for n in graph.nodes if n.op == "call_function"], env, floats, mask, layer_of, watch, keep, reuse)
    out = next((n for n in graph.nodes if n.op == "output"), None)
    if out is None:
        raise GraphRunError("the graph has no output node")
    if out.name in graph.problems:  # it returns what the lowering does not compute (``_verify``)
        raise UnsupportedOp(graph.problems[out.name])
    from torch.fx.node import map_arg

    return list(map_arg(out.args[0], env.__getitem__))


def execute(graph: capture.Graph, nodes: list, env: dict, floats, mask, layer_of=None, watch=None, keep=None,
            reuse=None) -> dict:
    """Run ``nodes`` (call_function nodes of ``graph``, in graph order) on the values ``env`` holds; fills ``env``.

    ``keep`` and ``reuse``: see ``run``."""
    ctx = Context(floats, mask)
    stack = gmodule.current_calls()
    state = kinks.active() if keep is not None or reuse is not None else None
    kept, names = reuse if reuse is not None else (None, ())
    for node in nodes:
        if node.op != "call_function":
            raise GraphRunError(f"node {node.name}: a {node.op} node; exported graphs have placeholders, "
                                "call_function nodes and one output")
        if node.name in names:
            # The reference's value, and its kink calls in their place in this pass's recording.
            env[node] = kept.values[node.name]
            state.recording.branches.extend(kept.branches[node.name])
            state.held_position += kept.held[node.name]
            continue
        if keep is not None:
            branches, held = len(state.recording.branches), len(state.recording.held)
        if node.target is operator.getitem:
            env[node] = env[node.args[0]][node.args[1]]
        else:
            env[node] = _call(graph, node, env, ctx, stack, layer_of)
        if watch is not None:
            env[node] = watch(node, env[node])
        if keep is not None:
            keep.keep(node, env[node], state.recording.branches[branches:], len(state.recording.held) - held)
    return env


def _call(graph, node, env, ctx, stack, layer_of):
    if node.name in graph.problems:
        raise UnsupportedOp(graph.problems[node.name])
    args, kwargs = _arguments(node, env.__getitem__, ctx.floats)
    missing = _unavailable_in(args, kwargs)
    op = capture.op_name(node)
    if missing is not None:
        raise UnsupportedOp(f"{op} uses {missing.what}, which the lowering does not compute: "
                            f"{capture.where(node)}")
    ctx.node, ctx.op = node, op
    layer = layer_of(node) if layer_of is not None else None
    if layer is not None:
        stack.append(layer)  # kink reports name the layer they happen in
    try:
        if node.name in graph.constants:
            with kinks.suspended():
                return lowering_of(graph, op)(ctx, *args, **kwargs)
        return lowering_of(graph, op)(ctx, *args, **kwargs)
    except (KinkMismatch, kinks.Crossed, UnsupportedOp):
        raise
    except (LoweringError, BackendOpMissing) as exc:
        raise UnsupportedOp(f"{exc} ({capture.where(node)}); {capture.WAYS_TO_LOWER.format(op=capture.spelled(op))}"
                            ) from exc
    except Exception as exc:
        raise GraphRunError(f"{op}, {capture.where(node)}: {type(exc).__name__}: {exc}") from exc
    finally:
        if layer is not None:
            stack.pop()


# ---------------------------------------------------------------- checking the lowerings
def verify(graph: capture.Graph, values: dict, mask) -> tuple[dict[str, str], dict[str, str]]:
    """What running every node by torch and by its lowering on torch's inputs (float64) found: the problems (nodes
    the tape and jax cannot run) and the kernel faults (nodes where torch's reference decomposition sides with the
    lowering against torch's kernel), each by node name."""
    import torch

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # a factory op with no dtype makes the run's floats, as the graph's do
    try:
        return _verify(graph, values, mask)
    finally:
        torch.set_default_dtype(default)


def torch_run(graph: capture.Graph, values: dict, mask) -> list:
    """Every graph output computed by torch's own ops in float64, the random nodes given the case's draws: the
    captured program as torch runs it (``values`` by placeholder name, numpy)."""
    import torch
    from torch.fx.node import map_arg

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        tenv: dict = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                v = values[node.name]
                tenv[node] = torch.from_numpy(np.array(v, copy=True)) if isinstance(v, np.ndarray) else v
            elif node.op == "output":
                return list(map_arg(node.args[0], tenv.__getitem__))
            elif node.target is operator.getitem:
                src, i = node.args
                tenv[node] = tenv[src][i]
            else:
                targs, tkwargs = _torch_arguments(node, tenv)
                if node.name in graph.draws.index:
                    tenv[node] = randomness.torch_value(node.target, targs, tkwargs,
                                                        lambda kind, shape, name=node.name: mask.draw(name, kind, shape))
                else:
                    tenv[node] = node.target(*targs, **tkwargs)
        raise capture.CaptureError("the graph has no output node")
    finally:
        torch.set_default_dtype(default)


def _verify(graph: capture.Graph, values: dict, mask) -> tuple[dict[str, str], dict[str, str]]:
    import torch
    from torch.fx.node import map_arg

    problems: dict[str, str] = {}
    faults: dict[str, str] = {}
    tenv: dict = {}
    lenv: dict = {}  # each node's lowering output, where it has one (to find Unavailable outputs used later)
    ctx = Context(np.float64, mask)
    for node in graph.nodes:
        if node.op == "placeholder":
            v = values[node.name]
            tenv[node] = torch.from_numpy(np.array(v, copy=True)) if isinstance(v, np.ndarray) else v
            lenv[node] = v
            continue
        if node.op == "output":
            # A graph that returns what its lowering does not compute (a kernel's saved statistics) cannot be run
            # by the tape and jax: the module returns it, and only torch computes it.
            returned = map_arg(node.args, lambda n: lenv.get(n))
            missing = _unavailable_in(list(returned[0]) if isinstance(returned[0], (list, tuple)) else [returned[0]],
                                      {})
            if missing is not None:
                problems[node.name] = (f"the module returns {missing.what}, which the lowering does not compute; "
                                       "return the values the model uses")
            break
        if node.target is operator.getitem:
            src, i = node.args
            tenv[node] = tenv[src][i] if tenv[src] is not None else None  # torch could not run the op: nothing
            lo = lenv.get(src)
            lenv[node] = lo[i] if isinstance(lo, (tuple, list)) else None
            continue
        op = capture.op_name(node)
        targs, tkwargs = _torch_arguments(node, tenv)
        try:
            if node.name in graph.draws.index:  # torch's op with the case's draw, as torch's run gets it
                tout = randomness.torch_value(node.target, targs, tkwargs,
                                              lambda kind, shape, name=node.name: mask.draw(name, kind, shape))
            else:
                tout = node.target(*targs, **tkwargs)
        except Exception:  # torch cannot run its own op in float64 here: nothing to hold the lowering to
            tout = None
        if op in PARTLY_UNINITIALISED and tout is not None:  # torch's memory where it writes nothing: the lowering's
            tout = PARTLY_UNINITIALISED[op](node, targs, tout)
        tenv[node] = tout
        if node.name in graph.problems or tout is None:
            lenv[node] = None
            continue
        nargs = map_arg(node.args, lambda n: _to_numpy(tenv[n]))
        nkwargs = map_arg(node.kwargs, lambda n: _to_numpy(tenv[n]))
        used = map_arg(node.args, lambda n: lenv.get(n))
        missing = _unavailable_in(list(used) if isinstance(used, (list, tuple)) else [used], {})
        if missing is not None:
            problems[node.name] = (f"{op} uses {missing.what}, which the lowering does not compute: "
                                   f"{capture.where(node)}")
            lenv[node] = None
            continue
        nargs, nkwargs = _arguments_from(nargs, nkwargs, ctx.floats)
        ctx.node, ctx.op = node, op
        try:
            out = lowering_of(graph, op)(ctx, *nargs, **nkwargs)
        except (LoweringError, BackendOpMissing) as exc:  # a form the table does not lower: said as such
            problems[node.name] = (f"{exc} ({capture.where(node)}); "
                                   + capture.WAYS_TO_LOWER.format(op=capture.spelled(op)))
            lenv[node] = None
            continue
        except Exception as exc:  # torch ran the op on these arguments, so the lowering should have: a bug
            problems[node.name] = (f"the lowering of {op} raised {type(exc).__name__}: {exc}, on arguments torch's "
                                   f"{op} takes ({capture.where(node)}); this is a bug in gradcheck/frontends/torch/aten.py")
            lenv[node] = None
            continue
        lenv[node] = out
        floor = _input_scale(node, tenv)
        why = None if op in UNINITIALISED else _differ(tout, out, floor=floor)
        if why:
            # Either side may be the wrong one; torch's own reference decomposition, where it is independent of
            # the kernel, says which (third_opinion).  A random node's draw is the case's, not the decomposition's.
            opinion = (third_opinion.Opinion(third_opinion.OPEN, "a random op is not judged by a decomposition")
                       if node.name in graph.draws.index else
                       third_opinion.consult(node.target, targs, tkwargs, _to_numpy(tout), out,
                                             functools.partial(_differ, floor=floor)))
            # torch's kernel at fault: the graph the tape and jax run computes the op; the lowering's value goes
            # on (lenv) as every right node's does.
            found = faults if opinion.side == third_opinion.KERNEL_WRONG else problems
            found[node.name] = _disagreement(op, why, capture.where(node), opinion)
    return problems, faults


def _disagreement(op: str, why: str, where: str, opinion) -> str:
    """The lowering check's message for a node whose lowering and torch's kernel disagree, naming the side at
    fault where torch's reference decomposition tells, and both where it cannot."""
    head = f"the lowering of {op} disagrees with torch's {op} ({why}), {where}; "
    if opinion.side == third_opinion.KERNEL_WRONG:
        return (head + f"{opinion.why}, so torch's kernel of {op} is the likely one at fault (a regression in torch, "
                "or a kernel replaced through torch.library): the tape and jax run the op as its decomposition "
                "computes it, and torch's results are expected to disagree with theirs from this node on")
    if opinion.side == third_opinion.LOWERING_WRONG:
        return (head + f"{opinion.why}, so this is a bug in gradcheck/frontends/torch/aten.py (a form of the op it "
                "does not lower should raise LoweringError): the tape and jax cannot check this case until it is fixed")
    return (head + f"either the lowering in gradcheck/frontends/torch/aten.py or torch's kernel of {op} is wrong here "
            f"({opinion.why}): the tape and jax cannot check this case until the two agree")


def _input_scale(node, tenv) -> float:
    """The typical magnitude of a node's float inputs, below which its output's rounding noise is not judged.

    A value computed by cancellation, such as BatchNorm's running mean of an
    already normalised input (9.9e-15 for inputs of size 1), is rounding noise
    of the inputs' size: two correct kernels that sum in another order differ
    there by 1e-22, which is 1e-8 of the value itself, and nothing at the
    inputs' scale.  The typical magnitude (``_typical_magnitude``), not the
    largest: a mask's sentinel is large and adds no noise.
    """
    import torch

    scale = 0.0
    for n in node.all_input_nodes:
        v = tenv.get(n)
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
            scale = max(scale, _typical_magnitude(v.detach().cpu().numpy()))
    return scale


def _typical_magnitude(values: np.ndarray) -> float:
    """The median of the finite, non-zero magnitudes of ``values`` (a subsample's, for a large tensor), float
    extremes (a mask filled with finfo.min) left out; 0.0 when there are none."""
    a = np.abs(values[np.isfinite(values)]).ravel()
    a = a[:: max(1, a.size // 65536)]
    a = a[(a > 0) & (a < EXTREME)]
    return float(np.median(a)) if a.size else 0.0


def _torch_arguments(node, tenv):
    import torch
    from torch.fx.node import map_arg

    def convert(v):
        if isinstance(v, torch.dtype) and v.is_floating_point:
            return torch.float64  # the graph's float dtype is the run's, float64 here
        if isinstance(v, torch.device):
            return torch.device("cpu")  # the check runs on the numpy values' side, whatever the module's device
        if isinstance(v, (list, tuple)):
            return type(v)(convert(x) for x in v)
        return v

    args = convert(map_arg(node.args, tenv.__getitem__))
    kwargs = {k: convert(v) for k, v in map_arg(node.kwargs, tenv.__getitem__).items()}
    return args, kwargs


def _arguments_from(args, kwargs, floats):
    import torch

    def convert(v):
        if isinstance(v, torch.dtype):
            return numpy_dtype(v, floats)
        if isinstance(v, (list, tuple)):
            return type(v)(convert(x) for x in v)
        return v

    return convert(args), {k: convert(v) for k, v in kwargs.items()}


def _to_numpy(v):
    import torch

    if isinstance(v, torch.Tensor):  # as the torch backend reads its tensors (a conjugate view an FFT makes ...)
        from gradcheck.backends.torch import ops as torch_ops

        return torch_ops.to_numpy(v).copy()
    if isinstance(v, (list, tuple)):
        return type(v)(_to_numpy(x) for x in v)
    return v


def _differ(tout, lout, rtol: float = VERIFY_RTOL, floor: float = 0.0) -> str | None:
    """Why a lowering's output differs from torch's (shape, dtype, values), or None.

    Values differ beyond ``rtol`` times the larger of torch's largest
    magnitude and ``floor``, the scale of the op's inputs (``_input_scale``).
    An integer or bool output must have torch's dtype and equal it exactly.
    """
    import torch

    if isinstance(lout, Unavailable) or lout is None:
        return None
    if isinstance(tout, (tuple, list)):
        if not isinstance(lout, (tuple, list)) or len(lout) != len(tout):
            return f"torch returns {len(tout)} values, the lowering {type(lout).__name__}"
        for i, (t, lo) in enumerate(zip(tout, lout)):
            why = _differ(t, lo, rtol, floor)
            if why:
                return f"output {i}: {why}"
        return None
    if not isinstance(tout, torch.Tensor):
        return None
    t = tout.detach().cpu().numpy()
    a = np.asarray(lout) if not hasattr(lout, "value") else np.asarray(lout.value)
    return array_differ(a, t, rtol, floor, "torch")
