"""The PyTorch backend: every op's forward against numpy, every gradient against the tape.

The op samples are the op database's (``tests/op_db.py``): each is one small
function written against ``gradcheck.ops`` (tinygrad test_ops style).
``test_forward`` runs it on numpy and on torch tensors, in float64 (tight) and
float32 (loose); ``test_gradient`` runs the random projection ``<r, f(x)>``
through ``withgradient`` on the torch and tape backends in float64 and
compares value and gradients to ~1e-10.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import zlib

import numpy as np
import pytest
from op_db import C34, IDS7, OPS, RM4, RV4, all_samples

torch = pytest.importorskip("torch")

import gradcheck  # noqa: E402
from gradcheck import ops  # noqa: E402
from gradcheck.backends import get_backend  # noqa: E402
from gradcheck.backends.torch import ops as to  # noqa: E402
from gradcheck.backends.torch.driver import DEVICE_ENV, TorchBackend  # noqa: E402
from gradcheck.layers import BatchNorm2d, Chain, Conv2d, Dense  # noqa: E402
from gradcheck.tree import map_leaves  # noqa: E402

FWD_TOL = {np.float64: (1e-10, 1e-12), np.float32: (1e-5, 1e-5)}  # (rtol, atol)
GRAD_TOL = (1e-10, 1e-12)


# ---------------------------------------------------------------- comparison
def assert_close(actual, expected, rtol, atol, label, names=("torch", "numpy")):
    """Shapes, dtypes and values of two arrays; the message names both sides and the stage."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    a, e = names
    assert actual.shape == expected.shape, (
        f"{label}: shape {a} {actual.shape} != {e} {expected.shape}"
    )
    assert actual.dtype == expected.dtype, (
        f"{label}: dtype {a} {actual.dtype} != {e} {expected.dtype}"
    )
    if actual.dtype.kind not in "fc":
        bad = actual != expected
        assert not bad.any(), f"{label}: {int(bad.sum())} of {bad.size} values differ ({a} vs {e})"
        return
    same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))  # equal infs, both nan
    with np.errstate(invalid="ignore"):
        err = np.abs(actual - expected)
        bad = ~(same | (err <= atol + rtol * np.abs(expected)))
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err, -1)), err.shape) if err.ndim else ()
        raise AssertionError(
            f"{label}: {int(bad.sum())} of {bad.size} values differ beyond rtol={rtol} atol={atol}; "
            f"worst at {tuple(int(k) for k in i)}: {a} {actual[i]!r} vs {e} {expected[i]!r}"
        )


# ---------------------------------------------------------------- the samples
# Every fixed sample of the op database (tests/op_db.py).  A sample's inputs are seeded from its test
# id, so the forward check in float32 and in float64 and the gradient check each draw their own.
SAMPLES = all_samples()


def _seed(test_id: str) -> int:
    return zlib.crc32(test_id.encode())


def _gradient_params(samples):
    """The samples with a gradient, each with the marks torch's known defects and exclusions give it."""
    params = []
    for s in samples:
        if not s.grad:
            continue
        marks = []
        if bug := OPS[s.op].bug("torch"):
            marks.append(pytest.mark.xfail(strict=True, reason=bug))
        if "torch" in s.no_gradient_on:
            marks.append(pytest.mark.skip(reason=f"torch: {s.no_gradient_on['torch']}"))
        params.append(pytest.param(s, id=s.id, marks=marks))
    return params


GRADIENT_PARAMS = _gradient_params(SAMPLES)


def _as_torch(arrays):
    return [torch.from_numpy(a.copy()) for a in arrays]


# ---------------------------------------------------------------- forward
SAME_EVEN = (
    "ignore:Using padding='same' with even kernel"  # torch notes a padded copy; not our concern
)


@pytest.mark.filterwarnings(SAME_EVEN)
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("sample", [pytest.param(s, id=s.id) for s in SAMPLES])
def test_forward(sample, dtype, request):
    xs = sample.arrays(_seed(request.node.callspec.id), dtype)
    expected = sample.fn(*xs)
    actual = sample.fn(*_as_torch(xs))
    assert isinstance(actual, torch.Tensor), f"{sample.op}: torch returned a {type(actual).__name__}"
    if dtype == np.float32 and sample.const64 and np.asarray(expected).dtype == np.float64:
        # numpy promotes a float32 array meeting a float64 constant; torch must not.
        expected = np.asarray(expected).astype(np.float32)
    assert_close(
        to.to_numpy(actual), expected, *FWD_TOL[dtype], f"{sample.op} forward {np.dtype(dtype)}"
    )


