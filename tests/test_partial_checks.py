"""One backend and the referee, and checks on fewer backends than asked.

* One backend left (the others unavailable): its gradients are held against
  the float64 referee alone, and a gradient the stable referee resolves
  outside its resolution is blamed on it, per leaf and along the joint
  direction, with one, two and three backends.
* A case a requested backend was unavailable to is *partial*: every report
  says so ("torch only", "7 of 24 cases checked on torch and the referee
  alone: tape, jax unavailable"), ``unavailable = "fail"`` fails it, and no
  count shows more leaves agreeing than compared.

Every detection is tried with the fault on each backend (``tests/faults.py``),
each next to its clean control.
"""

from __future__ import annotations

import json
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from faults import REASON, unavailable, wrong_bias_gradient

import gradcheck
import gradcheck.layers as L
from gradcheck import ops, reports, results
from gradcheck.app.cli import main
from gradcheck.backends import reference_rank
from gradcheck.case import Case
from gradcheck.check.runner import JOINT, RunOptions, run_case

pytest_plugins = ["pytester"]

ALL = ("tape", "torch", "jax")
BIASES = {"0.bias", "1.bias"}
GRADIENTS = {"0.weight", "0.bias", "1.weight", "1.bias", "input"}


def need(*backends):
    for b in backends:
        if b != "tape":
            pytest.importorskip(b)


def mlp(rng):
    return L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=rng), L.Dense(4, 2, rng=rng))


CASE = Case("mlp", mlp, lambda rng: (rng.standard_normal((5, 3)),))


def leaf(result, path):
    return next(x for x in result.leaves if x.path == path)


def failing(result):
    return {x.path: x for x in result.leaves if x.failing}


def alone(monkeypatch, backend):
    """Every backend but ``backend`` unavailable to the case, with a reason, as for a torch model whose op has no
    lowering."""
    need(*ALL)
    for other in ALL:
        if other != backend:
            unavailable(monkeypatch, other)


# ---------------------------------------------------------------- one backend and the referee, per leaf
@pytest.mark.parametrize("wrong", [False, True], ids=["clean", "wrong-bias-vjp"])
@pytest.mark.parametrize("backend", ALL)
def test_one_backend_is_blamed_on_the_referees_word_alone(monkeypatch, backend, wrong):
    alone(monkeypatch, backend)
    if wrong:
        wrong_bias_gradient(monkeypatch, backend)
    r = run_case(CASE, RunOptions(backends=ALL, referee="leaves"))
    others = [b for b in ALL if b != backend]
    assert r.unavailable == {b: REASON for b in others} and r.checked_on == [backend] and r.partial
    assert not r.errors
    grads = [x for x in r.leaves if x.role in ("param", "input")]
    assert {x.path for x in grads} == GRADIENTS
    assert all([c.backend for c in x.referee] == [backend] and x.referee[0].stable for x in grads)
    if not wrong:
        assert r.verdict == "agree" and not failing(r)
        assert all(x.referee[0].agrees for x in grads)
        return
    assert r.verdict == "disagree"
    bad = failing(r)
    assert set(bad) == BIASES
    for x in bad.values():
        assert x.verdict == "disagree" and x.blame == [backend]
        assert x.message.startswith(f"{backend}: the float64 finite difference differs from its gradient (")
        assert x.message.endswith(f"only {backend} and the referee were compared")
    assert all(leaf(r, p).verdict == "agree" for p in GRADIENTS - BIASES)


def test_one_backend_asked_for_alone_reads_the_same(monkeypatch):
    wrong_bias_gradient(monkeypatch, "tape")
    r = run_case(CASE, RunOptions(backends=("tape",), referee="leaves"))
    assert not r.partial and {p: x.blame for p, x in failing(r).items()} == {p: ["tape"] for p in BIASES}
    assert leaf(r, "0.bias").message.endswith("only tape and the referee were compared")


# ---------------------------------------------------------------- the joint direction
def joint_backends(culprit: str, n: int) -> tuple[str, ...]:
    return (culprit,) + tuple(b for b in ALL if b != culprit)[: n - 1]


MODES = {"joint": RunOptions(referee="joint"), "auto-over-budget": RunOptions(referee="auto", referee_budget_s=1e-9)}


