"""The capture cache: a module's exported, decomposed program kept on disk, so the next run need not export it.

``torch.export`` and ``run_decompositions`` are deterministic for a given
module, inputs and torch, and they are most of what building a
``from_torch`` case costs.  An entry is the decomposed program as
``graph_file`` writes it (nodes, their ``nn_module_stack``, ``stack_trace``
and shapes, the graph signature and tensor constants; no weights, as the
graph binds the module's own), with the float inputs the forward holds
(``capture.hold_undifferentiable``), in one ``torch.save`` file read back with
``weights_only=True``.  Not ``torch.export.save``: loading its archive
imports most of ``torch._dynamo``, which cost more than the rest of a warm
build (docs/decisions.md).

The key (:func:`key`) covers what can change the captured graph: the source
of every module class of the model that torch does not define (and of the
file it is in) and what its methods close over, each submodule's attributes, training flag, parameter and
buffer names, shapes, dtypes and ``requires_grad``; the ``forward=`` and
``references=`` functions (their source, closures and the globals they
read); the example inputs' shapes, dtypes and devices; the decomposition;
torch's and Python's versions; and gradcheck's version and the source of
this frontend.  A model whose source cannot be read (a class made in a
REPL or by ``type(...)``) is captured without the cache, with a debug note.

An entry is never trusted on its key alone: ``model.Program`` checks a
loaded graph against the module's own forward before using it, and the
lowering check and the float64 graph-against-module check run on it as on
a fresh capture; an entry that fails to load or fails a check is deleted
and the module captured afresh.  Writes go to a temporary file renamed into
place, so a concurrent run reads a whole entry or none.  The folder keeps
at most ``MAX_BYTES``; the least recently used entries go first.  Delete
the folder to clear it (``gradcheck.cache``: ``<cache_dir>/torch-export``).
"""

from __future__ import annotations

import glob
import hashlib
import inspect
import json
import logging
import os
import re
import sys
import tempfile
import types
import warnings

import numpy as np
import torch

from gradcheck.frontends.torch import graph_file

log = logging.getLogger("gradcheck.capture_cache")

FORMAT = 2  # the layout of an entry; a change makes every older entry a miss
MAX_BYTES = 512 * 2**20  # the folder's bound: least recently used entries are deleted past it
SUFFIX = ".graph.pt"
_FORMER = (".pt2",)  # what entries of earlier formats end with: never found again, so deleted by ``_bound``
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))
_warned: set[str] = set()


class CaptureCacheWarning(UserWarning):
    """The capture cache's folder cannot be used; modules are captured without it."""


class Uncacheable(Exception):
    """What the key needs cannot be read (the source of a class defined in a REPL)."""


# ---------------------------------------------------------------- the key
def key(wrapper, example_inputs: tuple, training: bool, decompose: str, references: dict) -> str | None:
    """The entry's name for this capture, or None (with a debug note) when the model cannot be keyed."""
    try:
        parts = {
            "format": [FORMAT, graph_file.FORMAT],
            "torch": torch.__version__,
            "python": list(sys.version_info[:3]),
            "gradcheck": _gradcheck_version(),
            "frontend": _frontend_hash(),
            "training": bool(training),
            "decompose": decompose,
            "default dtype": str(torch.get_default_dtype()),
            "inputs": [_tensor_spec(x) for x in example_inputs],
            "forward": _function(wrapper._forward) if wrapper._forward is not None else None,
            "references": {op: _function(fn) for op, fn in sorted((references or {}).items())},
            "modules": _modules(wrapper.module),
        }
    except Uncacheable as exc:
        log.debug("from_torch captures %s without the capture cache: %s", type(wrapper.module).__name__, exc)
        return None
    except Exception as exc:  # noqa: BLE001 - a value the key cannot describe (a sparse tensor): no cache, no failure
        log.debug("from_torch captures %s without the capture cache: its key could not be made (%s: %s)",
                  type(wrapper.module).__name__, type(exc).__name__, exc)
        return None
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _gradcheck_version() -> str:
    # From the installed distribution, as the run's environment records it (runner.environment): importing the
    # package here would close an import circle (gradcheck -> frontends.torch -> model -> this module).
    import importlib.metadata

    try:
        return importlib.metadata.version("gradcheck")
    except importlib.metadata.PackageNotFoundError:
        return ""


_frontend: str | None = None


def _frontend_hash() -> str:
    """This frontend's source: a change to how gradcheck captures makes every entry a miss."""
    global _frontend
    if _frontend is None:
        h = hashlib.sha256()
        for path in sorted(glob.glob(os.path.join(_OWN_DIR, "*.py"))):
            with open(path, "rb") as f:
                h.update(os.path.basename(path).encode() + b"\0" + f.read())
        _frontend = h.hexdigest()
    return _frontend


def _tensor_spec(x) -> list:
    return [list(x.shape), str(x.dtype), str(x.device)]


