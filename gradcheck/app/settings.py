"""Every setting of a gradient check, wherever it is given, read and validated in one place.

Layers, lowest first; a later layer wins wherever it sets a value:

1. the defaults (those of ``gradcheck.check.runner.RunOptions``; the backends are
   ``gradcheck.check.runner.DEFAULT_BACKENDS``);
2. ``[tool.gradcheck]`` in ``pyproject.toml``, or the TOML file of
   ``gradcheck run --config``;
3. pytest ini options (``gradcheck_<name>``);
4. command-line flags: ``gradcheck run --<name>`` or ``pytest --gradcheck-<name>``;
5. the ``@pytest.mark.gradcheck(...)`` marker;
6. the keyword arguments of ``assert_gradients_agree``.

Each layer is read with :func:`from_values`, which checks every value and
raises :class:`SettingsError` naming the place, the setting as the user
wrote it, and what it must be; :meth:`Settings.over` stacks the layers;
:meth:`Settings.run_options` turns the result into the runner's options.
The names, choices and help texts are here too (:data:`KEYS`), so the
command line, the pytest plugin, the config file and the assertion accept
the same settings and say the same things about them.

Importing this module imports nothing heavy: the pytest plugin imports it
while pytest starts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gradcheck.check.verdict import IMPRECISE_POLICIES, UNAVAILABLE_POLICIES

# gradcheck.check.trajectory.OPTIMIZERS and gradcheck.check.second_order.ORDERS (those import numpy; this stays light)
OPTIMIZERS = ("sgd", "adam")
ORDERS = (1, 2)


class SettingsError(ValueError):
    """A setting that cannot be used; the message names where it came from, the value and the fix."""


class NothingToCompare(SettingsError):
    """The backends and referee asked for (or installed) cannot compare anything."""


@dataclass(frozen=True)
class Key:
    name: str
    # how values are checked: "backends", "choice", "seed", "number", "positive", "order", "path", "cache", "memory",
    # "jobs", "table"
    kind: str
    metavar: str
    help: str
    choices: tuple[str, ...] = ()
    example: object = None  # shown in the fix of an error message
    check: bool = True  # a setting of one check (pytest options, marker, call arguments), not only of a run
    check_default: str = ""  # where assert_gradients_agree's default differs from a run's


REFEREES = ("auto", "leaves", "joint", "off")
# "both" was "float32 and float64 as two cases"; every float32 case now runs in float64 too.
DTYPES = ("float32", "float64", "both")
DTYPE_ALIASES = {"both": "float32"}

KEYS: dict[str, Key] = {k.name: k for k in (
    Key("backends", "backends", "LIST", "backends to compare, comma-separated: tape,torch,jax (default: all three)",
        example="tape,torch"),
    Key("dtype", "choice", "DTYPE",
        "float32 (default): each case is checked in float64, which decides, and measured in float32 against "
        "float64; float64: float64 only ('both' is a deprecated alias of float32)", DTYPES, example="float64",
        check_default="the model's parameter dtype"),
    Key("seed", "seed", "N", "seed of the parameters, inputs, loss cotangent and referee directions (default 0)",
        example=0),
    Key("rtol", "number", "X", "relative tolerance for every leaf (a rule applied after the defaults per dtype)",
        example=1e-3),
    Key("atol", "number", "X", "absolute tolerance for every leaf (added to the scaled one)", example=1e-6),
    Key("referee", "choice", "MODE",
        "float64 finite differences: auto (default: per leaf when cheap, else one joint direction), leaves, "
        "joint, off", REFEREES, example="auto"),
    Key("mode", "choice", "MODE", "train (batch statistics, dropout) or eval (default: the case's or model's own)",
        ("train", "eval"), example="eval"),
    Key("imprecise", "choice", "WHAT",
        "a float32 result too far from float64: warn (default) or fail the case", IMPRECISE_POLICIES,
        example="fail"),
    Key("unavailable", "choice", "WHAT",
        "a backend asked for but unavailable (not installed, or unable to run the case), so the case is checked "
        "on fewer backends than asked: warn (default: every report says so beside the verdict) or fail the case",
        UNAVAILABLE_POLICIES, example="fail"),
    Key("order", "order", "N",
        "1 (default): gradients; 2: Hessian-vector products per leaf too, compared across backends like "
        "gradients and refereed by central differences of each backend's own gradient", example=2),
    Key("steps", "seed", "N",
        "N > 0: each backend trains its own copy for N optimiser steps from the same start on the same batches; "
        "losses per step, the parameters after N steps and the step where the trajectories part (default 0)",
        example=3),
    Key("optimizer", "choice", "NAME", "the optimiser of --steps, written once in float64: sgd (default) or adam",
        OPTIMIZERS, example="adam"),
    Key("lr", "positive", "X", "learning rate of --steps (default: sgd 0.01, adam 0.001)", example=1e-3),
    Key("referee_budget_s", "number", "SECONDS",
        "referee auto: check every leaf apart when that is estimated to fit in this many seconds (default 20)",
        example=20, check=False),
    Key("output", "path", "DIR", "folder for the reports (default ./gradcheck-report)", example="gradcheck-report",
        check=False),
    Key("cache_dir", "cache", "DIR",
        "folder of gradcheck's persistent caches, which later runs read instead of compiling or capturing again: "
        "jax's compilation cache, and from_torch's captured graphs in its torch-export subfolder (default: the "
        "per-user cache folder, ~/.cache/gradcheck/jax on Linux; false in [tool.gradcheck], or --no-cache: neither)",
        example="~/.cache/gradcheck/jax", check=False),
    Key("memory_limit", "memory", "GiB",
        "the most memory a case may be estimated to need, in GiB; a case estimated above it is refused (verdict "
        "error) before it runs (default: what the machine has available; off: no check)", example=8, check=False),
    Key("jobs", "jobs", "N",
        "worker processes for a run of several cases: N, or auto (one per core this process may use); each "
        "worker's BLAS, torch and jax threads are limited to its share of the cores (default 1: every case in "
        "this process)", example=2, check=False),
    Key("tolerance", "table", "", "tolerance defaults and rules (see gradcheck/check/tolerance.py)", check=False),
)}
CHECK_KEYS = tuple(k for k, key in KEYS.items() if key.check)
VALUE_KEYS = tuple(k for k in KEYS if k != "tolerance")

# How a setting reads in each place, for messages: spell(key, value).
Spell = Callable[[str, object], str]


def _toml_value(value) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def spell_toml(key, value) -> str:
    return f"{key} = {_toml_value(value)}"


def spell_kwarg(key, value) -> str:
    return f"{key}={value!r}"


def spell_flag(prefix: str = "--") -> Spell:
    return lambda key, value: f"{prefix}{key.replace('_', '-')} {value}"


def spell_ini(key, value) -> str:
    return f"gradcheck_{key} = {value}"


@dataclass(frozen=True)
class Settings:
    """One layer of settings, or several stacked; ``None`` means "not set here, ask the layer below"."""

    backends: tuple[str, ...] | None = None
    dtype: str | None = None
    seed: int | None = None
    rtol: float | None = None
    atol: float | None = None
    referee: str | None = None
    mode: str | None = None
    imprecise: str | None = None
    unavailable: str | None = None
    order: int | None = None
    steps: int | None = None
    optimizer: str | None = None
    lr: float | None = None
    referee_budget_s: float | None = None
    output: str | None = None
    cache_dir: str | bool | None = None  # False: no persistent compilation cache
    memory_limit: float | None = None  # GiB; inf: no memory check (gradcheck.check.memory)
    jobs: int | str | None = None  # worker processes of a run; "auto": one per core this process may use
    # The [tool.gradcheck.tolerance] table and where it came from.
    tolerance: tuple[dict, str] | None = field(default=None, compare=False)
    # (rtol, atol, rule name) of every layer that set one, lowest first: each becomes a tolerance
    # rule, so a leaf's verdict records every layer that decided its tolerance.
    overrides: tuple[tuple[float | None, float | None, str], ...] = field(default=(), compare=False)

    def over(self, base: Settings) -> Settings:
        """These settings where set, ``base`` elsewhere."""
        changes = {k: getattr(self, k) for k in VALUE_KEYS if getattr(self, k) is not None}
        return replace(base, **changes, tolerance=self.tolerance or base.tolerance,
                       overrides=base.overrides + self.overrides)

    def rules(self):
        """The tolerance rules: defaults, the tolerance table, then each layer's rtol/atol."""
        from gradcheck.check.tolerance import ToleranceRules

        rules = ToleranceRules.from_config(*self.tolerance) if self.tolerance else ToleranceRules()
        for rtol, atol, name in self.overrides:
            rules = rules.with_overrides(rtol, atol, name=name)
        return rules

    def backends_or_default(self) -> tuple[str, ...]:
        from gradcheck.check.runner import DEFAULT_BACKENDS

        return self.backends or DEFAULT_BACKENDS

    def referee_or_default(self) -> str:
        from gradcheck.check.runner import RunOptions

        return self.referee or RunOptions.referee

    def run_options(self, replay=None, repeat: bool = True):
        """The runner's options; what no layer set keeps ``RunOptions``' own default."""
        from gradcheck.check.runner import RunOptions

        given = {k: getattr(self, k) for k in ("referee", "referee_budget_s", "imprecise", "unavailable", "order",
                                               "steps", "optimizer", "lr", "memory_limit")
                 if getattr(self, k) is not None}
        return RunOptions(backends=self.backends_or_default(), rules=self.rules(), repeat=repeat, replay=replay,
                          **given)


