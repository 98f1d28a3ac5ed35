"""The tape backend driver: gradcheck's own reverse-mode AD on numpy."""

from __future__ import annotations

import numpy as np

from gradcheck.backends.base import Backend, Evaluation, evaluate_eagerly
from gradcheck.backends.tape import tape


class TapeBackend(Backend):
    name = "tape"

    def evaluate(self, f, args, prefixes=None) -> Evaluation:
        return evaluate_eagerly(f, args, prefixes, _lift, _differentiate, lambda x: np.asarray(tape.raw(x)))


def _lift(value, trainable):
    from gradcheck.backends.tape.ops import identity

    if not trainable and np.asarray(tape.raw(value)).dtype.kind != "f":
        # Integer leaves (token ids, labels) are constants: hand them over as
        # numpy, so indexing with them needs no unwrapping in layers.
        return np.asarray(tape.raw(value)), False
    if isinstance(value, tape.Tensor) and value.requires_grad:
        # Called inside an outer gradient: link to the outer tape so the
        # result stays differentiable (gradients of gradients).
        return (identity(value) if trainable else tape.Tensor(value.value)), True
    return tape.Tensor(tape.raw(value), requires_grad=trainable), False


def _differentiate(loss, wrt, create_graph):
    return tape.grad(loss, wrt, create_graph=create_graph) if wrt else []
