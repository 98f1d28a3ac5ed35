"""Leaf-by-leaf comparison across backends: structure, finiteness, values; verdict and blame.

For one leaf (a parameter's gradient, an input's gradient, the forward
output or an updated buffer) each backend gives an array, or nothing.  The
checks run in this order; a failed check 1 or 2 ends the comparison:

1. structure: every backend gives an array (and none gives one where none is
   expected), with the same shape and the expected dtype      -> ``structural``
2. finiteness: no NaN/Inf on any backend                      -> ``nonfinite``
   (blamed on the backends that have them, unless every backend has them at
   the same elements: then the function itself is not finite there)
3. values: every pair within its tolerance                   -> ``disagree``
4. substance: a parameter's or input's gradient is not ~0 on every backend
   (relative to the case's largest gradient entry)            -> ``vacuous``

Check 4 overrides check 3: a vacuous leaf's pairs are still compared and
their numbers recorded, but rounding noise around zero decides nothing.
Values leave the leaf ``agree`` or ``disagree`` as the pairs say; who is to
blame is decided afterwards, with the referee's checks, by
``gradcheck.check.verdict.decide``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import numpy as np

from gradcheck.backends import reference_rank  # which backend of a pair is its reference
from gradcheck.check import sums
from gradcheck.check.tolerance import ResolvedTolerance, ToleranceRules
from gradcheck.results import LeafResult, PairResult

HIST_EDGES = [float(e) for e in np.arange(-8.0, 4.01, 1.0)]
WORST_ELEMENTS = 5
MISSING = object()  # a backend that gave no array for a leaf
# A gradient this small relative to the largest gradient entry of the case is
# rounding noise around an exact zero (a bias followed by BatchNorm, a head
# that the loss ignores): comparing it checks nothing.
VACUOUS_REL = {"float32": 1e-5, "float64": 1e-11}


def pair_stats(a: np.ndarray, b: np.ndarray, tol: ResolvedTolerance, scale: float, backend: str,
               reference: str, value_scale: np.ndarray | None = None) -> PairResult:
    """How far ``a`` (backend) is from ``b`` (reference).

    The elementwise numbers (mismatched count, max abs/rel and where) are
    always computed; the verdict and the headroom follow the tolerance's
    criterion (see ``gradcheck.check.tolerance``).  ``value_scale``: see
    ``compare_leaf``.
    """
    return _pair(_Operand(a), _Operand(b), tol, scale, backend, reference, value_scale)[0]


class _Operand:
    """One backend's array, flat, with the numbers the pairs share, each computed once.

    float32 and float64 arrays are compared in their own precision (anything
    else in float64): the difference of two float32 numbers is exact to 6e-8
    of itself, which no tolerance comes near, and float32 passes move half
    the memory of float64 ones.  Sums (norms, inner products) accumulate in
    float64.  A leaf of ResNet-18 holds up to 2.4 M elements and is compared
    in three pairs: this is what judging a model costs.
    """

    def __init__(self, v):
        v = np.asarray(v)
        self.v = v if v.dtype in (np.float32, np.float64) else v.astype(np.float64)
        self.flat = self.v.reshape(-1)  # a view of a contiguous array; one copy of any other
        self._norm = self._max_abs = None

    @property
    def max_abs(self) -> float:
        if self._max_abs is None:
            f = self.flat
            self._max_abs = float(max(f.max(), -f.min())) if f.size else 0.0
        return self._max_abs

    @property
    def norm(self) -> float:
        if self._norm is None:
            self._norm = float(np.sqrt(sums.inner(self.flat, self.flat)))
        return self._norm


# A pair is compared in blocks of this many elements.  Each elementwise step (the difference, |b|, the allowed
# error, the ratios) writes a temporary: leaf-sized ones stream every step through memory, and a fresh one is
# mapped by the kernel page by page (a leaf of ResNet-18 is 19 MB in float64); a block's stay in the core's cache,
# in buffers reused from block to block.  The results are the same but for the order of the sums (the norm of the
# difference); see docs/decisions.md, "Comparing a pair in blocks".
BLOCK = 1 << 14


class _Blocks:
    """The elementwise quantities of one pair, block by block: ``|a - b|``, ``|b|`` and the allowed error
    ``atol + rtol (|b| + value_scale)``, in buffers reused for every block."""

    def __init__(self, a: _Operand, b: _Operand, rtol: float, atol: float, value_scale: np.ndarray | None):
        self.a, self.b, self.rtol, self.atol = a.flat, b.flat, rtol, atol
        self.scale = None if value_scale is None else value_scale.reshape(-1)
        m = min(BLOCK, self.a.size)
        dtype = np.result_type(self.a, self.b)
        self.diff, self.babs, self.allowed, self.ratio = (np.empty(m, dtype) for _ in range(4))
        self.spare = np.empty(m, np.result_type(dtype, np.float64)) if value_scale is not None else None

    def __iter__(self):
        """``(start, diff, babs, allowed)`` per block; ``diff`` holds ``a - b`` until the caller takes its
        absolute value (``absolute``), so that the signed difference's norm is taken first."""
        n = self.a.size
        for lo in range(0, n, BLOCK):
            hi = min(lo + BLOCK, n)
            m = hi - lo
            diff, babs, allowed = self.diff[:m], self.babs[:m], self.allowed[:m]
            np.subtract(self.a[lo:hi], self.b[lo:hi], out=diff)
            np.abs(self.b[lo:hi], out=babs)
            np.multiply(babs, self.rtol, out=allowed)
            if self.scale is not None:
                spare = self.spare[:m]
                np.multiply(self.scale[lo:hi], self.rtol, out=spare)
                allowed += spare
            allowed += self.atol
            yield lo, diff, babs, allowed

    def ratios(self):
        """``(start, |a - b| / allowed)`` per block (see ``_ratio``)."""
        for lo, diff, _, allowed in self:
            np.abs(diff, out=diff)
            yield lo, _ratio(diff, allowed, self.ratio[:diff.size])