# ---------------------------------------------------------------- gradients
def projected(fn, r):
    """The loss <r, fn(...)>: a random cotangent, so no gradient is trivially zero."""
    return lambda *xs: ops.sum(ops.mul(fn(*xs), r))


def compare_gradients(fn, xs, label, backends=("torch", "tape")):
    """withgradient of ``fn`` on two backends; values and every argument's gradient must agree."""
    out = np.asarray(fn(*xs))
    r = np.random.default_rng(zlib.crc32(label.encode())).standard_normal(out.shape)
    results = [gradcheck.withgradient(projected(fn, r), *xs, backend=b) for b in backends]
    (va, ga), (vb, gb) = results
    assert_close(va, vb, *GRAD_TOL, f"{label} loss", names=backends)
    for k, (a, b) in enumerate(zip(ga, gb, strict=True)):
        assert_close(a, b, *GRAD_TOL, f"{label} backward pass tensor {k}", names=backends)


@pytest.mark.filterwarnings(SAME_EVEN)
@pytest.mark.parametrize("sample", GRADIENT_PARAMS)
def test_gradient(sample, request):
    xs = sample.arrays(_seed(request.node.callspec.id))
    compare_gradients(sample.fn, xs, f"{sample.op} ({request.node.callspec.id})")


def test_every_op_has_forward_and_gradient_rows():
    # A new op in gradcheck.ops without a sample in tests/op_db.py would go unchecked on torch.
    covered = {s.op for s in SAMPLES}
    graded = {s.op for s in SAMPLES if s.grad and "torch" not in s.no_gradient_on}
    assert not set(ops.__all__) - covered, (
        f"ops without a sample in tests/op_db.py: {sorted(set(ops.__all__) - covered)}"
    )
    not_differentiable = {name for name, info in OPS.items() if not info.differentiable}
    missing = set(ops.__all__) - graded - not_differentiable
    assert not missing, f"ops without a gradient sample torch can run: {sorted(missing)}"


# Ops that torch deliberately runs as their derived composition in gradcheck.ops, with the reason.
DERIVED_ON_TORCH = {
    "normalize": "statistics over arbitrary axes have no torch kernel; the layers call batch_norm, layer_norm "
                 "and group_norm, which run F.batch_norm, F.layer_norm and F.group_norm",
}


