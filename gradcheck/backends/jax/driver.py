"""The JAX backend driver: ``jax.value_and_grad`` over the trainable leaves, jit-compiled and cached.

``f`` is turned into a pure function of (trainable leaf values, other leaf
values): it rebuilds the arguments around the given values, calls ``f`` and
returns the loss, with what ``f`` returned and the buffers after the call
(BatchNorm's running statistics) as auxiliary outputs.  Non-trainable arrays
(buffers, frozen params, integer token ids) are inputs too, so new values do
not recompile; static fields stay Python values, baked into the trace.

The compiled function is cached, keyed by the function object itself (as
``jax.jit`` keys it), the leaf paths, shapes and dtypes, the static structure
of the arguments (module types, static fields, training flags, frozen sets)
and, for a float32 run pinned to the float64 kinks, the ops and shapes of the
pinned calls; so timing a second call measures the computation and not the
compilation.  A cache must never change a result: what a function computes
cannot be read off its code and closed-over values (a closed-over helper's
own closure, a default argument, a global), so a new function object always
compiles anew.

One function object can still compute something else when what its trace
reads is rebound: an op implementation replaced (``jax_ops.linear``
monkeypatched with a wrong VJP), a jax function, a layer class's method.
The per-layer replay (``gradcheck.check.localise``) runs one function for every
layer, so a replay compiled before the change would be handed back after
it, computing the old op.  The key therefore holds the state of the
namespaces a trace reads (``_NamespaceStates``): the op dispatchers
(``gradcheck.ops``), the jax implementations and what they call
(``jax_ops``, ``kernels``, ``common``, ``jax.numpy``, ``jax.lax``,
``jax.nn``, ``jax.scipy.special``) and every layer class of the arguments,
each reduced to a token that changes whenever one of its attributes is
rebound (a check by identity over the attributes, a few microseconds).
Undoing the change gives the earlier token back, and its compiled entry.

jax is imported only when this backend is used; float64 is switched on then,
and jax's persistent compilation cache is set up (below).

The persistent compilation cache keeps what XLA compiled on disk, so a
later process compiles nothing it compiled before.  It sits under the cache
above: tracing and lowering still run every time (so every key above still
decides what is traced), and XLA's executable is looked up by jax's own key
of the lowered program itself (its StableHLO, the compile options, the jax
and jaxlib versions, the backend and XLA's flags).  A program that computes
anything else (another model configuration, dtype, kink decision, a
monkeypatched op) lowers to another program and is compiled afresh; a
cached executable is only ever handed back for the identical program.  It
is on by default, in a per-user folder (:func:`default_cache_folder`);
:func:`cache_choice` says where the folder comes from:

1. the ``cache_dir`` setting (``gradcheck run --cache-dir DIR`` or
   ``--no-cache``, ``cache_dir`` in ``[tool.gradcheck]``), given to
   :func:`use_compile_cache`;
2. ``GRADCHECK_NO_CACHE=1`` or ``GRADCHECK_CACHE_DIR=DIR`` in the environment;
3. jax's own configuration, when the user has one (``JAX_COMPILATION_CACHE_DIR``,
   ``jax.config.update("jax_compilation_cache_dir", ...)`` or the cache
   switched off in jax): left as it is;
4. the per-user folder.

The setting and the environment are read in ``gradcheck.cache``, which
also places ``from_torch``'s capture cache in the folder's ``torch-export``
subfolder (jax reads and evicts only its own top-level ``*-cache`` files).

The cache is jax's, so it serves every jit compilation of the process, not
only gradcheck's.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import inspect
import operator
import os
import sys
import tempfile
import types
import warnings
import weakref
from dataclasses import dataclass

import numpy as np

from gradcheck import cache as gradcheck_cache
from gradcheck.backends import backend_of
from gradcheck.backends.base import (
    Backend,
    Evaluation,
    all_leaves,
    arg_prefixes,
    map_output,
    program_data,
    split_output,
)
from gradcheck.check import kinks
from gradcheck.module import BUFFER, CHILD, PARAM, Module
from gradcheck.tree import map_leaves

# Stands in for every array leaf in the argument skeleton a compiled function
# keeps: the cache must not hold the first call's parameters alive.
_PLACEHOLDER = np.zeros(0)


_configured = False


def configure_jax():
    """Enable float64 and exact matmuls, once; float32 inputs still compute in float32."""
    global _configured
    import jax

    if not _configured:
        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_default_matmul_precision", "highest")
        _apply_compile_cache(jax)
        _configured = True
    return jax


# ---------------------------------------------------------------- the persistent compilation cache
CACHE_DIR_ENV, NO_CACHE_ENV = gradcheck_cache.CACHE_DIR_ENV, gradcheck_cache.NO_CACHE_ENV
JAX_CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"
JAX_ENABLE_ENV = "JAX_ENABLE_COMPILATION_CACHE"
_FALSE_WORDS = gradcheck_cache.FALSE_WORDS

# jax's options for its persistent cache, and their defaults in jax.
_JAX_DIR, _JAX_ENABLE = "jax_compilation_cache_dir", "jax_enable_compilation_cache"
_JAX_MIN_TIME, _JAX_MIN_SIZE = "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes"
_JAX_OPTIONS = (_JAX_DIR, _JAX_ENABLE, _JAX_MIN_TIME, _JAX_MIN_SIZE)
_JAX_DEFAULT_MIN_TIME, _JAX_DEFAULT_MIN_SIZE = 1.0, 0


class CacheWarning(UserWarning):
    """The compilation cache's folder cannot be used; jax compiles without it."""


