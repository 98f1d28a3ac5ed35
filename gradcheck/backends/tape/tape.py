"""The tape: a small reverse-mode AD on numpy.

A ``Tensor`` wraps a numpy array.  Calling a ``Primitive`` on tensors that
require gradients records a node (the primitive, its arguments, which of them
are differentiable); ``grad`` walks those nodes backwards from an output,
calling each primitive's vector-Jacobian products (VJPs).

VJPs are written against ``gradcheck.ops``.  In an ordinary backward pass they
receive plain numpy values, so they run as numpy; with ``create_graph=True``
they receive the tensors themselves and are recorded in turn, which is how
gradients of gradients work.  The primitives and their VJPs live in
``gradcheck/backends/tape/ops.py``, one row per primitive.
"""

from __future__ import annotations

import numpy as np

from gradcheck import ops


class Tensor:
    """A numpy array on the tape.  Only float tensors can require gradients."""

    __slots__ = ("value", "requires_grad", "node")
    # Make numpy hand mixed expressions (ndarray + Tensor) to our operators.
    __array_ufunc__ = None

    def __init__(self, value, requires_grad: bool = False, node=None):
        self.value = np.asarray(value)
        if requires_grad and self.value.dtype.kind != "f":
            raise TypeError(
                f"a tape tensor of dtype {self.value.dtype} cannot require gradients; "
                "only float arrays are differentiated (integer and bool inputs are constants)"
            )
        self.requires_grad = requires_grad
        self.node = node

    shape = property(lambda self: self.value.shape)
    ndim = property(lambda self: self.value.ndim)
    dtype = property(lambda self: self.value.dtype)
    size = property(lambda self: self.value.size)
    T = property(lambda self: ops.transpose(self))

    def __len__(self):
        return len(self.value)

    def __repr__(self):
        grad = ", requires_grad" if self.requires_grad else ""
        return f"Tensor({self.value!r}{grad})"

    def numpy(self) -> np.ndarray:
        return self.value

    def __bool__(self):
        raise TypeError(
            "the truth value of a tape Tensor is ambiguous inside a traced function; "
            "use gradcheck.ops.where for data-dependent choices"
        )

    __add__ = lambda self, o: ops.add(self, o)
    __radd__ = lambda self, o: ops.add(o, self)
    __sub__ = lambda self, o: ops.sub(self, o)
    __rsub__ = lambda self, o: ops.sub(o, self)
    __mul__ = lambda self, o: ops.mul(self, o)
    __rmul__ = lambda self, o: ops.mul(o, self)
    __truediv__ = lambda self, o: ops.div(self, o)
    __rtruediv__ = lambda self, o: ops.div(o, self)
    __pow__ = lambda self, o: ops.pow(self, o)
    __rpow__ = lambda self, o: ops.pow(o, self)
    __matmul__ = lambda self, o: ops.matmul(self, o)
    __rmatmul__ = lambda self, o: ops.matmul(o, self)
    __neg__ = lambda self: ops.neg(self)
    __getitem__ = lambda self, index: ops.getitem(self, index)
    __gt__ = lambda self, o: ops.greater(self, o)
    __lt__ = lambda self, o: ops.less(self, o)


def raw(x):
    """The numpy value behind a tensor (anything else is returned as is)."""
    return x.value if isinstance(x, Tensor) else x


class Primitive:
    """An op with a numpy forward and one VJP per differentiable argument."""

    def __init__(self, name: str, forward):
        self.name = name
        self.forward = forward
        self.vjps: dict[int, object] = {}
        self.vjp_any = None  # for variadic primitives: vjp(argnum, g, ans, *args)
        self.vjp_joint = None  # for ops whose gradients share work: vjp(argnums, g, ans, *args)

    def defvjp(self, *vjps):
        """One VJP per positional argument, ``vjp(g, ans, *args, **kwargs)``; None = not differentiable."""
        self.vjps = {i: f for i, f in enumerate(vjps) if f is not None}
        return self

    def defvjp_argnum(self, vjp):
        """One VJP for every positional argument, ``vjp(argnum, g, ans, *args, **kwargs)``."""
        self.vjp_any = vjp
        return self

    def defvjp_joint(self, vjp):
        """One VJP for all arguments at once, ``vjp(argnums, g, ans, *args, **kwargs)``.

        It returns one gradient per requested argnum.  For ops whose
        gradients share intermediate results (a normalisation's statistics),
        which separate VJPs would each recompute.
        """
        self.vjp_joint = vjp
        return self

    def vjp(self, argnum: int):
        if self.vjp_joint is not None:
            return lambda g, ans, *a, **k: self.vjp_joint((argnum,), g, ans, *a, **k)[0]
        if self.vjp_any is not None:
            return lambda g, ans, *a, **k: self.vjp_any(argnum, g, ans, *a, **k)
        return self.vjps.get(argnum)

    def backward(self, argnums, g, ans, args, kwargs) -> list:
        """The gradients with respect to the arguments at ``argnums``, in that order."""
        if self.vjp_joint is not None:
            return list(self.vjp_joint(tuple(argnums), g, ans, *args, **kwargs))
        return [self.vjp(i)(g, ans, *args, **kwargs) for i in argnums]

    def __call__(self, *args, **kwargs):
        try:
            value = self.forward(*(raw(a) for a in args), **kwargs)
        except (ValueError, IndexError) as exc:
            raise _named_error(self.name, exc, args) from exc
        if not any(isinstance(a, Tensor) for a in args):
            # Plain numpy in, plain numpy out: a first-order backward pass calls
            # primitives (conv's input gradient...) on numpy and must stay fast.
            return value
        parents = tuple(i for i, a in enumerate(args) if isinstance(a, Tensor) and a.requires_grad)
        if not parents:
            return Tensor(value)
        for i in parents:
            if self.vjp(i) is None:
                raise NotImplementedError(
                    f"tape op '{self.name}' has no gradient with respect to argument {i}; "
                    "pass a constant there (wrap it in gradcheck.ops.stop_gradient) or add its VJP "
                    "in gradcheck/backends/tape/ops.py"
                )
        return Tensor(value, requires_grad=np.asarray(value).dtype.kind == "f", node=(self, args, kwargs, parents))

    def __repr__(self):
        return f"<tape primitive {self.name}>"


