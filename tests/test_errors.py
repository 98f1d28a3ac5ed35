"""Bad input: every error names the op or field, the offending shape or type, and what was expected.

Never a bare numpy traceback from deep inside the tape.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gradcheck
from gradcheck import ops
from gradcheck.backends.numpy import ops as numpy_ops
from gradcheck.backends.tape import ops as tape_ops
from gradcheck.backends.tape import tape
from gradcheck.backends.tape.tape import Tensor
from gradcheck.layers import Chain, Conv2d, Dense
from gradcheck.module import Module, param
from gradcheck.ops import BackendOpMissing, shape_of


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


def test_dense_with_the_wrong_input_width_names_linear_and_shapes():
    layer = Dense(3, 2, rng=0)
    with pytest.raises(ValueError, match=r"linear: input of shape \(4, 5\) and weight \(2, 3\)"):
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
    with pytest.raises(ValueError, match=r"max_pool2d: input of shape \(2, 5, 5\); expected 4 dims, NCHW"):
        ops.max_pool2d(make(2, 5, 5), 2)
    with pytest.raises(ValueError, match=r"avg_pool2d: input of shape \(2, 5, 5\); expected 4 dims"):
        ops.avg_pool2d(make(2, 5, 5), 2)
    with pytest.raises(ValueError, match=r"adaptive_avg_pool2d: input of shape \(2, 5, 5\); expected 4 dims"):
        ops.adaptive_avg_pool2d(make(2, 5, 5), 2)
    with pytest.raises(ValueError, match=r"padding \(2, 2\) must be at most half the kernel \(3, 3\)"):
        ops.max_pool2d(make(1, 1, 5, 5), 3, padding=2)


# ---------------------------------------------------------------- one rule, one message, every backend
def _torch(a):
    torch = pytest.importorskip("torch")
    return torch.tensor(a, requires_grad=a.dtype.kind == "f")


def _jax(a):
    from gradcheck.backends.jax.driver import configure_jax

    pytest.importorskip("jax")
    return configure_jax().numpy.asarray(a)


MAKERS = {
    "numpy": np.asarray,
    "tape": lambda a: Tensor(a, requires_grad=a.dtype.kind == "f"),
    "torch": _torch,
    "jax": _jax,
}


def F(*shape):
    """A float argument of ``shape``: it becomes each backend's own array."""
    return ("float", shape)


C = np.array  # an integer or bool constant: numpy on every backend


