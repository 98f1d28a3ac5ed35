"""The ``fuzz`` suite: layer configurations, shapes and values drawn with numpy from a seed.

A placeholder for a hypothesis-driven version (which would shrink a failure
to the smallest configuration): this one draws ``n`` valid configurations
from ``numpy.random.default_rng(seed)``, so ``gradcheck run fuzz --seed S -k
NAME`` replays any case exactly.  Every draw is valid by construction
(channels divisible by groups, outputs at least one pixel, ``"same"`` only
at stride 1) and layers with kinks get kink-free inputs.  Draws that could
not fail are redrawn: a convolution whose outputs see only padding, a
normalisation over a single value, a softmax over one element, a
recurrence of one step from a zero state (its ``weight_hh`` gets no
gradient); the runner would rightly call those vacuous.
"""

from __future__ import annotations

import numpy as np

from gradcheck import layers as L
from gradcheck import ops
from gradcheck.suites.layers import gru_flat, lstm_flat, randomised, with_stats
from gradcheck.suites.table import NOTE_KINK_FREE, Row, cases, make, normal, smooth_free

FUZZ_CASES = 200


def _int(rng, low, high):
    """An int in [low, high] (both ends included)."""
    return int(rng.integers(low, high + 1))


def _linear(rng):
    i, o, bias = _int(rng, 1, 6), _int(rng, 1, 6), bool(rng.random() < 0.7)
    lead = tuple(_int(rng, 1, 3) for _ in range(_int(rng, 1, 2)))
    return Row("Linear", f"in{i},out{o}" + ("" if bias else ",nobias") + f",x{lead}",
               make(L.Linear, i, o, bias=bias), normal(*lead, i))


def _touches_input(x_shape, w_shape, transpose=False, **geometry) -> bool:
    """Whether any output of the (transposed) convolution depends on the input, not only on padding."""
    x, w = np.ones(x_shape), np.ones(w_shape)
    y = ops.conv_transpose(x, w, **geometry) if transpose else ops.conv(x, w, **geometry)
    return bool(np.max(y) > 0)


def _redrawn(draw):
    """Redraw a family's configuration until it is not vacuous (``draw`` returns None to reject)."""

    def family(rng, *args):
        for _ in range(100):
            row = draw(rng, *args)
            if row is not None:
                return row
        raise RuntimeError(f"fuzz: {draw.__name__} found no non-vacuous configuration in 100 draws")

    family.__name__ = draw.__name__
    return family


