"""``gradcheck.from_jax``: a jax model as it is written (flax.linen, flax.nnx, equinox, a plain function), checked
on jax, the tape and torch.

Each model of ``tests/jax_models.py`` agrees across the three backends under the runner's verdict, with the
framework's leaf names, its buffers compared, its dropout masks the same on every backend.  Each way of being
wrong is caught and blamed on the right party, next to a clean control: a wrong ``custom_vjp`` in the user's
code on jax (with its origin named), a lowering's wrong VJP on the tape or on torch, a lowering that computes
something else before anyone is blamed, a lowering that drops a gradient on the tape and torch together, a
primitive without a lowering as a check on jax alone that says so.
"""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
pytest.importorskip("equinox")
torch = pytest.importorskip("torch")

import faults  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax_models as jm  # noqa: E402
from jax import lax  # noqa: E402

import gradcheck  # noqa: E402
from gradcheck import ops  # noqa: E402
from gradcheck.backends import backend_of  # noqa: E402
from gradcheck.check.runner import RunOptions, run_case  # noqa: E402
from gradcheck.frontends.jax import from_jax, primitives  # noqa: E402

ALL = ("jax", "tape", "torch")
# The models of the list, in each framework's idiom (the wrong custom_vjp is a fault below).
MODELS = [name for name in jm.ALL if name != "jax_wrong_vjp"]


def check(target, *args, options=None, **kwargs):
    return run_case(from_jax(target, *args, **kwargs), options or RunOptions(repeat=False))


def made(name, **extra):
    """``(target, args, kwargs)`` of the model ``name`` of ``tests/jax_models.py``, with ``extra`` keywords."""
    target, args, kwargs = jm.ALL[name]()
    return target, args, {**kwargs, **extra}


def check_model(name, options=None, **extra):
    target, args, kwargs = made(name, **extra)
    return check(target, *args, options=options, **kwargs)


def failing(res) -> str:
    lines = [f"{leaf.path} [{leaf.role}] {leaf.verdict} blame={leaf.blame}: {leaf.message}"
             for leaf in res.leaves if leaf.verdict not in ("agree", "vacuous")]
    return "\n".join(lines + [f"{k}: {v}" for k, v in {**res.errors, **res.unavailable}.items()])


def assert_agree(res):
    assert not res.errors and not res.unavailable, failing(res)
    assert sorted(res.timings) == sorted(ALL)
    assert res.verdict == "agree", failing(res)
    assert res.leaves_compared > 0


def paths(res, role):
    return [leaf.path for leaf in res.leaves if leaf.role == role]


# ---------------------------------------------------------------- every framework's models agree
@pytest.mark.parametrize("name", MODELS)
def test_models_agree_on_every_backend_under_the_frameworks_names(name):
    target, args, kwargs = made(name)
    case = from_jax(target, *args, **kwargs)
    model = case.build(None)
    res = run_case(case, RunOptions(repeat=False))
    assert_agree(res)
    described = model._program.model
    assert set(paths(res, "param")) == set(described.params)  # the framework's own names
    floats = [n for n, v in described.buffers.items() if v.dtype.kind == "f"]
    assert set(paths(res, "buffer")) == set(floats)  # BatchNorm statistics: updated and compared
    assert res.dtype == "float32"  # as the user has it, measured
    # linen_resnet_block's 1x1, stride-2 projection is where torch 2.13's channels-last float32 kernel is wrong:
    # ok because the lowering hands torch contiguous operands (test_a_lowered_convolution_is_contiguous_for_torch)
    assert res.float32 in ("ok", "unmeasured"), failing(res)


def test_a_lowered_convolution_is_contiguous_for_torch():
    """jax's NHWC input and HWIO kernel reach torch as views: a channels-last input, on which torch 2.13's float32
    weight gradient of a 1x1, stride-2 convolution is off by about half with several threads (and the heap is
    corrupted with one).  The torch backend's convolution takes them contiguous, so its float32 weight gradient
    is its float64 one to rounding on every torch.  Negative control: without the ``contiguous`` in
    ``gradcheck.backends.torch.ops._conv_args`` this fails on torch 2.13.0+cpu (relative error 0.4-1.0)."""
    import torch

    from gradcheck.backends.torch import ops as torch_ops

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 8, 4, generator=g, dtype=torch.float64).permute(0, 3, 1, 2)  # NHWC, viewed as NCHW
    w = torch.randn(1, 1, 4, 6, generator=g, dtype=torch.float64).permute(3, 2, 0, 1)  # HWIO, viewed as OIHW
    for conv, kernel in ((torch_ops.conv, w), (torch_ops.conv_transpose, w.transpose(0, 1))):
        grads = []
        for dtype in (torch.float64, torch.float32):
            xd, wd = x.to(dtype).requires_grad_(), kernel.to(dtype).requires_grad_()
            out = conv(xd, wd, stride=2)
            grads.append([grad.double() for grad in torch.autograd.grad(out, (xd, wd), torch.ones_like(out))])
        for g64, g32 in zip(*grads):
            assert (g32 - g64).norm() <= 1e-5 * g64.norm(), (conv.__name__, float((g32 - g64).norm() / g64.norm()))


