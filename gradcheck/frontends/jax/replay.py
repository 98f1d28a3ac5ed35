"""A reproducer of one custom rule call (``gradcheck.repro``): the user's rule, loaded by its import path, under
jax alone.

The origin of a ``from_jax`` disagreement is a call of a custom rule (``units.Unit``): a ``custom_vjp`` or
``custom_jvp`` equation of the model's jaxpr, at the operands the float64 reference gave it.  Its reproducer is
a script that needs jax, numpy and the user's package, nothing of gradcheck (the template is
``gradcheck/repro/templates/replay_jax_rule.py``).  It imports the rule by its import path, calls it on the
recorded operands rebuilt into the rule's own arguments, takes jax's VJP there with the recorded output
cotangent, and prints it next to every backend's recorded gradient.

**Naming the rule.**  The equation knows the function the rule stands for (its source file, line and name)
and, for a ``custom_vjp``, the user's ``bwd`` function itself.  The ``custom_vjp`` / ``custom_jvp`` object is
looked for among the globals of the module that defines the function, and one level down in the classes that
module defines (a rule held as a class attribute): an object whose primal function has that code (and, for a
``custom_vjp``, whose ``bwd`` is the equation's) is a candidate, named ``module:qualname``.

**Checked before it is written.**  The script's call is run here, on the recorded float64 operands: its output
and its VJP must be the equation's own (what jax ran in the replay) to float64 rounding, else the candidate is
not the rule (two rules made by one factory share their code) or its arguments are not rebuilt as it takes
them.  A rule that cannot be named and checked so (made inside the model's forward, defined in ``__main__``,
with ``nondiff_argnums``, taking pytree arguments of a custom type) gets a script that prints the stored
numbers and says why it cannot recompute them (exit status 2).

A rule's operands that are values it closes over (``num_consts``, jax hoisted them out of its body) are no
argument of the named function: the script leaves their gradients out, and says so.
"""

from __future__ import annotations

import importlib.resources
import inspect
import sys

import numpy as np

TEMPLATE = ("gradcheck.repro.templates", "replay_jax_rule.py")
SCRIPT = "repro_jax.py"
CHECK_RTOL = 1e-9  # the script's call against the equation's own, relative to each array's scale: rounding only


class NotNamed(Exception):
    """The rule cannot be loaded by an import path and called as recorded (the message says why)."""


def write_replay(unit, where, rec) -> dict:
    """Write ``repro_jax.py`` into ``where``; return what ``meta.json`` adds (``arrays``: what ``layer.npz``
    adds, the operands held as recorded; ``readme``: the folder's README text)."""
    import jax

    eqn = unit.eqn
    name, file, line = _source(eqn)
    name = name.rsplit(".", 1)[-1] or eqn.primitive.name
    kind = rec.layer  # custom_vjp or custom_jvp (units.record)
    operands, arrays = [], {}
    k = j = 0
    for slot, value in unit.slots:
        if slot == "input":
            operands.append(f"input.{k}")
            k += 1
        else:
            arrays[f"held.{j}"] = np.asarray(value)
            operands.append(f"held.{j}")
            j += 1
    num_consts = int(eqn.params.get("num_consts", 0) or 0)
    meta = {"function": name, "defined": f"{file}:{line}" if file else "", "rule": kind,
            "called": rec.source.rsplit("; called at ", 1)[-1] if "; called at " in rec.source else "",
            "operands": operands, "num_consts": num_consts, "import_path": "", "args": None,
            "jax_version": jax.__version__, "scripts": [SCRIPT], "unsupported": ""}
    try:
        path, skeleton = _named(unit, rec)
        meta["import_path"], meta["args"] = path, skeleton
    except NotNamed as exc:
        meta["unsupported"] = str(exc)
    return _written(where, meta, arrays, kind, name)


def write_stored(where, rec, function: str, kind: str, operands: list[str], why: str) -> dict:
    """``repro_jax.py`` for a unit no script can rebuild alone (``units.Region``): it prints the stored numbers."""
    import jax

    meta = {"function": function, "defined": "", "rule": kind,
            "called": rec.source.rsplit(", from ", 1)[-1] if ", from " in rec.source else "",
            "operands": operands, "num_consts": 0, "import_path": "", "args": None,
            "jax_version": jax.__version__, "scripts": [SCRIPT], "unsupported": why}
    return _written(where, meta, {}, kind, function)


def _written(where, meta: dict, arrays: dict, kind: str, name: str) -> dict:
    """The script written into ``where``; ``meta`` with the arrays ``layer.npz`` adds and the README's text."""
    script = importlib.resources.files(TEMPLATE[0]) / TEMPLATE[1]
    (where / SCRIPT).write_text(script.read_text(encoding="utf-8"), encoding="utf-8")
    meta["arrays"] = arrays
    meta["readme"] = _readme(meta, kind, name)
    return meta


