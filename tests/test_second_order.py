"""Second order across backends: Hessian-vector products per leaf, float64 decides, float32 is measured,
each backend refereed by central differences of its own gradient; a backend that cannot differentiate
twice says so by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck import reports, results
from gradcheck.backends import get_backend
from gradcheck.backends.base import all_leaves
from gradcheck.case import Case
from gradcheck.check import second_order
from gradcheck.check.runner import CaseRun, RunOptions, run, run_case
from gradcheck.layers.models import MODELS

torch = pytest.importorskip("torch")
pytest.importorskip("jax")


def hvp_leaves(res):
    return [leaf for leaf in res.leaves if leaf.role == "hvp"]


def conv_bn(rng):
    return L.Chain(L.Conv2d(3, 4, 3, padding=1, rng=rng), L.BatchNorm2d(4), L.Tanh(),
                   L.Conv2d(4, 4, 3, stride=2, rng=rng), L.BatchNorm2d(4), L.ReLU(), L.Flatten(),
                   L.Dense(4 * 3 * 3, 3, rng=rng))


CONV_BN = Case("conv_bn", conv_bn, lambda rng: (rng.standard_normal((2, 3, 8, 8)),))
TANH_MLP = MODELS["mlp"].case(size="small", activation="tanh", name="mlp_tanh")


def _agrees(res, backends, vacuous=()):
    """Every hvp leaf agrees, refereed; ``vacuous``: those whose Hessian rows are exactly zero."""
    hv = hvp_leaves(res)
    assert res.verdict == "agree", [(x.path, x.verdict, x.message) for x in res.leaves if x.failing] or res.errors
    assert hv and all(x.verdict in ("agree", "vacuous") for x in hv)
    assert {x.path for x in hv if x.verdict == "vacuous"} == set(vacuous)
    checked = [x for x in hv if x.verdict == "agree"]
    for x in checked:
        assert {p.backend for p in x.pairs} | {p.reference for p in x.pairs} == set(backends)
        # every backend refereed by its own gradient, sharply: an error of 1e-3 of ||H v|| is 10x its resolution
        assert {c.backend for c in x.referee} == set(backends) and all(c.agrees and c.stable for c in x.referee)
        assert all(c.resolution < 1e-4 * max(x.norms.values()) for c in x.referee)
    assert res.second_order.backends == sorted(backends, key=["torch", "jax", "tape"].index)
    return hv


def test_mlp_second_order_agrees_in_float64_and_is_measured_in_float32():
    res = run_case(MODELS["mlp"].case(size="small"), RunOptions(order=2))
    hv = _agrees(res, ("tape", "torch", "jax"), vacuous={"hvp:4.bias"})
    assert [x.path for x in hv] == ["hvp:" + p for p in ("0.weight", "0.bias", "2.weight", "2.bias", "4.weight",
                                                         "4.bias", "input")]
    # The head's bias enters the loss linearly: its Hessian row is exactly zero, which checks nothing.
    assert next(x for x in hv if x.path == "hvp:4.bias").verdict == "vacuous"
    f32 = [x.float32 for x in hv if x.float32 is not None]
    assert f32 and all(f.verdict == "ok" and max(f.errors.values()) < 1e-5 for f in f32)
    # The first-order leaves are untouched and still first; hvp leaves are counted as compared.
    assert [x.role for x in res.leaves[: -len(hv)]].count("hvp") == 0
    assert res.leaves_compared == sum(1 for x in res.leaves if x.pairs)
    assert set(res.second_order.timings) == {"tape", "torch", "jax"}


def test_lenet5_tape_cannot_differentiate_max_pool_twice_and_says_so():
    res = run_case(MODELS["lenet5"].case(size="small", dtype="float64"), RunOptions(order=2))
    why = "tape: max_pool2d has no second derivative"
    assert res.second_order.unavailable == {"tape": why}
    hv = _agrees(res, ("torch", "jax"), vacuous={"hvp:fc3.bias"})
    assert all(x.unavailable == {"tape": why} and why in x.message for x in hv)
    assert any(why in n for n in res.notes) and "tape" not in res.errors and not res.unavailable
    summary = reports.render_summary(run_result(res))
    assert f"SECOND ORDER {res.name} — {why}" in summary and "PASS" in summary


def test_conv_batchnorm_second_order_agrees():
    # A conv bias followed by train-mode BatchNorm has no effect on the loss: its rows are exactly zero.
    _agrees(run_case(CONV_BN, RunOptions(order=2)), ("tape", "torch", "jax"),
            vacuous={"hvp:0.bias", "hvp:3.bias", "hvp:7.bias"})


def test_transformer_second_order_agrees_where_torch_attention_has_no_double_backward():
    # torch's CPU attention kernel has no derivative of its backward: torch is unavailable for order 2, named.
    res = run_case(MODELS["transformer"].case(size="small", dtype="float64"), RunOptions(order=2))
    assert res.second_order.unavailable == {
        "torch": "torch: scaled_dot_product_flash_attention_for_cpu has no second derivative"}
    _agrees(res, ("jax", "tape"))


# ---------------------------------------------------------------- a wrong second derivative
class _TanhFirstOrderOnly(torch.autograd.Function):
    """tanh whose backward is right in value but treats tanh(x) as a constant: its derivative is wrong."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y.detach() ** 2)


