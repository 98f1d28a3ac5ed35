"""Training-step trajectories: each backend trains its own copy with its own gradients, the optimiser
written once in float64; losses per step, parameters after N steps, and the step where they part."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck import reports, results
from gradcheck.backends import get_backend
from gradcheck.case import Case
from gradcheck.check import trajectory
from gradcheck.check.runner import RunOptions, run, run_case
from gradcheck.layers.models import MODELS
from gradcheck.reports.text import loss_sentence

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

MLP = MODELS["mlp"].case(size="small", dtype="float64")


def conv_bn(rng):
    return L.Chain(L.Conv2d(3, 4, 3, padding=1, rng=rng), L.BatchNorm2d(4), L.ReLU(),
                   L.Conv2d(4, 4, 3, stride=2, rng=rng), L.Flatten(), L.Dense(4 * 3 * 3, 3, rng=rng))


CONV_BN = Case("conv_bn", conv_bn, lambda rng: (rng.standard_normal((2, 3, 8, 8)),), dtype="float64")


# ---------------------------------------------------------------- the optimisers
@pytest.mark.parametrize("name", trajectory.OPTIMIZERS)
def test_the_optimisers_are_torch_s(name):
    rng = np.random.default_rng(0)
    x = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    grads = [{p: rng.standard_normal(v.shape) for p, v in x.items()} for _ in range(4)]
    tx = {p: torch.tensor(v, requires_grad=True) for p, v in x.items()}
    topt = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[name](list(tx.values()), lr=0.05)
    ours = trajectory.optimizer(name, 0.05)
    for g in grads:
        x = ours.step(x, g)
        for p, t in tx.items():
            t.grad = torch.tensor(g[p])
        topt.step()
    for p in x:
        np.testing.assert_allclose(x[p], tx[p].detach().numpy(), rtol=1e-13, atol=1e-15)


def test_the_default_learning_rates_and_bad_options():
    assert trajectory.optimizer("sgd").lr == 1e-2 and trajectory.optimizer("adam").lr == 1e-3
    for bad, match in (({"steps": -1}, "steps=-1"), ({"optimizer": "rmsprop"}, "optimizer='rmsprop'"),
                       ({"lr": 0.0}, "lr=0.0"), ({"lr": float("nan")}, "lr=nan"), ({"steps": True}, "steps=True")):
        with pytest.raises(ValueError, match=match):
            RunOptions(**bad)


# ---------------------------------------------------------------- correct backends
def test_correct_backends_follow_one_trajectory():
    res = run_case(MLP, RunOptions(steps=3))
    t = res.trajectory
    assert res.verdict == "agree" and t.verdict == "agree" and t.parted is None and not t.errors
    assert (t.steps, t.optimizer, t.lr) == (3, "sgd", 1e-2)
    assert set(t.losses) == {"tape", "torch", "jax"} and all(len(v) == 4 for v in t.losses.values())
    losses = np.array(list(t.losses.values()))
    assert np.ptp(losses, axis=0).max() < 1e-12 * np.abs(losses).max()
    assert len(set(np.round(losses[0], 6))) == 4  # the loss moves from step to step
    # The loss at the start is the first-order check's own: the same parameters, batch and cotangent.
    start = next(x for x in res.leaves if x.path == "output")
    assert start.verdict == "agree"
    assert [x.path for x in t.leaves] == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert all(x.verdict == "agree" and x.role == "param" for x in t.leaves)
    assert len(t.headroom) == 3 and max(t.headroom) < 0.1
    summary = reports.render_summary(run_result(res))
    assert f"✓ TRAJECTORY {res.name} — 3 sgd steps (lr 0.01): the trajectories agree at every step" in summary
    for k in range(1, 4):
        assert f"  {loss_sentence(t, k)}" in summary
    assert loss_sentence(t, 1).startswith("loss after step 1: tape ")


def test_batchnorm_running_statistics_evolve_along():
    res = run_case(CONV_BN, RunOptions(steps=2, optimizer="adam"))
    t = res.trajectory
    assert t.verdict == "agree", t.message
    buffers = {x.path: x for x in t.leaves if x.role == "buffer"}
    assert set(buffers) == {"1.running_mean", "1.running_var"}
    assert all(x.verdict == "agree" for x in buffers.values())
    # two train-mode forwards moved them off their initial zeros and ones
    assert all(x.norms and min(x.norms.values()) > 0 for x in buffers.values())
    assert buffers["1.running_mean"].norms["tape"] > 0


# ---------------------------------------------------------------- a backend that is slightly wrong
def _wrong_bias(monkeypatch, backend="jax", path="4.bias", rel=1e-3, moved_only=False):
    """``backend``'s gradient of ``path`` off by ``rel``; with ``moved_only`` only once the parameters moved."""
    driver = get_backend(backend)
    real = driver.evaluate
    start = {}

    def evaluate(f, args, prefixes=None, **kw):
        ev = real(f, args, prefixes, **kw)
        w = np.asarray(args[0].named_parameters()[0][1], np.float64)
        start.setdefault(w.shape, w.copy())
        if path in ev.grads and (not moved_only or not np.array_equal(start[w.shape], w)):
            ev.grads[path] = ev.grads[path] * (1 + rel)
        return ev

    monkeypatch.setattr(driver, "evaluate", evaluate)


