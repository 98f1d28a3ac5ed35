"""reports/text.py: the sentences every report and the assertion message share, and the one sanitiser."""

from __future__ import annotations

import ast
import re
from importlib import resources

import pytest
import report_fixtures as fx

import gradcheck.assertions as A
from gradcheck import reports, results
from gradcheck.reports import text as T
from gradcheck.results import CaseResult, KinkReport, LeafResult, RunResult

COMMAND_START = re.compile(r"^\s*(::|##\[)")


# ---------------------------------------------------------------- the sanitiser
@pytest.mark.parametrize("raw, clean", [
    ("plain name", "plain name"),
    ("a\nb", "a b"),
    ("a\r\nb\rc", "a b c"),
    ("tab\there", "tab here"),
    ("esc \x1b[31mred\x1b[0m", "esc \\x1b[31mred\\x1b[0m"),
    ("nul\x00 bell\x07 del\x7f csi\x9b", "nul\\x00 bell\\x07 del\\x7f csi\\x9b"),
    ("line\u2028sep\u2029para", "line\\u2028sep\\u2029para"),
    ("bidi \u202eevil", "bidi \\u202eevil"),
    ("::error::forged", "\\::error::forged"),
    ("   ::warning file=x::w", "   \\::warning file=x::w"),
    ("##[error]azure", "\\##[error]azure"),
    ("ns::op is fine mid-line", "ns::op is fine mid-line"),
    ("ok\n::error::after a newline", "ok ::error::after a newline"),
])
def test_clean_line(raw, clean):
    assert T.clean_line(raw) == clean
    assert T.clean_line(clean) == clean  # idempotent: cleaning twice changes nothing
    assert "\n" not in clean and not COMMAND_START.match(clean)


def test_clean_lines_keeps_lines_apart_but_cleans_each():
    assert T.clean_lines("Type: msg\n::error::x\n  \x1b[1mframe") == ["Type: msg", "\\::error::x", "  \\x1b[1mframe"]


def test_one_sanitiser():
    """No renderer carries its own control-character scrubber: they all call text.clean_line."""
    for name in ("terminal", "markdown", "github", "junit", "_common", "html", "svg", "cards", "tree"):
        source = resources.files("gradcheck.reports").joinpath(f"{name}.py").read_text(encoding="utf-8")
        tree = ast.parse(source)
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert "clean_line" not in defined and "_CONTROL" not in source, name
    assert not hasattr(reports._common, "clean_line")


# ---------------------------------------------------------------- errors: the exception first
def test_error_parts_runner_form():
    text = "ValueError: shapes (8, 3) and (32, 64) do not match\n  gradcheck/kernels.py:210 in matmul\n" \
           "  gradcheck/backends/numpy_ops.py:96 in check_matmul"
    head, frames = T.error_parts(text)
    assert head == "ValueError: shapes (8, 3) and (32, 64) do not match"
    assert frames == ["gradcheck/kernels.py:210 in matmul", "gradcheck/backends/numpy_ops.py:96 in check_matmul"]
    assert T.error_line(text) == ("ValueError: shapes (8, 3) and (32, 64) do not match — at "
                                  "gradcheck/backends/numpy_ops.py:96 in check_matmul")


def test_error_parts_python_traceback_and_chain():
    text = ('Traceback (most recent call last):\n  File "/x/site-packages/gradcheck/a.py", line 3, in f\n'
            "    g()\nKeyError: 'k'\n\nDuring handling of the above exception, another exception occurred:\n\n"
            'Traceback (most recent call last):\n  File "b.py", line 9, in h\n    raise RuntimeError("boom")\n'
            "RuntimeError: boom")
    head, frames = T.error_parts(text)
    assert head == "RuntimeError: boom" and frames == ["b.py:9 in h"]
    assert T.error_parts('Traceback (most recent call last):\n  File "a.py", line 1\nOSError: x')[1] == ["a.py:1"]
    assert T.error_parts("") == ("error (no message)", [])
    assert T.error_parts("internal error while comparing: TypeError: x\n  compare.py:3 in f")[0] == \
        "internal error while comparing: TypeError: x"
    assert T.error_headline("RuntimeError: a\x1b[2Jb\n  f.py:1 in g") == "RuntimeError: a\\x1b[2Jb"


