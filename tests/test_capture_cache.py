"""from_torch's capture cache: a warm run reads the exported graph instead of exporting, and is never wrong.

A case built from the cache gives what a fresh capture gives (leaves, verdicts, every node's origin) without
calling ``torch.export``; whatever can change the graph (the module's code, an attribute, an input's shape,
torch's version) changes the key; a broken entry, or one that holds another module's graph, is discarded and the
module captured afresh; ``cache_dir = false`` writes nothing; a module whose source cannot be read is captured
without the cache.  The session runs with the caches off (tests/conftest.py); each test here gives a folder.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch_families  # noqa: E402
from torch import nn  # noqa: E402

from gradcheck import cache, from_torch  # noqa: E402
from gradcheck.check.runner import RunOptions, run_case  # noqa: E402
from gradcheck.frontends.torch import capture, capture_cache  # noqa: E402
from gradcheck.frontends.torch import model as tmodel  # noqa: E402

OPTIONS = RunOptions(backends=("torch", "tape"))


class Small(nn.Module):
    """A conv, a BatchNorm (running statistics are buffer mutations), dropout (case draws) and a head."""

    def __init__(self, scale: float = 1.0):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.drop = nn.Dropout(0.25)
        self.head = nn.Linear(3 * 5 * 5, 4)
        self.scale = scale

    def forward(self, x):
        h = self.drop(torch.relu(self.bn(self.conv(x)))) * self.scale
        return self.head(h.flatten(1))


class Tanh(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Sigmoid(nn.Module):
    """Tanh's parameters under the same names, computing something else."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        return torch.sigmoid(self.fc(x)) * 3.0


@pytest.fixture
def folder(tmp_path):
    cache.use(str(tmp_path / "cache"), "--cache-dir")
    yield tmp_path / "cache" / cache.CAPTURES
    cache.use(None)


@pytest.fixture
def exports(monkeypatch):
    """How many times torch.export.export ran."""
    calls = []
    real = torch.export.export

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", counted)
    return calls


def small():
    torch.manual_seed(0)
    return Small(), torch.randn(2, 2, 5, 5)


def entries(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir()
                  if p.name.endswith(capture_cache.SUFFIX) and not p.name.startswith(".")) if folder.is_dir() else []


def summary(case):
    """What a run of the case decides, and where every node of its graph comes from."""
    res = run_case(case, OPTIONS)
    program = case.build(np.random.default_rng(0))._program
    graph = program.graph(case.mode == "train")
    leaves = [(leaf.path, leaf.role, leaf.layer, leaf.verdict, tuple(leaf.blame),
               {b: round(n, 9) for b, n in leaf.norms.items()}) for leaf in res.leaves]
    origins = [(n.name, str(n.target), capture.module_of(n), capture.source_line(n)) for n in graph.nodes]
    return {"verdict": res.verdict, "errors": res.errors, "notes": res.notes, "leaves": leaves, "origins": origins,
            "first": res.first_disagreement}


# ---------------------------------------------------------------- a warm case is the cold one, without export
def test_a_warm_capture_gives_the_cold_results_without_exporting(folder, exports):
    cold = summary(from_torch(*small()))
    assert len(exports) == 1 and len(entries(folder)) == 1
    warm_case = from_torch(*small())
    assert len(exports) == 1  # read from the cache, not exported
    graph = warm_case.build(np.random.default_rng(0))._program.graph(True)
    assert graph.from_cache and graph.entry is not None
    warm = summary(warm_case)
    assert len(exports) == 1
    assert warm == cold
    assert cold["verdict"] == "agree" and cold["leaves"]
    assert any(kind == "BatchNorm2d" for _, _, (_, kind), _ in cold["origins"])  # origins survive the round trip


def test_an_entry_holds_the_graph_not_the_weights(folder):
    torch.manual_seed(0)
    wide = nn.Sequential(nn.Linear(512, 1024), nn.Tanh(), nn.Linear(1024, 8))  # 2 MB of float32 weights
    from_torch(wide, torch.randn(2, 512))
    (entry,) = entries(folder)
    assert (folder / entry).stat().st_size < 200_000
    assert wide[0].weight.abs().sum() > 0  # the module's own weights are left as they were