def _ratio(diff: np.ndarray, allowed: np.ndarray, out: np.ndarray) -> np.ndarray:
    """|a-b| / allowed elementwise into ``out``, 0 where a == b (inf where nothing is allowed and they differ).

    Two passes: where a == b and nothing is allowed the quotient is 0/0, a NaN, and ``fmax(NaN, 0)`` is 0.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        np.divide(diff, allowed, out=out)
    return np.fmax(out, 0.0, out=out)


class _Largest:
    """The first largest value of a blockwise pass and its flat index (np.argmax's choice over the whole array)."""

    def __init__(self):
        self.value, self.at = -np.inf, 0

    def see(self, lo: int, block: np.ndarray) -> None:
        k = int(np.argmax(block))
        if block[k] > self.value:
            self.value, self.at = float(block[k]), lo + k


def _pair(a: _Operand, b: _Operand, tol: ResolvedTolerance, scale: float, backend: str,
          reference: str, value_scale: np.ndarray | None = None) -> tuple[PairResult, Callable[[], Iterator]]:
    """The pair's result, and a function giving its elementwise error ratios block by block (for the
    worst-element table, which only the leaf's worst pair needs)."""
    blocks = _Blocks(a, b, tol.rtol, tol.absolute(scale), value_scale)
    elementwise = tol.criterion != "norm"
    squares, mismatched, headroom = 0.0, 0, 0.0
    largest_abs, largest_rel = _Largest(), _Largest()
    for lo, diff, babs, allowed in blocks:
        squares += sums.inner(diff, diff)
        np.abs(diff, out=diff)
        largest_abs.see(lo, diff)
        mismatched += int(np.count_nonzero(diff > allowed))
        ratio = blocks.ratio[:diff.size]
        largest_rel.see(lo, _ratio(diff, babs, ratio))
        if elementwise:
            headroom = max(headroom, float(np.max(_ratio(diff, allowed, ratio))))
    nd = float(np.sqrt(squares))
    na, nb = a.norm, b.norm
    size, shape = a.flat.size, a.v.shape
    out = PairResult(backend=backend, reference=reference, verdict="agree", mismatched=mismatched, total=size)
    if size:
        out.max_abs, out.max_abs_index = largest_abs.value, [int(k) for k in np.unravel_index(largest_abs.at, shape)]
        out.max_rel, out.max_rel_index = largest_rel.value, [int(k) for k in np.unravel_index(largest_rel.at, shape)]
    out.rel_err_norm = nd / nb if nb > 0 else (0.0 if nd == 0 else float("inf"))
    out.cosine = sums.inner(a.flat, b.flat) / (na * nb) if na > 0 and nb > 0 else float(na == nb)
    if tol.criterion == "norm":
        limit = tol.norm_rtol
        out.headroom = out.rel_err_norm / limit if limit > 0 else (0.0 if nd == 0 else float("inf"))
        failed = out.headroom > 1.0
        what = f"relative error norm {out.rel_err_norm:.3g} > {limit:.3g}"
    else:
        out.headroom = headroom
        failed = out.mismatched > 0
        what = f"{out.mismatched}/{out.total} elements off"
    if failed:
        out.verdict = "disagree"
        out.message = (f"{backend} vs {reference}: {what}, max abs {out.max_abs:.3g} at {out.max_abs_index}, "
                       f"max rel {out.max_rel:.3g}, headroom {out.headroom:.3g}")
    return out, blocks.ratios


def compare_leaf(path: str, role: str, arrays: dict, *, dtype: str, rules: ToleranceRules, layer: str = "",
                 expect_array: bool = True, case_scale: float = 0.0,
                 value_scale: np.ndarray | None = None) -> LeafResult:
    """Compare one leaf across backends. ``arrays`` maps backend -> array, None or MISSING.

    ``case_scale`` is, for a gradient, the largest gradient entry of the
    whole case, against which the leaf is judged vacuous (see
    ``VACUOUS_REL``); for a buffer, the scale of the case's updated buffers,
    below which its absolute tolerance does not go (see
    ``runner._buffer_scale``).  ``value_scale``, for an updated buffer, is a
    scale per element that its relative tolerance applies to besides its own
    value, ``|a - b| <= atol + rtol (|b| + value_scale)``
    (``statistic_scales``).  The
    leaf comes back ``agree`` or ``disagree`` as its pairs say (or with the
    verdict of a failed earlier check); blame is ``verdict.decide``'s.
    """
    leaf = LeafResult(path=path, role=role, layer=layer, dtype=dtype)
    names = sorted(arrays, key=reference_rank)
    given = {n: np.asarray(arrays[n]) for n in names if arrays[n] is not None and arrays[n] is not MISSING}
    if given:
        leaf.shape = list(next(iter(given.values())).shape)

    structural = _structure(leaf, names, arrays, given, expect_array, dtype)
    if structural or not expect_array:
        return leaf

    if not all(_finite(v) for v in given.values()):
        return _nonfinite(leaf, given, {n: np.isfinite(v) if v.dtype.kind in "fc" else np.ones(v.shape, bool)
                                        for n, v in given.items()})

    operands = {n: _Operand(v) for n, v in given.items()}
    leaf.norms = {n: w.norm for n, w in operands.items()}
    maxes = sorted(w.max_abs for w in operands.values())
    scale = maxes[len(maxes) // 2] if len(maxes) % 2 else 0.5 * (maxes[len(maxes) // 2 - 1] + maxes[len(maxes) // 2])
    if role == "buffer":
        scale = max(scale, case_scale)
    base_tol = rules.resolve(path, dtype, layer)
    if value_scale is not None:
        value_scale = np.asarray(value_scale, np.float64)
        if value_scale.shape != tuple(leaf.shape) or not np.any(value_scale):
            value_scale = None
    leaf.tolerance = _recorded(base_tol, scale, value_scale)
    ratios_of = []  # per pair: a function computing its elementwise error ratios
    for x, y in itertools.combinations(names, 2):
        backend, reference = (y, x) if reference_rank(x) <= reference_rank(y) else (x, y)
        tol = rules.resolve(path, dtype, layer, (backend, reference))
        pair, ratios = _pair(operands[backend], operands[reference], tol, scale, backend, reference, value_scale)
        leaf.pairs.append(pair)
        ratios_of.append(ratios)
        if tol.rules != base_tol.rules:
            leaf.tolerance = _recorded(tol, scale, value_scale)
    if leaf.pairs:
        worst = max(range(len(leaf.pairs)), key=lambda k: leaf.pairs[k].headroom)
        _attach_worst(leaf, given, leaf.pairs[worst], ratios_of[worst]())

    if role in ("param", "input") and maxes[-1] <= VACUOUS_REL.get(dtype, 0.0) * case_scale:
        leaf.verdict = "vacuous"
        leaf.referee = []
        leaf.message = (f"the gradient is ~0 on every backend (max |g| = {maxes[-1]:.3g}, the case's largest is "
                        f"{case_scale:.3g}): this leaf checks nothing")
        return leaf
    leaf.verdict = "disagree" if any(p.verdict == "disagree" for p in leaf.pairs) else "agree"
    return leaf


def _recorded(tol: ResolvedTolerance, scale: float, value_scale: np.ndarray | None):
    """The tolerance as the leaf records it, naming the statistic's scale where one applied."""
    out = tol.record(scale)
    if value_scale is not None and tol.criterion != "norm":
        out.rule = (out.rule.replace("|b|", "(|b| + s)", 1)
                    + f"; s: the statistic's scale per element, up to {float(np.max(value_scale)):.3g} "
                    "(its update's operands, and a mean's spread: the square root of its running variance)")
    return out


# A running mean and its running variance are named alike in every framework gradcheck reads: torch and
# gradcheck's layers (``bn.running_mean``, ``bn.running_var``), flax linen and nnx (``.../mean``, ``.../var``).
_MEAN, _VARIANCES = "mean", ("var", "variance")


def statistic_scales(before: dict[str, np.ndarray], after: dict[str, dict]) -> dict[str, np.ndarray]:
    """Per updated buffer, the scale per element that its rounding is at besides its own value
    (``compare_leaf``'s ``value_scale``).

    ``before`` maps each float buffer's path to its value at the case point;
    ``after`` each backend to its updated buffers.  A running statistic is
    updated as ``b' = (1 - m) b + m s`` from a batch statistic ``s``, and
    ``s`` is as precise as the values it summarises *relative to their own
    scale*, not relative to ``s``: a batch mean of two values per channel
    that nearly cancel (BatchNorm at 1x1 spatial, batch 2) inherits their
    rounding, which the model may have amplified far past a unit roundoff,
    at the scale of the values.  If those values agree within ``rtol`` of
    their scale, then ``|m Δs| <= rtol m rms(x)``, and from the buffers alone:

    * ``m |s| = |b' - (1 - m) b| <= max(|b'|, |b|, |b' - b|)`` whatever
      ``m`` in [0, 1] (the update's operands; beyond ``|b'|`` only where the
      update cancelled: a pretrained running mean meeting a batch mean of the
      other sign);
    * for a mean with a running variance beside it (same path, ``var`` for
      ``mean``; updated from the same batch with ``v >= 0``):
      ``m σ = sqrt(m · m σ²) <= sqrt(m σ²) <= sqrt(v')`` (σ² biased or unbiased),
      and ``rms(x) <= |μ| + σ``.

    So ``s = max(|b'|, |b|, |b' - b|) - |b'| (+ sqrt(v'))``, ``b'`` and ``v'``
    each the median over backends (one backend's wrong statistics cannot widen
    everyone's tolerance).  ``sqrt(v')`` is also the scale at which the mean
    is ever used, ``(x - b') / sqrt(v' + eps)``: an error below ``rtol`` of it
    moves no normalised value by more than ``rtol``.  A path absent from the
    result has no scale beyond its own values.
    """
    medians = {}
    for path, b0 in before.items():
        got = [np.asarray(buf[path], np.float64) for buf in after.values() if _usable(buf.get(path), np.shape(b0))]
        if got:
            medians[path] = np.median(np.stack(got), axis=0)
    out = {}
    for path, b1 in medians.items():
        b0 = np.abs(np.asarray(before[path], np.float64))
        moved = np.abs(b1 - np.asarray(before[path], np.float64))
        scale = np.maximum(np.maximum(b0, moved), np.abs(b1)) - np.abs(b1)
        var = _variance_of(path, medians)
        if var is not None:
            scale = scale + np.sqrt(np.maximum(var, 0.0))
        if np.any(scale > 0):
            out[path] = scale
    return out


def _usable(v, shape) -> bool:
    if v is None or v is MISSING:
        return False
    v = np.asarray(v)
    return v.shape == tuple(shape) and v.dtype.kind == "f" and bool(np.isfinite(v).all())


def _variance_of(path: str, medians: dict[str, np.ndarray]) -> np.ndarray | None:
    """The running variance beside the running mean at ``path`` (``None`` when ``path`` is not a mean or has none)."""
    i = path.rfind(_MEAN)
    if i < 0:
        return None
    for name in _VARIANCES:
        sibling = path[:i] + name + path[i + len(_MEAN):]
        if sibling in medians and medians[sibling].shape == medians[path].shape:
            return medians[sibling]
    return None


def _structure(leaf: LeafResult, names, arrays, given, expect_array, dtype) -> bool:
    problems, blame = [], []
    for n in names:
        v = arrays[n]
        present = v is not None and v is not MISSING
        if expect_array and not present:
            problems.append(f"{n} gives no gradient")
            blame.append(n)
        elif not expect_array and present:
            what = {"buffer": "a buffer", "frozen": "a frozen parameter"}.get(leaf.role, "a non-trainable leaf")
            problems.append(f"{n} gives a gradient for {what}")
            blame.append(n)
    shapes = {n: tuple(v.shape) for n, v in given.items()}
    if len(set(shapes.values())) > 1:
        common = max(set(shapes.values()), key=list(shapes.values()).count)
        for n, s in shapes.items():
            if s != common:
                problems.append(f"{n} has shape {s}, others {common}")
                blame.append(n)
    for n, v in given.items():
        if expect_array and v.dtype != np.dtype(dtype) and v.dtype.kind == "f":
            problems.append(f"{n} has dtype {v.dtype}, expected {dtype}")
            blame.append(n)
    if problems:
        leaf.verdict = "structural"
        leaf.blame = sorted(set(blame), key=reference_rank)
        leaf.message = "; ".join(problems)
        return True
    leaf.verdict = "agree" if expect_array else "skipped"
    return False


def _nonfinite(leaf: LeafResult, given, finite) -> LeafResult:
    leaf.verdict = "nonfinite"
    bad = {n: int((~f).sum()) for n, f in finite.items() if not f.all()}
    if len(bad) == len(given) and len({f.tobytes() for f in finite.values()}) == 1:
        leaf.message = (f"every backend gives NaN/Inf at the same {next(iter(bad.values()))} element(s): "
                        "the function itself is not finite here, so this leaf cannot be checked")
    else:
        leaf.blame = sorted(bad, key=reference_rank)
        leaf.message = ", ".join(f"{n}: {k} NaN/Inf" for n, k in bad.items()) + " (policy: any NaN/Inf "
        leaf.message += "where another backend is finite is that backend's fault)"
    return leaf


def _finite(v: np.ndarray) -> bool:
    """No NaN or Inf in ``v``: its smallest and largest elements are finite (a NaN is the min and the max
    of any array it is in), found without an array of flags."""
    if v.dtype.kind not in "fc" or not v.size:
        return True
    if v.dtype.kind == "c":
        return bool(np.isfinite(v).all())
    return bool(np.isfinite(v.min()) and np.isfinite(v.max()))


def _attach_worst(leaf: LeafResult, given, worst: PairResult, ratios: Iterator) -> None:
    """The worst pair's few worst elements (every backend's value there) and its histogram of error ratios,
    from its ratios block by block (``_Blocks.ratios``)."""
    n_bins = len(HIST_EDGES) - 1
    counts = np.zeros(n_bins, np.int64)
    best_ratio, best_at = np.empty(0), np.empty(0, np.intp)  # the worst few so far
    for lo, ratio in ratios:
        # Only the worst few are shown: a block's candidates are the elements worse than the worst few
        # so far (once there are that many), a comparison where a partial selection would cost far more.
        top = np.flatnonzero(ratio > best_ratio.min()) if best_ratio.size == WORST_ELEMENTS else None
        if top is None or top.size:
            best_ratio = np.concatenate([best_ratio, ratio if top is None else ratio[top]])
            best_at = np.concatenate([best_at, lo + (np.arange(ratio.size) if top is None else top)])
            keep = np.argsort(-best_ratio, kind="stable")[:WORST_ELEMENTS]  # ties: the first element first
            best_ratio, best_at = best_ratio[keep], best_at[keep]
        # Decades of the ratio, clipped into the histogram's range (exact zeros in the lowest bin); the edges
        # are whole decades, so a floor is the bin and no sort is needed.
        with np.errstate(divide="ignore"):
            logs = np.log10(ratio)
        bins = np.clip(np.floor(logs - HIST_EDGES[0]), 0, n_bins - 1).astype(np.intp)
        counts += np.bincount(bins, minlength=n_bins)
    if not best_at.size:
        return
    for j in np.argsort(-best_ratio, kind="stable"):
        idx = np.unravel_index(int(best_at[j]), given[worst.backend].shape)
        leaf.worst.append({"index": [int(k) for k in idx], "ratio": float(best_ratio[j]),
                           "values": {n: float(v[idx]) for n, v in given.items()}})
    leaf.histogram = {"edges": HIST_EDGES, "counts": [int(c) for c in counts],
                      "pair": [worst.backend, worst.reference]}


def first_in_backward_order(leaves: list[LeafResult]) -> str | None:
    """Where a gradient disagreement starts.

    Leaves are in forward order.  A wrong VJP in layer k corrupts the gradients
    of layer k and of every layer before it, never those after it; the
    disagreeing parameter that comes *last* in forward order (first in the
    backward pass) is therefore where the disagreement starts.  Disagreeing
    here means ``disagree``, ``nonfinite`` or ``structural``; with no such
    parameter, the first such leaf of another role (an output, a buffer, an
    input gradient) is named.
    """
    params = [leaf for leaf in leaves if leaf.role == "param" and leaf.verdict in ("disagree", "nonfinite", "structural")]
    if params:
        return params[-1].path
    others = [leaf for leaf in leaves if leaf.verdict in ("disagree", "nonfinite", "structural")]
    return others[0].path if others else None
