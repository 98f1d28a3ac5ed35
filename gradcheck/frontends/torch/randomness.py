"""The case's random draws: every random op of a torch module gives every backend the same values.

A random op in a forward (dropout, attention dropout, DropPath's
``torch.rand``, ``randn_like`` noise, ``bernoulli``, ``normal_``,
``randperm``, ``multinomial``) is a fact of the case: if each backend drew
its own numbers no gradient could agree, and torch alone would be reported
nondeterministic.  So draw
``k`` of a graph (its ``k``-th random node, in graph order, which is the
order the forward made them) is one float64 array from the case seed, a
standard uniform ``u`` or a standard normal ``z`` of the op's shape, and the
op's value is a transform of it and of the op's arguments:

====================================  ==========================================
``rand``, ``uniform(a, b)``           ``a + (b - a) u``
``randn``, ``normal(mean, std)``      ``mean + std z``
``exponential(l)``                    ``-log(1 - u) / l``
``bernoulli(p)``                      ``u < p``
``dropout(x, p)``                     ``x (u < 1 - p) / (1 - p)``, as torch's
                                      CPU dropout draws ``bernoulli_(1 - p)``;
                                      attention dropout the same, on the weights
``randint(low, high)``                ``low + floor((high - low) u)``
``randperm(n)``                       the order that sorts ``u``
``multinomial(p, n)``                 Gumbel top-``n`` of ``log p`` (without
                                      replacement), else the inverse CDF at ``u``
====================================  ==========================================

(and ``cauchy``, ``log_normal``, ``geometric``, ``random_(from, to)`` the
same way).  The same function computes both sides:

* the tape, jax and the numpy referee run the graph: each random node's
  lowering (registered in ``aten.LOWERINGS``) is the transform, on the
  backend its arguments are on.  A random op has no derivative in torch
  (``normal(mean, std)``'s gradient in ``mean`` is zero), so a value that
  depends on a differentiated tensor is held with ``stop_gradient``, which the
  referee holds fixed at the case point too (``gradcheck.check.kinks``);
* torch runs the module itself: ``CaseRandom``, a ``TorchDispatchMode``, gives
  the forward's ``k``-th random call draw ``k`` (an in-place op fills its
  tensor), after checking that the kind and shape of the draw are the
  graph's.  At the dispatch level every random draw is seen, also those made
  inside a library function (``F.multi_head_attention_forward``'s attention
  dropout), where torch's dropout is ``empty_like(x).bernoulli_(1 - p)``.

Only ``bernoulli(p)`` of a probability tensor compares (``u < p``) with a
kink op, as the graph's own decomposition of it does (``rand`` then ``lt``),
so a pinned float32 run meets the same comparison on every backend.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
from dataclasses import dataclass

import numpy as np

from gradcheck import ops as o
from gradcheck.backends import backend_of

_TAG = 0x52414E44  # "RAND": separates these streams from the dropout masks' (seed, k)
# Inside torch's runs of a module (CaseRandom) torch's generator is not drawn from (every draw is the case's), so it
# holds where the forward is instead: seeded with _AT + (call << 40) + (draws << 20) + kinks, it says that in torch
# call ``call`` (CaseRandom.call) draw number ``draws`` and pinned kink op call ``kinks`` (eager.TorchFunctions) come
# next.  Gradient checkpointing puts back the generator of a segment's start before it recomputes the segment inside
# the backward, and so says which draws, of which call, and which kink decisions the recompute repeats.
_AT = 0x5241 << 48
_ANEW = 1 << 40  # the numbers of the draws a recompute makes anew (CaseRandom._anew), past any graph's own


@dataclass(frozen=True)
class Position:
    call: int
    draws: int
    kinks: int


def forward_position() -> Position | None:
    """Where the torch forward in progress (or recomputed) is, or None where the module seeded torch itself."""
    import torch

    at = torch.default_generator.initial_seed() - _AT
    return Position(at >> 40, (at >> 20) & 0xFFFFF, at & 0xFFFFF) if 0 <= at < 1 << 48 else None


def set_forward_position(call: int | None = None, draws: int | None = None, kinks: int | None = None,
                         over_module_seed: bool = True) -> None:
    """Say in torch's generator where the forward is (None: as it says now, or last said where the module seeded
    torch itself since).  ``over_module_seed=False`` leaves a seed the module gave torch in place (its draws
    are matched by it, ``CaseRandom._position``) and keeps the position for the next time it is said."""
    import torch

    now = forward_position()
    mine = now is not None
    now = now or _said[0]
    _said[0] = at = Position(now.call if call is None else call, now.draws if draws is None else draws,
                             now.kinks if kinks is None else kinks)
    if mine or over_module_seed:
        torch.default_generator.manual_seed(_AT + (at.call << 40) + (at.draws << 20) + at.kinks)


_said = [Position(0, 0, 0)]
# The torch calls whose draws are made or may be recomputed (entered, not yet exited), by number.
_calls: dict = {}
_numbers = itertools.count()


# The state numpy's and Python's global generators start every forward of a module at (``host_generators``).
HOST_SEED = 0
# The seed of the draws a graph traced at the example branches on (``Draws.pinned``): the capture's draws.
BRANCH_SEED = 0x42524E43


@contextlib.contextmanager
def host_generators(on_draw=None):
    """numpy's and Python's global generators at one fixed state for a forward; the caller's restored after.

    A module that draws on the host (wav2vec2's SpecAugment masks come from
    ``np.random``) is not seen by torch's dispatch: the graph keeps, as
    constants, what the capture's forward drew, and torch's own forward
    would draw anew on every call (reported nondeterministic, torch blamed).
    Started at one state, every forward of the module draws the capture's
    values.  The state is fixed, not the case seed's, because one graph
    serves every seed (the capture cache).  ``on_draw()`` is called when the
    forward drew from either generator.
    """
    import random

    np_state, py_state = np.random.get_state(), random.getstate()
    np.random.seed(HOST_SEED)
    random.seed(HOST_SEED)
    start = (np.random.get_state(), random.getstate())
    try:
        yield
    finally:
        now = np.random.get_state()
        drew = (not np.array_equal(now[1], start[0][1]) or now[2:] != start[0][2:]
                or random.getstate() != start[1])
        np.random.set_state(np_state)
        random.setstate(py_state)
        if drew and on_draw is not None:
            on_draw()


def case_draw(seed: int, k: int, kind: str, shape, pinned=frozenset()) -> np.ndarray:
    """Draw ``k`` of a case with seed ``seed``; a pinned draw (``Draws.pinned``) is the capture's."""
    return draw(BRANCH_SEED if k in pinned else seed, k, kind, shape)


