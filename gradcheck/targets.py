"""What ``gradcheck run TARGET`` means: a model, a suite, a layer, or ``package.module:function``."""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass

from gradcheck.case import Case


class TargetError(ValueError):
    """A target that names nothing runnable (the message lists what there is)."""


@dataclass
class Request:
    dtype: str | None = None  # None: the target's own (float32 for models, both for suites)
    seed: int = 0
    batch: int | None = None
    input_shape: tuple[int, ...] | None = None
    mode: str | None = None  # None: the target's own (train for models)


def _models():
    from gradcheck.layers.models import MODELS

    return MODELS


def _suites():
    from gradcheck.suites import SUITES

    return SUITES


def _dtypes(request: Request, default: str) -> list[str]:
    if request.dtype == "both":
        return ["float32", "float64"]
    return [request.dtype or default]


def resolve(names: list[str], request: Request) -> list[Case]:
    cases: list[Case] = []
    for name in names:
        cases.extend(_resolve_one(name, request))
    seen = set()
    for case in cases:
        if case.name in seen:
            raise TargetError(f"two cases are named {case.name!r}; give each case a unique name")
        seen.add(case.name)
    return cases


def _resolve_one(name: str, request: Request) -> list[Case]:
    if ":" in name:
        return _retype(_user_cases(name, request), request)
    models = _models()
    if name in models:
        spec = models[name]
        return [spec.case(seed=request.seed, dtype=dt, mode=request.mode or "train", batch=request.batch,
                          input_shape=request.input_shape) for dt in _dtypes(request, "float32")]
    if request.batch is not None or request.input_shape is not None:
        raise TargetError(f"--batch and --input-shape apply to model targets; {name!r} is not a model")
    suites = _suites()
    if name in suites:
        return _retype(_with_mode(suites[name](seed=request.seed), request), request)
    layer_cases = [c for c in suites["layers"](seed=request.seed) if _layer_of(c) == name]
    if layer_cases:
        return _retype(_with_mode(layer_cases, request), request)
    known = list(models) + list(suites) + layer_names()
    hint = difflib.get_close_matches(name, known, n=3)
    raise TargetError(
        f"unknown target {name!r}" + (f" (did you mean {', '.join(hint)}?)" if hint else "")
        + f"; models: {', '.join(models)}; suites: {', '.join(suites)}; layers: see `gradcheck list layers`; "
        "or package.module:function returning a Case or a list of Cases"
    )


def _with_mode(cases, request):
    return [c.with_(mode=request.mode) if request.mode else c for c in cases]


def _retype(cases: list[Case], request: Request) -> list[Case]:
    """Apply an explicit --dtype: one dtype casts every case; ``both`` doubles them."""
    if request.dtype is None:
        return cases
    if request.dtype != "both":
        return [c if c.dtype == request.dtype else c.with_(dtype=request.dtype) for c in cases]
    out, seen = [], {c.name for c in cases}
    for c in cases:
        for dt in ("float32", "float64"):
            stem = c.name[: -len(c.dtype) - 1] if c.name.endswith("-" + c.dtype) else c.name
            name = f"{stem}-{dt}"
            if name in seen and name != c.name:
                continue  # the suite already has this case in that dtype
            out.append(c.with_(dtype=dt, name=name))
    return list({c.name: c for c in out}.values())


def _layer_of(case: Case) -> str:
    return case.model or case.name.split("[")[0].split("-")[0]


def _user_cases(target: str, request: Request) -> list[Case]:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"target {target!r}: cannot import module {module_name!r} ({exc}); "
                          "is it on sys.path (run from your project root, or pip install it)?") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise TargetError(f"target {target!r}: module {module_name!r} has no attribute {attr!r}")
    made = fn() if callable(fn) else fn
    cases = [made] if isinstance(made, Case) else made
    if not isinstance(cases, (list, tuple)) or not cases or not all(isinstance(c, Case) for c in cases):
        raise TargetError(
            f"target {target!r}: {attr}() returned {type(made).__name__}; it must return a "
            "gradcheck.case.Case or a non-empty list of them"
        )
    return [c.with_(seed=request.seed) if request.seed else c for c in cases]


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
