"""from_jax's framework side: each call form as one pure, named Model (gradcheck/frontends/jax/frameworks.py).

For every model of ``tests/jax_models.py`` (flax.linen, flax.nnx, equinox, plain jax, written as their users
write them): the leaves have the framework's own names; ``Model.call`` reproduces the user's own call (its
outputs and state updates) exactly in float64, and its ``jax.grad`` is the one through the user's own call;
every random draw depends on the key alone; the float64 run is float64 throughout; wrong call forms fail
with an error that names the thing, the value and the fix.

The user's own calls below are written here as a user writes them (``module.apply``, ``nnx.grad``,
``eqx.filter_grad``), independently of frameworks.py.
"""

from __future__ import annotations

import functools

import pytest

jax = pytest.importorskip("jax")
flax = pytest.importorskip("flax")
eqx = pytest.importorskip("equinox")

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx, traverse_util  # noqa: E402

jax.config.update("jax_enable_x64", True)  # before the models are made, as describe does before it traces

import jax_models as jm  # noqa: E402

from gradcheck.frontends.jax import frameworks as fw  # noqa: E402

DROPOUT = ("linen_mlp", "linen_encoder_block", "nnx_cnn", "nnx_transformer_block", "equinox_attention_block")
STATEFUL = ("linen_cnn", "linen_resnet_block", "nnx_cnn", "equinox_cnn", "jax_stateful")


# --- the models, at the user's float32 and at float64 -----------------------------------------------------


def _to64(x):
    return x.astype(jnp.float64) if isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.floating) else x


def _tree64(tree):
    return jax.tree_util.tree_map(_to64, tree)


def _user64(kind, target, args, kwargs):
    """The user's own objects with every float array in float64 (and flax's dtype attributes at float64)."""
    kwargs = dict(kwargs)
    if kind == "linen":
        widen = {f: jnp.float64 for f in ("dtype", "param_dtype") if f in {x.name for x in target.__dataclass_fields__.values()}}
        return target.clone(**widen), _tree64(args), kwargs
    if kind == "nnx":
        graphdef, state = nnx.split(target)
        return nnx.merge(graphdef, _tree64(state)), _tree64(args), kwargs
    if "state" in kwargs:
        kwargs["state"] = _tree64(kwargs["state"])
    return _tree64(target), _tree64(args), kwargs


@functools.cache
def made(name):
    """``(user objects at float32, at float64, Model of the float32 ones, Model of the float64 ones)``."""
    target, args, kwargs = jm.ALL[name]()
    kind = fw.kind_of(target)
    user64 = _user64(kind, target, args, kwargs)
    return (target, args, kwargs), user64, fw.describe(target, args, kwargs), fw.describe(*user64)


def _key(model, stream="key"):
    return jax.random.wrap_key_data(model.key[model.streams.index(stream)], impl=model.key_impl)


def user_call(model, target, args, kwargs):
    """``(output, {buffer name: new value})``: the model run as its user runs it, the state named by its framework."""
    kind = model.kind
    if kind == "linen":
        result = target.apply(*args, **kwargs)
        out, updates = result if kwargs.get("mutable") else (result, {})
        return out, traverse_util.flatten_dict(dict(updates), sep="/")
    if kind == "nnx":
        module = nnx.clone(target)
        out = module(*args)
        return out, _nnx_flat(nnx.state(module, nnx.BatchStat))
    extra = {"key": _key(model)} if "key" in model.streams else {}
    if kind == "equinox":
        state, call = kwargs.get("state"), kwargs.get("call")
        result = call(target, state, *args, **extra) if call else target(*args, **extra)
        if state is None:
            return result, {}
        out, new = result
        return out, _eqx_state(target, new)
    params, inputs = args[0], args[1:]
    if "state" not in kwargs:
        return target(params, *inputs, **extra), {}
    out, new = target(params, kwargs["state"], *inputs, **extra)
    return out, {"state" + jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(new)[0]}


