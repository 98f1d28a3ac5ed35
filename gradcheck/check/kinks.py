"""Kinks: float32 runs take the float64 reference's branch at every relu, max and comparison.

A float32 forward lands on the other side of a kink that lies closer to it
than float32 resolves: ResNet-18 at 224x224 has about 2.3 M relu inputs, and
some of them lie within 1e-6 of zero, so on some seed some backend's float32
relu mask differs from the float64 one in an element, and every gradient
upstream moves by 1e-3.  That is not a wrong gradient, and float32 verdicts
must not depend on which side rounding falls.

So the float64 reference forward (numpy, the referee's forward) *records*
the branch every kink op takes, in call order, and each backend's float32
run is *pinned* to those branches: a pinned op runs the backend's own kernel
(``F.relu``, ``jax.nn.relu``, ``F.max_pool2d``) and, only in the elements
where that kernel's decision differs from the recorded one, the recorded
branch instead.  Its float32 error against float64 then measures rounding
alone.  The elements where a backend's decision differed are counted
(``KinkReport.crossed``), and kinks closer than float32 (or float64)
resolves are reported.

Only kink ops called from layer code are recorded and pinned, not those
inside another op's derived body: a backend may implement that op natively
(torch's ``leaky_relu``) where another composes it (the tape's, from
``greater``), and the sequences of calls must match across backends.

The recorder and the pinner are the ``kinks`` slot's interceptor of
``gradcheck.ops.dispatch`` while their block runs (``recording``, ``pinned``).

Branches by op: ``relu``/``leaky_relu``/``elu`` (input > 0), ``abs``
(sign), ``maximum``/``minimum`` (which operand), ``max``/``min`` (the
arg-max along the reduced axes), ``max_pool2d`` (each window's first
maximum), ``greater``/``less`` (the comparison itself).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gradcheck import ops
from gradcheck.backends import backend_of
from gradcheck.backends.numpy import kernels
from gradcheck.ops import dispatch, rules
from gradcheck.results import KinkReport

OPS = frozenset({"relu", "leaky_relu", "elu", "abs", "maximum", "minimum", "max", "min", "max_pool2d",
                 "greater", "less", "stop_gradient"})
# Distances from a kink, relative to the scale of the op's input, below which a float32 forward may land on
# either side (float32's epsilon is 1.2e-7; a deep forward's activations carry errors of 1e-7..1e-5 of
# their scale) and below which even float64 does (its epsilon is 2.2e-16, times the same depth factor).
FLOAT32_REACH = 1e-5
FLOAT64_REACH = 1e-13


class KinkMismatch(RuntimeError):
    """A pinned run called kink ops in another order or shape than the float64 reference."""


class Crossed(Exception):
    """A pass made under ``stopping_at_crossing`` took a kink decision the reference did not: it stopped there."""


# Whether passes recorded with ``hold`` stop at their first crossing (``stopping_at_crossing``).
_STOPPING = contextvars.ContextVar("gradcheck_kinks_stopping", default=False)


@dataclass
class Branch:
    """One kink op call of the reference forward: the decision it took and how close it came."""

    op: str
    layer: str
    decision: np.ndarray  # bool (or sign, for abs) in the shape the pinned op needs
    shape: tuple  # the input shape, checked when pinning
    elements: int = 0
    near: int = 0
    min_distance: float = float("inf")
    below_float64: int = 0

    def report(self, call: int, crossed: dict[str, int]) -> KinkReport:
        return KinkReport(op=self.op, layer=self.layer, call=call, elements=self.elements, near=self.near,
                          min_distance=float(self.min_distance) if np.isfinite(self.min_distance) else 0.0,
                          below_float64=self.below_float64, crossed=dict(crossed))


@dataclass
class Recording:
    """The branches of one float64 reference forward, in call order, and the values it held.

    ``held`` are the outputs of the forward's ``stop_gradient`` calls (a
    torch ``detach``, a padding row, a random draw that depends on a
    differentiated tensor): a referee pass made with ``hold=`` this recording
    gets those values back, call by call, so its finite difference is the
    derivative of the function the backends differentiate, with what the
    model holds fixed held fixed at the case point.
    """

    branches: list[Branch] = field(default_factory=list)
    held: list = field(default_factory=list)
    misheld: int = 0  # a held value this pass could not be given (another call order or shape than the reference)
    # What a frontend keeps of this forward for the passes made under it (gradcheck.frontends.torch.reuse).
    kept: list = field(default_factory=list, repr=False, compare=False)

    def reports(self, crossed: dict[str, list[int]]) -> list[KinkReport]:
        """One report per call that came near its kink or that some backend crossed."""
        out = []
        for i, b in enumerate(self.branches):
            counts = {name: int(c[i]) for name, c in crossed.items() if i < len(c) and c[i]}
            if b.near or b.below_float64 or counts:
                out.append(b.report(i, counts))
        return out


SLOT = "kinks"  # this module's slot among the op interceptors (gradcheck.ops.dispatch)


class _State(dispatch.Interceptor):
    """A recording or pinning in progress: the interceptor of every op call while its block runs."""

    def __init__(self, mode: str, recording: Recording, layer_of: Callable[[], str], stats: bool = True,
                 hold: Recording | None = None):
        self.mode = mode  # "record" or "pin"
        self.hold = hold  # record: the reference whose held values this pass gets back (a referee pass)
        self.stop = hold is not None and _STOPPING.get()  # record: raise Crossed at the first differing decision
        self.held_position = 0
        self.stats = stats  # record: measure distances too (the reference forward), or decisions alone
        self.recording = recording
        self.layer_of = layer_of
        self.depth = 0  # > 0 inside an op: nested kink calls are neither recorded nor pinned
        self.position = 0
        self.crossed: list = []  # pin: per call, the elements where the backend's own decision differed
        self.decisions: list | None = None  # pin: the decision arrays as the backend holds them (jax: traced)

    def around(self, name: str, run: Callable, args: tuple, kwargs: dict):
        """The dispatcher's hook, on every op call: kink ops called from layer code are recorded or pinned.

        Calls made inside an op (``depth > 0``: its derived body, a pinned op's own arithmetic) only run.
        """
        if self.depth == 0 and name in OPS:
            return call(self, name, run, args, kwargs)
        self.depth += 1
        try:
            return run(*args, **kwargs)
        finally:
            self.depth -= 1


def active() -> _State | None:
    """The recording or pinning in effect, or None."""
    return dispatch.innermost(SLOT)


@contextlib.contextmanager
def recording(layer_of: Callable[[], str] = lambda: "", stats: bool = True, hold: Recording | None = None):
    """Record the branch of every kink op called (on numpy, in float64) inside the block.

    ``stats=False`` records the decisions alone (the referee's passes only ask whether they changed);
    ``hold``, a reference forward's recording, gives each ``stop_gradient`` call the value it held there.
    """
    with dispatch.intercepting(SLOT, _State("record", Recording(), layer_of, stats, hold)) as state:
        yield state.recording


@contextlib.contextmanager
def pinned(rec: Recording):
    """Pin every kink op called inside the block to ``rec``'s branches; yields the state (its ``crossed``)."""
    with dispatch.intercepting(SLOT, _State("pin", rec, lambda: "")) as state:
        yield state


@contextlib.contextmanager
def stopping_at_crossing():
    """Inside the block, a pass recorded with ``hold`` (a referee pass) raises ``Crossed`` at its first kink
    decision that differs from the reference's, instead of running to the end.

    A referee step that crosses a kink is shrunk and taken again, its value
    unused, and all it needs to know is that it crossed (``differing`` > 0):
    the rest of the pass, and the other end of the step, are work for nothing.
    """
    token = _STOPPING.set(True)
    try:
        yield
    finally:
        _STOPPING.reset(token)


@contextlib.contextmanager
def suspended():
    """No recording or pinning inside the block (a driver's own bookkeeping)."""
    with dispatch.intercepting(SLOT, None):
        yield


def skip(n: int) -> None:
    """The pinned run in effect passes over ``n`` of the reference's kink calls that it does not make itself (a
    custom rule or a loop that jax runs whole, ``gradcheck.frontends.jax``): they are not pinned there, and count
    no crossing."""
    state = active()
    if state is not None and state.mode == "pin" and state.depth == 0 and n:
        state.position += n
        state.crossed.extend([0] * n)


def mark() -> tuple[int, int] | None:
    """Where the pinned run in effect is (``rewind`` returns it there), or None outside a pinned run."""
    state = active()
    return (state.position, len(state.crossed)) if state is not None and state.mode == "pin" else None


def rewind(at: tuple[int, int] | None) -> None:
    """The pinned run in effect back at ``at`` (``mark``): the calls made since are undone, as if not made."""
    state = active()
    if at is not None and state is not None and state.mode == "pin":
        state.position = at[0]
        del state.crossed[at[1]:]


def decision_arrays(rec: Recording) -> list[np.ndarray]:
    return [b.decision for b in rec.branches]


@contextlib.contextmanager
def decisions_as(state: _State, arrays: list):
    """Inside the block the pinned ops read their decisions from ``arrays`` (jax: the traced inputs)."""
    saved = state.decisions, state.position, state.crossed
    state.decisions, state.position, state.crossed = list(arrays), 0, []
    try:
        yield state
    finally:
        state.decisions, state.position = saved[0], saved[1]


# ---------------------------------------------------------------- recording or pinning one call
def call(state: _State, name: str, run: Callable, args: tuple, kwargs: dict):
    """Run kink op ``name`` under ``state``: record its branch, or pin it to the recorded one.

    ``run(*args, **kwargs)`` is the op as dispatched (the backend's kernel).
    """
    if name == "stop_gradient":
        return _held(state, run, args, kwargs)
    state.depth += 1
    try:
        if state.mode == "record":
            out = run(*args, **kwargs)
            state.recording.branches.append(_RECORD[name](state.layer_of(), name, out, *args, **kwargs))
            if state.stop:
                _stop_if_crossed(state)
            return out
        i = state.position
        branches = state.recording.branches
        if i >= len(branches) or branches[i].op != name:
            found = branches[i].op if i < len(branches) else "nothing"
            raise KinkMismatch(f"kink op call {i} is {name} here but {found} in the float64 reference forward")
        state.position += 1
        if name not in ("maximum", "minimum", "greater", "less") and ops.shape_of(args[0]) != branches[i].shape:
            raise KinkMismatch(f"kink op call {i} ({name}): input of shape {ops.shape_of(args[0])} where the "
                               f"float64 reference had {branches[i].shape}")
        decision = branches[i].decision if state.decisions is None else state.decisions[i]
        out, crossed = _PIN[name](name, run, decision, *args, **kwargs)
        state.crossed.append(crossed)
        return out
    finally:
        state.depth -= 1


def _held(state: _State, run: Callable, args: tuple, kwargs: dict):
    """``stop_gradient`` on numpy while recording: keep its value, or, in a pass with ``hold``, give the held one."""
    out = run(*args, **kwargs)
    if state.mode != "record" or backend_of(out) not in ("numpy", None):
        return out  # a backend's run: its own stop_gradient is what it differentiates
    if state.hold is None:
        state.recording.held.append(np.array(out, copy=True))
        return out
    i = state.held_position
    state.held_position += 1
    held = state.hold.held
    if i < len(held) and np.shape(held[i]) == np.shape(out):
        return held[i].copy()
    state.recording.misheld += 1
    return out


# ---------------------------------------------------------------- recording (numpy, float64)
def _stats(branch: Branch, distance: np.ndarray, scale: float) -> Branch:
    d = np.abs(np.asarray(distance, np.float64)).ravel()
    branch.elements = int(d.size)
    # Exact ties and exact zeros (relu's zeros meeting in a max-pool window, zero padding) are the same in
    # every precision: no rounding moves them across.
    d = d[(d > 0) & np.isfinite(d)]  # an infinite distance (a -inf mask against a value) is no kink
    if d.size and scale > 0:
        rel = d / scale
        branch.near = int(np.count_nonzero(rel < FLOAT32_REACH))
        branch.below_float64 = int(np.count_nonzero(rel < FLOAT64_REACH))
        branch.min_distance = float(rel.min())
    return branch


def _scale(*xs) -> float:
    """The largest finite magnitude among the inputs: an infinity (a mask's -inf) would make every distance 0."""
    return max((float(np.max(np.abs(x), where=np.isfinite(x), initial=0.0)) if np.size(x) else 0.0) for x in xs)


def _float(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def _measuring() -> bool:
    state = active()
    return state is None or state.stats


def _record_positive(layer, name, out, x, *rest, **kw):
    x = _float(x)
    branch = Branch(name, layer, x > 0, x.shape)
    return _stats(branch, x, _scale(x)) if _measuring() else branch


def _record_abs(layer, name, out, x):
    x = _float(x)
    branch = Branch(name, layer, np.sign(x), x.shape)
    return _stats(branch, x, _scale(x)) if _measuring() else branch


def _record_compare(layer, name, out, a, b):
    a, b = _float(a), _float(b)
    decision = np.asarray(a > b if name in ("maximum", "greater") else a < b)
    branch = Branch(name, layer, decision, decision.shape)
    if not _measuring():
        return branch
    return _stats(branch, np.broadcast_to(a - b, decision.shape), _scale(a, b))


def _axes(x: np.ndarray, axis) -> tuple:
    if axis is None:
        return tuple(range(x.ndim))
    return tuple(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis))


def _record_reduce(layer, name, out, x, axis=None, keepdims=False):
    """``max``/``min``: a one-hot of the first extremum over the reduced axes, and the gap to the runner-up."""
    x = _float(x)
    axes = _axes(x, axis)
    keep = [a for a in range(x.ndim) if a not in axes]
    moved = np.transpose(x, keep + list(axes)).reshape([x.shape[a] for a in keep] + [-1])
    signed = moved if name == "max" else -moved
    first = np.argmax(signed, axis=-1)
    hot = np.zeros(signed.shape, bool)
    np.put_along_axis(hot, first[..., None], True, axis=-1)
    if signed.shape[-1] > 1:
        top2 = -np.partition(-signed, 1, axis=-1)[..., :2]
        gap = top2[..., 0] - top2[..., 1]
    else:
        gap = np.full(signed.shape[:-1], np.inf)
    # Back to x's layout: the one-hot has x's shape.
    hot = hot.reshape([x.shape[a] for a in keep] + [x.shape[a] for a in axes])
    hot = np.transpose(hot, np.argsort(keep + list(axes)))
    branch = Branch(name, layer, hot, x.shape)
    return _stats(branch, gap[np.isfinite(gap)], _scale(x)) if _measuring() else branch


def _record_max_pool(layer, name, out, x, kernel_size, stride=None, padding=0):
    """Which kernel tap holds each window's first maximum (a one-hot over taps), and each window's gap to its runner-up."""
    x = _float(x)
    g = rules.pool_geometry(name, x.shape, kernel_size, stride, padding)
    taps = np.stack(kernels._taps(x, g, -np.inf))  # (kh*kw, N, C, oh, ow), taps in row-major order
    hot = np.zeros(taps.shape, bool)
    np.put_along_axis(hot, np.argmax(taps, axis=0)[None], True, axis=0)
    if not _measuring():
        return Branch(name, layer, hot, x.shape)
    if taps.shape[0] > 1:
        top2 = -np.partition(-taps, 1, axis=0)[:2]
        with np.errstate(invalid="ignore"):
            gap = top2[0] - top2[1]
        gap = gap[np.isfinite(gap)]
    else:
        gap = np.zeros(0)
    return _stats(Branch(name, layer, hot, x.shape), gap, _scale(x))


_RECORD = {"relu": _record_positive, "leaky_relu": _record_positive, "elu": _record_positive,
           "abs": _record_abs, "maximum": _record_compare, "minimum": _record_compare, "greater": _record_compare,
           "less": _record_compare, "max": _record_reduce, "min": _record_reduce, "max_pool2d": _record_max_pool}


# ---------------------------------------------------------------- pinning (any backend, through ops)
def _count_differ(same, like):
    """How many elements of the boolean ``same`` are False (a backend scalar)."""
    f = ops.astype(same, ops.dtype_of(like))
    return ops.sub(float(np.prod(ops.shape_of(f), dtype=np.int64)), ops.sum(f))


def _pin_positive(name, run, decision, x, *rest, **kw):
    """relu / leaky_relu / elu: the kernel, and where its side of 0 differs, the reference's branch."""
    mine = run(x, *rest, **kw)
    same = ops.equal(ops.greater(x, 0.0), decision)
    # The reference's branch at the crossed elements: the identity on the positive side, the op's value at
    # the same x on the other (it is continuous, so both sides give nearly the same value there).
    if name == "relu":
        other = ops.where(decision, x, ops.zeros_like(x))
    elif name == "leaky_relu":
        slope = rest[0] if rest else kw.get("negative_slope", 0.01)
        other = ops.where(decision, x, ops.mul(x, slope))
    else:  # elu
        alpha = rest[0] if rest else kw.get("alpha", 1.0)
        other = ops.where(decision, x, ops.mul(ops.expm1(ops.minimum(x, 0.0)), alpha))
    return ops.where(same, mine, other), _count_differ(same, x)


def _pin_abs(name, run, decision, x):
    mine = run(x)
    sign = ops.asarray(decision, like=x) if isinstance(decision, np.ndarray) else ops.astype(decision, ops.dtype_of(x))
    same = ops.equal(ops.greater(x, 0.0), ops.greater(sign, 0.0))
    return ops.where(same, mine, ops.mul(x, sign)), _count_differ(same, x)


def _pin_choose(name, run, decision, a, b):
    """maximum / minimum: where the kernel picks the other operand than the reference did, the reference's."""
    mine = run(a, b)
    cmp = ops.greater(a, b) if name == "maximum" else ops.less(a, b)
    same = ops.equal(cmp, decision)
    return ops.where(same, mine, ops.where(decision, a, b)), _count_differ(same, mine)


def _pin_compare(name, run, decision, a, b):
    """greater / less: the reference's answer (a comparison has no gradient: the branch is the whole result)."""
    mine = run(a, b)
    ref = ops.asarray(decision, like=mine) if isinstance(decision, np.ndarray) else decision
    same = ops.equal(mine, ref)
    # Count in a float dtype of the operands (a bool result cannot be summed as floats everywhere).
    float_operand = next((v for v in (a, b) if hasattr(v, "dtype") and np.dtype(ops.dtype_of(v)).kind == "f"), None)
    count = _count_differ(same, float_operand) if float_operand is not None else 0
    return ref, count


def _pin_reduce(name, run, decision, x, axis=None, keepdims=False):
    """max / min: where the kernel's extremum is not the reference's element, that element."""
    mine = run(x, axis=axis, keepdims=keepdims)
    hot = ops.asarray(decision, like=x) if isinstance(decision, np.ndarray) else decision
    ref = ops.sum(ops.where(hot, x, ops.zeros_like(x)), axis=axis, keepdims=keepdims)
    moved = ops.greater(mine, ref) if name == "max" else ops.less(mine, ref)
    return ops.where(moved, ref, mine), _count_true(moved, x)


def _count_true(mask, like):
    return ops.sum(ops.astype(mask, ops.dtype_of(like)))


def _pin_max_pool(name, run, decision, x, kernel_size, stride=None, padding=0):
    """max_pool2d: each window's element at the reference's tap (a selection: it rounds nothing).

    Not the kernel with corrections, as for relu: two elements of a window
    that tie in float32 but not in float64 would go to the kernel's first
    maximum, which need not be the float64 one.  The tap views are strided
    slices of the padded input, so the gradient goes to the reference's
    element exactly; the kernel itself still runs, to count its crossings.
    """
    mine = run(x, kernel_size, stride, padding)
    g = rules.pool_geometry(name, ops.shape_of(x), kernel_size, stride, padding)
    (pt, pb), (pl, pr) = g.pads
    padded = ops.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))) if pt or pb or pl or pr else x
    sh, sw = g.stride
    hot = ops.asarray(decision, like=x) if isinstance(decision, np.ndarray) else decision
    out = None
    for t in range(g.kh * g.kw):
        i, j = divmod(t, g.kw)
        tap = ops.getitem(padded, (slice(None), slice(None), slice(i, i + sh * (g.oh - 1) + 1, sh),
                                   slice(j, j + sw * (g.ow - 1) + 1, sw)))
        picked = ops.where(ops.getitem(hot, t), tap, ops.zeros_like(tap))
        out = picked if out is None else ops.add(out, picked)
    return out, _count_differ(ops.equal(mine, out), x)