@pytest.mark.parametrize("name, seed", [("linen_mlp", 1), ("linen_mlp", 2), ("jax_function", 1), ("jax_function", 2),
                                        ("equinox_cnn", 1), ("nnx_cnn", 1)])
def test_models_agree_at_other_seeds(name, seed):
    """Another cotangent, other referee directions, other keys for the streams the model was given none for."""
    assert_agree(check_model(name, seed=seed))


def test_names_in_the_results_are_the_frameworks():
    res = check_model("linen_cnn")
    assert {"params/Conv_0/kernel", "params/Dense_0/bias", "batch_stats/BatchNorm_0/mean"} <= {
        leaf.path for leaf in res.leaves}
    assert paths(res, "input") == ["input"]
    layers = {leaf.path: leaf.layer for leaf in res.leaves}
    assert layers["params/Conv_0/kernel"] == "Conv" and layers["batch_stats/BatchNorm_0/var"] == "BatchNorm"
    eqx = check_model("equinox_mlp")
    assert paths(eqx, "param")[:2] == [".layers[0].weight", ".layers[0].bias"]
    assert {leaf.layer for leaf in eqx.leaves if leaf.role == "param"} == {"Linear"}
    plain = check_model("jax_function")
    assert set(paths(plain, "param")) == {"['encoder']['w']", "['encoder']['b']", "['head']['w']", "['head']['a']"}


def test_dropout_masks_are_the_same_on_every_backend():
    """The tape's and torch's outputs are jax's to rounding: one mask off would move an element by its value."""
    target, args, kwargs = made("linen_mlp")
    case = from_jax(target, *args, **kwargs)
    model, x = case.build(None), np.asarray(args[1], np.float64)
    from gradcheck.case import cast_floats

    model = cast_floats(model, np.float64)
    outs = {b: np.asarray(gradcheck.withgradient(lambda m, x: ops.sum(m(x)), model, x, backend=b)[0])
            for b in ("tape", "torch", "jax")}
    assert outs["tape"] == pytest.approx(outs["jax"], rel=1e-12) and outs["torch"] == pytest.approx(outs["jax"], rel=1e-12)
    assert any("random draw" in note and "dropout" in note for note in case.notes)
    # A stream the model was given no key for takes it from the case seed: another seed, other masks.
    target, args, kwargs = made("equinox_attention_block")
    one, other = (from_jax(target, *args, **kwargs, seed=s).build(None) for s in (0, 1))
    x = np.asarray(args[0], np.float64)
    a, b = (np.asarray(m(x)) for m in (cast_floats(one, np.float64), cast_floats(other, np.float64)))
    assert not np.allclose(a, b)


# ---------------------------------------------------------------- faults, blamed on the right party
def test_a_wrong_custom_vjp_is_blamed_on_jax_with_its_origin():
    res = check_model("jax_wrong_vjp", dtype="float64")
    wrong = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert wrong and all(leaf.blame == ["jax"] and leaf.referee for leaf in wrong), failing(res)
    assert "['head']['a']" in {leaf.path for leaf in wrong}
    line = jm.scaled_tanh_wrong.fun.__code__.co_firstlineno  # where Python says the rule's function starts
    origin = res.origin
    assert origin is not None and origin.path == "scaled_tanh" and origin.blame == ["jax"], origin
    assert origin.layer == "custom_vjp" and re.search(rf"jax_models\.py:{line}\b", origin.message), origin.message
    assert_agree(check_model("jax_function", dtype="float64"))  # the control: the right rule agrees


def _tape_only(fn):
    """A lowering that runs ``fn`` on the tape and the table's own lowering elsewhere."""
    original = primitives.LOWERINGS["tanh"]
    return lambda ctx, x, **kw: fn(x) if backend_of(x) == "tape" else original(ctx, x, **kw)


