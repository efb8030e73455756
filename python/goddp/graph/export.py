"""Export of a Dynamo-captured FX graph to the planner's flat arrays.

The arrays are exactly the fields of ``goddp_graph`` in csrc/goddp.h (codes
from goddp.native.extension, their one owner). Only facts about the graph are
gathered here (which node refers to which parameter, and how, and which
modules each node runs inside); every decision about where to cut, and
which modules are repeated blocks, is the planner's.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import fx, nn

from goddp.graph.checkpoints import body_of
from goddp.graph.cost import graph_costs
from goddp.graph.nodes import is_compute, resolve_attr
from goddp.native import extension as _native

OP_CODES = {
    "placeholder": _native.OP_PLACEHOLDER,
    "get_attr": _native.OP_GET_ATTR,
    "call_module": _native.OP_CALL_MODULE,
    "call_function": _native.OP_CALL_FUNCTION,
    "call_method": _native.OP_CALL_METHOD,
    "output": _native.OP_OUTPUT,
}

def parameter_names(module: nn.Module) -> dict[int, str]:
    """id(parameter) -> fully qualified name in module. A shared parameter
    keeps its first name, as named_parameters() does."""
    names: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), name)
    return names


@dataclass
class ExportedGraph:
    """A graph in the planner's array form, plus what is needed to map the
    plan back onto the FX nodes."""

    nodes: list[fx.Node]
    node_index: dict[fx.Node, int]
    params: list[torch.Tensor]  # the real parameters where Dynamo kept them
    param_names: list[str]
    arrays: dict[str, Any]  # goddp_graph fields, ready for _native.plan_graph


_SOURCE_PART = re.compile(
    r"\._modules\['([^']*)'\]|\._parameters\['([^']*)'\]|\.([A-Za-z_]\w*)|\[(\d+)\]"
)


def name_from_dynamo_source(source_name: str) -> str | None:
    """Turns a Dynamo source such as ``L['self']._modules['fc1']._parameters['weight']``
    into ``fc1.weight`` (relative to the frame's first local). Returns None when
    the source does not have that shape."""
    head = re.match(r"^(?:L|G)\['[^']*'\]", source_name)
    if head is None:
        return None
    rest = source_name[head.end():]
    parts: list[str] = []
    pos = 0
    for match in _SOURCE_PART.finditer(rest):
        if match.start() != pos:
            return None
        pos = match.end()
        part = next(g for g in match.groups() if g is not None)
        if part in ("_modules", "_parameters"):
            continue
        parts.append(part)
    if pos != len(rest) or not parts:
        return None
    return ".".join(parts)


def placeholder_parameter(node: fx.Node) -> torch.Tensor | None:
    """The parameter a Dynamo placeholder stands for, or None.

    Returns the real nn.Parameter when Dynamo's GraphArg still holds it, so
    that identity matches the DDP module's parameters; else the fake
    parameter from meta["example_value"] (still unique per parameter).
    """
    example = node.meta.get("example_value")
    if example is None or not isinstance(example, nn.Parameter):
        return None
    grapharg = node.meta.get("grapharg")
    if grapharg is not None:
        try:
            real = grapharg.example
        except AssertionError:  # a dead weak reference (GraphArg.example asserts): fall back to the fake
            real = None
        if isinstance(real, torch.Tensor):
            return real
    return example


def _placeholder_source_name(node: fx.Node) -> str | None:
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None) if grapharg is not None else None
    if source is None:
        source = getattr(node, "_dynamo_source", None)
    if source is None:
        return None
    try:
        return source.name if isinstance(source.name, str) else source.name()
    except NotImplementedError:  # a Source kind without a name: named from the node instead
        return None


def _storage_bytes(param: torch.Tensor, fallback: int) -> int:
    try:
        return int(param.untyped_storage().nbytes())
    except RuntimeError:  # tensors without storage (some subclasses; NotImplementedError is one)
        return fallback


def _type_key(kind: Any) -> str:
    if isinstance(kind, type):
        return f"{kind.__module__}.{kind.__qualname__}"
    return str(kind)


def module_stack(node: fx.Node) -> list[tuple[str, str]]:
    """(path, type) of each module on node's nn_module_stack, outermost
    first; entries of another shape are skipped."""
    entries = []
    for value in (node.meta.get("nn_module_stack") or {}).values():
        try:
            path, kind = value[0], value[1]
        except (TypeError, IndexError):
            continue
        entries.append((str(path), _type_key(kind)))
    return entries


class _CodeTable:
    """Small ints for dtypes/devices in order of first appearance, so every
    rank assigns the same codes for the same graph."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}

    def code(self, key: Any) -> int:
        text = str(key)
        if text not in self._codes:
            self._codes[text] = len(self._codes)
        return self._codes[text]


class _Exporter:
    """One export: walks the nodes once, collecting the node arrays and the
    parameter table; each step below fills one part of goddp_graph."""

    def __init__(
        self,
        gm: fx.GraphModule,
        param_name_of: Callable[[torch.Tensor], str | None] | None,
        ignored_names: Iterable[str],
        placeholder_params: Mapping[fx.Node, tuple[torch.Tensor, str]] | None = None,
    ) -> None:
        self.gm = gm
        self.given_placeholder_params = placeholder_params
        self.nodes = list(gm.graph.nodes)
        self.node_index = {node: i for i, node in enumerate(self.nodes)}
        self.param_name_of = param_name_of
        self.ignored = set(ignored_names)
        self.flat_to_fqn = gm.meta.get("dynamo_flat_name_to_original_fqn", {}) if hasattr(gm, "meta") else {}
        # The parameter table, in order of first reference.
        self.params: list[torch.Tensor] = []
        self.param_names: list[str] = []
        self.param_slot: dict[int, int] = {}  # id(parameter) -> index in params
        self.placeholder_param: dict[fx.Node, int] = {}
        self.module_ids: dict[int, int] = {}
        # Per node, in goddp_graph's CSR layout.
        self.node_ops = array("i")
        self.node_module_ids = array("i")
        self.node_param_offsets = array("q", [0])
        self.node_params = array("i")
        self.node_param_refs = array("B")
        self.node_user_offsets = array("q", [0])
        self.node_users = array("i")

    def run(self) -> ExportedGraph:
        self.find_placeholder_params()
        for node in self.nodes:
            self.add_node(node)
        flops, nbytes = graph_costs(self.gm, self.nodes)
        arrays = {"num_nodes": len(self.nodes), **self.node_arrays(), **self.param_arrays(), **self.stack_arrays(),
                  "node_flops": array("q", flops), "node_bytes": array("q", nbytes)}
        return ExportedGraph(self.nodes, self.node_index, self.params, self.param_names, arrays)

    # -- the parameter table

    def param_index(self, param: torch.Tensor, fallback_name: str) -> int:
        slot = self.param_slot.get(id(param))
        if slot is None:
            slot = len(self.params)
            self.param_slot[id(param)] = slot
            self.params.append(param)
            name = self.param_name_of(param) if self.param_name_of is not None else None
            self.param_names.append(name or fallback_name)
        return slot

    def find_placeholder_params(self) -> None:
        """Parameters held by placeholders (Dynamo with
        inline_inbuilt_nn_modules) enter the table first, in graph order."""
        given = self.given_placeholder_params
        for node in self.nodes:
            if node.op != "placeholder":
                continue
            if given is not None:
                if node in given:
                    param, fallback = given[node]
                    self.placeholder_param[node] = self.param_index(param, fallback)
                continue
            param = placeholder_parameter(node)
            if param is None:
                continue
            source_name = _placeholder_source_name(node)
            fallback = (name_from_dynamo_source(source_name) if source_name else None) or str(node.target)
            self.placeholder_param[node] = self.param_index(param, fallback)

    def module_id(self, module: nn.Module) -> int:
        return self.module_ids.setdefault(id(module), len(self.module_ids))

    # -- references from one node to parameters

    def add_ref(self, slot: int, kind: int) -> None:
        self.node_params.append(slot)
        self.node_param_refs.append(kind)

    def add_module_refs(self, module: nn.Module, prefix: str) -> None:
        for name, param in module.named_parameters():
            fqn = f"{prefix}.{name}"
            self.add_ref(self.param_index(param, self.flat_to_fqn.get(fqn, fqn)), _native.REF_MODULE)

    def add_nested_refs(self, value: Any) -> None:
        """Parameters inside containers or keyword arguments: REF_OTHER."""
        if isinstance(value, fx.Node):
            slot = self.placeholder_param.get(value)
            if slot is not None:
                self.add_ref(slot, _native.REF_OTHER)
        elif isinstance(value, (tuple, list)):
            for item in value:
                self.add_nested_refs(item)
        elif isinstance(value, dict):
            for item in value.values():
                self.add_nested_refs(item)
        elif isinstance(value, slice):
            self.add_nested_refs((value.start, value.stop, value.step))

    def add_arg_refs(self, node: fx.Node, positional_kind: int) -> None:
        if not any(inp in self.placeholder_param for inp in node.all_input_nodes):
            return
        for arg in node.args:
            if isinstance(arg, fx.Node):
                slot = self.placeholder_param.get(arg)
                if slot is not None:
                    self.add_ref(slot, positional_kind)
            else:
                self.add_nested_refs(arg)
        for value in node.kwargs.values():
            self.add_nested_refs(value)

    # -- one node per op kind; each returns the node's module id (-1: none)

    def call_function_refs(self, node: fx.Node) -> int:
        self.add_arg_refs(node, _native.REF_ARG)
        return -1

    def call_method_refs(self, node: fx.Node) -> int:
        receiver = node.args[0] if node.args else None
        if not (isinstance(receiver, fx.Node) and isinstance(receiver.target, str)):
            # torch's DDPOptimizer counts a method's parameter arguments
            # only when the receiver's target is a name (placeholder,
            # get_attr, call_module, call_method); e.g. not for h.mul(w)
            # where h comes from a call_function. Still a use (ddp mode).
            self.add_arg_refs(node, _native.REF_OTHER)
            return -1
        mod_id = -1
        try:
            module = self.gm.get_submodule(receiver.target)
        except AttributeError:
            module = None
        if module is not None:
            mod_id = self.module_id(module)
            self.add_module_refs(module, receiver.target)
        self.add_arg_refs(node, _native.REF_ARG)
        return mod_id

    def call_module_refs(self, node: fx.Node) -> int:
        module = self.gm.get_submodule(node.target)
        mod_id = self.module_id(module)
        self.add_module_refs(module, str(node.target))
        # A parameter handed to a module call counts as a use, not as an arg.
        self.add_arg_refs(node, _native.REF_OTHER)
        return mod_id

    def get_attr_refs(self, node: fx.Node) -> int:
        target = str(node.target)
        try:
            value = resolve_attr(self.gm, target)
        except AttributeError:
            value = None
        if isinstance(value, nn.Parameter):
            self.add_ref(self.param_index(value, self.flat_to_fqn.get(target, target)), _native.REF_ATTR)
        return -1

    def add_node(self, node: fx.Node) -> None:
        refs = self._REFS.get(node.op)
        self.node_ops.append(OP_CODES[node.op])
        self.node_module_ids.append(refs(self, node) if refs is not None else -1)
        self.node_param_offsets.append(len(self.node_params))
        if node.users:
            self.node_users.extend(sorted(self.node_index[user] for user in node.users))
        self.node_user_offsets.append(len(self.node_users))

    _REFS = {
        "call_function": call_function_refs,
        "call_method": call_method_refs,
        "call_module": call_module_refs,
        "get_attr": get_attr_refs,
    }

    # -- the finished arrays

    def node_arrays(self) -> dict[str, Any]:
        return {
            "node_ops": self.node_ops,
            "node_module_ids": self.node_module_ids,
            "node_param_offsets": self.node_param_offsets,
            "node_params": self.node_params,
            "node_param_refs": self.node_param_refs,
            "node_user_offsets": self.node_user_offsets,
            "node_users": self.node_users,
        }

    def stack_arrays(self) -> dict[str, Any]:
        """Each node's own module stack (Dynamo's nn_module_stack), outermost
        first, as goddp_graph's interned table, and the body facts of its
        higher-order-op calls: the facts the planner's block rule reads
        (planner/modstack.go, Note [Block rule]; planner/bodies.go, Note
        [Body stacks])."""
        index: dict[str, int] = {}
        string_offsets, strings = array("q", [0]), bytearray()

        def intern(text: str) -> int:
            slot = index.get(text)
            if slot is None:
                slot = index[text] = len(index)
                strings.extend(text.encode("utf-8"))
                string_offsets.append(len(strings))
            return slot

        def table(stacks: Iterable[list[tuple[str, str]]]) -> tuple[array, array, array]:
            offsets, paths, types = array("q", [0]), array("i"), array("i")
            for stack in stacks:
                for path, kind in stack:
                    paths.append(intern(path))
                    types.append(intern(kind))
                offsets.append(len(paths))
            return offsets, paths, types

        stack_offsets, paths, types = table(module_stack(node) for node in self.nodes)
        out: dict[str, Any] = {"node_stack_offsets": stack_offsets, "node_stack_paths": paths, "node_stack_types": types}
        calls = self.hop_calls()
        if calls:
            belongs, body_offsets, bodies = array("i", [-1] * len(self.nodes)), array("q", [0]), []
            for i, node in enumerate(self.nodes):
                for member in calls.get(node, ()):
                    belongs[self.node_index[member]] = i
                bodies.extend(_flattened_body(self.gm, node) if node in calls else ())
                body_offsets.append(len(bodies))
            body_stacks = table(module_stack(inner) for inner in bodies)
            out.update(zip(("body_stack_offsets", "body_stack_paths", "body_stack_types"), body_stacks))
            out.update(node_hop_calls=belongs, node_body_offsets=body_offsets)
        return {"module_string_offsets": string_offsets, "module_strings": bytes(strings), **out}

    def hop_calls(self) -> dict[fx.Node, list[fx.Node]]:
        """Per higher-order-op call (a node with a body), in graph order, the
        outer nodes that belong to it: its body's get_attr, itself and the
        getitems of its results (Note [Body stacks]); a later call's claim
        wins."""
        calls: dict[fx.Node, list[fx.Node]] = {}
        for node in self.nodes:
            if body_of(self.gm, node) is not None:
                items = [u for u in node.users if u.op == "call_function" and u.target is operator.getitem]
                calls[node] = [node.args[0], node, *items]
        return calls

    def param_flags(self, param: torch.Tensor, name: str) -> int:
        flags = _native.PARAM_REQUIRES_GRAD if param.requires_grad else 0
        if getattr(param, "_ddp_ignored", False) or name in self.ignored:
            flags |= _native.PARAM_DDP_IGNORED
        return flags

    def param_arrays(self) -> dict[str, Any]:
        dtypes = _CodeTable()
        devices = _CodeTable()
        param_bytes = array("q")
        param_storage_bytes = array("q")
        param_dtypes = array("i")
        param_devices = array("i")
        param_flags = array("I")
        param_name_offsets = array("q", [0])
        encoded_names = bytearray()
        for param, name in zip(self.params, self.param_names):
            nbytes = param.numel() * param.element_size()
            param_bytes.append(nbytes)
            param_storage_bytes.append(_storage_bytes(param, nbytes))
            param_dtypes.append(dtypes.code(param.dtype))
            param_devices.append(devices.code(param.device))
            param_flags.append(self.param_flags(param, name))
            encoded_names += name.encode("utf-8")
            param_name_offsets.append(len(encoded_names))
        return {
            "num_params": len(self.params),
            "param_bytes": param_bytes,
            "param_storage_bytes": param_storage_bytes,
            "param_dtypes": param_dtypes,
            "param_devices": param_devices,
            "param_flags": param_flags,
            "param_name_offsets": param_name_offsets,
            "param_names": bytes(encoded_names),
        }


def _flattened_body(gm: fx.GraphModule, node: fx.Node) -> Iterable[fx.Node]:
    """The compute nodes a higher-order-op call's body runs, a nested call's
    body in its place, recursively, in order (Note [Body stacks])."""
    body = body_of(gm, node)
    for inner in body.graph.nodes:
        if not is_compute(inner) or inner.op == "get_attr":
            continue
        if body_of(body, inner) is None:
            yield inner
        else:
            yield from _flattened_body(body, inner)


def export_graph(
    gm: fx.GraphModule,
    *,
    param_name_of: Callable[[torch.Tensor], str | None] | None = None,
    ignored_names: Iterable[str] = (),
    placeholder_params: Mapping[fx.Node, tuple[torch.Tensor, str]] | None = None,
) -> ExportedGraph:
    """Flattens gm into the planner's arrays.

    param_name_of maps a real parameter to its fully qualified name (relative
    to the DDP-wrapped module); where it returns None the name comes from
    Dynamo's source, then from the graph. ignored_names are FQNs DDP ignores
    (besides parameters marked ``_ddp_ignored``). Each node's module stack
    goes along, from which the planner finds repeated blocks when asked to
    cut at them. placeholder_params, given, says which placeholders stand
    for which parameter (and its fallback name) instead of Dynamo's
    metadata: a checkpoint body's placeholders are the parameters its call
    is handed (body_parameters).
    """
    return _Exporter(gm, param_name_of, ignored_names, placeholder_params).run()


def body_parameters(gm: fx.GraphModule, call: fx.Node, body: fx.GraphModule) -> dict[fx.Node, tuple[torch.Tensor, str]]:
    """Per placeholder of a higher-order-op call's body, the parameter it
    stands for and its fallback name: body placeholder i is the call's
    argument i + 1, a placeholder of gm holding a parameter (or a get_attr
    of one). Placeholders that stand for no parameter are left out."""
    out: dict[fx.Node, tuple[torch.Tensor, str]] = {}
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    for inner, outer in zip(placeholders, call.args[1:]):
        if not isinstance(outer, fx.Node):
            continue
        if outer.op == "placeholder":
            param = placeholder_parameter(outer)
            if param is None:
                continue
            source_name = _placeholder_source_name(outer)
            out[inner] = (param, (name_from_dynamo_source(source_name) if source_name else None) or str(outer.target))
        elif outer.op == "get_attr":
            try:
                value = resolve_attr(gm, str(outer.target))
            except AttributeError:
                continue
            if isinstance(value, nn.Parameter):
                flat = gm.meta.get("dynamo_flat_name_to_original_fqn", {}) if hasattr(gm, "meta") else {}
                out[inner] = (value, flat.get(str(outer.target), str(outer.target)))
    return out


def with_ddp_positions(exported: ExportedGraph, names: Sequence[str]) -> ExportedGraph:
    """exported with goddp_graph.param_ddp_positions set: each parameter's
    index in ``names`` (DDP's parameter list, goddp.ddp.declaration), -1
    where DDP does not reduce it. Matched by name: the graph may hold
    Dynamo's stand-ins rather than the parameters themselves."""
    position = {name: k for k, name in enumerate(names)}
    positions = array("i", (position.get(name, -1) for name in exported.param_names))
    return dataclasses.replace(exported, arrays={**exported.arrays, "param_ddp_positions": positions})