def _trace_dispatch(monkeypatch):
    """Wrap every op of gradcheck.ops; record, per op, whether another op was dispatched inside it.

    A derived body calls the other ops through gradcheck.ops' globals, so a
    nested dispatch is exactly what running the composition looks like;
    torch's own kernels dispatch nothing.
    """
    seen, composed, stack = set(), set(), []

    def traced(name, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if stack:
                composed.add(stack[-1])
            seen.add(name)
            stack.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                stack.pop()

        call.__wrapped__ = getattr(fn, "__wrapped__", fn)  # still the op's own body, as on the op
        return call

    for name in ops.__all__:
        monkeypatch.setattr(ops, name, traced(name, getattr(ops, name)))
    return seen, composed


@pytest.mark.filterwarnings(SAME_EVEN)
def test_every_op_is_implemented_natively(monkeypatch):
    native = set(ops.__all__) - set(DERIVED_ON_TORCH)
    # Defined in torch_ops itself (not imported there from elsewhere, e.g. the derived body).
    missing = sorted(n for n in native if not callable(vars(to).get(n)) or vars(to)[n].__module__ != to.__name__)
    assert not missing, f"torch_ops lacks {missing}"
    assert not set(DERIVED_ON_TORCH) & set(vars(to)), "an op listed in DERIVED_ON_TORCH is defined in torch_ops"
    # ... and it runs torch's kernel: on torch tensors, no op of gradcheck.ops is dispatched inside it.
    # (torch_ops.normalize passed the check above while it ran ops.normalize's composition.)
    seen, composed = _trace_dispatch(monkeypatch)
    for sample in SAMPLES:
        sample.fn(*_as_torch(sample.arrays(_seed(sample.id))))
    assert not native - seen, f"samples never dispatched {sorted(native - seen)}"
    assert not composed & native, f"native on torch, but run as a composition of other ops: {sorted(composed & native)}"
    assert composed >= set(DERIVED_ON_TORCH), "an op listed in DERIVED_ON_TORCH is no longer a composition"


# ---------------------------------------------------------------- edges
# Kinks, ties, infinities and saturation, at chosen points: the conventions
# (gradient at 0, tie splitting, masked branches) are where ADs differ.
Z = np.array([0.0, 1.0, -1.5, 0.0])


_edge_ids: dict[str, int] = {}


def E(op, fn, *inputs, tape_bug=""):
    """One edge row: ``E("relu", lambda x: ops.relu(x), Z)``."""
    n = _edge_ids[op] = _edge_ids.get(op, -1) + 1
    return pytest.param(
        op, fn, [np.asarray(x, dtype=np.float64) for x in inputs], tape_bug, id=f"{op}@{n}"
    )


NEG_INF = -np.inf
# fmt: off
EDGES = [
    E("pow", lambda a, b: ops.pow(a, b), [0.0, 0.0, 2.0, 0.5], [2.0, 0.5, 0.0, 3.0]),
    # d/da a**0 at a=0 is 0 on torch (and now the tape), not 0 * 0**-1 = nan.
    E("pow", lambda a, b: ops.pow(a, b), [0.0, 1.0], [0.0, 0.0]),
    E("pow", lambda a: ops.pow(a, 0), Z),
    # d/db a**b where a < 0 has no real logarithm: NaN on torch (and jax, and the tape); 0 at a == 0.
    E("pow", lambda a, b: ops.pow(a, b), [-2.0, 0.0, 1.5, -0.5], [2.0, 2.0, 2.0, 3.0]),
    E("pow", lambda b: ops.pow(-2.0, b), [2.0, 3.0]),
    E("sqrt", lambda x: ops.sqrt(x), [0.0, 4.0]),
    E("log", lambda x: ops.log(x), [0.0, 2.0]),
    E("div", lambda a, b: ops.div(a, b), [1.0, -1.0, 2.0], [0.0, 0.0, 4.0]),
    E("relu", lambda x: ops.relu(x), Z),
    E("abs", lambda x: ops.abs(x), Z),
    E("leaky_relu", lambda x: ops.leaky_relu(x, 0.1), Z),
    E("elu", lambda x: ops.elu(x, 2.0), [0.0, 800.0, -800.0, -1.0]),
    E("maximum", lambda x: ops.maximum(x, 0.0), Z),
    E("minimum", lambda a, b: ops.minimum(a, b), Z, [0.0, 1.0, -2.0, 1.0]),
    E("max", lambda x: ops.max(x, axis=1), np.ones((2, 3))),
    E("min", lambda x: ops.min(x), [[1.0, -1.0], [-1.0, -1.0]]),
    E("max_pool2d", lambda x: ops.max_pool2d(x, 3, stride=2, padding=1), -np.ones((1, 1, 3, 3))),
    E("max_pool2d", lambda x: ops.max_pool2d(x, 2, stride=1), np.ones((1, 1, 3, 3))),
    E("logsumexp", lambda x: ops.logsumexp(x, axis=1), [[NEG_INF, 0.0], [1000.0, 2.0]]),
    E("softmax", lambda x: ops.softmax(x, axis=1), [[NEG_INF, 0.0], [1000.0, 2.0]]),
    E("log_softmax", lambda x: ops.log_softmax(x), [[1000.0, 0.0], [1.0, 2.0]]),
    E("softplus", lambda x: ops.softplus(x), [25.0, -30.0, 100.0, 800.0]),
    E("sigmoid", lambda x: ops.sigmoid(x), [40.0, -40.0, 800.0, -800.0]),
    E("silu", lambda x: ops.silu(x), [800.0, -800.0, 0.0]),
    E("gelu", lambda x: ops.gelu(x, approximate="tanh"), [800.0, -800.0, 0.0]),
    E("gelu", lambda x: ops.gelu(x), [40.0, -40.0, 0.0]),
    E("where", lambda x: ops.where(ops.greater(x, 0.0), ops.log(x), 0.0), Z),
    E("where", lambda x: ops.where(ops.less(x, 0.0), 0.0, ops.sqrt(x)), Z),
]
# fmt: on


@pytest.mark.parametrize("op, fn, xs, tape_bug", EDGES)
def test_edge_forward(op, fn, xs, tape_bug):
    with np.errstate(all="ignore"):
        expected = fn(*xs)
    assert_close(
        to.to_numpy(fn(*_as_torch(xs))), expected, *FWD_TOL[np.float64], f"{op} edge forward"
    )


@pytest.mark.parametrize("op, fn, xs, tape_bug", EDGES)
def test_edge_gradient(op, fn, xs, tape_bug, request):
    if tape_bug:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"tape: {tape_bug}"))
    with np.errstate(all="ignore"):
        compare_gradients(fn, xs, f"{op} edge ({request.node.callspec.id})")