@pytest.mark.parametrize("wrong", [False, True], ids=["clean", "wrong-bias-vjp"])
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("culprit", ALL)
def test_the_joint_direction_agrees_on_a_correct_model_and_blames_a_wrong_vjp(monkeypatch, culprit, n, mode, wrong):
    backends = joint_backends(culprit, n)
    need(*backends)
    if wrong:
        wrong_bias_gradient(monkeypatch, culprit)
    options = MODES[mode]
    r = run_case(CASE, RunOptions(backends=backends, referee=options.referee,
                                  referee_budget_s=options.referee_budget_s))
    assert not r.errors, r.errors
    joint = [x for x in r.leaves if x.role == "referee"]
    assert all(x.path == JOINT for x in joint)
    assert any(n_.startswith("referee, joint direction over 5 leaves") for n_ in r.notes), r.notes
    if mode == "auto-over-budget":
        assert any(n_.startswith("referee: checking each of 5 leaves was estimated") for n_ in r.notes), r.notes
    if not wrong:
        assert r.verdict == "agree" and not failing(r), [(x.path, x.message) for x in r.leaves]
        # One backend: the joint direction is all its gradients were held against, so it is a leaf of its own.
        assert len(joint) == (1 if n == 1 else 0)
        if joint:
            assert joint[0].verdict == "agree" and [c.backend for c in joint[0].referee] == [culprit]
            assert r.leaves_compared == r.compared == r.agreeing == 1
        return
    assert r.verdict == "disagree"
    (j,) = joint
    assert j.verdict == "disagree" and j.blame == [culprit], j.message
    assert {c.backend for c in j.referee if not c.agrees} == {culprit}
    bad = failing(r)
    if n == 1:  # nothing else compared the leaves one by one
        assert set(bad) == {JOINT}
        assert f"only {culprit} and the referee were compared" in j.message
    else:  # the pairs find the leaves, and each is refereed apart
        assert set(bad) == {JOINT} | BIASES
        assert all(bad[p].blame == [culprit] for p in BIASES)
        held = sorted((b for b in backends if b != culprit), key=reference_rank)
        assert j.message.startswith(f"{culprit}: the float64 referee and {' and '.join(held)} agree")


def test_one_backend_whose_joint_referee_abstains_compared_nothing_and_says_why(monkeypatch):
    from gradcheck.check import referee

    monkeypatch.setattr(referee, "UNSTABLE", -1.0)  # every finite difference reads as unstable
    r = run_case(CASE, RunOptions(backends=("tape",), referee="joint"))
    assert r.verdict == "error" and r.leaves_compared == 0 and r.agreeing == 0
    assert r.errors["case"].startswith("nothing was compared: only tape ran, and the referee resolved none of its "
                                       "gradients")
    assert "no trainable leaf" not in r.errors["case"]


# ---------------------------------------------------------------- counts are honest
def test_an_output_one_backend_gave_is_compared_against_nothing_and_never_counted_as_agreeing():
    one = run_case(CASE, RunOptions(backends=("tape",), referee="leaves"))
    out = leaf(one, "output")
    assert out.verdict == "agree" and not out.pairs and not out.referee and not out.compared
    assert one.leaves_compared == one.compared == one.agreeing == len(GRADIENTS)
    run = results.RunResult(cases=[one])
    table_row = next(ln for ln in reports.render_summary(run).splitlines() if ln.startswith("mlp "))
    assert f" {len(GRADIENTS)}/{len(GRADIENTS)} " in table_row, table_row
    assert f"{len(GRADIENTS)} of {len(GRADIENTS)} leaves agree (4 parameter gradients, 1 input gradient)" in \
        reports.render_summary(run).splitlines()[-1]
    # The control: with a second backend the output is held against it, and counted.
    need("torch")
    two = run_case(CASE, RunOptions(backends=("tape", "torch"), referee="leaves"))
    assert leaf(two, "output").compared and two.compared == two.agreeing == len(GRADIENTS) + 1