@dataclass(frozen=True)
class CacheChoice:
    """Where jax's persistent compilation cache is, and what chose it."""

    folder: str | None  # None: no persistent cache, or jax's own configuration (source "jax")
    source: str  # the setting as spelled (--cache-dir), an environment variable, "jax" or "default"

    @property
    def gradcheck(self) -> bool:
        """Whether gradcheck sets the cache up (jax's own configuration is left as the user made it)."""
        return self.source != "jax"


_jax_own: dict | None = None  # jax's cache options as found before gradcheck first changed them


def default_cache_folder() -> str:
    """The per-user folder (``gradcheck.cache.default_folder``: ``~/.cache/gradcheck/jax`` on Linux)."""
    return gradcheck_cache.default_folder()


def use_compile_cache(setting: str | bool | None, where: str = "cache_dir") -> CacheChoice:
    """Take the ``cache_dir`` setting (a folder, ``False`` for none, ``None`` for unset), spelled ``where``.

    The setting is ``gradcheck.cache``'s, so it also places (or turns off)
    ``from_torch``'s capture cache.  Applied at once if jax is already set
    up, otherwise before its first compilation; returns the resulting
    :func:`cache_choice`.
    """
    gradcheck_cache.use(setting, where)
    if _configured:
        _apply_compile_cache(sys.modules["jax"])
    return cache_choice()


_GIVEN = object()  # cache_choice's default: the setting given to use_compile_cache


def cache_choice(setting=_GIVEN, where: str = "cache_dir") -> CacheChoice:
    """Where the persistent cache is: the setting, the environment, jax's own configuration, the default.

    ``setting`` defaults to the one given to :func:`use_compile_cache`;
    another one is resolved without being applied (to check it first).
    """
    if setting is _GIVEN:
        setting, where = gradcheck_cache.given()
    chosen = gradcheck_cache.choose(setting, where)
    if chosen is not None:
        return CacheChoice(chosen.folder, chosen.source)
    own = _jax_own_options()
    if own[_JAX_DIR] or not own[_JAX_ENABLE]:
        return CacheChoice(own[_JAX_DIR] if own[_JAX_ENABLE] else None, "jax")
    return CacheChoice(default_cache_folder(), "default")


def _jax_own_options() -> dict:
    """jax's cache options as the user left them: before gradcheck changed them, or jax's environment."""
    if _jax_own is not None:
        return _jax_own
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "config"):
        return {name: getattr(jax.config, name) for name in _JAX_OPTIONS}
    return {_JAX_DIR: os.environ.get(JAX_CACHE_DIR_ENV) or None,
            _JAX_ENABLE: os.environ.get(JAX_ENABLE_ENV, "true").strip().lower() not in _FALSE_WORDS,
            _JAX_MIN_TIME: _JAX_DEFAULT_MIN_TIME, _JAX_MIN_SIZE: _JAX_DEFAULT_MIN_SIZE}


