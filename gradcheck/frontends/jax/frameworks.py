"""The four ways a JAX user writes a model, as one pure description: ``describe(target, args, kwargs) -> Model``.

``from_jax``'s call forms (issue 22), and what each one runs:

* plain jax, ``from_jax(fn, params, *inputs, state=None)``: ``fn(params, *inputs) -> output``, or with
  ``state``, ``fn(params, state, *inputs) -> (output, new_state)``;
* flax.linen, ``from_jax(module, variables, *inputs, **apply_kwargs)``:
  ``module.apply(variables, *inputs, **apply_kwargs)``;
* flax.nnx, ``from_jax(module, *inputs)``: ``module(*inputs)``, in the mode the module is in;
* equinox, ``from_jax(module, *inputs, state=None, call=None)``: ``call(module, state, *inputs)``, by
  default ``module(*inputs)`` (``module(*inputs, state)`` with a state).

gradcheck's own keywords ``name=``, ``seed=`` and ``dtype=`` are taken out first and never reach the model.

``Model.call(params, buffers, inputs, key) -> (outputs, new_buffers)`` is a pure function of arrays that runs the
user's own model, rebuilt from the flat, named leaves: it is what ``jax.grad`` differentiates (the jax backend)
and what ``jax.make_jaxpr`` traces (the jaxpr the tape and torch run).  Leaves keep the framework's own names:
linen ``params/Dense_0/kernel`` (``flax.traverse_util.flatten_dict(variables, sep="/")``), nnx its state paths
joined the same way (``linear1/kernel``, ``layers/0/kernel``), equinox and plain pytrees
``jax.tree_util.keystr`` paths (``.layers[0].weight``, ``['encoder']['w']``).

Randomness is one input of the call, ``key``: uint32 key data, one row per random stream the model reads
(``Model.streams``), so that every random draw depends on the key alone, never on a differentiated leaf, and
from_jax evaluates that part of the jaxpr once, with jax, and hands its results (the dropout masks)
to the tape and torch as constants.

``Model.layers`` names, where the framework has modules, the one owning each leaf (linen's ``Dense``, seen as
the first trace makes it; nnx's and equinox's module classes): the gradcheck tree groups the leaves by it.

This module imports numpy, jax and (only when a model of theirs is given) flax and equinox, nothing of
gradcheck: ``gradcheck.frontends.jax.model`` makes the gradcheck Module of a ``Model``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gradcheck.frontends.jax import scopes

OWN_KEYWORDS = ("name", "seed", "dtype")  # gradcheck's, never passed on to the model

# What a leaf of the user's structures is to the check.
PARAM = "param"  # differentiated
BUFFER = "buffer"  # state: not differentiated, its updated value compared
CONSTANT = "constant"  # an array held fixed: integer arrays, rng counters
STATIC = "static"  # not an array (a function, a flag, a config value): held as it is, never traced
KEY = "key"  # a jax random key: one stream of the case's randomness
INPUT = "input"  # an example input (float ones are differentiated, integer ones are not)


class FromJaxError(Exception):
    """A model from_jax cannot describe; the message names the thing, the value and the fix (exit 2)."""


class CallFormError(FromJaxError, TypeError):
    """The arguments do not match any of from_jax's call forms, or not the one the target's framework takes."""


class TraceError(FromJaxError):
    """jax cannot trace the model as it is called; the message carries jax's own reason."""