# ---------------------------------------------------------------- float32 and kinks
def test_kink_sentence():
    k = KinkReport(op="relu", layer="layer3.1", call=40, elements=50176, near=1, min_distance=3.2e-6,
                   crossed={"tape": 0, "torch": 0, "jax": 1})
    assert T.kink_sentence(k) == ("1 relu input in layer3.1 is 3.2e-6 from its kink; jax's float32 forward "
                                  "crossed it (pinned to the float64 branch)")
    two = KinkReport(op="relu", layer="layer3.1", near=1, min_distance=3.2e-6, crossed={"torch": 1, "jax": 1})
    assert "torch's and jax's float32 forwards crossed it" in T.kink_sentence(two)
    many = KinkReport(op="max_pool2d", layer="", near=5, min_distance=1.25e-7, below_float64=2, crossed={"jax": 3})
    assert T.kink_sentence(many) == ("5 max_pool2d inputs are within float32's reach of their kink (closest "
                                     "1.2e-7); jax's float32 forward crossed 3 (pinned to the float64 branch); "
                                     "2 closer than float64 resolves")
    calm = KinkReport(op="relu", layer="0", near=2, min_distance=1e-6)
    assert T.kink_sentence(calm).endswith("; no float32 forward crossed them")
    assert "50176 elements, 1 within float32's reach" in T.kink_counts(k)


def test_imprecise_sentence():
    case = fx.imprecise_case("warn")
    leaf = next(x for x in case.leaves if x.path == fx.IMPRECISE_LEAF)
    assert T.imprecise_sentence(leaf) == ("jax float32 is 800× further from float64 than torch on features.3.weight "
                                          "(4.8e-04 vs 6e-07; limit 6.1e-06)")
    ok = next(x for x in case.leaves if x.path == "features.0.weight")
    assert T.imprecise_sentence(ok) == ""
    leaf.float32.errors["jax"] = float("nan")
    leaf.float32.verdict = "nonfinite"
    assert T.imprecise_sentence(leaf).startswith("jax float32 gradient of features.3.weight is not finite")
    leaf.float32 = fx.float32_part({"torch": 0.0, "jax": 1e-3})
    assert T.imprecise_sentence(leaf) == "jax float32 is 0.001 from float64 on features.3.weight, where torch's " \
                                         "float32 is exact"
    assert T.float32_cell(fx.imprecise_case("warn")) == "imprecise: jax 800×"
    assert T.float32_cell(fx.convnet_case()) == "ok, jax 2.3×"
    assert T.float32_cell(fx.error_case()) == "—"


# ---------------------------------------------------------------- runs
def test_run_sentence_interrupted_never_passes():
    assert T.run_sentence(fx.interrupted_run(39, 200)).startswith(
        "interrupted: 39 of 200 cases ran; none of those failed; 351 of 351 leaves agree")
    bad = fx.interrupted_run(3, 200)
    bad.cases[1] = fx.disagree_case()
    assert T.run_sentence(bad).startswith("interrupted: 3 of 200 cases ran; 1 of them failed")
    unknown = RunResult(cases=[fx.convnet_case()], interrupted=True)
    assert T.run_sentence(unknown).startswith("interrupted: 1 case ran (how many were planned is not recorded)")
    assert T.run_sentence(RunResult(planned=200, interrupted=True)) == "interrupted: 0 of 200 cases ran"
    for run in (fx.interrupted_run(), bad, unknown):
        assert "passed" not in T.run_sentence(run)
    assert T.run_sentence(fx.agree_run()).startswith("all 2 cases passed")


def test_run_sentence_of_nothing_is_not_no_case_ran():
    # What `gradcheck report` on a file with no case in it renders: it must not read as a run that ran nothing.
    assert T.run_sentence(RunResult()) == "no case results: nothing was checked"


def test_run_sentence_counts_vacuous_and_float32_apart():
    sentence = T.run_sentence(fx.two_part_run())
    assert "2 of 5 cases failed" in sentence and "2 vacuous" in sentence
    assert "float32 imprecise: 1 leaf (warnings)" in sentence


def test_unavailable_once_per_backend():
    assert T.unavailable_notices(fx.unavailable_run(50)) == [
        ("jax", "jax is not installed: pip install 'gradcheck[jax]'", 50)]


