"""Fast numpy kernels for convolution and pooling.

Everything is 2-d on NCHW (1-d convolutions add a unit height).  There are no
Python loops over pixels: windows are strided views of the padded input, a
convolution is one batched BLAS matmul over groups (im2col), and the scatter
back to the input (transposed convolution, pooling gradients) loops over the
kernel's taps only (9 for a 3x3 kernel).

The three convolution kernels are closed under differentiation, which is what
gives the tape second derivatives through convolutions:

* ``conv2d(x, w)``                 y = conv(x, w)
* ``conv2d_input_grad(g, w, xs)``  adjoint of conv in x   (transposed convolution)
* ``conv2d_weight_grad(x, g, ws)`` adjoint of conv in w
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
    """Strided view (N, C, oh, ow, kh, kw) of the padded input; no copy."""
    s0, s1, s2, s3 = xp.strides
    (sh, sw), (dh, dw) = g.stride, g.dilation
    return as_strided(
        xp,
        shape=(xp.shape[0], xp.shape[1], g.oh, g.ow, g.kh, g.kw),
        strides=(s0, s1, s2 * sh, s3 * sw, s2 * dh, s3 * dw),
        writeable=False,
    )


def _pad(x: np.ndarray, g: ConvGeometry, value=0.0) -> np.ndarray:
    if g.pads == ((0, 0), (0, 0)):
        return x
    (pt, pb), (pl, pr) = g.pads
    # A negative trailing pad (a transposed convolution's output_padding beyond
    # its padding) crops rows that no window reaches.
    x = x[:, :, : x.shape[2] + min(pb, 0), : x.shape[3] + min(pr, 0)]
    pads = ((0, 0), (0, 0), (pt, max(pb, 0)), (pl, max(pr, 0)))
    return np.pad(x, pads, constant_values=value)


def _columns(x: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """im2col: (G, N*oh*ow, C/G*kh*kw), the one copy a convolution makes."""
    win = _windows(_pad(x, g), g)
    cg = g.c // g.groups
    win = win.reshape(g.n, g.groups, cg, g.oh, g.ow, g.kh, g.kw)
    return win.transpose(1, 0, 3, 4, 2, 5, 6).reshape(g.groups, g.n * g.oh * g.ow, cg * g.kh * g.kw)


def _out_matrix(y: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """(N, O, oh, ow) -> (G, N*oh*ow, O/G)."""
    og = g.o // g.groups
    return y.reshape(g.n, g.groups, og, g.oh, g.ow).transpose(1, 0, 3, 4, 2).reshape(
        g.groups, g.n * g.oh * g.ow, og
    )


def conv2d(x: np.ndarray, w: np.ndarray, g: ConvGeometry) -> np.ndarray:
    cols = _columns(x, g)
    wm = w.reshape(g.groups, g.o // g.groups, -1).transpose(0, 2, 1)
    out = np.matmul(cols, wm)  # (G, N*oh*ow, O/G)
    out = out.reshape(g.groups, g.n, g.oh, g.ow, g.o // g.groups).transpose(1, 0, 4, 2, 3)
    return np.ascontiguousarray(out).reshape(g.n, g.o, g.oh, g.ow)


def conv2d_weight_grad(x: np.ndarray, gy: np.ndarray, g: ConvGeometry) -> np.ndarray:
    cols = _columns(x, g)
    gm = _out_matrix(gy, g)
    dw = np.matmul(gm.transpose(0, 2, 1), cols)  # (G, O/G, C/G*kh*kw)
    return dw.reshape(g.o, g.c // g.groups, g.kh, g.kw)


def scatter_windows(cols: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """Sum window contributions (N, C, oh, ow, kh, kw) back onto the unpadded input."""
    xp = np.zeros(g.padded, dtype=cols.dtype)
    (sh, sw), (dh, dw) = g.stride, g.dilation
    for i in range(g.kh):
        for j in range(g.kw):
            xp[:, :, i * dh : i * dh + sh * (g.oh - 1) + 1 : sh, j * dw : j * dw + sw * (g.ow - 1) + 1 : sw] += cols[
                :, :, :, :, i, j
            ]
    (pt, pb), (pl, pr) = g.pads
    out = xp[:, :, pt : xp.shape[2] - max(pb, 0), pl : xp.shape[3] - max(pr, 0)]
    if pb < 0 or pr < 0:  # rows no window reaches (see _pad) get nothing
        out = np.pad(out, ((0, 0), (0, 0), (0, -min(pb, 0)), (0, -min(pr, 0))))
    return out


def conv2d_input_grad(gy: np.ndarray, w: np.ndarray, g: ConvGeometry) -> np.ndarray:
    gm = _out_matrix(gy, g)  # (G, N*oh*ow, O/G)
    cg = g.c // g.groups
    cols = np.matmul(gm, w.reshape(g.groups, g.o // g.groups, -1))  # (G, N*oh*ow, Cg*kh*kw)
    cols = cols.reshape(g.groups, g.n, g.oh, g.ow, cg, g.kh, g.kw).transpose(1, 0, 4, 2, 3, 5, 6)
    return np.ascontiguousarray(scatter_windows(cols.reshape(g.n, g.c, g.oh, g.ow, g.kh, g.kw), g))


# ---------------------------------------------------------------- pooling
def pool_geometry(x_shape, kernel_size, stride, padding, dilation=1) -> ConvGeometry:
    if len(x_shape) != 4:
        raise ValueError(f"pool2d: input of shape {tuple(x_shape)}; expected 4 dims, NCHW")
    n, c, h, w = x_shape
    kh, kw = pair(kernel_size, 2, "kernel_size")
    stride = pair(stride if stride is not None else (kh, kw), 2, "stride")
    ph, pw = pair(padding, 2, "padding")
    if ph > kh // 2 or pw > kw // 2:
        raise ValueError(
            f"pool: padding {(ph, pw)} must be at most half the kernel {(kh, kw)} (torch's rule)"
        )
    return geometry((n, c, h, w), (c, 1, kh, kw), stride, (ph, pw), dilation, c)


def max_pool2d(x: np.ndarray, g: ConvGeometry) -> np.ndarray:
    return _windows(_pad(x, g, -np.inf), g).max(axis=(4, 5))


def max_pool2d_grad(x: np.ndarray, gy: np.ndarray, g: ConvGeometry) -> np.ndarray:
    """The gradient goes to the first maximum of each window (torch's convention)."""
    win = _windows(_pad(x, g, -np.inf), g).reshape(g.n, g.c, g.oh, g.ow, g.kh * g.kw)
    first = win.argmax(axis=-1)
    onehot = np.zeros(win.shape, dtype=gy.dtype)
    np.put_along_axis(onehot, first[..., None], gy[..., None], axis=-1)
    return scatter_windows(onehot.reshape(g.n, g.c, g.oh, g.ow, g.kh, g.kw), g)


def avg_pool_correction(g: ConvGeometry) -> np.ndarray:
    """Factor (oh, ow) turning a kernel-area mean into a mean over real, unpadded pixels."""
    ones = np.ones((1, 1, g.h, g.w))
    g1 = geometry((1, 1, g.h, g.w), (1, 1, g.kh, g.kw), g.stride, tuple(p for p, _ in g.pads), g.dilation, 1)
    counts = conv2d(ones, np.ones((1, 1, g.kh, g.kw)), g1)[0, 0]
    return (g.kh * g.kw) / counts