@dataclass(frozen=True, eq=False)  # holds arrays: identity, not elementwise equality
class Model:
    """A user's jax model as one pure function of named arrays.

    * ``params``: the differentiated leaves, under the framework's names; ``buffers``: state (linen's
      non-``params`` collections, nnx ``BatchStat``, equinox ``State``, plain jax ``state``), updated by the
      call and compared; ``constants``: non-float arrays held fixed (integer leaves, nnx's rng counters).
    * ``inputs``: the example inputs (float ones differentiated, integer ones - token ids - constant), named by
      ``input_names``; ``output_names``: the float leaves of the output in pytree order, the loss's order.
    * ``key``: uint32 key data, shape ``(len(streams), *key_shape)``, one row per random stream: the user's
      own keys where they gave them (linen ``rngs=``, a key among the inputs, nnx's ``Rngs`` state), else
      drawn from ``seed`` (``key_for``).  ``key_impl`` is the PRNG implementation the rows are data of.
    * ``case_dtype``: the case's dtype (``dtype=``, else float64 when every parameter is float64, else
      float32); ``at(dtype)`` is the model at a run's dtype.
    """

    kind: str
    name: str
    params: dict[str, np.ndarray]
    buffers: dict[str, np.ndarray]
    constants: dict[str, np.ndarray]
    inputs: tuple[np.ndarray, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    key: np.ndarray
    streams: tuple[str, ...]
    key_impl: str
    seed: int
    case_dtype: str
    widened: bool = False  # the call runs the framework's narrower float dtype attributes in float64
    _run: Callable = field(default=None, repr=False, compare=False)
    root_class: str = ""  # the model's class name (a function's name for plain jax)
    layers: dict[str, tuple[str, str]] = field(default_factory=dict)  # leaf -> (owner's path, its class)
    classes: dict[str, str] = field(default_factory=dict)  # every module's path -> its class (the replay's names)

    def call(self, params: Mapping, buffers: Mapping, inputs: tuple, key) -> tuple[Any, dict]:
        """``(outputs, new_buffers)``: the user's model at these arrays, pure (the Model is never changed).

        ``outputs`` is the model's own output pytree; ``new_buffers`` has every name of ``buffers``, with the
        values the call updated (BatchNorm's running statistics) and the others as given.  Traceable with
        ``jax.make_jaxpr`` and differentiable with ``jax.grad``; ``key`` is data like ``Model.key``.
        """
        return self._run(params, buffers, self.constants, tuple(inputs), key, self.widened)

    def at(self, dtype) -> Model:
        """The model with its float parameters, buffers and inputs cast to ``dtype``.

        At float64 the call also runs every float dtype the framework's modules hold (flax's ``dtype=`` and
        ``param_dtype=``, equinox's static dtype fields) in float64, so that the float64 run is float64
        throughout, as from_torch runs a torch module in float64; at float32 the modules run as written.
        Casts the user writes (``x.astype(jnp.float32)``) stay: ``narrow_floats(model.trace())`` finds them.
        """
        dt = np.dtype(dtype)
        if dt not in (np.float32, np.float64):
            raise ValueError(f"Model.at: dtype={dtype!r}; a run is float32 or float64")
        return replace(self, params=_cast_all(self.params, dt), buffers=_cast_all(self.buffers, dt),
                       inputs=tuple(_cast(x, dt) for x in self.inputs), widened=dt == np.float64)

    def key_for(self, seed: int) -> np.ndarray:
        """Key data for the case seed ``seed``: one key per stream, split from ``jax.random.key(seed)``."""
        return _seed_keys(seed, len(self.streams), self.key_impl)

    def args(self) -> tuple:
        """``(params, buffers, inputs, key)``, the call's arguments at the model's own values."""
        return self.params, self.buffers, self.inputs, self.key

    def trace(self):
        """The call's ``ClosedJaxpr`` at the model's values; its invars are ``jax.tree_util.tree_leaves(model.args())``."""
        return _traced(self.kind, self.name, lambda: jax.make_jaxpr(self.call)(*self.args()))


def describe(target, args: tuple = (), kwargs: Mapping | None = None) -> Model:
    """The Model of ``from_jax(target, *args, **kwargs)``, in whichever of the four call forms ``target`` takes.

    Raises ``CallFormError`` for arguments that fit no form, and ``TraceError`` (with jax's reason) when
    the model cannot be traced as it is called.
    """
    enable_x64()
    kwargs = dict(kwargs or {})
    own = {"name": None, "seed": 0, "dtype": None}
    name, seed, dtype = (kwargs.pop(k, own[k]) for k in OWN_KEYWORDS)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise CallFormError(f"from_jax: seed={seed!r}; the case seed is an int (seed=0)")
    kind = kind_of(target)
    framework = _DESCRIBERS[kind](target, tuple(args), kwargs)
    return _model(framework, name or framework.name, int(seed), _case_dtype(dtype))


def enable_x64() -> None:
    """Turn on jax's float64; before any tracing, else every float64 array would silently be float32."""
    if not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)


def kind_of(target) -> str:
    """Which call form ``target`` takes: "linen", "nnx", "equinox" or "jax" (a function)."""
    linen, nnx, eqx = (sys.modules.get(m) for m in ("flax.linen", "flax.nnx", "equinox"))
    if linen is not None and isinstance(target, linen.Module):
        return "linen"
    if nnx is not None and isinstance(target, nnx.Module):
        return "nnx"
    if eqx is not None and isinstance(target, eqx.Module):
        # eqx.filter_jit, filter_vmap, Partial, ... are Modules that stand for a function.
        where = type(target).__module__
        return "jax" if where.startswith("equinox.") and not where.startswith("equinox.nn") else "equinox"
    if isinstance(target, type):
        raise CallFormError(f"from_jax: got the class {target.__qualname__}, not a model; pass an instance, "
                            f"from_jax({target.__name__}(...), ...), or a function")
    if callable(target):
        return "jax"
    raise CallFormError(f"from_jax: the model is {_what(target)}; from_jax takes a flax.linen Module, a "
                        "flax.nnx Module, an equinox Module or a function fn(params, *inputs)")


def narrow_floats(jaxpr) -> list[str]:
    """Each place a float narrower than float64 appears in ``jaxpr`` (a ClosedJaxpr or Jaxpr, sub-jaxprs too).

    One line per place, ``"convert_element_type -> float32[2,4] at models.py:12 (__call__)"``; empty when
    the jaxpr is float64 throughout (what the float64 run must be).
    """
    found = []
    for line, _ in _narrow_places(jaxpr):
        if line not in found:
            found.append(line)
    return found


def narrowest_float(jaxpr) -> str:
    """The name of the narrowest float dtype ``jaxpr`` computes in (sub-jaxprs too): ``"float64"`` when it is
    float64 throughout, else the cast's, the coarsest if several (``"bfloat16"`` over ``"float32"``)."""
    from gradcheck.check.conditioning import unit_roundoff

    return max({np.dtype(aval.dtype).name for _, aval in _narrow_places(jaxpr)}, key=unit_roundoff,
               default="float64")


