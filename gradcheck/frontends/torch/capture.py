"""Capture: ``torch.export`` a module, decompose it, and read its graph signature.

The graph is decomposed to Core ATen with one change to torch's default
table: the ops in ``PRESERVED`` stay whole.  They are the functions a model
library calls (``F.linear``, ``F.layer_norm``, ``F.scaled_dot_product_attention``,
the convolutions ...) and each has a ``gradcheck.ops`` counterpart, so the
tape and jax run their own kernels for them (jax: ``jax.nn.dot_product_attention``,
flax's LayerNorm formulation, ``lax.conv_general_dilated``), not torch's
decomposition of them into smaller ATen ops.  What is decomposed, torch
decomposes; ``decompose="core"`` decomposes everything (docs/from_torch.md).

The signature maps every graph input to what it is: a parameter (by its
canonical torch name: the first of the names a tied tensor has, as
``named_parameters`` gives it), a buffer, a constant, or a user input; and
every output to a user output or a buffer mutation (BatchNorm's running
statistics, ``num_batches_tracked``).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from gradcheck.frontends.torch import randomness
from gradcheck.frontends.torch.aten import LOWERINGS

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = "module"  # the child name the wrapper gives the user's module; stripped from every name

_aten = torch.ops.aten
PRESERVED = (
    _aten.linear.default,
    _aten.matmul.default,
    _aten.conv1d.default, _aten.conv2d.default, _aten.conv1d.padding, _aten.conv2d.padding,
    _aten.conv_transpose1d.default, _aten.conv_transpose2d.input,
    _aten.layer_norm.default, _aten.group_norm.default, _aten.rms_norm.default,
    _aten.scaled_dot_product_attention.default,
    _aten.hardswish.default, _aten.hardsigmoid.default, _aten.silu.default,
    _aten.upsample_nearest2d.vec, _aten.upsample_bilinear2d.vec,
)
DECOMPOSE = ("fused", "core")


class CaptureError(RuntimeError):
    """``torch.export`` could not capture the module; the message has torch's reason and the ways out."""


WAYS_OUT = (
    "ways out: (1) make the branch depend on Python values (a config flag, a shape), not on tensor "
    "values; (2) write a data-dependent branch with torch.cond, which torch.export captures whole; "
    "(3) pass forward=lambda module, *inputs: ... to from_torch to check the path you want; (4) check "
    "the submodules that can be captured one by one (from_torch(model.encoder, x)). See docs/from_torch.md"
)


# The two public ways to have the tape and jax run an op gradcheck does not lower (docs/from_torch.md).
WAYS_TO_LOWER = ("give from_torch references={{{op!r}: fn}} (fn: the op's math in ordinary torch ops, traced and "
                 "lowered like the rest of the graph), or lower it yourself with @gradcheck.frontends.torch.lowering({op!r}) "
                 "(docs/from_torch.md, 'Ops gradcheck does not lower'), or give from_torch a forward= that avoids it")


class _Forward(nn.Module):
    """The user's module under one name (``module``), called as ``forward(module, *inputs)``."""

    def __init__(self, module: nn.Module, forward=None):
        super().__init__()
        self.module = module
        self._forward = forward

    def forward(self, *inputs):
        inputs = tuple(x.detach() if i in self.held else x for i, x in enumerate(inputs))
        with randomness.host_generators(on_draw=lambda: self.__dict__.__setitem__("draws_on_host", True)):
            out = self.module(*inputs) if self._forward is None else self._forward(self.module, *inputs)
        return _without_objects(out, self.dropped)

    @property
    def held(self) -> dict:
        """Float inputs torch does not differentiate (``soft_margin_loss``'s target), by position: why each is
        held (``hold_undifferentiable``).  The forward detaches them, so the graph does too."""
        return self.__dict__.setdefault("_held", {})

    @property
    def dropped(self) -> dict:
        """Output leaves that are neither tensors nor plain values (a transformers ``DynamicCache``), by path:
        what the module returned there, which the check does not compare."""
        return self.__dict__.setdefault("_dropped", {})


def _without_objects(out, dropped: dict):
    """``out`` with every leaf that is neither a tensor nor a plain value replaced by None (noted in ``dropped``):
    torch.export returns tensors in containers it knows, and a cache object is state, not an output."""
    from torch.utils import _pytree as pytree

    pairs, spec = pytree.tree_flatten_with_path(out)
    leaves = []
    for path, v in pairs:
        if isinstance(v, (torch.Tensor, int, float, bool, str)) or v is None:
            leaves.append(v)
        else:
            dropped[_keyname(path) or "output"] = type(v).__name__
            leaves.append(None)
    return pytree.tree_unflatten(leaves, spec)