def _apply_compile_cache(jax) -> None:
    """Set jax's cache options to :func:`cache_choice`'s (jax's own when the choice is theirs)."""
    global _jax_own
    now = {name: getattr(jax.config, name) for name in _JAX_OPTIONS}
    if _jax_own is None:
        _jax_own = dict(now)
    choice = cache_choice()
    want = dict(_jax_own)
    if choice.gradcheck:
        folder = choice.folder if choice.folder is None or _usable(choice) else None
        want[_JAX_DIR], want[_JAX_ENABLE] = folder, folder is not None
        if folder is not None:
            # By default jax stores only programs that took a second or more to compile; a small layer's
            # programs compile quicker, and a suite of them adds up.  A threshold the user set is kept.
            if want[_JAX_MIN_TIME] == _JAX_DEFAULT_MIN_TIME:
                want[_JAX_MIN_TIME] = 0.0
            if want[_JAX_MIN_SIZE] == _JAX_DEFAULT_MIN_SIZE:
                want[_JAX_MIN_SIZE] = -1  # no size threshold, and none put in by jax either
    if want == now:
        return
    for name in _JAX_OPTIONS:
        if want[name] != now[name]:
            jax.config.update(name, want[name])
    # jax opens its cache once, at the first compilation that asks for it: reopen it where it now is.
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()


def _usable(choice: CacheChoice) -> bool:
    """Whether the folder can be made and written in; if not, a warning saying so and how to fix it."""
    try:
        os.makedirs(choice.folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".gradcheck-probe.", dir=choice.folder)
        os.close(fd)
        os.unlink(probe)
        return True
    except OSError as exc:
        said = "the default folder" if choice.source == "default" else choice.source
        warnings.warn(CacheWarning(
            f"jax's compilation cache: {said} {choice.folder} cannot be written ({exc.strerror or exc}); jax "
            f"compiles without it. Give a writable folder (--cache-dir DIR, cache_dir in [tool.gradcheck] or "
            f"{CACHE_DIR_ENV}=DIR), or turn the cache off (--no-cache or {NO_CACHE_ENV}=1)"), stacklevel=3)
        return False