def _narrow_places(jaxpr):
    """``(line, aval)`` for each input, constant and equation output of ``jaxpr`` in a float narrower than
    float64 (``narrow_floats`` writes the lines)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for what, atoms in (("input", jaxpr.invars), ("constant", jaxpr.constvars)):
        for i, v in enumerate(atoms):
            if _narrow(v.aval):
                yield f"{what} {i} is {v.aval.str_short()}", v.aval
    for eqn, where in _equations(jaxpr):
        for v in eqn.outvars:
            if _narrow(v.aval):
                yield f"{eqn.primitive.name} -> {v.aval.str_short()} at {where or 'an unknown line'}", v.aval


def widened_floats(jaxpr) -> list[str]:
    """Each place the float32 program widens a float32 value to float64 (``jaxpr`` traced for the float32 run).

    gradcheck traces with x64 on (its float64 check needs it), and under x64 jax's default float dtype is
    float64: ``jnp.ones(n)``, ``jnp.zeros(...)``, ``jax.nn.one_hot``, ``jax.random.normal(key, shape)`` are
    float64, and the float32 values that meet them are converted up.  With x64 off, as a model is usually run,
    none of them is: the program is float32 throughout.  One line per place, as ``narrow_floats`` writes them.
    """
    found = []
    for eqn, where in _equations(getattr(jaxpr, "jaxpr", jaxpr)):
        if eqn.primitive.name != "convert_element_type" or not _narrow(eqn.invars[0].aval):
            continue
        out = eqn.outvars[0].aval
        if jnp.issubdtype(out.dtype, jnp.inexact) and not _narrow(out):
            line = f"{eqn.invars[0].aval.str_short()} -> {out.dtype} at {where or 'an unknown line'}"
            if line not in found:
                found.append(line)
    return found


# --- what each framework contributes --------------------------------------------------------------------


@dataclass
class _Framework:
    """One call form, taken apart: the user's structures, how their leaves are named and used, how to call.

    ``tree`` holds the model's arrays (variables, module, params and state); ``role_of(path, leaf)`` says what
    each leaf is and ``name_of(path)`` names it, the same way for the tree and for ``invoke``'s updates.
    ``invoke(tree, args, kwargs, keys, widen) -> (outputs, updates)`` runs the user's call on a rebuilt tree
    (``keys``: stream name -> typed key) and returns the output and a pytree of updated state leaves.
    """

    kind: str
    name: str
    form: str  # the call as the user writes it, for error messages
    tree: Any
    name_of: Callable
    role_of: Callable
    invoke: Callable
    positional: tuple = ()
    keywords: dict = field(default_factory=dict)
    is_leaf: Callable | None = None
    rngs: dict = field(default_factory=dict)  # named keys the user gave outside the inputs (linen's rngs=)
    takes_key: bool = False  # the callee declares `key`: it gets the case key as key= unless an input is one
    # owners(names, seen) -> {leaf name: (owner path, owner class)}: the framework module owning each leaf, where
    # the framework has modules; ``seen`` is what the first trace saw (linen's modules, made inside apply).
    owners: Callable | None = None
    # classes(seen) -> {module path: class name} for every module, as the module spans name them (``regions``).
    classes: Callable | None = None


def _linen(module, args, kwargs) -> _Framework:
    name = type(module).__name__
    form = f"{name}.apply(variables, *inputs, **apply_kwargs)"
    if module.scope is not None:
        raise CallFormError(f"from_jax: the flax.linen module {name} is bound (module.bind, or a submodule "
                            "inside apply); pass the unbound module and its variables: module, variables = "
                            "bound.unbind(); from_jax(module, variables, *inputs)")
    if not args or not isinstance(args[0], Mapping):
        got = _what(args[0]) if args else "nothing"
        raise CallFormError(f"from_jax: the flax.linen module {name} takes its variables after it, as "
                            f"module.apply does: from_jax(module, variables, *inputs, **apply_kwargs); got {got}")
    variables, inputs = args[0], args[1:]
    if "params" not in variables:
        raise CallFormError(f"from_jax: the variables of {name} have the collections {sorted(variables)} and no "
                            "'params'; pass what module.init returned (the whole {'params': ...} dict, as "
                            "module.apply takes it), not variables['params']")
    rngs = kwargs.pop("rngs", None)
    if rngs is not None and not isinstance(rngs, Mapping):
        raise CallFormError(f"from_jax: rngs={_what(rngs)} for {name}; module.apply takes a dict of keys by rng "
                            "stream: rngs={'dropout': jax.random.key(0)}")
    # apply returns (output, updated collections) exactly when some collection is mutable.
    returns_state = kwargs.get("mutable", False) is not False or bool(kwargs.get("capture_intermediates", False))

    def role_of(path, leaf):
        return _array_role(leaf, PARAM if _part(path[0]) == "params" else BUFFER)

    def invoke(tree, args, kw, keys, widen):
        streams = {s: keys[s] for s in rngs or ()}
        with _linen_float64() if widen else contextlib.nullcontext(), _linen_modules_seen():
            result = module.apply(tree, *args, rngs=streams or None, **kw)
        return result if returns_state else (result, {})

    def owners(names, seen):
        out = {}
        for leaf in names:
            scope = leaf.split("/")[1:-1]  # params/Dense_0/kernel: the collection, the scope, the variable
            for k in range(len(scope), 0, -1):
                if tuple(scope[:k]) in seen:
                    out[leaf] = ("/".join(scope[:k]), seen[tuple(scope[:k])])
                    break
        return out

    return _Framework("linen", name, form, variables, _slash, role_of, invoke, inputs, kwargs,
                      rngs=dict(rngs or {}), owners=owners,
                      classes=lambda seen: {"/".join(path): cls for path, cls in seen.items() if path})


def _nnx(module, args, kwargs) -> _Framework:
    from flax import nnx

    name = type(module).__name__
    _no_keywords(kwargs, f"the flax.nnx module {name}", "from_jax(module, *inputs)",
                 "an nnx module carries its own state and randomness; give other arguments positionally")
    split = lambda m: nnx.split(m, nnx.Param, nnx.BatchStat, nnx.RngKey, ...)
    graphdef, params, stats, keys, rest = split(module)
    # The mode (train()/eval(): deterministic, use_running_average) is static, in graphdef, as the module has it.
    # Its rng keys are the call's key input; its counters stay constants, so every call draws the same masks.
    tree = {"param": params, "batch": stats, "key": keys, "rest": rest}

    def role_of(path, leaf):
        group = _part(path[0])
        return KEY if group == "key" else _array_role(leaf, PARAM if group == "param" else BUFFER)

    def invoke(tree, args, kw, keys, widen):
        model = nnx.merge(graphdef, tree["param"], tree["batch"], tree["key"], tree["rest"])
        modules = [(path, node) for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Module)]
        if widen:
            for _, node in modules:
                _widen_attrs(node, list(vars(node)))
        with scopes.module_scopes({id(node): (node, "/".join(str(p) for p in path)) for path, node in modules}):
            out = model(*args, **kw)
        _, _, new_stats, _, new_rest = split(model)
        return out, {"batch": new_stats, "rest": new_rest}

    def modules():
        return {tuple(str(p) for p in path): type(node).__name__ for path, node in nnx.iter_graph(module)
                if isinstance(node, nnx.Module) and path}

    def owners(names, seen):
        modules_at = modules()
        out = {}
        for leaf in names:
            parts = tuple(leaf.split("/"))
            for k in range(len(parts) - 1, 0, -1):
                if parts[:k] in modules_at:
                    out[leaf] = ("/".join(parts[:k]), modules_at[parts[:k]])
                    break
        return out

    return _Framework("nnx", name, f"{name}(*inputs)", tree, lambda path: _slash(path[1:]), role_of, invoke, args,
                      owners=owners, classes=lambda seen: {"/".join(p): cls for p, cls in modules().items()})


def _equinox(module, args, kwargs) -> _Framework:
    import equinox as eqx

    name = type(module).__name__
    state, call = kwargs.pop("state", None), kwargs.pop("call", None)
    _no_keywords(kwargs, f"the equinox module {name}", "from_jax(module, *inputs, state=None, call=None)",
                 "pass other arguments through call=lambda model, state, x: model(x, ...)")
    if state is not None and not isinstance(state, eqx.nn.State):
        raise CallFormError(f"from_jax: state={_what(state)} for the equinox module {name}; equinox's state is "
                            "an eqx.nn.State, as model, state = eqx.nn.make_with_state(Model)(...) returns it")
    if call is not None and not callable(call):
        raise CallFormError(f"from_jax: call={_what(call)} for {name}; call is a function "
                            "call(model, state, *inputs) -> (output, new_state) | output")
    is_index = lambda x: isinstance(x, eqx.nn.StateIndex)
    indices = {leaf.marker: jax.tree_util.keystr(path)
               for path, leaf in jax.tree_util.tree_flatten_with_path(module, is_leaf=is_index)[0] if is_index(leaf)}
    if indices and state is None:
        raise CallFormError(f"from_jax: the equinox module {name} has stateful layers ({', '.join(indices.values())}) "
                            "and no state was given; pass state=state, as eqx.nn.make_with_state returns it")
    markers = _state_markers(state)
    form = ("call(model, state, *inputs)" if call is not None
            else f"{name}(*inputs)" if state is None else f"{name}(*inputs, state)")

    def name_of(path):
        if path[0].idx == 0:
            return jax.tree_util.keystr(path[1:])
        # A state entry is named where its StateIndex sits in the model: '.bn.ema_state_index[0]'.
        marker = markers[path[1].key]
        return indices.get(marker, str(marker)) + jax.tree_util.keystr(path[2:])

    def role_of(path, leaf):
        return _array_role(leaf, PARAM if path[0].idx == 0 else BUFFER)

    def invoke(tree, args, kw, keys, widen):
        model, st = tree
        if widen:
            for _, node in _equinox_paths(model, eqx.Module):
                _widen_attrs(node, [f.name for f in dataclasses.fields(node)])
        extra = {"key": keys["key"]} if "key" in keys else {}
        with scopes.module_scopes({id(node): (node, path) for path, node in _equinox_paths(model, eqx.Module)}):
            if call is not None:
                result = call(model, st, *args, **extra)
            else:
                result = model(*args, **extra) if st is None else model(*args, st, **extra)
        if st is not None and isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], eqx.nn.State):
            return result[0], (None, result[1])
        return result, (None, None)  # no state, or a call that returns its output alone: the state is unchanged

    def owners(names, seen):
        out = {}
        for path, leaf in jax.tree_util.tree_flatten_with_path(module, is_leaf=is_index)[0]:
            owner = _equinox_owner(module, path, eqx.Module)
            if owner is None:
                continue
            prefix = jax.tree_util.keystr(path)
            for leaf_name in names:  # the leaf itself, or a state entry its StateIndex names (.bn.ema_state_index[0])
                if leaf_name == prefix or (is_index(leaf) and leaf_name.startswith(prefix + "[")):
                    out[leaf_name] = owner
        return out

    return _Framework("equinox", name, form, (module, state), name_of, role_of, invoke, args,
                      is_leaf=is_index, takes_key=_takes_key(call if call is not None else module), owners=owners,
                      classes=lambda seen: {path: type(node).__name__ for path, node in _equinox_paths(module, eqx.Module)
                                            if path})


def _equinox_owner(root, path, module_type) -> tuple[str, str] | None:
    """The innermost equinox module (below the root) on the way to the leaf at ``path``: (its path, its class)."""
    obj, owner = root, None
    for j, k in enumerate(path[:-1]):
        if isinstance(k, jax.tree_util.GetAttrKey):
            obj = getattr(obj, k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            obj = obj[k.idx]
        elif isinstance(k, jax.tree_util.DictKey):
            obj = obj[k.key]
        else:  # a custom pytree's flattened index: no attribute to follow
            return owner
        if isinstance(obj, module_type):
            owner = (jax.tree_util.keystr(path[:j + 1]), type(obj).__name__)
    return owner


def _plain(fn, args, kwargs) -> _Framework:
    name = _qualname(fn)
    state = kwargs.pop("state", None)
    _no_keywords(kwargs, f"the function {name}", "from_jax(fn, params, *inputs, state=None)",
                 f"pass it positionally, or close over it: from_jax(lambda params, x: {name}(params, x, ...), ...)")
    if not args:
        raise CallFormError(f"from_jax: no params for the function {name}; call it as from_jax(fn, params, "
                            "*inputs), with fn(params, *inputs) -> output")
    params, inputs = args[0], args[1:]
    with_state = state is not None
    form = f"{name}(params, state, *inputs)" if with_state else f"{name}(params, *inputs)"

    def name_of(path):
        # state leaves read as the expression that reaches them: state['bn']['mean'], distinct from params'.
        return ("" if path[0].idx == 0 else "state") + jax.tree_util.keystr(path[1:])

    def role_of(path, leaf):
        if path[0].idx == 0 and isinstance(leaf, (float, complex)):
            raise CallFormError(f"from_jax: params{jax.tree_util.keystr(path[1:])} of {name} is the Python "
                                f"number {leaf!r}; make it an array to differentiate it (jnp.asarray({leaf!r})), "
                                "or close over it in fn to hold it fixed")
        return _array_role(leaf, PARAM if path[0].idx == 0 else BUFFER)

    def invoke(tree, args, kw, keys, widen):
        p, s = tree
        extra = {"key": keys["key"]} if "key" in keys else {}
        with scopes.haiku_scopes(haiku_classes):
            result = fn(p, *args, **extra) if not with_state else fn(p, s, *args, **extra)
        if not with_state:
            return result, (None, None)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise CallFormError(f"from_jax: with state= given, {form} must return (output, new_state); "
                                f"{name} returned {_what(result)}")
        old, new = jax.tree_util.tree_structure(s), jax.tree_util.tree_structure(result[1])
        if old != new:
            raise CallFormError(f"from_jax: {name}'s new_state has the structure {new}, its state {old}; "
                                "return the updated state in the structure it was given")
        return result[0], (None, result[1])

    haiku_classes: dict[str, str] = {}  # the haiku modules the function calls, if any (``scopes.haiku_scopes``)
    return _Framework("jax", name, form, (params, state), name_of, role_of, invoke, inputs,
                      takes_key=_takes_key(fn), classes=lambda seen: dict(haiku_classes))


_DESCRIBERS = {"jax": _plain, "linen": _linen, "nnx": _nnx, "equinox": _equinox}


# --- the Model: leaves laid out, keys, the pure call --------------------------------------------------


def _model(fw: _Framework, name: str, seed: int, dtype: str | None) -> Model:
    state, values = _lay_out(fw.tree, fw.name_of, fw.role_of, fw.is_leaf, f"of {_LABELS[fw.kind]} {fw.name}")
    inputs, given = _lay_out((fw.positional, fw.keywords), _input_name, _input_role, None, f"given to {fw.name}")
    input_names = tuple(inputs.names(INPUT))
    user_keys = {**values[KEY], **dict(fw.rngs), **given[KEY]}
    if fw.takes_key and not given[KEY]:
        user_keys["key"] = None  # the case's own key, from the seed
    streams = tuple(user_keys)
    key, impl = _key_data(user_keys, seed, fw.name)

    def run(params, buffers, constants, xs, key, widen):
        # jax arrays, as the user's own call has them (numpy values would meet frameworks' isinstance checks).
        params, buffers, constants, xs = jax.tree_util.tree_map(jnp.asarray, (params, buffers, constants, xs))
        keys = {s: jax.random.wrap_key_data(key[i], impl=impl) for i, s in enumerate(streams)}
        tree = state.join({PARAM: params, BUFFER: buffers, CONSTANT: constants, KEY: keys})
        args, kw = inputs.join({INPUT: dict(zip(input_names, xs)), KEY: keys})
        out, updates = fw.invoke(tree, args, kw, keys, widen)
        new = dict(buffers)
        for path, leaf in jax.tree_util.tree_flatten_with_path(updates)[0]:
            if fw.name_of(path) in new:  # a collection the call creates (sown intermediates) is not state
                new[fw.name_of(path)] = leaf
        return out, new

    params = values[PARAM]
    case_dtype = dtype or ("float64" if params and all(v.dtype == np.float64 for v in params.values()) else "float32")
    model = Model(fw.kind, name, params, values[BUFFER], values[CONSTANT], tuple(given[INPUT][n] for n in input_names),
                  input_names, (), key, streams, impl, seed, case_dtype, False, run)
    _LINEN_SEEN.append({})
    try:
        closed, shapes = _traced(fw.kind, fw.name, lambda: jax.make_jaxpr(model.call, return_shape=True)(*model.args()),
                                 fw.form)
    finally:
        seen = _LINEN_SEEN.pop()
    _no_leaked_tracers(closed, fw.kind, fw.name)
    outputs = tuple("output" + jax.tree_util.keystr(path) for path, leaf in jax.tree_util.tree_flatten_with_path(shapes[0])[0]
                    if jnp.issubdtype(leaf.dtype, jnp.inexact))
    layers = fw.owners([*model.params, *model.buffers], seen) if fw.owners is not None else {}
    classes = fw.classes(seen) if fw.classes is not None else {}
    return replace(model, output_names=outputs, root_class=fw.name, layers=layers, classes=classes)


@dataclass(frozen=True)
class _Layout:
    """Where each leaf of one pytree goes: ``(role, name)`` per leaf, and the STATIC leaves' values."""

    treedef: Any
    slots: tuple[tuple[str, str], ...]
    statics: tuple

    def names(self, role: str) -> list[str]:
        return [n for r, n in self.slots if r == role]

    def join(self, arrays: Mapping[str, Mapping[str, Any]]):
        """The user's structure again, each leaf taken by role and name from ``arrays``."""
        statics = iter(self.statics)
        return self.treedef.unflatten([next(statics) if role == STATIC else arrays[role][name]
                                       for role, name in self.slots])