def _readme(meta, kind, name) -> list[str]:
    if meta["import_path"]:
        module = meta["import_path"].split(":", 1)[0]
        how = (f"`python {SCRIPT}` imports `{meta['import_path']}` (the {kind} `{name}`; `{module}` must be "
               "importable), calls it on the recorded float64 operands (`input.*`, `held.*` in `layer.npz`), takes "
               "jax's VJP there with the recorded output cotangent (`cotangent.*`) and prints, per gradient, how far "
               "it is from the float64 reference (`reference.*`) and from each backend's recorded value (`tape.*`, "
               "`torch.*`, `jax.*`), then a float64 finite difference of the rule's primal along a random "
               "direction.  It needs jax and numpy, not gradcheck.")
    else:
        how = (f"`python {SCRIPT}` cannot rebuild the {kind} `{name}` without gradcheck ({meta['unsupported']}); it "
               "prints the numbers stored in `layer.npz`: the reference and each backend's recorded gradient.")
    return [how]


# ---------------------------------------------------------------- naming and checking the rule
def _named(unit, rec) -> tuple[str, object]:
    """``("module:qualname", the arguments' skeleton)`` of the rule, checked against the equation; raises
    ``NotNamed``."""
    eqn = unit.eqn
    found = _candidates(eqn)
    if not found:
        raise NotNamed(_why_not_found(eqn))
    tree = _in_tree(eqn, len(unit.slots) - int(eqn.params.get("num_consts", 0) or 0))
    skeleton = _skeleton(tree)
    problems = []
    for path, obj in found:
        if getattr(obj, "nondiff_argnums", ()):
            problems.append(f"{path} has nondiff_argnums {tuple(obj.nondiff_argnums)}: those arguments are not "
                            "among the recorded operands")
            continue
        why = _check(unit, rec, obj, tree)
        if not why:
            return path, skeleton
        problems.append(f"{path}: {why}")
    raise NotNamed("; ".join(problems))


def _source(eqn) -> tuple[str, str, int]:
    """``(function name, file, first line)`` the rule's primal body was traced from."""
    body = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
    info = getattr(getattr(body, "jaxpr", body), "debug_info", None)
    text = getattr(info, "func_src_info", None) or ""
    name, _, at = text.partition(" at ")
    file, _, line = at.rpartition(":")
    return name, file, int(line) if line.isdigit() else -1


def _bwd(eqn):
    """The user's ``bwd`` function of a ``custom_vjp`` equation, where jax keeps it (None otherwise)."""
    bwd = eqn.params.get("bwd")
    return getattr(bwd, "f", None) if bwd is not None else None


def _is_rule(obj, eqn, name, file, line, bwd) -> bool:
    import jax

    if eqn.primitive.name.startswith("custom_vjp"):
        if not isinstance(obj, jax.custom_vjp) or (bwd is not None and obj.bwd is not bwd):
            return False
    elif not isinstance(obj, jax.custom_jvp):
        return False
    try:
        fun = inspect.unwrap(obj.fun)  # jax.nn.relu's primal is a jitted function
    except ValueError:  # a cycle of __wrapped__
        return False
    code = getattr(fun, "__code__", None)
    return (code is not None and getattr(fun, "__name__", "") == name and code.co_firstlineno == line
            and _same_file(code.co_filename, file))


def _same_file(a: str, b: str) -> bool:
    import os

    try:
        return os.path.samefile(a, b)
    except OSError:
        return a == b


def _candidates(eqn) -> list[tuple[str, object]]:
    """Every ``(import path, object)`` that is the equation's rule, by the search the module doc describes."""
    name, file, line = _source(eqn)
    bwd = _bwd(eqn)
    modules = []
    for mod in list(sys.modules.values()):
        # The module's own dict: a module-level __getattr__ (a lazy or deprecating module) is never run.
        mod_file = vars(mod).get("__file__") if mod is not None and hasattr(mod, "__dict__") else None
        if isinstance(mod_file, str) and file and _same_file(mod_file, file):
            modules.append(mod)
    owner = sys.modules.get(getattr(bwd, "__module__", "") or "")
    if owner is not None and owner not in modules:
        modules.append(owner)
    found, seen = [], set()
    for mod in modules:
        if mod.__name__ == "__main__":
            continue
        for attr, value in list(vars(mod).items()):
            places = [(attr, value)]
            if isinstance(value, type) and value.__module__ == mod.__name__:
                places += [(f"{attr}.{a}", v.__func__ if isinstance(v, (staticmethod, classmethod)) else v)
                           for a, v in vars(value).items()]
            for qual, obj in places:
                if id(obj) not in seen and _is_rule(obj, eqn, name, file, line, bwd):
                    seen.add(id(obj))
                    found.append((f"{mod.__name__}:{qual}", obj))
    return found


