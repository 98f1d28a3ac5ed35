"""A pair is compared block by block (``compare.BLOCK``); every number it reports is the whole array's.

The reference here is the comparison written out on whole arrays, straight from its definitions
(``|a - b| <= atol + rtol (|b| + s)``, the first largest element, the worst few, decades of the ratio).  Blocks
of 7 elements put every boundary case (a leaf smaller than a block, a last partial block, the worst element in
a late block, ties across blocks) in reach of small arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradcheck.check import compare
from gradcheck.check.tolerance import Rule, ToleranceRules

RULES = ToleranceRules()


def _whole(a, b, tol, scale, value_scale):
    """The pair's numbers on whole arrays, and its elementwise ratios against the allowed error."""
    diff = np.abs(a - b)
    allowed = tol.rtol * np.abs(b)
    if value_scale is not None:
        allowed = allowed + tol.rtol * value_scale
    allowed = allowed + tol.absolute(scale)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.nan_to_num(diff / np.abs(b), nan=0.0, posinf=np.inf)
        ratio = np.where(diff == 0, 0.0, diff / allowed)
    out = {"mismatched": int(np.count_nonzero(diff > allowed)), "total": diff.size}
    if diff.size:
        out["max_abs_index"] = [int(k) for k in np.unravel_index(int(np.argmax(diff)), diff.shape)]
        out["max_rel_index"] = [int(k) for k in np.unravel_index(int(np.argmax(rel)), diff.shape)]
        out["max_abs"], out["max_rel"] = float(diff.max()), float(rel.max())
    nb = np.linalg.norm(b.astype(np.float64))
    out["rel_err_norm"] = float(np.linalg.norm((a - b).astype(np.float64)) / nb) if nb else None
    return out, ratio


def _arrays(rng, shape, dtype, kind):
    b = rng.standard_normal(shape).astype(dtype)
    if kind == "zeros":
        b = np.zeros(shape, dtype)
    noise = {"close": 1e-9 if dtype == np.float64 else 1e-5, "off": 1e-3, "zeros": 1e-3, "ties": 0.0}[kind]
    a = (b + noise * rng.standard_normal(shape)).astype(dtype)
    if kind == "ties":  # the same error at many elements, in several blocks: the first one is the largest
        a = b.copy()
        a.reshape(-1)[3::5] += 0.5
    return a, b


SHAPES = [(), (5,), (7,), (3, 4), (37, 11), (6, 3, 3, 3)]


@pytest.mark.parametrize("block", [7, compare.BLOCK])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind", ["close", "off", "zeros", "ties"])
def test_blocks_give_the_whole_arrays_numbers(monkeypatch, block, dtype, kind):
    monkeypatch.setattr(compare, "BLOCK", block)
    rng = np.random.default_rng(7)
    name = np.dtype(dtype).name
    for shape in SHAPES:
        a, b = _arrays(rng, shape, dtype, kind)
        for role, value_scale in (("param", None), ("buffer", np.abs(rng.standard_normal(shape)))):
            leaf = compare.compare_leaf("w", role, {"torch": a, "tape": b}, dtype=name, rules=RULES,
                                        case_scale=1.0, value_scale=value_scale)
            (pair,) = leaf.pairs
            tol = RULES.resolve("w", name, "", (pair.backend, pair.reference))
            got_a, got_b = ({"torch": a, "tape": b}[n] for n in (pair.backend, pair.reference))
            scale = 0.5 * (np.abs(a).max(initial=0) + np.abs(b).max(initial=0))  # the median of two backends
            if role == "buffer":
                scale = max(scale, 1.0)  # case_scale
            want, ratio = _whole(got_a, got_b, tol, scale, value_scale if role == "buffer" else None)
            where = (shape, name, kind, role)
            for key in ("mismatched", "total", "max_abs_index", "max_rel_index"):
                if key in want:
                    assert getattr(pair, key) == want[key], (key, where)
            if a.size:
                assert pair.max_abs == pytest.approx(want["max_abs"], rel=1e-6), where
                assert pair.max_rel == pytest.approx(want["max_rel"], rel=1e-6), where
            if want["rel_err_norm"] is not None:
                assert pair.rel_err_norm == pytest.approx(want["rel_err_norm"], rel=1e-5), where
            flat = ratio.reshape(-1)
            if flat.size:
                assert sum(leaf.histogram["counts"]) == flat.size, where
                worst = sorted(flat, reverse=True)[:compare.WORST_ELEMENTS]
                assert [w["ratio"] for w in leaf.worst] == pytest.approx(worst, rel=1e-5), where
                first = int(np.argmax(flat))  # the first of the largest comes first
                assert leaf.worst[0]["index"] == [int(k) for k in np.unravel_index(first, shape)], where
            if tol.criterion != "norm" and flat.size:
                assert pair.headroom == pytest.approx(float(flat.max()), rel=1e-5), where


def test_a_nan_or_inf_anywhere_is_found(monkeypatch):
    """The finiteness check without an array of flags (smallest and largest element) still finds a single NaN
    or Inf in any block, and the blame is the backend that has it."""
    monkeypatch.setattr(compare, "BLOCK", 7)
    rng = np.random.default_rng(0)
    for bad in (np.nan, np.inf, -np.inf):
        for at in (0, 17, 99):
            b = rng.standard_normal(100)
            a = b.copy()
            a[at] = bad
            leaf = compare.compare_leaf("w", "param", {"torch": a, "tape": b}, dtype="float64", rules=RULES,
                                        case_scale=1.0)
            assert leaf.verdict == "nonfinite" and leaf.blame == ["torch"], (bad, at)
    clean = rng.standard_normal(100)
    leaf = compare.compare_leaf("w", "param", {"torch": clean, "tape": clean.copy()}, dtype="float64",
                                rules=RULES, case_scale=1.0)
    assert leaf.verdict == "agree"


@pytest.mark.parametrize("block", [7, compare.BLOCK])
def test_an_error_exactly_at_the_tolerance_agrees(monkeypatch, block):
    """``|a - b| == atol + rtol |b|`` agrees, as torch.testing and numpy.isclose have it (headroom exactly 1);
    one ulp more is a mismatch, counted in every block it falls in.  Dyadic tolerances make the bound exact."""
    monkeypatch.setattr(compare, "BLOCK", block)
    tol = ToleranceRules(rules=[Rule(rtol=0.5, atol=0.25, atol_scale=0.0, criterion="elementwise")]).resolve(
        "w", "float64")
    b = np.ones(20)
    a = b + 0.75  # exactly the allowed error at every element
    pair, _ = compare._pair(compare._Operand(a), compare._Operand(b), tol, 1.0, "torch", "tape")
    assert (pair.verdict, pair.mismatched, pair.headroom) == ("agree", 0, 1.0)
    a[[3, 15]] = np.nextafter(1.75, np.inf)  # one ulp beyond, in the first and the third block of 7
    pair, _ = compare._pair(compare._Operand(a), compare._Operand(b), tol, 1.0, "torch", "tape")
    assert (pair.verdict, pair.mismatched) == ("disagree", 2)
    assert pair.headroom > 1.0 and pair.max_abs_index == [3]