def _lay_out(tree, name_of, role_of, is_leaf, what: str):
    """``(layout, values)``: the tree's leaves by role; ``values[role][name]`` a numpy copy (a key as given).

    ``what`` says whose leaves they are in messages: "of the function f", "given to f".
    """
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    slots, statics = [], []
    values = {role: {} for role in (PARAM, BUFFER, CONSTANT, KEY, INPUT)}
    for path, leaf in pairs:
        name = name_of(path)
        role = role_of(path, leaf)
        if role != KEY and _is_key(leaf):
            raise CallFormError(f"from_jax: {name} {what} is a jax random key; the case's randomness reaches "
                                "the model as its own input: give linen rngs={...}, give the key as an input, or let "
                                "the call take key= (equinox, plain jax)")
        slots.append((role, name))
        if role == STATIC:
            statics.append(leaf)
            continue
        if name in values[role]:
            raise CallFormError(f"from_jax: two leaves {what} are both named {name!r}; rename one")
        values[role][name] = leaf if role == KEY else _host(leaf, name, what)
    return _Layout(treedef, tuple(slots), tuple(statics)), values


def _array_role(leaf, floats: str) -> str:
    """``floats`` (PARAM or BUFFER) for a float array, CONSTANT for another array, STATIC for anything else."""
    if not isinstance(leaf, (np.ndarray, np.generic, jax.Array)):
        return STATIC
    if _is_key(leaf):
        return CONSTANT  # refused by _lay_out, by name
    return floats if jnp.issubdtype(leaf.dtype, jnp.inexact) else CONSTANT