def draw(seed: int, k: int, kind: str, shape) -> np.ndarray:
    """Draw ``k`` of a case: float64 ``uniform`` in [0, 1) or standard ``normal`` values of ``shape``."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(k), _TAG]))
    shape = tuple(int(d) for d in shape)
    return rng.random(shape) if kind == "uniform" else rng.standard_normal(shape)


# ---------------------------------------------------------------- the ops
class Op:
    """One random ATen op: which base draw it takes, of what shape, and its value from the draw."""

    def __init__(self, kind, shape, value, in_place=False, integer=False):
        self.kind = kind  # "uniform" or "normal"
        self.shape = shape  # bound arguments -> the draw's shape
        self.value = value  # (bound arguments, draw, like) -> the op's value
        self.in_place = in_place  # fills ``self`` (the eager forms: normal_, bernoulli_)
        self.integer = integer  # int64 result unless a dtype is given (randint, randperm, multinomial)


def _self_shape(b):
    return o.shape_of(b["self"])


def _size(b):
    return tuple(int(d) for d in b["size"])


def _uniform(lo_name, hi_name, lo=0.0, hi=1.0):
    def value(b, u, like):
        a = b.get(lo_name, lo) if lo_name else lo
        c = b.get(hi_name, hi) if hi_name else hi
        return float(a) + (float(c) - float(a)) * u
    return value


def _normal_scalars(b, z, like):
    return float(b.get("mean", 0.0)) + float(b.get("std", 1.0)) * z


def _normal_tensors(b, z, like):
    """``mean + std z`` with a tensor mean or std: held, as torch gives the draw no gradient in either."""
    mean, std = b["mean"], b["std"]
    ref = mean if hasattr(mean, "shape") else std
    zc = o.asarray(z, like=ref)
    return o.stop_gradient(o.add(mean, o.mul(zc, std)))


def _normal_shape(b):
    shapes = [o.shape_of(v) for v in (b["mean"], b["std"]) if hasattr(v, "shape")]
    return tuple(np.broadcast_shapes(*shapes))


def _bernoulli_scalar(b, u, like):
    p = float(b.get("p", 0.5) if b.get("p") is not None else 0.5)
    return (u < p).astype(np.float64)


def _bernoulli_tensor(b, u, like):
    """``u < p`` for a probability tensor, with the comparison the graph's decomposition makes (``lt``)."""
    p = b["p"] if hasattr(b.get("p"), "shape") else b["self"]
    uc = o.asarray(u, like=p)
    return o.astype(o.less(uc, p), np.dtype(o.dtype_of(p)))