# ---------------------------------------------------------------- reading one layer
def from_values(values: Mapping, where: str, *, spell: Spell = spell_kwarg, text: bool = False,
                allowed: tuple[str, ...] = CHECK_KEYS, rule_name: str | None = None) -> Settings:
    """One layer of settings from ``values``, each checked.

    ``text``: the values are strings from a command line or an ini file
    (``"3"`` is a seed, ``""`` is unset); otherwise they are typed (TOML,
    a marker, call arguments) and must have their type (``seed = "3"`` and
    ``seed = 1.5`` are errors).  ``None`` is unset everywhere.  ``rule_name``
    names this layer's rtol/atol rule (default ``where``).
    """
    unknown = [k for k in values if k not in allowed]
    if unknown:
        raise SettingsError(f"{where}: unknown setting(s) {sorted(unknown)}; allowed: {', '.join(allowed)}")
    out: dict = {}
    for key, value in values.items():
        if value is None or (text and value == ""):
            continue
        out[key] = _check(KEYS[key], value, where, spell, text)
    tolerance = out.pop("tolerance", None)
    settings = Settings(**out, tolerance=(tolerance, where) if tolerance else None)
    if settings.rtol is not None or settings.atol is not None:
        settings = replace(settings, overrides=((settings.rtol, settings.atol, rule_name or where),))
    return settings