def test_a_wrong_second_derivative_is_caught_and_blamed_on_its_backend(monkeypatch):
    from gradcheck.backends.torch import ops as torch_ops

    monkeypatch.setattr(torch_ops, "tanh", _TanhFirstOrderOnly.apply)
    res = run_case(TANH_MLP, RunOptions(order=2))
    first = [x for x in res.leaves if x.role != "hvp"]
    assert all(x.verdict == "agree" for x in first)  # the first derivative is right
    bad = [x for x in hvp_leaves(res) if x.verdict == "disagree"]
    assert bad and res.verdict == "disagree" and all(x.blame == ["torch"] for x in bad)
    x = bad[0]
    assert "torch: its Hessian-vector product is not the derivative of its own gradient" in x.message
    assert "jax and tape match" in x.message
    assert {c.backend: c.agrees for c in x.referee} == {"torch": False, "jax": True, "tape": True}
    assert x.path in reports.render_summary(run_result(res)) and "FAIL" in reports.render_summary(run_result(res))


def tanh_first_order_only(monkeypatch, backend):
    """``backend``'s tanh: value and first derivative right, its derivative treating tanh(x) as a constant."""
    if backend == "torch":
        from gradcheck.backends.torch import ops as torch_ops

        monkeypatch.setattr(torch_ops, "tanh", _TanhFirstOrderOnly.apply)
    elif backend == "jax":
        import jax
        import jax.numpy as jnp

        from gradcheck.backends.jax import ops as jax_ops

        @jax.custom_jvp
        def tanh(x):
            return jnp.tanh(x)

        @tanh.defjvp
        def _(primals, tangents):
            y = jnp.tanh(primals[0])
            return y, tangents[0] * (1 - jax.lax.stop_gradient(y) ** 2)

        monkeypatch.setattr(jax_ops, "tanh", tanh)
    else:
        from gradcheck import ops
        from gradcheck.backends.tape import ops as tape_ops

        right = tape_ops.tanh.vjps[0]
        monkeypatch.setitem(tape_ops.tanh.vjps, 0, lambda g, ans, x: right(g, ops.stop_gradient(ans), x))


ALL = ("tape", "torch", "jax")