def test_a_wrong_vjp_in_a_lowering_is_blamed_on_the_tape(monkeypatch):
    from gradcheck.backends.tape.tape import Primitive

    # tanh's forward, with a VJP that forgets to square (1 - tanh^2).
    bad = Primitive("bad_tanh", np.tanh).defvjp(lambda g, ans, x: ops.mul(g, ops.sub(1.0, ans)))
    monkeypatch.setitem(primitives.LOWERINGS, "tanh", _tape_only(bad))
    res = check_model("jax_function", dtype="float64")
    wrong = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert wrong and all(leaf.blame == ["tape"] for leaf in wrong), failing(res)
    # Upstream of a tanh: the encoder's, and the head's weight before scaled_tanh's (its scale a is not).
    assert "['head']['a']" not in {leaf.path for leaf in wrong}


def test_a_wrong_backward_in_a_lowering_is_blamed_on_torch(monkeypatch):
    faults.wrong_jax_tanh(monkeypatch, "torch", 1.001)
    res = check_model("jax_function", dtype="float64")
    wrong = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert wrong and all(leaf.blame == ["torch"] for leaf in wrong), failing(res)


def test_a_lowering_that_computes_something_else_is_caught_before_blaming_jax(monkeypatch):
    monkeypatch.setitem(primitives.LOWERINGS, "tanh", lambda ctx, x, **_: ops.mul(ops.tanh(x), 1.0 + 1e-6))
    res = check_model("jax_function", dtype="float64")
    for backend in ("tape", "torch"):
        message = res.unavailable[backend]
        assert "the lowering of tanh disagrees with jax's" in message, message
        assert "jax_models.py:" in message and "gradcheck/frontends/jax/primitives.py" in message
    assert "jax" in res.timings and not any("jax" in leaf.blame for leaf in res.leaves)
    grads = [leaf for leaf in res.leaves if leaf.role in ("param", "input")]
    assert grads and all(leaf.verdict == "agree" and [c.backend for c in leaf.referee] == ["jax"] for leaf in grads)
    partial = check_model("jax_function", dtype="float64", options=RunOptions(repeat=False, unavailable="fail"))
    assert partial.verdict == "partial"


def test_a_lowering_that_drops_a_gradient_is_blamed_on_the_tape_and_torch(monkeypatch):
    """Right values, no gradient: the referee (on the same values) sides with jax against both."""
    monkeypatch.setitem(primitives.LOWERINGS, "tanh", lambda ctx, x, **_: np.tanh(np.asarray(ops.to_numpy(x))))
    res = check_model("jax_function", dtype="float64")
    wrong = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert wrong and all(sorted(leaf.blame) == ["tape", "torch"] and leaf.referee for leaf in wrong), failing(res)


# ---------------------------------------------------------------- what cannot be lowered, said
def _cube_primitive():
    from jax.extend import core as jcore
    from jax.interpreters import ad, mlir

    prim = jcore.Primitive("gc_from_jax_cube")
    prim.def_impl(lambda x: x * x * x)
    prim.def_abstract_eval(lambda x: x)
    ad.defjvp(prim, lambda g, x: 3.0 * x * x * g)
    mlir.register_lowering(prim, mlir.lower_fun(lambda x: x * x * x, multiple_results=False))
    return prim


CUBE = _cube_primitive()


def cubed(params, x):
    return jnp.tanh(CUBE.bind(x @ params["w"]))  # the line the message names


def test_a_primitive_without_a_lowering_is_a_check_on_jax_alone_that_says_so(monkeypatch):
    params, x = {"w": np.linspace(-1, 1, 12).reshape(4, 3)}, np.linspace(-1, 1, 8).reshape(2, 4)
    case = from_jax(cubed, params, x, dtype="float64")
    line = inspect.getsourcelines(cubed)[1] + 1
    note = next(n for n in case.notes if "gc_from_jax_cube" in n)
    assert "jax only" in note
    res = run_case(case, RunOptions(repeat=False))
    for backend in ("tape", "torch"):
        message = res.unavailable[backend]
        assert "'gc_from_jax_cube' has no lowering" in message and re.search(rf"test_from_jax\.py:{line}\b", message)
        assert "@gradcheck.frontends.jax.lowering('gc_from_jax_cube')" in message
        assert "with the jax backend alone" in message
    grads = [leaf for leaf in res.leaves if leaf.role in ("param", "input")]
    assert grads and all(leaf.verdict == "agree" and [c.backend for c in leaf.referee] == ["jax"] for leaf in grads)
    # The public way out: lowered, the model is checked on every backend.
    monkeypatch.setitem(primitives.LOWERINGS, "gc_from_jax_cube", None)

    @gradcheck.frontends.jax.lowering("gc_from_jax_cube")
    def cube(x):
        return ops.mul(ops.mul(x, x), x)

    assert_agree(check(cubed, params, x, dtype="float64"))