# ---------------------------------------------------------------- the checks can fail
def test_negative_control_assert_close():
    a = np.linspace(-1, 1, 12).reshape(3, 4)
    assert_close(a, a.copy(), *GRAD_TOL, "identical")
    b = a.copy()
    b[1, 2] *= 1 + 1e-8
    with pytest.raises(AssertionError, match=r"worst at \(1, 2\)"):
        assert_close(b, a, *GRAD_TOL, "perturbed")
    with pytest.raises(AssertionError, match="shape"):
        assert_close(a[:2], a, *GRAD_TOL, "shape")
    with pytest.raises(AssertionError, match="dtype"):
        assert_close(a.astype(np.float32), a, *FWD_TOL[np.float32], "dtype")
    with pytest.raises(AssertionError):
        assert_close(np.where(a > 0, np.nan, a), a, *GRAD_TOL, "nan")


def test_negative_control_gradient(monkeypatch):
    # A torch tanh whose derivative is off by 1e-8 relative must be caught.
    class Tanh(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.tanh(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * (1 - torch.tanh(x) ** 2) * (1 + 1e-8)

    xs = [np.linspace(-1, 1, 6)]
    compare_gradients(lambda x: ops.tanh(x), xs, "tanh control")
    monkeypatch.setattr(to, "tanh", Tanh.apply)
    with pytest.raises(AssertionError, match="backward pass tensor 0"):
        compare_gradients(lambda x: ops.tanh(x), xs, "tanh perturbed")


def test_batch_norm_eval_returns_the_running_statistics_unchanged():
    x = torch.randn((2, 4, 3), dtype=torch.float64)
    rm, rv = torch.as_tensor(RM4), torch.as_tensor(RV4)
    _, m, v = ops.batch_norm(x, rm, rv, training=False)
    assert m is rm and v is rv and torch.equal(rm, torch.as_tensor(RM4))
    # Training: copies are updated (F.batch_norm writes in place) and returned; the inputs stay as they were.
    _, m, v = ops.batch_norm(x, rm, rv, momentum=np.array(0.5))
    assert torch.equal(rm, torch.as_tensor(RM4)) and torch.equal(rv, torch.as_tensor(RV4))
    torch.testing.assert_close(m, 0.5 * rm + 0.5 * x.mean((0, 2)), rtol=1e-12, atol=0)
    torch.testing.assert_close(v, 0.5 * rv + 0.5 * x.var((0, 2)), rtol=1e-12, atol=0)  # unbiased
    assert ops.batch_norm(x)[1:] == (None, None)


def test_embedding_padding_idx_is_f_embedding_when_the_padding_row_is_zero():
    # F.embedding(padding_idx) returns the padding row's values and gives that row no gradient; the op's
    # contract (ops.embedding) is zeros at padding positions.  With the zero row torch keeps there, F.embedding
    # alone gives the op's output and gradients exactly; torch_ops zeroes the positions too, for any row.
    rng = np.random.default_rng(5)
    table = rng.standard_normal((7, 3))
    r = torch.as_tensor(rng.standard_normal(IDS7.shape + (3,)))
    ids = torch.as_tensor(IDS7)
    for pad_row in (np.zeros(3), rng.standard_normal(3)):
        table[6] = pad_row
        grads = []
        for fn in (lambda w: torch.nn.functional.embedding(ids, w, padding_idx=6), lambda w: ops.embedding(ids, w, 6),
                   lambda w: ops.embedding.__wrapped__(ids, w, 6)):
            w = torch.tensor(table, requires_grad=True)
            out = fn(w)
            (out * r).sum().backward()
            grads.append((out.detach(), w.grad))
        (f_out, f_grad), (op_out, op_grad), (derived_out, derived_grad) = grads
        assert torch.equal(op_out, derived_out) and torch.equal(op_grad, derived_grad)
        assert torch.equal(f_grad, derived_grad), "F.embedding gives the padding row no gradient"
        assert not op_grad[6].any()
        assert torch.equal(f_out, derived_out) == (not pad_row.any()), "F.embedding returns the padding row itself"


class _Functional:
    """torch.nn.functional with some functions replaced: what torch_ops sees as ``F``."""

    def __init__(self, **replaced):
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)


class _BatchNormNoMeanTerm(torch.autograd.Function):
    """F.batch_norm (training) whose input gradient lacks its mean term: ``rstd * (g' - xhat * mean(g' xhat))``."""

    calls = 0

    @staticmethod
    def forward(ctx, x, running_mean, running_var, weight, bias, training=False, momentum=0.1, eps=1e-5):
        _BatchNormNoMeanTerm.calls += 1
        assert training, "the control covers training mode"
        y = torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, True, momentum, eps)
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        axes = (0,) + tuple(range(2, x.ndim))
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean = x.mean(axes, keepdim=True)
        rstd = torch.rsqrt(x.var(axes, keepdim=True, unbiased=False) + ctx.eps)
        xhat = (x - mean) * rstd
        gw = g * weight.reshape(shape)
        gx = rstd * (gw - xhat * (gw * xhat).mean(axes, keepdim=True))  # the mean(gw) term left out
        return gx, None, None, (g * xhat).sum(axes), g.sum(axes), None, None, None


