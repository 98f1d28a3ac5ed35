"""The user's torch module run by torch itself, as the case runs it, and where a call's values say it runs.

``call_torch`` is the torch backend's forward of a ``from_torch`` case, of
the whole module (``model.Program``) and of one submodule call replayed
alone (``units.UnitCall``): ``functional_call`` with the case's leaves
bound, in the case's mode, with the case's random draws (``TorchFacts``)
and, through a torch function mode (``TorchFunctions``), every float dtype
the module names made float64 in a float64 run and relu and max pooling
pinned to the float64 reference's kinks in a pinned float32 run.  ``backend_of_values`` and ``float_dtype_of`` read,
from a call's leaves and inputs, which backend runs it and in which float
dtype.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import weakref
from dataclasses import dataclass

from gradcheck import ops
from gradcheck.backends.torch.driver import hold
from gradcheck.check import kinks
from gradcheck.frontends.arrays import backend_of_values, float_dtype_of  # noqa: F401 (model and units use them)
from gradcheck.frontends.torch import randomness


@dataclass
class TorchFacts:
    """The random draws a torch call makes (dropout's among them), as numbers of the whole graph's."""

    seed: int
    draws: list  # (op, kind, shape) of each draw it makes, in order
    draw_indices: list | None = None  # their numbers in the whole graph (None: 0, 1, 2 ...)
    recorded: dict | None = None  # when given: "random_values" handed out, in order
    pinned: frozenset = frozenset()  # the graph's numbers of the draws a traced branch depends on (Draws.pinned)
    recomputed: list | None = None  # where what a recompute inside the backward did anew is told (Draws.recomputed)

    @classmethod
    def of(cls, seed: int, graph_draws, indices: list | None = None, recorded: dict | None = None) -> TorchFacts:
        """The facts of a call that makes the graph's draws ``indices`` (``randomness.Draws``; None: all of them)."""
        expected = graph_draws.expected if indices is None else [graph_draws.expected[k] for k in indices]
        return cls(seed, expected, indices, recorded, graph_draws.pinned, graph_draws.recomputed)


def call_torch(module, state: dict, args: tuple, kwargs: dict, training: bool, facts: TorchFacts):
    """``module(*args, **kwargs)`` under torch with ``state`` bound (``functional_call``), as the case runs it.

    In ``training`` mode (restored after), with the case's dropout masks and
    random draws (``facts``, dropout's among them).  A module's own float constants
    (``torch.zeros(...)``, ``torch.tensor(0.5)`` in its forward) take the
    default dtype, and its casts name a float dtype (T5's and Llama's RMSNorm
    compute in ``.to(torch.float32)``): in a float64 run both are float64, as
    in the graph, whose float dtypes are the run's.
    """
    import torch

    # The inputs are the drivers' leaves: an in-place op of the module on an input must not touch them.
    clones: dict[int, object] = {}

    def clone(x):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return clones.setdefault(id(x), x.clone())
        return x

    args = tuple(clone(x) for x in args)
    kwargs = {k: clone(v) for k, v in kwargs.items()}
    floats = {v.dtype for v in list(state.values()) + list(args) + list(kwargs.values())
              if isinstance(v, torch.Tensor) and v.is_floating_point()}
    run_dtype = torch.float64 if floats == {torch.float64} else None
    setup = contextlib.ExitStack()
    try:
        was = [m.training for m in module.modules()]
        module.train(training)
        setup.callback(_restore_training, module, was)
        setup.callback(torch.set_default_dtype, torch.get_default_dtype())
        if run_dtype is not None:
            torch.set_default_dtype(run_dtype)
        draws = setup.enter_context(randomness.CaseRandom(facts.seed, facts.draws, facts.draw_indices,
                                                          facts.recorded, facts.pinned, facts.recomputed))
        functions = setup.enter_context(TorchFunctions(run_dtype))
        functions.start_forward()
        setup.enter_context(_backward_under(functions))
        # functional_call's own binding, held open here rather than undone on return (see backends.torch.driver.hold)
        setup.enter_context(_reparametrize_module(module, state, tie_weights=True, strict=False))
        try:
            out = module(*args, **kwargs)
        except RuntimeError as exc:
            if run_dtype is not None and _FLOAT64_REFUSED.search(str(exc)):
                raise RuntimeError(_no_float64(module, exc)) from exc
            raise
        draws.finish()
        if facts.recomputed is not None and torch.is_grad_enabled():  # no backward follows a no_grad call
            setup.callback(_buffers_written_again(state, facts.recomputed))  # first undone: after the backward
    except BaseException:
        setup.close()
        raise
    hold(setup)  # undone once the gradient is taken: a recompute inside the backward meets the same call
    return out


@contextlib.contextmanager
def _backward_under(functions: TorchFunctions):
    """The Python that torch runs inside the call's backward, under the call's ``TorchFunctions`` too.

    torch's function modes do not reach into a backward (its dispatch modes,
    ``CaseRandom``, do), so that code would miss the run's float dtype and the
    pinned kinks: a custom ``autograd.Function``'s backward that computes in
    ``.float()`` (a fused norm's mixed-precision fallback) would round to
    float32 inside torch's float64 run, and a segment that gradient
    checkpointing recomputes would differ from its forward.  Two entry points
    are handed their function wrapped to enter them again
    (``TorchFunctions.again``, which enters them once however often it is
    wrapped):

    * every custom Function's backward, as the engine fetches it
      (``BackwardCFunction._get_user_fn``, on both its boxed and unboxed
      paths); reentrant checkpointing's ``CheckpointFunction`` is one, its
      recompute inside;
    * each segment's function of non-reentrant checkpointing, whose recompute
      runs in a saved-tensor hook, not a Function: every generator of that
      path, which torch renames between versions
      (``_checkpoint_without_reentrant_generator`` up to 2.13,
      ``_checkpoint_without_reentrant_generator_impl`` from 2.14), takes it
      first.  They are looked up by name at each call.
    """
    from torch.autograd.function import BackwardCFunction

    try:
        from torch.utils import checkpoint as ckpt
    except ImportError:  # a torch without it: nothing to recompute
        ckpt = None
    generators = {} if ckpt is None else {
        name: f for name, f in vars(ckpt).items()
        if name.startswith("_checkpoint_without_reentrant_generator") and callable(f)}
    user_fn = BackwardCFunction.__dict__["_get_user_fn"]

    def without_reentrant(generator):
        return lambda function, *rest, **kwargs: generator(functions.again(function), *rest, **kwargs)

    BackwardCFunction._get_user_fn = lambda node: functions.again(user_fn(node))
    for name, generator in generators.items():
        setattr(ckpt, name, without_reentrant(generator))
    try:
        yield
    finally:
        for name, generator in generators.items():
            setattr(ckpt, name, generator)
        BackwardCFunction._get_user_fn = user_fn


def _buffers_written_again(state: dict, told: list):
    """A check, made when the backward is done, that it wrote none of the call's buffers (``state``'s tensors that
    take no gradient); where it did, say so in ``told``.

    A recompute inside the backward (gradient checkpointing) runs a
    training-mode BatchNorm again, and torch updates its running statistics
    once more: torch's buffers after the step are then not the forward's, and
    a comparison of them blames torch.  That is what torch does to the user's
    model, so it stays the verdict; the note says where it comes from.
    """
    import torch

    # The values, not the version counters: a BatchNorm kernel writes its running statistics without a version bump.
    before = {name: t.detach().clone() for name, t in state.items()
              if isinstance(t, torch.Tensor) and not t.requires_grad}

    def check():
        again = [name.removeprefix("module.") for name, t in state.items()  # the capture wrapper's child name
                 if name in before and not torch.equal(t.detach(), before[name]) and not before[name].isnan().any()]
        if again:
            names = ", ".join(again[:3]) + (f" and {len(again) - 3} more" if len(again) > 3 else "")
            message = (f"torch's backward recomputes part of the forward (gradient checkpointing) and writes the "
                       f"buffers {names} again: a training-mode BatchNorm updates its running statistics once more in "
                       "each recompute, as torch does to the model under checkpointing, so torch's buffers after the "
                       "step are not the forward's")
            if message not in told:
                told.append(message)

    return check


def _restore_training(module, was: list) -> None:
    for m, flag in zip(module.modules(), was):
        m.training = flag


def _reparametrize_module(module, state: dict, **kwargs):
    """``functional_call``'s binding of ``state`` to ``module``, as a context that can be held open."""
    from torch.nn.utils import stateless

    return stateless._reparametrize_module(module, state, **kwargs)


# How torch's kernels refuse a double: "got Double", "not implemented for 'Double'", "... but found Double".
_FLOAT64_REFUSED = re.compile(r"\bDouble\b|\bfloat64\b")


def _no_float64(module, exc) -> str:
    """What to tell a user whose module torch cannot run in float64 (the run that decides)."""
    inner = getattr(module, "module", module)  # the capture's wrapper holds the user's module
    return (f"torch cannot run {type(inner).__name__} in float64, which decides the check: {exc}. A kernel with no "
            "float64 implementation (a low-precision fused kernel, transformers' grouped-matmul experts) stops it; "
            "check the model with its plain implementation (transformers: experts_implementation=\"eager\")")


@contextlib.contextmanager
def custom_backwards(on_apply):
    """Report each custom ``torch.autograd.Function`` applied inside as ``on_apply(name)``.

    Such a Function's backward is the user's code: torch takes its gradient
    from it, while the graph holds only the forward, which the tape and jax
    differentiate.  When torch's gradient is the one off, that is the first
    place to look (``function_name`` says where it is).  Function.apply is
    a Python classmethod with no hook, so it is wrapped for the duration.
    """
    import torch

    original = torch.autograd.Function.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        on_apply(function_name(cls))
        return original.__get__(None, cls)(*args, **kwargs)

    torch.autograd.Function.apply = classmethod(apply)
    try:
        yield
    finally:
        torch.autograd.Function.apply = original


def function_name(cls) -> str:
    """``Name (file:line)`` of a custom autograd.Function's backward, or its name alone where the source is unknown."""
    try:
        backward = inspect.unwrap(cls.backward)
        return f"{cls.__qualname__} ({inspect.getsourcefile(backward)}:{inspect.getsourcelines(backward)[1]})"
    except (TypeError, OSError, AttributeError):
        return cls.__qualname__


class TorchFunctions:
    """On torch, the function-level part of the case's run: the run's float dtype, and the pinned kinks.

    A ``TorchFunctionMode``.  In a float64 run, every float dtype a call
    names (``.float()``, ``.to(torch.float32)``, ``dtype=torch.float32``)
    becomes float64, as in the graph, whose float dtypes are the run's.

    While a float32 run is pinned to the float64 reference's kinks
    (``gradcheck.check.kinks``), relu and max pooling go through ``gradcheck.ops``
    too, which runs torch's own kernel and takes the reference's branch only
    where torch's differs; unpinned, torch would land on the other side of
    ResNet-18's near-zero relu inputs and its float32 error would measure
    that, not rounding.  The reference recorded the graph's kink ops in
    graph order; a module whose other kink ops (clamp, maximum) are not
    intercepted here misaligns the sequence, which the pin detects
    (``KinkMismatch``), and the run is repeated unpinned with a note.

    (The random draws, dropout's included, are the dispatch level's:
    ``randomness.CaseRandom``.)
    """

    def __init__(self, run_dtype=None, recompute: bool = False):
        from torch.overrides import TorchFunctionMode

        outer = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return outer._handle(func, args, kwargs or {})

        self._mode_type = _Mode

        state = kinks.active()
        self.pinning = state is not None and state.mode == "pin"
        self._mode = _Mode()
        self.run_dtype = run_dtype  # every float dtype a call names becomes this one (None: as the module says)
        self.recompute = recompute  # a forward recomputed inside the backward: its kink calls repeat the forward's
        self._replayed: dict[int, int] = {}  # recompute: a module's seed -> the next kink call it repeats

    def __enter__(self):
        self._mode.__enter__()
        return self

    def start_forward(self) -> None:
        """Where a module's forward starts: its first pinned kink op is the pin's next (not the recompute's)."""
        if self.pinning and randomness.forward_position() is not None:
            randomness.set_forward_position(kinks=kinks.active().position)

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)

    def again(self, function):
        """``function`` run under an equal of this mode where none is in effect: recomputed inside a backward."""
        from torch.overrides import _get_current_function_mode_stack

        run_dtype, own = self.run_dtype, self._mode_type.__qualname__

        def run(*args, **kwargs):
            if any(type(m).__qualname__ == own for m in _get_current_function_mode_stack()):
                return function(*args, **kwargs)
            with TorchFunctions(run_dtype, recompute=True):
                return function(*args, **kwargs)

        return run

    def _handle(self, func, args, kwargs):
        import torch.nn.functional as F

        if self.run_dtype is not None:
            if func in _float_casts():
                return args[0].to(self.run_dtype)
            args, kwargs = _run_dtype(args, self.run_dtype), {k: _run_dtype(v, self.run_dtype) for k, v in kwargs.items()}
        if self.pinning and any(func is f for f in _relus()):
            return self._pinned(lambda: ops.relu(args[0] if args else kwargs["input"]))
        if self.pinning and func is F.max_pool2d:
            names = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
            bound = _bind(names, (None, None, None, 0, 1, False, False), args, kwargs)
            if bound["dilation"] in (1, (1, 1), [1, 1]) and not bound["return_indices"]:
                from gradcheck.frontends.torch.aten import max_pool2d_ceil

                return self._pinned(lambda: max_pool2d_ceil(bound["input"], bound["kernel_size"],
                                                            bound["stride"] or bound["kernel_size"],
                                                            bound["padding"], bool(bound["ceil_mode"])))
        return func(*args, **kwargs)


    def _pinned(self, run):
        """A pinned kink op's call: in the forward, the next one; recomputed inside the backward, the one it repeats.

        The pin numbers kink calls in the order the forward made them; a
        segment that gradient checkpointing recomputes makes its calls again,
        and must take the same decisions, not the next ones.  torch's
        generator says which (``randomness.forward_position``); where the
        module seeded torch itself (Reformer's reversible layers, which
        recompute their sublayers in their own backward after seeding torch as
        their forward did), the first kink call the forward made under that
        seed, and the ones after it in turn (``_seeded_kinks``).
        """
        import torch

        state = kinks.active()
        at = randomness.forward_position()
        seed = torch.default_generator.initial_seed()
        if at is None and not self.recompute:
            _seeded_kinks(state).setdefault(seed, state.position)
        start = None
        if self.recompute:
            start = at.kinks if at is not None else self._replayed.get(seed, _seeded_kinks(state).get(seed))
        if start is None or start >= state.position:
            out = run()
            randomness.set_forward_position(kinks=state.position, over_module_seed=False)
            return out
        end, crossed = state.position, len(state.crossed)
        state.position = start
        try:
            out = run()
            if at is None:
                self._replayed[seed] = state.position
            randomness.set_forward_position(kinks=state.position, over_module_seed=False)
            return out
        finally:
            state.position = end
            del state.crossed[crossed:]  # the forward's crossings are counted once


# Per pinned run (its kinks state): a seed a module gave torch itself -> the first kink call its forward made under it.
_SEEDED_KINKS = weakref.WeakKeyDictionary()


def _seeded_kinks(state) -> dict[int, int]:
    return _SEEDED_KINKS.setdefault(state, {})


@functools.cache
def _float_casts() -> tuple:
    """The tensor methods that cast to one fixed float dtype."""
    import torch

    return (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.double)


def _run_dtype(value, run_dtype):
    """``value`` with every float torch dtype in it (nested in tuples and lists too) replaced by ``run_dtype``."""
    import torch

    if isinstance(value, torch.dtype):
        return run_dtype if value.is_floating_point else value
    if type(value) in (tuple, list):  # plain ones only: a named tuple or torch.Size holds no dtype to replace
        return type(value)(_run_dtype(v, run_dtype) for v in value)
    return value


@functools.cache
def _relus() -> tuple:
    """The relu entry points a torch module calls, as the function mode sees them."""
    import torch
    import torch.nn.functional as F

    return (F.relu, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_)


def _bind(names, defaults, args, kwargs) -> dict:
    bound = dict(zip(names, defaults))
    bound.update(zip(names, args))
    bound.update(kwargs)
    return bound