def user_grads(model, target, args, kwargs, loss):
    """``{param name: gradient}`` of ``loss(output)`` through the user's own call, as each framework takes it."""
    kind = model.kind
    if kind == "linen":
        variables, inputs = args[0], args[1:]

        def f(params):
            out = target.apply({**variables, "params": params}, *inputs, **kwargs)
            return loss(out[0] if kwargs.get("mutable") else out)

        grads = jax.grad(f)(variables["params"])
        return {"params/" + k: v for k, v in traverse_util.flatten_dict(dict(grads), sep="/").items()}
    if kind == "nnx":
        return _nnx_flat(nnx.grad(lambda m: loss(m(*args)))(nnx.clone(target)))
    if kind == "equinox":
        extra = {"key": _key(model)} if "key" in model.streams else {}
        state, call = kwargs.get("state"), kwargs.get("call")

        def f(m):
            out = call(m, state, *args, **extra) if call else m(*args, **extra)
            return loss(out[0] if state is not None else out)

        grads = eqx.filter_grad(f)(target)
        return {jax.tree_util.keystr(p): g for p, g in jax.tree_util.tree_flatten_with_path(grads)[0]}
    params, inputs = args[0], args[1:]
    if "state" in kwargs:
        grads = jax.grad(lambda p: loss(target(p, kwargs["state"], *inputs)[0]))(params)
    else:
        grads = jax.grad(lambda p: loss(target(p, *inputs)))(params)
    return {jax.tree_util.keystr(p): g for p, g in jax.tree_util.tree_flatten_with_path(grads)[0]}


def _nnx_flat(state):
    def host(v):
        v = v[...] if isinstance(v, nnx.Variable) else v
        return np.asarray(jax.random.key_data(v) if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key) else v)

    return {"/".join(map(str, path)): host(v) for path, v in nnx.to_flat_state(state)}


def _eqx_state(model, state):
    """An equinox State named by where each StateIndex sits in the model, read through State.get."""
    is_index = lambda x: isinstance(x, eqx.nn.StateIndex)
    named = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(model, is_leaf=is_index)[0]:
        if is_index(leaf):
            for sub, v in jax.tree_util.tree_flatten_with_path(state.get(leaf))[0]:
                named[jax.tree_util.keystr(path) + jax.tree_util.keystr(sub)] = v
    return named


def _floats(tree):
    return [x for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]


def _loss_for(output, seed=0):
    """``<r, output>`` over the output's float leaves, ``r`` a fixed random cotangent (never sum: BatchNorm)."""
    rng = np.random.default_rng(seed)
    rs = [rng.standard_normal(np.shape(x)) for x in _floats(output)]
    return lambda out: sum(jnp.vdot(r, x) for r, x in zip(rs, _floats(out)))