def _check(key: Key, value, where: str, spell: Spell, text: bool):
    said = f"{where}: {spell(key.name, value)}"
    example = spell(key.name, key.example)
    if key.kind == "backends":
        return parse_backends(value, said, example)
    if key.kind == "choice":
        if not isinstance(value, str) or value not in key.choices:
            raise SettingsError(f"{said}: expected one of {', '.join(key.choices)}")
        return DTYPE_ALIASES.get(value, value) if key.name == "dtype" else value
    if key.kind == "seed":
        return non_negative_int(value, said, example, text)
    if key.kind == "number":
        return non_negative_number(value, said, example, text)
    if key.kind == "positive":
        number = non_negative_number(value, said, example, text)
        if number == 0:
            raise SettingsError(f"{said}: must be a finite number > 0, e.g. {example}")
        return number
    if key.kind == "order":
        n = non_negative_int(value, said, example, text, least=1)
        if n not in ORDERS:
            raise SettingsError(f"{said}: must be 1 (gradients) or 2 (Hessian-vector products too), e.g. {example}")
        return n
    if key.kind == "path":
        if not isinstance(value, str) or not value.strip():
            raise SettingsError(f"{said}: must be a path (a non-empty string), e.g. {example}")
        return value
    if key.kind == "cache":
        if value is False:  # cache_dir = false, or --no-cache
            return False
        if not isinstance(value, str) or not value.strip():
            raise SettingsError(f"{said}: must be a folder (a non-empty string), e.g. {example}; to run without "
                                "the cache: cache_dir = false, or --no-cache")
        return value
    if key.kind == "memory":
        return memory_limit(value, said, example, text)
    if key.kind == "jobs":
        return jobs(value, said, example, text)
    if key.kind == "table":
        if not isinstance(value, dict):
            raise SettingsError(f"{said}: must be a table, e.g. [tool.gradcheck.tolerance] (see gradcheck/check/tolerance.py)")
        from gradcheck.check.tolerance import ToleranceRules

        try:
            ToleranceRules.from_config(value, where)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        return value
    raise AssertionError(f"settings key {key.name!r} has no check for kind {key.kind!r}")  # pragma: no cover


