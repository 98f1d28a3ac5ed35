"""How much float64 itself can decide at this point: its rounding, amplified by the model, measured.

A network at a point where it is ill-conditioned amplifies float64's
rounding many orders of magnitude.  EfficientNet-B0 at 32x32 with a batch of
two is one: its last BatchNorms normalise two values per channel, and its
gradients reach 1e10; two correct backends then differ by 1e-8 of a
gradient, beyond any fixed float64 tolerance, and the finite difference's
own rounding far exceeds the few bits the referee's floor assumes.  Neither
is a wrong gradient, and neither may be guessed away by a wider tolerance:
both are *measured*, at the point.

The probe moves every float64 leaf by one ulp, each element up or down at
random (from the case seed) — what rounding does to
every value a forward computes — and reads what moves:

* the loss (``loss_noise``): the referee's resolution has a floor of
  ``loss_noise / h``, its numerator's rounding error (``gradcheck.check.referee``);
* each backend's float64 gradient of a leaf the backends disagree on
  (``spread``, relative, in norm): two backends whose difference is within
  ``SPREAD_FACTOR`` times the median spread cannot be told apart by float64
  here, and the leaf agrees *within float64's reach*, saying so with the
  numbers.  A well-conditioned leaf moves by ~1e-15, so nothing a check could
  catch before is let through.

Why a unit roundoff at the inputs stands for the rounding inside: each op
rounds its result by up to one unit, and the error is carried to the output
by the Jacobian from that op on; the inputs' Jacobian is the longest of
those chains, so the probe sees the largest amplification, and the factor
covers the sum over the ops' independent roundings and the two backends'.
"""

from __future__ import annotations

import numpy as np

from gradcheck.check import sums

UNIT = 2.0 ** -53  # float64's unit roundoff
UNIT32 = 2.0 ** -24  # float32's
# Two correct backends' float64 results differ by the rounding of every op either computes, carried by the
# model; the probe measures one such rounding at the inputs.  On EfficientNet-B0 at 32x32 the backends'
# differences were 1.4 to 2.9 times the probe's spread over 166 leaves (docs/decisions.md); the factor leaves
# five times that, and a wrong gradient of the usual kind (1e-4 or more of a leaf) is still far outside it.
SPREAD_FACTOR = 16.0


# By dtype name; numpy's finfo knows neither bfloat16 nor the float8s, and a complex dtype rounds as its parts.
_UNITS = {"float64": UNIT, "complex128": UNIT, "float32": UNIT32, "complex64": UNIT32, "float16": 2.0 ** -11,
          "bfloat16": 2.0 ** -8, "float8_e4m3fn": 2.0 ** -4, "float8_e5m2": 2.0 ** -3}


def unit_roundoff(dtype: str) -> float:
    """The unit roundoff of a float dtype by name (``"float32"``: 2^-24); ValueError for a name it does not know."""
    if dtype not in _UNITS:
        raise ValueError(f"unit_roundoff: {dtype!r} is not a float dtype it knows ({', '.join(_UNITS)})")
    return _UNITS[dtype]


def perturbed(values: dict[str, np.ndarray], seed: int, draw: int = 0, unit: float = UNIT) -> dict[str, np.ndarray]:
    """Each float64 array moved by one ulp per element (a relative step between one and two unit roundoffs), up
    or down at random (from ``seed``); exact zeros and non-finite values stay (a zero's neighbour is a denormal,
    not a rounding).  ``unit``: a coarser unit roundoff (the float32 a model casts part of its float64 run to)
    moves each element by two of those units of its magnitude instead, so that a value the model rounds to that
    float moves too (one float64 ulp would vanish in its rounding)."""
    out = {}
    for i, (path, v) in enumerate(sorted(values.items())):
        v = np.asarray(v, np.float64, order="C")
        up = _coin_flips(np.random.default_rng([int(seed), 0x524F554E, int(draw), i]), v.shape)
        if unit > UNIT:
            out[path] = np.where(np.isfinite(v), v + np.where(up, 2 * unit, -2 * unit) * np.abs(v), v)
        else:
            out[path] = _one_ulp(v, up)
    return out