class JaxBackend(Backend):
    name = "jax"
    module = "jax"
    install_hint = "install it with `pip install jax` (or `pip install 'gradcheck[jax]'`)"
    compiles = True
    cache_size = 64  # compiled functions kept (least recently used are dropped)

    def __init__(self):
        self._compiled: collections.OrderedDict = collections.OrderedDict()
        self.traces = 0  # times f was traced or run eagerly (tests count recompilations)
        self._pending: set = set()  # compilations prepare started that have not finished

    def busy(self) -> bool:
        return bool(self._pending)

    def evaluate(self, f, args, prefixes=None, jit=True) -> Evaluation:
        self.require()
        jax, prefixes, leaves, train, other, train_vals, other_vals, nested, pin, pin_vals, pin_spec = \
            self._inputs(f, args, prefixes)
        run, rebuild_cell = self._compiled_run(jax, f, args, prefixes, leaves, train, other, jit and not nested,
                                               pin_spec)
        with kinks.suspended():
            (loss, (arrays, buffers, crossed)), grads = run(train_vals, other_vals, pin_vals, pin)
        if pin is not None:
            pin.crossed = [np.asarray(c) for c in crossed]
        keep = (lambda x: x) if nested else _numpy
        return Evaluation(
            value=rebuild_cell["value"]([keep(a) for a in arrays]),
            grads={leaf.path: keep(g) for leaf, g in zip(train, grads, strict=True)},
            buffers={path: keep(b) for path, b in buffers.items()},
            leaves=leaves,
        )

    def prepare(self, f, args, prefixes=None) -> bool:
        """Trace and lower ``f`` at ``args`` now, and compile it on a background thread.

        The ``evaluate`` of the same call that follows finds the program compiled,
        or waits for it.  XLA compiles in C++ without the GIL, so the eager
        backends run meanwhile; tracing stays on the calling thread, because the
        op interceptors (kinks, cost, module calls) are process-wide and a trace
        must not interleave with another backend's forward.  Under the same
        pinned kinks (``gradcheck.check.kinks.pinned``) as the call it prepares.
        Returns whether a compilation was started: a call that cannot be
        prepared (nested in a jax transformation, already compiled, or failing
        to trace) is left to ``evaluate``, which raises what it raises.
        """
        if not self.available()[0]:
            return False
        jax, prefixes, leaves, train, other, train_vals, other_vals, nested, pin, pin_vals, pin_spec = \
            self._inputs(f, args, prefixes)
        if nested:
            return False
        key = _cache_key(f, args, prefixes, leaves, train, pin_spec)
        if key is None or key in self._compiled:
            return False
        try:
            jitted, rebuild_cell = self._jitted(jax, f, args, prefixes, train, other)
            lowered = jitted.lower(train_vals, other_vals, pin_vals, _Static(pin))
        except Exception:  # evaluate traces again and reports it as the case's error
            return False
        compiling = _compile_pool().submit(lowered.compile)
        self._pending.add(compiling)
        compiling.add_done_callback(self._pending.discard)

        def run(train_vals, other_vals, pin_vals, pin):
            return compiling.result()(train_vals, other_vals, pin_vals)

        self._remember(key, (run, rebuild_cell))
        return True

    def _inputs(self, f, args, prefixes):
        """What a call hands the compiled function: the leaves as jax values, and the pinned kinks' decisions."""
        jax = configure_jax()
        prefixes = arg_prefixes(args, prefixes)
        leaves = all_leaves(args, prefixes)
        train = [leaf for leaf in leaves if leaf.trainable]
        other = [leaf for leaf in leaves if not leaf.trainable]
        train_vals = tuple(_to_jax(jax, leaf) for leaf in train)
        other_vals = tuple(_to_jax(jax, leaf) for leaf in other)
        # Called inside an outer jax transformation: stay traced, return jax values.
        nested = any(isinstance(v, jax.core.Tracer) for v in train_vals + other_vals)
        # The arrays f declares (its cotangents, ``program_data``) follow the other leaves as inputs of the
        # program, so that it is the same program whatever their values (``_pure`` splits them off again).
        data = program_data(f)
        if data is not None and not nested:
            other_vals += tuple(jax.device_put(np.asarray(a)) for a in data[0])
        # A float32 run pinned to the float64 reference's kinks (gradcheck.check.kinks): the decisions are inputs
        # of the compiled function, not constants baked into it, and the crossings come back as outputs.
        state = kinks.active()
        pin = state if state is not None and state.mode == "pin" and not nested else None
        decisions = kinks.decision_arrays(pin.recording) if pin else []
        pin_vals = tuple(jax.device_put(d) for d in decisions)
        pin_spec = tuple((b.op, b.shape, d.shape, str(d.dtype)) for b, d in zip(pin.recording.branches, decisions)
                         ) if pin else None
        return jax, prefixes, leaves, train, other, train_vals, other_vals, nested, pin, pin_vals, pin_spec

    # -- compilation and its cache -------------------------------------------
    def _compiled_run(self, jax, f, args, prefixes, leaves, train, other, jit, pin_spec=None):
        key = _cache_key(f, args, prefixes, leaves, train, pin_spec) if jit else None
        if key is not None and key in self._compiled:
            self._compiled.move_to_end(key)
            return self._compiled[key]
        if jit:
            compiled, rebuild_cell = self._jitted(jax, f, args, prefixes, train, other)

            def run(train_vals, other_vals, pin_vals, pin):
                return compiled(train_vals, other_vals, pin_vals, _Static(pin))
        else:
            run, rebuild_cell = self._grad_run(jax, f, args, prefixes, train, other)
        entry = (run, rebuild_cell)
        if key is not None:
            self._remember(key, entry)
        return entry

    def _remember(self, key, entry) -> None:
        self._compiled[key] = entry
        while len(self._compiled) > self.cache_size:
            self._compiled.popitem(last=False)

    def _jitted(self, jax, f, args, prefixes, train, other):
        """``jax.jit`` of the value-and-gradient function; the pin state is Python bookkeeping read while tracing:
        static, and not part of the key (its decisions are the traced pin_vals; their ops and shapes are)."""
        grad_run, rebuild_cell = self._grad_run(jax, f, args, prefixes, train, other)
        return jax.jit(lambda t, o, p, pin_box: grad_run(t, o, p, pin_box.state), static_argnums=3), rebuild_cell

    def _grad_run(self, jax, f, args, prefixes, train, other):
        skeleton = [map_leaves(a, lambda path, v, kind: _PLACEHOLDER, p) for a, p in zip(args, prefixes, strict=True)]
        rebuild_cell: dict = {}
        pure = self._pure(f, skeleton, prefixes, [leaf.path for leaf in train], [leaf.path for leaf in other],
                          rebuild_cell)
        if train:
            return jax.value_and_grad(pure, argnums=0, has_aux=True), rebuild_cell

        def grad_run(train_vals, other_vals, pin_vals, pin):  # nothing to differentiate (every leaf frozen or integer)
            return pure(train_vals, other_vals, pin_vals, pin), ()

        return grad_run, rebuild_cell

    def _pure(self, f, skeleton, prefixes, train_paths, other_paths, rebuild_cell):
        data, n_other = program_data(f), len(other_paths)

        def pure(train_vals, other_vals, pin_vals, pin):
            self.traces += 1
            # What follows the leaves is f's declared arrays (``_inputs``): f is made around them, traced.
            other_vals, given = other_vals[:n_other], other_vals[n_other:]
            f_now = data[1](list(given)) if given else f
            values = dict(zip(other_paths, other_vals, strict=True))
            values.update(zip(train_paths, train_vals, strict=True))
            targs = [map_leaves(s, lambda path, v, kind: values[path], p) for s, p in zip(skeleton, prefixes, strict=True)]
            if pin is None:
                loss, value = split_output(f_now(*targs))
                crossed = []
            else:
                with kinks.resumed(pin), kinks.decisions_as(pin, pin_vals) as state:
                    loss, value = split_output(f_now(*targs))
                    crossed = list(state.crossed)
            arrays, rebuild_cell["value"] = _split_arrays(value)
            buffers = {leaf.path: leaf.value for leaf in all_leaves(targs, prefixes) if leaf.kind == "buffer"}
            return _scalar_loss(loss), (arrays, buffers, crossed)

        return pure


