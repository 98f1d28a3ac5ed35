"""Backend registry: one row per backend, and every lookup the rest of gradcheck makes by backend name.

A backend is one ``Row`` here plus its package ``gradcheck/backends/<name>/``
(``ops.py``, the op implementations under the names of ``gradcheck.ops``;
``driver.py``, the driver that evaluates a function and its gradients).  The
row says which arrays are the backend's, where its ops and driver are, where
it stands in the reference order of a pair, whether a run checks it when
none are named, how to read an array's values, and the optional hooks
(its own Hessian-vector product, its reproducer script).  The rows of
``tape``, ``torch``, ``jax`` and ``numpy`` (the float64 forward of the
referee, no driver) are registered below; ``register`` adds one
(docs/decisions.md, "Adding a backend").

Modules are named as import strings and imported on first use, so torch and
jax are imported only when an array of theirs is seen or their backend is
asked for.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Row:
    """One backend.  ``ops``, ``driver`` and ``hvp`` are import names, or the objects themselves."""

    name: str
    arrays: Callable[[type], bool]  # whether an array of this type is this backend's
    ops: Any  # its ops module: "gradcheck.backends.<name>.ops"
    driver: Any = None  # "module:Class" of its driver (None: it runs ops but differentiates nothing)
    rank: int | None = None  # its place as a pair's reference: the lower rank is the reference (None: after all)
    default: bool = False  # checked when a run names no backends (in the order the rows are registered)
    concrete: Callable[[Any], np.ndarray | None] | None = None  # an array's values, None while unknown (traced)
    hvp: Any = None  # "module:function" of its own H v, hvp(driver, f, args, prefixes, v) (None: grad of grad)
    repro: str | None = None  # the file name of its script in a reproducer folder (gradcheck.repro)


_ROWS: dict[str, Row] = {}  # by name, in the order registered
_BY_TYPE: dict[type, str | None] = {}
_MODULES: dict[str, object] = {}
_INSTANCES: dict[str, object] = {}
_UNRANKED = sys.maxsize


def register(row: Row) -> Row:
    """Add ``row`` to the registry; a name already registered is an error (``unregister`` it first)."""
    if row.name in _ROWS:
        raise ValueError(f"backend {row.name!r} is registered already; unregister({row.name!r}) first to replace it")
    _ROWS[row.name] = row
    _forget(row.name)
    return row


def unregister(name: str) -> Row:
    """Remove backend ``name`` from the registry (a backend registered for a test); returns its row."""
    row = _ROWS.pop(name)
    _forget(name)
    return row


def _forget(name: str) -> None:
    _BY_TYPE.clear()  # a new row may claim a type classified before (a subclass of another's array type)
    _MODULES.pop(name, None)
    _INSTANCES.pop(name, None)


def rows() -> tuple[Row, ...]:
    """Every registered row, in the order registered."""
    return tuple(_ROWS.values())


def row(name: str) -> Row:
    """The row of backend ``name``."""
    try:
        return _ROWS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(_ROWS)}") from None


def default_backends() -> tuple[str, ...]:
    """The backends a run checks when it names none, in the order registered."""
    return tuple(r.name for r in _ROWS.values() if r.default)


def reference_rank(name: str) -> int:
    """Where backend ``name`` stands in the reference order: of two backends, the lower rank is the reference."""
    r = _ROWS.get(name)
    return r.rank if r is not None and r.rank is not None else _UNRANKED


def repro_scripts() -> dict[str, str]:
    """Backend name -> the file name of its reproducer script, for the backends that have one."""
    return {r.name: r.repro for r in _ROWS.values() if r.repro}


def own_hvp(name: str) -> Callable | None:
    """Backend ``name``'s own Hessian-vector product, or None when it takes the gradient of its gradient."""
    r = _ROWS.get(name)  # a driver of no registered backend (a test's) differentiates its gradient too
    return _load(r.hvp) if r is not None and r.hvp is not None else None


def _load(ref):
    """An import name (``"pkg.mod"`` or ``"pkg.mod:attr"``) imported, or the object itself."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded


# ---------------------------------------------------------------- arrays
def _classify(t: type) -> str | None:
    # The latest registered row is asked first, so a new backend's array type may subclass another's.
    for r in reversed(_ROWS.values()):
        if r.arrays(t):
            return r.name
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


def concrete(x) -> np.ndarray | None:
    """``x``'s values as numpy, or None while they are not known (a jax tracer inside a transformation)."""
    name = backend_of(x)
    read = _ROWS[name].concrete if name is not None else None
    return read(x) if read is not None else np.asarray(x)


def ops_module(name: str):
    """The ops module of backend ``name`` (imported on first use)."""
    try:
        return _MODULES[name]
    except KeyError:
        module = _MODULES[name] = _load(row(name).ops)
        return module


def get_backend(name: str):
    """The driver of backend ``name`` (``tape``, ``torch`` or ``jax``); imports nothing heavy."""
    r = _ROWS.get(name)
    if r is None or r.driver is None:
        raise ValueError(f"unknown backend {name!r}; choose from "
                         f"{', '.join(n for n, r in _ROWS.items() if r.driver is not None)}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _load(r.driver)()
    return _INSTANCES[name]


# ---------------------------------------------------------------- the built-in rows
def _is_numpy(t: type) -> bool:
    return issubclass(t, (np.ndarray, np.generic, bool, int, float))


def _is_tape(t: type) -> bool:
    return t.__module__ == "gradcheck.backends.tape.tape" and t.__name__ == "Tensor"


def _is_torch(t: type) -> bool:
    return t.__module__.split(".")[0] == "torch"


def _is_jax(t: type) -> bool:
    return t.__module__.split(".")[0] in ("jax", "jaxlib")


def _tape_values(x) -> np.ndarray:
    return x.value


def _torch_values(x) -> np.ndarray:
    return x.detach().cpu().numpy()


def _jax_values(x) -> np.ndarray | None:
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


# numpy first: the rows registered later are asked first about an array's type, and numpy's test is the widest.
register(Row("numpy", _is_numpy, "gradcheck.backends.numpy.ops"))
register(Row("tape", _is_tape, "gradcheck.backends.tape.ops", "gradcheck.backends.tape.driver:TapeBackend",
             rank=2, default=True, concrete=_tape_values, repro="repro_tape.py"))
register(Row("torch", _is_torch, "gradcheck.backends.torch.ops", "gradcheck.backends.torch.driver:TorchBackend",
             rank=0, default=True, concrete=_torch_values, repro="repro_torch.py"))
register(Row("jax", _is_jax, "gradcheck.backends.jax.ops", "gradcheck.backends.jax.driver:JaxBackend",
             rank=1, default=True, concrete=_jax_values, hvp="gradcheck.check.second_order:_hvp_jax",
             repro="repro_jax.py"))