def _why_not_found(eqn) -> str:
    name, file, line = _source(eqn)
    mains = [m for m in (sys.modules.get("__main__"),) if m is not None and file
             and getattr(m, "__file__", None) and _same_file(m.__file__, file)]
    if mains:
        return (f"{name} is defined in the script run as __main__ ({file}), which has no import path; define it in "
                "a module the script can import")
    return (f"no module-level name holds the rule {name} (defined at {file}:{line}): it is made inside another "
            "function's call (the model's forward, or a factory whose result is not kept at module level), so "
            "only a run of the whole model could rebuild it")


def _in_tree(eqn, n: int):
    """The treedef of the rule's positional arguments: a ``custom_vjp`` keeps it with its ``bwd``; else the
    arguments are taken to be ``n`` arrays (the check that follows says whether they are)."""
    import jax

    bwd = eqn.params.get("bwd")
    for transform in getattr(bwd, "transforms", ()) or ():
        fn, params = transform if isinstance(transform, tuple) and len(transform) == 2 else (None, None)
        if getattr(fn, "__name__", "") == "_flatten_bwd" and params:
            tree = params[0]
            if isinstance(tree, jax.tree_util.PyTreeDef) and tree.num_leaves == n:
                return tree
    return jax.tree_util.tree_structure(tuple(range(n)))


def _skeleton(tree):
    """The arguments' structure as JSON (tuples, lists, dicts with string keys, None; leaf k is ``{"leaf": k}``);
    raises ``NotNamed`` for another kind of node."""
    import jax

    def encode(x):
        if x is None:
            return None
        if isinstance(x, int) and not isinstance(x, bool):
            return {"leaf": x}
        if type(x) in (tuple, list):
            return {type(x).__name__: [encode(v) for v in x]}
        if type(x) is dict and all(isinstance(k, str) for k in x):
            return {"dict": [[k, encode(v)] for k, v in x.items()]}
        raise NotNamed(f"its arguments hold a {type(x).__name__} pytree node, which the script does not rebuild "
                       "(it rebuilds tuples, lists, dicts with string keys and None)")

    return encode(jax.tree_util.tree_unflatten(tree, list(range(tree.num_leaves))))


def _check(unit, rec, obj, tree) -> str:
    """Why calling ``obj`` on the recorded operands is not the equation's call ("" when it is): its output and
    its VJP at the recorded cotangent against the equation's, bound by jax (float64: from_jax enabled x64)."""
    import jax

    operands = _operands(unit, rec)
    n = int(unit.eqn.params.get("num_consts", 0) or 0)
    floats = [i for i, (slot, _) in enumerate(unit.slots) if slot == "input"]
    mine = [i for i in floats if i >= n]

    def named(*xs):
        ops = list(operands)
        for i, x in zip(mine, xs):
            ops[i] = x
        return obj(*jax.tree_util.tree_unflatten(tree, ops[n:]))

    def bound(*xs):
        ops = list(operands)
        for i, x in zip(mine, xs):
            ops[i] = x
        params = unit.eqn.primitive.get_bind_params(unit.eqn.params)
        return unit.eqn.primitive.bind(*ops, **params)

    try:
        got = _vjp(named, [operands[i] for i in mine], rec.cotangent)
        want = _vjp(bound, [operands[i] for i in mine], rec.cotangent)
    except Exception as exc:  # the candidate cannot be called so: not this call's rule, as recorded
        return f"calling it on the recorded operands fails ({type(exc).__name__}: {exc})"
    for label, a, b in (("output", got[0], want[0]), ("gradient", got[1], want[1])):
        if len(a) != len(b):
            return f"it gives {len(a)} {label}s, the recorded call {len(b)}"
        for x, y in zip(a, b):
            x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
            if x.shape != y.shape:
                return f"its {label} has shape {x.shape}, the recorded call's {y.shape}"
            scale = float(np.max(np.abs(y), initial=0.0))
            if float(np.max(np.abs(x - y), initial=0.0)) > CHECK_RTOL * max(scale, 1e-300):
                return f"its {label} is not the recorded call's (another rule with the same code, or other arguments)"
    return ""


def _operands(unit, rec) -> list:
    """The call's operands at the float64 reference: float ones from the record, the others as held."""
    it = iter(rec.args)
    return [np.asarray(next(it), np.float64) if slot == "input" else value for slot, value in unit.slots]


def _vjp(fn, xs, cotangents):
    """``(float outputs, gradients)`` of ``fn`` at ``xs`` with the cotangents of its float outputs."""
    import jax

    out, pull = jax.vjp(fn, *xs)
    leaves, out_tree = jax.tree_util.tree_flatten(out)
    it = iter(cotangents)
    cts, floats = [], []
    for o in leaves:
        if np.issubdtype(o.dtype, np.inexact):
            floats.append(o)
            cts.append(np.asarray(next(it), o.dtype))
        else:
            cts.append(np.zeros(o.shape, jax.dtypes.float0))
    return floats, list(pull(jax.tree_util.tree_unflatten(out_tree, cts)))