def strip(name: str) -> str:
    """A name in the wrapper as the user's module names it (``module.layer1.0`` -> ``layer1.0``)."""
    if name == ROOT:
        return ""
    return name[len(ROOT) + 1 :] if name.startswith(ROOT + ".") else name


@dataclass
class Binding:
    """What one graph input is: ``param``/``buffer`` (``target`` the leaf path), ``constant``, ``input``."""

    kind: str
    target: str = ""
    index: int = -1
    value: object = None


@dataclass
class Graph:
    """One exported, decomposed graph of the module in one mode (train or eval)."""

    training: bool
    program: object  # torch.export.ExportedProgram
    nodes: list
    inputs: dict[str, Binding]  # placeholder name -> what it is
    outputs: list[tuple[str, object]]  # ("output", k) | ("buffer", path) | ("ignore", why) per graph output
    user_outputs: int
    draws: object = None  # randomness.Draws: the random nodes (dropout, rand, bernoulli ...), each one case draw
    lowerings: dict = field(default_factory=dict)  # op -> this graph's own lowering (a custom op's reference)
    problems: dict[str, str] = field(default_factory=dict)  # node name -> why the tape and jax cannot run it
    # Nodes where torch's own kernel, not the lowering, computes something else than the op (the lowering check
    # with torch's reference decomposition's word, ``third_opinion``): the tape and jax run the graph as the op
    # should be, and torch is expected to disagree.  Node name -> what the check found.
    kernel_faults: dict[str, str] = field(default_factory=dict)
    # Why the graph as a whole does not compute what the module does in float64 although each node's lowering
    # matches torch's op ("" when it does): a decomposition that fixed a value at the capture's dtype.
    unfaithful: str = ""
    # Nodes computed from constants alone (causal masks from arange): no parameter or input reaches them, so
    # their comparisons are not kinks of the function being checked.
    constants: set[str] = field(default_factory=set)
    refused: str = ""  # torch.export refused the module and the graph was traced at the example inputs (why)
    verified: bool = False
    export_s: float = 0.0
    # The capture cache's entry for this graph, (name, folder), when it has one; ``from_cache``: read from it
    # (not exported in this process).  Either is discarded when the graph fails a check (``model.Program``).
    entry: tuple[str, str] | None = None
    from_cache: bool = False


_NOT_DIFFERENTIABLE = re.compile(r"function '(\w+)' is not differentiable with respect to argument '(\w+)'")
_SETS_REQUIRES_GRAD = "you can only change requires_grad flags of leaf variables"


def hold_undifferentiable(wrapper: _Forward, example_inputs: tuple, training: bool) -> None:
    """Find the float inputs torch refuses to differentiate, and hold them as the case's constants.

    A float input is differentiated like a parameter.  But some of torch's ops
    declare an argument not differentiable and refuse a tensor that requires
    a gradient there ("The function 'soft_margin_loss' is not differentiable
    with respect to argument 'target'"): a loss module called as
    ``loss(x, target)`` with a float target could then not run on torch at
    all, while the tape and jax would differentiate the target through the
    graph.  Such an input is torch's convention, like a ``padding_idx`` row:
    the forward detaches it (``_Forward.held``), on every backend and in the
    graph, so no backend gives it a gradient and the referee holds it fixed.

    Found by one forward with every float input requiring a gradient (the
    parameters detached, the buffers on copies, so the module stays at the
    case's point); only when torch refuses, one forward per float input
    says which.  Runs once per module.
    """
    if "_held_probed" in wrapper.__dict__:
        return
    wrapper.__dict__["_held_probed"] = True
    floats = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if not floats:
        return

    def refusal(which) -> str:
        state = {n: p.detach() for n, p in wrapper.named_parameters()}
        state.update((n, b.clone()) for n, b in wrapper.named_buffers())
        # A clone of a leaf that requires a gradient: the module may write into its inputs, as into any tensor.
        xs = tuple(x.detach().requires_grad_(True).clone() if i in which else x for i, x in enumerate(example_inputs))
        was = [m.training for m in wrapper.modules()]
        wrapper.train(training)
        try:
            with torch.enable_grad():
                torch.func.functional_call(wrapper, state, xs, strict=False)
        except RuntimeError as exc:
            found = _NOT_DIFFERENTIABLE.search(str(exc))
            if found:
                return f"{found.group(1)}'s {found.group(2)}, which torch declares not differentiable"
            if _SETS_REQUIRES_GRAD in str(exc):
                return ("one the module sets requires_grad on itself (on a tensor computed from it, which torch "
                        "allows only where the input does not require a gradient: the module is not differentiable "
                        f"by it on torch; {branch_line(exc) or 'line unknown'})")
            return ""
        except Exception:  # noqa: BLE001 - any other failure is the capture's to report, with its own message
            return ""
        finally:
            for m, flag in zip(wrapper.modules(), was):
                m.training = flag
        return ""

    if not refusal(set(floats)):
        return
    for i in floats:
        why = refusal({i})
        if why:
            wrapper.held[i] = why