class _LinearBiasOff(torch.autograd.Function):
    """F.linear whose bias gradient is off by a factor 1 + 1e-6."""

    calls = 0

    @staticmethod
    def forward(ctx, x, weight, bias=None):
        _LinearBiasOff.calls += 1
        ctx.save_for_backward(x, weight)
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        return g @ weight, g2.T @ x2, g2.sum(0) * (1 + 1e-6)


@pytest.mark.parametrize("fn, xs, wrong, kernel, bad_tensor", [
    (lambda x, w, b: ops.batch_norm(x, RM4, RV4, w, b)[0], [(3, 4, 5, 2), (4,), (4,)], _BatchNormNoMeanTerm,
     "batch_norm", 0),
    (lambda x, w, b: ops.linear(x, w, b), [(2, 3, 5), (4, 5), (4,)], _LinearBiasOff, "linear", 2),
], ids=["batch_norm", "linear"])
def test_negative_control_framework_kernel(fn, xs, wrong, kernel, bad_tensor, monkeypatch):
    # torch_ops runs torch's own kernel, so a wrong backward in it shows in the float64 sample check.
    xs = [np.random.default_rng(3).uniform(0.5, 2.0, size=s) for s in xs]
    compare_gradients(fn, xs, f"{kernel} control")
    monkeypatch.setattr(to, "F", _Functional(**{kernel: wrong.apply}))
    wrong.calls = 0
    with pytest.raises(AssertionError, match=f"backward pass tensor {bad_tensor}"):
        compare_gradients(fn, xs, f"{kernel} with a wrong backward")
    assert wrong.calls, f"torch_ops.{kernel} did not call F.{kernel}"


# ---------------------------------------------------------------- structure and buffers
def _float64(model):
    return map_leaves(
        model, lambda path, v, kind: v.astype(np.float64) if v.dtype.kind == "f" else v
    )


