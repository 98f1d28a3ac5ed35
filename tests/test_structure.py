"""Structural gradients: ``withgradient`` mirrors its arguments, as Tracker's does.

An array at every trainable leaf, None at static fields, buffers, frozen
params and non-float arrays, zeros for a trainable leaf the loss ignores;
tuples, lists, dicts and nested Chains keep their shape; the arguments are
never modified; leaf paths are the ones torch would print.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import gradcheck
from gradcheck import ops
from gradcheck.layers import BatchNorm2d, Chain, Conv2d, Dense
from gradcheck.module import Module, param, static
from gradcheck.tree import leaves_with_paths, map_leaves


def at(tree, path: str):
    """The value at a dotted path of a module / list / tuple / dict structure (None leaves included)."""
    node = tree
    for part in path.split("."):
        if isinstance(node, Module):
            inline = [name for name, kind, inl in node.field_kinds() if inl]
            if part.isdigit() and inline:
                node = getattr(node, inline[0])[int(part)]
            else:
                node = getattr(node, part)
        elif isinstance(node, dict):
            node = node[part]
        else:
            node = node[int(part)]
    return node


def as64(model):
    return map_leaves(model, lambda path, v, kind: np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else v)


def sq_loss(m, x):
    return ops.sum(m(x) ** 2)


# ---------------------------------------------------------------- the Tracker example
def tracker_model(dtype=np.float32):
    model = Chain(Dense(2, 1, activation=ops.tanh, rng=0), Dense(1, 1, bias=False, rng=1))
    return model if dtype == np.float32 else as64(model)


def analytic_tracker_gradient(model, x):
    """By hand: z = x W0^T + b0, a = tanh z, y = a W1^T, L = sum y^2."""
    W0, b0 = model[0].weight.astype(np.float64), model[0].bias.astype(np.float64)
    W1 = model[1].weight.astype(np.float64)
    x = x.astype(np.float64)
    z = x @ W0.T + b0  # (N, 1)
    a = np.tanh(z)
    y = a @ W1.T  # (N, 1)
    dy = 2 * y  # dL/dy
    dW1 = dy.T @ a  # (1, 1)
    dz = (dy @ W1) * (1 - a * a)  # (N, 1)
    return {
        "loss": float(np.sum(y * y)),
        "0.weight": dz.T @ x,  # (1, 2)
        "0.bias": dz.sum(axis=0),  # (1,)
        "1.weight": dW1,
        "x": dz @ W0,  # (N, 2)
    }


@pytest.mark.parametrize("dtype,rtol", [(np.float32, 2e-5), (np.float64, 1e-12)])
def test_tracker_example(dtype, rtol):
    model = tracker_model(dtype)
    x = np.array([[0.3, -0.7], [1.1, 0.2], [-0.5, 0.9]], dtype)
    value, (gm, gx) = gradcheck.withgradient(lambda m, x: ops.sum(m(x) ** 2), model, x)
    want = analytic_tracker_gradient(model, x)

    # Structure: per layer a weight array, a bias array or None, activation None.
    assert isinstance(gm, Chain) and len(gm.layers) == 2
    first, second = gm.layers
    assert isinstance(first.weight, np.ndarray) and first.weight.shape == (1, 2)
    assert isinstance(first.bias, np.ndarray) and first.bias.shape == (1,)
    assert first.activation is None  # a function is not trainable
    assert isinstance(second.weight, np.ndarray) and second.weight.shape == (1, 1)
    assert second.bias is None and second.activation is None  # disabled bias
    assert isinstance(gx, np.ndarray) and gx.shape == x.shape

    # Values: the hand-derived gradient.
    np.testing.assert_allclose(float(value), want["loss"], rtol=rtol)
    for path in ("0.weight", "0.bias", "1.weight"):
        got = at(gm, path)
        assert got.dtype == dtype, f"{path}: {dtype.__name__} parameter got a {got.dtype} gradient"
        np.testing.assert_allclose(got, want[path], rtol=rtol, atol=rtol * 1e-2, err_msg=path)
    assert gx.dtype == dtype
    np.testing.assert_allclose(gx, want["x"], rtol=rtol, atol=rtol * 1e-2, err_msg="x")


def test_gradient_is_withgradient_without_the_value():
    model, x = tracker_model(np.float64), np.ones((2, 2))
    _, (gm1, gx1) = gradcheck.withgradient(sq_loss, model, x)
    gm2, gx2 = gradcheck.gradient(sq_loss, model, x)
    np.testing.assert_array_equal(gx1, gx2)
    np.testing.assert_array_equal(gm1[0].weight, gm2[0].weight)


# ---------------------------------------------------------------- None placement
def conv_bn(rng=0):
    return Chain(Conv2d(2, 3, 3, padding=1, rng=rng), BatchNorm2d(3))


def test_buffers_and_static_fields_get_none():
    model = conv_bn()
    x = np.random.default_rng(0).standard_normal((2, 2, 4, 4)).astype(np.float32)
    r = np.random.default_rng(1).standard_normal((2, 3, 4, 4)).astype(np.float32)
    (gm,) = gradcheck.gradient(lambda m: ops.sum(m(x) * r), model)
    kinds = {p: k for p, _, k in model.named_arrays()}
    assert {p for p, k in kinds.items() if k == "buffer"} >= {"1.running_mean", "1.running_var"}
    for path, kind in kinds.items():
        g = at(gm, path)
        if kind == "buffer":
            assert g is None, f"buffer {path} got a gradient"
        else:
            assert isinstance(g, np.ndarray) and g.shape == at(model, path).shape, path
            assert np.any(g != 0), f"{path}: gradient is identically zero (vacuous)"
    for name in ("stride", "padding", "dilation", "groups"):
        assert getattr(gm[0], name) is None, f"static field {name} got {getattr(gm[0], name)!r}"
    assert gm[1].eps is None and gm[1].momentum is None


def test_frozen_params_get_none_and_the_rest_is_unchanged():
    x = np.array([[0.3, -0.7], [1.1, 0.2]])
    free = tracker_model(np.float64)
    frozen = tracker_model(np.float64).freeze("0.weight")
    g_free, _ = gradcheck.gradient(sq_loss, free, x)
    g_frozen, _ = gradcheck.gradient(sq_loss, frozen, x)
    assert g_frozen[0].weight is None
    np.testing.assert_array_equal(g_frozen[0].bias, g_free[0].bias)
    np.testing.assert_array_equal(g_frozen[1].weight, g_free[1].weight)
    # A frozen param is still a parameter (torch lists it; requires_grad=False).
    assert "0.weight" in dict(frozen.named_parameters())
    assert {p: k for p, _, k in frozen.named_arrays()}["0.weight"] == "frozen"


def test_freeze_by_glob_and_unknown_pattern():
    model = Chain(Dense(2, 3, rng=0), Dense(3, 1, rng=1)).freeze("*.bias")
    g, _ = gradcheck.gradient(sq_loss, model, np.ones((1, 2)))
    assert g[0].bias is None and g[1].bias is None
    assert g[0].weight is not None and g[1].weight is not None
    with pytest.raises(ValueError, match=r"freeze\('nope\.\*'\) matches no parameter of Chain"):
        model.freeze("nope.*")


def test_non_float_arguments_get_none():
    table = np.random.default_rng(0).standard_normal((5, 3))
    idx = np.array([[0, 4], [4, 1]])
    mask = np.array([True, False, True])
    scale = 2.0

    def f(table, idx, mask, scale, n):
        rows = ops.take(table, idx)  # (2, 2, 3)
        return ops.sum(ops.where(mask, rows, 0.0)) * scale * n

    g_table, g_idx, g_mask, g_scale, g_n = gradcheck.gradient(f, table, idx, mask, scale, 3)
    assert g_idx is None and g_mask is None and g_scale is None and g_n is None
    want = np.zeros((5, 3))
    np.add.at(want, idx, np.where(mask, 6.0, 0.0))  # repeated index 4 accumulates
    np.testing.assert_array_equal(g_table, want)


def test_unused_trainable_leaves_get_zeros_not_none():
    model = Chain(Dense(2, 2, rng=0), Dense(2, 1, rng=1))
    x = np.ones((3, 2), np.float32)
    g, gx, gy = gradcheck.gradient(lambda m, x, y: ops.sum(m[0](x)), model, x, np.ones(4, np.float32))
    for path in ("1.weight", "1.bias"):
        z = at(g, path)
        assert isinstance(z, np.ndarray) and z.shape == at(model, path).shape and z.dtype == np.float32
        assert not np.any(z), path
    assert np.any(g[0].weight)
    assert gy.shape == (4,) and not np.any(gy)


# ---------------------------------------------------------------- nesting and containers
def test_nested_chains_mirror_and_paths():
    inner = Chain(Dense(2, 3, activation=ops.tanh, rng=0), Dense(3, 3, rng=1))
    model = Chain(inner, Dense(3, 1, bias=False, rng=2))
    paths = [p for p, _ in model.named_parameters()]
    assert paths == ["0.0.weight", "0.0.bias", "0.1.weight", "0.1.bias", "1.weight"]
    g, _ = gradcheck.gradient(sq_loss, as64(model), np.ones((2, 2)))
    assert isinstance(g[0], Chain) and isinstance(g[0][1], Dense)
    for p in paths:
        assert at(g, p).shape == at(model, p).shape, p
    assert g[1].bias is None
    # Chains nested in Chains give the same numbers as the flat Chain.
    flat = Chain(inner[0], inner[1], model[1])
    g_flat, _ = gradcheck.gradient(sq_loss, as64(flat), np.ones((2, 2)))
    for nested_path, flat_path in zip(paths, ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight"], strict=True):
        np.testing.assert_allclose(at(g, nested_path), at(g_flat, flat_path), rtol=1e-14)


def test_tuples_lists_and_dicts_as_arguments():
    rng = np.random.default_rng(3)
    a, b, c = rng.standard_normal(3), rng.standard_normal((2, 3)), rng.standard_normal(3)
    params = {"w": a, "nested": {"b": b, "k": 7, "ids": np.array([1, 0])}, "fn": np.tanh}

    def f(params, pair, items):
        w, nested = params["w"], params["nested"]
        x, y = pair
        return ops.sum(ops.mul(ops.matmul(nested["b"], w), x)) + ops.sum(y * items[0]) * nested["k"]

    x, y = rng.standard_normal(2), rng.standard_normal(3)
    g_params, g_pair, g_items = gradcheck.gradient(f, params, (x, y), [c, "label"])
    assert isinstance(g_params, dict) and set(g_params) == {"w", "nested", "fn"}
    assert g_params["fn"] is None and g_params["nested"]["k"] is None and g_params["nested"]["ids"] is None
    assert isinstance(g_pair, tuple) and len(g_pair) == 2
    assert isinstance(g_items, list) and g_items[1] is None
    np.testing.assert_allclose(g_params["w"], b.T @ x)
    np.testing.assert_allclose(g_params["nested"]["b"], np.outer(x, a))
    np.testing.assert_allclose(g_pair[0], b @ a)
    np.testing.assert_allclose(g_pair[1], 7 * c)
    np.testing.assert_allclose(g_items[0], 7 * y)


def test_a_model_inside_a_dict_argument():
    model = tracker_model(np.float64)
    x = np.array([[0.5, -0.25]])
    (g,) = gradcheck.gradient(lambda d: sq_loss(d["model"], d["x"]), {"model": model, "x": x})
    want = analytic_tracker_gradient(model, x)
    np.testing.assert_allclose(g["model"][0].weight, want["0.weight"], rtol=1e-12)
    np.testing.assert_allclose(g["x"], want["x"], rtol=1e-12)
    assert g["model"][0].activation is None


def test_f_returning_a_tuple():
    model, x = tracker_model(np.float64), np.array([[0.3, -0.7]])

    def f(m, x):
        y = m(x)
        return ops.sum(y**2), y, {"note": "aux", "scale": 2.0}

    value, (gm, gx) = gradcheck.withgradient(f, model, x)
    assert isinstance(value, tuple) and len(value) == 3
    loss, y, aux = value
    assert isinstance(y, np.ndarray) and y.shape == (1, 1)  # handed back as numpy
    assert aux == {"note": "aux", "scale": 2.0}
    want = analytic_tracker_gradient(model, x)
    np.testing.assert_allclose(float(loss), want["loss"], rtol=1e-12)
    np.testing.assert_allclose(gm[0].weight, want["0.weight"], rtol=1e-12)
    np.testing.assert_allclose(gx, want["x"], rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gradient_dtype_follows_the_leaf(dtype):
    model = conv_bn()
    model = model if dtype == np.float32 else as64(model)
    x = np.random.default_rng(0).standard_normal((2, 2, 4, 4)).astype(dtype)
    gm, gx = gradcheck.gradient(lambda m, x: ops.sum(ops.tanh(m(x))), model, x)
    for leaf in leaves_with_paths((gm, gx)):
        assert leaf.value.dtype == dtype, f"{leaf.path}: {leaf.value.dtype}"


# ---------------------------------------------------------------- the arguments are not modified
def _snapshot(tree):
    return {leaf.path: (leaf.value, np.array(leaf.value, copy=True)) for leaf in leaves_with_paths(tree)}


def test_input_model_is_not_mutated():
    model = Chain(conv_bn(), Dense(3, 1, rng=2))
    model.freeze("0.1.weight")
    x = np.random.default_rng(0).standard_normal((2, 2, 3, 3)).astype(np.float32)
    before = _snapshot(model)
    frozen_before = copy.copy(model[0][1].__dict__.get("_frozen"))
    training_before = [m.training for m in model.modules()]

    def f(m, x):
        h = m[0](x)  # BatchNorm in training mode updates its running statistics (on a copy)
        return ops.sum(m[1](ops.mean(h, axis=(2, 3))))

    gradcheck.gradient(f, model, x)
    after = _snapshot(model)
    assert after.keys() == before.keys()
    for path, (obj, values) in before.items():
        assert after[path][0] is obj, f"{path}: the model's array object was replaced"
        np.testing.assert_array_equal(after[path][1], values, err_msg=f"{path} was modified")
    assert model[0][1].__dict__.get("_frozen") == frozen_before
    assert [m.training for m in model.modules()] == training_before
    np.testing.assert_array_equal(x, np.random.default_rng(0).standard_normal((2, 2, 3, 3)).astype(np.float32))


# ---------------------------------------------------------------- paths as torch names them
def test_paths_as_torch_names_them():
    model = Chain(Conv2d(2, 3, 3, rng=0), BatchNorm2d(3), Chain(Dense(3, 2, rng=1), Dense(2, 1, bias=False, rng=2)))
    params = [p for p, _ in model.named_parameters()]
    buffers = [p for p, _, k in model.named_arrays() if k == "buffer"]
    assert params == ["0.weight", "0.bias", "1.weight", "1.bias", "2.0.weight", "2.0.bias", "2.1.weight"]
    assert buffers == ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    torch = pytest.importorskip("torch")
    nn = torch.nn
    ref = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3),
                        nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1, bias=False)))
    assert params == [n for n, _ in ref.named_parameters()]
    assert buffers == [n for n, _ in ref.named_buffers()]
    for (p, v), (_, t) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert tuple(v.shape) == tuple(t.shape), f"{p}: layout {v.shape} vs torch {tuple(t.shape)}"


def test_custom_module_fields():
    class Scale(Module):
        gain: object = param()
        offset: object = param()
        power: int = static()
        label: str = static()

    m = Scale(gain=np.array([2.0, 3.0]), offset=None, power=2, label="s")
    (g,) = gradcheck.gradient(lambda m: ops.sum(ops.pow(m.gain, m.power)), m)
    assert g.offset is None and g.power is None and g.label is None
    np.testing.assert_allclose(g.gain, [4.0, 6.0])
    assert [p for p, _ in m.named_parameters()] == ["gain"]


def test_float64_constant_in_the_loss_keeps_float32_gradients():
    x = np.ones(3, np.float32)
    r = np.arange(3.0)  # float64
    (g,) = gradcheck.gradient(lambda x: ops.sum(ops.mul(x, r)), x)
    assert g.dtype == np.float32


def test_f_may_return_a_namedtuple():
    from collections import namedtuple

    Out = namedtuple("Out", "loss extra")
    value, (g,) = gradcheck.withgradient(lambda x: Out(ops.sum(x * x), x), np.ones(2))
    assert isinstance(value, Out) and value.extra.shape == (2,)
    np.testing.assert_allclose(g, 2 * np.ones(2))