def _input_role(path, leaf) -> str:
    if _is_key(leaf):
        return KEY  # the user's own key, given as an input: it stays theirs, and is a stream of the case
    if isinstance(leaf, (np.ndarray, np.generic, jax.Array)):
        return INPUT
    return STATIC


def _input_name(path) -> str:
    """``input.0``, ``input.1['mask']`` for positional inputs; ``input.train`` for a keyword."""
    return f"input.{_part(path[1])}" + jax.tree_util.keystr(path[2:])


def _host(leaf, name: str, what: str) -> np.ndarray:
    if isinstance(leaf, jax.core.Tracer):
        raise CallFormError(f"from_jax: {name} {what} is a traced value ({type(leaf).__name__}); from_jax was "
                            "called inside jax.jit, vmap or grad: call it outside any jax transformation, with "
                            "concrete arrays")
    return np.array(leaf, copy=True)


# --- randomness -------------------------------------------------------------------------------------------


def _is_key(leaf) -> bool:
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _key_data(keys: Mapping[str, Any], seed: int, name: str) -> tuple[np.ndarray, str]:
    """``(data, impl)``: one row of key data per stream; a stream given None gets its key from the seed."""
    impls, rows = set(), {}
    default = str(jax.config.jax_default_prng_impl)
    for stream, k in keys.items():
        if k is None:
            continue
        if _is_key(k):
            impl, data = str(jax.random.key_impl(k)), np.asarray(jax.random.key_data(k))
        else:  # a legacy raw key (jax.random.PRNGKey): data of the default implementation, as jax reads it
            impl, data = default, np.asarray(k)
            if data.dtype != np.uint32 or data.shape != _seed_keys(0, 1, default).shape[1:]:
                raise CallFormError(f"from_jax: the key for {stream!r} of {name} is {_what(k)}, not a jax key; give "
                                    "jax.random.key(n) (or a legacy jax.random.PRNGKey(n))")
        if data.ndim != _seed_keys(0, 1, impl).ndim - 1:
            raise CallFormError(f"from_jax: the key for {stream!r} of {name} is an array of {data.shape[:-1]} keys; "
                                "give one key per stream (split them inside the model)")
        impls.add(impl)
        rows[stream] = data
    if len(impls) > 1:
        raise CallFormError(f"from_jax: the keys of {name} mix the PRNG implementations {sorted(impls)}; give keys of one")
    impl = impls.pop() if impls else default
    drawn = _seed_keys(seed, len(keys), impl)
    data = [rows.get(s, drawn[i]) for i, s in enumerate(keys)]
    return (np.stack(data) if data else drawn).astype(np.uint32), impl