def _modules(root) -> list:
    """Every submodule: its path, class (by source), training flag, parameters, buffers and other attributes."""
    own = {id(t): f"param {n}" for n, t in root.named_parameters(remove_duplicate=False)}
    own.update({id(t): f"buffer {n}" for n, t in root.named_buffers(remove_duplicate=False)})
    out = []
    for path, m in root.named_modules(remove_duplicate=False):
        attrs = {}
        for name, value in sorted(vars(m).items()):
            if name in ("_parameters", "_buffers", "_modules"):
                continue
            attrs[name] = _describe(value, own)
        out.append({
            "path": path,
            "class": _class(type(m)),
            "training": m.training,
            "parameters": [[n, _tensor_spec(p), p.requires_grad] if p is not None else [n, None]
                           for n, p in m._parameters.items()],
            "buffers": [[n, _tensor_spec(b), n in m._non_persistent_buffers_set] if b is not None else [n, None]
                        for n, b in m._buffers.items()],
            "children": [[n, type(c).__qualname__ if c is not None else None] for n, c in m._modules.items()],
            "attributes": attrs,
        })
    return out


_classes: dict = {}


def _class(cls) -> list:
    """A class by its name and, for each class of its MRO torch does not define, its source and its file's, and
    what its methods close over.  A class made by a function (``def make(act): class Block(nn.Module): ...``) has
    one source for every class it makes, and only the closures tell them apart: without them, a Block made with
    ``torch.cos`` was handed the graph of one made with ``torch.acos``, and the load check, comparing outputs, cannot
    see the difference on an empty input.  Kept per class: a class's closures are fixed when it is made."""
    if cls not in _classes:
        parts = [f"{cls.__module__}.{cls.__qualname__}"]
        for c in cls.__mro__:
            if c is object or _torch_defined(c):
                continue
            parts.append(_source(c, f"class {c.__qualname__}"))
            parts.extend(_closures(c))
        _classes[cls] = parts
    return _classes[cls]


def _closures(cls) -> list:
    """What the functions defined in ``cls``'s body (methods, static and class methods, properties) close over."""
    out = []
    for name, member in sorted(vars(cls).items()):
        for fn in (getattr(member, "__func__", member), getattr(member, "fget", None)):
            cells = getattr(fn, "__closure__", None) or ()
            described = [_cell(cell) for cell in cells if not _is_class_cell(cell, cls)]
            if described:
                out.append([name, described])
    return out


def _is_class_cell(cell, cls) -> bool:
    """The ``__class__`` cell that ``super()`` needs: the class itself, which the key names already."""
    try:
        return cell.cell_contents is cls
    except ValueError:  # an empty cell
        return False


def _cell(cell):
    try:
        return _describe(cell.cell_contents, {}, depth=1)
    except ValueError:  # an empty cell
        return None


def _torch_defined(obj) -> bool:
    module = getattr(obj, "__module__", "") or ""
    return module == "torch" or module.startswith(("torch.", "builtins"))


def _source(obj, what: str) -> str:
    """The hash of ``obj``'s source and of the whole file it is in (the helpers it calls there)."""
    try:
        source = inspect.getsource(obj)
        path = inspect.getsourcefile(obj)
    except (OSError, TypeError) as exc:
        raise Uncacheable(f"the source of {what} cannot be read ({exc})") from None
    h = hashlib.sha256(source.encode())
    if path and os.path.isfile(path):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _function(fn) -> list:
    """A function by its source, the values it closes over and the globals it reads."""
    if _torch_defined(fn) or isinstance(fn, types.BuiltinFunctionType):
        return [getattr(fn, "__module__", ""), getattr(fn, "__qualname__", repr(fn))]
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: its class
        return _class(type(fn)) + [_describe(vars(fn), {})] if hasattr(fn, "__dict__") else _class(type(fn))
    if fn in _describing:  # a function that reads itself (a recursive helper): named, not described again
        return ["recursive", getattr(fn, "__qualname__", repr(fn))]
    _describing.add(fn)
    try:
        out = [_source(fn, f"function {getattr(fn, '__qualname__', fn)}")]
        out.extend(_cell(cell) for cell in getattr(fn, "__closure__", None) or ())
        globals_ = getattr(fn, "__globals__", {})
        for name in sorted(set(_names(code))):
            if name in globals_ and not isinstance(globals_[name], types.ModuleType):
                out.append([name, _describe(globals_[name], {}, depth=1)])
        return out
    finally:
        _describing.discard(fn)


_describing: set = set()  # the functions being described: a recursive one is not followed into itself