def test_structural_gradients_and_batchnorm_buffers():
    rng = np.random.default_rng(0)
    model = Chain(
        Conv2d(2, 3, 3, padding=1, rng=rng),
        BatchNorm2d(3),
        ops.relu,
        lambda x: ops.flatten(x),
        Dense(3 * 4 * 4, 5, rng=rng),
    ).train()
    model = _float64(model).freeze("4.bias")
    unused = _float64(Dense(3, 2, rng=rng))
    x = rng.standard_normal((2, 2, 4, 4))
    ids = np.array([1, 0, 2])
    r = rng.standard_normal((2, 5))

    def f(m, x, extra, ids):
        return ops.sum(ops.mul(m(x), r))

    args = (model, x, unused, ids)
    evals = {b: get_backend(b).evaluate(f, args) for b in ("torch", "tape")}
    t, p = evals["torch"], evals["tape"]
    assert (
        sorted(t.grads)
        == sorted(p.grads)
        == [
            "0.0.bias",
            "0.0.weight",
            "0.1.bias",
            "0.1.weight",
            "0.4.weight",
            "1",
            "2.bias",
            "2.weight",
        ]
    )
    for path in p.grads:
        assert_close(
            t.grads[path], p.grads[path], *GRAD_TOL, f"gradient of {path}", names=("torch", "tape")
        )
    assert sorted(t.buffers) == ["0.1.num_batches_tracked", "0.1.running_mean", "0.1.running_var"]
    for path in p.buffers:
        assert_close(
            t.buffers[path], p.buffers[path], *GRAD_TOL, f"buffer {path}", names=("torch", "tape")
        )
    assert t.buffers["0.1.num_batches_tracked"] == 1
    assert not np.allclose(t.buffers["0.1.running_mean"], 0), (
        "train mode must move the running mean"
    )

    value, (gm, gx, gu, gi) = gradcheck.withgradient(f, *args, backend="torch")
    assert np.ndim(value) == 0
    assert gm[0].weight.shape == (3, 2, 3, 3) and gm[0].stride is None and gm[0].padding is None
    assert (
        gm[1].running_mean is None
        and gm[1].running_var is None
        and gm[1].num_batches_tracked is None
    )
    assert gm[1].eps is None and gm[2] is None and gm[3] is None
    assert gm[4].bias is None, "a frozen param gets None"
    assert gx.shape == x.shape and gi is None
    assert gu.weight.shape == (2, 3) and not gu.weight.any() and not gu.bias.any(), (
        "an unused param gets zeros"
    )
    assert model[1].running_mean.dtype == np.float64 and not model[1].running_mean.any(), (
        "inputs are not modified"
    )


def test_float32_in_float32_out():
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    value, (g,) = gradcheck.withgradient(
        lambda x: ops.sum(ops.mul(ops.tanh(x), C34[:2, :3])), x, backend="torch"
    )
    assert value.dtype == np.float32 and g.dtype == np.float32


# ---------------------------------------------------------------- constants and dtypes
def test_float64_constants_do_not_upcast_float32():
    x = torch.ones(2, 3, dtype=torch.float32)
    c = np.full((2, 3), 0.5)  # float64
    for name, out in {
        "add": ops.add(x, c),
        "sub scalar first": ops.sub(np.float64(1.0), x),
        "mul": ops.mul(c, x),
        "maximum": ops.maximum(x, c),
        "where": ops.where(c > 0, c, x),
        "matmul": ops.matmul(x, c.T),
        "einsum": ops.einsum("ij,kj->ik", x, c),
        "concatenate": ops.concatenate([x, c]),
        "conv": ops.conv(x.reshape(1, 1, 2, 3), np.ones((1, 1, 1, 2)), bias=np.zeros(1)),
        "asarray": ops.asarray(c, like=x),
    }.items():
        assert out.dtype == torch.float32, (
            f"{name}: a float64 numpy constant made the result {out.dtype}"
        )
    assert ops.asarray(np.arange(3), like=x).dtype == torch.int64, "an int constant keeps its dtype"
    assert ops.asarray(c, like=x, dtype="float64").dtype == torch.float64, "an explicit dtype wins"
    assert ops.astype(x, np.float16).dtype == torch.float16
    assert ops.greater(x, c).dtype == torch.bool


def test_dtype_and_shape_helpers():
    x = torch.zeros(2, 3, dtype=torch.float32)
    assert ops.dtype_of(x) == np.float32 and ops.shape_of(x) == (2, 3)
    assert ops.dtype_of(ops.less(x, 1.0)) == np.bool_
    assert isinstance(ops.to_numpy(x), np.ndarray)