def _seed_keys(seed: int, n: int, impl: str) -> np.ndarray:
    return np.asarray(jax.random.key_data(jax.random.split(jax.random.key(seed, impl=impl), n)))


def _takes_key(fn) -> bool:
    """Whether ``fn`` declares a ``key`` argument (equinox's convention for a layer's randomness)."""
    try:
        parameter = inspect.signature(fn).parameters.get("key")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)


# --- float64 throughout -------------------------------------------------------------------------------------


def _wider(value):
    """float64 (complex128) for a narrower float (complex) dtype held as a dtype object; None for anything else."""
    if not isinstance(value, (type, np.dtype)):
        return None
    try:
        dt = np.dtype(value)
    except Exception:  # a class that is no dtype
        return None
    if jnp.issubdtype(dt, jnp.complexfloating):
        return jnp.complex128 if dt.itemsize < 16 else None
    if jnp.issubdtype(dt, jnp.floating):
        return jnp.float64 if dt.itemsize < 8 else None
    return None


def _dtype_named(name: str):
    """The dtype a string names (``"float32"``, ``"bfloat16"``), or the string itself when it names none."""
    try:
        return jnp.dtype(name)
    except TypeError:
        return name


def _widen_attrs(obj, names) -> None:
    """Set each of ``obj``'s attributes ``names`` that holds a narrower float dtype to float64 (complex128).

    Only on modules made for one call (a linen apply's, nnx's merge, equinox's unflattening): the user's own
    objects are never changed.
    """
    for attr in names:
        value = getattr(obj, attr, None)
        if isinstance(value, str) and "dtype" in attr:  # flax takes a dtype's name too (dtype="float32")
            value = _dtype_named(value)
        wider = _wider(value)
        if wider is not None:
            object.__setattr__(obj, attr, wider)  # linen and equinox modules are frozen dataclasses