def times_default_ones(params, x):
    return jnp.tanh(x @ params["w"]) * jnp.ones(3)  # jax's default float: float64 under the x64 gradcheck turns on


def times_typed_ones(params, x):
    return jnp.tanh(x @ params["w"]) * jnp.ones(3, x.dtype)


def test_a_value_of_jaxs_default_float_is_float32_in_the_float32_run():
    """With x64 off, as the model is run, ``jnp.ones(3)`` is float32; under gradcheck's x64 it is float64, and jax's
    float32 run computed the output in float64.  That was once a structural float32 failure blamed on jax.  Every
    float of a run is the run's dtype (the tape's and torch's rule), the note names the line, and a model whose
    values carry the data's dtype has no such note.  Negative control: without ``_narrowed`` in
    ``gradcheck.frontends.jax.model.Program.call`` the output leaf is structural with jax blamed."""
    params = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)}
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    case = from_jax(times_default_ones, params, x)
    assert case.dtype == "float32"
    line = inspect.getsourcelines(times_default_ones)[1] + 1
    note = next(n for n in case.notes if "jax's float32 run computes in float64" in n)
    assert re.search(rf"test_from_jax\.py:{line}\b", note), note
    res = run_case(case, RunOptions(repeat=False))
    assert_agree(res)
    assert res.float32 == "ok", failing(res)
    assert {leaf.path for leaf in res.leaves} >= {"output", "['w']", "input"}
    typed = from_jax(times_typed_ones, params, x)
    assert not [n for n in typed.notes if "float64" in n], typed.notes


def scanned_from_a_float32_carry(params, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ params["w"] + x), None), jnp.zeros(3, jnp.float32), xs)[0]


def scanned_from_a_typed_carry(params, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ params["w"] + x), None), jnp.zeros(3, xs.dtype), xs)[0]


def test_a_model_that_does_not_trace_in_float64_says_why_and_the_way_out():
    """A float32 carry the model makes itself meets the float64 values of the widened trace, and jax refuses the
    scan.  The model runs as written, so the error says that, where, and what to change (it once told the user
    to check that their call runs); with the data's dtype the same model is checked and agrees."""
    params = {"w": np.linspace(-1, 1, 9, dtype=np.float32).reshape(3, 3)}
    xs = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    assert scanned_from_a_float32_carry(params, xs).dtype == jnp.float32  # it runs as written
    with pytest.raises(gradcheck.frontends.jax.TraceError) as info:
        from_jax(scanned_from_a_float32_carry, params, xs)
    message = str(info.value)
    assert "traces as written, in float32, but jax cannot trace its float64 version" in message
    assert "test_from_jax.py:" in message and "jnp.zeros(n, x.dtype)" in message
    assert "check that this call runs" not in message
    assert_agree(run_case(from_jax(scanned_from_a_typed_carry, params, xs), RunOptions(repeat=False)))


def cubed_and_permuted(params, x):
    # Integer constants (an iota, an index normalised against the axis length) are the jaxpr's constant part.
    return (jnp.tanh(CUBE.bind(x @ params["w"])) * (jnp.arange(3) + 1))[:, jnp.array([2, 0, 1])]


def test_a_float32_model_checked_on_jax_alone_is_measured_in_float32():
    """On jax alone the jax backend's compiled call is the first to ask for the float32 program, and the
    constant part must still be computed eagerly under its trace (it was once a tracer there, and the case an
    error).  Negative control: without ``ensure_compile_time_eval`` in ``interpreter.evaluate_constants``
    this case's float32 run is an error (TracerArrayConversionError)."""
    params, x = {"w": np.linspace(-1, 1, 12).reshape(4, 3)}, np.linspace(-1, 1, 8).reshape(2, 4)
    case = from_jax(cubed_and_permuted, params, x, dtype="float32")
    res = run_case(case, RunOptions(repeat=False))
    assert not res.errors, res.errors
    assert set(res.unavailable) == {"tape", "torch"}
    assert res.verdict == "agree" and res.float32 == "ok", failing(res)
    grads = [leaf for leaf in res.leaves if leaf.role in ("param", "input")]
    assert grads and all(list(leaf.float32.errors) == ["jax"] for leaf in grads)


