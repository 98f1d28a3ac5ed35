"""Check a tape VJP against float64 central differences: the inner-product identity.

For ``y = f(x)`` with Jacobian ``J``, random directions ``u`` (input-shaped)
and ``v`` (output-shaped) must satisfy

    <v, J u>  =  <J^T v, u>

``J u`` comes from central differences of the plain-numpy forward along
``u``; ``J^T v`` comes from the tape (``tape.grad(out, [x], cotangent=v)``).
One scalar per differentiated argument is compared, so the check costs a few
forward passes whatever the sizes, and a wrong VJP almost surely moves the
scalar (u and v are random and dense).

Tolerance, derived from the step ``h``:

* truncation: the central difference ``D(h)`` is off by ``c h^2``; ``D(2h)``
  is off by ``4 c h^2``, so ``|D(2h) - D(h)| / 3`` estimates the error of
  ``D(h)`` from the data itself;
* rounding: each forward value carries a relative error of a few ulps of the
  terms it sums, which the difference quotient amplifies by ``1/h``; bounded
  by ``K * eps * sum |v| (|f(x+hu)| + |f(x-hu)|) / (2h)`` with ``K`` ulps, or
  by the jitter actually seen, whichever is larger: the largest second
  difference of ``f`` at 1 to 4 hairs (``h * 1e-4``) either side of ``x``,
  where its curvature is invisible and what moves is rounding.  The value
  bound alone misses functions whose value is a small difference of large
  terms (a gradient through a normalisation over two elements is ~1e-5 of
  its terms), where the noise is the terms'; and that noise moves in steps of
  the terms' ulp, so over a few elements one or two second differences are
  often exactly 0 (two of them missed it once in 20,000 such draws);
* a floor of ``1e-9`` relative to ``sum |v_i| |D_i|`` (the size of the terms
  of the inner product) for the tape's own float64 rounding.

The sum is multiplied by a safety factor of 10.  For inputs of order one and
``h = 1e-5`` the tolerance is a few 1e-8 relative (a 1e-5 relative error in a
VJP is caught), while a correct VJP typically uses under 1e-3 of it.  A truncation estimate that is
not small is itself a failure: it means a kink (relu at 0, a max tie) lies
within the step and the finite difference cannot referee.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gradcheck.backends.tape import tape
from gradcheck.backends.tape.tape import Tensor

EPS64 = np.finfo(np.float64).eps
ULPS = 64  # rounding steps one forward value may accumulate (conv sums, softmax)
SAFETY = 10.0
FLOOR_RTOL = 1e-9
STEP = 1e-5
JITTER_STEP = 1e-4  # of STEP: where a function's curvature is far below its rounding
# Second differences a hair apart, at 1..JITTER_POINTS hairs: rounding comes in steps of the ulp of the terms
# a value is computed from, and over a few elements one or two such differences are often exactly 0.
JITTER_POINTS = 4
MAX_TRUNCATION = 1e-4  # relative: beyond it the finite difference is not trustworthy


class VjpMismatch(AssertionError):
    """The tape's VJP disagrees with finite differences (or they cannot referee)."""


@dataclass
class Side:
    """One differentiated argument's comparison."""

    argnum: int
    tape: float  # <J^T v, u>
    numeric: float  # <v, J u>
    tol: float
    scale: float  # sum |v_i| |(J u)_i|: zero means the output ignores this argument

    @property
    def ok(self) -> bool:
        return bool(abs(self.tape - self.numeric) <= self.tol)


def _float_argnums(args) -> list[int]:
    return [i for i, a in enumerate(args) if isinstance(a, np.ndarray) and a.dtype.kind == "f"]


def _plain(out) -> np.ndarray:
    return np.asarray(tape.raw(out), dtype=np.float64)