_LINEN_SEEN: list[dict] = []  # while _model traces the call: each linen module apply makes, scope path -> class


@contextlib.contextmanager
def _linen_modules_seen():
    """While ``_model`` traces the call, every linen module the apply makes is noted by its scope path."""
    if not _LINEN_SEEN:
        yield
        return
    import flax.linen as nn

    seen = _LINEN_SEEN[-1]

    def interceptor(next_fun, args, kwargs, context):
        seen.setdefault(tuple(context.module.path), type(context.module).__name__)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        yield


@contextlib.contextmanager
def _linen_float64():
    """Every linen module made while this lasts holds its float dtype attributes at float64.

    flax makes an apply's modules during the apply (the root's clone, ``setup``'s and ``@nn.compact``'s
    submodules, ``nn.scan``'s lifted cells), so widening each one as it is made reaches all of them, and
    reaches what no method interceptor sees: ``OptimizedLSTMCell.initialize_carry`` is ``@nowrap`` and
    makes the carry in ``param_dtype``, which would meet float64 gates in ``nn.scan`` as float32.  Patched
    for the call alone: the user's own modules, and any apply outside the float64 run, are untouched.
    """
    import flax.linen as nn

    original = nn.Module.__post_init__

    def post_init(module):
        _widen_attrs(module, [f.name for f in dataclasses.fields(module)])
        original(module)

    nn.Module.__post_init__ = post_init
    try:
        yield
    finally:
        nn.Module.__post_init__ = original


def _equinox_paths(obj, module_type, path: str = ""):
    """``(path, module)`` for the equinox modules in ``obj``, outermost first, paths as ``jax.tree_util.keystr``
    writes them (``.layers[0]``; the root's is "")."""
    if isinstance(obj, module_type):
        yield path, obj
        for f in dataclasses.fields(obj):
            yield from _equinox_paths(getattr(obj, f.name, None), module_type, f"{path}.{f.name}")
    elif isinstance(obj, (list, tuple)):
        for k, x in enumerate(obj):
            yield from _equinox_paths(x, module_type, f"{path}[{k}]")
    elif isinstance(obj, dict):
        for k, x in obj.items():
            yield from _equinox_paths(x, module_type, f"{path}[{k!r}]")


