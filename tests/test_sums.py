"""The checks' inner products and norms (``gradcheck.check.sums``): float64 sums of arrays of any shape and dtype."""

import numpy as np
import pytest

from gradcheck.check import sums


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_inner_and_norm_are_numpys_in_float64_for_any_shape(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((3, 5, 7)), rng.standard_normal((3, 5, 7))
    assert sums.inner(a, b) == pytest.approx(float(np.vdot(a, b)), rel=1e-13)
    assert sums.norm(a) == pytest.approx(float(np.linalg.norm(a.ravel())), rel=1e-13)
    # a non-contiguous view is read in C order, as the flat array of its values
    assert sums.inner(a.transpose(2, 0, 1), b.transpose(2, 0, 1)) == pytest.approx(
        float(np.vdot(np.ascontiguousarray(a.transpose(2, 0, 1)), np.ascontiguousarray(b.transpose(2, 0, 1)))),
        rel=1e-13)
    assert sums.norm(np.float64(-3.0)) == 3.0
    assert sums.inner(np.zeros(0), np.zeros(0)) == 0.0


def test_float32_operands_are_summed_in_float64():
    a = np.array([1e8, 1.0, -1e8], np.float32)
    ones = np.ones(3, np.float32)
    # The control: a float32 sum loses the 1 against 1e8.
    assert float(np.einsum("i,i->", a, ones)) == 0.0
    assert sums.inner(a, ones) == 1.0
    assert sums.norm(np.array([3e20, 4e20], np.float32)) == pytest.approx(5e20, rel=1e-7)  # its square is past float32
