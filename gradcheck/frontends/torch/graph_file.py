"""A captured program written as gradcheck's own document: what ``capture.read_graph`` reads of it, and no more.

The capture cache could keep ``torch.export.save`` archives, but
``torch.export.load`` imports torch's serialiser, and through it most of
``torch._dynamo``: about 1.5 s of every warm ``from_torch`` build, more than
reading the graph itself, and an import the bare frameworks never make.  A
graph gradcheck runs needs much less than a whole ``ExportedProgram``:

- every node in order: its name, its op (``placeholder``, ``call_function``,
  ``output``), its target (an ATen or custom op by its name, or
  ``operator.getitem``), its arguments (references to earlier nodes, numbers,
  strings, dtypes, devices, layouts, memory formats, lists and tuples of them);
- of each node's metadata the three fields gradcheck reads: ``val`` (the
  shape and dtype of the value, rebuilt as a tensor on the ``meta`` device),
  ``nn_module_stack`` (the origin layer's names) and ``stack_trace`` (its
  source line);
- the graph signature (what each placeholder and output is) and the tensor
  constants the graph lifted.

A program with anything else (a higher-order op's subgraph, a symbolic shape,
an argument of another type) raises ``Unwritable``: it is captured afresh each
run rather than written half.  ``read`` rebuilds the nodes with the names they
had, so dropout masks (drawn in graph order, by node name) and origin names are
a fresh capture's; a document whose nodes come back under other names raises.
"""

from __future__ import annotations

import json
import math
import operator

import torch

FORMAT = 1  # this document's layout; capture_cache.FORMAT, in every key, changes with it


class Unwritable(ValueError):
    """The program holds something this format does not carry; it is not cached."""


class Program:
    """What ``capture.read_graph`` reads of an ExportedProgram, as ``read`` rebuilds it."""

    refused = ""

    def __init__(self, graph, input_specs: list, output_specs: list, constants: dict):
        from types import SimpleNamespace

        self.graph = graph
        self.graph_signature = SimpleNamespace(input_specs=input_specs, output_specs=output_specs)
        self.constants = constants


# ---------------------------------------------------------------- writing
def write(ep) -> dict:
    """The program as a document: ``{"format", "graph" (JSON text), "constants" (name -> tensor)}``."""
    nodes = []
    for node in ep.graph.nodes:
        if node.op not in ("placeholder", "call_function", "output"):
            raise Unwritable(f"node {node.name} is a {node.op} node (a subgraph or attribute)")
        nodes.append({
            "name": node.name,
            "op": node.op,
            "target": _target(node),
            "args": _value(node.args),
            "kwargs": {k: _value(v) for k, v in node.kwargs.items()},
            "val": _val(node.meta.get("val")),
            "stack": [[k, path, _kind(kind)] for k, (path, kind) in (node.meta.get("nn_module_stack") or {}).items()],
            "trace": node.meta.get("stack_trace"),
        })
    sig = ep.graph_signature
    doc = {
        "nodes": nodes,
        "inputs": [[s.kind.name, _argument(s.arg), s.target, s.persistent] for s in sig.input_specs],
        "outputs": [[s.kind.name, _argument(s.arg), s.target] for s in sig.output_specs],
    }
    constants = {}
    for name, value in ep.constants.items():
        if not isinstance(value, torch.Tensor):
            raise Unwritable(f"constant {name} is a {type(value).__name__}, not a tensor")
        constants[name] = value.detach().cpu().clone()
    return {"format": FORMAT, "graph": json.dumps(doc), "constants": constants}


def _target(node):
    if node.op != "call_function":
        return node.target
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return ["op", str(target)]
    if target is operator.getitem:
        return ["operator", "getitem"]
    raise Unwritable(f"node {node.name} calls {target!r}, neither an op overload nor getitem")


def _value(v):
    """An argument as JSON: lists stay lists; everything else that is not a plain scalar is tagged."""
    if isinstance(v, torch.fx.Node):
        return {"node": v.name}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, tuple):
        return {"tuple": [_value(x) for x in v]}
    if isinstance(v, list):
        return [_value(x) for x in v]
    for tag, kind in _TAGGED.items():
        if isinstance(v, kind):
            return {tag: str(v).replace("torch.", "")}
    raise Unwritable(f"an argument of type {type(v).__name__} ({v!r})")


_TAGGED = {"dtype": torch.dtype, "device": torch.device, "layout": torch.layout, "memory_format": torch.memory_format}