def test_a_bias_gradient_off_by_1e_3_parts_the_trajectories_at_step_1(monkeypatch):
    _wrong_bias(monkeypatch)
    res = run_case(MLP, RunOptions(steps=3))
    t = res.trajectory
    assert next(x for x in res.leaves if x.path == "4.bias").blame == ["jax"]  # first order sees it too
    assert t.verdict == "disagree" and t.parted == 1 and t.blame == ["jax"] and res.verdict == "disagree"
    assert t.message.startswith("the trajectories part after step 1: jax leaves the others (by majority) on 4.bias")
    assert loss_sentence(t, 1) in t.message
    losses = {b: v[1] for b, v in t.losses.items()}
    assert losses["tape"] == pytest.approx(losses["torch"], rel=1e-12)
    assert abs(losses["jax"] - losses["tape"]) > 1e-9 * abs(losses["tape"])
    assert [x.path for x in t.leaves if x.verdict == "disagree"] == ["4.bias"]
    assert t.headroom[0] > 1
    summary = reports.render_summary(run_result(res))
    assert f"✗ TRAJECTORY {res.name} — 3 sgd steps (lr 0.01): the trajectories part after step 1" in summary
    sentence = loss_sentence(t, 1)
    assert f"  {sentence}" in summary
    tape, torch_, jax_ = (part.split()[-1] for part in sentence.split(": ", 1)[1].split(", "))
    assert tape == torch_ != jax_  # printed with the digits that tell them apart


def test_adam_does_not_see_a_gradient_off_by_a_constant_factor(monkeypatch):
    _wrong_bias(monkeypatch)
    res = run_case(MLP, RunOptions(steps=2, optimizer="adam"))
    assert res.verdict == "disagree" and next(x for x in res.leaves if x.path == "4.bias").blame == ["jax"]
    assert res.trajectory.verdict == "agree" and max(res.trajectory.headroom) < 1e-3


def test_a_defect_that_starts_at_step_2_is_flagged_at_step_2(monkeypatch):
    _wrong_bias(monkeypatch, backend="torch", path="2.bias", moved_only=True)
    res = run_case(MLP, RunOptions(steps=3, optimizer="adam"))
    assert all(x.verdict == "agree" for x in res.leaves)  # at the start every gradient is right
    t = res.trajectory
    assert t.parted == 2 and t.blame == ["torch"] and res.verdict == "disagree"
    assert "part after step 2: torch leaves the others" in t.message
    assert t.headroom[0] < 1 < t.headroom[1]
    from gradcheck.reports.text import case_failure

    assert case_failure(res).startswith("3 adam steps (lr 0.001): the trajectories part after step 2")


def test_a_backend_that_fails_mid_trajectory_is_that_backend_s_error(monkeypatch):
    driver = get_backend("jax")
    real = driver.evaluate
    start = MLP.build(np.random.default_rng(np.random.SeedSequence(0).spawn(2)[0])).named_parameters()[0][1]

    def evaluate(f, args, prefixes=None, **kw):
        if not np.array_equal(np.asarray(args[0].named_parameters()[0][1], np.float64), start):
            raise RuntimeError("out of memory")  # from the first step on moved parameters: step 2
        return real(f, args, prefixes, **kw)

    monkeypatch.setattr(driver, "evaluate", evaluate)
    res = run_case(MLP, RunOptions(steps=3))
    t = res.trajectory
    assert t.verdict == "error" and res.verdict == "error" and "step 2: RuntimeError" in t.errors["jax"]
    assert len(t.losses["jax"]) == 1 and len(t.losses["tape"]) == 4 and t.parted is None
    assert {x.path for x in t.leaves} and all(x.verdict == "agree" for x in t.leaves)
    assert "jax failed at step 2" in reports.render_summary(run_result(res))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_trajectory_that_diverges_alike_everywhere_is_no_parting():
    # <r, f(x)> is unbounded below: a huge step sends every backend's loss to NaN together.
    res = run_case(MLP, RunOptions(steps=6, lr=1e4, backends=("tape", "torch")))
    t = res.trajectory
    assert t.verdict == "agree" and t.parted is None and res.verdict == "agree"
    assert not np.isfinite(t.losses["tape"][-1]) and not np.isfinite(t.losses["torch"][-1])
    assert t.message.startswith("the training diverged alike on every backend")
    assert "diverged" in reports.render_summary(run_result(res))