# ---------------------------------------------------------------- partial checks
def _torch_only(name, seed=0):
    unavailable = {"tape": "no lowering for aten.cumsum.default", "jax": "no lowering for aten.cumsum.default"}
    return CaseResult(name=name, seed=seed, backends=["tape", "torch", "jax"], unavailable=unavailable,
                      leaves=[fx.agree_leaf("w", backends=["torch"])])


def test_a_partial_check_is_named_on_its_row_in_its_sentence_and_in_the_runs():
    run = RunResult(cases=[_torch_only(f"gpt-{k}") for k in range(7)] + [fx.convnet_case(f"full-{k}")
                                                                          for k in range(17)])
    partial = run.cases[0]
    assert T.coverage_label(partial) == "torch only" and T.coverage_label(run.cases[-1]) == ""
    assert T.partial_sentence(partial) == "checked on torch and the referee alone: tape, jax unavailable"
    assert T.partial_sentence(run.cases[-1]) == ""
    assert T.partial_runs(run) == ["7 of 24 cases checked on torch and the referee alone: tape, jax unavailable"]
    assert T.run_sentence(run).startswith(
        "all 24 cases passed; 7 of 24 cases checked on torch and the referee alone: tape, jax unavailable; ")
    two = fx.unavailable_case()  # tape and torch ran, jax did not: still a cross-check, of two
    assert T.coverage_label(two) == "tape and torch only"
    assert T.partial_sentence(two) == "checked on tape and torch alone: jax unavailable"
    # Each kind of gap counts apart, in the order first met.
    run.cases.append(two)
    assert T.partial_runs(run) == ["7 of 25 cases checked on torch and the referee alone: tape, jax unavailable",
                                   "1 of 25 cases checked on tape and torch alone: jax unavailable"]
    assert T.partial_runs(RunResult(cases=[fx.convnet_case()])) == []  # the control


# ---------------------------------------------------------------- one failing-leaves rule
def test_vacuous_leaves_are_not_failing():
    case = fx.vacuous_case()
    assert [x.path for x in case.leaves if x.verdict == "vacuous"] == ["features.0.bias", "features.3.bias"]
    assert T.failing_leaves(case) == [] == case.failing_leaves() == reports._common.failing_leaves(case)
    assert not case.failed
    everything = fx.vacuous_case()
    for leaf in everything.leaves:
        if leaf.role in ("param", "input"):
            leaf.verdict = "vacuous"
    everything.verdict = "vacuous"
    assert T.failing_leaves(everything) == []
    assert T.summary_line(everything).startswith("every gradient leaf is vacuous (9 ≈0 on every backend)")


def test_renderers_and_assertion_share_the_rule():
    """The terminal, GitHub, JUnit, Markdown, HTML and the assertion message all list the same failing leaves."""
    run = fx.two_part_run()
    expected = [(c.name, x.path) for c in run.cases for x in c.failing_leaves()]
    assert expected == [("convnet-imprecise-fail", "features.3.weight"), ("convnet-broken", "features.3.weight")]
    summary = reports.render_summary(run)
    assert [ln.split(" — ")[0].split(" ", 2)[2] for ln in summary.splitlines()
            if re.match(r"^(✗|≈) [A-Z]+ (?!\()", ln)] == [f"{c} :: {p}" for c, p in expected]
    gh = [ln for ln in reports.github_annotations(run) if ln.startswith("::error")]
    assert len(gh) == len(expected)
    junit = reports.render_junit(run)
    assert junit.count('<testcase name="features.3.weight"') == len(expected)
    md_rows = [ln for ln in reports.render_markdown(run).split("### Failing leaves")[1].split("###")[0].splitlines()
               if ln.startswith("| c") and not ln.startswith("| case")]
    assert len(md_rows) == len(expected)
    html = reports.render_html(run)
    assert html.count("class='card ") == len(expected) + 1  # and one card for the float32 warning
    for case in run.cases:
        assert [x.path for x in A.failing_leaves(case)] == [x.path for x in case.failing_leaves()]


# ---------------------------------------------------------------- the assertion message
def _failing_case() -> CaseResult:
    case = fx.disagree_case()
    case.name = "small"
    return case


