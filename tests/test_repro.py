"""Reproducer folders (gradcheck.repro): the origin layer's data and one script per backend, run here in a
fresh process where gradcheck cannot be imported, printing the numbers next to the stored float64 reference."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import gradcheck.layers as L
from gradcheck import ops, repro
from gradcheck.case import Case
from gradcheck.check.runner import RunOptions, run_case

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from isolated import run_scripts  # noqa: E402
from test_localise import (  # noqa: E402  (after the importorskips: it needs torch)
    CONV_BN,
    MLP,
    Glue,
    LeakyReluGrad,
    run_localised,
    torch_batch_norm_wrong_where,
)

from gradcheck.backends.torch import ops as torch_ops  # noqa: E402  (after the importorskips: it imports torch)

ROW = re.compile(r"  index \(([\d, ]*)\): (.*)")


def rows_of(text, leaf):
    """The element rows printed under ``RESULT <leaf>``: {index: {label: value}}."""
    block = text.split(f"RESULT {leaf} ", 1)[1].split("\nRESULT ", 1)[0].split("\nSUMMARY", 1)[0]
    found = {}
    for m in ROW.finditer(block):
        idx = tuple(int(i) for i in m.group(1).replace(" ", "").split(",") if i)
        found[idx] = {k.strip(): float(v) for k, v in (p.rsplit(" ", 1) for p in m.group(2).split(", "))}
    return found


@pytest.fixture
def origin_folder(monkeypatch, tmp_path):
    torch_batch_norm_wrong_where(monkeypatch, 4, None)
    res, cr = run_localised(monkeypatch, CONV_BN)
    assert res.origin is not None and res.origin.path == "1"
    folders = repro.write_repro(tmp_path / "repro", cr, res)
    monkeypatch.undo()  # the scripts run against the real frameworks anyway; nothing here needs the bug any more
    return folders, res


def test_the_origin_folder_holds_the_layer_and_one_script_per_backend(origin_folder):
    folders, res = origin_folder
    assert len(folders) == 1
    d = folders[0]
    assert d.name == "1" and d.parent.name == "conv_bn"
    assert sorted(p.name for p in d.iterdir()) == ["README.md", "layer.npz", "meta.json", "repro_jax.py",
                                                   "repro_tape.py", "repro_torch.py"]
    meta = json.loads((d / "meta.json").read_text())
    assert (meta["layer"], meta["kind"], meta["blame"], meta["op"]) == ("BatchNorm2d", "vjp", ["torch"], "batch_norm")
    data = np.load(d / "layer.npz")
    assert {"param.weight", "param.bias", "param.running_mean", "input.0", "cotangent.0", "reference.input.0",
            "torch.input.0", "jax.input.0", "tape.input.0", "reference.output"} <= set(data.files)
    off = {x["name"]: x for x in meta["leaves"] if x["verdict"] != "agree"}
    assert off["input.0"]["blame"] == ["torch"] and off["input.0"]["reference"] in ("jax", "tape")
    np.testing.assert_array_equal(data["reference.input.0"], data[off["input.0"]["reference"] + ".input.0"])
    for script in ("repro_torch.py", "repro_jax.py", "repro_tape.py"):
        assert not re.search(r"^\s*(import|from)\s+gradcheck", (d / script).read_text(), re.M)


def test_the_scripts_run_without_gradcheck_and_print_the_disagreeing_numbers(origin_folder, tmp_path):
    folders, _ = origin_folder
    d = folders[0]
    data = np.load(d / "layer.npz")
    out = run_scripts([d / "repro_torch.py", d / "repro_jax.py", d / "repro_tape.py"], cwd=tmp_path)
    code, text = out[str(d / "repro_torch.py")]
    # Real torch is right: it agrees now, and the numbers gradcheck saw from the wrong one are shown beside.
    assert code == 0, text
    assert "RESULT input.0 agree" in text and "gradcheck saw torch disagree on input.0" in text
    rows = rows_of(text, "input.0")
    assert len(rows) >= 5
    ref, saw = data["reference.input.0"], data["torch.input.0"]
    for idx, values in rows.items():
        assert values["reference"] == ref[idx]  # printed to 17 digits: the stored float64 value itself
        assert values["gradcheck saw torch"] == saw[idx]
        assert abs(values["torch now"] - ref[idx]) <= 1e-12 * max(1.0, abs(ref[idx]))
    assert max(abs(v["gradcheck saw torch"] - v["reference"]) for v in rows.values()) > 1e-4  # the bug's size
    code, text = out[str(d / "repro_jax.py")]
    assert code == 0 and "SUMMARY jax agrees" in text, text
    assert set(re.findall(r"RESULT (\S+) agree", text)) == {"weight", "bias", "input.0", "output"}
    code, text = out[str(d / "repro_tape.py")]
    assert code == 0 and "RESULT input.0 agree finite_difference=" in text, text
    fd = float(re.search(r"RESULT input.0 agree finite_difference=(\S+)", text).group(1))
    v = np.random.default_rng(2).standard_normal(ref.shape)  # the script's direction for its third leaf
    assert abs(fd - float(np.vdot(ref, v))) < 1e-6 * max(1.0, abs(fd))


def test_a_framework_that_disagrees_with_the_reference_fails_its_script(origin_folder, tmp_path):
    folders, _ = origin_folder
    d = folders[0]
    arrays = dict(np.load(d / "layer.npz"))
    arrays["reference.input.0"] = arrays["reference.input.0"] * 1.001  # as if torch, here, were wrong
    np.savez(d / "layer.npz", **arrays)
    (code, text), = run_scripts([d / "repro_torch.py"], cwd=tmp_path).values()
    assert code == 1 and "RESULT input.0 disagree" in text and "SUMMARY torch DISAGREES" in text, text
    rows = rows_of(text, "input.0")
    assert rows and all(v["torch now"] != v["reference"] for v in rows.values())


def conv_bn_case():
    """A target for `gradcheck run tests.test_repro:conv_bn_case`."""
    return CONV_BN


def test_run_case_writes_the_origins_reproducer_when_asked(monkeypatch, tmp_path):
    torch_batch_norm_wrong_where(monkeypatch, 4, None)
    res = run_case(CONV_BN, RunOptions(repro=str(tmp_path / "r")))
    d = tmp_path / "r" / "conv_bn" / "1"
    assert (res.origin.path, res.origin.blame) == ("1", ["torch"])
    assert [n for n in res.notes if n.startswith("reproducer for")] == [f"reproducer for 1: {d}"]
    meta = json.loads((d / "meta.json").read_text())
    assert (meta["layer"], meta["kind"], meta["blame"], meta["op"]) == ("BatchNorm2d", "vjp", ["torch"], "batch_norm")
    assert {"repro_torch.py", "repro_jax.py", "repro_tape.py", "layer.npz"} <= {p.name for p in d.iterdir()}
    monkeypatch.undo()  # the control: a case that agrees writes nothing
    clean = run_case(CONV_BN, RunOptions(repro=str(tmp_path / "clean")))
    assert clean.verdict == "agree" and not (tmp_path / "clean").exists()
    assert not any(n.startswith("reproducer for") for n in clean.notes)


def test_the_command_line_writes_the_origins_reproducer(monkeypatch, tmp_path):
    from gradcheck.app import cli

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))  # `tests.test_repro` as a target
    monkeypatch.chdir(tmp_path)
    torch_batch_norm_wrong_where(monkeypatch, 4, None)
    code = cli.main(["run", "tests.test_repro:conv_bn_case", "--repro", "out", "--no-html", "--quiet"])
    assert code == 1
    d = tmp_path / "out" / "conv_bn" / "1"
    meta = json.loads((d / "meta.json").read_text())
    assert (meta["layer"], meta["blame"]) == ("BatchNorm2d", ["torch"])
    (out, _), = run_scripts([d / "repro_jax.py"], cwd=tmp_path).values()
    assert out == 0  # the folder stands on its own: jax, which was right, agrees with the stored reference
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "tests.test_repro:conv_bn_case", "--repro", "clean", "--no-html", "--quiet"]) == 0
    assert not any((tmp_path / "clean").iterdir())  # made up front (checked before the run), and left empty


def test_without_a_replay_nothing_is_written(monkeypatch, tmp_path):
    res, cr = run_localised(monkeypatch, CONV_BN)
    assert repro.write_repro(tmp_path, cr, res) == [] and not any(tmp_path.iterdir())


def test_a_forward_origin_reproduces_the_outputs(monkeypatch, tmp_path):
    original = torch_ops.linear
    monkeypatch.setattr(torch_ops, "linear", lambda x, w, b=None: original(x, w, b) + (
        (1e-6 * (1 + original(x, w, b).abs())).detach() if tuple(w.shape) == (8, 8) else 0.0))
    res, cr = run_localised(monkeypatch, MLP)
    assert res.origin.kind == "forward"
    (d,) = repro.write_repro(tmp_path / "r", cr, res)
    monkeypatch.undo()
    meta = json.loads((d / "meta.json").read_text())
    assert meta["kind"] == "forward" and [x["name"] for x in meta["leaves"] if x["verdict"] != "agree"] == ["output"]
    (code, text), = run_scripts([d / "repro_torch.py"], cwd=tmp_path).values()
    assert code == 0 and "gradcheck saw torch disagree on output" in text, text
    assert rows_of(text, "output")


def test_a_layer_type_that_cannot_be_rebuilt_prints_the_stored_numbers(monkeypatch, tmp_path):
    monkeypatch.setattr(torch_ops, "relu", LeakyReluGrad.apply)
    case = Case("glue", lambda rng: L.Chain(L.Dense(4, 8, rng=rng), Glue(L.Dense(8, 8, rng=rng))),
                lambda rng: (rng.standard_normal((6, 4)),))
    res, cr = run_localised(monkeypatch, case)
    (d,) = repro.write_repro(tmp_path / "r", cr, res)
    (code, text), = run_scripts([d / "repro_torch.py"], cwd=tmp_path).values()
    assert code == 2 and "cannot rebuild this layer with torch alone: no standalone rebuild of layer type Glue" in text
    assert "STORED input.0 disagree blame=torch" in text
    data = np.load(d / "layer.npz")
    for idx, values in rows_of(text.replace("STORED input.0", "RESULT input.0"), "input.0").items():
        assert values["reference"] == data["reference.input.0"][idx]
        assert values["gradcheck saw torch"] == data["torch.input.0"][idx]


# ---------------------------------------------------------------- every layer type the scripts rebuild
def _convs(rng):
    return L.Chain(L.Conv2d(3, 4, 3, stride=2, padding=1, rng=rng), L.BatchNorm2d(4), L.GroupNorm(2, 4),
                   L.Conv2d(4, 4, 3, padding="same", dilation=2, groups=2, bias=False, rng=rng), L.Flatten(),
                   L.Dense(64, 3, activation=ops.tanh, rng=rng))


def _conv1d(rng):
    return L.Chain(L.Conv1d(2, 3, 3, padding=1, rng=rng), L.BatchNorm1d(3), L.LayerNorm(5))


def _tokens(rng):
    return L.Chain(L.Embedding(10, 8, padding_idx=0, rng=rng), L.LayerNorm(8),
                   L.MultiheadAttention(8, 2, causal=True, rng=rng), L.MultiheadAttention(8, 2, batch_first=False, rng=rng),
                   L.Dense(8, 3, rng=rng))


def _ids(rng):
    ids = rng.integers(0, 10, size=(2, 5))
    ids[0, 1] = 0  # the padding row is used
    return (ids,)


MASK = np.array([[True, False, True, True, False], [True, True, False, True, True], [False, True, True, True, True]])

LAYER_CASES = [
    (Case("convs", _convs, lambda rng: (rng.standard_normal((2, 3, 8, 8)),)), 6),
    (Case("conv1d", _conv1d, lambda rng: (rng.standard_normal((2, 2, 5)),)), 3),
    (Case("tokens", _tokens, _ids), 6),  # both attentions' out_proj are layers of their own
    (Case("eval_bn", lambda rng: L.Chain(L.Dense(4, 6, rng=rng), L.BatchNorm1d(6)),
          lambda rng: (rng.standard_normal((5, 4)),), mode="eval"), 2),
    (Case("sdpa", lambda rng: L.Lambda(L.scaled_dot_product_attention, is_causal=True),
          lambda rng: tuple(rng.standard_normal(s) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 4)))), 1),
    (Case("sdpa_mask", lambda rng: L.Lambda(L.scaled_dot_product_attention, attn_mask=MASK, scale=0.3),
          lambda rng: tuple(rng.standard_normal(s) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 4)))), 1),
]


@pytest.mark.parametrize("case,n", LAYER_CASES, ids=[c.name for c, _ in LAYER_CASES])
def test_every_supported_layer_is_rebuilt_by_each_framework_and_agrees(monkeypatch, tmp_path, case, n):
    res, cr = run_localised(monkeypatch, case.with_(dtype="float64"), RunOptions(referee="off"), per_layer=True,
                            keep=True)
    assert res.verdict == "agree", [(x.path, x.message) for x in res.leaves if x.verdict != "agree"]
    folders = repro.write_repro(tmp_path / "r", cr, res, calls="all")
    assert len(folders) == len([c for c in cr.localisation.calls if c.replayed]) >= n
    scripts = [d / s for d in folders for s in ("repro_torch.py", "repro_jax.py", "repro_tape.py")]
    out = run_scripts(scripts, cwd=tmp_path)
    for script, (code, text) in out.items():
        layer = json.loads((Path(script).parent / "meta.json").read_text())
        if layer["unsupported"]:
            assert code == 2 and layer["layer"] == "Flatten", (script, text)
            continue
        assert code == 0, (script, text)
        results = re.findall(r"RESULT (\S+) (\w+)", text)
        assert results and all(v in ("agree", "vacuous") for _, v in results), (script, text)
        assert {name for name, _ in results} == {x["name"] for x in layer["leaves"]}, (script, text)