def test_a_stored_case_counts_its_agreeing_leaves_among_the_compared_ones():
    # An older file whose leaves_compared was counted without the output: the counts come from the leaves.
    one = run_case(CASE, RunOptions(backends=("tape",), referee="leaves"))
    data = results.to_dict(one)
    data["leaves_compared"] = 0
    stored = results.case_from_dict(data)
    assert stored.agreeing == stored.compared == len(GRADIENTS)


# ---------------------------------------------------------------- partial checks are said as such
@pytest.mark.parametrize("missing", [None, *ALL])
def test_a_case_a_backend_was_unavailable_to_is_partial_and_fails_under_the_policy(monkeypatch, missing):
    need(*ALL)
    if missing:
        unavailable(monkeypatch, missing)
    warned = run_case(CASE, RunOptions(backends=ALL))
    failed = run_case(CASE, RunOptions(backends=ALL, unavailable="fail"))
    assert warned.unavailable_policy == "warn" and failed.unavailable_policy == "fail"
    if missing is None:  # the control: nothing unavailable, nothing partial under either policy
        assert warned.verdict == failed.verdict == "agree" and not warned.partial and not failed.partial
        return
    ran = [b for b in ALL if b != missing]
    for r in (warned, failed):
        assert r.partial and r.checked_on == ran and r.unavailable == {missing: REASON}
        assert not failing(r)
    assert warned.verdict == "agree" and not warned.failed
    assert failed.verdict == "partial" and failed.failed
    assert reports.text.case_failure(failed) == (f"checked on {' and '.join(ran)} alone: {missing} unavailable, "
                                                 "which fails under the unavailable = \"fail\" policy")


def partial_run(monkeypatch, policy="warn"):
    """Three cases: two that only torch could run (tape and jax unavailable), one checked on all three."""
    need(*ALL)
    full = run_case(CASE.with_(name="full"), RunOptions(backends=ALL))
    alone(monkeypatch, "torch")
    cases = [run_case(CASE.with_(name=f"torch-{k}", seed=k), RunOptions(backends=ALL, unavailable=policy))
             for k in (1, 2)]
    return results.RunResult(cases=[cases[0], full, cases[1]], planned=3)


SENTENCE = "2 of 3 cases checked on torch and the referee alone: tape, jax unavailable"


def test_every_report_says_a_partial_check_is_one(monkeypatch, tmp_path):
    run = partial_run(monkeypatch)
    summary = reports.render_summary(run)
    rows = {}  # the case table's rows (the timing table's come after, under the same names)
    for ln in summary.splitlines():
        if ln.startswith(("torch-", "full ")):
            rows.setdefault(ln.split()[0], ln)
    assert [c.strip() for c in rows["torch-1"].split("  ") if c.strip()][1] == "✓ agree, torch only"
    assert "only" not in rows["full"]  # the control: the full cross-check has no label
    last = summary.splitlines()[-1]
    assert last.startswith(f"gradcheck PASS: all 3 cases passed; {SENTENCE}; "), last
    # JSON: the policy and what was unavailable, read back with the same meaning.
    reports.write_json(run, tmp_path / "r.json")
    back = results.load(tmp_path / "r.json")
    assert [(c.partial, c.checked_on, c.unavailable_policy) for c in back.cases] == [
        (True, ["torch"], "warn"), (False, list(ALL), "warn"), (True, ["torch"], "warn")]
    assert json.loads((tmp_path / "r.json").read_text())["cases"][0]["unavailable"] == {"tape": REASON, "jax": REASON}
    # JUnit: properties and a line where CI shows the case's output.
    suites = {s.get("name"): s for s in ET.fromstring(reports.render_junit(run)).findall("testsuite")}
    props = {p.get("name"): p.get("value") for p in suites["torch-1"].find("properties")}
    assert (props["checked_on"], props["unavailable"], props["unavailable.policy"]) == ("torch", "tape,jax", "warn")
    out = suites["torch-1"].find("testcase/system-out").text
    assert "checked on torch and the referee alone: tape, jax unavailable (unavailable policy: warn)" in out
    assert "checked_on" not in {p.get("name") for p in suites["full"].find("properties")}
    assert "checked on" not in suites["full"].find("testcase/system-out").text
    # Markdown: the row and the sentence.
    md = reports.render_markdown(run)
    row = next(ln for ln in md.splitlines() if ln.startswith("| torch-1 |"))
    assert row.split(" | ")[1] == "✅ agree · torch only"
    assert SENTENCE in md
    assert "only" not in next(ln for ln in md.splitlines() if ln.startswith("| full |"))
    # HTML: the label beside the badge, the callout in the case, the sentence in the header.
    page = reports.render_html(run)
    assert page.count("<span class='badge v-partial coverage'>torch only</span>") == 4  # 2 cases x (row, summary)
    assert page.count("<b>Partial check:</b> checked on torch and the referee alone: tape, jax unavailable;") == 2
    assert SENTENCE in page


