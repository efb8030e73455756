"""Export of a Dynamo-captured FX graph to the planner's flat arrays.

The arrays are exactly the fields of ``goddp_graph`` in csrc/goddp.h (codes
from goddp._native, their one owner). Only facts about the graph are
gathered here (which node refers to which parameter, and how); every
decision about where to cut is the planner's.
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import fx, nn

from goddp import _native
from goddp._native import REF_ARG, REF_ATTR, REF_MODULE, REF_OTHER

OP_CODES = {
    "placeholder": _native.OP_PLACEHOLDER,
    "get_attr": _native.OP_GET_ATTR,
    "call_module": _native.OP_CALL_MODULE,
    "call_function": _native.OP_CALL_FUNCTION,
    "call_method": _native.OP_CALL_METHOD,
    "output": _native.OP_OUTPUT,
}

_NO_DEFAULT = object()


def example_value(node: fx.Node, default: Any = _NO_DEFAULT) -> Any:
    """Dynamo's fake value for a node (meta["example_value"], or "val").
    Raises KeyError when there is none, unless a default is given."""
    meta = node.meta
    if "example_value" in meta:
        return meta["example_value"]
    if "val" in meta:
        return meta["val"]
    if default is not _NO_DEFAULT:
        return default
    raise KeyError(f"node {node.name!r} has no example_value/val metadata")


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


def resolve_attr(root: Any, target: str) -> Any:
    """getattr along a dotted path (get_attr and call_module targets)."""
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


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
        except Exception:  # a dead weak reference: fall back to the fake
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
    except Exception:
        return None


def _storage_bytes(param: torch.Tensor, fallback: int) -> int:
    try:
        return int(param.untyped_storage().nbytes())
    except Exception:  # tensors without storage (some subclasses)
        return fallback


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


def export_graph(
    gm: fx.GraphModule,
    *,
    param_name_of: Callable[[torch.Tensor], str | None] | None = None,
    ignored_names: Iterable[str] = (),
) -> ExportedGraph:
    """Flattens gm into the planner's arrays.

    param_name_of maps a real parameter to its fully qualified name (relative
    to the DDP-wrapped module); where it returns None the name comes from
    Dynamo's source, then from the graph. ignored_names are FQNs DDP ignores
    (besides parameters marked ``_ddp_ignored``).
    """
    nodes = list(gm.graph.nodes)
    node_index = {node: i for i, node in enumerate(nodes)}
    ignored = set(ignored_names)
    flat_to_fqn = gm.meta.get("dynamo_flat_name_to_original_fqn", {}) if hasattr(gm, "meta") else {}

    params: list[torch.Tensor] = []
    param_names: list[str] = []
    param_slot: dict[int, int] = {}  # id(parameter) -> index in params

    def param_index(param: torch.Tensor, fallback_name: str) -> int:
        slot = param_slot.get(id(param))
        if slot is None:
            slot = len(params)
            param_slot[id(param)] = slot
            params.append(param)
            name = param_name_of(param) if param_name_of is not None else None
            param_names.append(name or fallback_name)
        return slot

    # Parameters held by placeholders (Dynamo with inline_inbuilt_nn_modules).
    placeholder_param: dict[fx.Node, int] = {}
    for node in nodes:
        if node.op != "placeholder":
            continue
        param = placeholder_parameter(node)
        if param is None:
            continue
        source_name = _placeholder_source_name(node)
        fallback = (name_from_dynamo_source(source_name) if source_name else None) or str(node.target)
        placeholder_param[node] = param_index(param, fallback)

    module_ids: dict[int, int] = {}
    node_ops = array("i")
    node_module_ids = array("i")
    node_param_offsets = array("q", [0])
    node_params = array("i")
    node_param_refs = array("B")
    node_user_offsets = array("q", [0])
    node_users = array("i")

    def add_module_refs(module: nn.Module, prefix: str) -> None:
        for name, param in module.named_parameters():
            node_params.append(param_index(param, flat_to_fqn.get(f"{prefix}.{name}", f"{prefix}.{name}")))
            node_param_refs.append(REF_MODULE)

    def add_nested_refs(value: Any) -> None:
        # Parameters inside containers or keyword arguments: REF_OTHER.
        if isinstance(value, fx.Node):
            slot = placeholder_param.get(value)
            if slot is not None:
                node_params.append(slot)
                node_param_refs.append(REF_OTHER)
        elif isinstance(value, (tuple, list)):
            for item in value:
                add_nested_refs(item)
        elif isinstance(value, dict):
            for item in value.values():
                add_nested_refs(item)
        elif isinstance(value, slice):
            add_nested_refs((value.start, value.stop, value.step))

    def add_arg_refs(node: fx.Node, positional_kind: int) -> None:
        if not any(inp in placeholder_param for inp in node.all_input_nodes):
            return
        for arg in node.args:
            if isinstance(arg, fx.Node):
                slot = placeholder_param.get(arg)
                if slot is not None:
                    node_params.append(slot)
                    node_param_refs.append(positional_kind)
            else:
                add_nested_refs(arg)
        for value in node.kwargs.values():
            add_nested_refs(value)

    def module_id(module: nn.Module) -> int:
        ident = module_ids.get(id(module))
        if ident is None:
            ident = len(module_ids)
            module_ids[id(module)] = ident
        return ident

    for node in nodes:
        op = node.op
        node_ops.append(OP_CODES[op])
        mod_id = -1
        if op == "call_function":
            add_arg_refs(node, REF_ARG)
        elif op == "call_method":
            receiver = node.args[0] if node.args else None
            if isinstance(receiver, fx.Node) and isinstance(receiver.target, str):
                try:
                    module = gm.get_submodule(receiver.target)
                except AttributeError:
                    module = None
                if module is not None:
                    mod_id = module_id(module)
                    add_module_refs(module, receiver.target)
                add_arg_refs(node, REF_ARG)
            else:
                # torch's DDPOptimizer counts a method's parameter arguments
                # only when the receiver's target is a name (placeholder,
                # get_attr, call_module, call_method); e.g. not for h.mul(w)
                # where h comes from a call_function. Still a use (ddp mode).
                add_arg_refs(node, REF_OTHER)
        elif op == "call_module":
            module = gm.get_submodule(node.target)
            mod_id = module_id(module)
            add_module_refs(module, str(node.target))
            # A parameter handed to a module call counts as a use, not as an arg.
            add_arg_refs(node, REF_OTHER)
        elif op == "get_attr":
            try:
                value = resolve_attr(gm, str(node.target))
            except AttributeError:
                value = None
            if isinstance(value, nn.Parameter):
                target = str(node.target)
                node_params.append(param_index(value, flat_to_fqn.get(target, target)))
                node_param_refs.append(REF_ATTR)
        node_module_ids.append(mod_id)
        node_param_offsets.append(len(node_params))
        if node.users:
            node_users.extend(sorted(node_index[user] for user in node.users))
        node_user_offsets.append(len(node_users))

    dtypes = _CodeTable()
    devices = _CodeTable()
    param_bytes = array("q")
    param_storage_bytes = array("q")
    param_dtypes = array("i")
    param_devices = array("i")
    param_flags = array("I")
    param_name_offsets = array("q", [0])
    encoded_names = bytearray()
    for param, name in zip(params, param_names):
        nbytes = param.numel() * param.element_size()
        param_bytes.append(nbytes)
        param_storage_bytes.append(_storage_bytes(param, nbytes))
        param_dtypes.append(dtypes.code(param.dtype))
        param_devices.append(devices.code(param.device))
        flags = _native.PARAM_REQUIRES_GRAD if param.requires_grad else 0
        if getattr(param, "_ddp_ignored", False) or name in ignored:
            flags |= _native.PARAM_DDP_IGNORED
        param_flags.append(flags)
        encoded_names += name.encode("utf-8")
        param_name_offsets.append(len(encoded_names))

    arrays = {
        "num_nodes": len(nodes),
        "node_ops": node_ops,
        "node_module_ids": node_module_ids,
        "node_param_offsets": node_param_offsets,
        "node_params": node_params,
        "node_param_refs": node_param_refs,
        "node_user_offsets": node_user_offsets,
        "node_users": node_users,
        "num_params": len(params),
        "param_bytes": param_bytes,
        "param_storage_bytes": param_storage_bytes,
        "param_dtypes": param_dtypes,
        "param_devices": param_devices,
        "param_flags": param_flags,
        "param_name_offsets": param_name_offsets,
        "param_names": bytes(encoded_names),
    }
    return ExportedGraph(nodes, node_index, params, param_names, arrays)