def parse_backends(value, said: str = "backends", example: str = "backends=('tape', 'torch')") -> tuple[str, ...]:
    """``"tape,torch"`` or ``["tape", "torch"]`` -> ``("tape", "torch")``, each name checked."""
    from gradcheck.backends import rows

    known = [r.name for r in rows() if r.driver is not None]  # every registered backend that can run a case

    if isinstance(value, str):
        names = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value):
        names = list(value)
    else:
        raise SettingsError(f"{said}: must name backends, as a comma-separated string or a list of names, "
                            f"e.g. {example}")
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise SettingsError(f"{said}: names no backend; choose from {', '.join(known)}")
    for n in names:
        if n not in known:
            raise SettingsError(f"{said}: unknown backend {n!r}; choose from {', '.join(known)}")
    return tuple(dict.fromkeys(names))


def _is_int(value) -> bool:
    import numbers

    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def non_negative_int(value, said: str, example: str, text: bool = False, least: int = 0) -> int:
    """An integer >= ``least``: from text its digits, otherwise an int (not a bool, not 1.5)."""
    bound = "non-negative" if least == 0 else f">= {least}" if least != 1 else "positive"
    problem = f"{said}: must be a {bound} integer, e.g. {example}"
    if text and isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise SettingsError(problem) from None
    if not _is_int(value) or value < least:
        raise SettingsError(problem)
    return int(value)


def non_negative_number(value, said: str, example: str, text: bool = False) -> float:
    """A finite number >= 0 (nan and inf tolerate nothing and everything)."""
    problem = f"{said}: must be a finite number >= 0, e.g. {example}"
    if text and isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise SettingsError(problem) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise SettingsError(problem)
    return float(value)


def memory_limit(value, said: str, example: str, text: bool = False) -> float:
    """GiB > 0, or ``off`` (``false`` in TOML): ``inf``, which never refuses a case (gradcheck.check.memory)."""
    if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return math.inf
    problem = (f"{said}: must be a number of GiB > 0 (the most a case may be estimated to need), e.g. {example}, "
               "or off to run every case whatever its estimate")
    try:
        number = non_negative_number(value, said, example, text)
    except SettingsError:
        raise SettingsError(problem) from None
    if number == 0:
        raise SettingsError(problem)
    return number