def _randint(b, u, like):
    low, high = int(b.get("low", 0) or 0), int(b["high"])
    return (low + np.floor(u * (high - low))).astype(np.int64)


def _random_from(b, u, like):
    low, high = int(b.get("from", 0) or 0), b.get("to")
    if high is None:
        raise NotImplementedError("random_(from) without an upper bound draws from the dtype's whole range; give "
                                  "it `to`")
    return (low + np.floor(u * (int(high) - low))).astype(np.int64)


def _randperm(b, u, like):
    return np.argsort(u, kind="stable").astype(np.int64)


def _multinomial_shape(b):
    probs = o.shape_of(b["self"])
    if b.get("replacement"):
        return tuple(probs[:-1]) + (int(b["num_samples"]),)
    return tuple(probs)


def _multinomial(b, u, like):
    """Categories without replacement by Gumbel top-n of ``log p``, with replacement by the inverse CDF at ``u``."""
    p = b["self"]
    xp = _array_module(p)
    p = xp.asarray(_raw(p), dtype=np.float64) if xp is np else xp.asarray(p)
    n = int(b["num_samples"])
    if b.get("replacement"):
        cdf = xp.cumsum(p, axis=-1) / xp.sum(p, axis=-1, keepdims=True)
        idx = xp.sum(cdf[..., None, :] <= xp.asarray(u)[..., :, None], axis=-1)
        return xp.minimum(idx, p.shape[-1] - 1).astype(np.int64)
    with np.errstate(divide="ignore"):
        keys = xp.log(p) - xp.log(-xp.log(xp.asarray(u)))
    return xp.argsort(-keys, axis=-1)[..., :n].astype(np.int64)


def _exponential(b, u, like):
    return -np.log1p(-u) / float(b.get("lambd", 1.0))


def _cauchy(b, u, like):
    return float(b.get("median", 0.0)) + float(b.get("sigma", 1.0)) * np.tan(math.pi * (u - 0.5))


def _log_normal(b, z, like):
    return np.exp(float(b.get("mean", 1.0)) + float(b.get("std", 2.0)) * z)


def _geometric(b, u, like):
    return np.floor(np.log1p(-u) / np.log1p(-float(b["p"]))) + 1.0


def _array_module(x):
    """numpy, or jax.numpy when ``x`` is traced: an integer draw from a tensor's values carries no gradient."""
    if backend_of(x) == "jax":
        import jax.numpy as jnp

        return jnp
    return np


def _raw(x):
    if backend_of(x) == "tape":
        from gradcheck.backends.tape import tape

        return tape.raw(x)
    return o.to_numpy(x) if backend_of(x) == "torch" else x


OPS: dict[str, Op] = {}


def _add(names, op):
    for name in names.split():
        OPS[name] = op


_add("aten.rand.default aten.rand.generator", Op("uniform", _size, _uniform(None, None)))
_add("aten.rand_like.default", Op("uniform", _self_shape, _uniform(None, None)))
_add("aten.uniform.default", Op("uniform", _self_shape, _uniform("from", "to")))
_add("aten.uniform_.default", Op("uniform", _self_shape, _uniform("from", "to"), in_place=True))
_add("aten.randn.default aten.randn.generator", Op("normal", _size, _normal_scalars))
_add("aten.randn_like.default", Op("normal", _self_shape, _normal_scalars))
_add("aten.normal_functional.default", Op("normal", _self_shape, _normal_scalars))
_add("aten.normal_.default", Op("normal", _self_shape, _normal_scalars, in_place=True))
_add("aten.normal.float_float", Op("normal", _size, _normal_scalars))
_add("aten.normal.Tensor_float aten.normal.float_Tensor aten.normal.Tensor_Tensor",
     Op("normal", _normal_shape, _normal_tensors))