# ---------------------------------------------------------------- the model zoo
@pytest.mark.slow  # about 60 s on two cores
def test_resnet18_at_64_follows_one_trajectory_for_3_adam_steps():
    case = MODELS["resnet18"].case(size="small", dtype="float64")
    res = run_case(case, RunOptions(steps=3, optimizer="adam", referee="off", repeat=False))
    t = res.trajectory
    assert res.verdict == "agree" and t.verdict == "agree" and t.parted is None, t.message
    assert len(t.leaves) == 62 + 2 * 20 and all(x.verdict == "agree" for x in t.leaves)  # params, BN statistics
    assert max(t.headroom) < 1


# ---------------------------------------------------------------- results and reports
def run_result(*cases):
    return results.RunResult(env={"seed": 0}, cases=list(cases), planned=len(cases))


def test_trajectory_results_round_trip_and_render(tmp_path, monkeypatch):
    # (sgd: Adam's step is invariant to a constant scale of one gradient, so a gradient off by a constant
    # factor does not move an Adam trajectory; only the first-order check sees it)
    _wrong_bias(monkeypatch)
    rr = run([MLP], RunOptions(steps=2, optimizer="sgd"), results_path=tmp_path / "r.jsonl")
    again = results.load(tmp_path / "r.jsonl")
    assert again.cases[0].trajectory == rr.cases[0].trajectory
    assert results.run_from_dict(json.loads(results.dumps(rr))).cases[0].trajectory == rr.cases[0].trajectory
    page = reports.render_html(again)
    assert page == reports.render_html(rr)
    assert "class='trajectory'" in page and 'class="losschart"' in page
    from test_reports import check_html

    check_html(page)
    assert page.count('class="lossline"') == 3 and 'class="parted"' in page
    assert "the trajectories part after step 1" in page
    assert reports.render_summary(again) == reports.render_summary(rr)
    assert reports.render_junit(again) == reports.render_junit(rr)
    assert reports.render_markdown(again) == reports.render_markdown(rr)


def test_steps_from_the_command_line_config_and_assertion(tmp_path):
    from gradcheck import assertions
    from gradcheck.app import cli, pytest_plugin
    from gradcheck.app import settings as S

    args = cli.build_parser().parse_args(["run", "mlp", "--steps", "3", "--optimizer", "adam", "--lr", "1e-3"])
    o = cli.run_settings(args).run_options()
    assert (o.steps, o.optimizer, o.lr) == (3, "adam", 1e-3)
    for flags, match in ((["--steps", "-1"], "--steps -1: must be a non-negative integer"),
                         (["--optimizer", "lbfgs"], "--optimizer lbfgs: expected one of sgd, adam"),
                         (["--lr", "0"], "--lr 0: must be a finite number > 0")):
        with pytest.raises(S.SettingsError, match=match):
            cli.run_settings(cli.build_parser().parse_args(["run", "mlp", *flags]))
    (tmp_path / "g.toml").write_text('steps = 2\noptimizer = "adam"\nlr = 0.01\n')
    layer = S.from_config(tmp_path / "g.toml")[0]
    assert (layer.steps, layer.optimizer, layer.lr) == (2, "adam", 0.01)
    assert {"order", "steps", "optimizer", "lr"} <= set(pytest_plugin.SETTINGS)
    model = L.Chain(L.Dense(3, 4, rng=0), L.Tanh(), L.Dense(4, 2, rng=1))
    res = assertions.assert_gradients_agree(model, np.ones((2, 3)), steps=2, dtype="float64")
    assert res.trajectory.verdict == "agree" and len(res.trajectory.losses["tape"]) == 3