@_redrawn
def _conv(rng, nd):
    g = _int(rng, 1, 3)
    cin, cout = g * _int(rng, 1, 2), g * _int(rng, 1, 2)
    k = tuple(_int(rng, 1, 4) for _ in range(nd))
    d = _int(rng, 1, 2)
    s = 1 if rng.random() < 0.4 else _int(rng, 1, 3)
    if s == 1 and rng.random() < 0.3:
        p, ptxt = "same", "same"
    else:
        p = _int(rng, 0, max(k) - 1)
        ptxt = f"p{p}"
    pad = 0 if p == "same" else p
    size = tuple(max(1, d * (kk - 1) + 1 - 2 * pad) + _int(rng, 0, 4) for kk in k)
    kernel = k[0] if nd == 1 else k
    n = _int(rng, 1, 2)
    if not _touches_input((n, cin) + size, (cout, cin // g) + k, stride=s, padding=p, dilation=d, groups=g):
        return None
    cls, name = (L.Conv1d, "Conv1d") if nd == 1 else (L.Conv2d, "Conv2d")
    label = f"c{cin}->{cout},k{kernel},s{s},{ptxt},d{d},g{g}".replace(" ", "")
    return Row(name, label, make(cls, cin, cout, kernel, stride=s, padding=p, dilation=d, groups=g),
               normal(n, cin, *size))


@_redrawn
def _conv_transpose(rng):
    g = _int(rng, 1, 2)
    cin, cout = g * _int(rng, 1, 2), g * _int(rng, 1, 2)
    k, s, d = _int(rng, 1, 3), _int(rng, 1, 3), _int(rng, 1, 2)
    p = _int(rng, 0, (d * (k - 1)) // 2)
    op = _int(rng, 0, max(s, d) - 1)
    h, w, n = _int(rng, 1, 4), _int(rng, 1, 4), _int(rng, 1, 2)
    if not _touches_input((n, cin, h, w), (cin, cout // g, k, k), transpose=True, stride=s, padding=p,
                          output_padding=op, dilation=d, groups=g):
        return None
    label = f"c{cin}->{cout},k{k},s{s},p{p},op{op},d{d},g{g}"
    return Row("ConvTranspose2d", label,
               make(L.ConvTranspose2d, cin, cout, k, stride=s, padding=p, output_padding=op, dilation=d, groups=g),
               normal(n, cin, h, w))


@_redrawn
def _batchnorm(rng):
    c, n = _int(rng, 1, 4), _int(rng, 2, 4)
    affine = bool(rng.random() < 0.7)
    momentum = [0.1, 0.5, None][_int(rng, 0, 2)]
    shape = (n, c, _int(rng, 1, 3), _int(rng, 1, 3))
    if rng.random() < 0.3:
        return Row("BatchNorm2d", f"c{c},eval" + ("" if affine else ",noaffine"),
                   with_stats(L.BatchNorm2d, c, affine=affine), normal(*shape), mode="eval")
    if n * shape[2] * shape[3] < 4:
        return None  # two values per channel normalise to +-1 whatever they are: ill-conditioned
    return Row("BatchNorm2d", f"c{c},train,m{momentum}" + ("" if affine else ",noaffine"),
               make(L.BatchNorm2d, c, momentum=momentum, affine=affine), normal(*shape))


def _layernorm(rng):
    shape = tuple(_int(rng, 2, 4) for _ in range(_int(rng, 1, 2)))
    return Row("LayerNorm", f"{shape}".replace(" ", ""), randomised(L.LayerNorm, shape), normal(_int(rng, 1, 3), *shape))


@_redrawn
def _groupnorm(rng):
    g = _int(rng, 1, 3)
    c = g * _int(rng, 1, 3)
    h, w = _int(rng, 1, 3), _int(rng, 1, 3)
    if c // g * h * w < 3:
        return None  # a group of one or two values normalises to a constant
    return Row("GroupNorm", f"{g},{c}", randomised(L.GroupNorm, g, c), normal(2, c, h, w))


def _pool(rng):
    k = _int(rng, 1, 3)
    s = _int(rng, 1, 3)
    p = _int(rng, 0, k // 2)
    h, w = k + _int(rng, 0, 4), k + _int(rng, 0, 4)
    shape = (_int(rng, 1, 2), _int(rng, 1, 3), h, w)
    if rng.random() < 0.5:
        return Row("MaxPool2d", f"k{k},s{s},p{p}", make(L.MaxPool2d, k, s, p), smooth_free(*shape),
                   notes=(NOTE_KINK_FREE,))
    include = bool(rng.random() < 0.5)
    return Row("AvgPool2d", f"k{k},s{s},p{p}" + ("" if include else ",exclude_pad"),
               make(L.AvgPool2d, k, s, p, count_include_pad=include), normal(*shape))


def _activation(rng):
    names = sorted(L.ACTIVATIONS)
    name = names[_int(rng, 0, len(names) - 1)]
    layer = L.ACTIVATIONS[name][1]
    shape = tuple(_int(rng, 1, 4) for _ in range(_int(rng, 1, 2))) + (_int(rng, 2, 4),)  # softmax: >= 2 classes
    # kink-free for all: harmless for the smooth ones, needed for relu/leaky_relu/elu.
    return Row(layer.__name__, f"{shape}".replace(" ", ""), make(layer), smooth_free(*shape, scale=3.0),
               notes=(NOTE_KINK_FREE,))


def _attention(rng):
    h, dh = _int(rng, 1, 3), _int(rng, 1, 3)
    e, length, causal = h * dh, _int(rng, 1, 4), bool(rng.random() < 0.5)
    bias = bool(rng.random() < 0.7)
    return Row("MultiheadAttention", f"E{e},h{h},L{length}" + (",causal" if causal else "") + ("" if bias else ",nobias"),
               make(L.MultiheadAttention, e, h, causal=causal, bias=bias), normal(_int(rng, 1, 2), length, e))


def _recurrent(rng):
    # At least two steps: from the zero initial state, one step gives weight_hh no gradient.
    i, hdim, layers, length = _int(rng, 1, 3), _int(rng, 1, 4), _int(rng, 1, 2), _int(rng, 2, 4)
    lstm = bool(rng.random() < 0.5)
    cls, name, forward = (L.LSTM, "LSTM", lstm_flat) if lstm else (L.GRU, "GRU", gru_flat)
    return Row(name, f"in{i},h{hdim},layers{layers},L{length}", make(cls, i, hdim, num_layers=layers, batch_first=True),
               normal(_int(rng, 1, 2), length, i), forward=forward)


FAMILIES = (
    _linear, lambda r: _conv(r, 1), lambda r: _conv(r, 2), _conv_transpose, _batchnorm, _layernorm, _groupnorm,
    _pool, _activation, _attention, _recurrent,
)


def fuzz_rows(n: int, seed: int = 0) -> list[Row]:
    """``n`` configurations drawn from ``seed``; row ``i`` is labelled ``...#i`` so names stay unique."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        row = FAMILIES[_int(rng, 0, len(FAMILIES) - 1)](rng)
        out.append(Row(row.layer, f"{row.params}#{i}" if row.params else f"#{i}", row.build, row.inputs,
                       row.mode, row.forward, row.notes))
    return out


def fuzz_cases(n: int = FUZZ_CASES, seed: int = 0, dtype: str | None = None):
    """``n`` drawn layer configurations (checked in float64 and measured in float32 unless ``dtype="float64"``)."""
    return cases(fuzz_rows(n, seed), seed=seed, dtype=dtype)


def fuzz_suite(seed: int = 0, dtype: str | None = None):
    """Layer configurations, shapes and values drawn from the seed (200 cases; replay with --seed and -k)."""
    return fuzz_cases(FUZZ_CASES, seed, dtype)
