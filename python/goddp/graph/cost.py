"""What each node of a captured graph costs to run, estimated from Dynamo's
shapes and dtypes (Note [Edge costs] in planner/edges.go says how the
planner weighs these numbers).

Per node, two numbers, both per forward call:

- ``flops``: the floating-point work of the ops that run as a library
  kernel whether the piece is compiled or not (matrix products,
  convolutions, attention); the inner compiler calls the same kernels, so
  running the piece eagerly costs nothing here;
- ``bytes``: the memory that every other op reads and writes when it runs
  alone, as it does eagerly. The inner compiler fuses these ops, so this is
  what compiling the piece can save, at most.

Only metadata is read (meta["example_value"], Dynamo's fake tensors): no
node runs. A node without a tensor value, a view and a placeholder cost
nothing; a higher-order-op call (an activation checkpoint) costs what its
body does.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.utils import flop_counter

from goddp.graph.checkpoints import body_of
from goddp.graph.nodes import example_value, is_compute

_LINEAR = {F.linear, torch._C._nn.linear}
# The product's contracted dimension is the first operand's last (x @ w).
_MATMUL = {torch.matmul, torch.mm, torch.bmm, operator.matmul, "matmul", "mm", "bmm", "__matmul__"}
_ADDMM = {torch.addmm, torch.baddbmm, "addmm", "baddbmm"}
_CONV = {torch.conv1d, torch.conv2d, torch.conv3d, F.conv1d, F.conv2d, F.conv3d}
_CONV_T = {torch.conv_transpose1d, torch.conv_transpose2d, torch.conv_transpose3d,
           F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d}
_SDPA = {F.scaled_dot_product_attention}
# Gathers read the rows they return, not their whole table.
_GATHER = {F.embedding, torch.embedding, torch.index_select, torch.gather, torch.take}


def _hint(value: Any) -> int:
    """A size as an int: a symbolic size by its hint, never a guard."""
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return int(hint) if hint is not None else 1
    return int(value)


def _shape(value: Any) -> list[int]:
    return [_hint(s) for s in value.shape]


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return math.prod(_shape(value)) * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 0


def _value(arg: Any) -> Any:
    return example_value(arg, None) if isinstance(arg, fx.Node) else arg


def _target(gm: fx.GraphModule, node: fx.Node) -> Any:
    """The function a node calls: call_method's name, call_module's
    functional twin (nn.Linear -> F.linear) or its module, else the target."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        for kind, function in ((nn.Linear, F.linear), (nn.Conv1d, F.conv1d), (nn.Conv2d, F.conv2d),
                               (nn.Conv3d, F.conv3d), (nn.Embedding, F.embedding)):
            if type(module) is kind:
                return function
        return module
    return node.target


def _kernel_flops(target: Any, node: fx.Node, gm: fx.GraphModule, out: Any) -> int | None:
    """The flops of a library-kernel op, None for any other op."""
    if not isinstance(out, torch.Tensor):
        return None
    args = [_value(a) for a in node.args]
    if node.op == "call_module":  # the module's own weight is its second operand
        args = [args[0] if args else None, getattr(gm.get_submodule(str(node.target)), "weight", None)]
    else:
        args += [_value(node.kwargs.get(k)) for k in ("weight",) if k in node.kwargs]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    try:
        if target in _LINEAR and len(tensors) >= 2:
            return 2 * math.prod(_shape(out)) * _shape(tensors[1])[-1]
        if target in _MATMUL and tensors and tensors[0].dim() >= 1:
            return 2 * math.prod(_shape(out)) * _shape(tensors[0])[-1]
        if target in _ADDMM and len(tensors) >= 3:
            return 2 * math.prod(_shape(out)) * _shape(tensors[1])[-1]
        if (target in _CONV or target in _CONV_T) and len(tensors) >= 2:
            return int(flop_counter.conv_flop_count(_shape(tensors[0]), _shape(tensors[1]), _shape(out),
                                                    transposed=target in _CONV_T))
        if target in _SDPA and len(tensors) >= 3:
            return int(flop_counter.sdpa_flop_count(*(_shape(t) for t in tensors[:3])))
    except (IndexError, TypeError, ValueError):  # an operand of an unexpected shape: no kernel estimate
        return None
    return None


def _memory_bytes(target: Any, node: fx.Node, out: Any) -> int:
    """What an op that the compiler can fuse reads and writes, run alone."""
    if isinstance(out, torch.Tensor) and out._is_view():
        return 0
    if target is operator.getitem and node.args and not isinstance(_value(node.args[0]), torch.Tensor):
        return 0  # an item of a tuple of results
    written = _nbytes(out)
    if target in _GATHER:
        index = next((_value(a) for a in node.args if isinstance(_value(a), torch.Tensor)
                      and not _value(a).is_floating_point()), None)
        return 2 * written + _nbytes(index)
    inputs = {id(v): v for v in (_value(a) for a in node.all_input_nodes) if isinstance(v, torch.Tensor)}
    return written + sum(_nbytes(v) for v in inputs.values())


def node_cost(gm: fx.GraphModule, node: fx.Node) -> tuple[int, int]:
    """(flops, bytes) of one node of gm (the module docstring)."""
    if not is_compute(node) or node.op == "get_attr":
        return 0, 0
    body = body_of(gm, node)
    if body is not None:
        costs = [node_cost(body, inner) for inner in body.graph.nodes]
        return sum(f for f, _ in costs), sum(b for _, b in costs)
    out = example_value(node, None)
    if out is None:
        return 0, 0
    target = _target(gm, node)
    flops = _kernel_flops(target, node, gm, out)
    if flops is not None:
        return flops, 0
    return 0, _memory_bytes(target, node, out)


def graph_costs(gm: fx.GraphModule, nodes: Iterable[fx.Node]) -> tuple[list[int], list[int]]:
    """Per node, in order, its flops and its bytes (goddp_graph.node_flops
    and node_bytes)."""
    flops, nbytes = [], []
    for node in nodes:
        f, b = node_cost(gm, node)
        flops.append(f)
        nbytes.append(b)
    return flops, nbytes