@pytest.mark.parametrize("backend", ALL)
def test_a_wrong_second_derivative_on_each_backend_is_blamed_on_that_backend(monkeypatch, backend):
    clean = run_case(TANH_MLP, RunOptions(order=2))  # the control
    _agrees(clean, ALL, vacuous={"hvp:4.bias"})
    tanh_first_order_only(monkeypatch, backend)
    res = run_case(TANH_MLP, RunOptions(order=2))
    assert [(x.path, x.verdict) for x in res.leaves if x.role != "hvp" and x.verdict != "agree"] == []
    hv = {x.path: x for x in hvp_leaves(res)}
    bad = {p: x for p, x in hv.items() if x.verdict == "disagree"}
    # Every Hessian row through a tanh's second derivative: all but the head's (its rows hold tanh' only).
    assert set(bad) == {"hvp:" + p for p in ("0.weight", "0.bias", "2.weight", "2.bias", "input")}, sorted(bad)
    assert {p: x.blame for p, x in bad.items()} == {p: [backend] for p in bad}
    for x in bad.values():  # each backend refereed by its own gradient: only the wrong one misses its own
        assert {c.backend: c.agrees for c in x.referee} == {b: b != backend for b in ALL}, x.referee
    assert {p: x.verdict for p, x in hv.items() if p not in bad} == {"hvp:4.weight": "agree", "hvp:4.bias": "vacuous"}
    assert res.verdict == "disagree"


def test_one_backend_alone_is_held_against_its_own_referee(monkeypatch):
    from gradcheck.backends.torch import ops as torch_ops

    monkeypatch.setattr(torch_ops, "tanh", _TanhFirstOrderOnly.apply)
    res = run_case(TANH_MLP.with_(dtype="float64"), RunOptions(backends=("torch",), order=2))
    bad = [x for x in hvp_leaves(res) if x.verdict == "disagree"]
    assert bad and res.verdict == "disagree"
    assert all(x.blame == ["torch"] and x.message.startswith("torch: the Hessian-vector product misses") for x in bad)


def test_unavailability_is_read_from_each_framework_s_own_words():
    cases = {
        "tape": NotImplementedError("tape op 'max_pool2d_grad' has no gradient with respect to argument 1; pass"),
        "torch": NotImplementedError("the derivative for '_cdist_backward' is not implemented."),
        "jax": NotImplementedError("Differentiation rule for 'custom_lin' not implemented"),
    }
    assert {b: second_order.no_second_derivative(b, e) for b, e in cases.items()} == {
        "tape": "tape: max_pool2d has no second derivative", "torch": "torch: cdist has no second derivative",
        "jax": "jax: custom_lin has no second derivative"}
    assert second_order.no_second_derivative("torch", RuntimeError("CUDA out of memory")) is None


def test_another_error_is_that_backend_s_error(monkeypatch):
    real = second_order.hvp

    def broken(driver, *a):
        if driver.name == "jax":
            raise RuntimeError("boom")
        return real(driver, *a)

    monkeypatch.setattr(second_order, "hvp", broken)
    res = run_case(CONV_BN.with_(dtype="float64"), RunOptions(order=2))
    assert res.verdict == "error" and "RuntimeError: boom" in res.errors["jax (second order)"]
    assert res.second_order.backends == ["torch", "tape"] and hvp_leaves(res)


