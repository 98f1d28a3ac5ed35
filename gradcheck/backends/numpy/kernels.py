"""Fast numpy kernels for convolution, pooling and normalisation.

Everything is 2-d on NCHW (1-d convolutions add a unit height).  There are no
Python loops over pixels: windows are strided views of the padded input, a
convolution is one BLAS matmul per group over the whole batch (im2col), and
pooling and the scatter back to the input (a strided convolution's input
gradient, hence transposed convolution, and the pooling gradients) loop over
the kernel's taps only (9 for a 3x3 kernel).  At stride 1 a convolution's
input gradient is itself a convolution.

Copies are laid out so that numpy's innermost loop runs along an output row:
the column matrix is (C*kh*kw, N*oh*ow), not (N*oh*ow, C*kh*kw), whose inner
loop would be a kernel row of 3 elements.  On ResNet-18 that halved the time
spent outside BLAS.

The three convolution kernels are closed under differentiation, which is what
gives the tape second derivatives through convolutions:

* ``conv2d(x, w, g)``               y = conv(x, w)
* ``conv2d_input_grad(gy, w, g)``  adjoint of conv in x   (transposed convolution)
* ``conv2d_weight_grad(x, gy, g)`` adjoint of conv in w

where ``g`` is the ``ConvGeometry`` of the forward convolution, shared by all three.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided


def pair(v, n: int = 2, name: str = "value") -> tuple[int, ...]:
    if isinstance(v, (int, np.integer)):
        return (int(v),) * n
    v = tuple(int(i) for i in v)
    if len(v) != n:
        raise ValueError(f"{name}={v!r}: expected an int or {n} ints, one per spatial dim")
    return v


@dataclass(frozen=True)
class ConvGeometry:
    """Shapes and strides of one 2-d convolution, computed once and shared by its kernels."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    stride: tuple[int, int]
    pads: tuple[tuple[int, int], tuple[int, int]]
    dilation: tuple[int, int]
    groups: int

    @property
    def oh(self) -> int:
        return (self.h + sum(self.pads[0]) - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1

    @property
    def ow(self) -> int:
        return (self.w + sum(self.pads[1]) - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1

    @property
    def padded(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h + sum(self.pads[0]), self.w + sum(self.pads[1]))


def resolve_padding(padding, kernel, dilation, stride, n: int = 2):
    """torch's padding forms (int, tuple, "same", "valid") as ((before, after), ...)."""
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * n
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"padding='same' needs stride 1, got stride={stride}")
            out = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                # torch puts the odd pixel on the right/bottom.
                out.append((total // 2, total - total // 2))
            return tuple(out)
        raise ValueError(f"padding={padding!r}: expected an int, a tuple, 'same' or 'valid'")
    return tuple((p, p) for p in pair(padding, n, "padding"))


def geometry(x_shape, w_shape, stride, padding, dilation, groups) -> ConvGeometry:
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    if c != cg * groups:
        raise ValueError(
            f"conv: input has {c} channels but weight {tuple(w_shape)} with groups={groups} "
            f"expects {cg * groups}; weight must be (out, in/groups, kh, kw)"
        )
    if o % groups:
        raise ValueError(f"conv: {o} output channels are not divisible by groups={groups}")
    stride, dilation = pair(stride, 2, "stride"), pair(dilation, 2, "dilation")
    if min(stride) < 1 or min(dilation) < 1:
        raise ValueError(f"conv: stride {stride} and dilation {dilation} must be positive ints")
    pads = resolve_padding(padding, (kh, kw), dilation, stride)
    if min(p for pair_ in pads for p in pair_) < 0:
        raise ValueError(f"conv: padding {padding!r} must not be negative")
    g = ConvGeometry(n, c, h, w, o, kh, kw, stride, pads, dilation, groups)
    if g.oh < 1 or g.ow < 1:
        raise ValueError(
            f"conv: input {tuple(x_shape)} is smaller than the dilated kernel {(kh, kw)} "
            f"(dilation {dilation}, padding {pads}); the output would be empty"
        )
    return g


def _windows(xp: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """Strided view (N, C, kh, kw, oh, ow) of the padded input; no copy.

    Output pixels are the two innermost axes, so copying the view (im2col)
    runs numpy's inner loop along an output row (tens of pixels) rather than
    along a kernel row of 3, which is what makes the copy cheap.
    """
    s0, s1, s2, s3 = xp.strides
    (sh, sw), (dh, dw) = g.stride, g.dilation
    return as_strided(
        xp,
        shape=(xp.shape[0], xp.shape[1], g.kh, g.kw, g.oh, g.ow),
        strides=(s0, s1, s2 * dh, s3 * dw, s2 * sh, s3 * sw),
        writeable=False,
    )


def _pad(x: np.ndarray, g: ConvGeometry, value=0.0) -> np.ndarray:
    if g.pads == ((0, 0), (0, 0)):
        return x
    (pt, pb), (pl, pr) = g.pads
    # A negative trailing pad (a transposed convolution's output_padding beyond
    # its padding) crops rows that no window reaches.
    x = x[:, :, : x.shape[2] + min(pb, 0), : x.shape[3] + min(pr, 0)]
    n, c, h, w = x.shape
    # One fill and one copy; np.pad's generic path costs several passes.
    xp = np.empty((n, c, h + pt + max(pb, 0), w + pl + max(pr, 0)), dtype=x.dtype)
    xp.fill(value)
    xp[:, :, pt : pt + h, pl : pl + w] = x
    return xp


def _pointwise(g: ConvGeometry) -> bool:
    """A 1x1 kernel, stride 1, no padding: the input already is its own column matrix."""
    return (g.kh, g.kw, g.stride, g.pads) == (1, 1, (1, 1), ((0, 0), (0, 0)))


# The column matrix of a convolution is (G, C/G*kh*kw, N*oh*ow): the whole
# batch in one matrix, so that each convolution and each of its gradients is a
# single BLAS call per group (per-sample calls were slower, and the weight
# gradient then needed a sum over samples of weight-sized partial products).
def _columns(x: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """im2col: (G, C/G*kh*kw, N*oh*ow), one contiguous copy of the windows."""
    k = g.c // g.groups * g.kh * g.kw
    if _pointwise(g):
        win = x.reshape(g.n, g.c, 1, 1, g.oh, g.ow)
    else:
        win = _windows(_pad(x, g), g)
    # (N, C, kh, kw, oh, ow) -> (C, kh, kw, N, oh, ow): the copy's inner loop stays along output rows.
    return np.ascontiguousarray(win.transpose(1, 2, 3, 0, 4, 5)).reshape(g.groups, k, g.n * g.oh * g.ow)


def _weight_matrix(w: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """(O, C/G, kh, kw) -> (G, O/G, C/G*kh*kw), a view."""
    return w.reshape(g.groups, g.o // g.groups, -1)


def _out_matrix(y: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """(N, O, oh, ow) -> (G, O/G, N*oh*ow); a view for a single sample."""
    y = y.reshape(g.n, g.groups, g.o // g.groups, g.oh * g.ow).transpose(1, 2, 0, 3)
    return np.ascontiguousarray(y).reshape(g.groups, g.o // g.groups, g.n * g.oh * g.ow)


def _from_out_matrix(m: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """(G, O/G, N*oh*ow) -> (N, O, oh, ow), contiguous; no copy for a single sample."""
    m = m.reshape(g.groups, g.o // g.groups, g.n, g.oh, g.ow).transpose(2, 0, 1, 3, 4)
    return np.ascontiguousarray(m).reshape(g.n, g.o, g.oh, g.ow)


def conv2d(x: np.ndarray, w: np.ndarray, g: ConvGeometry) -> np.ndarray:
    return _from_out_matrix(np.matmul(_weight_matrix(w, g), _columns(x, g)), g)


def conv2d_weight_grad(x: np.ndarray, gy: np.ndarray, g: ConvGeometry) -> np.ndarray:
    dw = np.matmul(_out_matrix(gy, g), _columns(x, g).transpose(0, 2, 1))  # (G, O/G, K)
    return dw.reshape(g.o, g.c // g.groups, g.kh, g.kw)


def _tap_slices(g: ConvGeometry):
    """Per kernel tap (row-major): ``(phase, index)`` of the outputs' inputs in the padded input.

    A strided window reads rows ``i*dh, i*dh + sh, ...``: every ``sh``-th row
    from an offset.  Split the padded input into its ``sh x sw`` phases
    (rows ``a::sh``, columns ``b::sw``) and each tap reads a contiguous block
    of one phase, so numpy's inner loops run at unit stride.  For stride 1
    there is one phase, the padded input itself.
    """
    (sh, sw), (dh, dw) = g.stride, g.dilation
    for i in range(g.kh):
        for j in range(g.kw):
            r, c = i * dh, j * dw
            index = (slice(None), slice(None), slice(r // sh, r // sh + g.oh), slice(c // sw, c // sw + g.ow))
            yield (r % sh, c % sw), index


def _phases(xp: np.ndarray, g: ConvGeometry) -> dict:
    """The phases of the padded input that some tap reads, as contiguous arrays (no copy for stride 1)."""
    (sh, sw) = g.stride
    if (sh, sw) == (1, 1):
        return {(0, 0): xp}
    return {(a, b): np.ascontiguousarray(xp[:, :, a::sh, b::sw]) for (a, b), _ in _tap_slices(g)}


def _scatter_taps(contributions, g: ConvGeometry, dtype) -> np.ndarray:
    """Sum per-tap contributions, each (N, C, oh, ow) in tap order, onto the unpadded input.

    One add per kernel tap (9 for a 3x3 kernel) into a phase of the padded
    input (see ``_tap_slices``), each over whole output rows: no Python loop
    over pixels, no strided inner loops.
    """
    (sh, sw) = g.stride
    n, c, hp, wp = g.padded
    phases = {}
    for (phase, index), contribution in zip(_tap_slices(g), contributions):
        if phase not in phases:
            a, b = phase
            phases[phase] = np.zeros((n, c, -(-(hp - a) // sh), -(-(wp - b) // sw)), dtype=dtype)
        phases[phase][index] += contribution
    if (sh, sw) == (1, 1):
        xp = phases[(0, 0)]
    else:
        # Phases no tap reads (a 1x1 kernel with stride 2) get no gradient.
        xp = (np.empty if len(phases) == sh * sw else np.zeros)(g.padded, dtype=dtype)
        for (a, b), values in phases.items():
            xp[:, :, a::sh, b::sw] = values
    (pt, pb), (pl, pr) = g.pads
    out = xp[:, :, pt : xp.shape[2] - max(pb, 0), pl : xp.shape[3] - max(pr, 0)]
    if pb < 0 or pr < 0:  # rows no window reaches (see _pad) get nothing
        out = np.pad(out, ((0, 0), (0, 0), (0, -min(pb, 0)), (0, -min(pr, 0))))
    return np.ascontiguousarray(out)


def _col2im(cols: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """Adjoint of im2col: window contributions (C, kh, kw, N, oh, ow) summed onto the (N, C, H, W) input."""
    if _pointwise(g):
        return np.ascontiguousarray(cols.reshape(g.c, g.n, g.h, g.w).transpose(1, 0, 2, 3))
    taps = (cols[:, i, j].transpose(1, 0, 2, 3) for i in range(g.kh) for j in range(g.kw))
    return _scatter_taps(taps, g, cols.dtype)


def _adjoint_geometry(g: ConvGeometry) -> ConvGeometry | None:
    """For a stride-1 convolution, the geometry of the convolution that is its input gradient.

    With stride 1, the adjoint of a convolution is a convolution of the
    output gradient with the flipped, transposed kernel, padded by the
    dilated kernel's extent minus the original padding.  None where that
    padding would be negative (padding wider than the dilated kernel's
    extent), or with stride: then the gradient scatters instead.  None too
    for a pointwise kernel, whose col2im is a reshape.
    """
    if g.stride != (1, 1) or _pointwise(g):
        return None
    (dh, dw), ((pt, pb), (pl, pr)) = g.dilation, g.pads
    eh, ew = dh * (g.kh - 1), dw * (g.kw - 1)
    pads = ((eh - pt, eh - pb), (ew - pl, ew - pr))
    if min(p for pair_ in pads for p in pair_) < 0:
        return None
    return ConvGeometry(g.n, g.o, g.oh, g.ow, g.c, g.kh, g.kw, (1, 1), pads, g.dilation, g.groups)


def conv2d_input_grad(gy: np.ndarray, w: np.ndarray, g: ConvGeometry) -> np.ndarray:
    adjoint = _adjoint_geometry(g)
    if adjoint is not None:
        # A copy (im2col of gy) and a matmul, instead of a matmul and kh*kw
        # read-modify-write passes over the input (col2im): half the memory traffic.
        og, cg = g.o // g.groups, g.c // g.groups
        wt = w[:, :, ::-1, ::-1].reshape(g.groups, og, cg, g.kh, g.kw).transpose(0, 2, 1, 3, 4)
        return conv2d(gy, wt.reshape(g.c, og, g.kh, g.kw), adjoint)
    # (G, K, O/G) @ (G, O/G, N*P) -> (G, K, N*P), which is (C, kh, kw, N, oh, ow).
    cols = np.matmul(_weight_matrix(w, g).transpose(0, 2, 1), _out_matrix(gy, g))
    return _col2im(cols.reshape(g.c, g.kh, g.kw, g.n, g.oh, g.ow), g)


# ---------------------------------------------------------------- pooling
# A pool's windows are a depthwise convolution's: its geometry, validated, is
# gradcheck.ops.rules.pool_geometry (the one place the backends take it from).


def _taps(x: np.ndarray, g: ConvGeometry, value) -> list[np.ndarray]:
    """The kh*kw views (N, C, oh, ow) of the padded input, one per kernel tap (see ``_tap_slices``)."""
    phases = _phases(_pad(x, g, value), g)
    return [phases[phase][index] for phase, index in _tap_slices(g)]


def max_pool2d(x: np.ndarray, g: ConvGeometry) -> np.ndarray:
    # A running maximum over the taps: kh*kw passes over the output, each
    # along whole rows (NaN propagates, as in np.max and torch).
    taps = _taps(x, g, -np.inf)
    out = taps[0].copy()
    for t in taps[1:]:
        np.maximum(out, t, out=out)
    return out


def max_pool2d_grad(x: np.ndarray, gy: np.ndarray, g: ConvGeometry, out: np.ndarray | None = None) -> np.ndarray:
    """The gradient goes to the first maximum of each window (torch's convention).

    ``out`` is the forward result, when the caller has it (saves recomputing
    it).  Taps are visited in row-major order; each takes the gradient of the
    outputs whose maximum it holds and that no earlier tap has taken.
    """
    if out is None:
        out = max_pool2d(x, g)
    taps = _taps(x, g, -np.inf)
    free = np.ones(out.shape, dtype=bool)  # outputs whose maximum no tap has claimed yet
    zero = np.zeros((), dtype=gy.dtype)
    nan_out = np.isnan(out)
    nan = bool(nan_out.any())

    def contributions():
        for t in taps:
            hit = t == out
            if nan:  # a NaN is the maximum, as np.argmax has it (the first NaN wins)
                hit |= np.isnan(t) & nan_out
            hit &= free
            np.logical_and(free, ~hit, out=free)
            # where, not a product: a non-finite gy must not leak onto other taps as 0 * inf.
            yield np.where(hit, gy, zero)

    return _scatter_taps(contributions(), g, gy.dtype)


def avg_pool_correction(g: ConvGeometry) -> np.ndarray:
    """Factor (oh, ow) turning a kernel-area mean into a mean over real, unpadded pixels."""
    ones = np.ones((1, 1, g.h, g.w))
    g1 = geometry((1, 1, g.h, g.w), (1, 1, g.kh, g.kw), g.stride, tuple(p for p, _ in g.pads), g.dilation, 1)
    counts = conv2d(ones, np.ones((1, 1, g.kh, g.kw)), g1)[0, 0]
    return (g.kh * g.kw) / counts


# ---------------------------------------------------------------- normalisation
def _count(shape, axes) -> float:
    return float(np.prod([shape[a] for a in axes]))


def broadcasts_into(small, big) -> bool:
    """Whether an array of shape ``small`` broadcast against shape ``big`` leaves ``big`` unchanged.

    A weight that broadcasts into the statistics' shape (BatchNorm's, per
    channel) is folded into the per-statistic scale.
    """
    try:
        return np.broadcast_shapes(tuple(small), tuple(big)) == tuple(big)
    except ValueError:
        return False


def normalize_stats(x, axes, eps):
    """``(mean, var, centred, rstd)`` of ``x`` over ``axes`` (biased variance, reduced axes kept).

    The arithmetic and its order are those of ``ops.normalize``'s derived
    body (sums divided by the count), so the fused tape node and the numpy
    forward give what the composition gives.
    """
    n = _count(x.shape, axes)
    mean = np.sum(x, axis=axes, keepdims=True) / n
    centred = x - mean
    var = np.sum(centred * centred, axis=axes, keepdims=True) / n
    return mean, var, centred, 1.0 / np.sqrt(var + eps)


def normalize_apply(centred, rstd, weight, bias):
    """``centred * rstd * weight + bias``, the weight folded into the scale when it has the statistics' shape."""
    fold = weight is not None and broadcasts_into(weight.shape, rstd.shape)
    y = centred * (rstd * weight if fold else rstd)
    if weight is not None and not fold:
        y = y * weight
    return y + bias if bias is not None else y


def normalize_grads(argnums, g, weight, bias, axes, centred, rstd) -> list:
    """Gradients of ``normalize`` for ``argnums`` (0: x, 1: weight, 2: bias), sharing the reductions.

    With ``n`` the count, ``scale = rstd`` and ``gx = g * weight`` (the
    gradient at the normalised input), or, when the weight is folded into the
    per-statistic scale, ``scale = rstd * weight`` and ``gx = g``:
    ``dx = scale * (gx - sum(gx)/n - centred * rstd^2 * sum(gx*centred)/n)``:
    two reductions and a few full-size passes, where the composition's
    backward pass makes about twice as many.
    """
    n = _count(g.shape, axes)
    fold = weight is not None and broadcasts_into(weight.shape, rstd.shape)
    gx = g if weight is None or fold else g * weight
    sum_gx = np.sum(gx, axis=axes, keepdims=True)
    sum_gxc = np.sum(gx * centred, axis=axes, keepdims=True)
    grads = []
    for i in argnums:
        if i == 0:
            scale = rstd * weight if fold else rstd
            dx = centred * (-(scale * rstd * rstd) * (sum_gxc / n))
            dx += gx * scale
            dx -= scale * (sum_gx / n)
            grads.append(dx)
        elif i == 1:
            # sum(g * xhat): with a folded weight gx is g, and the sum is already there.
            g_xhat = sum_gxc * rstd if fold else g * centred * rstd
            grads.append(_sum_to(g_xhat, weight.shape))
        else:
            grads.append(_sum_to(sum_gx if gx is g and broadcasts_into(bias.shape, rstd.shape) else g, bias.shape))
    return grads


def summed_axes(shape, target) -> tuple[int, ...]:
    """The axes of an array of ``shape`` to sum over (kept) to undo broadcasting ``target`` to it.

    The leading axes broadcasting added and the size-1 axes it stretched: a
    gradient reaching a broadcast operand is summed there, then reshaped.
    """
    lead = len(shape) - len(target)
    return tuple(range(lead)) + tuple(i + lead for i, s in enumerate(target) if s == 1 and shape[i + lead] != 1)


def _sum_to(a, shape) -> np.ndarray:
    """Sum ``a`` over the axes that broadcasting ``shape`` against it stretched or added."""
    axes = summed_axes(a.shape, shape)
    return np.sum(a, axis=axes, keepdims=True).reshape(shape) if axes else a.reshape(shape)

