"""Backend registry: which backend an array belongs to, and each backend's ops module.

Backends are named ``tape``, ``torch``, ``jax`` and ``numpy``.  Their op
implementations live in parallel modules with the same function names
(``backends/<name>/ops.py``); torch and jax are
imported only when an array of theirs is seen or their backend is asked for.
"""

from __future__ import annotations

import importlib

import numpy as np

_BY_TYPE: dict[type, str | None] = {}
_MODULES: dict[str, object] = {}

def _classify(t: type) -> str | None:
    root = t.__module__.split(".")[0]
    if t.__module__ == "gradcheck.backends.tape.tape" and t.__name__ == "Tensor":
        return "tape"
    if root == "torch":
        return "torch"
    if root in ("jax", "jaxlib"):
        return "jax"
    if issubclass(t, (np.ndarray, np.generic, bool, int, float)):
        return "numpy"
    return None


def backend_of(x) -> str | None:
    """The backend an array belongs to, or None for non-arrays (lists, None, strings)."""
    t = type(x)
    try:
        return _BY_TYPE[t]
    except KeyError:
        name = _BY_TYPE[t] = _classify(t)
        return name


def backend_of_args(args) -> str:
    """The backend that should run an op given its positional arguments.

    numpy arrays and Python scalars are constants that join any backend;
    arrays of two different frameworks in one op are an error.
    """
    found = "numpy"
    for a in args:
        name = backend_of(a)
        if name is None and isinstance(a, (list, tuple)):
            name = backend_of_args(a)
        if name is None or name == "numpy" or name == found:
            continue
        if found != "numpy":
            raise TypeError(
                f"an op received both {found} and {name} arrays; a computation must stay on one "
                "backend (convert constants with gradcheck.ops.asarray(value, like=x))"
            )
        found = name
    return found


def ops_module(name: str):
    """The ops module of backend ``name`` (imported on first use)."""
    try:
        return _MODULES[name]
    except KeyError:
        module = _MODULES[name] = importlib.import_module(f"gradcheck.backends.{name}.ops")
        return module


_DRIVERS = {
    "tape": ("gradcheck.backends.tape.driver", "TapeBackend"),
    "torch": ("gradcheck.backends.torch.driver", "TorchBackend"),
    "jax": ("gradcheck.backends.jax.driver", "JaxBackend"),
}
_INSTANCES: dict[str, object] = {}


def get_backend(name: str):
    """The driver of backend ``name`` (``tape``, ``torch`` or ``jax``); imports nothing heavy."""
    if name not in _DRIVERS:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(_DRIVERS)}")
    if name not in _INSTANCES:
        module, cls = _DRIVERS[name]
        _INSTANCES[name] = getattr(importlib.import_module(module), cls)()
    return _INSTANCES[name]
