"""Check a JAX model as it is written: ``from_jax(model, ...) -> Case`` for plain jax, flax.linen, flax.nnx, equinox.

jax differentiates the user's own function, with its own ``custom_jvp``/``custom_vjp`` rules; the tape and
torch run its jaxpr (traced with float64 enabled), each primitive lowered to ``gradcheck.ops``; the float64
referee runs that jaxpr on numpy.  Parameters and buffers keep the framework's own names.

* ``frameworks``: the four call forms, described as one pure function of named arrays;
* ``primitives``: the jax primitive -> ``gradcheck.ops`` table;
* ``interpreter``: runs a jaxpr, evaluates its key-dependent part with jax, checks each lowering against
  jax's primitive;
* ``model``: the gradcheck Module that stands for the jax model;
* ``facts``: the case's notes; ``units``: the custom rules as replay units (``gradcheck.check.localise``).

Importing this package imports jax; ``import gradcheck`` does not import it.
"""

from __future__ import annotations

import sys

from gradcheck.case import Case


def is_jax_model(obj) -> bool:
    """Whether ``obj`` is a flax.linen, flax.nnx or equinox Module (without importing any of them)."""
    for name in ("flax.linen", "flax.nnx", "equinox"):
        mod = sys.modules.get(name)
        if mod is not None and isinstance(obj, mod.Module):
            return True
    return False


def is_jax_target(obj) -> bool:
    """Whether ``obj`` is what from_jax checks: a flax or equinox module, or a plain function (not a gradcheck
    Module, a torch module or a class)."""
    if is_jax_model(obj):
        return True
    return callable(obj) and not isinstance(obj, type) and not _is_torch_or_gradcheck(obj)


def from_jax(model, *args, **kwargs) -> Case:
    """A Case that checks a jax model on jax, the tape and torch, in one of four call forms.

    * plain jax: ``from_jax(fn, params, *inputs, state=None)``, with ``fn(params, *inputs) -> output`` or,
      with ``state``, ``fn(params, state, *inputs) -> (output, new_state)``; ``params`` and ``state`` are
      any pytrees;
    * flax.linen: ``from_jax(module, variables, *inputs, **apply_kwargs)``, checked as
      ``module.apply(variables, *inputs, **apply_kwargs)``: ``variables["params"]`` is differentiated, the
      ``mutable=[...]`` collections (``batch_stats``) are buffers, ``rngs={"dropout": key}`` the randomness;
    * flax.nnx: ``from_jax(module, *inputs)``: ``nnx.Param`` differentiated, ``nnx.BatchStat`` buffers, the
      rng state the randomness, in the mode the module is in (``train()``/``eval()``);
    * equinox: ``from_jax(module, *inputs, state=None, call=None)``: inexact array leaves differentiated,
      ``state`` (``eqx.nn.State``) buffers; ``call(model, state, *inputs) -> (output, new_state) | output``
      says how it is called (default ``module(*inputs)``).

    Every form takes gradcheck's own keywords too, never passed on to the model: ``name=`` (the case's),
    ``seed=`` (the loss cotangent, referee directions, and the keys of streams the model was given none
    for) and ``dtype=`` (default: float64 when every parameter is, else float32).

    Every float leaf of what the model returns enters the loss, in pytree order; float inputs are
    differentiated, integer ones (token ids) are constants.  Raises ``FromJaxError``: ``CallFormError``
    for arguments that fit no form, ``TraceError`` with jax's reason when jax cannot trace the model.
    """
    try:
        import jax  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"from_jax needs jax ({exc}); install it with `pip install jax` (and flax or equinox "
                          "for their models: `pip install 'gradcheck[jax-models]'`)") from None
    from gradcheck.frontends.jax import facts, frameworks
    from gradcheck.frontends.jax.model import Program

    described = frameworks.describe(model, args, kwargs)
    if not described.output_names:
        raise frameworks.CallFormError(f"from_jax: {described.name} returns no float array; a gradient check needs "
                                       "one: return the logits (or the loss)")
    program = Program(described)
    program.traced("float64")  # the float64 jaxpr and its constants: a model jax cannot trace so fails here
    inputs = tuple(described.inputs)

    def build(rng):
        return program.tree()

    return Case(name=described.name, build=build, inputs=lambda rng: inputs, dtype=described.case_dtype,
                mode="train", seed=described.seed, model=described.root_class or described.name,
                notes=facts.describe(program),
                float64_computes_in=program.float64_computes_in)


def as_cases(made, name: str = "") -> list[Case] | None:
    """A target's jax models as Cases: a ``(model, args)`` or ``(model, args, kwargs)`` triple (the arguments of
    ``from_jax(model, *args, **kwargs)``), or a list of them mixed with Cases; None if ``made`` is none of these.

    A model that cannot be described or traced raises its ``FromJaxError`` (a usage error: exit 2).
    """
    items = made if isinstance(made, list) else [made]
    if not any(_is_call(item) for item in items):
        return None
    out: list[Case] = []
    for i, item in enumerate(items):
        if isinstance(item, Case):
            out.append(item)
        elif _is_call(item):
            target, args, *rest = item
            kwargs = dict(rest[0]) if rest else {}
            if "name" not in kwargs and name:
                kwargs["name"] = name if len(items) == 1 else f"{name}[{i}]"
            out.append(from_jax(target, *tuple(args), **kwargs))
        else:
            return None
    return out


def _is_call(item) -> bool:
    """``(model, args)`` or ``(model, args, kwargs)``: a jax model (or a function) and its arguments."""
    if not (isinstance(item, tuple) and len(item) in (2, 3) and isinstance(item[1], (tuple, list))):
        return False
    if len(item) == 3 and not isinstance(item[2], dict):
        return False
    return is_jax_model(item[0]) or ("jax" in sys.modules and is_jax_target(item[0]))


def _is_torch_or_gradcheck(obj) -> bool:
    from gradcheck.frontends.torch import is_torch_module
    from gradcheck.module import Module

    return isinstance(obj, Module) or is_torch_module(obj)


def is_usage_error(exc: BaseException) -> bool:
    """Whether ``exc`` is from_jax's refusal of its arguments (``FromJaxError``): the user's to fix, exit 2."""
    frameworks = sys.modules.get("gradcheck.frontends.jax.frameworks")
    return frameworks is not None and isinstance(exc, frameworks.FromJaxError)


def lowering(name: str):
    """Lower the jax primitive ``name`` in ``gradcheck.ops`` for every jaxpr (``primitives.lowering``)."""
    from gradcheck.frontends.jax.primitives import lowering as _lowering

    return _lowering(name)


def __getattr__(name):
    # The heavy parts import jax; they load when first named.
    if name in ("FromJaxError", "CallFormError", "TraceError"):
        from gradcheck.frontends.jax import frameworks

        return getattr(frameworks, name)
    if name == "LoweringError":
        from gradcheck.frontends.jax import primitives

        return primitives.LoweringError
    if name == "UnsupportedPrimitive":
        from gradcheck.frontends.jax import model

        return model.UnsupportedPrimitive
    raise AttributeError(f"module 'gradcheck.frontends.jax' has no attribute {name!r}")


__all__ = ["CallFormError", "FromJaxError", "LoweringError", "TraceError", "UnsupportedPrimitive", "as_cases",
           "from_jax", "is_jax_model", "is_jax_target", "is_usage_error", "lowering"]