# Argument rules shared by every backend are tested once, on all of them (tests/test_errors.py); these are
# what torch alone cannot do or needs.
@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda x: ops.mean(x.long()), TypeError, "not a float"),
        (lambda x: ops.astype(x, object), TypeError, "no torch equivalent"),
        (lambda x: ops.batch_norm(x, x[0].detach().requires_grad_(), np.ones(3)), ValueError,
         "no gradient for running_mean"),
        (lambda x: ops.scaled_dot_product_attention(x, x, x, dropout_mask=np.array([[0.0, 2.0], [1.5, 2.0]])),
         ValueError, "one keep factor"),
        (lambda x: ops.binary_cross_entropy_with_logits(x, np.zeros((2, 3)), weight=x.detach().requires_grad_()),
         ValueError, "no gradient for weight"),
    ],
)
def test_precise_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(torch.zeros(2, 3, dtype=torch.float64))


# ---------------------------------------------------------------- the driver
def test_non_scalar_loss_names_its_shape():
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        gradcheck.withgradient(lambda x: ops.mul(x, 2.0), np.ones((2, 3)), backend="torch")
    with pytest.raises(TypeError, match="not a torch tensor"):
        gradcheck.withgradient(lambda x: 1.0, np.ones(2), backend="torch")


def test_tuple_output_and_unused_arguments():
    x, y = np.arange(3.0), np.arange(2.0)
    value, (gx, gy) = gradcheck.withgradient(
        lambda x, y: (ops.sum(ops.mul(x, x)), ops.mul(x, 3.0)), x, y, backend="torch"
    )
    assert isinstance(value, tuple) and isinstance(value[1], np.ndarray)
    assert_close(value[1], 3 * x, *GRAD_TOL, "aux output")
    assert_close(gx, 2 * x, *GRAD_TOL, "gradient of x")
    assert_close(gy, np.zeros(2), *GRAD_TOL, "unused y")
    # A loss that uses no trainable input at all still gives zeros, not an autograd error.
    _, (gx,) = gradcheck.withgradient(lambda x: ops.sum(ops.stop_gradient(x)), x, backend="torch")
    assert_close(gx, np.zeros(3), *GRAD_TOL, "detached loss")


def test_gradients_of_gradients():
    # The driver called inside an outer torch gradient stays differentiable.
    inner = get_backend("torch")
    x = torch.tensor([0.3, -0.7], dtype=torch.float64, requires_grad=True)
    ev = inner.evaluate(lambda x: ops.sum(ops.mul(ops.sin(x), x)), (x,))
    (g,) = ev.grads.values()
    (h,) = torch.autograd.grad(g.sum(), x)
    expected = 2 * np.cos(x.detach().numpy()) - x.detach().numpy() * np.sin(x.detach().numpy())
    assert_close(h.numpy(), expected, *GRAD_TOL, "second derivative")


def test_driver_settings(monkeypatch):
    backend = TorchBackend()
    assert backend.name == "torch" and backend.module == "torch" and backend.device == "cpu"
    assert (
        "pip install torch==2.13.0" in backend.install_hint
        and "gradcheck[torch]" in backend.install_hint
    )
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    assert TorchBackend().device == "cuda"
    assert TorchBackend("cpu").device == "cpu"
    backend.evaluate(lambda x: ops.sum(x), (np.ones(2),))
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


def test_leaves_are_copies():
    x = np.ones(3)
    gradcheck.withgradient(lambda x: ops.sum(x), x, backend="torch")
    seen = []
    get_backend("torch").evaluate(lambda x: (seen.append(x), ops.sum(x))[1], (x,))
    assert seen[0].dtype == torch.float64 and seen[0].requires_grad
    assert not np.shares_memory(seen[0].detach().numpy(), x)


def test_import_gradcheck_does_not_import_torch():
    code = (
        "import sys, gradcheck, gradcheck.ops, gradcheck.layers; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("sample", GRADIENT_PARAMS)
def test_gradient_on_cuda(sample, request, monkeypatch):
    # The same samples, torch on the GPU, against the tape on the CPU.
    monkeypatch.setattr(get_backend("torch"), "device", "cuda")
    xs = sample.arrays(_seed(request.node.callspec.id))
    compare_gradients(sample.fn, xs, f"{sample.op} on cuda")