def _equal(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    assert np.array_equal(a, b), f"{what}: differs by {np.max(np.abs(a - b))}"


# --- names --------------------------------------------------------------------------------------------------


def test_linen_names_are_flatten_dict_paths():
    for name in jm.LINEN:
        (module, args, kwargs), _, model, _ = made(f"linen_{name}")
        flat = traverse_util.flatten_dict(dict(args[0]), sep="/")
        assert set(model.params) == {k for k in flat if k.startswith("params/")}, name
        assert set(model.buffers) == {k for k in flat if not k.startswith("params/")}, name
    model = made("linen_mlp")[2]
    assert sorted(model.params) == ["params/Dense_0/bias", "params/Dense_0/kernel",
                                    "params/Dense_1/bias", "params/Dense_1/kernel"]
    assert sorted(made("linen_cnn")[2].buffers) == ["batch_stats/BatchNorm_0/mean", "batch_stats/BatchNorm_0/var"]
    resnet = made("linen_resnet_block")[2]
    assert {"params/conv_proj/kernel", "batch_stats/norm_proj/mean", "params/BatchNorm_1/scale"} <= set(
        resnet.params) | set(resnet.buffers)
    assert "params/ScanOptimizedLSTMCell_0/hf/bias" in made("linen_lstm")[2].params
    assert made("linen_mlp")[2].streams == ("dropout",)


def test_nnx_names_are_state_paths():
    for name in jm.NNX:
        module, model = made(f"nnx_{name}")[0][0], made(f"nnx_{name}")[2]
        assert set(model.params) == set(_nnx_flat(nnx.state(module, nnx.Param))), name
        assert set(model.buffers) == set(_nnx_flat(nnx.state(module, nnx.BatchStat))), name
    assert sorted(made("nnx_mlp")[2].params) == ["linear1/bias", "linear1/kernel", "linear2/bias", "linear2/kernel"]
    cnn = made("nnx_cnn")[2]
    assert sorted(cnn.buffers) == ["bn1/mean", "bn1/var"]
    assert cnn.streams == ("dropout/rngs/key",) and set(cnn.constants) == {"dropout/rngs/count"}
    assert made("nnx_transformer_block")[2].streams == ("attn/rngs/key", "dropout/rngs/key")


def test_equinox_and_plain_names_are_keystr_paths():
    for name in jm.EQUINOX:
        module, model = made(f"equinox_{name}")[0][0], made(f"equinox_{name}")[2]
        leaves = jax.tree_util.tree_flatten_with_path(eqx.filter(module, eqx.is_inexact_array))[0]
        assert list(model.params) == [jax.tree_util.keystr(p) for p, _ in leaves], name
    assert list(made("equinox_mlp")[2].params) == [f".layers[{i}].{w}" for i in range(3) for w in ("weight", "bias")]
    cnn = made("equinox_cnn")[2]
    assert sorted(cnn.buffers) == [".bn1.ema_state_index[0]", ".bn1.ema_state_index[1]"]
    assert set(cnn.constants) == {".bn1.ema_first_time_index"}
    assert sorted(made("jax_function")[2].params) == ["['encoder']['b']", "['encoder']['w']", "['head']['a']",
                                                      "['head']['w']"]
    stateful = made("jax_stateful")[2]
    assert list(stateful.buffers) == ["state['mean']"] and list(stateful.constants) == ["state['steps']"]


def test_inputs_outputs_and_display_names():
    lm = made("linen_tied_lm")[2]
    assert lm.input_names == ("input.0",) and lm.inputs[0].dtype == np.int32  # token ids: a constant input
    enc = made("linen_encoder_block")[2]
    assert enc.input_names == ("input.0", "input.1") and enc.inputs[1].dtype == np.bool_
    assert enc.output_names == ("output",)
    assert [made(n)[2].name for n in ("linen_mlp", "nnx_cnn", "equinox_gru", "jax_function")] == [
        "LinenMLP", "NnxCNN", "EqxGRU", "plain_model"]
    assert made("linen_mlp")[2].case_dtype == "float32" and made("linen_mlp")[3].case_dtype == "float64"

    def two_outputs(params, x):
        y = x @ params["w"]
        return {"logits": y, "argmax": jnp.argmax(y, -1), "aux": (jnp.tanh(y),)}

    model = fw.describe(two_outputs, ({"w": np.ones((3, 2))}, np.ones((4, 3))), {})
    assert model.output_names == ("output['aux'][0]", "output['logits']")  # the integer argmax is left out


# --- the call is the user's call ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(jm.ALL))
def test_call_reproduces_the_users_call_in_float64(name):
    _, (target, args, kwargs), model32, model = made(name)
    expected, expected_buffers = user_call(model, target, args, kwargs)
    for m in (model, model32.at("float64")):  # the float64 objects as given, and the float32 ones cast
        out, new = m.call(*m.args())
        assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(expected)
        for i, (a, b) in enumerate(zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(expected))):
            _equal(a, b, f"{name} output {i}")
        assert set(new) == set(m.buffers)
        for k, v in expected_buffers.items():
            if k in m.buffers:
                _equal(new[k], v, f"{name} buffer {k}")
        assert (set(expected_buffers) - set(m.buffers)) <= set(m.constants)  # an updated bool flag is a constant
    if name in STATEFUL:
        k = next(iter(model.buffers))
        assert not np.array_equal(np.asarray(new[k]), model.buffers[k]), f"{name}: the call updated no buffer"


@pytest.mark.parametrize("name", list(jm.ALL))
def test_grad_of_the_call_is_the_grad_through_the_users_call(name):
    _, (target, args, kwargs), _, model = made(name)
    out, _ = model.call(*model.args())
    loss = _loss_for(out)
    expected = user_grads(model, target, args, kwargs, loss)
    got = jax.grad(lambda p: loss(model.call(p, model.buffers, model.inputs, model.key)[0]))(model.params)
    assert set(got) == set(model.params) == set(expected)
    for k in got:
        _equal(got[k], expected[k], f"{name} grad {k}")
    assert any(np.any(np.asarray(g) != 0) for g in got.values())


def test_the_float32_call_is_the_users_float32_call():
    for name in ("linen_cnn", "nnx_transformer_block", "equinox_cnn", "jax_function"):
        (target, args, kwargs), _, model, _ = made(name)
        out, _ = model.call(*model.args())
        expected, _ = user_call(model, target, args, kwargs)
        _equal(jax.tree_util.tree_leaves(out)[0], jax.tree_util.tree_leaves(expected)[0], name)
        assert np.asarray(jax.tree_util.tree_leaves(out)[0]).dtype == np.float32