def check_vjp(
    f: Callable,
    args: Sequence,
    *,
    name: str,
    wrt: Sequence[int] | None = None,
    numeric_f: Callable | None = None,
    stage: str = "vjp",
    seed: int = 0,
    step: float = STEP,
    expect_zero: bool = False,
    require_dependence: bool = True,
    grad_fn: Callable | None = None,
) -> list[Side]:
    """Assert ``<v, J u> == <J^T v, u>`` for each float argument of ``f``; return the sides.

    ``f(*args)`` is called with plain float64 numpy arrays for the numeric
    side (or ``numeric_f``, when the numeric forward is not ``f`` itself) and
    with tape tensors for the tape side.  ``wrt`` picks the differentiated
    arguments (default: every float array).  With ``require_dependence`` at
    least one argument must actually influence the output, so a check can
    never pass by comparing zero with zero everywhere; ``expect_zero`` instead
    demands that no argument does (``stop_gradient``, constants).  ``grad_fn(out, tensors, v)``
    replaces ``tape.grad`` (second-order checks pass ``create_graph``).
    """
    args = list(args)
    wrt = _float_argnums(args) if wrt is None else list(wrt)
    if not wrt:
        raise ValueError(f"{stage} of {name}: no float array argument to differentiate")
    for i in wrt:
        if args[i].dtype != np.float64:
            raise ValueError(f"{stage} of {name}: argument {i} is {args[i].dtype}; the checker needs float64")
    numeric_f = numeric_f or f
    grad_fn = grad_fn or (lambda out, xs, v: tape.grad(out, xs, cotangent=v))
    rng = np.random.default_rng(seed)

    # Tape side: one backward pass with a random cotangent gives J^T v for every argument.
    tensors = [Tensor(a, requires_grad=(i in wrt)) if isinstance(a, np.ndarray) else a for i, a in enumerate(args)]
    out = f(*tensors)
    y0 = _plain(numeric_f(*args))
    if tuple(np.shape(tape.raw(out))) != y0.shape:
        raise VjpMismatch(
            f"{stage} of {name}: tape output shape {np.shape(tape.raw(out))} vs numpy output shape {y0.shape}"
        )
    # Same numpy kernels on both sides, so the values agree to rounding.
    if not np.allclose(_plain(out), y0, rtol=1e-10, atol=1e-10 * max(1.0, float(np.max(np.abs(y0), initial=0.0)))):
        raise VjpMismatch(
            f"{stage} of {name}: tape forward differs from numpy forward by "
            f"{np.max(np.abs(_plain(out) - y0)):.3g}"
        )
    v = rng.standard_normal(y0.shape)
    if not isinstance(out, Tensor) or not out.requires_grad:
        grads = [np.zeros_like(args[i]) for i in wrt]
    else:
        grads = grad_fn(out, [tensors[i] for i in wrt], v)

    sides = []
    for i, g in zip(wrt, grads, strict=True):
        g = _plain(g)
        if g.shape != args[i].shape:
            raise VjpMismatch(f"{stage} of {name} wrt arg {i}: tape gradient shape {g.shape} vs input shape {args[i].shape}")
        u = rng.standard_normal(args[i].shape)

        def along(t, i=i, u=u):
            moved = list(args)
            moved[i] = args[i] + t * u
            return _plain(numeric_f(*moved))

        fp, fm, fp2, fm2 = along(step), along(-step), along(2 * step), along(-2 * step)
        d1 = (fp - fm) / (2 * step)
        d2 = (fp2 - fm2) / (4 * step)
        numeric = float(np.sum(v * d1))
        scale = float(np.sum(np.abs(v * d1)))
        truncation = abs(float(np.sum(v * (d2 - d1)))) / 3
        hair = step * JITTER_STEP
        jitter = np.zeros_like(y0)
        for k in range(1, JITTER_POINTS + 1):
            jitter = np.maximum(jitter, np.abs(along(k * hair) - 2 * y0 + along(-k * hair)))
        rounding = max(ULPS * EPS64 * float(np.sum(np.abs(v) * (np.abs(fp) + np.abs(fm)))),
                       float(np.sum(np.abs(v) * jitter))) / (2 * step)
        tol = SAFETY * (truncation + rounding + FLOOR_RTOL * scale)
        tape_side = float(np.sum(g * u))
        side = Side(i, tape_side, numeric, tol, scale)
        label = f"{stage} of {name} wrt arg {i}"
        if truncation > MAX_TRUNCATION * max(scale, 1e-300):
            raise VjpMismatch(
                f"{label}: finite differences are unstable (truncation estimate {truncation:.3g} vs "
                f"size {scale:.3g}); a kink or tie lies within the step {step:g}: move the inputs away from it"
            )
        if not side.ok:
            raise VjpMismatch(
                f"{label}: tape {tape_side:.10g} vs numeric {numeric:.10g} "
                f"(|diff| {abs(tape_side - numeric):.3g} > tol {tol:.3g}; step {step:g})"
            )
        sides.append(side)
    if require_dependence and not expect_zero and all(s.scale == 0.0 for s in sides):
        raise VjpMismatch(
            f"{stage} of {name}: the output depends on none of arguments {wrt} (J u = 0 for every one); "
            "a check that compares zero with zero cannot fail: choose inputs where the op is not flat"
        )
    if expect_zero and any(s.scale != 0.0 or s.tape != 0.0 for s in sides):
        raise VjpMismatch(f"{stage} of {name}: expected no gradient at all, got {sides}")
    return sides


