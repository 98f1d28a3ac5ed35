"""Bad input: every error names the op or field, the offending shape or type, and what was expected.

Never a bare numpy traceback from deep inside the tape.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gradcheck
from gradcheck import ops, tape
from gradcheck.backends import numpy_ops, tape_ops
from gradcheck.layers import Chain, Conv2d, Dense
from gradcheck.module import Module, param
from gradcheck.ops import BackendOpMissing
from gradcheck.tape import Tensor


def T(*shape):
    return Tensor(np.ones(shape), requires_grad=True)


BACKENDS = {"tape": T, "numpy": lambda *shape: np.ones(shape)}


# ---------------------------------------------------------------- matmul
@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize(
    "a,b,expect",
    [
        ((2, 3), (4, 5), r"matmul: shapes \(2, 3\) and \(4, 5\) do not match: the first's last axis \(3\) "
                         r"must equal the second's second-to-last axis \(4\)"),
        ((3,), (4,), r"matmul: shapes \(3,\) and \(4,\) do not match: .* the second's only axis \(4\)"),
        ((2, 5), (3,), r"matmul: shapes \(2, 5\) and \(3,\) do not match"),
        ((2, 3, 4), (3, 4, 5), r"matmul: shapes \(2, 3, 4\) and \(3, 4, 5\): batch dimensions \(2,\) and \(3,\) "
                               r"do not broadcast"),
        ((), (3,), r"matmul: shapes \(\) and \(3,\): a 0-d operand .* use mul"),
    ],
)
def test_matmul_shape_errors(backend, a, b, expect):
    make = BACKENDS[backend]
    with pytest.raises(ValueError, match=expect):
        ops.matmul(make(*a), make(*b))


def test_dense_with_the_wrong_input_width_names_matmul_and_shapes():
    layer = Dense(3, 2, rng=0)
    with pytest.raises(ValueError, match=r"matmul: shapes \(4, 5\) and \(3, 2\)"):
        gradcheck.gradient(lambda m, x: ops.sum(m(x)), layer, np.ones((4, 5), np.float32))


# ---------------------------------------------------------------- convolution and pooling
@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize(
    "x,w,kw,expect",
    [
        ((1, 3, 5, 5), (4, 2, 3, 3), {}, r"conv: input \(1, 3, 5, 5\) has 3 channels but weight \(4, 2, 3, 3\) "
                                         r"with groups=1 expects 2; the weight is \(out, in/groups, \*kernel\)"),
        ((1, 4, 5, 5), (4, 1, 3, 3), {"groups": 2}, r"conv: input \(1, 4, 5, 5\) has 4 channels .* groups=2 expects 2"),
        ((1, 3, 5), (4, 3, 3, 3), {}, r"conv: input \(1, 3, 5\) and weight \(4, 3, 3, 3\): expected NCL with "
                                      r"\(out, in/groups, k\) or NCHW"),
        ((1, 2, 2), (3, 2, 3), {}, r"smaller than the dilated kernel .*1-d input \(1, 2, 2\) and weight \(3, 2, 3\)"),
        ((1, 2, 5, 5), (3, 2, 3, 3), {"stride": 0}, r"conv: stride \(0, 0\) and dilation \(1, 1\) must be positive"),
        ((1, 2, 5, 5), (3, 2, 3, 3), {"stride": 2, "padding": "same"}, r"padding='same' needs stride 1"),
        ((1, 2, 5, 5), (3, 2, 3, 3), {"padding": "full"}, r"padding='full': expected an int, a tuple, 'same' or 'valid'"),
        ((1, 2, 5, 5), (3, 2, 3, 3), {"stride": (1, 2, 3)}, r"stride=\(1, 2, 3\): expected an int or 2 ints"),
    ],
)
def test_conv_shape_errors(backend, x, w, kw, expect):
    make = BACKENDS[backend]
    with pytest.raises(ValueError, match=expect):
        ops.conv(make(*x), make(*w), **kw)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize(
    "x,w,kw,expect",
    [
        ((1, 3, 4, 4), (2, 3, 3, 3), {}, r"conv_transpose: input \(1, 3, 4, 4\) has 3 channels but weight "
                                         r"\(2, 3, 3, 3\) expects 2; .* \(in, out/groups, \*kernel\)"),
        ((1, 2, 4, 4), (2, 3, 3, 3), {"stride": 2, "output_padding": 2}, r"output_padding=\(2, 2\) must be smaller"),
        ((1, 2, 1, 1), (2, 3, 1, 1), {"padding": 1}, r"conv_transpose: .* gives an empty output"),
    ],
)
def test_conv_transpose_shape_errors(backend, x, w, kw, expect):
    make = BACKENDS[backend]
    with pytest.raises(ValueError, match=expect):
        ops.conv_transpose(make(*x), make(*w), **kw)


def test_conv2d_layer_with_the_wrong_channels():
    with pytest.raises(ValueError, match=r"conv: input \(2, 4, 6, 6\) has 4 channels but weight \(5, 3, 3, 3\)"):
        gradcheck.gradient(lambda m, x: ops.sum(m(x)), Conv2d(3, 5, 3, rng=0), np.ones((2, 4, 6, 6), np.float32))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_pooling_shape_errors(backend):
    make = BACKENDS[backend]
    with pytest.raises(ValueError, match=r"pool2d: input of shape \(2, 5, 5\); expected 4 dims, NCHW"):
        ops.max_pool2d(make(2, 5, 5), 2)
    with pytest.raises(ValueError, match=r"pool2d: input of shape \(2, 5, 5\); expected 4 dims"):
        ops.avg_pool2d(make(2, 5, 5), 2)
    with pytest.raises(ValueError, match=r"adaptive_avg_pool2d: input of shape \(2, 5, 5\); expected 4 dims"):
        ops.adaptive_avg_pool2d(make(2, 5, 5), 2)
    with pytest.raises(ValueError, match=r"padding \(2, 2\) must be at most half the kernel \(3, 3\)"):
        ops.max_pool2d(make(1, 1, 5, 5), 3, padding=2)


# ---------------------------------------------------------------- other ops: numpy's complaint, named
@pytest.mark.parametrize(
    "call,expect",
    [
        (lambda: ops.add(T(2, 3), T(4)), r"add: operands could not be broadcast .*shapes \(2, 3\), \(4,\)"),
        (lambda: ops.where(np.ones(4, bool), T(2, 3), 0.0), r"where: .*broadcast.*shapes \(4,\), \(2, 3\)"),
        (lambda: ops.reshape(T(5, 3), (4, 4)), r"reshape: cannot reshape array of size 15 into shape \(4,\s?4\)"),
        (lambda: ops.sum(T(5, 3), axis=2), r"sum: axis 2 is out of bounds .* shapes \(5, 3\)"),
        (lambda: ops.softmax(T(2, 3), axis=2), r"softmax: axis 2 is out of bounds"),
        (lambda: ops.concatenate([T(2, 3), T(3, 2)]), r"concatenate: .*must match.* shapes \(2, 3\), \(3, 2\)"),
        (lambda: ops.stack([T(2, 3), T(3, 2)]), r"stack: all input arrays must have the same shape"),
        (lambda: ops.einsum("ij,jk->ik", T(2, 3), T(4, 5)), r"einsum: .* shapes \(2, 3\), \(4, 5\)"),
        (lambda: ops.einsum("ij,jk", T(2, 3), T(3, 5)), r"einsum 'ij,jk': the tape needs an explicit output"),
        (lambda: ops.broadcast_to(T(2, 3), (4, 3)), r"broadcast_to: .* \(2, 3\)"),
        (lambda: ops.getitem(T(2, 3), (5,)), r"getitem: index 5 is out of bounds"),
        (lambda: ops.pad(T(2, 3), ((1, 1), (1, 2), (0, 0))), r"pad: pad_width .* for an input of shape \(2, 3\); "
                                                             r"expected one \(before, after\) pair .*\(2 pairs\)"),
        (lambda: ops.pad(T(2, 3), ((1, -1), (0, 0))), r"pad: pad_width .* has a negative width"),
        (lambda: ops.squeeze(T(2, 3), 0), r"squeeze: axis 0 of shape \(2, 3\) has size 2, not 1"),
        (lambda: ops.gelu(T(3), approximate="fast"), r"gelu: approximate='fast'; expected 'none' or 'tanh'"),
    ],
)
def test_shape_errors_on_the_tape_name_the_op(call, expect):
    with pytest.raises((ValueError, IndexError), match=expect):
        call()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_pad_width_broadcast_forms(backend):
    # numpy's short forms work on every backend, and the tape's gradient has the input's shape.
    x = BACKENDS[backend](2, 3)
    assert tape.raw(ops.pad(x, 1)).shape == (4, 5)
    assert tape.raw(ops.pad(x, ((1, 2),))).shape == (5, 6)
    if backend == "tape":
        (g,) = tape.grad(ops.sum(ops.pad(x, ((1, 2),))), [x])
        np.testing.assert_array_equal(g, np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"pad: pad_width .* for an input of shape \(2, 3\)"):
        ops.pad(x, ((1, 1), (1, 1), (1, 1)))


# ---------------------------------------------------------------- non-differentiable where a float is needed
@pytest.mark.parametrize("dtype", [np.int64, np.bool_])
def test_requires_grad_on_an_integer_array(dtype):
    with pytest.raises(TypeError, match=f"dtype {np.dtype(dtype)} cannot require gradients; only float arrays"):
        Tensor(np.zeros(3, dtype), requires_grad=True)


def test_grad_with_respect_to_an_integer_tensor():
    x, i = T(3), Tensor(np.arange(3))
    with pytest.raises(TypeError, match=r"grad with respect to a int64 tensor \(position 1 of wrt\); only float"):
        tape.grad(ops.sum(x), [x, i])
    with pytest.raises(TypeError, match=r"grad with respect to a ndarray \(position 0"):
        tape.grad(ops.sum(x), [np.ones(3)])


def test_a_non_float_loss():
    with pytest.raises(TypeError, match=r"returned a .*int.*not a tape Tensor; the loss must be a float"):
        gradcheck.gradient(lambda x: ops.sum(ops.greater(x, 0.0)), np.ones(3))
    with pytest.raises(TypeError, match=r"the loss has dtype int64; only a float loss"):
        tape.grad(ops.sum(Tensor(np.arange(3))), [T(1)])
    with pytest.raises(TypeError, match=r"returned a float, not a tape Tensor"):
        gradcheck.gradient(lambda x: 1.0, np.ones(3))


def test_float_index_arrays():
    with pytest.raises(TypeError, match=r"getitem: an index array of dtype float64 \(shape \(2,\)\); expected an integer"):
        ops.take(T(5, 3), np.array([0.0, 1.0]))
    with pytest.raises(TypeError, match=r"getitem: an index array of dtype float64"):
        ops.getitem(np.ones((5, 3)), (np.array([0.5]),))
    with pytest.raises(TypeError, match=r"not a tensor that requires grad"):
        ops.take(T(5, 3), Tensor(np.array([0.0, 1.0]), requires_grad=True))


def test_int_arguments_are_constants_not_errors():
    # Token ids passed to f arrive as constant tensors and index fine; their gradient is None.
    g_table, g_ids = gradcheck.gradient(lambda t, ids: ops.sum(ops.take(t, ids)), np.ones((4, 2)), np.array([3, 3]))
    assert g_ids is None
    np.testing.assert_array_equal(g_table, [[0, 0], [0, 0], [0, 0], [2, 2]])


# ---------------------------------------------------------------- an op a backend lacks
def test_an_op_the_tape_lacks(monkeypatch):
    monkeypatch.delattr(tape_ops, "softplus")  # softplus has no derived version in gradcheck.ops
    with pytest.raises(BackendOpMissing, match=r"op 'softplus' is not implemented by the tape backend; "
                                               r"add `def softplus\(...\)` to gradcheck/backends/tape_ops.py"):
        ops.softplus(T(3))
    # Through the public API the same error surfaces (the runner records it per case and backend).
    with pytest.raises(BackendOpMissing, match="'softplus'.*tape"):
        gradcheck.gradient(lambda x: ops.sum(ops.softplus(x)), np.ones(3))


def test_an_op_the_numpy_backend_lacks(monkeypatch):
    monkeypatch.delattr(numpy_ops, "erf")
    with pytest.raises(BackendOpMissing, match=r"op 'erf' is not implemented by the numpy backend"):
        ops.erf(np.ones(3))
    assert issubclass(BackendOpMissing, NotImplementedError)


def test_derived_ops_need_no_backend_version(monkeypatch):
    # rsqrt is derived from div and sqrt: a backend without it still runs it.
    assert not hasattr(tape_ops, "rsqrt") and ops.rsqrt.derived
    np.testing.assert_allclose(tape.raw(ops.rsqrt(Tensor(np.array([4.0])))), [0.5])


def test_a_primitive_without_a_vjp_for_an_argument():
    x = T(1, 1, 4, 4)
    (g,) = tape.grad(ops.sum(ops.max_pool2d(x, 2)), [x], create_graph=False)  # first order is fine
    with pytest.raises(NotImplementedError, match=r"tape op 'max_pool2d_grad' has no gradient with respect to argument"):
        tape.grad(ops.sum(ops.max_pool2d(x, 2)), [x], create_graph=True)


# ---------------------------------------------------------------- model fields of an unknown kind
def test_an_unmarked_array_field():
    class Bad(Module):
        weight: Any = param()
        scale: Any = None  # an array without param()/buffer(): trainable or not cannot be guessed

    m = Bad(weight=np.ones(3), scale=np.ones(3))
    with pytest.raises(TypeError, match=r"field 'scale' of Bad holds a ndarray but is not marked; "
                                        r"declare it with param\(\), buffer\(\), static\(\) or child\(\)"):
        gradcheck.gradient(lambda m: ops.sum(m.weight * m.scale), m)
    with pytest.raises(TypeError, match="field 'scale' of Bad"):
        m.named_parameters()


def test_an_unmarked_tuple_of_arrays():
    class Pair(Module):
        weights: Any = None

    m = Pair(weights=(np.ones(2), np.ones(2)))
    with pytest.raises(TypeError, match=r"field 'weights' of Pair holds a tuple but is not marked"):
        m.named_parameters()


def test_unmarked_config_values_are_static():
    class Cfg(Module):
        weight: Any = param()
        kernel: Any = None
        name: Any = None

    m = Cfg(weight=np.ones(2), kernel=(3, 3), name="x")
    (g,) = gradcheck.gradient(lambda m: ops.sum(m.weight), m)
    assert g.kernel is None and g.name is None and g.weight.shape == (2,)


def test_a_param_field_holding_a_non_array():
    class Odd(Module):
        weight: Any = param()

    with pytest.raises(TypeError, match=r"weight: a param of Odd must be an array, got str"):
        gradcheck.gradient(lambda m: 0.0, Odd(weight="zeros"))


# ---------------------------------------------------------------- mixing backends
def test_mixing_torch_and_tape_arrays():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"an op received both (tape and torch|torch and tape) arrays; a computation "
                                        r"must stay on one backend"):
        ops.add(T(3), torch.ones(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="both (tape and torch|torch and tape) arrays"):
        ops.concatenate([T(3), torch.ones(3, dtype=torch.float64)])


def test_mixing_tape_and_numpy_is_fine():
    # numpy arrays and Python scalars are constants that join any backend.
    out = ops.add(T(3), np.arange(3.0))
    assert isinstance(out, Tensor) and out.requires_grad


# ---------------------------------------------------------------- the loss
def test_a_non_scalar_loss():
    with pytest.raises(ValueError, match=r"the loss must be a scalar, got an output of shape \(3,\); reduce it"):
        gradcheck.gradient(lambda x: x * 2.0, np.ones(3))
    model = Chain(Dense(2, 2, rng=0))
    with pytest.raises(ValueError, match=r"the loss must be a scalar, got an output of shape \(4, 2\)"):
        gradcheck.withgradient(lambda m, x: (m(x), "aux"), model, np.ones((4, 2), np.float32))


def test_a_cotangent_of_the_wrong_shape():
    x = T(3)
    with pytest.raises(ValueError, match=r"cotangent of shape \(2,\) for an output of shape \(3,\)"):
        tape.grad(ops.mul(x, 2.0), [x], cotangent=np.ones(2))


def test_unknown_backend():
    with pytest.raises(ValueError, match=r"unknown backend 'tensorflow'; choose from tape, torch, jax"):
        gradcheck.gradient(lambda x: ops.sum(x), np.ones(3), backend="tensorflow")
