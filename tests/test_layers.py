"""Each layer against its torch.nn counterpart: names, shapes, forward, buffers and tape gradients.

One table row per configuration; one helper does the checking.  Our layer
runs on plain numpy in float64 (the forward the referee uses), torch runs the
same weights in float64; then the tape's gradients of a random projection of
the output are held against torch autograd's.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcheck
from gradcheck import ops
from gradcheck.backends import get_backend
from gradcheck.case import cast_floats
from gradcheck.layers import (
    ELU,
    GELU,
    GRU,
    LSTM,
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Chain,
    Conv1d,
    Conv2d,
    ConvTranspose1d,
    ConvTranspose2d,
    Dropout,
    Embedding,
    Flatten,
    GroupNorm,
    Lambda,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    MaxPool2d,
    MultiheadAttention,
    Parallel,
    ReLU,
    RMSNorm,
    Sigmoid,
    SiLU,
    SkipConnection,
    Softmax,
    Softplus,
    Tanh,
    binary_cross_entropy_with_logits,
    causal_mask,
    concat_channels,
    cross_entropy,
    mse_loss,
    scaled_dot_product_attention,
)
from gradcheck.suites.inputs import integers, kink_free, positive

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

# torch warns that an even kernel with padding="same" copies its input; that is the case under test.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same'")


def rng(seed=0):
    return np.random.default_rng(seed)


def x_normal(*shape):
    return lambda r: (r.standard_normal(shape),)


def x_kinkfree(*shape):
    return lambda r: (kink_free(r, shape),)


def ids(*shape, high):
    return lambda r: (integers(r, shape, high),)


def our_buffers(model):
    return [(p, v) for p, v, k in model.named_arrays() if k == "buffer"]


def load_into_torch(ours, tmod):
    """Copy our parameters and buffers into ``tmod`` by name, after checking the names and shapes match."""
    ours_p = [(p, tuple(np.shape(v))) for p, v in ours.named_parameters()]
    torch_p = [(p, tuple(v.shape)) for p, v in tmod.named_parameters()]
    assert ours_p == torch_p, f"parameters differ:\n ours  {ours_p}\n torch {torch_p}"
    ours_b = [(p, tuple(np.shape(v))) for p, v in our_buffers(ours)]
    torch_b = [(p, tuple(v.shape)) for p, v in tmod.named_buffers()]
    assert ours_b == torch_b, f"buffers differ:\n ours  {ours_b}\n torch {torch_b}"
    state = {p: torch.as_tensor(np.asarray(v)) for p, v, _ in ours.named_arrays()}
    tmod.load_state_dict(state, strict=True)
    return tmod


def to_torch(x, grad=False):
    t = torch.as_tensor(np.asarray(x))
    return t.requires_grad_(True) if grad and t.is_floating_point() else t


def first(out):
    return out[0] if isinstance(out, tuple) else out


def check_against_torch(ours, theirs, inputs, mode="train", call=None, torch_call=None, grads=True,
                        rtol=1e-9, atol=1e-11):
    """Forward (numpy float64 vs torch float64), buffers after the call, and tape vs torch gradients.

    Our layer also runs on the torch backend (``F.linear``, ``F.batch_norm`` ...
    through ``gradcheck.ops``): its gradients and buffers are held against
    torch.nn's too.
    """
    call = call or (lambda m, *xs: m(*xs))
    torch_call = torch_call or call
    ours = cast_floats(ours.train(mode == "train"), np.float64)
    if theirs is not None:
        theirs = load_into_torch(ours, theirs.double().train(mode == "train"))
    # The tape run goes first: it works on copies, while the numpy run updates `ours` in place.
    fresh = cast_floats(ours, np.float64)
    y = first(call(ours, *inputs))
    ty_inputs = [to_torch(x, grad=True) for x in inputs]
    ty = first(torch_call(theirs, *ty_inputs) if theirs is not None else torch_call(*ty_inputs))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=rtol, atol=atol, err_msg="forward: ours (numpy) vs torch")
    if theirs is not None:
        for (p, v), (_, tv) in zip(our_buffers(ours), theirs.named_buffers()):
            np.testing.assert_allclose(np.asarray(v), tv.numpy(), rtol=rtol, atol=atol, err_msg=f"buffer {p} after forward")
    if not grads:
        return
    r = np.random.default_rng(99).standard_normal(np.shape(y))
    (g_model, *g_inputs) = gradcheck.gradient(lambda m, *xs: ops.sum(first(call(m, *xs)) * r), fresh, *inputs)
    (ty * torch.as_tensor(r)).sum().backward()
    tape_grads = dict((p, v) for p, v, _ in g_model.named_arrays()) if g_model is not None else {}
    if theirs is not None:
        for p, tp in theirs.named_parameters():
            got = tape_grads.get(p)
            want = tp.grad.numpy() if tp.grad is not None else np.zeros(tuple(tp.shape))
            assert got is not None, f"tape gave no gradient for parameter {p}"
            np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10, err_msg=f"tape vs torch gradient of {p}")
    for k, (g, tx) in enumerate(zip(g_inputs, ty_inputs)):
        if tx.is_floating_point():
            np.testing.assert_allclose(g, tx.grad.numpy(), rtol=1e-8, atol=1e-10, err_msg=f"tape vs torch gradient of input {k}")
    # Our layer on the torch backend, against torch.nn.
    ev = get_backend("torch").evaluate(lambda m, *xs: ops.sum(ops.mul(first(call(m, *xs)), r)), (fresh, *inputs))
    if theirs is not None:
        for p, tp in theirs.named_parameters():
            want = tp.grad.numpy() if tp.grad is not None else np.zeros(tuple(tp.shape))
            np.testing.assert_allclose(ev.grads[f"0.{p}"], want, rtol=1e-8, atol=1e-10,
                                       err_msg=f"torch backend vs torch.nn gradient of {p}")
        for p, tv in theirs.named_buffers():
            np.testing.assert_allclose(ev.buffers[f"0.{p}"], tv.numpy(), rtol=rtol, atol=atol,
                                       err_msg=f"torch backend vs torch.nn buffer {p} after forward")
    for k, tx in enumerate(ty_inputs):
        if tx.is_floating_point():
            np.testing.assert_allclose(ev.grads[str(k + 1)], tx.grad.numpy(), rtol=1e-8, atol=1e-10,
                                       err_msg=f"torch backend vs torch gradient of input {k}")


def TORCH_SELF_ATTENTION(m, x):
    return m(x, x, x, need_weights=False)[0]


# id: (our layer, torch module, inputs(rng), mode[, how torch calls its module])
MODULE_ROWS = {
    "Linear": (lambda: Linear(5, 3), lambda: nn.Linear(5, 3), x_normal(4, 5), "train"),
    "Linear-nobias-3d": (lambda: Linear(5, 3, bias=False), lambda: nn.Linear(5, 3, bias=False), x_normal(2, 3, 5), "train"),
    "Conv1d[k3]": (lambda: Conv1d(3, 4, 3), lambda: nn.Conv1d(3, 4, 3), x_normal(2, 3, 9), "train"),
    "Conv1d[k3,s2,p1,d2,g]": (lambda: Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2),
                              lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2), x_normal(2, 4, 11), "train"),
    "Conv1d[k4,same]": (lambda: Conv1d(3, 2, 4, padding="same"), lambda: nn.Conv1d(3, 2, 4, padding="same"), x_normal(2, 3, 8), "train"),
    "Conv2d[k3,p1]": (lambda: Conv2d(3, 4, 3, padding=1), lambda: nn.Conv2d(3, 4, 3, padding=1), x_normal(2, 3, 6, 6), "train"),
    "Conv2d[k3,s2,p1,g2]": (lambda: Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
                            lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), x_normal(2, 4, 7, 7), "train"),
    "Conv2d[k3,d2,same]": (lambda: Conv2d(3, 4, 3, dilation=2, padding="same"),
                           lambda: nn.Conv2d(3, 4, 3, dilation=2, padding="same"), x_normal(1, 3, 8, 8), "train"),
    "Conv2d[k4,same]": (lambda: Conv2d(2, 3, 4, padding="same", bias=False),
                        lambda: nn.Conv2d(2, 3, 4, padding="same", bias=False), x_normal(1, 2, 6, 7), "train"),
    "Conv2d[depthwise]": (lambda: Conv2d(4, 8, 3, groups=4, padding=(1, 0)),
                          lambda: nn.Conv2d(4, 8, 3, groups=4, padding=(1, 0)), x_normal(2, 4, 5, 6), "train"),
    "Conv2d[k(2,3),s(2,1)]": (lambda: Conv2d(3, 2, (2, 3), stride=(2, 1)), lambda: nn.Conv2d(3, 2, (2, 3), stride=(2, 1)),
                              x_normal(2, 3, 7, 6), "train"),
    "ConvTranspose2d[k3,s2,p1,op1]": (lambda: ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
                                      lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
                                      x_normal(2, 4, 4, 5), "train"),
    "ConvTranspose2d[k2,s2,g2,nobias]": (lambda: ConvTranspose2d(4, 6, 2, stride=2, groups=2, bias=False),
                                         lambda: nn.ConvTranspose2d(4, 6, 2, stride=2, groups=2, bias=False),
                                         x_normal(2, 4, 3, 3), "train"),
    "ConvTranspose2d[k3,d2]": (lambda: ConvTranspose2d(3, 2, 3, dilation=2), lambda: nn.ConvTranspose2d(3, 2, 3, dilation=2),
                               x_normal(1, 3, 4, 4), "train"),
    "ConvTranspose1d[k3,s2]": (lambda: ConvTranspose1d(3, 2, 3, stride=2), lambda: nn.ConvTranspose1d(3, 2, 3, stride=2),
                               x_normal(2, 3, 5), "train"),
    "BatchNorm2d[train]": (lambda: BatchNorm2d(3), lambda: nn.BatchNorm2d(3), x_normal(4, 3, 3, 3), "train"),
    "BatchNorm2d[train,m0.3,eps1e-3,noaffine]": (lambda: BatchNorm2d(3, eps=1e-3, momentum=0.3, affine=False),
                                                 lambda: nn.BatchNorm2d(3, eps=1e-3, momentum=0.3, affine=False),
                                                 x_normal(2, 3, 4, 2), "train"),
    "BatchNorm2d[train,momentum=None]": (lambda: BatchNorm2d(3, momentum=None), lambda: nn.BatchNorm2d(3, momentum=None),
                                         x_normal(2, 3, 2, 2), "train"),
    "BatchNorm2d[eval]": (lambda: _with_stats(BatchNorm2d(3)), lambda: nn.BatchNorm2d(3), x_normal(2, 3, 3, 3), "eval"),
    "BatchNorm2d[no-stats]": (lambda: BatchNorm2d(3, track_running_stats=False),
                              lambda: nn.BatchNorm2d(3, track_running_stats=False), x_normal(2, 3, 3, 3), "eval"),
    "BatchNorm1d[NC]": (lambda: BatchNorm1d(5), lambda: nn.BatchNorm1d(5), x_normal(6, 5), "train"),
    "BatchNorm1d[NCL]": (lambda: BatchNorm1d(4), lambda: nn.BatchNorm1d(4), x_normal(3, 4, 5), "train"),
    "BatchNorm1d[eval]": (lambda: _with_stats(BatchNorm1d(4)), lambda: nn.BatchNorm1d(4), x_normal(3, 4), "eval"),
    "LayerNorm[8]": (lambda: _randomised(LayerNorm(8)), lambda: nn.LayerNorm(8), x_normal(2, 3, 8), "train"),
    "LayerNorm[(3,4),noaffine]": (lambda: LayerNorm((3, 4), elementwise_affine=False),
                                  lambda: nn.LayerNorm((3, 4), elementwise_affine=False), x_normal(2, 3, 4), "train"),
    "LayerNorm[nobias]": (lambda: _randomised(LayerNorm(6, bias=False)), lambda: nn.LayerNorm(6, bias=False), x_normal(4, 6), "train"),
    "GroupNorm[2,6]": (lambda: _randomised(GroupNorm(2, 6)), lambda: nn.GroupNorm(2, 6), x_normal(2, 6, 3, 3), "train"),
    "GroupNorm[6,6,noaffine]": (lambda: GroupNorm(6, 6, affine=False), lambda: nn.GroupNorm(6, 6, affine=False),
                                x_normal(2, 6, 4), "train"),
    "RMSNorm[8]": (lambda: _randomised(RMSNorm(8)), lambda: nn.RMSNorm(8), x_normal(2, 3, 8), "train"),
    "RMSNorm[(3,4),eps1e-5]": (lambda: RMSNorm((3, 4), eps=1e-5), lambda: nn.RMSNorm((3, 4), eps=1e-5), x_normal(2, 3, 4), "train"),
    "RMSNorm[noaffine]": (lambda: RMSNorm(5, elementwise_affine=False), lambda: nn.RMSNorm(5, elementwise_affine=False),
                          x_normal(3, 5), "train"),
    "MaxPool2d[k2]": (lambda: MaxPool2d(2), lambda: nn.MaxPool2d(2), x_kinkfree(2, 3, 6, 6), "train"),
    "MaxPool2d[k3,s2,p1]": (lambda: MaxPool2d(3, 2, 1), lambda: nn.MaxPool2d(3, 2, 1), x_kinkfree(2, 2, 7, 7), "train"),
    "AvgPool2d[k2]": (lambda: AvgPool2d(2), lambda: nn.AvgPool2d(2), x_normal(2, 3, 6, 6), "train"),
    "AvgPool2d[k3,s2,p1,exclude]": (lambda: AvgPool2d(3, 2, 1, count_include_pad=False),
                                    lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False), x_normal(2, 2, 7, 7), "train"),
    "AdaptiveAvgPool2d[1]": (lambda: AdaptiveAvgPool2d(1), lambda: nn.AdaptiveAvgPool2d(1), x_normal(2, 3, 5, 5), "train"),
    "AdaptiveAvgPool2d[(2,3)]": (lambda: AdaptiveAvgPool2d((2, 3)), lambda: nn.AdaptiveAvgPool2d((2, 3)), x_normal(2, 3, 5, 7), "train"),
    "AdaptiveAvgPool2d[(None,3)]": (lambda: AdaptiveAvgPool2d((None, 3)), lambda: nn.AdaptiveAvgPool2d((None, 3)),
                                    x_normal(1, 2, 4, 7), "train"),
    "Flatten": (lambda: Flatten(), lambda: nn.Flatten(), x_normal(2, 3, 4, 2), "train"),
    "Flatten[1,2]": (lambda: Flatten(1, 2), lambda: nn.Flatten(1, 2), x_normal(2, 3, 4, 2), "train"),
    "Embedding": (lambda: Embedding(10, 4), lambda: nn.Embedding(10, 4), ids(3, 5, high=10), "train"),
    "Embedding[padding_idx]": (lambda: Embedding(7, 3, padding_idx=0), lambda: nn.Embedding(7, 3, padding_idx=0),
                               lambda r: (np.array([[0, 1, 2, 0], [3, 0, 6, 6]]),), "train"),
    "ReLU": (lambda: ReLU(), lambda: nn.ReLU(), x_kinkfree(3, 7), "train"),
    "LeakyReLU[0.2]": (lambda: LeakyReLU(0.2), lambda: nn.LeakyReLU(0.2), x_kinkfree(3, 7), "train"),
    "ELU[0.5]": (lambda: ELU(0.5), lambda: nn.ELU(0.5), x_kinkfree(3, 7), "train"),
    "GELU": (lambda: GELU(), lambda: nn.GELU(), x_normal(3, 7), "train"),
    "GELU[tanh]": (lambda: GELU("tanh"), lambda: nn.GELU("tanh"), x_normal(3, 7), "train"),
    "SiLU": (lambda: SiLU(), lambda: nn.SiLU(), x_normal(3, 7), "train"),
    "Tanh": (lambda: Tanh(), lambda: nn.Tanh(), x_normal(3, 7), "train"),
    "Sigmoid": (lambda: Sigmoid(), lambda: nn.Sigmoid(), x_normal(3, 7), "train"),
    "Softplus": (lambda: Softplus(), lambda: nn.Softplus(), lambda r: (r.standard_normal((3, 7)) * 15,), "train"),
    "Softplus[beta2,th3]": (lambda: Softplus(2.0, 3.0), lambda: nn.Softplus(2.0, 3.0), lambda r: (r.standard_normal((3, 7)) * 3,), "train"),
    "Softmax[1]": (lambda: Softmax(1), lambda: nn.Softmax(1), x_normal(3, 4, 2), "train"),
    "LogSoftmax[-1]": (lambda: LogSoftmax(-1), lambda: nn.LogSoftmax(-1), x_normal(3, 4, 2), "train"),
    "MultiheadAttention[E8,h2]": (lambda: MultiheadAttention(8, 2), lambda: nn.MultiheadAttention(8, 2, batch_first=True),
                                  x_normal(2, 5, 8), "train", TORCH_SELF_ATTENTION),
    "MultiheadAttention[nobias]": (lambda: MultiheadAttention(8, 4, bias=False),
                                   lambda: nn.MultiheadAttention(8, 4, bias=False, batch_first=True), x_normal(2, 3, 8), "train",
                                   TORCH_SELF_ATTENTION),
    "LSTM": (lambda: LSTM(3, 4), lambda: nn.LSTM(3, 4), x_normal(5, 2, 3), "train"),
    "LSTM[batch_first,2layers]": (lambda: LSTM(3, 4, num_layers=2, batch_first=True),
                                  lambda: nn.LSTM(3, 4, num_layers=2, batch_first=True), x_normal(2, 5, 3), "train"),
    "LSTM[nobias,unbatched]": (lambda: LSTM(3, 2, bias=False), lambda: nn.LSTM(3, 2, bias=False), x_normal(4, 3), "train"),
    "GRU": (lambda: GRU(3, 4), lambda: nn.GRU(3, 4), x_normal(5, 2, 3), "train"),
    "GRU[batch_first,2layers]": (lambda: GRU(3, 4, num_layers=2, batch_first=True),
                                 lambda: nn.GRU(3, 4, num_layers=2, batch_first=True), x_normal(2, 4, 3), "train"),
}


def _with_stats(bn):
    """Non-trivial running statistics, so eval mode is more than the identity."""
    r = rng(7)
    bn.running_mean = r.standard_normal(bn.running_mean.shape).astype(np.float32)
    bn.running_var = positive(r, bn.running_var.shape).astype(np.float32)
    bn.weight = positive(r, bn.weight.shape).astype(np.float32)
    bn.bias = r.standard_normal(bn.bias.shape).astype(np.float32)
    return bn


def _randomised(norm):
    """Affine parameters away from their 1/0 init, so a swapped weight/bias would show."""
    r = rng(8)
    for name in ("weight", "bias"):
        if getattr(norm, name, None) is not None:
            setattr(norm, name, r.standard_normal(getattr(norm, name).shape).astype(np.float32))
    return norm


@pytest.mark.parametrize("row", list(MODULE_ROWS), ids=list(MODULE_ROWS))
def test_module_matches_torch(row):
    ours, theirs, inputs, mode, *torch_call = MODULE_ROWS[row]
    torch.manual_seed(0)
    check_against_torch(ours(), theirs(), inputs(rng(1)), mode=mode, torch_call=(torch_call or [None])[0])


def test_batchnorm_running_stats_after_one_train_forward():
    ours = cast_floats(BatchNorm2d(3, momentum=0.2), np.float64)
    theirs = nn.BatchNorm2d(3, momentum=0.2).double()
    x = rng(3).standard_normal((4, 3, 5, 5)) * 2 + 1
    ours(x)
    theirs(torch.as_tensor(x))
    np.testing.assert_allclose(ours.running_mean, theirs.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.running_var, theirs.running_var.numpy(), rtol=1e-12)
    assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked) == 1


@pytest.mark.parametrize("momentum", [0.2, None], ids=["momentum0.2", "momentum=None"])
def test_batchnorm_running_stats_after_train_steps_match_torch_exactly(momentum):
    # Three training steps: running statistics and num_batches_tracked on numpy, the tape and the torch
    # backend (F.batch_norm) against torch.nn.BatchNorm2d, in float64.  momentum=None is the cumulative
    # average, factor 1/num_batches_tracked after the increment.
    theirs = nn.BatchNorm2d(3, momentum=momentum).double()
    ours = {b: cast_floats(BatchNorm2d(3, momentum=momentum), np.float64) for b in ("numpy", "tape", "torch")}
    for step in range(3):
        x = rng(10 + step).standard_normal((4, 3, 5, 5)) * 2 + 1
        theirs(torch.as_tensor(x))
        ours["numpy"](x)  # updates the layer in place
        for b in ("tape", "torch"):
            ev = get_backend(b).evaluate(lambda m, x: ops.sum(m(x)), (ours[b], x))
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                setattr(ours[b], name, ev.buffers[f"0.{name}"])
        for b, m in ours.items():
            # torch's own kernel, fed the same momentum, is bit for bit torch.nn's; the compositions round apart.
            rtol = 0 if b == "torch" else 1e-14
            for name in ("running_mean", "running_var"):
                np.testing.assert_allclose(getattr(m, name), getattr(theirs, name).numpy(), rtol=rtol, atol=0,
                                           err_msg=f"{b}: {name} after step {step + 1}")
            assert int(m.num_batches_tracked) == int(theirs.num_batches_tracked) == step + 1, b
            assert np.asarray(m.num_batches_tracked).dtype == np.int64, b


def test_batchnorm_buffers_get_no_gradient_and_update_on_tape():
    bn = cast_floats(BatchNorm2d(2), np.float64)
    x = rng(4).standard_normal((3, 2, 2, 2))
    r = rng(5).standard_normal(x.shape)
    (g_bn, g_x) = gradcheck.gradient(lambda m, x: ops.sum(m(x) * r), bn, x)
    assert g_bn.running_mean is None and g_bn.running_var is None and g_bn.num_batches_tracked is None
    assert g_bn.weight.shape == (2,) and g_x.shape == x.shape
    assert float(np.abs(g_x).max()) > 0  # a random projection keeps the input gradient non-trivial


def test_batchnorm_rejects_wrong_rank_and_single_value():
    with pytest.raises(ValueError, match="BatchNorm2d"):
        BatchNorm2d(3)(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="more than 1 value"):
        BatchNorm1d(3)(np.zeros((1, 3)))


# ------------------------------------------------------------------ attention
def test_multihead_attention_masks_match_torch():
    r = rng(2)
    q, k = r.standard_normal((2, 4, 8)), r.standard_normal((2, 6, 8))
    attn = (r.random((4, 6)) > 0.6) & ~np.eye(4, 6, dtype=bool)  # True = masked, never a whole row
    pad = np.zeros((2, 6), bool)
    pad[0, 5] = pad[1, 0] = True
    torch.manual_seed(0)
    check_against_torch(
        MultiheadAttention(8, 2, rng=1), nn.MultiheadAttention(8, 2, batch_first=True), (q, k),
        call=lambda m, q, k: m(q, k, k, attn_mask=attn, key_padding_mask=pad),
        torch_call=lambda m, q, k: m(q, k, k, attn_mask=torch.as_tensor(attn), key_padding_mask=torch.as_tensor(pad),
                                     need_weights=False)[0],
    )


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask and attn_mask is deprecated")
@pytest.mark.parametrize("kind", ["bool+padding+causal", "float(N*heads)+padding"])
def test_multihead_attention_masks_as_inputs_on_every_backend(kind):
    # Masks passed as arguments reach each backend as its own arrays (torch: tensors, merged with
    # torch ops; tape: tape tensors), then one merged mask goes to ops.scaled_dot_product_attention.
    r = rng(8)
    q, k = r.standard_normal((2, 4, 8)), r.standard_normal((2, 6, 8))
    pad = np.zeros((2, 6), bool)
    pad[0, 5] = pad[1, 3] = True  # with the causal mask, query 0 still sees key 0: no row is all masked
    causal = kind.endswith("causal")
    if kind.startswith("bool"):
        attn = (r.random((4, 6)) > 0.6) & ~np.eye(4, 6, dtype=bool)  # True = masked, never a whole row
        torch_attn = torch.as_tensor(attn | ~causal_mask(4, 6))
    else:
        attn = r.standard_normal((2 * 2, 4, 6))
        torch_attn = torch.as_tensor(attn)
    ours = cast_floats(MultiheadAttention(8, 2, causal=causal, rng=1), np.float64)
    torch.manual_seed(0)
    theirs = load_into_torch(ours, nn.MultiheadAttention(8, 2, batch_first=True).double())
    tq, tk = to_torch(q, grad=True), to_torch(k, grad=True)
    ty = theirs(tq, tk, tk, attn_mask=torch_attn, key_padding_mask=torch.as_tensor(pad), need_weights=False)[0]
    cot = r.standard_normal(tuple(ty.shape))
    (ty * torch.as_tensor(cot)).sum().backward()

    def f(m, q, k, attn, pad):
        return ops.sum(ops.mul(m(q, k, k, attn_mask=attn, key_padding_mask=pad), cot))

    evs = {b: get_backend(b).evaluate(f, (ours, q, k, attn, pad)) for b in ("tape", "torch")}
    for b, ev in evs.items():
        np.testing.assert_allclose(ev.value, float((ty * torch.as_tensor(cot)).sum().detach()), rtol=1e-10,
                                   err_msg=f"{b}: value")
        for p, tp in theirs.named_parameters():
            np.testing.assert_allclose(ev.grads[f"0.{p}"], tp.grad.numpy(), rtol=1e-8, atol=1e-10, err_msg=f"{b}: {p}")
        for name, path, t in (("query", "1", tq), ("key", "2", tk)):
            np.testing.assert_allclose(ev.grads[path], t.grad.numpy(), rtol=1e-8, atol=1e-10, err_msg=f"{b}: {name}")
    if "3" in evs["torch"].grads:  # a float mask is an input too: its gradient agrees between the backends
        np.testing.assert_allclose(evs["torch"].grads["3"], evs["tape"].grads["3"], rtol=1e-8, atol=1e-10)


def test_multihead_attention_causal_and_weights_match_torch():
    x = rng(3).standard_normal((2, 5, 6))
    mask = torch.as_tensor(~causal_mask(5))
    check_against_torch(
        MultiheadAttention(6, 3, causal=True, rng=2), nn.MultiheadAttention(6, 3, batch_first=True), (x,),
        call=lambda m, x: m(x, need_weights=True)[1],
        torch_call=lambda m, x: m(x, x, x, attn_mask=mask, need_weights=True)[1],
    )


def test_multihead_attention_kdim_vdim_and_seq_first():
    q, k, v = rng(4).standard_normal((3, 2, 6)), rng(5).standard_normal((4, 2, 5)), rng(6).standard_normal((4, 2, 3))
    torch.manual_seed(0)
    check_against_torch(
        MultiheadAttention(6, 2, kdim=5, vdim=3, batch_first=False, rng=3),
        nn.MultiheadAttention(6, 2, kdim=5, vdim=3), (q, k, v),
        call=lambda m, q, k, v: m(q, k, v), torch_call=lambda m, q, k, v: m(q, k, v)[0],
    )


@pytest.mark.parametrize("kind", ["plain", "causal", "bool-mask", "float-mask", "scale"])
def test_scaled_dot_product_attention_matches_torch(kind):
    r = rng(6)
    q, k, v = r.standard_normal((2, 3, 4, 5)), r.standard_normal((2, 3, 6, 5)), r.standard_normal((2, 3, 6, 2))
    kw = {}
    if kind == "causal":
        kw = {"is_causal": True}
    elif kind == "bool-mask":
        kw = {"attn_mask": causal_mask(4, 6)[::-1].copy()}
    elif kind == "float-mask":
        kw = {"attn_mask": r.standard_normal((4, 6))}
    elif kind == "scale":
        kw = {"scale": 0.3}
    tkw = {k_: (torch.as_tensor(v_) if isinstance(v_, np.ndarray) else v_) for k_, v_ in kw.items()}
    check_against_torch(
        Lambda(scaled_dot_product_attention, **kw), None, (q, k, v),
        torch_call=lambda *xs: F.scaled_dot_product_attention(*xs, **tkw),
    )


def test_lstm_and_gru_with_initial_state_match_torch():
    r = rng(7)
    x, h0, c0 = r.standard_normal((2, 4, 3)), r.standard_normal((2, 2, 5)), r.standard_normal((2, 2, 5))
    torch.manual_seed(0)
    check_against_torch(
        LSTM(3, 5, num_layers=2, batch_first=True), nn.LSTM(3, 5, num_layers=2, batch_first=True), (x, h0, c0),
        call=lambda m, x, h, c: m(x, (h, c))[1][1],
    )
    check_against_torch(
        GRU(3, 5, num_layers=2, batch_first=True), nn.GRU(3, 5, num_layers=2, batch_first=True), (x, h0),
        call=lambda m, x, h: m(x, h)[1],
    )


# ------------------------------------------------------------------ functions
LOSS_ROWS = {
    "mse[mean]": (lambda a, b: mse_loss(a, b), lambda a, b: F.mse_loss(a, b), lambda r: (r.standard_normal((3, 4)), r.standard_normal((3, 4)))),
    "mse[sum]": (lambda a, b: mse_loss(a, b, "sum"), lambda a, b: F.mse_loss(a, b, reduction="sum"),
                 lambda r: (r.standard_normal((3, 4)), r.standard_normal((3, 4)))),
    "cross_entropy": (cross_entropy, F.cross_entropy, lambda r: (r.standard_normal((5, 4)), integers(r, (5,), 4))),
    "cross_entropy[NCd,sum]": (lambda a, b: cross_entropy(a, b, reduction="sum"), lambda a, b: F.cross_entropy(a, b, reduction="sum"),
                               lambda r: (r.standard_normal((2, 4, 3)), integers(r, (2, 3), 4))),
    "cross_entropy[ignore,smooth]": (lambda a, b: cross_entropy(a, b, ignore_index=1, label_smoothing=0.1),
                                     lambda a, b: F.cross_entropy(a, b, ignore_index=1, label_smoothing=0.1),
                                     lambda r: (r.standard_normal((6, 3)), np.array([0, 1, 2, 1, 2, 0]))),
    "cross_entropy[weight,none]": (lambda a, b: cross_entropy(a, b, weight=np.array([0.2, 1.0, 3.0]), reduction="none"),
                                   lambda a, b: F.cross_entropy(a, b, weight=torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64), reduction="none"),
                                   lambda r: (r.standard_normal((4, 3)), integers(r, (4,), 3))),
    "cross_entropy[weight,mean]": (lambda a, b: cross_entropy(a, b, weight=np.array([0.2, 1.0, 3.0])),
                                   lambda a, b: F.cross_entropy(a, b, weight=torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64)),
                                   lambda r: (r.standard_normal((4, 3)), integers(r, (4,), 3))),
    "cross_entropy[probs]": (lambda a, b: cross_entropy(a, b, label_smoothing=0.2), lambda a, b: F.cross_entropy(a, b, label_smoothing=0.2),
                             lambda r: (r.standard_normal((4, 3)), r.dirichlet(np.ones(3), size=4))),
    "bce_with_logits": (binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits,
                        lambda r: (r.standard_normal((3, 4)) * 5, r.random((3, 4)))),
    "bce_with_logits[pos_weight,sum]": (
        lambda a, b: binary_cross_entropy_with_logits(a, b, reduction="sum", pos_weight=np.array([1.0, 2.0, 0.5, 3.0])),
        lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction="sum", pos_weight=torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=torch.float64)),
        lambda r: (r.standard_normal((3, 4)), (r.random((3, 4)) > 0.5).astype(float))),
}


@pytest.mark.parametrize("row", list(LOSS_ROWS), ids=list(LOSS_ROWS))
def test_loss_matches_torch(row):
    ours, theirs, inputs = LOSS_ROWS[row]
    check_against_torch(Lambda(ours), None, inputs(rng(2)), torch_call=theirs)


# ------------------------------------------------------------------ no torch counterpart
def test_dropout_mask_from_seed_scaled_and_identity_in_eval():
    layer = Dropout(0.25, rng=3)
    x = rng(1).standard_normal((50, 40))
    y = layer(x)
    keep = np.random.default_rng(layer.seed).random(x.shape) >= 0.25
    np.testing.assert_array_equal(y, x * (keep / 0.75))
    assert 0.2 < 1 - keep.mean() < 0.3
    np.testing.assert_array_equal(layer.eval()(x), x)
    np.testing.assert_array_equal(Dropout(1.0, rng=0)(x), np.zeros_like(x))
    # the same seed gives the same mask on the tape
    (g,) = gradcheck.gradient(lambda x: ops.sum(layer.train()(x)), x)
    np.testing.assert_array_equal(g, keep / 0.75)


def test_combinators():
    r = rng(5)
    a, b = Linear(4, 3, rng=1), Linear(4, 3, rng=2)
    x = r.standard_normal((2, 4))
    np.testing.assert_allclose(Parallel(a, b)(x), a(x) + b(x))
    np.testing.assert_allclose(Parallel(a, b, combine=concat_channels)(x), np.concatenate([a(x), b(x)], 1))
    np.testing.assert_allclose(Parallel(a, b)(x, 2 * x), a(x) + b(2 * x))
    sq = Linear(4, 4, rng=3)
    np.testing.assert_allclose(SkipConnection(sq)(x), sq(x) + x)
    np.testing.assert_allclose(SkipConnection(a, lambda y, x: y * 2)(x), a(x) * 2)
    chain = Chain(Linear(4, 5, rng=1), Tanh(), SkipConnection(Linear(5, 5, rng=2)), Parallel(Linear(5, 2, rng=3), Linear(5, 2, rng=4)))
    assert [p for p, _ in chain.named_parameters()] == [
        "0.weight", "0.bias", "2.layer.weight", "2.layer.bias", "3.0.weight", "3.0.bias", "3.1.weight", "3.1.bias"]
    seq = nn.Sequential(nn.Linear(4, 5), nn.Tanh())
    load_into_torch(Chain(chain[0], chain[1]), seq)
    (g, _) = gradcheck.gradient(lambda m, x: ops.sum(m(x) * np.arange(4.0).reshape(2, 2)), chain, x)
    assert all(np.abs(v).max() > 0 for _, v in g.named_parameters())


def test_every_layer_takes_rng_and_is_deterministic():
    a = Chain(Conv2d(2, 3, 3, rng=5), BatchNorm2d(3, rng=5), Linear(3, 2, rng=np.random.default_rng(1)), Dropout(rng=4))
    b = Chain(Conv2d(2, 3, 3, rng=5), BatchNorm2d(3, rng=5), Linear(3, 2, rng=np.random.default_rng(1)), Dropout(rng=4))
    for (p, u), (_, v) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(u, v, err_msg=p)
    assert a[3].seed == b[3].seed


def test_default_init_scales_follow_torch():
    conv, lin = Conv2d(16, 32, 3, rng=0), Linear(64, 10, rng=0)
    bound = 1 / np.sqrt(16 * 9)  # kaiming_uniform(a=sqrt 5) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert np.abs(conv.weight).max() <= bound and np.abs(conv.weight).max() > 0.9 * bound
    assert np.abs(lin.bias).max() <= 1 / 8
    ct = ConvTranspose2d(8, 4, 3, rng=0)  # fan_in from dim 1: 4 * 9
    assert np.abs(ct.weight).max() <= 1 / 6 and np.abs(ct.weight).max() > 0.9 / 6
    mha = MultiheadAttention(8, 2, rng=0)
    assert np.abs(mha.in_proj_weight).max() <= np.sqrt(6 / (8 + 24)) and not mha.in_proj_bias.any()
    assert not mha.out_proj.bias.any()
    emb = Embedding(1000, 8, rng=0)
    assert abs(emb.weight.std() - 1) < 0.05


def test_error_messages_name_the_problem():
    with pytest.raises(ValueError, match="divisible by groups=3"):
        Conv2d(4, 6, 3, groups=3)
    with pytest.raises(ValueError, match="LayerNorm"):
        LayerNorm(5)(np.zeros((2, 4)))
    with pytest.raises(NotImplementedError, match="dilation"):
        MaxPool2d(2, dilation=2)
    with pytest.raises(ValueError, match="num_heads"):
        MultiheadAttention(6, 4)
    with pytest.raises(ValueError, match="reduction"):
        mse_loss(np.zeros(2), np.zeros(2), reduction="avg")
