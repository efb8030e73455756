"""FX helpers shared by the graph and backend suites: the graph Dynamo
captures for a model, a node's innermost module path, and an inner
compiler that counts the graphs it gets."""

from __future__ import annotations

import torch
from torch import fx, nn
from torch._dynamo.backends.registry import lookup_backend


def dynamo_graph(model: nn.Module, *inputs) -> fx.GraphModule:
    """The graph Dynamo captures for model(*inputs)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=keep)(*inputs)
    torch._dynamo.reset()
    assert len(graphs) == 1
    return graphs[0]


def module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[0][0]) if stack else ""


class CountingCompiler:
    """aot_eager, counting the graphs it compiles."""

    def __init__(self) -> None:
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)