def _names(code) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _names(const)
    return names


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _describe(value, own: dict, depth: int = 0):
    """A value as the key holds it: plain values as they are, tensors by spec (and content, unless the module
    holds them as a parameter or buffer), functions by source, other objects by their attributes."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (torch.dtype, torch.device, torch.Size, bytes)):
        return str(value)
    if isinstance(value, torch.Tensor):
        if id(value) in own:
            return own[id(value)]
        data = value.detach().cpu().contiguous().reshape(-1)  # 1-d: a 0-d tensor has no byte view
        digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()
        return ["tensor", _tensor_spec(value), digest]
    if isinstance(value, np.ndarray):
        return ["array", list(value.shape), str(value.dtype), hashlib.sha256(value.tobytes()).hexdigest()]
    if depth > 4:
        return type(value).__qualname__
    if isinstance(value, (list, tuple)):
        return [_describe(v, own, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(str(_describe(v, own, depth + 1)) for v in value)
    if isinstance(value, dict):
        return [[str(k), _describe(v, own, depth + 1)] for k, v in value.items()]
    if isinstance(value, torch.nn.Module):
        return ["module", type(value).__qualname__]  # a submodule is keyed where the tree has it
    if isinstance(value, (types.FunctionType, types.MethodType)):
        return _function(getattr(value, "__func__", value))
    if isinstance(value, type):
        return _class(value)
    if callable(value) and (_torch_defined(value) or isinstance(value, types.BuiltinFunctionType)):
        return [getattr(value, "__module__", ""), getattr(value, "__qualname__", repr(value))]
    if hasattr(value, "__dict__") and not isinstance(value, types.ModuleType):
        return [type(value).__qualname__, _describe(vars(value), own, depth + 1)]
    return [type(value).__qualname__, _ADDRESS.sub("", repr(value))]


# ---------------------------------------------------------------- the folder
def folder() -> str | None:
    """The capture cache's folder, made if need be; None when the cache is off or cannot be written."""
    from gradcheck import cache

    choice = cache.capture_folder()
    if choice.folder is None:
        return None
    try:
        os.makedirs(choice.folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=choice.folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        if choice.folder not in _warned:
            _warned.add(choice.folder)
            said = "the default folder" if choice.source == "default" else choice.source
            warnings.warn(CaptureCacheWarning(
                f"from_torch's capture cache: {said} {choice.folder} cannot be written ({exc.strerror or exc}); "
                f"modules are captured without it. Give a writable folder (--cache-dir DIR, cache_dir in "
                f"[tool.gradcheck] or {cache.CACHE_DIR_ENV}=DIR), or turn the caches off (--no-cache or "
                f"{cache.NO_CACHE_ENV}=1)"), stacklevel=4)
        return None
    return choice.folder


def path_of(name: str, where: str) -> str:
    return os.path.join(where, name + SUFFIX)


def load(name: str, where: str):
    """``(program, held)`` of the entry (``graph_file.Program``; the held float inputs by position), or None if
    there is none or it cannot be read (then deleted)."""
    path = path_of(name, where)
    if not os.path.exists(path):
        return None
    try:
        payload = torch.load(path, weights_only=True)
        program = graph_file.read(payload["program"])
        held = {int(k): v for k, v in payload["held"].items()}
    except Exception as exc:  # noqa: BLE001 - a broken entry of any kind is recaptured, never used
        discard(name, where, f"it cannot be read ({type(exc).__name__}: {str(exc)[:200]})")
        return None
    try:
        os.utime(path)  # its time of last use, for the bound on the folder's size
    except OSError:
        pass
    return program, held


def store(name: str, where: str, ep, held: dict) -> None:
    """Write the entry atomically (a temporary file renamed into place); a program the format does not carry
    (``graph_file.Unwritable``) or a failed write is only noted at debug level: the module is captured afresh."""
    try:
        payload = {"program": graph_file.write(ep), "held": {str(k): v for k, v in held.items()}}
    except graph_file.Unwritable as exc:
        log.debug("the capture cache does not keep %s: %s", name, exc)
        return
    path = path_of(name, where)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp" + SUFFIX, dir=where)
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001 - a program that cannot be written is simply not cached
        log.debug("the capture cache could not store %s: %s: %s", name, type(exc).__name__, exc)
        _unlink(tmp)
        return
    _bound(where)


def discard(name: str, where: str, why: str) -> None:
    log.debug("the capture cache's entry %s is discarded: %s", name, why)
    _unlink(path_of(name, where))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _bound(where: str, limit: int = MAX_BYTES) -> None:
    """Delete the least recently used entries while the folder holds more than ``limit`` bytes, and what a killed
    process left half-written (a temporary file an hour old; a write in progress is seconds old)."""
    import time

    for path in [p for suffix in _FORMER for p in glob.glob(os.path.join(where, "*" + suffix))]:
        _unlink(path)
    for path in glob.glob(os.path.join(where, ".*.tmp" + SUFFIX)):
        try:
            if os.stat(path).st_mtime < time.time() - 3600:
                _unlink(path)
        except OSError:
            pass
    entries = []
    for path in glob.glob(os.path.join(where, "*" + SUFFIX)):
        try:
            st = os.stat(path)
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        _unlink(path)
        total -= size
