"""Run an exported graph with ``gradcheck.ops``, and check each lowering against torch's own op once.

``run`` walks the graph's nodes in order and calls each node's lowering
(``gradcheck.export.aten``) on whatever backend the values are on: tape
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

import operator

import numpy as np

from gradcheck import kinks
from gradcheck import module as gmodule
from gradcheck.backends.base import BackendUnavailable
from gradcheck.export import capture
from gradcheck.export.aten import LOWERINGS, LoweringError, Unavailable
from gradcheck.kinks import KinkMismatch
from gradcheck.ops import BackendOpMissing

# Relative error (max |lowering - torch| / max |torch|) a float64 lowering may have: kernels that sum in
# another order differ by a few ulps times the reduction length, ten thousand times below this.
VERIFY_RTOL = 1e-8
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

    def dropout_mask(self, shape, p) -> np.ndarray:
        return self._mask(self.node.name, tuple(shape), p)


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


def run(graph: capture.Graph, values: dict, floats, mask, layer_of=None) -> list:
    """The graph's outputs, in the order of its output specs, from placeholder values."""
    if graph.unfaithful:
        raise UnsupportedOp(graph.unfaithful)
    env: dict = {}
    ctx = Context(floats, mask)
    stack = gmodule.current_calls()
    for node in graph.nodes:
        if node.op == "placeholder":
            env[node] = values[node.name]
        elif node.op == "call_function":
            if node.target is operator.getitem:
                env[node] = env[node.args[0]][node.args[1]]
                continue
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
                        env[node] = LOWERINGS[op](ctx, *args, **kwargs)
                else:
                    env[node] = LOWERINGS[op](ctx, *args, **kwargs)
            except (KinkMismatch, UnsupportedOp):
                raise
            except (LoweringError, BackendOpMissing) as exc:
                raise UnsupportedOp(f"{exc} ({capture.where(node)})") from exc
            except Exception as exc:
                raise GraphRunError(f"{op}, {capture.where(node)}: {type(exc).__name__}: {exc}") from exc
            finally:
                if layer is not None:
                    stack.pop()
        elif node.op == "output":
            from torch.fx.node import map_arg

            return list(map_arg(node.args[0], env.__getitem__))
        else:
            raise GraphRunError(f"node {node.name}: a {node.op} node; exported graphs have placeholders, "
                                "call_function nodes and one output")
    raise GraphRunError("the graph has no output node")


# ---------------------------------------------------------------- torch's side of the random ops
def torch_dropout(node_target: str, args, kwargs, mask_for):
    """torch's value of a dropout node with the case's mask (``mask_for(shape, p)``), or None if not one."""
    import torch

    from gradcheck.backends import torch_ops

    args = list(args) + [None] * 8
    if node_target == "aten.bernoulli.p":
        x, p = args[0], float(args[1] if args[1] is not None else kwargs.get("p", 0.5))
        if not 0.0 < p < 1.0:
            return None
        return torch.as_tensor(np.asarray(mask_for(tuple(x.shape), 1.0 - p)) != 0, dtype=x.dtype)
    if node_target in ("aten.native_dropout.default", "aten.dropout.default"):
        x, p, train = args[0], args[1], args[2] if args[2] is not None else kwargs.get("train", True)
        if not (train and p):
            out = x
            keep = torch.ones_like(x, dtype=torch.bool)
        else:
            factors = torch.as_tensor(mask_for(tuple(x.shape), float(p)), dtype=x.dtype)
            out, keep = x * factors, factors != 0
        return (out, keep) if node_target.startswith("aten.native") else out
    if node_target == "aten.scaled_dot_product_attention.default":
        q, k, v = args[:3]
        attn_mask = args[3] if args[3] is not None else kwargs.get("attn_mask")
        p = args[4] if args[4] is not None else kwargs.get("dropout_p", 0.0)
        causal = args[5] if args[5] is not None else kwargs.get("is_causal", False)
        scale = kwargs.get("scale", args[6])
        if not p:
            return None
        shape = tuple(np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2]))) + (q.shape[-2], k.shape[-2])
        return torch_ops.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                      dropout_mask=mask_for(shape, float(p)),
                                                      is_causal=bool(causal), scale=scale)
    return None


