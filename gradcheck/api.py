"""The public gradient API, mirroring Tracker's ``withgradient``."""

from __future__ import annotations

from gradcheck.backends import get_backend
from gradcheck.backends.base import arg_prefixes
from gradcheck.tree import structural_grads


def withgradient(f, *args, backend: str = "tape"):
    """``(value, grads)`` of ``f(*args)`` on one backend.

    ``grads`` has one entry per argument, mirroring its structure: an array at
    every trainable leaf (a non-frozen param, a float array argument), None at
    static fields, buffers, frozen params and non-float arrays.  A trainable
    leaf the loss does not use gets zeros.  If ``f`` returns a tuple, its
    first element is the loss and ``value`` is the whole tuple.  The arguments
    are not modified (buffer updates such as BatchNorm's running statistics
    happen on a copy; the runner reads them back from the evaluation).
    """
    driver = get_backend(backend)
    driver.require()
    prefixes = arg_prefixes(args)
    ev = driver.evaluate(f, args, prefixes)
    grads = tuple(structural_grads(a, ev.grads, p) for a, p in zip(args, prefixes))
    return ev.value, grads


def gradient(f, *args, backend: str = "tape"):
    """The structural gradients of ``f`` alone (see ``withgradient``)."""
    return withgradient(f, *args, backend=backend)[1]