def decomposition_table(decompose: str):
    if decompose not in DECOMPOSE:
        raise ValueError(f"from_torch: decompose={decompose!r}; expected one of {', '.join(DECOMPOSE)}")
    table = torch.export.default_decompositions()
    if decompose == "fused":
        for op in PRESERVED:
            table.pop(op, None)
    # A detach is part of the function differentiated (a straight-through estimator, a stopped statistic);
    # decomposed, it would become an alias, and the tape and jax would differentiate through it.
    table.pop(torch.ops.aten.detach.default, None)
    # torch's kernel gives a row that is -inf throughout 0, and its gradient there 0; decomposed (a softmax, then a
    # where), the tape's and jax's gradient through that row's softmax is NaN.  Lowered whole (aten.safe_softmax).
    table.pop(torch.ops.aten._safe_softmax.default, None)
    return table


def export(wrapper: _Forward, example_inputs: tuple, training: bool, decompose: str, name: str):
    """The decomposed ExportedProgram of ``wrapper`` in the given mode; CaptureError with torch's reason.

    When ``torch.export`` refuses (a branch on a tensor's value, a ``float()``
    of one), the graph is traced at the example inputs instead
    (``trace_at_example``): a gradient check is made at one point, so a graph
    that takes the branches the example takes is valid for it.  The result
    then carries ``refused``, the note that says so.
    """
    import warnings

    table = decomposition_table(decompose)
    hold_undifferentiable(wrapper, example_inputs, training)
    was = [m.training for m in wrapper.modules()]
    wrapper.train(training)
    mode = "train" if training else "eval"
    try:
        with warnings.catch_warnings(), _recurrent_dropout():
            # torch's own deprecation inside export, and nn.LSTM's weight cache being set while tracing:
            # neither says anything about the module being checked.
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            warnings.filterwarnings("ignore", message=".*_flat_weights.*were assigned during export.*")
            try:
                ep = torch.export.export(wrapper, tuple(example_inputs), strict=False)
                return _without_effect_tokens(ep.run_decompositions(table))
            except Exception as exc:
                refused = exc
            try:
                traced = trace_at_example(wrapper, tuple(example_inputs), _with_batch_norm(table))
            except Exception as exc:
                eager = eager_failure(wrapper, example_inputs, training)
                if eager is not None:
                    raise CaptureError(_fails_eagerly(name, mode, eager)) from eager
                raise CaptureError(
                    f"torch.export could not capture {name} ({mode} mode): {type(refused).__name__}: "
                    f"{torch_reason(refused)}\nand tracing it at the example inputs failed too: {type(exc).__name__}: "
                    f"{torch_reason(exc)}\n{WAYS_OUT}") from exc
            first = torch_reason(refused).splitlines()[0]
            traced.refused = (f"torch.export refused {name} ({mode} mode: {type(refused).__name__}: {first}"
                              f"{'; ' + branch_line(refused) if branch_line(refused) else ''}); traced at the example "
                              "inputs instead, taking the branches they take, which is the point this case checks")
            return traced
    finally:
        for m, flag in zip(wrapper.modules(), was):
            m.training = flag


def _without_effect_tokens(ep):
    """``ep`` with its ops called directly where torch.export threads an effect token through them.

    torch.export keeps some ops in order by a token that goes in as an input
    and out as an output of kind TOKEN, and each such op is called through
    ``with_effects``: torch.linalg's error check after ``cholesky``, ``inv``
    and ``solve`` (``_linalg_check_errors``) is one.  A graph is run node by
    node in its order, so the token orders nothing here; torch's own pass
    removes it and calls the ops as written.
    """
    if not any(spec.kind.name == "TOKEN" for spec in ep.graph_signature.input_specs):
        return ep
    try:
        from torch.export._remove_effect_tokens_pass import _remove_effect_tokens
    except ImportError:  # a torch without the pass: read_graph names the token input it cannot bind
        return ep
    return _remove_effect_tokens(ep)