_add("aten.exponential.default", Op("uniform", _self_shape, _exponential))
_add("aten.exponential_.default", Op("uniform", _self_shape, _exponential, in_place=True))
_add("aten.cauchy.default", Op("uniform", _self_shape, _cauchy))
_add("aten.cauchy_.default", Op("uniform", _self_shape, _cauchy, in_place=True))
_add("aten.log_normal.default", Op("normal", _self_shape, _log_normal))
_add("aten.log_normal_.default", Op("normal", _self_shape, _log_normal, in_place=True))
_add("aten.geometric.default", Op("uniform", _self_shape, _geometric))
_add("aten.geometric_.default", Op("uniform", _self_shape, _geometric, in_place=True))
_add("aten.bernoulli.p", Op("uniform", _self_shape, _bernoulli_scalar))
_add("aten.bernoulli_.float", Op("uniform", _self_shape, _bernoulli_scalar, in_place=True))
_add("aten.bernoulli.default aten.bernoulli.Tensor", Op("uniform", _self_shape, _bernoulli_tensor))
_add("aten.bernoulli_.Tensor", Op("uniform", _self_shape, _bernoulli_tensor, in_place=True))
_add("aten.randint.default aten.randint.low aten.randint.generator aten.randint.low_generator",
     Op("uniform", _size, _randint, integer=True))
_add("aten.randint_like.default aten.randint_like.low_dtype aten.randint_like.Tensor",
     Op("uniform", _self_shape, _randint, integer=True))
_add("aten.random.from", Op("uniform", _self_shape, _random_from))
_add("aten.random_.from", Op("uniform", _self_shape, _random_from, in_place=True))
_add("aten.randperm.default aten.randperm.generator", Op("uniform", lambda b: (int(b["n"]),), _randperm,
                                                           integer=True))
_add("aten.multinomial.default", Op("uniform", _multinomial_shape, _multinomial, integer=True))


def is_random(name: str) -> bool:
    return name in OPS


# Graph nodes that draw only for some arguments: dropout in training with 0 < p < 1, attention with dropout_p > 0.
_DROPOUTS = ("aten.native_dropout.default", "aten.dropout.default")
_ATTENTION = {"aten.scaled_dot_product_attention.default": 4,
              "aten._scaled_dot_product_flash_attention_for_cpu.default": 3}


def drop_probability(name: str, args, kwargs) -> float:
    """The drop probability of a dropout or attention node that drops anything (0 otherwise)."""
    args = list(args) + [None] * 8
    if name in _DROPOUTS:
        p, train = args[1], args[2] if args[2] is not None else kwargs.get("train", True)
        return float(p) if train and p and 0.0 < float(p) < 1.0 else 0.0
    if name in _ATTENTION:
        pos = _ATTENTION[name]
        p = args[pos] if args[pos] is not None else kwargs.get("dropout_p", 0.0)
        return float(p or 0.0)
    return 0.0


def draws_in(node) -> bool:
    """Whether a graph node makes one of the case's draws."""
    name = str(node.target)
    if name in OPS:
        return True
    if name in _DROPOUTS or name in _ATTENTION:
        return drop_probability(name, node.args, node.kwargs) > 0
    return False


def keep_factors(u: np.ndarray, p: float) -> np.ndarray:
    """A dropout's keep-and-scale factors from its draw: ``(u < 1 - p) / (1 - p)``, torch's ``bernoulli_(1 - p)``."""
    return (u < 1.0 - p).astype(np.float64) / (1.0 - p)