# (call, its arguments, the error type, what the message says): each message is the one every backend gives.
ONE_MESSAGE = [
    ("add", (F(2, 3), F(4)), {}, ValueError, r"add: shapes \(2, 3\), \(4,\) do not broadcast: counted from the last"),
    ("where", (C([True, False, True, True]), F(2, 3), F(2, 3)), {}, ValueError,
     r"where: shapes \(4,\), \(2, 3\), \(2, 3\) do not broadcast"),
    ("where", (F(3), F(3), F(3)), {}, TypeError, r"where: the condition has dtype float64; expected a bool array"),
    ("matmul", (F(2, 3), F(4, 5)), {}, ValueError, r"matmul: shapes \(2, 3\) and \(4, 5\) do not match: the first's "
                                                 r"last axis \(3\) must equal the second's second-to-last axis \(4\)"),
    ("matmul", (F(3), F(4)), {}, ValueError, r"matmul: shapes \(3,\) and \(4,\) do not match: .* the second's only"),
    ("matmul", (F(2, 3, 4), F(3, 4, 5)), {}, ValueError, r"batch dimensions \(2,\) and \(3,\) do not broadcast"),
    ("matmul", (F(), F(3)), {}, ValueError, r"matmul: shapes \(\) and \(3,\): a 0-d operand .* use mul"),
    ("einsum", ("ij,jk->ik", F(2, 3), F(4, 5)), {}, ValueError,
     r"einsum 'ij,jk->ik': index 'j' has size 3 in operand 0 and 4 in operand 1"),
    ("einsum", ("ij,j1", F(2, 3), F(3, 5)), {}, ValueError, r"einsum 'ij,j1': 'j1' has '1'; indices are letters"),
    ("einsum", ("ijk,jk->i", F(2, 3), F(3, 5)), {}, ValueError, r"operand 0 has shape \(2, 3\) \(2 axes\) but its term"),
    ("einsum", ("...ij,...jk->...ik", F(2, 2, 3), F(3, 3, 4)), {}, ValueError,
     r"einsum '...ij,...jk->...ik' \(the '...' dims\): shapes \(2,\), \(3,\) do not broadcast"),
    # (torch sums the '...' dims of '...i->i', so the rule accepts it; an output index twice torch refuses too)
    ("einsum", ("ij->ii", F(2, 3)), {}, ValueError, r"every output index must appear once, and in an input"),
    ("sum", (F(5, 3),), {"axis": 2}, ValueError, r"sum: axis 2 is out of bounds for an array of shape \(5, 3\)"),
    ("mean", (F(5, 3),), {"axis": (0, -2)}, ValueError, r"mean: axis=\(0, -2\) names an axis twice"),
    ("max", (F(2, 0),), {"axis": 1}, ValueError, r"max: reducing an axis of size 0 \(shape \(2, 0\), axis=1\)"),
    ("softmax", (F(2, 3),), {"axis": 2}, ValueError, r"softmax: axis 2 is out of bounds"),
    ("reshape", (F(5, 3), (4, 4)), {}, ValueError,
     r"reshape: cannot reshape an array of shape \(5, 3\) \(size 15\) into shape \(4, 4\)"),
    ("reshape", (F(6,), (-1, -1)), {}, ValueError, r"reshape: shape \(-1, -1\): .* at most one -1"),
    ("transpose", (F(2, 3), (0, 0)), {}, ValueError, r"transpose: axes \(0, 0\) are not a permutation of the 2 axes"),
    ("broadcast_to", (F(2, 3), (4, 3)), {}, ValueError, r"broadcast_to: an array of shape \(2, 3\) does not broadcast "
                                                       r"to \(4, 3\)"),
    ("concatenate", ([F(2, 3), F(3, 2)],), {}, ValueError, r"concatenate: array 1 has shape \(3, 2\) and array 0 "
                                                          r"\(2, 3\); along axis 0 they join"),
    ("stack", ([F(2, 3), F(3, 2)],), {}, ValueError, r"stack: array 1 has shape \(3, 2\) and array 0 \(2, 3\)"),
    ("getitem", (F(2, 3), (5,)), {}, IndexError, r"getitem: index \[5\] is invalid for shape \(2, 3\): index 5 is out "
                                                 r"of bounds for axis 0 with size 2"),
    ("getitem", (F(2, 3), C([0.5])), {}, TypeError, r"getitem: an index array of dtype float64 \(shape \(1,\)\)"),
    ("getitem", (F(2, 3), "a"), {}, TypeError, r"getitem: index component 'a' of type str"),
    ("take", (F(2, 3), C([0.5])), {}, TypeError, r"take: indices of dtype float64; expected an integer array"),
    ("take", (F(2, 3), C([7])), {}, IndexError, r"take: index 7 is out of bounds for axis 0 with size 2"),
    ("take", (F(2, 3), C([0])), {"axis": 2}, ValueError, r"take: axis 2 is out of bounds for an array of shape"),
    ("pad", (F(2, 3), ((1, 2), (1, 2), (1, 2))), {}, ValueError, r"pad: pad_width .* for an input of shape \(2, 3\); "
                                                               r"expected one \(before, after\) pair .*\(2 pairs\)"),
    ("pad", (F(2, 3), ((1, -1), (0, 0))), {}, ValueError, r"pad: pad_width .* has a negative width"),
    ("conv", (F(1, 3, 5, 5), F(4, 2, 3, 3)), {}, ValueError, r"conv: input \(1, 3, 5, 5\) has 3 channels but weight "
                                                           r"\(4, 2, 3, 3\) with groups=1 expects 2"),
    ("conv", (F(1, 2, 2), F(3, 2, 3)), {}, ValueError, r"smaller than the dilated kernel .*1-d input \(1, 2, 2\)"),
    ("conv", (F(1, 2, 5, 5), F(3, 2, 3, 3)), {"stride": 0}, ValueError, r"conv: stride \(0, 0\) and dilation \(1, 1\) "
                                                                      r"must be positive"),
    ("conv", (F(1, 2, 5, 5), F(3, 2, 3, 3)), {"stride": 2, "padding": "same"}, ValueError,
     r"padding='same' needs stride 1"),
    ("conv", (F(1, 2, 5, 5), F(3, 2, 3, 3)), {"padding": "full"}, ValueError, r"padding='full': expected an int"),
    ("conv", (F(1, 2, 5, 5), F(3, 2, 3, 3)), {"stride": (1, 2, 3)}, ValueError, r"stride=\(1, 2, 3\): expected an int "
                                                                              r"or 2 ints"),
    ("conv", (F(1, 2, 5, 5), F(3, 2, 3, 3), F(4)), {}, ValueError, r"conv: bias of shape \(4,\); expected \(3,\)"),
    ("conv_transpose", (F(1, 3, 5, 5), F(4, 2, 3, 3)), {}, ValueError, r"conv_transpose: input \(1, 3, 5, 5\) has 3 "
                                                                     r"channels but weight \(4, 2, 3, 3\) expects 4"),
    ("conv_transpose", (F(1, 4, 5, 5), F(4, 2, 3, 3)), {"padding": "same"}, ValueError,
     r"conv_transpose: padding='same'; a transposed convolution takes an int or a tuple"),
    ("conv_transpose", (F(1, 4, 5, 5), F(4, 2, 3, 3)), {"stride": 2, "output_padding": 2}, ValueError,
     r"output_padding=\(2, 2\) must be smaller than stride"),
    ("max_pool2d", (F(1, 3, 5), 2), {}, ValueError, r"max_pool2d: input of shape \(1, 3, 5\); expected 4 dims, NCHW"),
    ("max_pool2d", (F(1, 1, 3, 3), 5), {}, ValueError, r"max_pool2d: input \(1, 1, 3, 3\) is smaller than the kernel"),
    ("avg_pool2d", (F(1, 1, 4, 4), 2), {"padding": 2}, ValueError, r"avg_pool2d: padding \(2, 2\) must be at most half"),
    ("avg_pool2d", (F(1, 1, 3, 3), 0), {}, ValueError, r"avg_pool2d: kernel_size \(0, 0\) and stride \(0, 0\) must be"),
    ("adaptive_avg_pool2d", (F(1, 3, 5), 2), {}, ValueError, r"adaptive_avg_pool2d: input of shape \(1, 3, 5\)"),
    ("adaptive_avg_pool2d", (F(1, 3, 5, 5), 0), {}, ValueError, r"output_size=0; expected a positive int"),
    ("gelu", (F(3),), {"approximate": "fast"}, ValueError, r"gelu: approximate='fast'; expected 'none' or 'tanh'"),
    ("linear", (F(4, 5), F(3, 4)), {}, ValueError, r"linear: input of shape \(4, 5\) and weight \(3, 4\): .* the "
                                                 r"input's last dim must be in_features=4"),
    ("linear", (F(4, 4), F(3, 4), F(5)), {}, ValueError, r"linear: bias of shape \(5,\); expected \(3,\)"),
    ("batch_norm", (F(4),), {}, ValueError, r"batch_norm: input of shape \(4,\); expected \(N, C, ...\)"),
    ("batch_norm", (F(4, 3), None, None, F(5)), {}, ValueError, r"batch_norm: weight of shape \(5,\); expected \(3,\)"),
    ("batch_norm", (F(4, 3),), {"training": False}, ValueError, r"training=False needs running_mean and running_var"),
    ("batch_norm", (F(4, 3), F(3)), {}, ValueError, r"give both running_mean and running_var, or neither"),
    ("batch_norm", (F(4, 3), F(3), F(3)), {"momentum": None}, ValueError, r"1 / num_batches_tracked"),
    ("batch_norm", (C([[1, 2]]),), {}, TypeError, r"batch_norm: input of dtype int64; expected a float array"),
    ("layer_norm", (F(4, 3), (5,)), {}, ValueError, r"layer_norm: normalized_shape \(5,\) is not the trailing shape"),
    ("layer_norm", (F(4, 3), (3,), F(4)), {}, ValueError, r"layer_norm: weight of shape \(4,\); expected \(3,\)"),
    ("rms_norm", (F(4, 3), (3,), F(3, 1)), {}, ValueError, r"rms_norm: weight of shape \(3, 1\); expected \(3,\)"),
    ("group_norm", (F(2, 6, 3), 4), {}, ValueError, r"group_norm: num_groups=4 must be a positive int dividing"),
    ("normalize", (F(2, 3), (0,), 1e-5, F(2, 4)), {}, ValueError, r"normalize: weight of shape \(2, 4\) does not "
                                                                  r"broadcast into the input's shape \(2, 3\)"),
    ("scaled_dot_product_attention", (F(2, 3, 4), F(2, 5, 4), F(2, 6, 4)), {}, ValueError,
     r"scaled_dot_product_attention: query \(2, 3, 4\), key \(2, 5, 4\), value \(2, 6, 4\); expected"),
    ("scaled_dot_product_attention", (F(3, 4), F(3, 4), F(3, 4)),
     {"attn_mask": C(np.ones((3, 3), bool)), "is_causal": True}, ValueError, r"give attn_mask or is_causal=True, not"),
    ("scaled_dot_product_attention", (F(3, 4), F(5, 4), F(5, 4)), {"attn_mask": C(np.ones((3, 3), bool))}, ValueError,
     r"attn_mask of shape \(3, 3\) does not broadcast to the scores' shape \(3, 5\)"),
    ("embedding", (C([0, 5]), F(3, 4)), {}, IndexError, r"embedding: id 5 is out of range for a table of 3 rows"),
    ("embedding", (C([0.5]), F(3, 4)), {}, TypeError, r"embedding: ids of dtype float64; expected an integer array"),
    ("embedding", (C([0]), F(3, 4)), {"padding_idx": 3}, ValueError, r"padding_idx=3 is out of range for a table"),
    ("cross_entropy", (F(4), C(0)), {}, ValueError, r"cross_entropy: input of shape \(4,\); expected \(N, C\)"),
    ("cross_entropy", (F(4, 3), C([0, 1, 2, 3])), {}, IndexError, r"cross_entropy: target 3 is out of bounds for 3 "
                                                                  r"classes \(ignore_index=-100\)"),
    ("cross_entropy", (F(4, 3), C([0, 1, 2])), {}, ValueError, r"class-index targets of shape \(3,\); an input \(4, 3\) "
                                                               r"needs \(4,\)"),
    ("cross_entropy", (F(4, 3), F(4, 2)), {}, ValueError, r"probability targets of shape \(4, 2\) must match"),
    ("cross_entropy", (F(4, 3), C([0, 1, 2, 1])), {"reduction": "avg"}, ValueError,
     r"cross_entropy: reduction='avg'; expected 'mean', 'sum' or 'none'"),
    ("cross_entropy", (F(4, 3), C([0, 1, 2, 1])), {"weight": F(2)}, ValueError, r"weight of shape \(2,\); expected \(3,\)"),
    ("nll_loss", (F(4, 3), C([0, 1, 2, 5])), {}, IndexError, r"nll_loss: target 5 is out of bounds for 3 classes"),
    ("nll_loss", (F(4, 3), F(4, 3)), {}, TypeError, r"nll_loss: target of dtype float64; expected an integer array"),
    ("mse_loss", (F(4, 3), F(4, 2)), {}, ValueError, r"mse_loss: shapes \(4, 3\), \(4, 2\) do not broadcast"),
    ("binary_cross_entropy_with_logits", (F(2, 3), F(3)), {}, ValueError, r"target of shape \(3,\) must match the input"),
    ("upsample_nearest2d", (F(1, 1, 2, 2), (0, 4)), {}, ValueError, r"upsample_nearest2d: size=\(0, 4\); expected a"),
]


