"""The ops added for torch.export graphs: hardswish, hardsigmoid, nearest and bilinear upsampling.

Each derived body (what the tape and the numpy referee run) computes exactly
what torch's kernel does, forward; the gradients agree across the tape,
torch's kernel and jax's (``jax.nn.hard_swish``, ``jax.image.resize``); and a
wrong gradient in one of them is caught and blamed on it (the negative
controls).
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcheck
import gradcheck.layers as L
from gradcheck import ops
from gradcheck.assertions import GradientsDisagree

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
F = torch.nn.functional

from gradcheck.backends.jax.driver import configure_jax  # noqa: E402

configure_jax()  # float64 jax arrays, as the jax backend runs them

SIZES = [  # (h, w) -> (oh, ow), scale factor: up, down, odd ratios, a given factor that is not out/in
    ((3, 4), (6, 8), None), ((5, 7), (3, 4), None), ((4, 4), (8, 8), 2.0), ((5, 5), (7, 7), 1.5),
    ((3, 5), (7, 11), None),
]


@pytest.mark.parametrize("size,out,factor", SIZES)
@pytest.mark.parametrize("mode,corners", [("nearest", None), ("bilinear", False), ("bilinear", True)])
def test_upsampling_computes_what_torch_does(size, out, factor, mode, corners):
    x = np.random.default_rng(0).standard_normal((2, 3) + size)
    kw = {} if corners is None else {"align_corners": corners}
    ref = F.interpolate(torch.from_numpy(x), size=None if factor else out, scale_factor=factor, mode=mode,
                        **kw).numpy()
    for backend_x in (x, jax.numpy.asarray(x), torch.from_numpy(x)):
        if mode == "nearest":
            y = ops.upsample_nearest2d(backend_x, ref.shape[2:], factor)
        else:
            y = ops.upsample_bilinear2d(backend_x, ref.shape[2:], corners, factor)
        np.testing.assert_allclose(ops.to_numpy(y), ref, rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", ["hardswish", "hardsigmoid"])
def test_hard_activations_compute_what_torch_does(name):
    x = np.linspace(-5, 5, 41)
    ref = getattr(F, name)(torch.from_numpy(x)).numpy()
    for backend_x in (x, jax.numpy.asarray(x)):
        np.testing.assert_allclose(ops.to_numpy(getattr(ops, name)(backend_x)), ref, rtol=0, atol=1e-15)


def test_hard_activations_have_torchs_gradient_at_their_kinks():
    x = np.array([-3.0, 3.0])
    for name in ("hardswish", "hardsigmoid"):
        t = torch.from_numpy(x.copy()).requires_grad_(True)
        getattr(F, name)(t).sum().backward()
        tape = gradcheck.gradient(lambda v, name=name: ops.sum(getattr(ops, name)(v)), x)[0]
        np.testing.assert_array_equal(tape, t.grad.numpy(), err_msg=f"{name} at -3 and 3")


CASES = {
    "hardswish": (lambda x: ops.hardswish(x), (3, 8)),
    "hardsigmoid": (lambda x: ops.hardsigmoid(x), (3, 8)),
    "nearest_up": (lambda x: ops.upsample_nearest2d(x, (6, 9)), (2, 2, 3, 4)),
    "nearest_down": (lambda x: ops.upsample_nearest2d(x, (2, 3)), (2, 2, 5, 7)),
    "bilinear_up": (lambda x: ops.upsample_bilinear2d(x, (6, 9)), (2, 2, 3, 4)),
    "bilinear_corners": (lambda x: ops.upsample_bilinear2d(x, (5, 7), align_corners=True), (2, 2, 3, 4)),
    "bilinear_factor": (lambda x: ops.upsample_bilinear2d(x, (7, 7), scale_factor=1.5), (2, 2, 5, 5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_agree_on_every_backend(name):
    fn, shape = CASES[name]
    # Spread wide enough that the hard activations' flat parts are reached, but not their kinks.
    x = np.random.default_rng(1).standard_normal(shape) * 2.5
    gradcheck.assert_gradients_agree(L.Lambda(fn), x.astype(np.float32), backends=("tape", "torch", "jax"))


def test_a_wrong_jax_hardswish_gradient_is_blamed_on_jax(monkeypatch):
    from gradcheck.backends.jax import ops as jax_ops

    @jax.custom_vjp
    def wrong(x):
        return jax.nn.hard_swish(x)

    wrong.defvjp(lambda x: (wrong(x), x), lambda x, g: (g * jax.grad(lambda v: jax.nn.hard_swish(v).sum())(x)
                                                        * (1 + 1e-3),))
    monkeypatch.setattr(jax_ops, "hardswish", wrong)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32) * 2.5
    with pytest.raises(GradientsDisagree) as info:
        gradcheck.assert_gradients_agree(L.Lambda(lambda x: ops.hardswish(x)), x)
    assert all(leaf.blame == ["jax"] for leaf in info.value.result.leaves if leaf.verdict == "disagree")


def test_a_wrong_bilinear_matrix_is_caught(monkeypatch):
    # The derived op runs on the tape and the referee; a wrong interpolation weight there is a wrong
    # forward, which torch's and jax's own kernels do not share.
    original = ops.bilinear_matrix
    monkeypatch.setattr(ops, "bilinear_matrix", lambda *a, **k: original(*a, **k) * 1.001)
    x = np.random.default_rng(2).standard_normal((2, 2, 3, 4))
    with pytest.raises(GradientsDisagree) as info:
        gradcheck.assert_gradients_agree(L.Lambda(lambda x: ops.upsample_bilinear2d(x, (6, 8))), x)
    output = next(leaf for leaf in info.value.result.leaves if leaf.path == "output")
    assert output.verdict == "disagree" and output.blame == ["tape"]


# ---------------------------------------------------------------- atan, prod and topk (issue 20)
PROD_X = np.array([[1.5, 0.0, -2.0, 0.5], [0.0, 1.5, 0.0, 2.0], [0.5, -1.5, 1.2, 0.8]])  # one zero, two, none


def _on_every_backend(fn, x):
    """``fn`` of ``x`` as numpy, jax, tape and torch values, each back as numpy."""
    from gradcheck.backends.tape.tape import Tensor

    for backend_x in (x, jax.numpy.asarray(x), Tensor(x), torch.from_numpy(x)):
        yield type(backend_x).__module__, fn(backend_x)


def test_atan_prod_and_topk_compute_what_torch_does():
    t = torch.from_numpy(PROD_X)
    for name, (fn, want) in {
        "atan": (ops.atan, torch.atan(t)),
        "prod rows": (lambda x: ops.prod(x, axis=1), t.prod(1)),
        "prod all, kept": (lambda x: ops.prod(x, axis=(0, 1), keepdims=True), t.prod().reshape(1, 1)),
    }.items():
        for where, y in _on_every_backend(fn, PROD_X):
            np.testing.assert_allclose(ops.to_numpy(y), want.numpy(), rtol=1e-15, atol=0, err_msg=f"{name} on {where}")
    x = np.random.default_rng(3).standard_normal((3, 5))
    for largest in (True, False):
        want = torch.topk(torch.from_numpy(x), 2, dim=1, largest=largest)
        for where, (values, indices) in _on_every_backend(lambda v, largest=largest: ops.topk(v, 2, 1, largest), x):
            np.testing.assert_array_equal(ops.to_numpy(values), want.values.numpy(), err_msg=f"topk on {where}")
            np.testing.assert_array_equal(ops.to_numpy(indices), want.indices.numpy(), err_msg=f"topk on {where}")
            assert np.dtype(ops.dtype_of(indices)) == np.int64, where


def test_prods_gradient_at_zeros_is_the_product_of_the_others():
    # One zero in a row: the gradient there is the others' product, 0 elsewhere; two zeros: 0 everywhere.
    want = np.array([[0.0, -1.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [-1.44, 0.48, -0.6, -0.9]])
    grad = gradcheck.gradient(lambda x: ops.sum(ops.prod(x, axis=1)), PROD_X)[0]
    np.testing.assert_allclose(grad, want, rtol=1e-15)
    t = torch.from_numpy(PROD_X).requires_grad_(True)
    t.prod(1).sum().backward()
    np.testing.assert_allclose(grad, t.grad.numpy(), rtol=1e-15)


def _jax_with_a_wrong_gradient(fn, factor=1 + 1e-3):
    """``fn`` on jax with its gradient in the first argument scaled by ``factor``: an op whose backward is wrong."""

    def patched(x, *args, **kwargs):
        @jax.custom_vjp
        def wrong(v):
            return fn(v, *args, **kwargs)

        def bwd(v, g):
            return (jax.vjp(lambda u: fn(u, *args, **kwargs), v)[1](g)[0] * factor,)

        wrong.defvjp(lambda v: (wrong(v), v), bwd)
        return wrong(x)

    return patched


@pytest.mark.parametrize("name, fn, x", [
    ("atan", lambda x: ops.atan(x), np.random.default_rng(4).standard_normal((3, 4))),
    ("prod", lambda x: ops.prod(x, axis=1), PROD_X),
    ("topk", lambda x: ops.topk(x, 2, axis=1)[0], np.random.default_rng(5).standard_normal((3, 5))),
])
def test_the_new_ops_agree_and_a_wrong_jax_gradient_of_them_is_blamed_on_jax(name, fn, x, monkeypatch):
    from gradcheck.backends.jax import ops as jax_ops

    # The clean case; each run gets a function of its own, so that jax compiles the patched op afresh.
    gradcheck.assert_gradients_agree(L.Lambda(lambda v: fn(v)), x, backends=("tape", "torch", "jax"))
    original = getattr(jax_ops, name)
    if name == "topk":  # the values' gradient is wrong, the indices are what they were
        wrong_values = _jax_with_a_wrong_gradient(lambda v, *a, **k: original(v, *a, **k)[0])
        monkeypatch.setattr(jax_ops, name, lambda v, *a, **k: (wrong_values(v, *a, **k), original(v, *a, **k)[1]))
    else:
        monkeypatch.setattr(jax_ops, name, _jax_with_a_wrong_gradient(original))
    with pytest.raises(GradientsDisagree) as info:
        gradcheck.assert_gradients_agree(L.Lambda(lambda v: fn(v)), x, backends=("tape", "torch", "jax"))
    wrong = [leaf for leaf in info.value.result.leaves if leaf.verdict == "disagree"]
    assert wrong and all(leaf.blame == ["jax"] for leaf in wrong)


def test_a_tape_topk_that_picks_the_smallest_is_blamed_on_the_tape(monkeypatch):
    from gradcheck.backends.tape import ops as tape_ops

    original = tape_ops.topk
    monkeypatch.setattr(tape_ops, "topk", lambda x, k, axis=-1, largest=True: original(x, k, axis, not largest))
    x = np.random.default_rng(5).standard_normal((3, 5))
    with pytest.raises(GradientsDisagree) as info:
        gradcheck.assert_gradients_agree(L.Lambda(lambda x: ops.topk(x, 2, axis=1)[0]), x)
    output = next(leaf for leaf in info.value.result.leaves if leaf.path == "output")
    assert output.verdict == "disagree" and output.blame == ["tape"]