def test_the_fail_policy_fails_the_run_and_every_report_says_why(monkeypatch):
    run = partial_run(monkeypatch, policy="fail")
    assert [c.verdict for c in run.cases] == ["partial", "agree", "partial"] and run.failed
    summary = reports.render_summary(run)
    failures = [ln for ln in summary.splitlines() if ln.startswith("◐ PARTIAL")]
    assert failures == [f"◐ PARTIAL torch-{k} — checked on torch and the referee alone: tape, jax unavailable, which "
                        "fails under the unavailable = \"fail\" policy" for k in (1, 2)]
    assert summary.splitlines()[-1].startswith(f"gradcheck FAIL: 2 of 3 cases failed; {SENTENCE}; ")
    suite = next(s for s in ET.fromstring(reports.render_junit(run)).findall("testsuite") if s.get("name") == "torch-1")
    failure = suite.find("testcase/failure")
    assert failure.get("type") == "partial" and "checked on torch and the referee alone" in failure.get("message")


# ---------------------------------------------------------------- the command line, the settings file
def _cli(monkeypatch, tmp_path, *argv):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))
    monkeypatch.chdir(tmp_path)
    return main(["run", "tests.test_partial_checks:cli_case", "--no-html", *argv])


def cli_case():
    return CASE


@pytest.mark.parametrize("missing", [None, "jax"])
def test_the_command_line_and_the_settings_file_fail_a_partial_check_when_asked(monkeypatch, tmp_path, capsys,
                                                                                 missing):
    need(*ALL)
    if missing:
        unavailable(monkeypatch, missing)
    assert _cli(monkeypatch, tmp_path) == 0
    out = capsys.readouterr().out
    assert ("tape and torch only" in out) == bool(missing)
    code = _cli(monkeypatch, tmp_path, "--unavailable", "fail")
    out = capsys.readouterr().out
    assert code == (1 if missing else 0), out
    (tmp_path / "strict.toml").write_text('[tool.gradcheck]\nunavailable = "fail"\n')
    assert _cli(monkeypatch, tmp_path, "--config", "strict.toml") == (1 if missing else 0)
    # The command line beats the settings file.
    assert _cli(monkeypatch, tmp_path, "--config", "strict.toml", "--unavailable", "warn") == 0
    capsys.readouterr()


def test_an_unknown_policy_is_a_usage_error_naming_the_value_and_the_choices(monkeypatch, tmp_path, capsys):
    assert _cli(monkeypatch, tmp_path, "--unavailable", "sometimes") == 2
    assert "gradcheck run: --unavailable sometimes: expected one of warn, fail" in capsys.readouterr().err
    (tmp_path / "bad.toml").write_text('[tool.gradcheck]\nunavailable = "never"\n')
    assert _cli(monkeypatch, tmp_path, "--config", "bad.toml") == 2
    assert 'unavailable = "never": expected one of warn, fail' in capsys.readouterr().err
    with pytest.raises(ValueError, match="unavailable='never'; expected one of warn, fail"):
        RunOptions(unavailable="never")