def _coin_flips(rng: np.random.Generator, shape) -> np.ndarray:
    """One fair random bit per element, eight to a drawn byte (a draw per element cost a quarter of a second on
    ResNet-18's 11.7 M parameters, for every probe)."""
    n = int(np.prod(shape, dtype=np.int64))
    drawn = rng.integers(0, 256, size=(n + 7) // 8, dtype=np.uint8)
    return np.unpackbits(drawn, count=n).view(bool).reshape(shape)


def _one_ulp(v: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``np.nextafter(v, +inf where up else -inf)`` on finite non-zero elements, by one step of the bit pattern:
    as an integer, a float's magnitude grows with its bits whatever its sign, so +1 moves away from zero and -1
    towards it; up is away from zero for a positive value and towards it for a negative one.  Computed in blocks
    into the result, so that the steps' temporaries stay block-sized (ResNet-18's largest leaf is 19 MB)."""
    shape, v, up = v.shape, v.reshape(-1), up.reshape(-1)  # flat: a 0-d array's arithmetic gives scalars
    out = np.empty(v.size, np.float64)
    bits = out.view(np.int64)
    for lo in range(0, v.size, _BLOCK):
        vb, ub, moved = v[lo:lo + _BLOCK], up[lo:lo + _BLOCK], bits[lo:lo + _BLOCK]
        np.copyto(moved, ub == (vb > 0))  # 1 where the step is away from zero, 0 where towards it
        moved *= 2
        moved -= 1
        moved += vb.view(np.int64)
        np.copyto(out[lo:lo + _BLOCK], vb, where=(vb == 0) | ~np.isfinite(vb))
    return out.reshape(shape)


_BLOCK = 1 << 16


def loss_noise(loss64, point: dict[str, np.ndarray], seed: int, draws: int = 2, base: float | None = None) -> float:
    """How far the float64 loss moves when every leaf of ``point`` moves by one unit roundoff (the largest of
    ``draws`` random moves): the rounding error a finite difference's numerator carries at this point.  ``base``:
    the loss at the point itself, when the caller already has it (one forward pass fewer)."""
    base = _value(loss64({})) if base is None else float(base)
    moved = [abs(_value(loss64(perturbed(point, seed, d))) - base) for d in range(draws)]
    return float(max(moved, default=0.0))


def _value(out) -> float:
    return float(out[0]) if isinstance(out, tuple) else float(out)


def spread(before: np.ndarray, after: np.ndarray) -> float:
    """``||after - before|| / ||before||`` in float64 (0 for an empty or zero leaf)."""
    a, b = np.asarray(before, np.float64), np.asarray(after, np.float64)
    norm = sums.norm(a)
    if norm == 0 or a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return 0.0
    return sums.norm(b - a) / norm


def within_reach(leaf, spreads: dict[str, float], computes_in: str = "float64") -> bool:
    """Whether a disagreeing leaf's disagreement lies within float64's reach as the spreads measured it; if so,
    the leaf agrees (no blame), and says why (``LeafResult.rounding``).  Its pairs within reach agree either way,
    so that a majority can outvote a backend whose gradient is outside it (the caller decides the leaf again).

    Within reach: every pair that disagrees differs by at most ``SPREAD_FACTOR``
    times the median spread (relative, in norm), and every stable referee check
    that misses a backend misses it by at most its resolution plus that much of
    the gradient's norm along the direction (a standard normal direction carries
    a gradient error of norm e into an answer error of about e).

    ``computes_in``: the narrowest float the float64 run computes in.  A model
    that casts to float32 itself (a softmax in float32, ``x.astype(jnp.float32)``)
    is followed by every backend, so its float64 run rounds as float32 does
    there; the caller's probe then moved the inputs by that float's unit
    (``perturbed(unit=...)``), and the spreads are that rounding's effect.
    """
    measured = [s for s in spreads.values() if s > 0]
    if not measured or leaf.verdict != "disagree":
        return False
    leaf.rounding = float(np.median(measured))
    reach = SPREAD_FACTOR * leaf.rounding
    cast = (f" ({computes_in}'s: the float64 run computes in {computes_in} where the model casts to it, and the probe "
            "moved the inputs by its unit)") if unit_roundoff(computes_in) > UNIT else ""
    pairs = [p for p in leaf.pairs if p.verdict == "disagree"]
    within = [p for p in pairs if p.rel_err_norm <= reach]
    for p in within:  # these two cannot be told apart here, whatever the others do (a majority can form)
        p.verdict = "agree"
        p.message = (f"{p.message}; within float64's reach here ({p.rel_err_norm:.2g} <= {SPREAD_FACTOR:g} x "
                     f"{leaf.rounding:.2g})")
    if len(within) < len(pairs):
        return False
    norm = float(np.median(list(leaf.norms.values()))) if leaf.norms else 0.0
    missed = [c for c in leaf.referee if c.stable and not c.agrees]
    if any(abs(c.directional - c.numeric) > c.resolution + reach * norm for c in missed):
        return False
    parts = []
    if pairs:
        worst = max(pairs, key=lambda p: p.rel_err_norm)
        parts.append(f"the backends differ by {worst.rel_err_norm:.2g} ({worst.backend} vs {worst.reference})")
    if missed:
        worst_c = max(missed, key=lambda c: abs(c.directional - c.numeric))
        parts.append(f"the finite difference by {abs(worst_c.directional - worst_c.numeric) / max(norm, 1e-300):.2g} "
                     f"of the gradient's norm ({worst_c.backend})")
    leaf.verdict, leaf.blame = "agree", []
    what = "value" if leaf.role in ("output", "buffer") else "gradient"
    leaf.message = (f"agrees within float64's reach here: a unit roundoff at the inputs moves this {what} by "
                    f"{leaf.rounding:.2g} of its norm (median over {len(measured)} backends){cast}, and "
                    f"{' and '.join(parts)}, within {SPREAD_FACTOR:g}x that; float64 cannot tell them apart here")
    return True


def float32_within_reach(leaf, spreads: dict[str, float], probe_unit: float = UNIT) -> bool:
    """Whether the backends a leaf's float32 part finds imprecise are off by no more than float32's own rounding,
    amplified at this point, can move the leaf; if so they are not imprecise, and the part says why.

    float32's precision is measured against float64 (``verdict.float32_part``), and a backend is imprecise when
    its error is more than ``factor`` times the best backend's plus a floor.  At a point that amplifies rounding
    that comparison reads noise: a gradient that is a sum of large terms cancelling to a small one (the scale of
    a layer whose output a batch-statistics BatchNorm normalises: exactly zero but for the norm's epsilon) is
    computed by every float32 backend with an error of the order of the terms, and which backend happened to land
    closest says nothing about the others.  The probe measures that amplification (``spread``: the relative move
    of the float64 result when every input moves by one float64 unit roundoff); float32 rounds every value
    ``UNIT32 / UNIT`` times as coarsely, so ``SPREAD_FACTOR`` times that spread, scaled so, is what float32 can
    reach here, and an error within it is rounding.  A well-conditioned leaf moves by ~1e-15 under the probe, a
    float32 reach of ~1e-5: an imprecise kernel there (a reduction in half precision, 1e-3) is still caught.
    """
    part = leaf.float32
    measured = [s for s in spreads.values() if s > 0]
    if part is None or part.verdict != "imprecise" or not measured:
        return False
    rounding = float(np.median(measured))
    reach = SPREAD_FACTOR * rounding * (UNIT32 / probe_unit)
    within = [n for n in part.imprecise if part.errors.get(n, np.inf) <= reach]
    if not within:
        return False
    part.limit = max(part.limit, reach)
    part.imprecise = [n for n in part.imprecise if n not in within]
    what = "value" if leaf.role in ("output", "buffer") else "gradient"
    probe = "a float64 unit roundoff" if probe_unit == UNIT else f"a move of {probe_unit:.2g} (the probe's unit)"
    times = f", times {UNIT32 / probe_unit:.0f}" if probe_unit != UNIT32 else ""
    said = (f"within float32's reach here: {probe} at the inputs moves this {what} by "
            f"{rounding:.2g} of its norm (median over {len(measured)} backends), so float32's rounding moves it by "
            f"up to {reach:.2g} ({SPREAD_FACTOR:g}x that{times}); "
            + ", ".join(f"{n}'s float32 error {part.errors[n]:.2g}" for n in within) + " lies within it")
    if part.imprecise:
        part.message = f"{part.message}; {said}"
    else:
        part.verdict, part.message = "ok", said
    return True