def _argument(value, backend):
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "float":
        rng = np.random.default_rng(0)
        return MAKERS[backend](rng.uniform(0.5, 1.5, value[1]))  # away from every kink and pole
    if isinstance(value, list):
        return [_argument(v, backend) for v in value]
    return value


@pytest.mark.parametrize("name, args, kwargs, error, match", ONE_MESSAGE,
                         ids=[f"{row[0]}-{i}" for i, row in enumerate(ONE_MESSAGE)])
def test_every_backend_refuses_with_one_message(name, args, kwargs, error, match):
    messages = {}
    for backend in MAKERS:
        with pytest.raises(error, match=match) as caught:
            getattr(ops, name)(*(_argument(a, backend) for a in args),
                               **{k: _argument(v, backend) for k, v in kwargs.items()})
        messages[backend] = f"{type(caught.value).__name__}: {caught.value}"
    assert len(set(messages.values())) == 1, messages


def test_a_rule_checks_only_what_the_contract_says():
    # The negative control of the table above: the same calls, corrected, run on every backend.
    for backend in MAKERS:
        x = _argument(F(2, 3), backend)
        assert shape_of(ops.add(x, _argument(F(3), backend))) == (2, 3)
        assert shape_of(ops.reshape(x, (-1,))) == (6,)
        assert shape_of(ops.take(x, np.array([1, -2]))) == (2, 3)
        assert shape_of(ops.getitem(x, (slice(None), np.array([0, 2])))) == (2, 2)
        assert shape_of(ops.einsum("ij,jk->ik", x, _argument(F(3, 4), backend))) == (2, 4)
        assert shape_of(ops.cross_entropy(x, np.array([-100, 2]))) == ()  # ignore_index is no class


# ---------------------------------------------------------------- ops outside the table: the message names the op
@pytest.mark.parametrize(
    "call,expect",
    [
        (lambda: ops.squeeze(T(2, 3), 0), r"squeeze: axis 0 of shape \(2, 3\) has size 2, not 1"),
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
    with pytest.raises(TypeError, match=r"take: indices of dtype float64; expected an integer array"):
        ops.take(T(5, 3), np.array([0.0, 1.0]))
    with pytest.raises(TypeError, match=r"getitem: an index array of dtype float64"):
        ops.getitem(np.ones((5, 3)), (np.array([0.5]),))
    with pytest.raises(TypeError, match=r"take: indices of dtype float64"):  # only float tensors require grad
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
                                               r"add `def softplus\(...\)` to gradcheck/backends/tape/ops.py"):
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