def jobs(value, said: str, example: str, text: bool = False) -> int | str:
    """A number of worker processes >= 1, or ``auto`` (resolved when the run starts: gradcheck.app.parallel)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return non_negative_int(value, said, example, text, least=1)
    except SettingsError:
        raise SettingsError(f"{said}: must be a number of worker processes >= 1, e.g. {example}, or auto (one per "
                            "core this process may use)") from None


def from_config(path=None) -> tuple[Settings, str]:
    """The ``[tool.gradcheck]`` layer (see ``gradcheck.app.config``) and the file it came from ("" if none)."""
    from gradcheck.app import config

    try:
        table, source = config.load(path)
    except config.ConfigError as exc:
        raise SettingsError(str(exc)) from None
    where = source or "[tool.gradcheck]"
    return from_values(table, where, spell=spell_toml, allowed=tuple(KEYS), rule_name=f"{where}: rtol/atol"), source


# ---------------------------------------------------------------- run selection (gradcheck run only)
def parse_batch(value) -> int | None:
    if value is None:
        return None
    return non_negative_int(value, f"gradcheck run: --batch {value}", "--batch 2", text=True, least=1)


def parse_input_shape(value) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        shape = tuple(int(v) for v in value.lower().replace(",", "x").split("x"))
    except ValueError:
        raise SettingsError(f"gradcheck run: --input-shape {value}: expected sizes joined by x, "
                            "e.g. --input-shape 3x224x224") from None
    if not shape or any(s <= 0 for s in shape):
        raise SettingsError(f"gradcheck run: --input-shape {value}: every size must be positive, "
                            "e.g. --input-shape 3x32x32")
    return shape


def parse_shard(value) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        i, n = (int(v) for v in value.split("/"))
    except ValueError:
        raise SettingsError(f"gradcheck run: --shard {value}: expected I/N, e.g. --shard 2/4") from None
    if not 1 <= i <= n:
        raise SettingsError(f"gradcheck run: --shard {value}: I must be between 1 and N, e.g. --shard 1/{max(n, 1)}")
    return i, n


# ---------------------------------------------------------------- can anything be compared?
def require_comparison(backends: tuple[str, ...], referee: str, *, cli: bool = False) -> tuple[str, ...]:
    """``backends`` if they can compare something; else :class:`NothingToCompare` saying what to do.

    A check needs two installed backends, or one backend asked for alone
    with the referee on (its gradient is held against float64 finite
    differences).  A backend that is missing is skipped only while two
    remain: a cross-check asked of several frameworks does not quietly
    become a check of one.  One backend with the referee off compares
    nothing, and nothing compared is never a pass.  ``cli`` spells the fix
    as flags, otherwise as keyword arguments.
    """
    from gradcheck.backends import get_backend

    missing = {}
    for b in backends:
        ok, why = get_backend(b).available()
        if not ok:
            missing[b] = why
    present = [b for b in backends if b not in missing]
    if len(present) >= 2 or (len(backends) == 1 and present and referee != "off"):
        return backends
    flag = (lambda k, v: f"--{k} {v}") if cli else (lambda k, v: f"{k}={v!r}")
    head = "gradcheck needs two backends, or one backend and the referee, to compare gradients"
    if not present or len(backends) > 1:
        have = ", ".join(present) or "none"
        lines = [f"{head}: of {', '.join(backends)} only {have} {'is' if len(present) == 1 else 'are'} installed"]
        lines += [f"  {b}: {why}" for b, why in missing.items()]
        fix = "install a missing framework"
        if present:
            alone = flag("backends", present[0] if cli else (present[0],))
            fix += f", or ask for {alone} alone to check it against the float64 referee"
            if referee == "off":
                fix += f" ({flag('referee', 'auto')})"
        lines.append(fix[0].upper() + fix[1:] + ".")
        raise NothingToCompare("\n".join(lines))
    b = present[0]
    other = "torch" if b != "torch" else "jax"
    raise NothingToCompare(
        f"{head}: {flag('backends', b if cli else (b,))} with {flag('referee', 'off')} compares nothing. "
        f"Turn the referee on ({flag('referee', 'auto')}) or add a second backend "
        f"({flag('backends', f'{b},{other}' if cli else (b, other))})."
    )
