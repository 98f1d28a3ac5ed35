"""How one op call runs, and the interceptors that see every call.

``op`` makes a function of ``gradcheck.ops`` a dispatching op.  A call runs
the op's argument rule (``gradcheck.ops.rules.RULES``), picks the backend
from the types of the arguments (``gradcheck.backends.backend_of_args``) and
runs that backend's function of the same name; a backend without one runs
the op's derived body (when its body is not ``...``), and otherwise
``BackendOpMissing`` is raised.

Interceptors.  A check that must see every op call (the kink recorder and
pinner, ``gradcheck.check.kinks``; the work counter, ``gradcheck.check.cost``)
puts an ``Interceptor`` in effect for the length of a block::

    with dispatch.intercepting("cost", counter):
        ...

An interceptor defines one or both hooks:

* ``around(name, run, args, kwargs)`` wraps the call as layer code made it:
  the argument rule, the backend's function or the derived body, and every
  op called inside.  It returns the op's value, normally
  ``run(*args, **kwargs)``.
* ``kernel(name, backend, args, out)`` sees each backend function's output
  right after it ran (a derived body's ops are each one such call, the
  derived op itself is none).  It returns nothing.

Every interceptor is pushed into a named *slot*, and of each slot only the
innermost push is in effect: a nested ``cost.counting()`` counts apart from
the outer one, and pushing ``None`` leaves the slot empty inside the block
(``kinks.suspended()``).  The ``around`` hooks of different slots nest in
the order the pushes in effect were made, the earliest outermost.  Pushes
and pops happen once per block, not per op: ``push`` and ``pop`` recompute
the hooks in effect, so that a call with no interceptor in effect costs one
test of a module global and allocates nothing.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from gradcheck.backends import backend_of_args, ops_module
from gradcheck.ops import rules

NAMES: list[str] = []  # every op made by ``op``, in definition order (``gradcheck.ops.__all__``)


class BackendOpMissing(NotImplementedError):
    """An op that a backend does not implement (and that has no derived version)."""


class Interceptor:
    """What an interceptor may define; a hook left None is not called.

    ``around(name, run, args, kwargs) -> value`` and ``kernel(name, backend,
    args, out) -> None``, as the module docstring describes them.
    """

    around: Callable[[str, Callable, tuple, dict], Any] | None = None
    kernel: Callable[[str, str, tuple, Any], None] | None = None


_stack: list[tuple[str, Interceptor | None]] = []  # (slot, interceptor) in push order
_around: Callable | None = None  # the ``around`` hooks in effect, composed into one (None: none)
_kernel: tuple = ()  # the ``kernel`` hooks in effect


def push(slot: str, interceptor: Interceptor | None) -> int:
    """Make ``interceptor`` the one in effect for ``slot`` (None: none) until ``pop``; returns the token for ``pop``."""
    _stack.append((slot, interceptor))
    _refresh()
    return len(_stack)


def pop(token: int) -> None:
    """Undo the ``push`` that returned ``token``, and every push made after it that is still in effect."""
    del _stack[token - 1:]
    _refresh()


@contextlib.contextmanager
def intercepting(slot: str, interceptor: Interceptor | None) -> Iterator[Interceptor | None]:
    """``push`` on entry, ``pop`` on exit: inside the block ``interceptor`` is ``slot``'s one in effect."""
    token = push(slot, interceptor)
    try:
        yield interceptor
    finally:
        pop(token)


def innermost(slot: str) -> Interceptor | None:
    """The interceptor in effect for ``slot``, or None."""
    for s, interceptor in reversed(_stack):
        if s == slot:
            return interceptor
    return None


def _refresh() -> None:
    global _around, _kernel
    in_effect: dict[str, Interceptor | None] = {}
    for slot, interceptor in _stack:
        in_effect.pop(slot, None)  # re-inserted last: the slot takes the place of its innermost push
        in_effect[slot] = interceptor
    found = [i for i in in_effect.values() if i is not None]
    _around = _composed(tuple(i.around for i in found if i.around is not None))
    _kernel = tuple(i.kernel for i in found if i.kernel is not None)


def _composed(hooks: tuple) -> Callable | None:
    """One ``around`` hook that calls ``hooks`` nested, the first outermost (None for none)."""
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]
    outer, inner = hooks[0], _composed(hooks[1:])
    return lambda name, run, args, kwargs: outer(
        name, lambda *a, **k: inner(name, run, a, k), args, kwargs)


def op(fn):
    """Make ``fn`` a dispatching op; its body (if any) is the derived fallback."""
    name = fn.__name__
    derived = not _is_stub(fn)
    check = rules.RULES.get(name)

    def run(*args, **kwargs):
        if check is not None:
            check(name, *args, **kwargs)
        backend = backend_of_args(args + tuple(kwargs.values()) if kwargs else args)
        module = ops_module(backend)
        impl = getattr(module, name, None)
        if impl is not None:
            out = impl(*args, **kwargs)
            if _kernel:
                for hook in _kernel:
                    hook(name, backend, args, out)
            return out
        if derived:
            return fn(*args, **kwargs)
        raise BackendOpMissing(
            f"op '{name}' is not implemented by the {backend} backend; "
            f"add `def {name}(...)` to {module.__name__.replace('.', '/')}.py "
            f"or run this case without the {backend} backend"
        )

    @functools.wraps(fn)
    def dispatch(*args, **kwargs):
        around = _around
        if around is None:
            return run(*args, **kwargs)
        return around(name, run, args, kwargs)

    dispatch.derived = derived
    NAMES.append(name)
    return dispatch


def _is_stub(fn) -> bool:
    code = fn.__code__
    # A body of just a docstring and `...` compiles to "return None" with only
    # the docstring (and Ellipsis) as constants.
    consts = [c for c in code.co_consts if c is not None and c is not Ellipsis and c != fn.__doc__]
    return not consts and not code.co_names