def attention_shape(q_shape, k_shape) -> tuple[int, ...]:
    """The shape of the attention weights, (..., L, S): what attention dropout draws.

    With grouped-query heads (``enable_gqa``: fewer key heads than query
    heads, each serving a group of queries) the weights have the queries' heads.
    """
    q, k = tuple(q_shape[:-2]), tuple(k_shape[:-2])
    if len(q) and len(k) and q[-1] != k[-1] and k[-1] and q[-1] % k[-1] == 0:
        k = k[:-1] + (q[-1],)
    return tuple(np.broadcast_shapes(q, k)) + (q_shape[-2], k_shape[-2])


# Arguments whose schema default is an enum code (``dtype=long`` is 4), not a value: absent, they are None.
_CODED = frozenset({"dtype", "layout", "device", "memory_format", "pin_memory"})


def bind(schema, args, kwargs) -> dict:
    """An op call's arguments by the names its schema gives them, defaults filled in."""
    bound = {}
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value() and a.name not in _CODED:
            bound[a.name] = a.default_value
    return bound


def spec(name: str, bound: dict) -> tuple[str, tuple[int, ...]]:
    """The base draw a call of ``name`` takes: its kind and shape."""
    op = OPS[name]
    return op.kind, tuple(int(d) for d in op.shape(bound))


def value(name: str, bound: dict, base: np.ndarray):
    """The op's value from its base draw: numpy (float64 or int64) when it depends on scalars alone, else a
    value on the backend of its tensor arguments."""
    out = OPS[name].value(bound, base, None)
    # numpy's arithmetic on a 0-d draw (``torch.rand([])``, LayerDrop's coin) gives a scalar, not an array.
    return np.asarray(out) if isinstance(out, np.generic) else out


# ---------------------------------------------------------------- the graph's side
def _lowering(name):
    def lower_random(ctx, *args, **kwargs):
        b = bind(ctx.node.target._schema, args, kwargs)
        kind, shape = spec(name, b)
        out = value(name, b, ctx.draw(kind, shape))
        if isinstance(out, np.ndarray):
            dtype = b.get("dtype")
            if dtype is None:
                like = b.get("self")
                dtype = np.dtype(o.dtype_of(like)) if like is not None and not OPS[name].integer else (
                    np.dtype(np.int64) if OPS[name].integer else ctx.floats)
            dtype = np.dtype(dtype)
            out = out.astype(ctx.floats if dtype.kind == "f" else dtype)
        return out

    lower_random.__name__ = "random_" + name.split(".")[1]
    return lower_random


def register(lowerings: dict) -> None:
    """Add a lowering per random op to the ATen table (``aten.LOWERINGS``)."""
    for name in OPS:
        if not OPS[name].in_place:
            lowerings[name] = _lowering(name)


# ---------------------------------------------------------------- torch's side
class Draws:
    """The random nodes of a graph, in order: each node's draw number, and the kind and shape of its draw.

    ``pinned``: the numbers of the draws whose value decides a branch of a
    graph traced at the example inputs (LayerDrop's ``torch.rand([]) < p``
    read by ``if``): the graph is the path the capture's value took, so that
    value is the draw on every backend, from ``BRANCH_SEED`` (the capture's
    own draws, ``capture.trace_at_example``), not from the case seed.
    """

    def __init__(self, nodes: list):
        random_nodes = [n for n in nodes if n.op == "call_function" and draws_in(n)]
        self.index = {n.name: k for k, n in enumerate(random_nodes)}
        self.expected = [node_spec(n) for n in random_nodes]
        decided = _deciding(nodes)
        self.pinned = frozenset(k for k, n in enumerate(random_nodes) if n.name in decided)
        # What torch's runs found a recompute inside the backward did that its forward did not (a draw made anew, a
        # buffer written again): each message once, for the case's notes (TorchModule.run_notes).
        self.recomputed: list[str] = []

    def __len__(self):
        return len(self.expected)


# The values a scalar is read from a tensor with: in a graph traced at the example, a branch's decision.
_READS = frozenset({"aten._local_scalar_dense.default", "aten.item.default"})


def _deciding(nodes: list) -> set[str]:
    """The names of the nodes whose value reaches a scalar read (``_READS``): what a traced branch depends on."""
    deciding: set[str] = set()
    for node in reversed(nodes):
        if node.op == "call_function" and (str(node.target) in _READS
                                           or any(u.name in deciding for u in node.users)):
            deciding.add(node.name)
    return deciding