def test_summary_line_and_format_failure():
    case = _failing_case()
    assert T.summary_line(case) == "1/9 leaves disagree: features.3.weight (jax)"
    lines = T.format_failure(case).splitlines()
    assert lines[0] == T.summary_line(case)
    assert lines[1].startswith("case 'small': float32, train, seed 0, backends tape, torch, jax; the disagreement "
                               "starts at features.3.weight")
    assert lines[2].split() == ["leaf", "verdict", "blamed", "max", "abs", "max", "rel", "headroom", "message"]
    assert lines[3].split()[:3] == ["features.3.weight", "disagree", "jax"]
    assert lines[4].startswith("  8 other leaves agree (largest headroom 0.08 at classifier.bias")
    assert lines[-1] == "replay: gradcheck run convnet -k convnet-broken --seed 0"


def test_format_failure_two_parts():
    case = fx.imprecise_case("fail")
    case.kinks = [fx.relu_kink()]
    for leaf in case.leaves:
        if leaf.path == "features.0.bias":
            leaf.verdict = "vacuous"
    text = T.format_failure(case)
    lines = text.splitlines()
    assert lines[0] == "1/9 leaves fail: features.3.weight (jax; imprecise)"
    assert lines[3].split()[:2] == ["features.3.weight", "imprecise"]
    assert lines[3].endswith("jax float32 is 800× further from float64 than torch on features.3.weight "
                             "(4.8e-04 vs 6e-07; limit 6.1e-06)")
    assert "  7 other leaves agree" in text  # the vacuous one is not among them
    assert "  1 leaf is vacuous (≈0 on every backend; not failures, not in the headroom): features.0.bias" in lines
    assert f"  kink: {T.kink_sentence(fx.relu_kink())}" in lines
    warn = fx.imprecise_case("warn")
    warn.verdict = "disagree"  # a float64 failure elsewhere: the float32 warning is listed beside it
    assert "  float32 warning: jax float32 is 800×" in T.format_failure(warn)


def test_format_failure_error_first_and_clean():
    case = fx.error_case()
    case.name = "evil\n::error::x"
    text = T.format_failure(case)
    lines = text.splitlines()
    assert lines[0] == "backend jax failed: NotImplementedError: op 'erf' has no jax kernel; add it to " \
                       "backends/jax_ops.py (and 1 more errors)"
    i = lines.index("error in tape: ValueError: " + fx.ERROR_MESSAGE)
    assert lines[i + 1:i + 3] == ["    gradcheck/kernels.py:210 in matmul",
                                  "    gradcheck/backends/numpy_ops.py:96 in check_matmul"]
    assert "error in jax: NotImplementedError: op 'erf' has no jax kernel; add it to backends/jax_ops.py" in lines
    assert "    ops.py:12" in lines
    assert all(not COMMAND_START.match(ln) and "\x1b" not in ln for ln in lines)
    assert lines[1].startswith("case 'evil\\n::error::x'")


def test_format_failure_injection_in_leaf_paths():
    case = fx.injection_run().cases[0]
    lines = T.format_failure(case).splitlines()
    assert all(not COMMAND_START.match(ln) for ln in lines)
    assert not any(re.search("[\x00-\x08\x0b-\x1f\x7f]", ln) for ln in lines)


def test_assertions_reexport_the_text_module():
    for name in ("failing_leaves", "summary_line", "format_failure", "_who", "_fmt", "_table", "_headroom"):
        assert getattr(A, name) is getattr(T, name), name


def test_who():
    case = _failing_case()
    leaf = case.leaves[5]
    assert T._who(leaf, case) == "jax"
    single = CaseResult(name="x", backends=["tape"], leaves=[LeafResult(path="w", role="param", verdict="disagree",
                                                                         referee=leaf.referee[:1])])
    assert T._who(single.leaves[0], single) == "tape vs referee"
    nobody = LeafResult(path="w", role="param", verdict="structural")
    assert T._who(nobody, case) == "unresolved; structural"


def test_origin_and_inherited():
    case = fx.disagree_case()
    case.origin = results.Origin(path="layer3.1", layer="BasicBlock", kind="forward", message="relu at a kink")
    assert T.origin_sentence(case) == ("the disagreement starts in the forward pass at layer3.1 (BasicBlock): no "
                                       "layer's own backward disagrees when replayed alone (relu at a kink)")
    assert T.origin_sentence(fx.convnet_case()) == ""
    leaf = case.leaves[5]
    leaf.inherited = True
    assert T.leaf_detail(leaf).endswith("; inherited: a layer after it in forward order is wrong")
    assert "  the disagreement starts in the forward pass at layer3.1" in T.format_failure(case)
