"""What a target names: a model, a suite, a layer, or ``package.module:function`` returning cases.

``gradcheck run TARGET...`` and the pytest plugin's ``--gradcheck-suite``
both resolve targets here, with the same rules:

* a function target is called with the keywords it takes among ``seed``
  and ``dtype`` (a built-in suite takes both) and no others, and may return
  a Case or a list of Cases;
* an explicit seed, dtype or mode is then set on every case; the name stays
  the configuration's name (``--dtype float64`` checks the same case in
  float64 only, it does not make another one);
* the current folder is importable, as under pytest and ``python -m``, so
  ``gradcheck run mycases:cases`` works next to ``mycases.py``;
* the same case named by several targets (``smoke`` and ``layers`` share
  rows) runs once; two different cases under one name are an error that
  names the targets they came from.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
import traceback
from dataclasses import dataclass

import numpy as np

from gradcheck.case import Case


class TargetError(ValueError):
    """A target that names nothing runnable (the message names it and lists what there is)."""


@dataclass
class Request:
    dtype: str | None = None  # None: each case's own
    seed: int | None = None  # None: each case's own (0 for built-in suites and models)
    batch: int | None = None
    input_shape: tuple[int, ...] | None = None
    mode: str | None = None  # None: each case's own (train for models)


def _models():
    from gradcheck.layers.models import MODELS

    return MODELS


def _suites():
    from gradcheck.suites import SUITES

    return SUITES


def resolve(names: list[str], request: Request | None = None) -> list[Case]:
    """The cases of every target, in order, each distinct case once."""
    request = request or Request()
    cases: list[Case] = []
    origin: dict[str, tuple[Case, str]] = {}
    for name in names:
        for case in _resolve_one(name, request):
            seen = origin.get(case.name)
            if seen is None:
                origin[case.name] = (case, name)
                cases.append(case)
            elif not same_case(seen[0], case):
                where = f"target {name!r}" if seen[1] == name else f"targets {seen[1]!r} and {name!r}"
                raise TargetError(f"two different cases are named {case.name!r} (from {where}); "
                                  "give each case a unique name")
    return cases


def _resolve_one(name: str, request: Request) -> list[Case]:
    if ":" in name:
        return _apply(_call(load_function(name), name, request), request)
    models = _models()
    if name in models:
        spec = models[name]
        case = spec.case(seed=request.seed or 0, dtype=request.dtype or "float32", mode=request.mode or "train",
                         batch=request.batch, input_shape=request.input_shape)
        return _apply([case], request)
    if request.batch is not None or request.input_shape is not None:
        raise TargetError(f"--batch and --input-shape apply to model targets; {name!r} is not a model")
    suites = _suites()
    if name in suites:
        return _apply(_call(suites[name], name, request), request)
    layer_cases = [c for c in _call(suites["layers"], "layers", request) if _layer_of(c) == name]
    if layer_cases:
        return _apply(layer_cases, request)
    known = list(models) + list(suites) + layer_names()
    hint = difflib.get_close_matches(name, known, n=3)
    raise TargetError(
        f"unknown target {name!r}" + (f" (did you mean {', '.join(hint)}?)" if hint else "")
        + f"; models: {', '.join(models)}; suites: {', '.join(suites)}; layers: see `gradcheck list layers`; "
        "or package.module:function returning a Case or a list of Cases"
    )


def _apply(cases: list[Case], request: Request) -> list[Case]:
    """An explicit seed, dtype and mode on every case; names unchanged."""
    changes = {k: v for k, v in (("seed", request.seed), ("dtype", request.dtype), ("mode", request.mode))
               if v is not None}
    return [c.with_(**changes) if changes else c for c in cases]


def _layer_of(case: Case) -> str:
    return case.model or case.name.split("[")[0].split("-")[0]


# ---------------------------------------------------------------- package.module:function
def load_function(target: str):
    """The object ``package.module:attr`` names, importing from the current folder too."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr or not all(p.isidentifier() for p in module_name.split(".")) \
            or not attr.isidentifier():
        raise TargetError(f"target {target!r}: expected package.module:function, e.g. mylib.checks:cases")
    # pytest (rootdir) and `python -m` put the current folder first on the import path; the
    # `gradcheck` console script does not, and a module next to the user must import all the same.
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise TargetError(f"target {target!r}: no module named {exc.name!r} in {here} or on the import path; "
                              "run from the folder that holds it, or pip install its package") from None
        raise TargetError(f"target {target!r}: importing {module_name!r} failed: {_one_line(exc)}") from None
    except BaseException as exc:  # a syntax error, or the module's own code raising
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise TargetError(f"target {target!r}: importing {module_name!r} failed: {_one_line(exc)}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
        hint = difflib.get_close_matches(attr, public, n=3)
        raise TargetError(f"target {target!r}: module {module_name!r} has no attribute {attr!r}"
                          + (f" (did you mean {', '.join(hint)}?)" if hint else "")) from None


def _one_line(exc: BaseException) -> str:
    """``Type: message (file:line)`` of where the error happened in the user's code."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}:{exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _call(fn, target: str, request: Request) -> list[Case]:
    """Call a target function with the keywords it accepts; check that it gave cases."""
    attr = target.rpartition(":")[2] or target
    if isinstance(fn, Case):
        made = fn
    elif callable(fn):
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        wide = any(p.kind is p.VAR_KEYWORD for p in params.values())
        needs = [n for n, p in params.items() if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                 p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in ("seed", "dtype")]
        if needs:
            raise TargetError(f"target {target!r}: {attr}() needs argument(s) {', '.join(needs)}; a target "
                              "function is called with no arguments (or only seed=, dtype=)")
        # A built-in suite draws its configurations from the seed (fuzz) and takes the dtype; the
        # dtype is set on every case afterwards all the same, for functions that do not take it.
        kwargs = {k: v for k, v in (("seed", request.seed if request.seed is not None else 0),
                                    ("dtype", request.dtype)) if wide or k in params}
        try:
            made = fn(**kwargs)
        except Exception as exc:
            raise TargetError(f"target {target!r}: {attr}() raised {_one_line(exc)}") from None
    else:
        made = fn
    from gradcheck.frontends import jax as jax_frontend
    from gradcheck.frontends import torch as export

    cases = export.as_cases(made, name=attr)
    if cases is None:  # (model, args[, kwargs]) of from_jax; a model jax cannot trace is a usage error
        try:
            cases = jax_frontend.as_cases(made, name=attr)
        except Exception as exc:
            if not jax_frontend.is_usage_error(exc):
                raise
            raise TargetError(f"target {target!r}: {exc}") from None
    if not cases:
        raise TargetError(
            f"target {target!r}: {attr} gave {type(made).__name__}"
            + (" (empty)" if isinstance(made, (list, tuple)) and not made else "")
            + "; it must be (or return) a gradcheck Case, a non-empty list of Cases, a (torch.nn.Module, inputs) "
              "pair, a (jax model, args[, kwargs]) tuple of from_jax's arguments, or a non-empty list of those"
        )
    return list(cases)


# ---------------------------------------------------------------- one case from two targets
def same_case(a: Case, b: Case) -> bool:
    """Whether two cases check the same thing: same settings, and builders that build the same.

    Suites build their cases afresh on each call, so the builders are new
    closures every time; they are the same when their code and everything
    they close over are (``make(L.Linear, 4, 3)`` twice is one builder).
    Tags and notes only label a case.
    """
    fields = ("name", "dtype", "mode", "seed", "model")
    return all(getattr(a, f) == getattr(b, f) for f in fields) and all(
        _same(getattr(a, f), getattr(b, f)) for f in ("build", "inputs", "forward"))


def _same(a, b, depth: int = 0) -> bool:
    if a is b:
        return True
    if depth > 12 or type(a) is not type(b):
        return False
    if inspect.isfunction(a):
        return (a.__code__ == b.__code__ and a.__qualname__ == b.__qualname__ and a.__module__ == b.__module__
                and _same(a.__defaults__, b.__defaults__, depth + 1)
                and _same(a.__kwdefaults__, b.__kwdefaults__, depth + 1)
                and _same(tuple(c.cell_contents for c in a.__closure__ or ()),
                          tuple(c.cell_contents for c in b.__closure__ or ()), depth + 1))
    if inspect.ismethod(a):
        return _same(a.__func__, b.__func__, depth + 1) and _same(a.__self__, b.__self__, depth + 1)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a truth value
        return False


def replay(names: list[str], settings):
    """case -> the ``gradcheck run`` command that re-runs it alone with the settings that were given.

    Only settings some layer set are spelled out; ``[tool.gradcheck]`` is
    read again by the command itself.
    """
    import shlex

    base = "gradcheck run " + " ".join(shlex.quote(n) for n in names)
    if settings.seed is not None:
        base += f" --seed {settings.seed}"
    for key in ("backends", "mode", "referee", "imprecise", "order", "steps", "optimizer", "lr"):
        value = getattr(settings, key)
        if value is not None:
            text = ",".join(value) if isinstance(value, tuple) else str(value)
            base += f" --{key} {shlex.quote(text)}"

    def command(case) -> str:
        return f"{base} --dtype {case.dtype} -k {shlex.quote(case.name)}"

    return command


# ---------------------------------------------------------------- selection and listings
def select(cases: list[Case], keyword: str | None = None, shard: tuple[int, int] | None = None) -> list[Case]:
    """``-k`` keeps names containing ``keyword`` (case-insensitive); ``--shard I/N`` every N-th from I."""
    if keyword:
        cases = [c for c in cases if keyword.lower() in c.name.lower()]
    if shard:
        i, n = shard
        cases = cases[i - 1 :: n]
    return cases


def model_summaries():
    return [(name, spec.description) for name, spec in _models().items()]


def suite_summaries():
    out = []
    for name, fn in _suites().items():
        doc = (fn.__doc__ or "").strip().splitlines()
        out.append((name, doc[0] if doc else ""))
    return out


def layer_names() -> list[str]:
    return sorted({_layer_of(c) for c in _suites()["layers"](seed=0)})