def test_each_mode_has_its_own_entry(folder, exports):
    m, x = small()
    from_torch(m, x, mode="eval")
    from_torch(m, x, mode="train")
    assert len(exports) == 2 and len(entries(folder)) == 2


def _described(program) -> tuple:
    """Everything ``capture.read_graph`` and the checks read of a program, with nodes by name: what an entry
    must give back as the export gave it."""
    from torch.fx.node import map_arg

    def val(v):
        if isinstance(v, torch.Tensor):
            return ("tensor", tuple(v.shape), v.dtype)
        return (type(v).__name__, tuple(val(x) for x in v)) if isinstance(v, (tuple, list)) else v

    nodes = [(n.name, n.op, str(n.target), repr(map_arg(n.args, lambda a: "%" + a.name)),
              repr(map_arg(n.kwargs, lambda a: "%" + a.name)), val(n.meta.get("val")),
              [(k, path) for k, (path, _) in (n.meta.get("nn_module_stack") or {}).items()],
              capture.module_of(n), n.meta.get("stack_trace")) for n in program.graph.nodes]
    sig = program.graph_signature
    inputs = [(s.kind.name, type(s.arg).__name__, s.arg.name, s.target, s.persistent) for s in sig.input_specs]
    outputs = [(s.kind.name, type(s.arg).__name__, s.arg.name, s.target) for s in sig.output_specs]
    constants = {k: (v.dtype, v.tolist()) for k, v in program.constants.items()}
    return nodes, inputs, outputs, constants


@pytest.mark.parametrize("family", sorted(torch_families.FAMILIES))
def test_an_entry_gives_back_the_exported_program_node_for_node(family, tmp_path):
    """Each family's train-mode program through an entry's format and back (a file written and read as the
    cache does): the same nodes, arguments, shapes, origins, source lines, signature and constants."""
    from gradcheck.frontends.torch import graph_file

    module, inputs = torch_families.FAMILIES[family]()
    wrapper = capture._Forward(module)
    capture.hold_undifferentiable(wrapper, tuple(inputs), True)
    ep = capture.export(wrapper, tuple(inputs), True, "fused", family)
    assert not isinstance(ep, capture._Traced)
    torch.save(graph_file.write(ep), tmp_path / "entry.pt")
    back = graph_file.read(torch.load(tmp_path / "entry.pt", weights_only=True))
    assert _described(back) == _described(ep)
    assert any(n.meta.get("nn_module_stack") for n in back.graph.nodes)


def test_a_program_the_format_does_not_carry_is_captured_each_time(folder, exports, caplog):
    """A branch written with torch.cond exports as a higher-order op whose branches are subgraphs: the entry's
    format does not carry those, so nothing is written and every build exports (a debug note says why)."""

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda v: torch.tanh(v), lambda v: torch.sigmoid(v), (self.fc(x),))

    torch.manual_seed(0)
    module, x = Branchy(), torch.randn(2, 4)
    with caplog.at_level(logging.DEBUG, logger="gradcheck.capture_cache"):
        from_torch(module, x)
        from_torch(module, x)
    assert len(exports) == 2 and entries(folder) == []
    assert "does not keep" in caplog.text and "get_attr" in caplog.text
    from_torch(*small())  # the control: a plain module's program is written
    assert len(entries(folder)) == 1