# ---------------------------------------------------------------- conventions, state, modes
def test_relus_gradient_at_zero_is_jaxs_convention_on_every_backend():
    """jax.nn.relu's gradient at 0 is 0; its body max(x, 0) would give 0.5 there (a rule, not the primal)."""

    def at_zero(params, x):
        return jax.nn.relu(x @ params["w"]) * params["s"]

    x = np.array([[0.0, 0.0], [1.0, -2.0], [0.5, 0.25]])  # the first row's pre-activations are exactly 0
    res = check(at_zero, {"w": np.array([[1.0, -1.0, 0.5], [0.5, 2.0, -1.0]]), "s": np.array([1.0, 2.0, 3.0])}, x,
                dtype="float64")
    assert_agree(res)


def test_a_stateful_function_updates_its_state_as_buffers():
    res = check_model("jax_stateful")
    assert_agree(res)
    assert paths(res, "buffer") == ["state['mean']"]


def test_eval_mode_is_the_users():
    target, args, _ = made("nnx_cnn")
    target.eval()
    assert_agree(check(target, *args))


# ---------------------------------------------------------------- the ways in: assert_gradients_agree, the CLI
def test_assert_gradients_agree_takes_from_jaxs_arguments():
    target, args, kwargs = made("linen_mlp")
    gradcheck.assert_gradients_agree(target, *args, **kwargs, dtype="float64")
    with pytest.raises(gradcheck.assertions.GradientsDisagree, match=r"jax"):
        target, args, _ = made("jax_wrong_vjp")
        gradcheck.assert_gradients_agree(target, *args, dtype="float64")


def test_the_cli_runs_a_target_that_returns_from_jax_cases_or_their_arguments(tmp_path, monkeypatch, capsys):
    from gradcheck import results
    from gradcheck.app import cli

    (tmp_path / "myjaxchecks.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "import gradcheck\n"
        "def mlp(params, x):\n"
        "    return jnp.tanh(x @ params['w1']) @ params['w2']\n"
        "P = {'w1': jnp.linspace(-1, 1, 12).reshape(4, 3), 'w2': jnp.linspace(0, 1, 6).reshape(3, 2)}\n"
        "X = jnp.linspace(-1, 1, 8).reshape(2, 4)\n"
        "def cases():\n"
        "    return [gradcheck.from_jax(mlp, P, X, name='mlp')]\n"
        "def calls():\n"
        "    return mlp, (P, X)\n"
        "def broken():\n"
        "    return mlp, (P, X[:, :3])\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for target in ("myjaxchecks:cases", "myjaxchecks:calls"):
        out = tmp_path / target.replace(":", "_")
        assert cli.main(["run", target, "--output", str(out), "-q"]) == 0
        [case] = results.load(out / "results.jsonl").cases
        assert case.verdict == "agree" and {"['w1']", "['w2']"} <= {x.path for x in case.leaves}
        assert "[&#x27;w1&#x27;]" in (out / "report.html").read_text() or "['w1']" in (out / "report.html").read_text()
    data = [json.loads(line) for line in (tmp_path / "myjaxchecks_calls" / "results.jsonl").read_text().splitlines()]
    assert {"['w1']", "['w2']"} <= {leaf["path"] for leaf in data[1]["case"]["leaves"]}
    capsys.readouterr()
    assert cli.main(["run", "myjaxchecks:broken", "--output", str(tmp_path / "b"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "jax cannot trace the function mlp" in err and "Traceback" not in err


def test_importing_gradcheck_imports_no_jax_flax_or_equinox():
    code = ("import gradcheck, gradcheck.frontends.jax, gradcheck.assertions, sys; "
            "print([m for m in ('jax', 'flax', 'equinox') if m in sys.modules]); gradcheck.from_jax")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]"]


def test_jax_cannot_trace_says_why_and_where():
    def branches(params, x):
        if jnp.sum(x) > 0:  # a Python branch on a traced value
            return x * params["w"]
        return x

    with pytest.raises(gradcheck.frontends.jax.TraceError, match=r"TracerBoolConversionError.*jax\.lax\.cond"):
        from_jax(branches, {"w": np.ones(3)}, np.ones(3))


def test_control_flow_and_remat_agree():
    def flow(params, x):
        h = jax.checkpoint(lambda w, x: jnp.sin(x @ w))(params["w"], x)
        h = lax.cond(jnp.sum(h) > 0, lambda h: h * params["a"], lambda h: h - params["a"], h)
        _, ys = lax.scan(lambda c, r: (c * 0.5 + r, jnp.tanh(c + r)), jnp.zeros(h.shape[1]), h)
        return ys

    params = {"w": np.linspace(-1, 1, 12).reshape(4, 3), "a": np.array([0.5, -1.0, 2.0])}
    assert_agree(check(flow, params, np.linspace(-1, 2, 20).reshape(5, 4), dtype="float64"))