@contextlib.contextmanager
def _recurrent_dropout():
    """While a graph is captured, torch's decomposition of the recurrent layers draws their dropout between layers.

    ``nn.RNN``, ``nn.LSTM`` and ``nn.GRU`` with ``dropout=p`` and more than
    one layer drop each layer's output but the last in training (torch's
    kernel, ``_rnn_impl``).  The Python decomposition that export traces them
    with (``torch._decomp.decompositions._rnn_helper``, torch 2.13) sets
    ``dropout = dropout if (train and num_layers < i - 1) else 0.0``, a
    condition no layer meets, so its graph draws nothing where the module
    draws a mask, and the graph is not the module in training.  This helper
    is torch's with the kernel's condition; each layer's output is dropped as
    the kernel drops it, by ``torch.dropout``, in the same order, so the
    graph's draws and the module's line up.
    """
    from torch._decomp import decompositions

    torch_helper = getattr(decompositions, "_rnn_helper", None)
    if torch_helper is None or not hasattr(decompositions, "params_hiddens"):
        yield  # a torch whose decomposition is organised otherwise: nothing to mend here
        return
    params_hiddens = decompositions.params_hiddens

    def rnn_helper(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                   layer_fn):
        input = input.transpose(0, 1) if batch_first else input
        final_hiddens = []
        for i in range(num_layers):
            cur_params, cur_hidden, bidir_params, bidir_hidden = params_hiddens(params, hidden, i, bidirectional)
            fwd_inp, fwd_hidden = layer_fn(input, cur_hidden, cur_params, has_biases)
            final_hiddens.append(fwd_hidden)
            if bidirectional:
                bwd_inp, bwd_hidden = layer_fn(input, bidir_hidden, bidir_params, has_biases, reverse=True)
                final_hiddens.append(bwd_hidden)
                input = torch.cat([fwd_inp, bwd_inp], fwd_inp.dim() - 1)
            else:
                input = fwd_inp
            if dropout != 0 and train and i < num_layers - 1:
                input = torch.dropout(input, dropout, train=True)
        input = input.transpose(0, 1) if batch_first else input
        return input, final_hiddens

    decompositions._rnn_helper = rnn_helper
    try:
        yield
    finally:
        decompositions._rnn_helper = torch_helper


def torch_reason(exc: BaseException) -> str:
    """torch's message, without its generic debugging advice: the first paragraph and the line that raised."""
    text = str(exc).strip()
    first = text.split("\n\n")[0].strip()
    call = re.search(r"The following call raised this error:\n(.*?)(?:\n\n|$)", text, re.S)
    if call and call.group(1).strip() not in first:
        first += "\n  raised at:\n" + call.group(1).rstrip()
    line = branch_line(exc)
    if line and line not in first:
        first += f"\n  the line that branches: {line}"
    return first


# torch's tracing machinery, whose frames never name the line a user or torch.nn wrote.
_TRACING = tuple(os.path.join(_TORCH_DIR, d) for d in (
    "_export", "export", "fx", "_dynamo", "_subclasses", "_ops.py", "_tensor.py", "utils", "_compile.py",
    "_library", "_higher_order_ops", "__init__.py", "_prims_common", "_refs", "_decomp", "_meta_registrations.py",
    "_functorch", "func", "overrides.py", "nn/modules/module.py", "_jit_internal.py", "_logging"))


def branch_line(exc: BaseException) -> str:
    """``file:line in fn: code`` of the innermost frame of the model's code (the user's or torch.nn's) in the
    traceback of ``exc``: the line whose tensor-valued branch or ``float()`` stopped the capture; "" if none."""
    import traceback

    frames = []
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # the traceback and the causes torch chains to it
        seen.add(id(e))
        frames = traceback.extract_tb(e.__traceback__) + frames
        e = e.__cause__ or e.__context__
    mine = [f for f in frames if not os.path.abspath(f.filename).startswith(_TRACING + (_OWN_DIR,))
            and "site-packages/torch/_" not in f.filename]
    if not mine:
        return ""
    f = mine[-1]
    path = f.filename
    if path.startswith(_TORCH_DIR):
        path = os.path.relpath(path, os.path.dirname(_TORCH_DIR))
    return f"{path}:{f.lineno} in {f.name}: {(f.line or '').strip()}"


def _renorm_in_place(graph) -> None:
    """``F.embedding(max_norm=...)`` renormalises the table in place through a detached alias, under no_grad:
    the lookup then reads the renormalised values with the table's own gradient.  Functionalised, the graph
    reads ``embedding_renorm(detach(weight))``, which would cut the gradient; the renorm reads the table itself
    (its lowering holds the renormalisation with stop_gradient, as torch holds it out of autograd)."""
    for node in graph.nodes:
        if node.op == "call_function" and str(node.target) == "aten.embedding_renorm.default":
            source = node.args[0]
            if getattr(source, "op", None) == "call_function" and str(source.target) == "aten.detach.default":
                node.replace_input_with(source, source.args[0])