def node_spec(node) -> tuple[str, str, tuple[int, ...]]:
    """(op, draw kind, draw shape) of a graph's random node, from the shapes torch.export recorded."""
    from torch.fx.node import map_arg

    name = str(node.target)
    args = map_arg(node.args, lambda n: n.meta.get("val"))
    kwargs = map_arg(node.kwargs, lambda n: n.meta.get("val"))
    if name in _DROPOUTS:
        return name, "uniform", tuple(int(d) for d in args[0].shape)
    if name in _ATTENTION:
        return name, "uniform", attention_shape(tuple(args[0].shape), tuple(args[1].shape))
    kind, shape = spec(name, bind(node.target._schema, args, kwargs))
    return name, kind, shape


def torch_value(func, args, kwargs, base_for):
    """torch's value of a random op call with the case's draw (``base_for(kind, shape)``), in its dtype."""
    import torch

    name = str(func)
    if name in _DROPOUTS or name in _ATTENTION:
        return _torch_dropout(name, args, kwargs, base_for)
    b = bind(func._schema, args, kwargs)
    kind, shape = spec(name, b)
    out = value(name, b, base_for(kind, shape))
    like = b.get("self")
    if isinstance(out, np.ndarray):
        dtype = b.get("dtype")
        if dtype is None:
            dtype = like.dtype if isinstance(like, torch.Tensor) and not OPS[name].integer else (
                torch.int64 if OPS[name].integer else torch.get_default_dtype())
        device = like.device if isinstance(like, torch.Tensor) else (b.get("device") or "cpu")
        out = torch.as_tensor(out, dtype=dtype, device=device)
    if OPS[name].in_place:
        with torch.no_grad():
            like.copy_(out.to(like.dtype))
        return like
    return out


def _torch_dropout(name, args, kwargs, base_for):
    """torch's value of a dropout or attention-dropout node with the case's keep mask (what verify compares)."""
    import torch

    from gradcheck.backends.torch import ops as torch_ops

    p = drop_probability(name, args, kwargs)
    if name in _DROPOUTS:
        x = args[0]
        factors = torch.as_tensor(keep_factors(base_for("uniform", tuple(x.shape)), p), dtype=x.dtype, device=x.device)
        out = x * factors
        return (out, factors != 0) if name == "aten.native_dropout.default" else out
    args = list(args) + [None] * 8
    q, k, v = args[:3]
    if name == "aten.scaled_dot_product_attention.default":
        attn_mask, causal = args[3] if args[3] is not None else kwargs.get("attn_mask"), args[5]
        scale = kwargs.get("scale", args[6])
    else:
        causal, attn_mask, scale = args[4], kwargs.get("attn_mask", args[5]), kwargs.get("scale", args[6])
    causal = causal if causal is not None else kwargs.get("is_causal", False)
    mask = keep_factors(base_for("uniform", attention_shape(tuple(q.shape), tuple(k.shape))), p)
    out = torch_ops.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_mask=mask,
                                                 is_causal=bool(causal), scale=scale)
    return out if name == "aten.scaled_dot_product_attention.default" else (out, None)


# Fused kernels that draw inside themselves, out of this mode's reach: a check cannot give them the case's draw.
_OPAQUE = frozenset({"aten._scaled_dot_product_flash_attention.default",
                     "aten._scaled_dot_product_efficient_attention.default",
                     "aten._scaled_dot_product_cudnn_attention.default", "aten._fused_dropout.default"})


