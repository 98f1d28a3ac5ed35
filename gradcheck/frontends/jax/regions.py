"""A jax model's modules as spans of its jaxpr: the equations jax records under one module path.

jax keeps, on every equation, the name stack it was traced under: flax.linen pushes each module's name as
its method runs (``ResNet/BasicBlock_0/Conv_0``), and gradcheck pushes the module paths of nnx and equinox
models while it traces them (``frameworks.module_scopes``).  A module's call is then the contiguous run of
equations whose stack starts with its path, at one site of the jaxpr: the equations it computes with, the
values they read from before (its inputs: activations, the parameters it uses, masks), and the values read
after (its outputs).  ``gradcheck.frontends.jax.units`` replays each such span alone on every backend, as
from_torch replays a submodule's call, so that a wrong gradient that is no custom rule's (a lowering's VJP on
the tape or torch, a primitive's rule in jax) is still named by the module it starts in.

Spans are found at the jaxpr's top level and inside the bodies of ``jit`` and ``closed_call`` equations (run
once, so a module there is called once per call of the body).  The bodies of loops and conds are not looked
into: a module inside a ``scan`` (flax's ``nn.scan``) is part of the span of the module around the loop.
Only the equations that run are counted (``interpreter.live_equations``): the key-dependent part (dropout's
masks) is jax's, evaluated once, and enters a span as a held input.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradcheck.frontends.jax import interpreter, scopes
from gradcheck.frontends.jax.primitives import is_float_dtype

# Higher-order equations whose body runs once, in place: spans are looked for inside them too.
_CALL_BODIES = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr"}


@dataclass
class Span:
    """One module's equations at one site: ``eqns`` are ``(index, equation)`` pairs in order."""

    site: tuple  # where the jaxpr is (``interpreter``'s sites: steps from the outermost jaxpr in)
    stack: tuple[str, ...]  # the module path, name stacks of the calls around the site included
    eqns: list
    inputs: list  # the variables its equations read that are defined before it (or are the jaxpr's inputs)
    outputs: list  # the variables it defines that are read after it (or are the jaxpr's outputs)
    around: tuple  # the higher-order equations the site is inside, outermost first

    @property
    def first(self) -> int:
        return self.eqns[0][0]

    @property
    def last(self) -> int:
        return self.eqns[-1][0]

    @property
    def path(self) -> str:
        return scopes.join(self.stack)


def find(closed, known: dict | None, own: bool | None) -> list[Span]:
    """Every module span of the jaxpr, outer before inner; a span the same equations as one inside it make
    (a module that only calls another) is left to the inner one, and the span of all the model's equations at
    the top (the model itself, already run whole) is none.  ``own``: the paths are gradcheck's scopes
    (``scopes.module_scopes``: nnx, equinox), not the framework's (linen); None: gradcheck's where an equation
    has any (``scopes.parts``)."""
    by_site = interpreter.known_by_site(known)
    found: dict[tuple, Span] = {}

    def visit(jaxpr, site, around, outer):
        eqns = interpreter.live_equations(jaxpr, by_site.get(site, {}))
        stacks = {i: outer + scopes.parts(e, own) for i, e in eqns}
        for i, e in eqns:
            part = _CALL_BODIES.get(e.primitive.name)
            if part is not None:
                body = e.params[part]
                visit(getattr(body, "jaxpr", body), site + ((i, part, 0),), around + (e,), stacks[i])
        # Where each variable is last read (the jaxpr's outputs after every equation): a span's outputs are
        # the variables it defines that are read after its last equation.
        last_read = {v: i for i, e in eqns for v in e.invars if interpreter.is_var(v)}
        last_read.update((v, len(jaxpr.eqns)) for v in jaxpr.outvars if interpreter.is_var(v))

        def keep(run, depth):
            if not run or (site == () and len(run) == len(eqns)):
                return
            defined, inputs = set(), []
            for _, e in run:
                for v in e.invars:
                    if interpreter.is_var(v) and v not in defined and v not in inputs:
                        inputs.append(v)
                defined.update(v for v in e.outvars if interpreter.is_var(v))
            end = run[-1][0]
            outputs = [v for _, e in run for v in e.outvars if interpreter.is_var(v) and last_read.get(v, -1) > end]
            if not any(map(is_float_var, inputs)) or not any(map(is_float_var, outputs)):
                return  # nothing to differentiate through: integer bookkeeping, or constants made here
            # The same equations at a deeper path replace the outer span: it names the module that does the work.
            found[(site, tuple(i for i, _ in run))] = Span(site, stacks[run[0][0]][:depth], list(run), inputs,
                                                           outputs, around)

        for depth in range(len(outer) + 1, max((len(s) for s in stacks.values()), default=0) + 1):
            run: list = []
            for i, e in eqns:
                s = stacks[i]
                if run and len(s) >= depth and s[:depth] == stacks[run[0][0]][:depth]:
                    run.append((i, e))
                    continue
                keep(run, depth)
                run = [(i, e)] if len(s) >= depth else []
            keep(run, depth)

    visit(closed.jaxpr, (), (), ())
    return list(found.values())


def is_float_var(v) -> bool:
    """Whether a jaxpr variable holds floats (bfloat16 and float8 kinds included)."""
    return hasattr(v.aval, "dtype") and is_float_dtype(v.aval.dtype)