def _cast(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    if np.issubdtype(x.dtype, np.complexfloating):
        return x.astype(np.result_type(dt, np.complex64))
    return x.astype(dt) if np.issubdtype(x.dtype, np.floating) else x


def _cast_all(arrays: Mapping[str, np.ndarray], dt: np.dtype) -> dict[str, np.ndarray]:
    return {k: _cast(v, dt) for k, v in arrays.items()}


def _case_dtype(dtype) -> str | None:
    if dtype is None:
        return None
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in ("float32", "float64"):
        raise CallFormError(f"from_jax: dtype={dtype!r}; the case dtype is 'float32' or 'float64'")
    return name


def _narrow(aval) -> bool:
    dt = getattr(aval, "dtype", None)
    if dt is None or jax.dtypes.issubdtype(dt, jax.dtypes.prng_key):
        return False
    return (jnp.issubdtype(dt, jnp.floating) and dt.itemsize < 8) or (jnp.issubdtype(dt, jnp.complexfloating)
                                                                      and dt.itemsize < 16)


def _equations(jaxpr, outer: str = ""):
    """``(equation, where)`` for every equation of ``jaxpr`` and of its sub-jaxprs.

    ``where`` is the user's line the equation comes from; one made inside a library function (jax.random's
    ``_uniform`` under flax's Dropout) has none of its own, and gets the line of the call that holds it.
    """
    from jax.extend.core import jaxprs_in_params

    for eqn in jaxpr.eqns:
        where = _source(eqn) or outer
        yield eqn, where
        for sub in jaxprs_in_params(eqn.params):
            yield from _equations(sub, where)


def _source(eqn) -> str:
    try:  # jax has no public accessor for an equation's user frame
        from jax._src import source_info_util

        return source_info_util.summarize(eqn.source_info)
    except Exception:
        return ""


# --- errors -------------------------------------------------------------------------------------------------


def _traced(kind: str, name: str, fn, form: str | None = None):
    """``fn()``, with any error from tracing the user's model turned into a TraceError with jax's reason."""
    try:
        return fn()
    except FromJaxError:
        raise
    except Exception as exc:
        raise TraceError(_trace_message(kind, name, form, exc)) from exc


def _reason(exc: Exception) -> str:
    """jax's first paragraph of ``exc``, at most 600 characters."""
    reason = str(exc).strip().split("\n\n")[0].strip()
    return reason if len(reason) <= 600 else reason[:600] + " ..."


def _trace_message(kind: str, name: str, form: str | None, exc: Exception) -> str:
    reason = _reason(exc)
    where = _user_frame(exc)
    if isinstance(exc, jax.errors.UnexpectedTracerError):
        fix = _LEAKED_FIX
    elif isinstance(exc, (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                          jax.errors.TracerIntegerConversionError, jax.errors.TracerArrayConversionError)):
        fix = ("the model turns a traced array into a Python value (an `if` on an array, int(x), np.asarray(x)); "
               "write the branch with jax.lax.cond or jnp.where, or close over the value as a Python constant")
    else:
        fix = f"the model fails when it is called as {form or 'the call form says'} at the example inputs; check that this call runs"
    return (f"from_jax: jax cannot trace {_LABELS[kind]} {name}: {type(exc).__name__}: {reason}"
            f"{f' (at {where})' if where else ''}; {fix}")


def float64_trace_message(kind: str, name: str, exc: Exception) -> str:
    """Why a model that traces as written (float32) does not trace in float64, and the way out."""
    cause = exc.__cause__ or exc
    reason, where = _reason(cause), _user_frame(cause)
    return (f"from_jax: {_LABELS[kind]} {name} traces as written, in float32, but jax cannot trace its float64 "
            f"version, which the check needs: {type(cause).__name__}: {reason}{f' (at {where})' if where else ''}; "
            "gradcheck makes it by widening the float32 parameters, inputs and dtype attributes to float64, and a "
            "value the model makes float32 itself (jnp.zeros(n, jnp.float32) as a lax.scan carry) then meets "
            "float64 ones: give that value the data's dtype (jnp.zeros(n, x.dtype))")


_LABELS = {"jax": "the function", "linen": "the flax.linen module", "nnx": "the flax.nnx module",
           "equinox": "the equinox module"}
_LEAKED_FIX = ("the model closes over a value traced by another jax transformation (a tracer that leaked out of "
               "jit, vmap, grad or scan); pass that value in as a parameter or an input, or compute it outside "
               "the transformation")


def _no_leaked_tracers(closed, kind: str, name: str) -> None:
    """Refuse a jaxpr with a tracer among its constants.

    ``make_jaxpr`` (and ``eval_shape``) accept a function that closes over a tracer leaked from a finished
    transformation, and make the dead tracer a constant of the jaxpr; only running it fails.  So the
    constants are looked at here, where the model's name is known, before anyone runs the jaxpr.
    """
    from jax.extend.core import ClosedJaxpr

    consts = list(closed.consts)
    for eqn, _ in _equations(closed.jaxpr):
        for value in eqn.params.values():
            for x in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(x, ClosedJaxpr):
                    consts += x.consts
    leaked = [c for c in consts if isinstance(c, jax.core.Tracer)]
    if leaked:
        raise TraceError(f"from_jax: {_LABELS[kind]} {name} closes over {len(leaked)} traced value(s) "
                         f"({type(leaked[0]).__name__} {leaked[0].aval.str_short()}), jax's UnexpectedTracerError "
                         f"when it runs; {_LEAKED_FIX}")


def _user_frame(exc: Exception) -> str:
    """The innermost frame of the error's traceback in the user's code, ``file:line in fn: code``; else ''."""
    libraries = _library_dirs()
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename != __file__ and not f.filename.startswith(libraries)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}"


def _library_dirs() -> tuple[str, ...]:
    """Where jax, flax, equinox, optax and the standard library live: frames there are not the user's code."""
    modules = [sys.modules.get(m) for m in ("jax", "jaxlib", "flax", "equinox", "optax")] + [contextlib]
    return tuple(os.path.dirname(m.__file__) + os.sep for m in modules if getattr(m, "__file__", None))


def _no_keywords(kwargs: Mapping, what: str, form: str, fix: str) -> None:
    if kwargs:
        got = ", ".join(f"{k}={_what(v)}" for k, v in kwargs.items())
        raise CallFormError(f"from_jax: {what} is called as {form} (and gradcheck's own name=, seed=, dtype=); "
                            f"got {got}: {fix}")


def _state_markers(state) -> list:
    """An ``eqx.nn.State``'s keys in its flattening order (its leaves carry only their position)."""
    if state is None:
        return []
    try:
        jax.tree_util.tree_flatten(state)
    except ValueError as exc:  # equinox refuses a state a call has already replaced with its new one
        raise CallFormError(f"from_jax: the eqx.nn.State given is an old one ({str(exc).splitlines()[0]}); pass "
                            "the state the last call returned, or a fresh one from eqx.nn.make_with_state") from None
    return list(state._state)  # what State.tree_flatten orders its values by; no public accessor


# --- small helpers ----------------------------------------------------------------------------------------


def _part(k) -> str:
    """One path entry as flax names it: a dict key, a sequence index, an attribute name."""
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _slash(path) -> str:
    """A flax path, ``params/Dense_0/kernel``; an nnx Variable's trailing ``.value`` is not part of its name."""
    parts = list(path)
    if parts and isinstance(parts[-1], jax.tree_util.GetAttrKey) and parts[-1].name == "value":
        parts = parts[:-1]
    return "/".join(_part(k) for k in parts)


def _qualname(fn) -> str:
    inner = getattr(fn, "func", None) or getattr(fn, "__wrapped__", None)  # functools.partial, jax.jit
    for f in (fn, inner):
        if getattr(f, "__qualname__", None):
            return f.__qualname__
    return type(fn).__name__


def _what(value) -> str:
    """A value as an error message shows it: an array by dtype and shape, anything else by type and repr."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a {type(value).__name__} {value.dtype}{list(value.shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"
