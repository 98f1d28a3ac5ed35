"""Modules: annotated dataclasses whose fields are params, buffers, statics or children.

A layer declares what each field is::

    class Dense(Module):
        weight: Array = param()
        bias: Array | None = param()
        activation: Callable | None = static()

* ``param``  a trainable array (frozen per instance with ``freeze``);
* ``buffer`` a non-trainable array that the forward may update (BatchNorm's
  running statistics): assign a new value to the field inside ``__call__``;
* ``static`` configuration, functions, shapes: never an array;
* ``child``  a module, or a list of modules; ``child(inline=True)`` leaves the
  field name out of the path, as ``torch.nn.Sequential`` numbers its layers.

An annotated field without a marker is inferred when it holds a module (or a
list of them) or a plain config value; an unmarked array is an error, since
whether it is trainable cannot be guessed.  Paths are dotted as PyTorch names
them (``layer1.0.conv1.weight``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools

import numpy as np

# The field kinds live with the walker that reads them (gradcheck.tree); they are this module's names too.
from gradcheck.tree import BUFFER, CHILD, PARAM, STATIC, describe, leaves_with_paths, owner_of


def _field(kind, default, **meta):
    return dataclasses.field(default=default, metadata={"kind": kind, **meta})


def param(default=None):
    """A trainable array field (or None, e.g. a disabled bias)."""
    return _field(PARAM, default)


def buffer(default=None):
    """A non-trainable array field (running statistics); never receives a gradient."""
    return _field(BUFFER, default)


def static(default=None):
    """Configuration: ints, floats, strings, functions. Never differentiated."""
    return _field(STATIC, default)


def child(default=None, inline: bool = False):
    """A sub-module, or a list of sub-modules; ``inline`` drops the field name from paths."""
    return _field(CHILD, default, inline=inline)


# The modules being called, innermost last, while someone listens (``calls``); None otherwise, so that a
# call costs one check.  Kink reports name the layer they happen in from it.
_calls: list | None = None


@contextlib.contextmanager
def calls():
    """Within the block, ``current_calls()`` lists the modules being called, innermost last."""
    global _calls
    previous, _calls = _calls, []
    try:
        yield _calls
    finally:
        _calls = previous


def current_calls() -> list:
    return _calls if _calls is not None else []


# Wraps every module call while set (``intercepting``); None otherwise.  The per-layer replay
# (gradcheck.check.localise) records each layer's inputs and outputs with it.
_around = None


@contextlib.contextmanager
def intercepting(around):
    """Within the block, every module call runs as ``around(module, run, args, kwargs)``; ``run(*args, **kwargs)`` is the call."""
    global _around
    previous, _around = _around, around
    try:
        yield
    finally:
        _around = previous


def _tracked(call):
    @functools.wraps(call)
    def tracked_call(self, *args, **kwargs):
        stack, around = _calls, _around
        if stack is None and around is None:
            return call(self, *args, **kwargs)
        if stack is not None:
            stack.append(self)
        try:
            if around is None:
                return call(self, *args, **kwargs)
            return around(self, functools.partial(call, self), args, kwargs)
        finally:
            if stack is not None:
                stack.pop()

    tracked_call.tracked = True
    return tracked_call


class Module:
    """Base class of layers and models; subclasses become dataclasses automatically."""

    training: bool = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        custom_init = any("__init__" in k.__dict__ for k in cls.__mro__ if k not in (Module, object))
        dataclasses.dataclass(cls, init=not custom_init, repr=False, eq=False)
        own_call = cls.__dict__.get("__call__")
        if own_call is not None and not getattr(own_call, "tracked", False):
            cls.__call__ = _tracked(own_call)

    # -- structure ---------------------------------------------------------
    def field_kinds(self):
        """Yield ``(name, kind, inline)`` for every declared field, in declaration order."""
        for f in dataclasses.fields(self):
            kind = f.metadata.get("kind") or _infer_kind(self, f.name, getattr(self, f.name))
            yield f.name, kind, f.metadata.get("inline", False)

    def named_arrays(self, prefix: str = ""):
        """Yield ``(path, array, kind)`` for every param and buffer, depth first.

        ``kind`` is ``param``, ``frozen`` or ``buffer``.  None-valued fields
        (a disabled bias) are skipped.
        """
        for leaf in leaves_with_paths(self, prefix):
            yield leaf.path, leaf.value, leaf.kind

    def named_parameters(self, prefix: str = ""):
        return [(p, v) for p, v, k in self.named_arrays(prefix) if k in ("param", "frozen")]

    def num_parameters(self) -> int:
        return int(sum(np.size(v) for _, v in self.named_parameters()))

    def freeze(self, *patterns: str):
        """Freeze params whose dotted path matches a glob (``"fc.*"``); returns self."""
        paths = [p for p, _ in self.named_parameters()]
        for pattern in patterns:
            hits = [p for p in paths if fnmatch.fnmatchcase(p, pattern)]
            if not hits:
                raise ValueError(
                    f"freeze({pattern!r}) matches no parameter of {type(self).__name__}; "
                    f"paths look like {paths[:3]}"
                )
            for p in hits:
                owner, name = self._owner_of(p)
                owner.__dict__.setdefault("_frozen", set())
                owner._frozen = set(owner._frozen) | {name}
        return self

    def is_frozen(self, name: str) -> bool:
        return name in self.__dict__.get("_frozen", ())

    def _owner_of(self, path: str):
        return owner_of(self, path)

    # -- modes ---------------------------------------------------------------
    def train(self, mode: bool = True):
        """Set training mode on this module and every sub-module (in place); returns self."""
        for m in self.modules():
            m.training = mode
        return self

    def eval(self):
        return self.train(False)

    def modules(self):
        yield self
        for name, kind, _ in self.field_kinds():
            if kind == CHILD:
                value = getattr(self, name)
                for sub in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(sub, Module):
                        yield from sub.modules()

    def __repr__(self):
        return describe(self)


def _infer_kind(module, name, value):
    if isinstance(value, Module) or (
        isinstance(value, (list, tuple)) and value and all(isinstance(v, Module) for v in value)
    ):
        return CHILD
    if value is None or callable(value) or isinstance(value, (bool, int, float, str)):
        return STATIC
    # A tuple is configuration (kernel sizes, shapes) unless it holds arrays,
    # whose kind (param or buffer) cannot be guessed.
    if isinstance(value, tuple) and not any(hasattr(v, "shape") for v in value):
        return STATIC
    raise TypeError(
        f"field '{name}' of {type(module).__name__} holds a {type(value).__name__} but is not "
        "marked; declare it with param(), buffer(), static() or child()"
    )


_node_classes: dict = {}


def node_class(name: str, base: type, fields: tuple[tuple[str, str], ...], module: str) -> type:
    """A Module class named after a framework's class (a frontend's tree of a model), with these fields, each
    ``(name, kind)``, kind "param", "buffer", "child" or "inline" (a child whose leaves are named without its
    field: a jax model's modules, whose leaves carry the framework's full names); made once per layout.
    ``module`` is the frontend's module, where the class says it comes from."""
    key = (name, base, fields, module)
    if key not in _node_classes:
        make = {"param": param, "buffer": buffer, "child": child, "inline": lambda: child(inline=True)}
        namespace = {"__annotations__": {f: "object" for f, _ in fields}, "__module__": module, "__qualname__": name}
        namespace.update({f: make[kind]() for f, kind in fields})
        _node_classes[key] = type(name, (base,), namespace)
    return _node_classes[key]