_PIN = {"relu": _pin_positive, "leaky_relu": _pin_positive, "elu": _pin_positive, "abs": _pin_abs,
        "maximum": _pin_choose, "minimum": _pin_choose, "greater": _pin_compare, "less": _pin_compare,
        "max": _pin_reduce, "min": _pin_reduce, "max_pool2d": _pin_max_pool}


@contextlib.contextmanager
def resumed(state: _State):
    """Make ``state`` the active one inside the block (a driver tracing under a state it suspended)."""
    with dispatch.intercepting(SLOT, state):
        yield state


def _stop_if_crossed(state: _State) -> None:
    """Raise ``Crossed`` when the branch just recorded differs from the reference's at its place (as ``differing``
    counts it)."""
    i = len(state.recording.branches) - 1
    reference = state.hold.branches
    if i >= len(reference) or _crossed(reference[i], state.recording.branches[i]):
        raise Crossed(f"kink op call {i} ({state.recording.branches[i].op}) took another decision than the "
                      "float64 reference forward")


def _crossed(a: Branch, b: Branch) -> int:
    """How many of call ``b``'s decisions differ from the reference call ``a``'s (a call that does not match
    counts whole)."""
    if a is b:  # a branch a pass reused from the reference (gradcheck.frontends.torch.reuse)
        return 0
    if a.op != b.op or a.decision.shape != b.decision.shape:
        return max(1, a.decision.size)
    return int(np.count_nonzero(a.decision != b.decision))


def differing(reference: Recording, other: Recording) -> int:
    """How many kink decisions of ``other`` differ from ``reference``'s (calls that do not match count whole)."""
    if len(reference.branches) != len(other.branches):
        return max(1, abs(len(reference.branches) - len(other.branches)))
    # a held value that could not be given back changes the function like a crossed kink
    return other.misheld + sum(_crossed(a, b) for a, b in zip(reference.branches, other.branches))