def gradient_fn(f: Callable, argnum: int, w: np.ndarray, wrt: Sequence[int]) -> Callable:
    """``x -> J_f(x)^T w`` for argument ``argnum``, as a function the checker can differentiate again.

    With plain numpy arguments it runs an ordinary (first-order) tape backward
    pass and returns numpy: that is the numeric side of a second-order check.
    With tape tensors it records the backward pass (``create_graph``), so its
    own VJP is the Hessian-vector product under test.
    """

    def grad_of_f(*args):
        outer = any(isinstance(a, Tensor) and a.requires_grad for a in args)
        if outer:
            xs = list(args)
        else:
            xs = [Tensor(a, requires_grad=(i in wrt)) if isinstance(a, np.ndarray) else a
                  for i, a in enumerate(args)]
        target = xs[argnum]
        if not (isinstance(target, Tensor) and target.requires_grad):
            target = xs[argnum] = Tensor(tape.raw(target), requires_grad=True)
        out = f(*xs)
        if not isinstance(out, Tensor) or not out.requires_grad:
            return Tensor(np.zeros_like(tape.raw(target))) if outer else np.zeros_like(tape.raw(target))
        (g,) = tape.grad(out, [target], cotangent=w, create_graph=outer)
        return g

    return grad_of_f


def check_second_order(f: Callable, args: Sequence, *, name: str, seed: int = 0,
                       wrt: Sequence[int] | None = None) -> list[Side]:
    """Hessian-vector products of ``<w, f(args)>`` against finite differences of its gradient.

    For every differentiated argument ``i`` the gradient ``G_i = d<w, f>/dx_i``
    is itself checked as a function of all arguments: its tape VJP (through
    ``create_graph``) against central differences of the first-order tape
    gradient.  That covers every block ``d^2 <w, f> / dx_i dx_j``.
    """
    args = list(args)
    wrt = _float_argnums(args) if wrt is None else list(wrt)
    y = np.asarray(tape.raw(f(*args)))
    w = np.random.default_rng(seed + 7919).standard_normal(y.shape)
    sides = []
    for i in wrt:
        g = gradient_fn(f, i, w, wrt)
        sides += check_vjp(
            g, args, name=name, wrt=wrt, stage=f"second-order (d/dx{i} then VJP)", seed=seed + i,
            require_dependence=False,
        )
    if all(s.scale == 0.0 for s in sides):
        raise VjpMismatch(
            f"second-order of {name}: every Hessian block is zero at these inputs, so the check cannot fail; "
            "use an op (or inputs) with curvature"
        )
    return sides