def test_the_call_is_traceable_over_flat_arrays():
    model = made("nnx_cnn")[3]
    closed = jax.make_jaxpr(model.call)(*model.args())
    assert len(closed.jaxpr.invars) == len(jax.tree_util.tree_leaves(model.args()))
    assert closed.jaxpr.invars[-1].aval.dtype == np.uint32  # the key is data, not a typed key
    assert model.trace().jaxpr.invars.__len__() == len(closed.jaxpr.invars)


def test_the_users_objects_are_not_changed():
    target, args, kwargs = jm.make_nnx_cnn()
    before = _nnx_flat(nnx.state(target))
    model = fw.describe(target, args, kwargs)
    model.at("float64").call(*model.at("float64").args())
    after = _nnx_flat(nnx.state(target))
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    assert all(np.dtype(d) == np.float32 for d in (target.conv1.param_dtype, target.bn1.param_dtype))


# --- randomness ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DROPOUT)
def test_masks_depend_on_the_key_alone(name):
    model = made(name)[3]
    first, again = (model.call(*model.args())[0] for _ in range(2))
    # Another key, checked to be one: nnx.Rngs(dropout=1)'s stream key is key_for(1)'s (split(key(1), 1)[0]).
    other_key = model.key_for(1234)
    assert not np.array_equal(other_key, model.key)
    other = model.call(model.params, model.buffers, model.inputs, other_key)[0]
    a, b, c = (np.asarray(jax.tree_util.tree_leaves(o)[0]) for o in (first, again, other))
    assert np.array_equal(a, b), f"{name}: two calls with one key drew different masks"
    assert not np.array_equal(a, c), f"{name}: another key drew the same masks"
    closed = model.trace()
    draws = [e for e in _equations(closed.jaxpr) if e.primitive.name in RANDOM_DRAWS]
    assert draws, f"{name}: no random draw in the jaxpr"
    assert _draws_on_differentiated(closed, model) == [], name


def test_the_users_own_key_is_the_models_key():
    (module, args, kwargs), _, model, _ = made("linen_mlp")
    assert np.array_equal(model.key[0], np.asarray(jax.random.key_data(kwargs["rngs"]["dropout"])))
    legacy = fw.describe(module, args, {**kwargs, "rngs": {"dropout": jax.random.PRNGKey(7)}})
    _equal(legacy.call(*legacy.args())[0], model.call(*model.args())[0], "a legacy uint32 key")

    def noisy(params, x, key):
        return x * params["w"] + jax.random.normal(key, x.shape)

    key = jax.random.key(5)
    given = fw.describe(noisy, ({"w": np.ones(3)}, np.ones(3), key), {})
    assert given.streams == ("input.1",) and np.array_equal(given.key[0], np.asarray(jax.random.key_data(key)))
    _equal(given.call(*given.args())[0], noisy({"w": jnp.ones(3)}, jnp.ones(3), key), "a key given as an input")
    nnx_model = made("nnx_cnn")[2]
    assert np.array_equal(nnx_model.key[0], np.asarray(jax.random.key_data(made("nnx_cnn")[0][0].dropout.rngs.key[...])))


def test_a_call_that_takes_key_gets_the_case_key():
    model = made("equinox_attention_block")[2]
    assert model.streams == ("key",)
    assert np.array_equal(model.key, model.key_for(0)) and not np.array_equal(model.key_for(0), model.key_for(1))
    seeded = fw.describe(*jm.make_equinox_attention_block()[:2], {**jm.make_equinox_attention_block()[2], "seed": 3})
    assert np.array_equal(seeded.key, model.key_for(3))


def test_the_taint_check_can_fail():
    def mask_from_params(params, x, *, key):  # a draw that depends on a differentiated leaf
        k = jax.random.fold_in(key, (jnp.sum(params["w"]) > 0).astype(jnp.int32))
        return x * params["w"] * jax.random.bernoulli(k, 0.5, x.shape)

    model = fw.describe(mask_from_params, ({"w": np.ones(3)}, np.ones(3)), {})
    assert _draws_on_differentiated(model.trace(), model) != []


