"""Structure of arguments: modules, tuples, lists, dicts and arrays, walked with dotted paths.

``map_leaves`` is the one walker: it rebuilds a structure with every array
leaf passed through a function (to move parameters onto a backend, or to
put gradients in their place) and every static value passed through another.

A node with fields is anything whose class has ``field_kinds()`` (yielding
``(name, kind, inline)`` with the kinds below) and ``is_frozen(name)``:
``gradcheck.module.Module`` is one.  The walker asks for nothing else, so
this module does not import the one that defines modules.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradcheck.backends import backend_of

# Field kinds of a node (``gradcheck.module`` declares its fields with them).
PARAM, BUFFER, STATIC, CHILD = "param", "buffer", "static", "child"

# Leaf kinds: a module's trainable "param", a "frozen" param, a "buffer", or an
# "array" given directly as (part of) an argument.
TRAINABLE_KINDS = ("param", "array")


@dataclass
class Leaf:
    path: str
    value: Any
    kind: str

    @property
    def trainable(self) -> bool:
        """Differentiated: a non-frozen param or a float array argument."""
        return self.kind in TRAINABLE_KINDS and is_float_array(self.value)


def is_float_array(x) -> bool:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return False
    try:
        return np.dtype(str(dtype).replace("torch.", "")).kind == "f"
    except TypeError:
        return False


def join(prefix: str, name) -> str:
    name = str(name)
    return f"{prefix}.{name}" if prefix else name


def is_node(x) -> bool:
    """Whether ``x`` has fields to walk (a module): its class has ``field_kinds``."""
    return callable(getattr(type(x), "field_kinds", None))


def _is_array(x) -> bool:
    return not isinstance(x, (bool, int, float, complex)) and backend_of(x) is not None


def map_leaves(tree, leaf_fn: Callable[[str, Any, str], Any], prefix: str = "",
               static_fn: Callable[[Any], Any] = lambda v: v):
    """Rebuild ``tree`` with ``leaf_fn(path, value, kind)`` at arrays and ``static_fn`` elsewhere.

    Modules are copied shallowly, so the original is never modified.
    """
    if is_node(tree):
        new = copy.copy(tree)
        for name, kind, inline in tree.field_kinds():
            value = getattr(tree, name)
            path = prefix if inline else join(prefix, name)
            if kind == CHILD:
                out = map_leaves(value, leaf_fn, path, static_fn)
            elif kind in (PARAM, BUFFER) and value is not None:
                if not _is_array(value):
                    raise TypeError(
                        f"{join(prefix, name)}: a {kind} of {type(tree).__name__} must be an array, "
                        f"got {type(value).__name__}"
                    )
                leaf_kind = "frozen" if kind == PARAM and tree.is_frozen(name) else kind
                out = leaf_fn(path, value, leaf_kind)
            else:
                out = static_fn(value)
            object.__setattr__(new, name, out)
        return new
    if isinstance(tree, (list, tuple)):
        items = [map_leaves(v, leaf_fn, join(prefix, i), static_fn) for i, v in enumerate(tree)]
        if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # namedtuple
            return type(tree)(*items)
        return type(tree)(items)
    if isinstance(tree, dict):
        return {k: map_leaves(v, leaf_fn, join(prefix, k), static_fn) for k, v in tree.items()}
    if _is_array(tree):
        return leaf_fn(prefix, tree, "array")
    return static_fn(tree)


def leaves_with_paths(tree, prefix: str = "") -> list[Leaf]:
    """Every array leaf of ``tree`` (params, buffers, array arguments) with its path and kind."""
    out: list[Leaf] = []

    def collect(path, value, kind):
        out.append(Leaf(path, value, kind))
        return value

    map_leaves(tree, collect, prefix)
    return out


def replace_leaves(tree, values: dict[str, Any], prefix: str = ""):
    """A copy of ``tree`` with the leaves named in ``values`` replaced.  A numpy scalar goes in as a 0-d array:
    arithmetic on a 0-d array gives scalars (a referee's step ``point + h * d``), which backends and a
    model's own ops (torch's, on a ``from_torch`` module) do not take as the arrays they are."""
    def replaced(path, v, kind):
        new = values.get(path, v)
        return np.asarray(new) if isinstance(new, np.generic) else new

    return map_leaves(tree, replaced, prefix)


def structural_grads(tree, grads: dict[str, Any], prefix: str = ""):
    """Mirror ``tree``: the gradient at each trainable leaf, None everywhere else."""

    def leaf(path, value, kind):
        return grads[path] if Leaf(path, value, kind).trainable else None

    return map_leaves(tree, leaf, prefix, static_fn=lambda v: None)


def owner_of(module, path: str):
    """The module that owns the field at ``path``, and the field's name."""
    parts = path.split(".")
    node = module
    for part in parts[:-1]:
        node = _step(node, part)
    if is_node(node):
        name = parts[-1]
        if any(field == name for field, _, _ in node.field_kinds()):
            return node, name
    raise KeyError(f"no field at path {path!r}")


def _step(node, part):
    if isinstance(node, (list, tuple)):
        return node[int(part)]
    if is_node(node):
        for name, kind, inline in node.field_kinds():
            if kind == CHILD and inline:
                value = getattr(node, name)
                if isinstance(value, (list, tuple)) and part.isdigit():
                    return value[int(part)]
            if name == part:
                return getattr(node, name)
    raise KeyError(part)


def describe(tree, indent: int = 0) -> str:
    """A readable one-field-per-line view of a module or gradient structure."""
    pad = "  " * indent
    if is_node(tree):
        lines = [f"{type(tree).__name__}("]
        for name, _, _ in tree.field_kinds():
            lines.append(f"{pad}  {name}={describe(getattr(tree, name), indent + 1)},")
        lines.append(f"{pad})")
        return "\n".join(lines)
    if isinstance(tree, (list, tuple)) and any(is_node(v) for v in tree):
        inner = ",\n".join(f"{pad}  {describe(v, indent + 1)}" for v in tree)
        open_, close = ("[", "]") if isinstance(tree, list) else ("(", ")")
        return f"{open_}\n{inner}\n{pad}{close}"
    if _is_array(tree):
        return f"array{tuple(tree.shape)}:{str(tree.dtype).replace('torch.', '')}"
    if callable(tree):
        return getattr(tree, "__name__", repr(tree))
    return repr(tree)


def modules_with_paths(tree, prefix: str = ""):
    """Yield ``(path, module)`` for every module in ``tree``, depth first (the root's path is ``prefix``)."""
    if is_node(tree):
        yield prefix, tree
        for name, kind, inline in tree.field_kinds():
            if kind == CHILD:
                yield from modules_with_paths(getattr(tree, name), prefix if inline else join(prefix, name))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from modules_with_paths(v, join(prefix, i))
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from modules_with_paths(v, join(prefix, k))


def leaf_owner_types(tree, prefix: str = "") -> dict[str, str]:
    """Path of every array leaf -> the type name of the module that owns it ("" for plain arrays)."""
    return {path if inline else join(path, name): type(m).__name__
            for path, m in modules_with_paths(tree, prefix)
            for name, kind, inline in m.field_kinds() if kind in (PARAM, BUFFER)}


def module_paths(tree, prefix: str = "") -> dict[int, str]:
    """``id(module)`` -> dotted path of every module in ``tree`` (the first path, for a module used twice)."""
    out: dict[int, str] = {}
    for path, m in modules_with_paths(tree, prefix):
        out.setdefault(id(m), path)
    return out