def _named_error(name, exc, args):
    """numpy's complaint about bad shapes or axes, prefixed with the op and its argument shapes."""
    if str(exc).startswith(f"{name}:"):  # already names the op (our own validation)
        return exc
    shapes = ", ".join(str(np.shape(raw(a))) if hasattr(raw(a), "shape") else type(a).__name__ for a in args)
    msg = f"{name}: {exc} (tape op '{name}' called on arguments of shapes {shapes})"
    try:
        return type(exc)(msg)
    except TypeError:  # an exception class with a different constructor
        return ValueError(msg)


def _toposort(out: Tensor) -> list[Tensor]:
    """Nodes reachable from ``out``, parents before children (iterative: deep nets overflow recursion)."""
    order, seen, stack = [], set(), [(out, False)]
    while stack:
        t, done = stack.pop()
        if done:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        if t.node is not None:
            _, args, _, parents = t.node
            stack.extend((args[i], False) for i in parents if id(args[i]) not in seen)
    return order


def grad(out: Tensor, wrt: list[Tensor], cotangent=None, create_graph: bool = False) -> list:
    """Gradients of ``out`` (contracted with ``cotangent``, default 1) with respect to ``wrt``.

    A tensor in ``wrt`` that ``out`` does not depend on gets zeros.  With
    ``create_graph`` the results are tensors recorded on the tape (so they can
    be differentiated again); otherwise numpy arrays.  Only the part of the
    graph between ``wrt`` and ``out`` is visited.
    """
    if not isinstance(out, Tensor):
        dtype, kind = getattr(out, "dtype", None), type(out).__name__
        what = kind if dtype is None or str(dtype) == kind else f"{kind} of dtype {dtype}"
        raise TypeError(
            f"the function returned a {what}, "
            "not a tape Tensor; the loss must be a float computed from the arguments with gradcheck.ops "
            "(comparisons and integer results are not differentiable)"
        )
    if out.value.dtype.kind != "f":
        raise TypeError(
            f"the loss has dtype {out.value.dtype}; only a float loss can be differentiated "
            "(comparisons and integer results are constants)"
        )
    for k, t in enumerate(wrt):
        if not (isinstance(t, Tensor) and t.value.dtype.kind == "f"):
            what = f"a {t.value.dtype} tensor" if isinstance(t, Tensor) else f"a {type(t).__name__}"
            raise TypeError(
                f"grad with respect to {what} (position {k} of wrt); only float tape tensors "
                "are differentiated (integer and bool arrays are constants)"
            )
    if cotangent is None:
        if out.value.size != 1:
            raise ValueError(
                f"the loss must be a scalar, got an output of shape {out.shape}; reduce it "
                "(gradcheck.ops.sum or mean) or pass a cotangent of that shape"
            )
        cotangent = np.ones_like(out.value)
    elif np.shape(raw(cotangent)) != out.shape:
        raise ValueError(f"cotangent of shape {np.shape(raw(cotangent))} for an output of shape {out.shape}; they must match")
    if create_graph and not isinstance(cotangent, Tensor):
        cotangent = Tensor(cotangent)
    targets = {id(t): k for k, t in enumerate(wrt)}
    order = _toposort(out)
    relevant = set(targets)
    for t in order:
        if t.node is not None and id(t) not in relevant:
            _, args, _, parents = t.node
            if any(id(args[i]) in relevant for i in parents):
                relevant.add(id(t))
    found: dict[int, object] = {}  # by id, so a tensor listed twice in wrt gets its gradient twice
    pending = {id(out): cotangent}
    for t in reversed(order):
        g = pending.pop(id(t), None)
        if g is None or id(t) not in relevant:
            continue
        if id(t) in targets:
            found[id(t)] = g
            continue
        prim, args, kwargs, parents = t.node
        if create_graph:
            vjp_args, ans = args, t
        else:
            vjp_args, ans = tuple(raw(a) for a in args), t.value
        needed = [i for i in parents if id(args[i]) in relevant]
        for i, gi in zip(needed, prim.backward(needed, g, ans, vjp_args, kwargs), strict=True):
            key = id(args[i])
            pending[key] = gi if key not in pending else ops.add(pending[key], gi)
    results = []
    for t in wrt:
        g = found.get(id(t))
        if g is None:
            zeros = np.zeros_like(raw(t))
            g = Tensor(zeros) if create_graph else zeros
        elif ops.dtype_of(g) != t.value.dtype:
            # A float64 constant in the loss promotes the cotangents; a gradient
            # has its leaf's dtype (as torch and jax give it).
            g = ops.astype(g, t.value.dtype)
        results.append(g)
    return results