# ---------------------------------------------------------------- checking the lowerings
def verify(graph: capture.Graph, values: dict, mask) -> dict[str, str]:
    """Problems found running every node by torch and by its lowering on torch's inputs (float64)."""
    import torch
    from torch.fx.node import map_arg

    problems: dict[str, str] = {}
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
            break
        if node.target is operator.getitem:
            src, i = node.args
            tenv[node] = tenv[src][i]
            lo = lenv.get(src)
            lenv[node] = lo[i] if isinstance(lo, (tuple, list)) else None
            continue
        op = capture.op_name(node)
        targs, tkwargs = _torch_arguments(node, tenv)
        mask_for = lambda shape, p, name=node.name: mask(name, shape, p)  # noqa: E731
        try:
            tout = torch_dropout(op, targs, tkwargs, mask_for)
            if tout is None:
                tout = node.target(*targs, **tkwargs)
        except Exception:  # torch cannot run its own op in float64 here: nothing to hold the lowering to
            tout = None
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
            out = LOWERINGS[op](ctx, *nargs, **nkwargs)
        except (LoweringError, BackendOpMissing) as exc:
            problems[node.name] = f"{exc} ({capture.where(node)})"
            lenv[node] = None
            continue
        except Exception as exc:
            problems[node.name] = (f"the lowering of {op} raised {type(exc).__name__}: {exc} "
                                   f"({capture.where(node)}); this is a bug in gradcheck/export/aten.py")
            lenv[node] = None
            continue
        lenv[node] = out
        why = None if op in UNINITIALISED else _differ(tout, out)
        if why:
            problems[node.name] = (f"the lowering of {op} disagrees with torch's {op} ({why}), "
                                   f"{capture.where(node)}; a bug in gradcheck/export/aten.py or an unsupported "
                                   "form of the op: the tape and jax cannot check this case until it is fixed")
    return problems


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

    if isinstance(v, torch.Tensor):
        return v.detach().cpu().numpy().copy()
    if isinstance(v, (list, tuple)):
        return type(v)(_to_numpy(x) for x in v)
    return v


def _differ(tout, lout, rtol: float = VERIFY_RTOL) -> str | None:
    """Why a lowering's output differs from torch's (shape, dtype kind, values beyond ``rtol``), or None."""
    import torch

    if isinstance(lout, Unavailable) or lout is None:
        return None
    if isinstance(tout, (tuple, list)):
        if not isinstance(lout, (tuple, list)) or len(lout) != len(tout):
            return f"torch returns {len(tout)} values, the lowering {type(lout).__name__}"
        for i, (t, lo) in enumerate(zip(tout, lout)):
            why = _differ(t, lo, rtol)
            if why:
                return f"output {i}: {why}"
        return None
    if not isinstance(tout, torch.Tensor):
        return None
    t = tout.detach().cpu().numpy()
    a = np.asarray(lout) if not hasattr(lout, "value") else np.asarray(lout.value)
    if a.shape != t.shape:
        return f"shape {a.shape}, torch's {t.shape}"
    tk, ak = t.dtype.kind, a.dtype.kind
    if (tk == "f") != (ak == "f"):
        return f"dtype {a.dtype}, torch's {t.dtype}"
    if tk != "f":
        if not np.array_equal(a.astype(t.dtype), t):
            return f"{int(np.sum(a.astype(t.dtype) != t))} of {t.size} elements differ"
        return None
    a64, t64 = a.astype(np.float64), t.astype(np.float64)
    # Which entries are NaN, +inf and -inf (a NaN's sign is NaN: it must not reach the comparison).
    same_special = np.array_equal(np.isnan(a64), np.isnan(t64)) and np.array_equal(
        np.where(np.isinf(a64), np.sign(a64), 0.0), np.where(np.isinf(t64), np.sign(t64), 0.0))
    if not same_special:
        return "NaN or infinite entries differ"
    finite = np.isfinite(t64)
    if not finite.any():
        return None
    err = float(np.max(np.abs(a64[finite] - t64[finite]), initial=0.0))
    scale = float(np.max(np.abs(t64[finite]), initial=0.0))
    if err > rtol * max(scale, np.finfo(np.float64).tiny):
        return f"max |difference| {err:.3g} where max |torch| is {scale:.3g}"
    return None