def _val(v):
    """A node's value as its shape and dtype (a tensor), a list of them (a multi-output op), or a plain scalar."""
    if isinstance(v, torch.Tensor):
        shape = []
        for d in v.shape:
            if not isinstance(d, int):
                raise Unwritable(f"a symbolic shape ({tuple(v.shape)})")
            shape.append(d)
        return {"tensor": shape, "dtype": str(v.dtype).replace("torch.", "")}
    if isinstance(v, (tuple, list)):
        return {"seq": [_val(x) for x in v], "tuple": isinstance(v, tuple)}
    if v is None or isinstance(v, (bool, int, float)):
        return _value(v)
    raise Unwritable(f"a node value of type {type(v).__name__}")


def _kind(kind) -> str:
    return kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"


def _argument(arg):
    from torch.export.graph_signature import ConstantArgument, TensorArgument

    if isinstance(arg, TensorArgument):
        return {"tensor": arg.name}
    if isinstance(arg, ConstantArgument):
        return {"constant": arg.name, "value": _value(arg.value)}
    raise Unwritable(f"a signature argument of type {type(arg).__name__}")


# ---------------------------------------------------------------- reading
def read(payload: dict) -> Program:
    """The program a document holds; raises (ValueError, KeyError, AttributeError ...) when it is not whole."""
    from torch.export.graph_signature import InputKind, InputSpec, OutputKind, OutputSpec

    if payload.get("format") != FORMAT:
        raise ValueError(f"a document of format {payload.get('format')!r}, not {FORMAT}")
    doc = json.loads(payload["graph"])
    graph = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    for spec in doc["nodes"]:
        args = _unvalue(spec["args"], env)
        kwargs = {k: _unvalue(v, env) for k, v in spec["kwargs"].items()}
        if spec["op"] == "output":
            node = graph.output(args[0])
        else:
            node = graph.create_node(spec["op"], _untarget(spec["target"]), args, kwargs, name=spec["name"])
        if node.name != spec["name"]:
            raise ValueError(f"node {spec['name']} came back as {node.name}")
        if spec["val"] is not None:
            node.meta["val"] = _unval(spec["val"])
        if spec["stack"]:
            node.meta["nn_module_stack"] = {k: (path, kind) for k, path, kind in spec["stack"]}
        if spec["trace"] is not None:
            node.meta["stack_trace"] = spec["trace"]
        env[node.name] = node
    inputs = [InputSpec(kind=InputKind[kind], arg=_unargument(arg), target=target, persistent=persistent)
              for kind, arg, target, persistent in doc["inputs"]]
    outputs = [OutputSpec(kind=OutputKind[kind], arg=_unargument(arg), target=target)
               for kind, arg, target in doc["outputs"]]
    return Program(graph, inputs, outputs, dict(payload["constants"]))


def _untarget(target):
    if not isinstance(target, list):
        return target  # a placeholder's own name
    kind, name = target
    if kind == "operator" and name == "getitem":
        return operator.getitem
    ns, op, overload = name.split(".")
    resolved = getattr(getattr(getattr(torch.ops, ns), op), overload)
    if str(resolved) != name:
        raise ValueError(f"op {name} resolves to {resolved}")
    return resolved


def _unvalue(v, env):
    if isinstance(v, list):
        return [_unvalue(x, env) for x in v]
    if not isinstance(v, dict):
        return v
    (tag, x), = v.items()
    if tag == "node":
        return env[x]
    if tag == "tuple":
        return tuple(_unvalue(y, env) for y in x)
    if tag == "float":
        return float(x)
    if tag in ("dtype", "layout", "memory_format"):
        return getattr(torch, x)
    if tag == "device":
        return torch.device(x)
    raise ValueError(f"an argument tagged {tag!r}")


def _unval(v):
    if isinstance(v, dict) and "tensor" in v:
        return torch.empty(v["tensor"], dtype=getattr(torch, v["dtype"]), device="meta")
    if isinstance(v, dict) and "seq" in v:
        items = [_unval(x) for x in v["seq"]]
        return tuple(items) if v["tuple"] else items
    return _unvalue(v, {})


def _unargument(arg):
    from torch.export.graph_signature import ConstantArgument, TensorArgument

    if "tensor" in arg:
        return TensorArgument(name=arg["tensor"])
    return ConstantArgument(name=arg["constant"], value=_unvalue(arg["value"], {}))