def test_the_hvp_is_h_times_v():
    # Every backend's H v against central differences of the tape's float64 gradient, elementwise.
    case = MODELS["mlp"].case(size="small", activation="tanh", hidden=(5,), in_features=4, out_features=3)
    cr = CaseRun(case.with_(dtype="float64"))
    f = cr.loss_fn(cr.cotangents64)
    point = {x.path: np.asarray(x.value) for x in all_leaves(cr.args64, cr.prefixes) if x.trainable}
    v = second_order.directions(point, 0, salt=0)
    tape = get_backend("tape")
    h = 1e-6

    def grad_at(s):
        from gradcheck.tree import replace_leaves

        args = [replace_leaves(a, {p: point[p] + s * h * v[p] for p in point}, pre)
                for a, pre in zip(cr.args64, cr.prefixes)]
        return tape.evaluate(f, args, cr.prefixes).grads

    plus, minus = grad_at(1), grad_at(-1)
    for name in ("tape", "torch", "jax"):
        hv = second_order.hvp(get_backend(name), f, cr.args64, cr.prefixes, v)
        for p in point:
            np.testing.assert_allclose(hv[p], (plus[p] - minus[p]) / (2 * h), rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- results and reports
def run_result(*cases):
    return results.RunResult(env={"seed": 0}, cases=list(cases), planned=len(cases))


def test_second_order_results_round_trip_and_render(tmp_path, monkeypatch):
    from gradcheck.backends.torch import ops as torch_ops

    monkeypatch.setattr(torch_ops, "tanh", _TanhFirstOrderOnly.apply)
    rr = run([TANH_MLP.with_(dtype="float64")], RunOptions(order=2), results_path=tmp_path / "r.jsonl")
    again = results.load(tmp_path / "r.jsonl")
    assert again.cases[0].second_order == rr.cases[0].second_order
    assert [x.path for x in again.cases[0].leaves] == [x.path for x in rr.cases[0].leaves]
    assert results.run_from_dict(json.loads(results.dumps(rr))).cases[0] == rr.cases[0]
    page = reports.render_html(again)
    assert page == reports.render_html(rr)
    assert "Second order" in page and "class='second-order'" in page
    from test_reports import check_html

    check_html(page)
    # the hvp rows are a table of their own, not rows of the first-order table or nodes of the tree
    data = json.loads(page.split('id="gradcheck-data">')[1].split("</script>")[0])
    assert [c["name"] for c in data["cases"]] == ["mlp_tanh", "mlp_tanh (second order)"]
    assert all(r["r"] != "hvp" for r in data["cases"][0]["rows"])
    assert all(r["r"] == "hvp" and r["p"].startswith("hvp:") for r in data["cases"][1]["rows"])
    assert "data-path=\"hvp:" not in page
    assert reports.render_markdown(again) == reports.render_markdown(rr)
    assert reports.render_junit(again) == reports.render_junit(rr)


def test_order_2_from_the_command_line_config_and_assertion(tmp_path, monkeypatch):
    from gradcheck import assertions
    from gradcheck.app import cli
    from gradcheck.app import settings as S

    args = cli.build_parser().parse_args(["run", "mlp", "--order", "2"])
    assert cli.run_settings(args).run_options().order == 2
    with pytest.raises(S.SettingsError, match=r"--order 3: must be 1 \(gradients\) or 2"):
        cli.run_settings(cli.build_parser().parse_args(["run", "mlp", "--order", "3"]))
    (tmp_path / "g.toml").write_text("order = 2\n")
    assert S.from_config(tmp_path / "g.toml")[0].order == 2
    model = L.Chain(L.Dense(3, 4, rng=0), L.Tanh(), L.Dense(4, 2, rng=1))
    res = assertions.assert_gradients_agree(model, np.ones((2, 3)), order=2, dtype="float64")
    assert hvp_leaves(res) and res.second_order.backends == ["torch", "jax", "tape"]
    with pytest.raises(S.SettingsError, match="order=0"):
        assertions.assert_gradients_agree(model, np.ones((2, 3)), order=0)
    with pytest.raises(ValueError, match="order=3"):
        RunOptions(order=3)


@pytest.mark.parametrize("cls", [results.SecondOrder, results.Trajectory])
def test_the_schema_doc_documents_every_new_field(cls):
    from test_reports import test_schema_doc_documents_every_field

    test_schema_doc_documents_every_field(cls)


def test_float32_hessian_vector_products_are_pinned_to_the_float64_kinks(monkeypatch):
    from test_verdicts import KINK_CASE

    from gradcheck.check import kinks

    def errors(res):
        return {x.path: x.float32.errors for x in hvp_leaves(res) if x.float32 is not None}

    pinned = errors(run_case(KINK_CASE, RunOptions(order=2)))
    assert pinned and all(max(e.values()) < 1e-6 for e in pinned.values()), pinned
    # Negative control: without pinning the float32 relu mask differs in one element, and H v with it.
    monkeypatch.setattr(kinks, "call", lambda state, name, run, args, kwargs: run(*args, **kwargs))
    loose = errors(run_case(KINK_CASE, RunOptions(order=2)))
    for backend in ("tape", "torch", "jax"):
        assert max(e[backend] for e in loose.values()) > 0.1