def _with_batch_norm(table) -> dict:
    """The table with torch's decomposition of ``native_batch_norm``, for a trace at the example inputs.

    Traced below autograd, ``F.batch_norm`` is ``native_batch_norm``, whose
    schema does not say that it updates the running statistics in place;
    decomposed, the updates are ``copy_`` nodes, and the traced graph returns
    the updated values.
    """
    from torch._decomp import get_decompositions

    out = dict(table)
    out.update(get_decompositions([torch.ops.aten.native_batch_norm]))
    return out


class _Traced:
    """What ``read_graph`` reads of an ExportedProgram, for a graph traced at the example inputs (``make_fx``)."""

    def __init__(self, module, input_specs, output_specs):
        from types import SimpleNamespace

        self.graph_module = module
        self.graph = module.graph
        self.graph_signature = SimpleNamespace(input_specs=input_specs, output_specs=output_specs)
        self.constants: dict = {}
        self.refused = ""


def trace_at_example(wrapper: _Forward, example_inputs: tuple, table) -> _Traced:
    """The module's graph traced with real tensors at the example inputs, decomposed as ``export`` would.

    ``make_fx`` on the values themselves: a branch on a tensor's value, or its
    ``float()``, is taken as the example takes it and the value is kept as a
    constant (``_error_on_data_dependent_ops=False``).  Parameters, buffers
    and inputs are the graph's placeholders, in that order; the buffers are
    updated on copies, whose values are outputs after the module's, so a
    running statistic is a buffer mutation as torch.export reports one.
    """
    from torch.export.graph_signature import (
        InputKind,
        InputSpec,
        OutputKind,
        OutputSpec,
        TensorArgument,
    )
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils import _pytree as pytree

    params = [(n, p) for n, p in wrapper.named_parameters()]
    buffers = [(n, b) for n, b in wrapper.named_buffers()]
    n_out: list[int] = []

    def f(param_values, buffer_values, *inputs):
        state = dict(zip([n for n, _ in params], param_values))
        state.update((n, b.clone()) for (n, _), b in zip(buffers, buffer_values))
        out = torch.func.functional_call(wrapper, state, inputs, tie_weights=True, strict=False)
        leaves = pytree.tree_leaves(out)
        if not all(isinstance(v, torch.Tensor) for v in leaves):
            raise CaptureError("the module returns values that are not tensors; tracing at the example inputs "
                               "compares tensors only (return the tensors, or pass forward=)")
        n_out.append(len(leaves))
        return leaves + [state[n] for n, _ in buffers]

    values = ([p.detach() for _, p in params], [b.detach().clone() for _, b in buffers])
    # The forward's draws are the capture's (randomness.BRANCH_SEED): a branch on one (LayerDrop) is taken as
    # every backend's pinned draw will take it (randomness.Draws.pinned); both traces draw the same values.
    def trace(fn):
        with randomness.CaseRandom(randomness.BRANCH_SEED, None), _requires_grad_unchanged(), _module_stack(wrapper):
            return make_fx(fn, decomposition_table=table, tracing_mode="real", record_stack_traces=True,
                           _error_on_data_dependent_ops=False)(*values, *example_inputs)

    try:
        module = trace(torch.func.functionalize(f))
    except Exception as exc:
        module = _as_written(trace, f, exc)
    with randomness.CaseRandom(randomness.BRANCH_SEED, None):
        module = _functional(module, values, example_inputs)
    constants = _lift_constants(module)
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder" and n.name not in constants]
    kinds = ([(InputKind.PARAMETER, n, None) for n, _ in params] + [(InputKind.BUFFER, n, True) for n, _ in buffers]
             + [(InputKind.USER_INPUT, None, None)] * len(example_inputs))
    if len(placeholders) != len(kinds):
        raise CaptureError(f"tracing at the example inputs gave {len(placeholders)} graph inputs for {len(kinds)} "
                           "parameters, buffers and inputs")
    input_specs = [InputSpec(kind=k, arg=TensorArgument(name=node.name), target=t, persistent=pers)
                   for node, (k, t, pers) in zip(placeholders, kinds)]
    out_node = next(n for n in module.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    output_specs = [OutputSpec(kind=OutputKind.USER_OUTPUT, arg=TensorArgument(name=o.name), target=None)
                    for o in outs[:n_out[0]]]
    output_specs += [OutputSpec(kind=OutputKind.BUFFER_MUTATION, arg=TensorArgument(name=o.name), target=n)
                     for o, (n, _) in zip(outs[n_out[0]:], buffers)]
    input_specs += [InputSpec(kind=InputKind.CONSTANT_TENSOR, arg=TensorArgument(name=name), target=name,
                              persistent=None) for name in constants]
    traced = _Traced(module, input_specs, output_specs)
    traced.constants.update(constants)
    return traced


def _as_written(trace, f, refused: Exception):
    """``f`` traced without functionalisation, where functorch's ``functionalize`` refused it (``refused``, raised
    again if this fails too): an ``autograd.Function`` without ``setup_context``, the form most hand-written
    kernels take, cannot run under a functorch transform.  Traced as written, the Function's forward is recorded
    op by op and its in-place ops as they are; the second trace (``_functional``) makes the graph functional.
    torch's own runs call the Function itself, its backward included."""
    try:
        return trace(f)
    except Exception:
        raise refused from None


@contextlib.contextmanager
def _module_stack(root: nn.Module):
    """While the module is traced at the example, each node records the module calls it was made in
    (``nn_module_stack``, as torch.export records them), so that its submodules are units of the per-layer
    replay and a disagreement gets an origin under the model's own names.

    ``make_fx`` records them only for a module it is handed as the traced function, through proxies of its
    attributes; the module here is called by ``functional_call`` inside a function.  So a forward pre-hook and
    hook on every module keep the stack of calls, and the tracer copies it to each node it makes, as it copies
    an interpreter's node metadata (``torch.fx.traceback.preserve_node_meta``).  Entries are keyed as
    ``path@n`` for a module's n-th call after its first (``units._call_index``); a module that is not one of the
    model's (made in the forward) records nothing.
    """
    import collections

    import torch.fx.traceback as fx_traceback

    paths = {id(m): name for name, m in root.named_modules()}
    calls: collections.Counter = collections.Counter()
    stack: list = []  # (module, key, (path, class)) of the calls open now, outermost first

    def publish():
        fx_traceback.get_current_meta()["nn_module_stack"] = {key: entry for _, key, entry in stack}

    def enter(mod, args):
        path = paths.get(id(mod))
        if path is None:
            return
        n = calls[path]
        calls[path] += 1
        stack.append((mod, path + (f"@{n}" if n else ""), (path, type(mod))))
        publish()

    def leave(mod, args, out):
        # Down to this call: a call inside it that raised, and which the module caught, never left.
        for depth in range(len(stack) - 1, -1, -1):
            if stack[depth][0] is mod:
                del stack[depth:]
                publish()
                return

    hooks = (nn.modules.module.register_module_forward_pre_hook(enter),
             nn.modules.module.register_module_forward_hook(leave))
    try:
        with fx_traceback.preserve_node_meta():
            yield
    finally:
        for hook in hooks:
            hook.remove()


@contextlib.contextmanager
def _requires_grad_unchanged():
    """``Tensor.requires_grad_`` does nothing while the module is traced at the example.

    transformers' ``enable_input_require_grads()`` (which
    ``gradient_checkpointing_enable()`` calls) hooks the input embeddings to
    run ``output.requires_grad_(True)``, and functionalisation refuses that on
    the tensors it traces ("call requires_grad_() outside of a function being
    transformed").  A flag changes no value the graph computes: the graph
    differentiates every path from its placeholders, and a cut path is a
    ``detach`` node.  torch's own runs of the module keep the call.
    """
    original = torch.Tensor.requires_grad_

    def requires_grad_(self, requires_grad=True):
        return self

    torch.Tensor.requires_grad_ = requires_grad_
    try:
        yield
    finally:
        torch.Tensor.requires_grad_ = original


def _functional(module, values: tuple, example_inputs: tuple):
    """``module`` traced once more through functionalization alone, each node keeping its source.

    The decompositions of the first trace run below functionalization: one
    that writes in place (the attention kernel's dropout, ``empty().bernoulli_(p).div_(p)``,
    which torch.export keeps whole) reaches the graph as written, and the tape
    and jax lower only functional ops.  The second trace, with no
    decompositions, makes those ops functional (``bernoulli.p``, ``div.Scalar``)
    and leaves the others as they are.
    """
    import torch.fx.traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    def replay(*args):
        with fx_traceback.preserve_node_meta():
            return torch.fx.Interpreter(module).run(*args)

    # An explicit table, empty: without one, make_fx (from torch 2.14) rewrites every detach to an alias, and the
    # tape and jax would differentiate through a held input or a straight-through estimator's stopped term.
    return make_fx(torch.func.functionalize(replay), decomposition_table={}, tracing_mode="real",
                   record_stack_traces=True, _error_on_data_dependent_ops=False)(*values, *example_inputs)


def _lift_constants(module) -> dict:
    """The traced module's tensor constants (``get_attr`` nodes: a tensor made in the forward) as placeholders,
    as torch.export lifts them; returns them by placeholder name."""
    constants = {}
    first = next(iter(module.graph.nodes))
    for node in list(module.graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(module, node.target)
        with module.graph.inserting_before(first):
            placeholder = module.graph.placeholder(f"c_{node.target}")
        placeholder.meta.update(node.meta)
        node.replace_all_uses_with(placeholder)
        module.graph.erase_node(node)
        constants[placeholder.name] = value.detach() if isinstance(value, torch.Tensor) else value
    return constants


def read_graph(ep, wrapper: _Forward, n_inputs: int, training: bool, lowerings: dict | None = None) -> Graph:
    """The graph of ``ep`` as gradcheck runs it: its bindings, outputs, nodes, draws and problems.

    ``lowerings`` are lowerings of custom ops by the graph's op name (each
    ``lowered(ctx, *args, **kwargs)``, as ``references.lowerings`` makes them
    from a ``from_torch(references=...)``); the graph keeps those of the ops
    it calls, and only the ops that no lowering covers are its problems.
    """
    from torch.export.graph_signature import InputKind, OutputKind

    canonical_params = {id(p): strip(n) for n, p in wrapper.named_parameters()}
    canonical_buffers = {id(b): strip(n) for n, b in wrapper.named_buffers()}
    inputs: dict[str, Binding] = {}
    user = 0
    for spec in ep.graph_signature.input_specs:
        arg = getattr(spec.arg, "name", None)
        if spec.kind == InputKind.PARAMETER:
            tensor = wrapper.get_parameter(spec.target)
            inputs[arg] = Binding("param", canonical_params.get(id(tensor), strip(spec.target)))
        elif spec.kind == InputKind.BUFFER:
            tensor = wrapper.get_buffer(spec.target)
            inputs[arg] = Binding("buffer", canonical_buffers.get(id(tensor), strip(spec.target)))
        elif spec.kind in (InputKind.CONSTANT_TENSOR,):
            value = ep.constants[spec.target]
            inputs[arg] = Binding("constant", strip(spec.target), value=value.detach().cpu().numpy().copy())
        elif spec.kind == InputKind.USER_INPUT:
            if arg is None:  # a non-tensor input, baked into the graph
                user += 1
                continue
            inputs[arg] = Binding("input", index=user)
            user += 1
        else:
            raise CaptureError(f"the exported graph has an input of kind {spec.kind.name} ({spec.target}); "
                               "gradcheck reads parameters, buffers, tensor constants and tensor inputs only")
    if user != n_inputs:
        raise CaptureError(f"the exported graph has {user} user inputs for {n_inputs} example inputs")
    outputs: list[tuple[str, object]] = []
    n_user = 0
    for spec in ep.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            outputs.append(("output", n_user))
            n_user += 1
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            tensor = wrapper.get_buffer(spec.target)
            outputs.append(("buffer", canonical_buffers.get(id(tensor), strip(spec.target))))
        else:  # a user input mutated in place: the check compares outputs and gradients, not that
            outputs.append(("ignore", spec.kind.name))
    _renorm_in_place(ep.graph)
    nodes = list(ep.graph.nodes)
    draws = randomness.Draws(nodes)
    nodes = [n for n in nodes if not (n.op == "call_function" and op_name(n) == "aten._local_scalar_dense.default"
                                      and not n.users)]  # a value traced at the example, kept as a constant
    graph = Graph(training=training, program=ep, nodes=nodes, inputs=inputs, outputs=outputs, user_outputs=n_user,
                  draws=draws, refused=ep.refused if isinstance(ep, _Traced) else "")
    for node in nodes:
        if lowerings and node.op == "call_function" and op_name(node) in lowerings:
            graph.lowerings.setdefault(op_name(node), lowerings[op_name(node)])
        why = None if op_name(node) in graph.lowerings else unsupported(node)
        if why:
            graph.problems[node.name] = why
        if node.op == "placeholder" and inputs.get(node.name, Binding("")).kind == "constant" or (
                node.op == "call_function" and all(a.name in graph.constants for a in node.all_input_nodes)):
            graph.constants.add(node.name)
    return graph


def op_name(node) -> str:
    return str(node.target)


def unsupported(node) -> str | None:
    """Why the tape and jax cannot run ``node`` (no lowering), or None."""
    if node.op != "call_function":
        return None
    import operator

    if node.target is operator.getitem:
        return None
    name = op_name(node)
    if name in LOWERINGS:
        return None
    kind = ("a random op gradcheck does not draw" if randomness_like(name) else
            "a higher-order op (control flow or a wrapped region)" if "higher_order" in name else
            "an op without a lowering")
    name_ = spelled(name)
    return (f"{name} is {kind}: {where(node)}; {WAYS_TO_LOWER.format(op=name_)}"
            + (", or decompose=\"core\" to have torch decompose it" if _preserved(name) else ""))


def spelled(name: str) -> str:
    """An op as torch spells it: ``mylib.fused_gelu.default`` -> ``mylib::fused_gelu``, ``aten.add.Tensor`` ->
    ``aten::add.Tensor``; a name of another form (a Python function's) as it is."""
    parts = name.split(".")
    if len(parts) != 3 or not all(parts):
        return name
    return f"{parts[0]}::{parts[1]}" + ("" if parts[2] == "default" else f".{parts[2]}")


def randomness_like(name: str) -> bool:
    return bool(re.search(r"\b(rand|randn|randint|bernoulli|normal|uniform|multinomial|poisson)", name))


def _preserved(name: str) -> bool:
    return any(str(op) == name for op in PRESERVED)


def module_of(node) -> tuple[str, str]:
    """(dotted module path, class name) of the innermost module the node was traced in."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, kind = list(stack.values())[-1]
    kind = kind if isinstance(kind, str) else getattr(kind, "__qualname__", str(kind))
    return strip(path), kind.rsplit(".", 1)[-1]




def source_line(node) -> str:
    """``file:line in fn: code`` of the innermost frame of user code that made the node."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    user = [f for f in frames if not os.path.abspath(f[0]).startswith((_TORCH_DIR, _OWN_DIR))]
    chosen = (user or frames)[-1] if frames else None
    if chosen is None:
        return "source line unknown"
    path, line, fn, code = chosen
    inner = ""
    if frames and chosen is not frames[-1]:
        f = frames[-1]
        inner = f" (inside {os.path.relpath(f[0], os.path.dirname(_TORCH_DIR))}:{f[1]}: {f[3].strip()})"
    return f"{path}:{line} in {fn}: {code.strip()}{inner}"


def where(node) -> str:
    """Where a node comes from: the module path and class, and the source line."""
    path, kind = module_of(node)
    owner = f"module {path} ({kind})" if path else f"the root module ({kind})" if kind else "the root module"
    return f"node {node.name}, from {owner}, at {source_line(node)}"


def eager_failure(wrapper: _Forward, example_inputs: tuple, training: bool) -> BaseException | None:
    """What the module raises when torch runs it eagerly on the example inputs (None if it runs): a capture that
    failed is then the module's own failure on those inputs, not torch.export's, and is reported as such.  Runs on
    copies of the buffers, so the module stays at the case's point, and with gradients on, as a user's forward
    runs (one that takes a gradient inside would fail without)."""
    was = [m.training for m in wrapper.modules()]
    wrapper.train(training)
    try:
        buffers = {n: b.clone() for n, b in wrapper.named_buffers()}
        with torch.enable_grad():
            torch.func.functional_call(wrapper, buffers, tuple(example_inputs), strict=False)
    except Exception as exc:  # noqa: BLE001 - whatever the module raises is what the user must see
        return exc
    finally:
        for m, flag in zip(wrapper.modules(), was):
            m.training = flag
    return None


def _fails_eagerly(name: str, mode: str, exc: BaseException) -> str:
    message = str(exc).strip().splitlines()
    line = branch_line(exc)
    return (f"{name} ({mode} mode) fails on its example inputs when torch runs it as it is, before any capture: "
            f"{type(exc).__name__}: {message[0] if message else ''}" + (f"\n  raised at: {line}" if line else "")
            + "\nfrom_torch checks a module at the example inputs it is given: pass inputs it accepts (the shapes, "
            "dtypes and number it was built for; a model configured for an input size, such as an image size, "
            "takes that size), or a forward= that calls it as it works")


def example_outputs(wrapper: _Forward, example_inputs: tuple, training: bool):
    """The eager output's leaves (pytree order), their names, and which are float tensors."""
    from torch.utils import _pytree as pytree

    was = [m.training for m in wrapper.modules()]
    wrapper.train(training)
    try:
        # On copies of the buffers: a forward in training mode updates BatchNorm's running statistics in place,
        # and the module must stay at the point its graph was captured at (the case's point).
        buffers = {n: b.clone() for n, b in wrapper.named_buffers()}
        with torch.no_grad():
            out = torch.func.functional_call(wrapper, buffers, tuple(example_inputs), strict=False)
    finally:
        for m, flag in zip(wrapper.modules(), was):
            m.training = flag
    pairs, _ = pytree.tree_flatten_with_path(out)
    names = [_keyname(path) for path, _ in pairs]
    floats = [isinstance(v, torch.Tensor) and v.is_floating_point() for _, v in pairs]
    return names, floats


def _keyname(path) -> str:
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts)