RANDOM_DRAWS = {"random_bits", "random_split", "random_fold_in", "threefry2x32"}


def _equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _equations(sub)


def _draws_on_differentiated(closed, model) -> list[str]:
    """The random draws in the jaxpr whose operands depend on a parameter or a float input."""
    n_params = len(model.params)
    n_buffers = len(model.buffers)
    invars = closed.jaxpr.invars
    floats = [n_params + n_buffers + i for i, x in enumerate(model.inputs) if np.issubdtype(x.dtype, np.floating)]
    tainted = {v for i, v in enumerate(invars) if i < n_params or i in floats}
    found: list[str] = []
    _taint(closed.jaxpr, tainted, found)
    return found


def _taint(jaxpr, tainted, found):
    """Forward dependence on ``tainted`` vars through ``jaxpr``; sub-jaxprs get the taint of their operands."""
    for eqn in jaxpr.eqns:
        hit = [v for v in eqn.invars if not isinstance(v, jax.extend.core.Literal) and v in tainted]
        if eqn.primitive.name in RANDOM_DRAWS and hit:
            found.append(f"{eqn.primitive.name} at {eqn.source_info}")
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            if len(sub.invars) <= len(eqn.invars):  # the trailing operands (cond's branches drop the index)
                ops = eqn.invars[len(eqn.invars) - len(sub.invars):]
                inner = {s for s, o in zip(sub.invars, ops) if not isinstance(o, jax.extend.core.Literal) and o in tainted}
            else:  # an arity this does not know: everything inside depends on any tainted operand
                inner = set(sub.invars) if hit else set()
            _taint(sub, inner, found)
        if hit:
            tainted.update(eqn.outvars)


# --- modes ------------------------------------------------------------------------------------------------


def test_nnx_eval_mode_is_respected():
    module, (x,), _ = jm.make_nnx_cnn()
    module.eval()
    model = fw.describe(module, (x,), {})
    out, new = model.call(*model.args())
    other = model.call(model.params, model.buffers, model.inputs, model.key_for(9))[0]
    _equal(out, other, "eval mode draws no mask")
    _equal(out, nnx.clone(module)(x), "eval mode is the user's eval call")
    assert all(np.array_equal(new[k], model.buffers[k]) for k in model.buffers)  # running averages used, not updated
    module.train()
    assert not np.array_equal(np.asarray(fw.describe(module, (x,), {}).call(*model.args())[0]), np.asarray(out))


def test_linen_and_equinox_deterministic_modes():
    (module, args, kwargs), _, _, _ = made("linen_mlp")
    model = fw.describe(module, args, {**kwargs, "train": False})
    a = model.call(*model.args())[0]
    _equal(a, model.call(model.params, model.buffers, model.inputs, model.key_for(4))[0], "linen deterministic")
    target, args, kwargs = jm.make_equinox_attention_block()
    model = fw.describe(eqx.nn.inference_mode(target), args, kwargs)
    a = model.call(*model.args())[0]
    _equal(a, model.call(model.params, model.buffers, model.inputs, model.key_for(4))[0], "equinox inference")


# --- float64 throughout ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(jm.ALL))
def test_the_float64_run_is_float64_throughout(name):
    model = made(name)[2].at("float64")
    assert fw.narrow_floats(model.trace()) == []
    out, _ = model.call(*model.args())
    loss = _loss_for(out)
    backward = jax.make_jaxpr(jax.grad(lambda p: loss(model.call(p, model.buffers, model.inputs, model.key)[0])))
    assert fw.narrow_floats(backward(model.params)) == []  # custom_vjp backwards and transposes included


class F32Dense(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4, dtype=jnp.float32)(x)  # a submodule that computes in float32 whatever its params are
        return nn.LayerNorm(dtype=jnp.float32)(h)