# ---------------------------------------------------------------- assert_gradients_agree
def test_assert_gradients_agree_warns_of_a_partial_pass_and_fails_it_when_asked(monkeypatch):
    need(*ALL)
    model = mlp(0)
    x = CASE.inputs(np.random.default_rng(0))[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the control: the full check warns of nothing
        assert not gradcheck.assert_gradients_agree(model, x).partial
    alone(monkeypatch, "torch")
    with pytest.warns(gradcheck.assertions.PartialCheck) as caught:
        result = gradcheck.assert_gradients_agree(model, x, name="mlp")
    assert result.verdict == "agree" and result.partial
    (w,) = caught
    assert str(w.message) == (f"mlp: checked on torch and the referee alone: tape, jax unavailable, not the cross-check "
                              f"asked for (tape: {REASON}; jax: {REASON}); unavailable=\"fail\" makes this a failure")
    with pytest.raises(gradcheck.assertions.GradientsDisagree) as info:
        gradcheck.assert_gradients_agree(model, x, name="mlp", unavailable="fail")
    lines = str(info.value).splitlines()
    assert lines[0] == ("checked on torch and the referee alone: tape, jax unavailable, which fails under the "
                        "unavailable = \"fail\" policy")
    assert f"skipped backend tape: {REASON}" in lines and f"skipped backend jax: {REASON}" in lines


def test_a_failing_partial_check_says_it_was_partial(monkeypatch):
    alone(monkeypatch, "torch")
    wrong_bias_gradient(monkeypatch, "torch")
    model = mlp(0)
    x = CASE.inputs(np.random.default_rng(0))[0]
    with pytest.raises(gradcheck.assertions.GradientsDisagree) as info:
        gradcheck.assert_gradients_agree(model, x, name="mlp", referee="leaves")
    lines = str(info.value).splitlines()
    assert lines[0] == "2/5 leaves disagree: 0.bias (torch vs referee), 1.bias (torch vs referee)"
    assert lines[2] == "  checked on torch and the referee alone: tape, jax unavailable: not the cross-check asked for"
    assert info.value.result.leaves[-1].path == "input"  # gradcheck's own layout, leaves in forward order


# ---------------------------------------------------------------- the pytest plugin
PLUGIN_TEST = '''
import numpy as np
import pytest

pytest_plugins = ["pytester"]
import gradcheck
import gradcheck.layers as L
from gradcheck import ops
from gradcheck.backends import get_backend
from gradcheck.backends.base import BackendUnavailable


@pytest.fixture(autouse=True)
def torch_cannot_run_it(monkeypatch):
    def refuse(*args, **kwargs):
        raise BackendUnavailable("no lowering for aten.fancy_op.default")
    monkeypatch.setattr(get_backend("torch"), "evaluate", refuse)


def check():
    model = L.Chain(L.Dense(3, 4, activation=ops.tanh, rng=0), L.Dense(4, 2, rng=1))
    gradcheck.assert_gradients_agree(model, np.random.default_rng(0).standard_normal((2, 3)), backends=("tape", "torch"))


def test_plain():
    check()


@pytest.mark.gradcheck(unavailable="warn")
def test_marked_warn():
    check()
'''


@pytest.fixture(scope="module")
def torch_imported():
    # Set up before `pytester`, whose in-process runs drop every module imported after it started (torch's C
    # extension cannot be imported twice); the driver's availability check imports torch.
    return pytest.importorskip("torch")


def test_the_plugin_takes_the_policy_from_its_option_its_ini_and_the_marker(torch_imported, pytester):
    pytester.makepyfile(test_partial=PLUGIN_TEST)
    warned = pytester.runpytest("-p", "no:cacheprovider")
    warned.assert_outcomes(passed=2, warnings=2)
    warned.stdout.fnmatch_lines(["*PartialCheck: test_partial.py::test_plain: checked on tape and the referee alone: "
                                 "torch unavailable, not the cross-check asked for*",
                                 "*2 gradient check(s), 0 failed, 2 partial (checked on fewer backends than asked)"])
    failed = pytester.runpytest("-p", "no:cacheprovider", "--gradcheck-unavailable", "fail")
    failed.assert_outcomes(passed=1, failed=1)  # the marker's warn beats the command line
    failed.stdout.fnmatch_lines(["*GradientsDisagree: checked on tape and the referee alone: torch unavailable, which "
                                 "fails under the unavailable = \"fail\" policy"])
    pytester.makeini("[pytest]\ngradcheck_unavailable = fail\n")
    pytester.runpytest("-p", "no:cacheprovider", "-k", "plain").assert_outcomes(failed=1, deselected=1)