class CaseRandom:
    """On torch, the forward's ``k``-th random op call gets draw ``k`` of the case (see the module doc).

    ``indices`` are the draws' numbers in the whole graph (a submodule
    replayed alone makes some of them); ``expected`` their ops and shapes,
    checked call by call, so a forward that draws differently from its
    graph is an error that says so, not a silent misalignment.
    """

    def __init__(self, seed: int, expected: list | None, indices: list[int] | None = None,
                 recorded: dict | None = None, pinned=frozenset(), recomputed: list | None = None):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class _Mode(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls):
                # torch wraps a mode's __torch_dispatch__ in torch._dynamo.disable, importing torch._dynamo at
                # its first call: 1.5 s, the largest part of a from_torch case built from the capture cache,
                # for a guard that only matters while dynamo compiles. So the guard is kept once something has
                # imported dynamo (an export, a torch.compile in the model), and skipped before, when nothing
                # can be compiling (docs/decisions.md, "The capture cache's own format").
                return "torch._dynamo" in sys.modules

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name, kwargs = str(func), kwargs or {}
                if name in OPS or (name in _DROPOUTS and drop_probability(name, args, kwargs) > 0):
                    return outer._handle(func, args, kwargs)
                if name in _OPAQUE and _draws_inside(name, args, kwargs):
                    raise NotImplementedError(
                        f"{func} draws its random numbers inside a fused kernel (dropout on an accelerator), "
                        "where no check can give it the case's draw; check the module on the CPU, or with "
                        "mode='eval'")
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self.seed = seed
        # None: a capture's forward, whose draws make the graph (numbered in call order, nothing to check)
        self.expected = list(expected) if expected is not None else None
        self.indices = list(indices) if indices is not None else None
        self.pinned = pinned
        self.recorded = recorded  # a reproducer keeps the values it hands out ("random_values")
        self.k = 0
        self.finished = False
        self._caller_generator = None
        self._seeded: dict[int, int] = {}  # a seed the module gave torch itself -> the first draw made from it
        self.call: int | None = None  # this call's number in torch's generator (forward_position), in torch's runs
        self.recomputed = recomputed  # where a draw made anew inside the backward is told (None: it is an error)
        self.anew = 0  # how many it made

    def __enter__(self):
        import torch

        if self.expected is not None:  # torch's generator says where the forward is (forward_position)
            self._caller_generator = torch.random.get_rng_state()
            self.call = next(_numbers) % 256
            _calls[self.call] = self
            set_forward_position(self.call, 0, 0)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        import torch

        try:
            return self._mode.__exit__(*exc)
        finally:
            if self._caller_generator is not None:
                _calls.pop(self.call, None)
                torch.random.set_rng_state(self._caller_generator)

    def _owner(self) -> CaseRandom:
        """The call a draw belongs to: this one's forward's, or, inside the backward, the call being recomputed."""
        import torch

        if self.expected is None or not self.finished:
            return self
        at = forward_position()
        if at is not None:
            return _calls.get(at.call, self)
        seed = torch.default_generator.initial_seed()
        return next((c for c in _calls.values() if seed in c._seeded), self)

    def _position(self) -> tuple[int, bool]:
        """The number of the draw being made, and whether it repeats one (recomputed inside the backward).

        In the forward the draws come in order.  After it, a draw is a
        recompute's (gradient checkpointing): it repeats the draw torch's
        generator says comes next, or, where the module seeds torch itself
        (Reformer's reversible layers replay their dropout so), the first
        draw the forward made from that seed.
        """
        import torch

        if self.expected is None:
            return self.k, False
        at = forward_position()
        if not self.finished:
            if at is None:
                self._seeded.setdefault(torch.default_generator.initial_seed(), self.k)
            return self.k, False
        if at is not None and at.call == self.call and at.draws < self.k:
            return at.draws, True
        if at is None and torch.default_generator.initial_seed() in self._seeded:
            return self._seeded[torch.default_generator.initial_seed()], True
        return self.k, False

    def _handle(self, func, args, kwargs):
        import torch

        owner = self._owner()
        if owner is not self:  # a segment of an earlier call of this forward, recomputed
            return owner._handle(func, args, kwargs)
        k, again = self._position()
        name = str(func)
        if name in _DROPOUTS:  # torch.native_dropout called as such (on CPU, F.dropout draws bernoulli_ instead)
            kind, shape = "uniform", tuple(int(d) for d in args[0].shape)
        else:
            kind, shape = spec(name, bind(func._schema, args, kwargs))
        if self.finished and (k >= len(self.expected)
                              or (again and (self.expected[k][1], tuple(self.expected[k][2])) != (kind, shape))):
            return self._anew(func, args, kwargs, k, again, name, kind, shape)
        if self.expected is not None and k >= len(self.expected):
            raise RuntimeError(f"the module made random draw #{k + 1} ({name}, shape {shape}) but its exported "
                               f"graph has {len(self.expected)}; the forward differs between calls (capture it "
                               "again)")
        # The draw's kind and shape are what align the two sides: the graph may hold another op for the same
        # draw (bernoulli(p) decomposes into rand < p; normal_ becomes normal_functional).
        want, want_kind, want_shape = self.expected[k] if self.expected is not None else (name, kind, shape)
        if (want_kind, tuple(want_shape)) != (kind, shape):
            raise RuntimeError(f"random draw #{k + 1}: the module calls {name} for a {kind} draw of shape {shape}, "
                               f"its graph {want} for a {want_kind} draw of shape {tuple(want_shape)}; the forward "
                               "differs from the captured one")
        if not again:
            self.k += 1
        index = self.indices[k] if self.indices is not None else k
        base = case_draw(self.seed, index, kind, shape, self.pinned)
        if self.expected is None:
            return self._captured(func, args, kwargs, base)
        set_forward_position(self.call, k + 1)
        out = torch_value(func, args, kwargs, lambda kind, shp: base)
        if self.recorded is not None and not again:  # a reproducer replays the draw: dropout's factors, else values
            kept = keep_factors(base, drop_probability(name, args, kwargs)) if name in _DROPOUTS else out
            self.recorded.setdefault("random_values", []).append(torch.as_tensor(kept).detach().clone())
        return out

    def _anew(self, func, args, kwargs, k, again, name, kind, shape):
        """A draw inside the backward that repeats none of the forward's: new numbers, as torch's generator gives.

        A recompute (gradient checkpointing with ``preserve_rng_state=False``,
        a reversible layer that draws in another order than its forward) then
        computes another function than the forward did, and torch's gradient
        is not the forward's: torch is blamed, as it is in the user's run,
        and the case's notes say why.
        """
        if again:
            want = self.expected[k]
            what = (f"draws {name} for a {kind} draw of shape {shape} where its forward made a {want[1]} draw of "
                    f"shape {tuple(want[2])} (random draw #{k + 1})")
        else:
            what = f"makes a random draw ({name}, {kind}, shape {shape}) after the forward's {len(self.expected)}"
        message = (f"torch's backward recomputes part of the forward (gradient checkpointing, a reversible layer) "
                   f"and the recompute {what}: it computes with other random numbers than the forward, so torch's "
                   "gradient is not the forward's (checkpoint with preserve_rng_state=True, and draw in the "
                   "forward's order)")
        if self.recomputed is None:
            raise RuntimeError(message)
        if message not in self.recomputed:
            self.recomputed.append(message)
        self.anew += 1
        base = case_draw(self.seed, _ANEW + self.anew, kind, shape, frozenset())
        return torch_value(func, args, kwargs, lambda kind, shp: base)

    @staticmethod
    def _captured(func, args, kwargs, base):
        """A capture's random call: the op itself, for the trace to record, holding the draw's value.

        A trace's modes run below this one, so the op's value is written into
        its real tensor with every mode set aside: the trace sees neither the
        write nor its ops.  Dropout's values stay torch's (no branch reads a
        mask)."""
        import torch
        from torch.utils._python_dispatch import _disable_current_modes

        out = func(*args, **kwargs)
        if str(func) in OPS and isinstance(out, torch.Tensor):
            with _disable_current_modes(), torch.no_grad():
                value = torch_value(func, args, kwargs, lambda kind, shp: base)
                if value is not out:
                    out.copy_(value.to(out.dtype))
        return out

    def finish(self):
        if self.expected is not None and self.k != len(self.expected):
            raise RuntimeError(f"the module made {self.k} random draws but its exported graph has "
                               f"{len(self.expected)}; the forward differs from the captured one")
        self.finished = self.expected is not None  # torch's run: what it draws from now on is a recompute's


def _draws_inside(name, args, kwargs) -> bool:
    """Whether a fused kernel's call would draw (dropout in training, attention with ``dropout_p > 0``)."""
    args = list(args) + [None] * 8
    if name == "aten.native_dropout.default":
        train = args[2] if args[2] is not None else kwargs.get("train")
        return bool(train) and 0.0 < float(args[1]) < 1.0
    if name == "aten._fused_dropout.default":
        return float(args[1]) < 1.0
    return float(kwargs.get("dropout_p", args[3] if args[3] is not None else 0.0) or 0.0) > 0
