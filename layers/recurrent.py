"""LSTM and GRU with torch.nn's parameter names, gate order and init, unrolled over time.

Parameters per layer ``k`` are ``weight_ih_l{k}`` (G*H, in), ``weight_hh_l{k}``
(G*H, H), ``bias_ih_l{k}``, ``bias_hh_l{k}`` with G = 4 (gates i, f, g, o)
for LSTM and G = 3 (r, z, n) for GRU, exactly as torch lays them out.  The
input projection of all time steps is one matmul; only the recurrent part
runs step by step.
"""

from __future__ import annotations

import math

import numpy as np

from gradcheck import ops
from gradcheck.layers import init
from gradcheck.module import Module, param, static

MAX_LAYERS = 4  # fields are declared up to this depth; unused ones stay None (no path)
_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


class _RNNBase(Module):
    # Declared in torch's registration order, so paths list as named_parameters() does.
    for _k in range(MAX_LAYERS):
        for _n in _NAMES:
            __annotations__[f"{_n}_l{_k}"] = "Any"
            vars()[f"{_n}_l{_k}"] = param()
    del _k, _n
    input_size: int = static()
    hidden_size: int = static()
    num_layers: int = static()
    batch_first: bool = static()

    gates = 1  # G: rows of the stacked gate weights, per hidden unit

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, rng=None):
        name = type(self).__name__
        if not 1 <= num_layers <= MAX_LAYERS:
            raise ValueError(f"{name}: num_layers={num_layers}; supported: 1 to {MAX_LAYERS}")
        if bidirectional or dropout:
            raise NotImplementedError(f"{name}: bidirectional and inter-layer dropout are not supported; leave them off")
        rng = init.get_rng(rng)
        bound = 1.0 / math.sqrt(hidden_size)  # torch draws every weight and bias from U(-bound, bound)
        G = self.gates
        for k in range(num_layers):
            fan = input_size if k == 0 else hidden_size
            setattr(self, f"weight_ih_l{k}", init.uniform(rng, (G * hidden_size, fan), bound))
            setattr(self, f"weight_hh_l{k}", init.uniform(rng, (G * hidden_size, hidden_size), bound))
            setattr(self, f"bias_ih_l{k}", init.uniform(rng, (G * hidden_size,), bound) if bias else None)
            setattr(self, f"bias_hh_l{k}", init.uniform(rng, (G * hidden_size,), bound) if bias else None)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.batch_first = batch_first

    def _layer(self, k):
        return tuple(getattr(self, f"{n}_l{k}") for n in _NAMES)

    def _inputs(self, x):
        """(x batch-first, batched?) from torch's layouts: (L, N, H_in), (N, L, H_in) or unbatched (L, H_in)."""
        shape = ops.shape_of(x)
        if len(shape) == 2:
            return ops.expand_dims(x, 0), False
        if len(shape) != 3 or shape[2] != self.input_size:
            raise ValueError(
                f"{type(self).__name__}(input_size={self.input_size}): input of shape {shape}; expected "
                f"({'N, L' if self.batch_first else 'L, N'}, {self.input_size})"
            )
        return (x if self.batch_first else ops.transpose(x, (1, 0, 2))), True

    def _outputs(self, out, states, batched):
        """Back to torch's layouts: output, and states stacked to (num_layers, N, H)."""
        states = tuple(ops.stack(s, axis=0) for s in states)
        if not batched:
            return ops.squeeze(out, 0), tuple(ops.squeeze(s, 1) for s in states)
        return (out if self.batch_first else ops.transpose(out, (1, 0, 2))), states

    def _initial(self, hx, x, k, batched):
        if hx is None:
            return ops.asarray(np.zeros((ops.shape_of(x)[0], self.hidden_size)), like=x)
        h = ops.getitem(hx, k)
        return h if batched else ops.expand_dims(h, 0)

    def _input_projection(self, x, w_ih, b):
        xw = ops.matmul(x, ops.transpose(w_ih))  # every time step at once: (N, L, G*H)
        if b is not None:
            xw = xw + b
        n, length, _ = ops.shape_of(xw)
        return ops.reshape(xw, (n, length, self.gates, self.hidden_size)), length

    def _gate(self, g, i):
        return ops.getitem(g, (slice(None), i))


class LSTM(_RNNBase):
    """torch.nn.LSTM; returns ``(output, (h_n, c_n))``."""

    gates = 4

    def __call__(self, x, hx=None):
        x, batched = self._inputs(x)
        h0, c0 = (None, None) if hx is None else hx
        hs, cs = [], []
        for k in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = self._layer(k)
            bias = None if b_ih is None else b_ih + b_hh
            xw, length = self._input_projection(x, w_ih, bias)
            h, c = self._initial(h0, x, k, batched), self._initial(c0, x, k, batched)
            outs = []
            for t in range(length):
                g = ops.getitem(xw, (slice(None), t)) + ops.reshape(
                    ops.matmul(h, ops.transpose(w_hh)), (-1, 4, self.hidden_size))
                i, f = ops.sigmoid(self._gate(g, 0)), ops.sigmoid(self._gate(g, 1))
                cand, o = ops.tanh(self._gate(g, 2)), ops.sigmoid(self._gate(g, 3))
                c = f * c + i * cand
                h = o * ops.tanh(c)
                outs.append(h)
            x = ops.stack(outs, axis=1)
            hs.append(h)
            cs.append(c)
        out, (h_n, c_n) = self._outputs(x, (hs, cs), batched)
        return out, (h_n, c_n)


class GRU(_RNNBase):
    """torch.nn.GRU; returns ``(output, h_n)``.

    ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``: the reset gate acts
    after the recurrent projection, as in torch (not the original paper).
    """

    gates = 3

    def __call__(self, x, hx=None):
        x, batched = self._inputs(x)
        hs = []
        for k in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = self._layer(k)
            xw, length = self._input_projection(x, w_ih, b_ih)
            h = self._initial(hx, x, k, batched)
            outs = []
            for t in range(length):
                xt = ops.getitem(xw, (slice(None), t))
                hw = ops.matmul(h, ops.transpose(w_hh))
                if b_hh is not None:
                    hw = hw + b_hh
                hw = ops.reshape(hw, (-1, 3, self.hidden_size))
                r = ops.sigmoid(self._gate(xt, 0) + self._gate(hw, 0))
                z = ops.sigmoid(self._gate(xt, 1) + self._gate(hw, 1))
                n = ops.tanh(self._gate(xt, 2) + r * self._gate(hw, 2))
                h = (1.0 - z) * n + z * h
                outs.append(h)
            x = ops.stack(outs, axis=1)
            hs.append(h)
        out, (h_n,) = self._outputs(x, (hs,), batched)
        return out, h_n