class F32Nnx(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(3, 4, dtype=jnp.float32, rngs=rngs)

    def __call__(self, x):
        return self.linear(x)


class F32Rope(eqx.Module):
    rope: eqx.nn.RotaryPositionalEmbedding
    linear: eqx.nn.Linear

    def __call__(self, x):
        return self.rope(jax.vmap(self.linear)(x))


def _widen_cases():
    x = jm._normal(1, (2, 3))
    dense = F32Dense()
    yield "linen", dense, (dense.init(jax.random.key(0), x), x), {}
    yield "nnx", F32Nnx(nnx.Rngs(0)), (x,), {}
    rope = F32Rope(eqx.nn.RotaryPositionalEmbedding(4, dtype=jnp.float32), eqx.nn.Linear(3, 4, dtype=jnp.float32,
                                                                                            key=jax.random.key(0)))
    yield "equinox", rope, (jm._normal(2, (5, 3)),), {}
    scan = jm.LSTMTagger()  # its cell makes the carry in the default param_dtype, float32
    xs = jm._normal(5, (2, 4, 3))
    yield "linen lstm", scan, (scan.init(jax.random.key(0), xs), xs), {}


@pytest.mark.parametrize("case", list(_widen_cases()), ids=lambda c: c[0])
def test_float32_dtype_attributes_run_in_float64(case):
    _, target, args, kwargs = case
    model = fw.describe(target, args, kwargs)
    as_written = replace_widened(model.at("float64"), False)
    narrow = fw.narrow_floats(as_written.trace()) if _traces(as_written) else ["the scan carry mismatches"]
    assert narrow, "the module computes in float32 as written: the control must see it"
    widened = model.at("float64")
    assert fw.narrow_floats(widened.trace()) == []
    out = jax.tree_util.tree_leaves(widened.call(*widened.args())[0])[0]
    assert np.asarray(out).dtype == np.float64
    user64 = _user64(fw.kind_of(target), target, args, kwargs)
    if model.kind == "linen" and "param_dtype" in target.__dataclass_fields__:
        reference = fw.describe(*user64)  # the user's own float64 spelling of it (param_dtype=float64)
        _equal(out, jax.tree_util.tree_leaves(reference.call(*reference.args())[0])[0], "widened is float64-native")


def replace_widened(model, widened):
    import dataclasses

    return dataclasses.replace(model, widened=widened)


def _traces(model):
    try:
        model.trace()
    except fw.TraceError:
        return False
    return True


def test_narrow_floats_names_the_users_cast():
    def casts(params, x):
        return jnp.tanh((x @ params["w"]).astype(jnp.float32)).astype(jnp.float64)

    model = fw.describe(casts, ({"w": np.ones((3, 2))}, np.ones((4, 3))), {}).at("float64")
    found = fw.narrow_floats(model.trace())
    assert found and found[0].startswith("convert_element_type -> float32[4,2] at ") and "test_jax_frameworks.py" in found[0]


# --- errors -------------------------------------------------------------------------------------------------


def test_a_closure_over_a_leaked_tracer_is_named():
    leaked = []

    @jax.jit
    def make(w):
        leaked.append(lambda params, x: params["a"] * x * w)
        return w

    make(jnp.ones(3))
    with pytest.raises(fw.TraceError, match=r"make.<locals>.<lambda> closes over 1 traced value\(s\) "
                                            r"\(DynamicJaxprTracer float64\[3\]\).*pass that value in as a parameter"):
        fw.describe(leaked[0], ({"a": np.ones(3)}, np.ones(3)), {})


def test_a_python_branch_on_an_array_is_named():
    def branches(params, x):
        if jnp.sum(x) > 0:
            return x * params["w"]
        return x

    with pytest.raises(fw.TraceError) as info:
        fw.describe(branches, ({"w": np.ones(3)}, np.ones(3)), {})
    message = str(info.value)
    assert "the function test_a_python_branch_on_an_array_is_named.<locals>.branches" in message
    assert "TracerBoolConversionError" in message and "jax.lax.cond" in message
    assert "test_jax_frameworks.py" in message and "if jnp.sum(x) > 0" in message


def test_a_model_that_fails_at_its_inputs_names_the_call():
    target, _, kwargs = jm.make_nnx_mlp()
    with pytest.raises(fw.TraceError, match=r"NnxMLP\(\*inputs\) at the example inputs"):
        fw.describe(target, (np.ones((4, 7), np.float32),), kwargs)


X = np.ones((4, 5), np.float32)


@pytest.mark.parametrize("args, kwargs, message", [
    ((), {}, r"takes its variables after it.*got nothing"),
    ((X,), {}, r"takes its variables after it.*got a ndarray float32\[4, 5\]"),
    (({"Dense_0": {}},), {}, r"collections \['Dense_0'\] and no 'params'.*not variables\['params'\]"),
    (("variables",), {"rngs": None}, r"takes its variables"),
], ids=["no variables", "inputs first", "params alone", "a string"])
def test_linen_call_form_errors(args, kwargs, message):
    with pytest.raises(fw.CallFormError, match=message):
        fw.describe(jm.LinenMLP(), args, kwargs)


def test_linen_rngs_and_bound_module_errors():
    (module, args, kwargs), _, _, _ = made("linen_mlp")
    with pytest.raises(fw.CallFormError, match=r"rngs=.*dict of keys by rng stream"):
        fw.describe(module, args, {**kwargs, "rngs": jax.random.key(0)})
    with pytest.raises(fw.CallFormError, match=r"is bound.*unbind"):
        fw.describe(module.bind(args[0]), args, {})


def test_other_call_form_errors():
    target, args, _ = jm.make_nnx_mlp()
    with pytest.raises(fw.CallFormError, match=r"nnx module NnxMLP is called as from_jax\(module, \*inputs\).*got state="):
        fw.describe(target, args, {"state": {}})
    module, args, kwargs = jm.make_equinox_cnn()
    with pytest.raises(fw.CallFormError, match=r"state=dict .*eqx.nn.State"):
        fw.describe(module, args, {**kwargs, "state": {}})
    with pytest.raises(fw.CallFormError, match=r"stateful layers \(\.bn1\.ema_first_time_index, \.bn1\.ema_state_index\)"
                                               r".*pass state=state"):
        fw.describe(module, args, {"call": kwargs["call"]})
    with pytest.raises(fw.CallFormError, match=r"equinox module EqxCNN .*got mode=str 'train'"):
        fw.describe(module, args, {**kwargs, "mode": "train"})
    fn, args, _ = jm.make_jax_function()
    with pytest.raises(fw.CallFormError, match=r"no params for the function plain_model"):
        fw.describe(fn, (), {})
    with pytest.raises(fw.CallFormError, match=r"function plain_model .*got train=bool True"):
        fw.describe(fn, args, {"train": True})
    with pytest.raises(fw.CallFormError, match=r"params\['lr'\] of .* Python number 0.1.*jnp.asarray\(0.1\)"):
        fw.describe(lambda p, x: x * p["lr"], ({"lr": 0.1}, X), {})
    with pytest.raises(fw.CallFormError, match=r"got the class LinenMLP, not a model.*LinenMLP\(...\)"):
        fw.describe(jm.LinenMLP, (), {})
    with pytest.raises(fw.CallFormError, match=r"the model is int 3; from_jax takes a flax.linen Module"):
        fw.describe(3, (), {})
    with pytest.raises(fw.CallFormError, match=r"dtype='float16'; the case dtype is 'float32' or 'float64'"):
        fw.describe(fn, args, {"dtype": "float16"})
    with pytest.raises(fw.CallFormError, match=r"seed='0'; the case seed is an int"):
        fw.describe(fn, args, {"seed": "0"})


def test_stateful_function_must_return_its_state():
    fn, args, kwargs = jm.make_jax_stateful()
    with pytest.raises(fw.CallFormError, match=r"must return \(output, new_state\).*returned a .*float32\[4, 3\]"):
        fw.describe(lambda p, s, x: fn(p, s, x)[0], args, kwargs)
    with pytest.raises(fw.CallFormError, match=r"new_state has the structure .* its state"):
        fw.describe(lambda p, s, x: (fn(p, s, x)[0], {"mean": s["mean"]}), args, kwargs)


def test_traced_arguments_and_keys_in_the_model_are_refused():
    fn, (params, x), _ = jm.make_jax_function()

    @jax.jit
    def inside(x):
        fw.describe(fn, (params, x), {})
        return x

    with pytest.raises(fw.CallFormError, match=r"input.0 given to plain_model is a traced value .*outside any jax transformation"):
        inside(x)
    with pytest.raises(fw.CallFormError, match=r"\['k'\] of the function .*<lambda> is a jax random key"):
        fw.describe(lambda p, x: x, ({"k": jax.random.key(0), "w": np.ones(3)}, np.ones(3)), {})


def test_gradchecks_own_keywords_never_reach_the_model():
    (module, args, kwargs), _, _, _ = made("linen_cnn")  # linen passes every other keyword to apply
    model = fw.describe(module, args, {**kwargs, "name": "my cnn", "seed": 3, "dtype": "float64"})
    assert (model.name, model.seed, model.case_dtype) == ("my cnn", 3, "float64")
    model.call(*model.args())
