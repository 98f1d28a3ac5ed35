"""A jax model that computes part of its float64 run in float32 because it casts there itself.

equimo's attention, like many jax models, takes its softmax in float32 (``logits.astype(jnp.float32)``) whatever
the model's dtype.  gradcheck cannot widen that cast in jax's run (jax runs the user's own code), so the tape and
torch follow it too (``primitives.run_float``): every backend computes that part in float32, and the
backends, whose float32 kernels round differently, are held to float32's reach at the point
(``conditioning.within_reach`` with the case's ``float64_computes_in``).  The referee's step and rounding floor are
taken at float32's epsilon there (``referee.step_for``), so it still resolves the gradient.

Before, the tape and torch computed the cast part in float64: jax's own forward differed from theirs by float32's
rounding, the tape and torch were made unavailable, and the referee's 1e-8 step on a forward that rounds to
float32 resolved nothing ("nothing was compared"); on equimo's ViT the forwards stayed within tolerance, and jax
was blamed by majority for its float32 softmax.  Each backend's wrong gradient inside the float32 part is still
blamed on it, beside a clean control.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402

from gradcheck import ops  # noqa: E402
from gradcheck.backends import backend_of  # noqa: E402
from gradcheck.check.runner import RunOptions, run_case  # noqa: E402
from gradcheck.frontends.jax import from_jax, primitives  # noqa: E402

FACTOR = 1.01
UPSTREAM = {"input", "['w1']", "['w2']"}  # the leaves whose gradients pass through the float32 softmax


def _model(rule=lambda v: v):
    def cast_model(params, x):
        h = jnp.tanh(x @ params["w1"])
        logits = rule((h @ params["w2"]).astype(jnp.float32))  # the model's own cast: a float32 softmax
        weights = jax.nn.softmax(logits * 3.0, axis=-1)
        return jnp.sin(weights.astype(x.dtype) @ params["w3"] * 3.0)

    return cast_model


@jax.custom_vjp
def _wrong_rule(v):
    return v


_wrong_rule.defvjp(lambda v: (v, None), lambda _, g: (g * FACTOR,))


def _point(seed: int):
    rng = np.random.default_rng(seed)
    params = {"w1": rng.standard_normal((8, 16)) / 3, "w2": rng.standard_normal((16, 16)) / 4,
              "w3": rng.standard_normal((16, 4))}
    return params, rng.standard_normal((6, 8))


def _run(seed: int, model=None):
    case = from_jax(model or _model(), *_point(seed), seed=seed)
    return case, run_case(case, RunOptions(repeat=False))


def _failing(res) -> str:
    lines = [f"{leaf.path} {leaf.verdict} blame={leaf.blame}: {leaf.message}" for leaf in res.leaves
             if leaf.verdict not in ("agree", "vacuous")]
    return "\n".join(lines + [f"{k}: {v}" for k, v in {**res.errors, **res.unavailable}.items()])


@pytest.mark.parametrize("seed", range(4))
def test_a_model_that_casts_to_float32_agrees_on_every_backend(seed):
    case, res = _run(seed)
    assert case.float64_computes_in == "float32"
    assert any("computes in a narrower float" in n and "float32's reach" in n for n in case.notes), case.notes
    assert not res.errors and not res.unavailable, _failing(res)
    assert sorted(res.timings) == ["jax", "tape", "torch"]
    assert res.verdict == "agree" and res.leaves_compared > 0, _failing(res)
    # The referee resolves the gradients through the float32 part (its step taken at float32's epsilon).
    checks = [c for leaf in res.leaves for c in leaf.referee]
    assert checks and all(c.stable and c.agrees for c in checks), [(c.backend, c.stable, c.error) for c in checks]


@pytest.mark.parametrize("followed", [True, False], ids=["cast followed", "cast widened"])
def test_without_float32s_reach_the_cast_model_disagrees(monkeypatch, followed):
    """The negative controls of the above, the mechanism taken apart: held to float64's own reach, the backends'
    float32 kernels disagree with no one to blame and the referee cannot resolve the float32 part at float64's
    step; and with the tape and torch computing the cast part in float64 too (gradcheck as it was), jax is
    blamed by majority for the float32 softmax its model asks for."""
    if not followed:
        monkeypatch.setattr(primitives, "FOLLOWED", frozenset())
    case = from_jax(_model(), *_point(0), seed=0).with_(float64_computes_in="float64")
    res = run_case(case, RunOptions(repeat=False))
    wrong = [leaf for leaf in res.leaves if leaf.verdict == "disagree"]
    assert res.verdict == "disagree" and wrong, _failing(res)
    upstream = [c for leaf in res.leaves if leaf.path in UPSTREAM for c in leaf.referee]
    if followed:
        assert all(not leaf.blame for leaf in wrong) and not any(c.stable for c in upstream), _failing(res)
    else:
        assert all(leaf.blame == ["jax"] for leaf in wrong), _failing(res)


def _scaled_exp_gradient(backend: str):
    """A lowering of exp whose gradient is FACTOR too large on ``backend`` alone (inside the float32 softmax)."""
    original = primitives.LOWERINGS["exp"]
    if backend == "tape":
        from gradcheck.backends.tape.tape import Primitive

        bad = Primitive("bad_exp", np.exp).defvjp(lambda g, ans, x: ops.mul(ops.mul(g, ans), FACTOR))
    else:
        class ScaledExp(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = torch.exp(x)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return g * y * FACTOR

        bad = ScaledExp.apply
    return lambda ctx, x, **kw: bad(x) if backend_of(x) == backend else original(ctx, x, **kw)


@pytest.mark.parametrize("backend", ["jax", "tape", "torch"])
def test_a_wrong_gradient_inside_the_float32_part_is_blamed_on_its_backend(monkeypatch, backend):
    if backend == "jax":  # the user's own rule on the float32 logits: jax runs it, the tape and torch the identity
        model = _model(_wrong_rule)
    else:
        monkeypatch.setitem(primitives.LOWERINGS, "exp", _scaled_exp_gradient(backend))
        model = None
    _, res = _run(1, model)
    wrong = {leaf.path: leaf.blame for leaf in res.leaves if leaf.verdict == "disagree"}
    # Upstream of the softmax: the input, w1 and w2; w3 is after it, and its gradient is right everywhere.
    assert set(wrong) == UPSTREAM, _failing(res)
    assert all(blame == [backend] for blame in wrong.values()), _failing(res)


def test_a_flax_dtype_given_by_name_is_widened_like_a_dtype(monkeypatch):
    """flax takes ``dtype="float32"`` as well as ``jnp.float32`` (flaxmodels' ResNet does); both are the
    framework's dtype attribute, widened for the float64 run, not a cast of the user's.  Negative control: with
    names left as they are, the float64 run computes the Dense in float32."""
    nn = pytest.importorskip("flax.linen")

    class NamedDtype(nn.Module):
        dtype: str = "float32"

        @nn.compact
        def __call__(self, x):
            return jnp.tanh(nn.Dense(4, dtype=self.dtype, param_dtype="float32")(x))

    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    model = NamedDtype()
    variables = model.init(jax.random.key(0), x)
    case = from_jax(model, variables, x)
    assert case.float64_computes_in == "float64", case.notes
    assert not [n for n in case.notes if "narrower float" in n], case.notes
    res = run_case(case, RunOptions(repeat=False))
    assert res.verdict == "agree" and not res.unavailable, _failing(res)
    from gradcheck.frontends.jax import frameworks

    monkeypatch.setattr(frameworks, "_dtype_named", lambda name: name)
    assert from_jax(model, variables, x).float64_computes_in == "float32"


# -- kinks inside the float32 part: float64 runs pinned as float32 runs are -----------------------------------
SHIFT = 0.37  # the float32 part adds it; c below takes (a + SHIFT) back off, exactly, where the kink is to sit


def _kink_point(seed: int, shape=(4, 6)):
    """``(c, a, params, x)``: float32 ``c`` equal to ``a + SHIFT`` in half the elements, half a unit off in the rest."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    a = rng.standard_normal(shape).astype(np.float32)
    c = a + np.float32(SHIFT)
    c = np.where(rng.random(shape) < 0.5, c, c - np.float32(0.5) * rng.choice([-1, 1], shape)).astype(np.float32)
    params = {"v": (rng.standard_normal((6, 3)) / 2).astype(np.float32),
              "w": (rng.standard_normal((6, 3)) / 2).astype(np.float32)}
    return c, a, params, x


def _gate_model(c, a):
    """A comparison the float32 part computes to exactly 0 in half its elements, gating ``x @ w``.  No leaf moves
    it (``y * 0``), so neither the referee's steps nor the probe of float64's reach cross it."""
    def gate_model(params, x):
        y = x @ params["w"]
        z = ((y.astype(jnp.float32) * 0 + a) + SHIFT) - c  # the model's own float32 part
        return jnp.tanh(x @ params["v"]) + jnp.where(z > 0, y, 0.5 * y)

    return gate_model


def _relu_model(c, rule):
    """A relu whose input the float32 part computes to exactly 0 in half its elements, from ``x`` itself."""
    def relu_model(params, x):
        z = (x.astype(jnp.float32) + SHIFT) - c
        return jnp.tanh(x @ params["v"]) + (jax.nn.relu(rule(z)).astype(x.dtype) + x) @ params["w"]

    return relu_model


def _add_rounding_up(backend: str):
    """A lowering of add whose float32 results on ``backend`` alone are one unit in the last place higher: a
    kernel that rounds the other way, within float32's rounding, with add's gradient unchanged."""
    original = primitives.LOWERINGS["add"]

    def add(ctx, a, b, **kw):
        y = original(ctx, a, b, **kw)
        if backend_of(y) != backend or np.dtype(ops.dtype_of(y)) != np.float32:
            return y
        value = np.asarray(ops.to_numpy(y))
        return ops.add(y, ops.asarray(np.nextafter(value, np.float32(np.inf)) - value, like=y))

    return add


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("backend", ["tape", "torch"])
def test_a_kink_within_the_float32_part_is_not_blamed_on_the_backend_that_rounds_across_it(monkeypatch, seed,
                                                                                           backend):
    """A comparison whose operand the float32 part computes to exactly 0, on a backend whose float32 add rounds
    one unit up (``_add_rounding_up``): its float64 run, which follows the model's cast, takes the other side,
    a whole term of the gradients it gates.  Pinned to the reference's decisions, as float32 runs are
    (``CaseRun.pin64``), it agrees, and the crossing is said.  Negative control: float64 runs unpinned (gradcheck as
    it was), the backend is blamed for its rounding."""
    monkeypatch.setitem(primitives.LOWERINGS, "add", _add_rounding_up(backend))
    c, a, params, x = _kink_point(seed, (4, 3))
    case = from_jax(_gate_model(c, a), params, x, seed=seed)
    assert case.float64_computes_in == "float32"
    res = run_case(case, RunOptions(repeat=False))
    assert not res.errors and not res.unavailable, _failing(res)
    assert res.verdict == "agree" and res.leaves_compared == 4, _failing(res)
    assert any(n.startswith(f"{backend}: its float64 run took the other side") for n in res.notes), res.notes

    from gradcheck.check import runner

    monkeypatch.setattr(runner.CaseRun, "pin64", property(lambda self: False))
    res = run_case(case, RunOptions(repeat=False))
    wrong = {leaf.path: leaf.blame for leaf in res.leaves if leaf.verdict == "disagree"}
    assert wrong == {"output": [backend], "input": [backend], "['w']": [backend]}, _failing(res)


def test_a_kink_within_the_float32_part_agrees_when_no_backend_rounds_across_it():
    """The clean control of the above: every backend computes the float32 part alike, nothing crosses."""
    c, a, params, x = _kink_point(0, (4, 3))
    res = run_case(from_jax(_gate_model(c, a), params, x, seed=0), RunOptions(repeat=False))
    assert res.verdict == "agree" and res.leaves_compared == 4, _failing(res)
    assert not any("took the other side" in n for n in res.notes), res.notes


@pytest.mark.parametrize("wrong", [False, True], ids=["clean", "jax's rule 1% wrong"])
def test_a_wrong_gradient_through_kinks_in_the_float32_part_is_blamed(wrong):
    """Relu inputs the float32 part computes to exactly 0, from the input itself: with float64 runs and the probe of
    float64's reach pinned, jax's own rule 1 % wrong on them (``_wrong_rule``) is blamed on jax, and the clean model
    agrees."""
    c, _, params, x = _kink_point(0)
    res = run_case(from_jax(_relu_model(c, _wrong_rule if wrong else (lambda v: v)), params, x, seed=0),
                   RunOptions(repeat=False))
    found = {leaf.path: leaf.blame for leaf in res.leaves if leaf.verdict == "disagree"}
    assert found == ({"input": ["jax"]} if wrong else {}), _failing(res)
