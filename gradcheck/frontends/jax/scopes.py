"""Module paths in the name stack of models whose framework records none (flax.nnx, equinox, haiku).

flax.linen pushes each module's name onto jax's name stack as its method runs, so every equation of its
jaxpr says which module computed it (``regions``).  nnx and equinox modules are plain Python callables: while
gradcheck traces one, ``module_scopes`` wraps the ``__call__`` of each module class in the model so that a
call of a module pushes that module's path (``jax.named_scope``), relative to the module whose call is
running around it (``haiku_scopes`` does the same for haiku's modules, through haiku's method interceptor): ``layers/0`` inside the root, then ``linear`` inside ``layers/0`` (each marked as
gradcheck's, ``MARK``).  The named scopes are
metadata of the trace alone; nothing the model computes changes.  The classes are restored on exit.
"""

from __future__ import annotations

import contextlib
import functools
import sys

import jax
from jax.extend import source_info_util

# gradcheck's own scopes start with this, so that the module paths are read from them alone: equinox's layers
# push scopes of their own (``eqx.nn.Linear``), which name a class, not where the module is.
MARK = "gradcheck:"
# The wrapper's frame is not the user's: the line an equation is named by is the user's call under it.
source_info_util.register_exclusion(__file__)


def parts(eqn, own: bool | None = None) -> tuple[str, ...]:
    """The module path jax recorded for ``eqn``, as its parts: the name stack's scopes (``vmap`` and other
    transforms left out), split at ``/``; with ``own``, gradcheck's scopes alone (``module_scopes``); with
    ``own=None``, gradcheck's alone where the equation has any."""
    scopes = [str(entry.name) for entry in getattr(eqn.source_info.name_stack, "stack", ())
              if type(entry).__name__ == "Scope"]
    if own or (own is None and any(name.startswith(MARK) for name in scopes)):
        scopes = [name.removeprefix(MARK) for name in scopes if name.startswith(MARK)]
    return tuple(p for name in scopes for p in name.split("/") if p)


def path(chain, own: bool | None = None) -> str:
    """The module path of the last equation of ``chain``, inside the higher-order equations before it."""
    return join(p for eqn in chain for p in parts(eqn, own))


_ABSENT = object()


class _Active:
    """The module calls running, innermost last: a call's scope is its path relative to the call around it."""

    def __init__(self):
        self.paths: list[str] = []

    def run(self, path: str, fn):
        if not path or (self.paths and self.paths[-1] == path):  # the root, or a base class's wrapper again
            return fn()
        outer = self.paths[-1] if self.paths else ""
        name = path[len(outer):].lstrip("/") if outer and path.startswith(outer) else path
        self.paths.append(path)
        try:
            with jax.named_scope(MARK + name):
                return fn()
        finally:
            self.paths.pop()


@contextlib.contextmanager
def module_scopes(modules: dict[int, tuple[object, str]]):
    """Inside the block, a call of any of ``modules`` (``id -> (module, path)``; the root's path "" is left
    out) runs under ``jax.named_scope`` of its path relative to the module call around it."""
    active = _Active()

    def wrap(original):
        @functools.wraps(original)
        def call(self, *args, **kwargs):
            found = modules.get(id(self))
            path = found[1] if found is not None and found[0] is self else ""
            return active.run(path, lambda: original(self, *args, **kwargs))

        return call

    patched = []
    for cls in {type(m) for m, _ in modules.values()}:
        if not callable(cls) or "__call__" not in dir(cls):
            continue
        # Restored as it was in the class's own namespace: equinox keeps a descriptor there (its methods are
        # bound as pytrees), which ``cls.__call__`` does not return.
        patched.append((cls, vars(cls).get("__call__", _ABSENT)))
        type.__setattr__(cls, "__call__", wrap(cls.__call__))
    try:
        yield
    finally:
        for cls, raw in reversed(patched):
            if raw is _ABSENT:
                type.__delattr__(cls, "__call__")
            else:
                type.__setattr__(cls, "__call__", raw)


@contextlib.contextmanager
def haiku_scopes(seen: dict | None = None):
    """Inside the block, a haiku module's ``__call__`` runs under its module name (``mlp/~/linear_0``, the name
    its parameters are stored under), where haiku is in use: a plain function that applies a haiku transform.
    ``seen`` gets each called module's class, by its name."""
    hk = sys.modules.get("haiku")
    if hk is None:
        yield
        return
    active = _Active()

    def interceptor(method, args, kwargs, context):
        if context.method_name != "__call__":
            return method(*args, **kwargs)
        if seen is not None:
            seen[context.module.module_name] = type(context.module).__name__
        return active.run(context.module.module_name, lambda: method(*args, **kwargs))

    with hk.intercept_methods(interceptor):
        yield


def join(parts) -> str:
    """A module path from name-stack parts: equinox's ``.layers[0]`` parts follow on directly, the others
    (linen's and nnx's names) with a ``/``."""
    out = ""
    for part in parts:
        out += part if part.startswith((".", "[")) or not out else "/" + part
    return out
