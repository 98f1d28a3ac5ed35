"""The fast paths: convolution and pooling kernels, and the fused normalisation primitive.

The kernels are checked against deliberately naive references written here
(a loop over kernel taps with ``einsum``, a loop over pooling windows), and
the three convolution kernels against each other through the adjoint
identity ``<conv(x, w), g> = <x, input_grad(g, w)> = <w, weight_grad(x, g)>``.
The tape's fused ``normalize`` primitive is checked against finite
differences of the composition BatchNorm and LayerNorm use (first and
second order) and against that composition in float32, and each
group has a negative control: a deliberately wrong kernel or VJP that the
same check must catch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from vjp_check import VjpMismatch, check_second_order, check_vjp

import gradcheck
from gradcheck import ops
from gradcheck.backends.numpy import kernels
from gradcheck.backends.tape import ops as tape_ops
from gradcheck.backends.tape import tape
from gradcheck.ops import rules


# ---------------------------------------------------------------- naive references
def naive_conv2d(x, w, g):
    """Cross-correlation by a loop over kernel taps: the definition, nothing clever."""
    (pt, pb), (pl, pr) = g.pads
    x = x[:, :, : x.shape[2] + min(pb, 0), : x.shape[3] + min(pr, 0)]
    xp = np.pad(x, ((0, 0), (0, 0), (pt, max(pb, 0)), (pl, max(pr, 0))))
    (sh, sw), (dh, dw) = g.stride, g.dilation
    cg, og = g.c // g.groups, g.o // g.groups
    out = np.zeros((g.n, g.o, g.oh, g.ow), dtype=np.result_type(x, w))
    for grp in range(g.groups):
        xs = xp[:, grp * cg : (grp + 1) * cg]
        ws = w[grp * og : (grp + 1) * og]
        for i in range(g.kh):
            for j in range(g.kw):
                patch = xs[:, :, i * dh : i * dh + sh * (g.oh - 1) + 1 : sh, j * dw : j * dw + sw * (g.ow - 1) + 1 : sw]
                out[:, grp * og : (grp + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def naive_max_pool2d(x, g):
    """(values, index of the first maximum in each window, row-major) by a loop over windows."""
    (pt, pb), (pl, pr) = g.pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=-np.inf)
    out = np.empty((g.n, g.c, g.oh, g.ow), dtype=x.dtype)
    grad_to = {}
    for n in range(g.n):
        for c in range(g.c):
            for a in range(g.oh):
                for b in range(g.ow):
                    win = xp[n, c, a * g.stride[0] : a * g.stride[0] + g.kh, b * g.stride[1] : b * g.stride[1] + g.kw]
                    k = int(np.argmax(win))  # first maximum; a NaN counts as the maximum
                    out[n, c, a, b] = win.flat[k]
                    grad_to[n, c, a, b] = (a * g.stride[0] + k // g.kw - pt, b * g.stride[1] + k % g.kw - pl)
    return out, grad_to


def naive_max_pool2d_grad(x, gy, g):
    _, grad_to = naive_max_pool2d(x, g)
    dx = np.zeros_like(x, dtype=gy.dtype)
    for (n, c, a, b), (i, j) in grad_to.items():
        dx[n, c, i, j] += gy[n, c, a, b]
    return dx


# ---------------------------------------------------------------- geometries
def conv_geometries():
    """Stride, padding, dilation, groups, 1x1 pointwise, a negative trailing pad (conv_transpose's crop)."""
    rng = np.random.default_rng(7)
    out = []
    specs = [
        # (n, c, h, w, o, kh, kw, stride, padding, dilation, groups)
        (2, 3, 9, 8, 4, 3, 3, 1, 1, 1, 1),
        (1, 4, 10, 7, 6, 3, 2, (2, 1), (1, 0), 1, 2),
        (2, 2, 9, 9, 2, 3, 3, 2, 2, 2, 2),
        (3, 6, 5, 6, 4, 1, 1, 1, 0, 1, 1),  # pointwise: no im2col copy
        (2, 6, 6, 5, 6, 1, 1, 2, 0, 1, 3),  # strided 1x1 (ResNet's downsample), grouped
        (2, 4, 7, 7, 4, 7, 7, 2, 3, 1, 1),  # ResNet's stem
        (1, 2, 1, 9, 3, 1, 3, (1, 2), (0, 1), (1, 2), 1),  # a lifted 1-d convolution
        # Stride 1: the input gradient is itself a convolution (the adjoint geometry) ...
        (2, 2, 9, 9, 2, 3, 3, 1, 2, 2, 1),  # ... dilated
        (1, 2, 6, 7, 3, 2, 2, 1, "same", 1, 1),  # ... with asymmetric padding (0 before, 1 after)
        (1, 2, 5, 5, 2, 1, 3, 1, (1, 2), 1, 1),  # ... unless the padding exceeds the kernel: scatter
    ]
    for n, c, h, w, o, kh, kw, s, p, d, grp in specs:
        g = kernels.geometry((n, c, h, w), (o, c // grp, kh, kw), s, p, d, grp)
        out.append((g, rng))
    g = kernels.geometry((2, 2, 7, 6), (2, 2, 3, 3), 2, 1, 1, 1)
    out.append((dataclasses.replace(g, pads=((1, 0), (1, -1))), rng))
    return out


GEOMETRIES = conv_geometries()
IDS = [f"{g.n}x{g.c}x{g.h}x{g.w}-o{g.o}-k{g.kh}x{g.kw}-s{g.stride}-p{g.pads}-d{g.dilation}-g{g.groups}"
       for g, _ in GEOMETRIES]


def _operands(g, rng, dtype=np.float64):
    x = rng.standard_normal((g.n, g.c, g.h, g.w)).astype(dtype)
    w = rng.standard_normal((g.o, g.c // g.groups, g.kh, g.kw)).astype(dtype)
    gy = rng.standard_normal((g.n, g.o, g.oh, g.ow)).astype(dtype)
    return x, w, gy


@pytest.mark.parametrize("geom,rng", GEOMETRIES, ids=IDS)
def test_conv_kernels_match_the_definition_and_are_adjoint(geom, rng):
    x, w, gy = _operands(geom, rng)
    y = kernels.conv2d(x, w, geom)
    np.testing.assert_allclose(y, naive_conv2d(x, w, geom), rtol=1e-12, atol=1e-12)
    dx = kernels.conv2d_input_grad(gy, w, geom)
    dw = kernels.conv2d_weight_grad(x, gy, geom)
    assert dx.shape == x.shape and dw.shape == w.shape
    assert y.flags.c_contiguous and dx.flags.c_contiguous
    lhs = float(np.vdot(y, gy))
    np.testing.assert_allclose([float(np.vdot(x, dx)), float(np.vdot(w, dw))], [lhs, lhs], rtol=1e-11)


@pytest.mark.parametrize("geom,rng", GEOMETRIES[:3], ids=IDS[:3])
def test_conv_kernels_keep_float32(geom, rng):
    x, w, gy = _operands(geom, rng, np.float32)
    for out in (kernels.conv2d(x, w, geom), kernels.conv2d_input_grad(gy, w, geom),
                kernels.conv2d_weight_grad(x, gy, geom)):
        assert out.dtype == np.float32
    np.testing.assert_allclose(kernels.conv2d(x, w, geom), naive_conv2d(x, w, geom), rtol=1e-4, atol=1e-4)


def test_conv_adjoint_check_catches_a_wrong_input_gradient(monkeypatch):
    """Negative control: an input gradient that flips the kernel breaks the adjoint identity."""
    geom, rng = GEOMETRIES[0]
    x, w, gy = _operands(geom, rng)
    monkeypatch.setattr(kernels, "_weight_matrix",
                        lambda w, g, orig=kernels._weight_matrix: orig(np.ascontiguousarray(w[..., ::-1, ::-1]), g))
    dx = kernels.conv2d_input_grad(gy, w, geom)
    assert abs(float(np.vdot(x, dx)) - float(np.vdot(naive_conv2d(x, w, geom), gy))) > 1e-3


def _pool_cases():
    rng = np.random.default_rng(3)
    cases = []
    for k, s, p in [(3, 2, 1), (2, 2, 0), (3, 1, 1), (2, 1, 0)]:
        x = rng.standard_normal((2, 3, 7, 6))
        cases.append((f"k{k}-s{s}-p{p}", x, k, s, p))
    ties = np.round(rng.standard_normal((1, 2, 6, 6)))  # many equal values: the first maximum wins
    cases.append(("ties", ties, 3, 2, 1))
    relu = np.maximum(rng.standard_normal((1, 2, 6, 6)), 0.0)  # whole windows of zeros
    cases.append(("relu zeros", relu, 3, 2, 1))
    nan = rng.standard_normal((1, 1, 5, 5))
    nan[0, 0, 1, 2] = nan[0, 0, 3, 3] = np.nan  # a NaN is the maximum of its windows
    cases.append(("nan", nan, 3, 1, 1))
    return cases


POOLS = _pool_cases()


@pytest.mark.parametrize("label,x,k,s,p", POOLS, ids=[c[0] for c in POOLS])
def test_max_pool_kernels_match_the_definition(label, x, k, s, p):
    g = rules.pool_geometry("max_pool2d", x.shape, k, s, p)
    ref, _ = naive_max_pool2d(x, g)
    np.testing.assert_array_equal(kernels.max_pool2d(x, g), ref)
    gy = np.random.default_rng(5).standard_normal(ref.shape)
    expected = naive_max_pool2d_grad(x, gy, g)
    np.testing.assert_allclose(kernels.max_pool2d_grad(x, gy, g), expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(kernels.max_pool2d_grad(x, gy, g, out=ref), expected, rtol=1e-12, atol=0)


def test_max_pool_gradient_check_catches_the_last_maximum_winning():
    """Negative control: routing ties to the last maximum instead of the first is a different gradient."""
    label, x, k, s, p = POOLS[4]  # ties
    g = rules.pool_geometry("max_pool2d", x.shape, k, s, p)
    gy = np.ones(kernels.max_pool2d(x, g).shape)
    flipped = x[:, :, ::-1, ::-1]  # the first maximum of the flipped input is the last of the original
    wrong = kernels.max_pool2d_grad(np.ascontiguousarray(flipped), gy[:, :, ::-1, ::-1].copy(), g)[:, :, ::-1, ::-1]
    assert not np.allclose(wrong, naive_max_pool2d_grad(x, gy, g))


# ---------------------------------------------------------------- fused normalisation
# The reference: the composition in gradcheck.ops that torch and jax run (the op's derived body).
composed_normalize = ops.normalize.__wrapped__


R = np.random.default_rng(11)
X = R.standard_normal((3, 4, 5, 2)) * 2.0 + 0.5
NORMS = [
    # (label, axes, weight, bias, x): BatchNorm folds a per-channel weight; LayerNorm does not.
    ("batchnorm", (0, 2, 3), R.uniform(0.5, 1.5, (1, 4, 1, 1)), R.standard_normal((1, 4, 1, 1)), X),
    ("batchnorm no affine", (0, 2, 3), None, None, X),
    ("batchnorm weight only", (0, 2, 3), R.uniform(0.5, 1.5, (1, 4, 1, 1)), None, X),
    ("layernorm", (2, 3), R.uniform(0.5, 1.5, (5, 2)), R.standard_normal((5, 2)), X),
    ("layernorm bias only", (-2, -1), None, R.standard_normal((5, 2)), X),
    ("groupnorm statistics", (2,), None, None, X.reshape(3, 2, -1)),
    ("batchnorm1d", (0,), R.uniform(0.5, 1.5, (1, 6)), R.standard_normal((1, 6)), R.standard_normal((4, 6))),
]


def _norm_f(axes, with_weight, with_bias, fn=tape_ops.normalize):
    def f(x, *wb):
        wb = list(wb)
        weight = wb.pop(0) if with_weight else None
        bias = wb.pop(0) if with_bias else None
        return fn(x, axes, 1e-5, weight=weight, bias=bias)[0]

    return f


def _norm_args(x, weight, bias):
    return (x,) + tuple(a for a in (weight, bias) if a is not None)


@pytest.mark.parametrize("label,axes,weight,bias,x", NORMS, ids=[c[0] for c in NORMS])
def test_normalize_vjp(label, axes, weight, bias, x):
    flags = (weight is not None, bias is not None)
    # Finite differences of the composition (plain numpy), not of the fused forward.
    check_vjp(_norm_f(axes, *flags), _norm_args(x, weight, bias), name=label,
              numeric_f=_norm_f(axes, *flags, fn=composed_normalize))


@pytest.mark.parametrize("label,axes,weight,bias,x", NORMS[:4], ids=[c[0] for c in NORMS[:4]])
def test_normalize_second_order(label, axes, weight, bias, x):
    check_second_order(lambda *a: ops.sin(_norm_f(axes, weight is not None, bias is not None)(*a)),
                       _norm_args(x, weight, bias), name=label)


@pytest.mark.parametrize("label,axes,weight,bias,x", NORMS, ids=[c[0] for c in NORMS])
def test_normalize_matches_its_composition(label, axes, weight, bias, x):
    """Fused and composed agree in float32: values, statistics, gradients (and keep the dtype)."""
    args = _norm_args(x.astype(np.float32), *(None if a is None else a.astype(np.float32) for a in (weight, bias)))
    cot = np.random.default_rng(2).standard_normal(x.shape).astype(np.float32)

    def loss(fn):
        def f(x, *wb):
            wb = list(wb)
            w_ = wb.pop(0) if weight is not None else None
            b_ = wb.pop(0) if bias is not None else None
            y, mean, var = fn(x, axes, 1e-5, w_, b_)
            return ops.sum(y * cot), y, mean, var

        return f

    (_, *outs1), g1 = gradcheck.withgradient(loss(tape_ops.normalize), *args)
    (_, *outs2), g2 = gradcheck.withgradient(loss(composed_normalize), *args)
    for a, b in zip(outs1 + list(g1), outs2 + list(g2), strict=True):
        assert a.dtype == b.dtype == np.float32
        # Normwise: two float32 roundings of one formula, where some entries cancel to ~0.
        assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b), (label, np.linalg.norm(a - b) / np.linalg.norm(b))


def test_normalize_records_one_node_and_constant_statistics():
    x = tape.Tensor(X, requires_grad=True)
    y, mean, var = tape_ops.normalize(x, (0, 2, 3), 1e-5, weight=tape.Tensor(NORMS[0][2], requires_grad=True))
    assert y.node[0] is tape_ops._normalize
    assert not mean.requires_grad and not var.requires_grad
    with pytest.raises(ValueError, match="normalize: weight of shape .* does not broadcast into the input's shape"):
        ops.normalize(x, (0, 2, 3), 1e-5, weight=np.ones((2, 4, 1, 1, 1)))


def test_normalize_check_catches_a_wrong_vjp(monkeypatch):
    """Negative control: dropping the mean(g * xhat) term (the variance's share) must be caught."""
    label, axes, weight, bias, x = NORMS[0]
    f, args = _norm_f(axes, True, True), _norm_args(x, weight, bias)
    numeric = _norm_f(axes, True, True, fn=composed_normalize)
    check_vjp(f, args, name=label, numeric_f=numeric)
    right = tape_ops._normalize.vjp_joint

    def wrong(argnums, g, ans, x, weight, bias, axes, eps, stats):
        grads = right(argnums, g, ans, x, weight, bias, axes, eps, stats)
        if 0 in argnums:
            centred, rstd = stats
            xhat = centred * rstd
            m2 = np.mean(g * xhat, axis=axes, keepdims=True)
            grads[argnums.index(0)] = grads[argnums.index(0)] + xhat * m2 * rstd * weight
        return grads

    monkeypatch.setattr(tape_ops._normalize, "vjp_joint", wrong)
    with pytest.raises(VjpMismatch, match=r"wrt arg 0: tape .* vs numeric"):
        check_vjp(f, args, name=label, numeric_f=numeric)


def test_joint_vjp_answers_single_argument_requests():
    """``Primitive.vjp(i)`` still works for a primitive with a joint VJP (one gradient at a time)."""
    label, axes, weight, bias, x = NORMS[0]
    centred = x - x.mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt((centred**2).mean(axis=axes, keepdims=True) + 1e-5)
    g = np.random.default_rng(4).standard_normal(x.shape)
    kw = {"axes": axes, "eps": 1e-5, "stats": (centred, rstd)}
    joint = tape_ops._normalize.backward([0, 1, 2], g, None, (x, weight, bias), kw)
    for i in range(3):
        np.testing.assert_allclose(tape_ops._normalize.vjp(i)(g, None, x, weight, bias, **kw), joint[i])