_pool = None


def _compile_pool():
    """One background thread for the compilations ``prepare`` starts: XLA already spreads one compilation over
    the cores, so two at once only contend (measured: float32 and float64 ResNet-18 together took as long as one
    after the other)."""
    global _pool
    if _pool is None:
        import concurrent.futures

        _pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradcheck-jax-compile")
    return _pool


def finish_compilations() -> None:
    """Wait for the compilations ``prepare`` started (each writes jax's persistent cache when it ends) and stop
    their thread: what the end of the process needs (``gradcheck.app.finish``)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None


def _numpy(x):
    # The result's own buffer, read-only, not a copy: a copy of every gradient costs a pass over fresh memory per
    # call (about 0.1 s a call for ResNet-18's 11.7 M float64 values), and nothing writes into what a backend
    # returned (tests/test_crosscheck.py runs a case with every backend's results made read-only).
    return np.asarray(x)


def _to_jax(jax, leaf):
    """A leaf value as a jax array (any backend's array is accepted, as numpy in between)."""
    from gradcheck import ops

    value = leaf.value
    if backend_of(value) != "jax":
        value = np.asarray(ops.to_numpy(value))
        if value.dtype.kind not in "biufc":
            raise TypeError(
                f"{leaf.path}: a {value.dtype} array cannot be passed to jax; array leaves must be "
                "numeric (make it a static field if it is configuration)"
            )
    # device_put copies without compiling anything; jnp.asarray compiles a small
    # program per new shape (0.4 s over ResNet-18's leaves).
    return value if backend_of(value) == "jax" else jax.device_put(value)


def _scalar_loss(loss):
    import jax.numpy as jnp

    if backend_of(loss) != "jax":
        raise TypeError(
            f"the function returned a {type(loss).__name__} as its loss, not a jax array; it must "
            "compute its loss from its arguments with gradcheck.ops (or return a tuple whose first "
            "element is that loss)"
        )
    if loss.size != 1:
        raise ValueError(
            f"the loss has shape {tuple(loss.shape)}; it must be a scalar "
            "(reduce it first, e.g. ops.sum(ops.mul(output, cotangent)))"
        )
    if not jnp.issubdtype(loss.dtype, jnp.floating):
        raise TypeError(
            f"the loss has dtype {loss.dtype}; only a float loss can be differentiated "
            "(comparisons and integer results are constants)"
        )
    return jnp.reshape(loss, ())


class _Slot:
    """Marks where an array sat in f's output, so the output can be rebuilt outside jit."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


def _split_arrays(value):
    """(arrays in ``value``, a function rebuilding ``value`` from new arrays).

    Only arrays can leave a compiled function; everything else f returned
    (ints, strings, None) is kept here and put back around them.
    """
    arrays = []

    def take(v):
        if backend_of(v) in ("jax", "numpy") and hasattr(v, "shape"):
            arrays.append(v)
            return _Slot(len(arrays) - 1)
        return v

    skeleton = map_output(value, take)

    def rebuild(new_arrays):
        return map_output(skeleton, lambda v: new_arrays[v.index] if isinstance(v, _Slot) else v)

    return arrays, rebuild


# ---------------------------------------------------------------- cache keys
class _Uncacheable(Exception):
    """A value whose equality cannot be established cheaply; the call compiles afresh."""


_MAX_DEPTH = 64


class _Static:
    """The pin state as a static argument of ``jax.jit``: hashed by identity of nothing (all equal).

    What the trace reads from it (op names and shapes) is in the cache key already.
    """

    __slots__ = ("state",)

    def __init__(self, state):
        self.state = state

    def __hash__(self):
        return 0

    def __eq__(self, other):
        return isinstance(other, _Static)


def _cache_key(f, args, prefixes, leaves, train, pin_spec=None):
    try:
        spec = tuple((leaf.path, leaf.kind, tuple(leaf.value.shape), str(leaf.value.dtype)) for leaf in leaves)
        classes: dict[type, None] = {}
        structure = tuple(_walked_signature(a, 0, classes) for a in args)
        key = (_function_key(f), tuple(prefixes), spec, tuple(leaf.path for leaf in train), structure, pin_spec,
               _namespace_state(classes))
        hash(key)
    except (_Uncacheable, TypeError):
        return None
    return key


class _NamespaceStates:
    """Each namespace's attributes (a module's, a class's) as a token: equal tokens, identical attributes.

    A namespace's states are kept with their attribute values (so no id can
    be reused while a state is known) and matched by identity, the most
    recent first; a state not seen before gets a new token, one seen before
    (a monkeypatch undone) its old one.  Tokens are never reused.  A
    namespace is held weakly: a class made for one test goes with its states.
    """

    keep = 8  # states remembered per namespace (older ones only cost a recompilation)

    def __init__(self):
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # namespace -> [(keys, values, token)]
        self._next = 0

    def token(self, namespace) -> int:
        attrs = vars(namespace)
        keys, values = list(attrs), list(attrs.values())
        known = self._states.setdefault(namespace, [])
        for i, (k, v, token) in enumerate(known):
            if len(v) == len(values) and all(map(operator.is_, v, values)) and k == keys:
                if i:
                    known.insert(0, known.pop(i))
                return token
        self._next += 1
        known.insert(0, (keys, values, self._next))
        del known[self.keep:]
        return self._next


_STATES = _NamespaceStates()
_OP_NAMESPACES: list = []


def _op_namespaces() -> list:
    """The modules a jax trace of gradcheck ops reads its functions from."""
    if not _OP_NAMESPACES:
        import jax.lax
        import jax.nn
        import jax.numpy
        import jax.scipy.special

        from gradcheck import ops
        from gradcheck.backends import ops_module
        from gradcheck.backends.numpy import kernels
        from gradcheck.ops import rules as common

        _OP_NAMESPACES.extend([ops, ops_module("jax"), kernels, common, jax.numpy, jax.lax, jax.nn,
                               jax.scipy.special])
    return _OP_NAMESPACES


def _namespace_state(classes) -> tuple:
    """The tokens of the op namespaces and of the layer classes (with their bases) a trace reads."""
    spaces = list(_op_namespaces())
    seen = set()
    for cls in classes:
        for c in cls.__mro__:
            if c is not object and c not in seen:
                seen.add(c)
                spaces.append(c)
    return tuple(_STATES.token(ns) for ns in spaces)


def _walked_signature(x, depth, classes):
    """Signature of a part of the arguments that map_leaves walks: arrays there are leaves.

    ``classes`` collects the layer classes met (their methods are what the trace runs).
    """
    _deeper(depth)
    if isinstance(x, Module):
        classes[type(x)] = None
        kinds = {name: kind for name, kind, _ in x.field_kinds()}
        items = []
        for name, value in sorted(vars(x).items()):
            kind = kinds.get(name)
            if kind in (PARAM, BUFFER):
                sig = None if value is None else "<leaf>"  # shape and dtype are in the leaf spec
            elif kind == CHILD:
                sig = _walked_signature(value, depth + 1, classes)
            else:
                sig = _static_signature(value, depth + 1)
            items.append((name, sig))
        return (type(x), tuple(items))
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_walked_signature(v, depth + 1, classes) for v in x))
    if isinstance(x, dict):
        return (dict, tuple((k, _walked_signature(v, depth + 1, classes)) for k, v in x.items()))
    if _is_array(x):
        return "<leaf>"
    return _static_signature(x, depth + 1)


def _static_signature(x, depth):
    """Signature of a value baked into the trace: arrays here are constants, compared by content."""
    _deeper(depth)
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes, type, np.dtype)):
        return (type(x), x)
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_static_signature(v, depth + 1) for v in x))
    if isinstance(x, dict):
        return (dict, tuple((_static_signature(k, depth + 1), _static_signature(v, depth + 1)) for k, v in x.items()))
    if isinstance(x, (set, frozenset)):
        return (frozenset, frozenset(_static_signature(v, depth + 1) for v in x))
    if isinstance(x, slice):  # unhashable before Python 3.12
        return (slice, _static_signature((x.start, x.stop, x.step), depth + 1))
    if isinstance(x, Module):
        return (type(x), tuple((k, _static_signature(v, depth + 1)) for k, v in sorted(vars(x).items())))
    if _is_array(x):
        return _array_content(x)
    if isinstance(x, functools.partial):  # a partial made once per layer: its function by identity
        return (functools.partial, _Identity(x.func), _static_signature(x.args, depth + 1),
                _static_signature(x.keywords, depth + 1))
    if inspect.ismethod(x):
        return ("method", _Identity(x.__func__), _static_signature(x.__self__, depth + 1))
    try:
        hash(x)  # functions and plain objects: by identity (the key keeps them alive)
    except TypeError:
        raise _Uncacheable(type(x).__name__) from None
    return (type(x), x)


def _function_key(f, depth=0):
    """``f`` by identity, as ``jax.jit`` keys it, and what it closes over by value.

    Identity, because what a function computes cannot be read off its code
    and closed-over values alone (a closed-over helper's own closure, a
    default argument); the values too, because a closed-over name rebound
    (a new scale, a list changed in place) changes what the same function
    object computes.  Closed-over functions are keyed the same way, a few
    levels deep.  Module-level globals are read when first traced, as
    ``jax.jit`` does.
    """
    _deeper(depth)
    if isinstance(f, functools.partial):
        return (functools.partial, _function_key(f.func, depth + 1), _static_signature(f.args, depth + 1),
                _static_signature(f.keywords, depth + 1))
    if inspect.ismethod(f):
        return ("method", _function_key(f.__func__, depth + 1), _static_signature(f.__self__, depth + 1))
    if not isinstance(f, types.FunctionType):
        return _static_signature(f, depth + 1)
    if depth > _FUNCTION_DEPTH:
        return _Identity(f)

    def value(x):
        if isinstance(x, (types.FunctionType, functools.partial, types.MethodType)):
            return _function_key(x, depth + 1)
        return _static_signature(x, depth + 1)

    cells = []
    for cell in f.__closure__ or ():
        try:
            cells.append(value(cell.cell_contents))
        except ValueError:  # a cell not yet assigned
            cells.append("<empty>")
    defaults = tuple(value(v) for v in f.__defaults__ or ())
    kwdefaults = tuple((k, value(v)) for k, v in (f.__kwdefaults__ or {}).items())
    return ("function", _Identity(f), tuple(cells), defaults, kwdefaults)


_FUNCTION_DEPTH = 3


class _Identity:
    """Compares by identity and keeps the object alive, so its id cannot be reused."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.obj is self.obj


def _array_content(x):
    if backend_of(x) == "jax" and _is_tracer(x):
        raise _Uncacheable("traced constant")
    a = np.ascontiguousarray(np.asarray(x))
    if a.dtype.kind not in "biufc":
        raise _Uncacheable(f"{a.dtype} array")
    return ("array", a.shape, str(a.dtype), hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest())


def _is_tracer(x):
    import jax

    return isinstance(x, jax.core.Tracer)


def _is_array(x):
    return not isinstance(x, (bool, int, float, complex)) and backend_of(x) is not None


def _deeper(depth):
    if depth > _MAX_DEPTH:  # a cycle or a very deep structure: not worth a key
        raise _Uncacheable("too deep")
