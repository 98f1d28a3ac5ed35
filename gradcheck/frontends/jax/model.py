"""The gradcheck Module standing for a jax model: its leaves by the framework's names, one call that dispatches.

``JaxModel`` holds every parameter (a ``param`` leaf) and every buffer (linen's mutable collections, nnx
``BatchStat``, equinox ``State``, plain jax ``state``) under the name the framework gives it
(``params/Dense_0/kernel``, ``linear1/kernel``, ``.layers[0].weight``, ``['encoder']['w']``), so the
runner, the reports and tolerance rules see the framework's names.  Where the framework names the layer that
owns a leaf (flax's and equinox's module classes), the leaf sits in an inline child of that class: paths stay
the framework's, and a tolerance rule ``layer = "BatchNorm"`` reaches it.

Calling it dispatches on what its leaves hold:

* jax arrays or tracers (the jax backend): the user's own model (``frameworks.Model.call``), which jax
  differentiates with its own rules, the user's ``custom_jvp`` and ``custom_vjp`` among them; a float32 run
  pinned to the float64 reference's kinks, the float32 jaxpr by jax's own primitives and the user's rules, its
  kinks through gradcheck.ops where the pin reaches them (``interpreter.run_pinned``);
* tape tensors and torch tensors: the model's jaxpr, each primitive lowered to ``gradcheck.ops``
  (``interpreter.run``), traced once per run dtype (float64 with every float dtype widened, float32 as the
  user wrote it);
* numpy arrays (the reference forward, the referee): the float64 jaxpr on numpy, once every equation's
  lowering has been checked against jax's primitive (``interpreter.verify``) and the whole jaxpr's forward
  against the model's own; where it cannot be run so, jax's own forward of the model, in float64.

The key-dependent part of each jaxpr (dropout masks, ``jax.random`` draws) is evaluated once by jax from the
case's keys (``interpreter.evaluate_constants``), and the tape and torch get its values as constants: every
backend sees the masks the user's own call draws.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from gradcheck.backends.base import BackendUnavailable
from gradcheck.check import conditioning
from gradcheck.check.tolerance import ToleranceRules
from gradcheck.frontends.jax import frameworks as fw
from gradcheck.frontends.jax import interpreter
from gradcheck.frontends.jax.primitives import LoweringError
from gradcheck.module import Module, node_class, static
from gradcheck.ops import BackendOpMissing
from gradcheck.tree import leaves_with_paths

_RESERVED = frozenset(dir(Module)) | {"training", "_frozen", "_program"}


class UnsupportedPrimitive(BackendOpMissing, BackendUnavailable):
    """The jaxpr has a primitive, or a form of one, the tape and torch cannot run: they are unavailable for
    the case.  jax, which runs the user's own function, still runs, and so does the referee (on jax's own
    float64 forward)."""


class JaxModel(Module):
    """The root: a jax model as a gradcheck Module (made by ``gradcheck.from_jax``)."""

    _program: object = static()

    def __init__(self):
        raise TypeError("a JaxModel is made by gradcheck.from_jax(model, ...), not directly")

    def __call__(self, *inputs):
        return self._program.call(self, inputs)

    def record_calls(self, cr) -> tuple[list, list[str]]:
        """Each call of a custom rule (``custom_vjp``, ``custom_jvp``) as a replay unit (``gradcheck.check.localise``)."""
        from gradcheck.frontends.jax import units

        return units.record(self._program, cr)


class JaxLayer(Module):
    """The leaves one framework module owns, inline (their paths are the framework's names alone)."""

    def __init__(self):
        raise TypeError("a JaxLayer is a part of a jax model's tree, made by gradcheck.from_jax")

    def __call__(self, *inputs):
        raise TypeError(f"{type(self).__name__} holds leaves of a jax model; call the root (the case's model)")


@dataclass
class Traced:
    """One run dtype's jaxpr of the model's call, and what every run of it is handed alike."""

    closed: object  # the ClosedJaxpr; its invars are tree_leaves((params, buffers, inputs, key))
    out_tree: object  # the treedef of (output, new_buffers)
    floats: tuple[int, ...]  # which leaves of the output are float (the loss's outputs, in order)
    known: dict  # interpreter.evaluate_constants: the key-dependent part's values (the dropout masks)


class Program:
    """Everything one ``from_jax`` call holds: the described model, its jaxprs per run dtype, their check."""

    def __init__(self, model: fw.Model):
        self.model = model
        self._models: dict[str, fw.Model] = {}
        self._traced: dict[str, Traced] = {}
        self._forwards: dict[str, object] = {}  # run dtype -> the model's own call, compiled
        self.problems: dict[str, str] = {}  # equation -> why the tape and torch cannot run it
        self.unfaithful = ""  # why the float64 jaxpr's forward differs from the model's own, or ""
        self.verified = False
        self._watch = None  # (site, i, eqn, invals, outs) -> outs, while a replay records or probes (``watching``)
        self._calls: dict[str, dict] = {}  # run dtype -> kink calls per equation (``_kink_calls``)

    @contextlib.contextmanager
    def watching(self, watch):
        """Inside the block the jaxpr's runs pass every equation's outputs through ``watch`` (``interpreter.run``)."""
        previous, self._watch = self._watch, watch
        try:
            yield
        finally:
            self._watch = previous

    # -- the model and its jaxpr, per run dtype ----------------------------------------------------------
    @functools.cached_property
    def float64_computes_in(self) -> str:
        """The narrowest float the float64 jaxpr computes in, where the model casts to it itself
        (``frameworks.narrowest_float``; ``Case.float64_computes_in``)."""
        return fw.narrowest_float(self.traced("float64").closed)

    def model_at(self, floats) -> fw.Model:
        name = np.dtype(floats).name
        if name not in self._models:
            self._models[name] = self.model.at(name)
        return self._models[name]

    def traced(self, floats) -> Traced:
        name = np.dtype(floats).name
        if name not in self._traced:
            m = self.model_at(floats)
            try:
                closed, shapes = fw._traced(m.kind, m.name,
                                            lambda: jax.make_jaxpr(m.call, return_shape=True)(*m.args()))
            except fw.TraceError as exc:
                if name != "float64" or self.model.case_dtype == "float64" or not self._traces_as_written():
                    raise
                raise fw.TraceError(fw.float64_trace_message(m.kind, m.name, exc)) from exc.__cause__
            out_leaves = jax.tree_util.tree_leaves(shapes[0])
            floats_at = tuple(i for i, s in enumerate(out_leaves) if jnp.issubdtype(s.dtype, jnp.inexact))
            known = interpreter.evaluate_constants(closed, self.given(closed, m))
            self._traced[name] = Traced(closed, jax.tree_util.tree_structure(shapes), floats_at, known)
        return self._traced[name]

    def _traces_as_written(self) -> bool:
        try:
            self.traced(np.float32)
        except fw.TraceError:
            return False
        return True

    def given(self, closed, m: fw.Model) -> dict:
        """The jaxpr's invars whose values are the case's constants: the key data, the integer inputs."""
        invars = closed.jaxpr.invars
        n_p, n_b = len(m.params), len(m.buffers)
        if len(invars) != n_p + n_b + len(m.inputs) + 1:
            raise RuntimeError(f"the jaxpr of {m.name} has {len(invars)} inputs for {n_p} parameters, {n_b} buffers, "
                               f"{len(m.inputs)} inputs and the key; this is a bug in gradcheck/frontends/jax")
        out = {invars[-1]: m.key}
        for k, x in enumerate(m.inputs):
            if not np.issubdtype(x.dtype, np.inexact):
                out[invars[n_p + n_b + k]] = x
        return out

    # -- the tree of leaves -------------------------------------------------------------------------------
    def tree(self) -> JaxModel:
        """A fresh gradcheck tree holding the model's parameter and buffer values (copies)."""
        m = self.model
        kinds = {**{n: "param" for n in m.params}, **{n: "buffer" for n in m.buffers}}
        values = {**m.params, **m.buffers}
        for name in kinds:
            if name in _RESERVED:
                raise TypeError(f"{m.name}: the leaf {name!r} has the name of a gradcheck Module attribute; rename "
                                "it in the model to check it")
        groups: dict[tuple[str, str], list[str]] = {}
        top: list[str] = []
        for name in kinds:
            owner = m.layers.get(name)
            if owner is None:
                top.append(name)
            else:
                groups.setdefault(owner, []).append(name)
        fields: list[tuple[str, str]] = [(n, kinds[n]) for n in top]
        children = {}
        for (path, cls), names in groups.items():
            node = object.__new__(node_class(cls, JaxLayer, tuple((n, kinds[n]) for n in names), __name__))
            for n in names:
                object.__setattr__(node, n, np.array(values[n], copy=True))
            field = f"<{path}>"
            fields.append((field, "inline"))
            children[field] = node
        root = object.__new__(node_class(m.root_class, JaxModel, tuple(fields), __name__))
        for n in top:
            object.__setattr__(root, n, np.array(values[n], copy=True))
        for field, node in children.items():
            object.__setattr__(root, field, node)
        root._program = self
        return root

    def leaf_names(self) -> list[str]:
        """The model's parameters and buffers by name, in the order of the jaxpr's first invars (``tree_leaves``
        of ``(params, buffers, inputs, key)``: each dict by sorted key)."""
        flat, _ = jax.tree_util.tree_flatten_with_path((dict(self.model.params), dict(self.model.buffers)))
        return [path[1].key for path, _ in flat]

    def values(self, root) -> tuple[dict, dict]:
        """``(params, buffers)`` by name, as the root's leaves hold them."""
        params, buffers = {}, {}
        for leaf in leaves_with_paths(root):
            (buffers if leaf.kind == "buffer" else params)[leaf.path] = leaf.value
        return params, buffers

    def set_buffers(self, root, new: dict) -> None:
        """Each buffer's field set to its new value (the drivers read updated buffers from the fields)."""
        owners = {}
        for node in [root] + [getattr(root, f) for f, kind, _ in root.field_kinds() if kind == "child"]:
            for f, kind, _ in node.field_kinds():
                if kind == "buffer":
                    owners[f] = node
        for name, value in new.items():
            if name in owners:
                setattr(owners[name], name, value)

    # -- calls ----------------------------------------------------------------------------------------------
    def call(self, root, inputs: tuple):
        params, buffers = self.values(root)
        backend = interpreter.backend_of_values(list(params.values()) + list(buffers.values()) + list(inputs))
        floats = interpreter.float_dtype_of(list(params.values()) + list(buffers.values()) + list(inputs))
        if backend == "jax" and self._pinned_here(floats):
            picked, new = self._pinned(params, buffers, inputs, floats)
        elif backend == "jax":
            out, new = self.model_at(floats).call(params, buffers, tuple(inputs), self.model.key)
            leaves = jax.tree_util.tree_leaves(out)
            picked = [leaves[i] for i in self.traced(floats).floats]
            if np.dtype(floats) != np.float64:
                # Every float of a run is the run's dtype, as on the tape and torch: a float64 value here is
                # jax's default float under the x64 that gradcheck turned on (facts.describe says where).
                picked = [_narrowed(x, floats) for x in picked]
                new = {k: _narrowed(v, floats) for k, v in new.items()}
        elif backend == "numpy" and floats == np.float64 and not self.verified:
            self._verify(params, buffers, inputs)
            return self.call(root, inputs)
        elif backend == "numpy" and (self.problems or self.unfaithful):
            # The tape and torch cannot run this jaxpr; the referee still can, on jax's own float64 forward.
            picked, new = self._own(params, buffers, inputs, floats)
        else:
            if backend != "numpy" and (self.problems or self.unfaithful):
                raise UnsupportedPrimitive(self.unavailable_because())
            picked, new = self._run(params, buffers, inputs, floats)
        self.set_buffers(root, new)
        return picked[0] if len(picked) == 1 else tuple(picked)

    def _pinned_here(self, floats) -> bool:
        """Whether jax's run of this call is pinned to the reference's kinks: a float32 run under a pin
        (``gradcheck.check.kinks.pinned``), of a jaxpr the tape and torch run too.  The float64 run, which
        decides, stays the user's own code."""
        from gradcheck.check import kinks

        state = kinks.active()
        return (state is not None and state.mode == "pin" and np.dtype(floats) != np.float64 and self.verified
                and not (self.problems or self.unfaithful))

    def _pinned(self, params, buffers, inputs, floats):
        """jax's run of the jaxpr with its kinks pinned (``interpreter.run_pinned``): (the float outputs, the new
        buffers).  A float32 forward lands on either side of a kink within its rounding, and jax runs the user's
        code, which no pin reaches; so its pinned float32 run binds jax's own primitives, and the user's custom
        rules, equation by equation, and only the kink-taking equations go through gradcheck.ops, as on the tape
        and torch.  Its float32 error then measures rounding, as theirs does."""
        from gradcheck.check import kinks

        t = self.traced(floats)
        args = jax.tree_util.tree_leaves((params, buffers, tuple(inputs), self.model.key))
        try:
            outs = interpreter.run_pinned(t.closed, args, floats, t.known, self._kink_calls(floats))
        except kinks.KinkMismatch:
            raise
        except Exception as exc:  # noqa: BLE001 - the runner runs it again unpinned (the user's own code), noted
            raise kinks.KinkMismatch(f"jax's float32 jaxpr could not be run pinned ({type(exc).__name__}: "
                                     f"{str(exc)[:200]})") from exc
        out, new = jax.tree_util.tree_unflatten(t.out_tree, outs)
        leaves = jax.tree_util.tree_leaves(out)
        return [_narrowed(leaves[i], floats) for i in t.floats], {k: _narrowed(v, floats) for k, v in new.items()}

    def _kink_calls(self, floats) -> dict:
        """How many kink calls each equation of the run dtype's jaxpr makes on the tape (``interpreter.kink_calls``),
        at the model's own values (a while loop's or a cond's count depends on them): once per run dtype."""
        name = np.dtype(floats).name
        if name not in self._calls:
            m, t = self.model_at(floats), self.traced(floats)
            self._calls[name] = interpreter.kink_calls(t.closed, jax.tree_util.tree_leaves(m.args()), floats, t.known)
        return self._calls[name]

    def unavailable_because(self) -> str:
        if self.unfaithful:
            return self.unfaithful
        return "the tape and torch cannot run this model's jaxpr: " + "; ".join(self.problems.values())

    def _run(self, params, buffers, inputs, floats):
        """The jaxpr on the backend the values are on: (the float outputs, the new buffers by name)."""
        t = self.traced(floats)
        args = jax.tree_util.tree_leaves((params, buffers, tuple(inputs), self.model.key))
        try:
            outs = interpreter.run(t.closed, args, floats, t.known, self._watch)
        except LoweringError as exc:  # a form verify could not see (a value-dependent one): unavailable, said so
            raise UnsupportedPrimitive(str(exc)) from exc
        out, new = jax.tree_util.tree_unflatten(t.out_tree, outs)
        leaves = jax.tree_util.tree_leaves(out)
        return [leaves[i] for i in t.floats], new

    def _own(self, params, buffers, inputs, floats):
        """jax's own forward of the model on numpy values: (the float outputs, the new buffers), as numpy.

        Compiled once per run dtype (the referee calls it many times where the tape and torch cannot run), as a
        program run a few times (``interpreter.QUICK_COMPILE``).
        """
        name = np.dtype(floats).name
        args = (params, buffers, tuple(inputs), self.model.key)
        if name not in self._forwards:
            self._forwards[name] = interpreter.compiled(self.model_at(floats).call, args)
        out, new = self._forwards[name](*args)
        leaves = jax.tree_util.tree_leaves(out)
        picked = [np.array(leaves[i]) for i in self.traced(floats).floats]
        return picked, {k: np.array(v) for k, v in new.items()}

    def _verify(self, params, buffers, inputs) -> None:
        """Each lowering against jax's primitive once, in float64, then the whole jaxpr against the model's own
        forward; outside the caller's counting and kinks."""
        from gradcheck.check import cost, kinks

        with cost.counting(), kinks.suspended():
            t = self.traced(np.float64)
            args = jax.tree_util.tree_leaves((params, buffers, tuple(inputs), self.model.key))
            self.problems.update(interpreter.verify(t.closed, args, t.known))
            if not self.problems:
                self.unfaithful = self._unfaithful(params, buffers, inputs)
        self.verified = True

    def _unfaithful(self, params, buffers, inputs) -> str:
        """Why the float64 jaxpr's forward differs from the model's own jax forward, or "".

        Every equation can match jax's primitive while the run still differs from the model: a constant of
        the key-dependent part handed to the wrong equation would make the tape, torch and the referee (which
        runs the same jaxpr) agree among themselves, and jax would be blamed for being right.
        """
        got, got_buffers = self._run(params, buffers, inputs, np.float64)
        want, want_buffers = self._own(params, buffers, inputs, np.float64)
        tol = ToleranceRules().resolve("output", "float64")
        # Where the model casts part of its float64 run to float32, the two runs round there as float32 does, and
        # the probe moves the inputs by float32's unit (conditioning.perturbed).
        narrow = self.float64_computes_in
        pairs = [(f"output {k}", w, g) for k, (w, g) in enumerate(zip(want, got))]
        pairs += [(f"buffer {n}", want_buffers[n], got_buffers[n]) for n in want_buffers if n in got_buffers]
        reach = None
        for what, w, g in pairs:
            w, g = np.asarray(w), np.asarray(g)
            why = _beyond(w, g, tol)
            if why and reach is None:
                moved = {**params, **buffers}
                moved.update(conditioning.perturbed(_float_arrays({**params, **buffers}), self.model.seed,
                                                    unit=conditioning.unit_roundoff(narrow)))
                mp = {n: moved[n] for n in params}
                mb = {n: moved[n] for n in buffers}
                again, again_buffers = self._own(mp, mb, inputs, np.float64)
                reach = {f"output {k}": conditioning.spread(a, b) for k, (a, b) in enumerate(zip(want, again))}
                reach.update((f"buffer {n}", conditioning.spread(want_buffers[n], again_buffers[n]))
                             for n in want_buffers if n in again_buffers)
            if why and what in reach and conditioning.spread(w, g) <= conditioning.SPREAD_FACTOR * reach[what]:
                continue  # within float64's reach at this point: rounding alone moves the model this far
            if why:
                return (f"the jaxpr's float64 forward differs from the model's own at {what} ({why}), although every "
                        "equation's lowering matches jax's primitive; the tape and torch cannot check this model, jax "
                        "alone is checked, against the referee on the model's own float64 forward")
        return ""


def _narrowed(x, floats):
    """``x`` in the run's float dtype where it is a wider float; anything else as it is."""
    dt = getattr(x, "dtype", None)
    if dt is not None and jnp.issubdtype(dt, jnp.floating) and np.dtype(dt).itemsize > np.dtype(floats).itemsize:
        return x.astype(floats)
    return x


def _beyond(want: np.ndarray, got: np.ndarray, tol) -> str:
    """Where ``got`` leaves the float64 output tolerance around ``want`` (elementwise), or ""."""
    if want.dtype.kind != "f":
        return "" if np.array_equal(want, got) else f"{int(np.sum(want != got))} of {want.size} elements differ"
    if want.shape != got.shape:
        return f"shape {got.shape}, the model's {want.shape}"
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)):
        return "NaN or infinite entries differ"
    w, g = want[finite].astype(np.float64), got[finite].astype(np.float64)
    if not w.size:
        return ""
    diff = np.abs(g - w)
    allowed = tol.rtol * np.abs(w) + tol.absolute(float(np.max(np.abs(w))))
    bad = diff > allowed
    if not bad.any():
        return ""
    return (f"{int(bad.sum())} of {w.size} elements beyond the float64 tolerance, max |difference| "
            f"{float(diff.max()):.3g} where max |jax| is {float(np.max(np.abs(w))):.3g}")


def _float_arrays(values: dict) -> dict:
    return {p: v for p, v in values.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"}


__all__ = ["JaxLayer", "JaxModel", "Program", "UnsupportedPrimitive"]