def test_a_warm_build_and_run_import_no_dynamo(tmp_path):
    """Reading an entry and running the case on torch (its random draws in a dispatch mode) imports no
    torch._dynamo: the import cost a warm from_torch case 1.5 s. The cold process, which exports, does import it."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import torch
        from gradcheck import cache, from_torch
        from gradcheck.check.runner import RunOptions, run_case
        from test_capture_cache import small

        cache.use({str(tmp_path / "cache")!r}, "--cache-dir")
        case = from_torch(*small())
        res = run_case(case, RunOptions(backends=("torch", "tape")))
        print(res.verdict, "torch._dynamo" in sys.modules)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    assert [r.stdout.split()[-2:] for r in runs] == [["agree", "True"], ["agree", "False"]]


# ---------------------------------------------------------------- what changes the key
def _load(path, name="gc_capture_cache_model"):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def key_of(module, *inputs, training=True, forward=None):
    return capture_cache.key(capture._Forward(module, forward), tuple(inputs), training, "fused", {})


def test_the_key_changes_with_the_module_code(tmp_path):
    path = tmp_path / "netdef.py"
    body = """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def forward(self, x):
                return {}(self.fc(x))
    """
    x = torch.randn(2, 4)
    try:
        path.write_text(textwrap.dedent(body.format("torch.tanh")))
        before = key_of(_load(path).Net(), x)
        path.write_text(textwrap.dedent(body.format("torch.sigmoid")))
        after = key_of(_load(path).Net(), x)
        path.write_text(textwrap.dedent(body.format("torch.tanh")))
        again = key_of(_load(path).Net(), x)
    finally:
        sys.modules.pop("gc_capture_cache_model", None)
    assert before is not None and after is not None
    assert before != after and before == again


def test_the_key_changes_with_what_shapes_the_graph(monkeypatch):
    m, x = small()
    base = key_of(m, x)
    assert base == key_of(*small())  # other parameter values, same graph: the same key
    assert key_of(Small(scale=2.0), x) != base  # a config attribute
    assert key_of(m, torch.randn(3, 2, 5, 5)) != base  # an input shape
    assert key_of(m, x.double()) != base  # an input dtype
    assert key_of(m, x, training=False) != base
    assert key_of(m, x, forward=lambda mod, x: mod(x) * 2) != base
    m.head.weight.requires_grad_(False)
    assert key_of(m, x) != base  # requires_grad
    m.head.weight.requires_grad_(True)
    monkeypatch.setattr(torch, "__version__", "9.9.9+other")
    assert key_of(m, x) != base


def _made_with(act):
    """A module class made by a function: one source for every class it makes, told apart by its closure."""

    class Made(nn.Module):
        def forward(self, x):
            return act(x)

    return Made()


def test_the_key_changes_with_what_a_class_made_by_a_function_closes_over():
    x = torch.randn(2, 3)
    assert key_of(_made_with(torch.cos), x) != key_of(_made_with(torch.acos), x)
    assert key_of(_made_with(torch.cos), x) == key_of(_made_with(torch.cos), x)


def test_a_class_made_by_a_function_gets_its_own_graph_on_an_empty_input(folder, exports):
    """The load check compares outputs, which an empty input cannot tell apart: the key must."""
    x = torch.randn(1, 0, 3, dtype=torch.float64)
    from_torch(_made_with(torch.acos), x)
    case = from_torch(_made_with(torch.cos), x)
    graph = case.build(np.random.default_rng(0))._program.graph(case.mode == "train")
    ops = {str(n.target) for n in graph.nodes if n.op == "call_function"}
    assert "aten.cos.default" in ops and "aten.acos.default" not in ops, ops
    assert len(exports) == 2 and len(entries(folder)) == 2


class _Scaled(nn.Module):
    """A 0-d tensor held as a plain attribute (not a parameter or buffer): a constant of the graph."""

    def __init__(self, scale):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.scale = torch.tensor(scale)

    def forward(self, x):
        return self.fc(x) * self.scale


def test_a_0_d_tensor_attribute_is_keyed_by_its_value(folder, exports):
    """A 0-d tensor has no byte view: keying it raised, and from_torch failed for any module holding one."""
    x = torch.randn(2, 3)
    assert key_of(_Scaled(2.0), x) is not None and key_of(_Scaled(2.0), x) != key_of(_Scaled(3.0), x)
    assert summary(from_torch(_Scaled(2.0), x))["verdict"] == "agree"


def _countdown(n):
    return _countdown(n - 1) if n > 0 else 0  # reads itself: the key names it rather than following it


def test_a_forward_calling_a_recursive_helper_is_keyed():
    m, x = small()
    assert key_of(m, x, forward=lambda mod, x: mod(x) * (1 + _countdown(2))) is not None


def test_another_torch_version_captures_afresh(folder, exports, monkeypatch):
    from_torch(*small())
    monkeypatch.setattr(torch, "__version__", "9.9.9+other")
    from_torch(*small())
    assert len(exports) == 2 and len(entries(folder)) == 2


# ---------------------------------------------------------------- broken and wrong entries
def test_a_corrupted_entry_is_discarded_and_recaptured(folder, exports, caplog):
    cold = summary(from_torch(*small()))
    (entry,) = entries(folder)
    (folder / entry).write_bytes(b"not a pt2 archive")
    with caplog.at_level(logging.DEBUG, logger="gradcheck.capture_cache"):
        case = from_torch(*small())
    assert len(exports) == 2
    assert "cannot be read" in caplog.text
    assert summary(case) == cold
    assert entries(folder) == [entry] and (folder / entry).stat().st_size > 1000  # written again, whole


def _plant(folder, exports):
    """Tanh's entry overwritten by Sigmoid's graph, under Tanh's key: the wrong program where Tanh's should be."""
    torch.manual_seed(0)
    x = torch.randn(3, 6)
    tanh = Tanh()
    cold = summary(from_torch(tanh, x))
    (entry,) = entries(folder)
    name = entry[: -len(capture_cache.SUFFIX)]
    wrong = capture.export(capture._Forward(Sigmoid()), (x,), True, "fused", "Sigmoid")
    capture_cache.store(name, str(folder), wrong, {})
    assert entries(folder) == [entry]
    assert len(exports) == 2
    return tanh, x, cold


def ops_of(case) -> set[str]:
    graph = case.build(np.random.default_rng(0))._program.graph(True)
    return {str(n.target) for n in graph.nodes if n.op == "call_function"}


def test_an_entry_holding_another_modules_graph_is_caught_and_not_used(folder, exports, caplog):
    tanh, x, cold = _plant(folder, exports)
    with caplog.at_level(logging.DEBUG, logger="gradcheck.capture_cache"):
        case = from_torch(tanh, x)
    assert "differs from the module's float64 forward" in caplog.text
    assert len(exports) == 3  # captured afresh
    assert "aten.tanh.default" in ops_of(case) and "aten.sigmoid.default" not in ops_of(case)
    assert summary(case) == cold


def test_the_checks_of_a_fresh_capture_catch_a_wrong_entry_that_passed_the_load_check(folder, exports, monkeypatch):
    """The float64 graph-against-module check of the run (``Program._unfaithful``) runs on a cached graph too:
    with the load-time check switched off, the wrong graph reaches the run, is caught there, and the verdict
    comes from a fresh capture."""
    tanh, x, cold = _plant(folder, exports)
    monkeypatch.setattr(tmodel.Program, "_cache_mismatch", lambda self, graph, training: "")
    case = from_torch(tanh, x)
    assert len(exports) == 2  # the wrong entry was read ...
    assert "aten.sigmoid.default" in ops_of(case)
    res = summary(case)
    assert len(exports) == 3  # ... and caught by the run's own checks, which captured afresh
    assert "aten.tanh.default" in ops_of(case)
    assert res == cold
    assert entries(folder) == []  # the wrong entry is gone


# ---------------------------------------------------------------- off, unreadable, unwritable
def test_no_cache_writes_nothing(tmp_path, exports, monkeypatch):
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path / "env"))
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    cache.use(False, "--no-cache")
    try:
        from_torch(*small())
        from_torch(*small())
    finally:
        cache.use(None)
    assert len(exports) == 2 and not (tmp_path / "env").exists()
    monkeypatch.setenv(cache.NO_CACHE_ENV, "1")
    from_torch(*small())
    assert len(exports) == 3 and not (tmp_path / "env").exists()
    monkeypatch.delenv(cache.NO_CACHE_ENV)
    from_torch(*small())  # the environment's folder, now that nothing turns it off
    assert entries(tmp_path / "env" / cache.CAPTURES)


def test_a_model_without_readable_source_is_captured_without_the_cache(folder, exports, caplog):
    def forward(self, x):
        return torch.tanh(self.fc(x))

    def init(self):
        nn.Module.__init__(self)
        self.fc = nn.Linear(4, 4)

    Made = type("Made", (nn.Module,), {"__init__": init, "forward": forward})
    Made.__module__ = "__main__"  # as a class typed at a REPL is
    with caplog.at_level(logging.DEBUG, logger="gradcheck.capture_cache"):
        case = from_torch(Made(), torch.randn(2, 4))
    assert "without the capture cache: the source of class Made cannot be read" in caplog.text
    assert run_case(case, OPTIONS).verdict == "agree"
    assert entries(folder) == []


def test_an_unwritable_folder_warns_and_captures_without_the_cache(tmp_path, exports):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    cache.use(str(blocker), "--cache-dir")
    capture_cache._warned.clear()
    try:
        with pytest.warns(capture_cache.CaptureCacheWarning, match=r"--cache-dir .*afile.*cannot be written"):
            case = from_torch(*small())
    finally:
        cache.use(None)
    assert run_case(case, OPTIONS).verdict == "agree"


def test_the_folder_is_bounded_least_recently_used_first(tmp_path):
    for i, name in enumerate(("old", "mid", "new")):
        path = tmp_path / f"{name}{capture_cache.SUFFIX}"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 + i, 1000 + i))
    writing = tmp_path / f".new.abc.tmp{capture_cache.SUFFIX}"  # another process's write in progress
    writing.write_bytes(b"x" * 100)
    left = tmp_path / f".old.abc.tmp{capture_cache.SUFFIX}"  # a write whose process was killed a day ago
    left.write_bytes(b"x" * 100)
    os.utime(left, (1000, 1000))
    former = tmp_path / "0123abcd.pt2"  # an entry of the torch.export.save format, whose key can no longer match
    former.write_bytes(b"x" * 10)
    capture_cache._bound(str(tmp_path), limit=250)
    assert entries(tmp_path) == [f"mid{capture_cache.SUFFIX}", f"new{capture_cache.SUFFIX}"]
    assert writing.exists() and not left.exists() and not former.exists()


def test_the_capture_folder_follows_the_cache_dir_setting(tmp_path, monkeypatch):
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    monkeypatch.delenv(cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(sys, "platform", "linux")
    assert cache.capture_folder() == cache.Choice(str(tmp_path / "xdg" / "gradcheck" / "jax" / "torch-export"),
                                                  "default")
    cache.use(str(tmp_path / "c"), "--cache-dir")
    try:
        assert cache.capture_folder() == cache.Choice(str(tmp_path / "c" / "torch-export"), "--cache-dir")
        cache.use(False, "--no-cache")
        assert cache.capture_folder() == cache.Choice(None, "--no-cache")
    finally:
        cache.use(None)


def test_warnings_of_a_clean_warm_capture_are_none(folder):
    from_torch(*small())
    with warnings.catch_warnings():
        warnings.simplefilter("error", capture_cache.CaptureCacheWarning)
        from_torch(*small())


def test_jax_and_the_captures_share_one_folder(tmp_path, exports):
    """jax's entries at the folder's top level, the captures in its subfolder: each cache serves its own."""
    jax = pytest.importorskip("jax")
    from gradcheck.backends.jax import driver as jax_driver

    hits = []
    listener = lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None  # noqa: E731
    jax.monitoring.register_event_listener(listener)
    try:
        jax_driver.use_compile_cache(str(tmp_path), "--cache-dir")
        jax_driver.configure_jax()
        torch.manual_seed(0)
        module, x = Tanh(), torch.randn(3, 6)
        options = RunOptions(backends=("tape", "jax"), repeat=False)
        cold = run_case(from_torch(module, x), options)
        jax_files = {p.name for p in tmp_path.iterdir() if p.name.endswith("-cache")}
        assert jax_files and entries(tmp_path / cache.CAPTURES) and len(exports) == 1
        jax.clear_caches()  # only the folder can serve what was compiled
        hits.clear()
        warm = run_case(from_torch(module, x), options)
        assert len(exports) == 1 and len(hits) >= 2  # the capture and jax's programs both came from the folder
        assert warm.verdict == cold.verdict == "agree"
        assert {p.name for p in tmp_path.iterdir() if p.name.endswith("-cache")} == jax_files
    finally:
        jax.monitoring.unregister_event_listener(listener)
        jax_driver.use_compile_cache(None)


def test_gradcheck_run_no_cache_writes_no_capture(tmp_path, monkeypatch):
    from gradcheck.app.cli import main
    from gradcheck.backends.jax import driver as jax_driver

    (tmp_path / "cc_target.py").write_text(textwrap.dedent("""
        import torch

        def model():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), (torch.randn(2, 4),)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(tmp_path / "env"))
    args = ["run", "cc_target:model", "--backends", "torch,tape", "--no-html", "-q"]
    try:
        assert main(args + ["--no-cache"]) == 0
        assert not (tmp_path / "env").exists()
        assert main(args) == 0  # the control: the same run with the cache on keeps the capture
        assert entries(tmp_path / "env" / cache.CAPTURES)
    finally:
        jax_driver.use_compile_cache(None)
