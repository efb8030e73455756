"""Activation checkpoints in Dynamo graphs: seeing through their bodies,
comparing them, and splitting one that spans several blocks or buckets.

Note [Checkpoint bodies]
~~~~~~~~~~~~~~~~~~~~~~~~
Dynamo captures ``torch.utils.checkpoint.checkpoint(fn, *args, **settings)``
(non-reentrant or reentrant alike, and so ``checkpoint_wrapper``, HF's
``gradient_checkpointing_enable`` and torchtitan's per-layer mode) as three
kinds of outer node: a get_attr of the body, a GraphModule of its own
(``wrap_body_N``); one call of the higher-order op
``tag_activation_checkpoint(body, *inputs, **settings)``, whose inputs
include the parameters the body reads (lifted: they are placeholders of the
outer graph); and a getitem per result. The settings (use_reentrant,
preserve_rng_state, ...) are the call's kwargs; a selective policy
(context_fn) rides in ``body.meta["_checkpoint_context_fn"]``. The call has
no module stack of its own; the body's nodes have the full one. AOTAutograd
later inlines the body, tags its nodes for recomputation, and its
partitioner recomputes them in backward; every call of a compiled piece is
its own autograd node.

So, for goddp:
- Blocks: the planner's block rule (Note [Block rule]) sees each call's
  module stack and weight through its body, from the facts the export
  hands it (Note [Body stacks] in planner/bodies.go). A call inside one
  block lands in it; a call whose body spans several blocks in none,
  unless it is split first (below).
- Identity: two calls are the same code when their bodies have the same
  structure, names aside, recursively, with the same settings and the same
  policy (``graph_key``; a policy partial compares by function and bound
  arguments, since Dynamo makes a new partial object per call).
- Splitting: a checkpoint whose body holds several blocks (one around the
  whole stack) would be one atomic piece whose gradients are all ready at
  once, so nothing overlaps inside it. goddp rewrites it, before planning,
  into consecutive checkpoints, one per block run of its body (a region),
  each taking the values it reads from earlier regions as inputs. Each
  region is then recomputed in its own piece, and its buckets overlap like
  any other. The cost is what each region's inputs keep alive: one boundary
  activation per cut (README, "Activation checkpointing", has the figures).
  Forward values are unchanged; backward runs the same ops per region.
- Splitting at buckets: a checkpoint whose body holds fewer than two
  blocks (around an nn.Sequential of dissimilar layers, or one large
  block) but more than a bucket's parameters is atomic too. Where the
  planner asks (Note [Checkpoint regions] in planner/ckptsplit.go says
  when, and which calls), Python tells it whether it cuts the outer graph
  at block runs, planned with the DDP module's real settings
  (``GraphPlan.block_runs``: false with fewer than two block runs, or
  find_unused_parameters=True with aligned buckets, whose declaration
  order keeps the byte-driven cuts), and plans each body it names alone
  in ddp mode, each body placeholder counted as the DDP parameter its
  call hands it (argument i + 1), with DDP's bucket cap for every bucket
  (Note [Uniform caps] in planner/regions.go: identical bodies are cut
  alike, so their regions stay identical pieces, and the plan says
  whether its pieces are regions). The regions are then rewritten as
  above. The cost is every value that crosses a cut, not always one
  activation: between layers of a stack it is one, inside a block also
  the residual stream and whatever else is live there (an MLP's wide
  hidden; README has the figures). The cuts are the body's bucket
  boundaries, not the cheapest crossings near them.
- Deciding: the regions, what keeps a checkpoint whole and block splits
  before bucket splits are the planner's (``goddp_checkpoint_split``,
  Note [Checkpoint regions]); its reply is codes and numbers. Python reads
  what needs torch (``_call_facts``: random ops, grad-mode and autocast
  changes, in-place writes, whether a value may cross a cut, nested
  higher-order ops, the selective policy), answers the planner's
  questions, words the decision (``kept_whole_reason``,
  ``describe_split``: the INFO line) and rewrites the graph
  (``_rewrite``).
- Options: both splits run exactly where the planner cuts at blocks
  (Options.cuts_at_blocks: mode "ddp" with block_cuts on, the default), the
  one switch under which goddp rewrites the user's graph before planning
  and shares identical pieces. torch's DDPOptimizer treats every
  checkpoint as atomic; so does goddp's torch mode (it reproduces
  DDPOptimizer), and ddp mode with block_cuts=False (plain bucket cuts,
  the graph as Dynamo captured it).
"""

from __future__ import annotations

import functools
import logging
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import fx

from goddp.graph.nodes import example_value, resolve_attr
from goddp.native import extension as _native

logger = logging.getLogger("goddp")

CONTEXT_FN_KEY = "_checkpoint_context_fn"
_CHECKPOINT = torch.ops.higher_order.tag_activation_checkpoint


def body_of(gm: fx.GraphModule, node: fx.Node) -> fx.GraphModule | None:
    """The body of a higher-order-op call (a HOP whose first argument is a
    get_attr of a GraphModule), or None for any other node."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.HigherOrderOperator):
        return None
    if not node.args or not isinstance(node.args[0], fx.Node) or node.args[0].op != "get_attr":
        return None
    try:
        body = resolve_attr(gm, str(node.args[0].target))
    except AttributeError:
        return None
    return body if isinstance(body, fx.GraphModule) else None


def is_checkpoint(gm: fx.GraphModule, node: fx.Node) -> bool:
    return node.target is _CHECKPOINT and body_of(gm, node) is not None


# --------------------------------------------------------------------------
# Identity


def policy_key(value: Any, canonical: Callable[[Any], Any]) -> Any:
    """A selective-checkpoint context_fn as a hashable key: a
    functools.partial by its function and bound arguments, lists by their
    items, anything else as canonical() says (functions: by identity)."""
    if isinstance(value, functools.partial):
        return (
            "partial",
            policy_key(value.func, canonical),
            tuple(policy_key(a, canonical) for a in value.args),
            tuple(sorted((k, policy_key(v, canonical)) for k, v in value.keywords.items())),
        )
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(policy_key(v, canonical) for v in value))
    return canonical(value)


def graph_key(
    gm: fx.GraphModule,
    canonical: Callable[[Any, dict[fx.Node, int]], Any],
    target_key: Callable[[fx.GraphModule, fx.Node], Any],
) -> tuple:
    """A hashable key for a graph's code: per node its op, target_key and
    arguments (other nodes by position, constants by canonical), names
    aside, and the graph module's meta (the checkpoint policy). target_key
    recurses into bodies (goddp.graph.blocks.piece_signature)."""
    entries, index = node_entries(gm, canonical, target_key)
    meta = tuple(
        (key, policy_key(value, lambda v: canonical(v, index)) if key == CONTEXT_FN_KEY else canonical(value, index))
        for key, value in sorted(getattr(gm, "meta", {}).items())
    )
    return (entries, meta)


def node_entries(
    gm: fx.GraphModule,
    canonical: Callable[[Any, dict[fx.Node, int]], Any],
    target_key: Callable[[fx.GraphModule, fx.Node], Any],
) -> tuple[tuple, dict[fx.Node, int]]:
    """Per node of gm, its op, target_key and arguments (other nodes by
    position, constants by canonical), names aside; and each node's
    position. Shared by graph_key and goddp.graph.blocks.piece_signature."""
    index: dict[fx.Node, int] = {}
    entries: list[Any] = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        if node.op == "placeholder":
            entries.append(("placeholder",))
            continue
        entries.append((node.op, target_key(gm, node), canonical(node.args, index), canonical(node.kwargs, index)))
    return tuple(entries), index


# --------------------------------------------------------------------------
# Splitting a checkpoint at the block or bucket boundaries of its body

_RANDOM_FUNCTIONS = frozenset(
    {
        torch.nn.functional.dropout, torch.nn.functional.dropout1d, torch.nn.functional.dropout2d,
        torch.nn.functional.dropout3d, torch.nn.functional.alpha_dropout,
        torch.nn.functional.feature_alpha_dropout, torch.dropout, torch.rand, torch.randn, torch.randint,
        torch.rand_like, torch.randn_like, torch.randint_like, torch.bernoulli, torch.multinomial,
        torch.normal, torch.randperm, torch.poisson, torch.nn.functional.rrelu, torch.nn.functional.gumbel_softmax,
    }
)
_RANDOM_METHODS = frozenset(
    {"bernoulli", "bernoulli_", "random_", "uniform_", "normal_", "exponential_", "geometric_", "cauchy_",
     "log_normal_", "multinomial"}
)
_STATE_FUNCTIONS = frozenset(
    {torch._C._set_grad_enabled, torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast}
)
_INPLACE_OPERATORS = frozenset(
    {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
     operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
     operator.imatmul}
)
# The only selective policy carried over to each region: a list of ops to
# save, wrapped as torch documents it.
_SAC_CONTEXTS = torch.utils.checkpoint.create_selective_checkpoint_contexts


def _op_name(node: fx.Node) -> str:
    return str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", str(node.target))


def _is_random(node: fx.Node) -> bool:
    if node.op == "call_method":
        return str(node.target) in _RANDOM_METHODS
    if node.op != "call_function":
        return False
    if node.target in _RANDOM_FUNCTIONS:
        return True
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def _mutated(node: fx.Node) -> fx.Node | None:
    """The value an in-place node writes (its first argument), or None."""
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    if node.kwargs.get("inplace") is True:
        return first
    if node.op == "call_method":
        name = str(node.target)
        return first if name.endswith("_") and not name.endswith("__") else None
    if node.op == "call_function":
        if node.target in _INPLACE_OPERATORS:
            return first
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            return first
    return None


def _carries(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def _example(node: fx.Node) -> Any:
    return example_value(node, None)


@dataclass
class Region:
    """A run of body nodes that becomes one checkpoint."""

    nodes: list[fx.Node] = field(default_factory=list)
    inputs: list[fx.Node] = field(default_factory=list)  # body values it reads from before it
    outputs: list[fx.Node] = field(default_factory=list)  # its values read after it


@dataclass(frozen=True)
class BodyBuckets:
    """A checkpoint body planned alone by buckets (Note [Checkpoint
    bodies]): per body node its piece (-1: placeholders, the output), the
    DDP parameters' bytes it holds, the bucket cap and the buckets they
    fill, and the planner's word on whether its pieces are regions to
    split it into (GraphPlan.checkpoint_regions, Note [Uniform caps])."""

    node_pieces: list[int]
    param_bytes: int
    cap_bytes: int
    buckets: int
    regions: bool


# Why the planner keeps a checkpoint whole (goddp_checkpoint_split's
# "code"), in goddp's words; {op} and {type} are the body node the reply
# names, {region} its region.
_KEPT_WHOLE = {
    "few_blocks": "its body holds fewer than two blocks",
    "result_used": "its result is used other than by indexing",
    "policy_function": "its selective-checkpoint policy is a function, which may keep state across the "
    "checkpoint's ops (a list of ops to save would be carried over to each region)",
    "random_op": "it holds a random op ({op}), whose saved RNG state would move",
    "state_change": "it changes grad mode or autocast inside, a state that would cross the cut",
    "nested_hop": "it holds a nested higher-order op",
    "read_before_made": "a value is read before the region that makes it",
    "attribute_both_sides": "a body attribute is read on both sides of a cut",
    "not_carried": "a {type} value would cross a cut",
    "mutation_across_cut": "{op} writes a value from before its region, across a cut",
    "hands_nothing_on": "its region {region} hands nothing on",
}


def kept_whole_reason(code: str, op: str = "", type_name: str = "", region: int = -1) -> str:
    """Why a checkpoint stays whole ("" when split): the planner's code, op
    and type_name of the body node it names, and the region it names."""
    if not code:
        return ""
    words = _KEPT_WHOLE.get(code, "kept whole for a reason this goddp cannot word ({code})")
    return words.format(op=op, type=type_name, region=region, code=code)


def mib(n: int) -> str:
    """A byte count in MiB, to three significant digits."""
    return f"{n / 2**20:.3g} MiB"


def describe_split(
    name: str, boundary: str, blocks: int, regions: int | None, buckets: BodyBuckets | None, reason: str
) -> str:
    """The INFO line for a checkpoint call named name (Note [Checkpoint
    regions], "Said"): the boundary tried, the blocks its body holds, the
    regions it is split into (None: kept whole, for reason) and, at
    buckets, its body's bucket plan (the parameter bytes against the cap)."""
    if boundary == "bucket" and buckets is not None:
        holds = (
            f"goddp: the checkpoint {name!r} holds {mib(buckets.param_bytes)} of DDP's parameters, "
            f"{buckets.buckets} buckets under the {mib(buckets.cap_bytes)} bucket cap"
        )
        if regions is not None:
            return (
                f"{holds}: split into {regions} checkpoint regions at bucket boundaries "
                "(the values crossing each cut are saved)"
            )
        return f"{holds}, but is kept whole, so its buckets cannot overlap: {reason}"
    if regions is not None:
        return (
            f"goddp: the checkpoint {name!r} spans {blocks} blocks: split into {regions} checkpoint regions at "
            "block boundaries (one saved activation per cut)"
        )
    return (
        f"goddp: the checkpoint {name!r} spans {blocks} blocks but is kept whole, so its blocks' buckets cannot "
        f"overlap: {reason}"
    )


@dataclass
class Split:
    """What the planner decided for one checkpoint call (Note [Checkpoint
    regions] in planner/ckptsplit.go): regions to split it into, or None
    and the reason it stays whole (code names it). boundary says which
    cuts were tried: "block", "bucket" (buckets says what was planned), or
    "" (nothing to split, nothing to say)."""

    call: fx.Node
    blocks: int  # block instances its body holds
    regions: list[Region] | None
    reason: str
    boundary: str = "block"
    buckets: BodyBuckets | None = None
    code: str = ""

    def describe(self) -> str:
        """The INFO line."""
        regions = None if self.regions is None else len(self.regions)
        return describe_split(self.call.name, self.boundary, self.blocks, regions, self.buckets, self.reason)


def _policy_is_function(body: fx.GraphModule) -> bool:
    """Whether the body's selective policy is anything but a list of ops to
    save, wrapped as torch documents it."""
    context_fn = body.meta.get(CONTEXT_FN_KEY)
    return context_fn is not None and not (
        isinstance(context_fn, functools.partial)
        and context_fn.func is _SAC_CONTEXTS
        and len(context_fn.args) == 1
        and not context_fn.keywords
        and isinstance(context_fn.args[0], (list, tuple))
    )


def _call_facts(call: fx.Node, body: fx.GraphModule, blocks: Sequence[int]) -> dict[str, Any]:
    """One call's facts for goddp_checkpoint_split (csrc/goddp.h)."""
    nodes = list(body.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    returned = set(nodes[-1].all_input_nodes)
    facts = []
    for node, block in zip(nodes, blocks):
        value, written = _example(node), _mutated(node)
        facts.append({
            "kind": node.op if node.op in ("placeholder", "get_attr", "output") else "compute",
            "block": block,
            "inputs": [index[v] for v in node.all_input_nodes],
            "returned": node in returned,
            "writes": -1 if written is None else index[written],
            "carries": _carries(value),
            "random": _is_random(node),
            "state_change": node.op == "call_function" and node.target in _STATE_FUNCTIONS,
            "nested": body_of(body, node) is not None,
        })
    return {
        "name": call.name,
        "nodes": facts,
        "indexed_only": all(u.op == "call_function" and u.target is operator.getitem for u in call.users),
        "policy_function": _policy_is_function(body),
        "buckets": None,
    }


BodyPlanner = Callable[[fx.GraphModule, fx.Node, fx.GraphModule], "BodyBuckets | None"]


def _decide(
    gm: fx.GraphModule,
    calls: Sequence[fx.Node],
    body_blocks: Callable[[fx.GraphModule], list[int]],
    body_buckets: BodyPlanner | None,
    cut_at_blocks: Callable[[fx.GraphModule], bool] | None,
) -> tuple[list[Split], list[int]]:
    """The planner's decision for every call, and the calls it has something
    to say about; Python answers its questions (goddp_checkpoint_split)."""
    bodies = [body_of(gm, call) for call in calls]
    request: dict[str, Any] = {
        "calls": [_call_facts(call, body, body_blocks(body)) for call, body in zip(calls, bodies)],
        "bucket_splits": body_buckets is not None,
        "cut_at_blocks": None,
        "buckets_planned": False,
    }
    planned: dict[int, BodyBuckets | None] = {}
    for _ in range(3):
        reply = _native.checkpoint_split(request)
        if reply["ask"] == "cut_at_blocks":
            request["cut_at_blocks"] = bool(cut_at_blocks(gm))
        elif reply["ask"] == "buckets":
            for i in reply["plan_buckets"]:
                b = planned[i] = body_buckets(gm, calls[i], bodies[i])
                request["calls"][i]["buckets"] = None if b is None else {
                    "pieces": list(b.node_pieces), "param_bytes": b.param_bytes, "cap_bytes": b.cap_bytes,
                    "buckets": b.buckets, "regions": b.regions,
                }
            request["buckets_planned"] = True
        else:
            break
    else:
        raise RuntimeError(f"goddp: goddp_checkpoint_split asked {reply['ask']!r} again")
    splits = []
    for i, (call, body, decided) in enumerate(zip(calls, bodies, reply["calls"])):
        regions, nodes = None, list(body.graph.nodes)
        if decided["node_regions"] is not None:
            regions = [
                Region(
                    [n for n, k in zip(nodes, decided["node_regions"]) if k == r],
                    [nodes[j] for j in region["inputs"]],
                    [nodes[j] for j in region["outputs"]],
                )
                for r, region in enumerate(decided["regions"])
            ]
        named = nodes[decided["node"]] if 0 <= decided["node"] < len(nodes) else None
        reason = kept_whole_reason(
            decided["code"],
            "" if named is None else _op_name(named),
            "" if named is None else type(_example(named)).__name__,
            decided["region"],
        )
        splits.append(
            Split(call, decided["blocks"], regions, reason, decided["boundary"], planned.get(i), decided["code"])
        )
    return splits, reply["said"]


def _region_body(body: fx.GraphModule, region: Region) -> fx.GraphModule:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for value in region.inputs:
        placeholder = graph.placeholder(value.name)
        placeholder.meta = dict(value.meta)
        env[value] = placeholder
    for node in region.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[n] for n in region.outputs))
    attrs = {str(n.target): resolve_attr(body, str(n.target)) for n in region.nodes if n.op == "get_attr"}
    sub = fx.GraphModule(attrs, graph, class_name="GoddpCheckpointRegion")
    sub.meta = dict(getattr(body, "meta", {}))
    return sub


def _rewrite(graph: fx.Graph, attrs: dict[str, Any], call: fx.Node, regions: Sequence[Region]) -> None:
    """Replaces call (in graph) by one checkpoint call per region."""
    body_attr = call.args[0]
    body = attrs[str(body_attr.target)]
    body_nodes = list(body.graph.nodes)
    placeholders = [n for n in body_nodes if n.op == "placeholder"]
    value: dict[fx.Node, Any] = dict(zip(placeholders, call.args[1:]))
    kept_meta = {k: v for k, v in call.meta.items() if k in ("stack_trace", "source_fn_stack")}
    with graph.inserting_before(call):
        for k, region in enumerate(regions):
            name = f"{body_attr.target}_region_{k}"
            attrs[name] = _region_body(body, region)
            region_call = graph.call_function(
                call.target, (graph.get_attr(name), *[value[v] for v in region.inputs]), dict(call.kwargs)
            )
            region_call.meta = {**kept_meta, "example_value": tuple(_example(o) for o in region.outputs)}
            for j, out in enumerate(region.outputs):
                item = graph.call_function(operator.getitem, (region_call, j))
                item.meta = {**kept_meta, "example_value": _example(out)}
                value[out] = item
    results = body_nodes[-1].args[0]
    for user in list(call.users):
        user.replace_all_uses_with(value[results[user.args[1]]])
        graph.erase_node(user)
    graph.erase_node(call)
    if not body_attr.users:
        graph.erase_node(body_attr)


def split_checkpoints(
    gm: fx.GraphModule,
    body_blocks: Callable[[fx.GraphModule], list[int]],
    body_buckets: BodyPlanner | None = None,
    cut_at_blocks: Callable[[fx.GraphModule], bool] | None = None,
) -> tuple[fx.GraphModule, list[Split]]:
    """gm with its checkpoint calls split into regions where the planner
    says (Note [Checkpoint regions] in planner/ckptsplit.go), gm itself
    when none is; and the decision for each call it has something to say
    about. body_buckets needs cut_at_blocks (the planner's
    GraphPlan.block_runs for gm). gm is not modified."""
    if body_buckets is not None and cut_at_blocks is None:
        raise ValueError("split_checkpoints: body_buckets needs cut_at_blocks (the planner's block_runs for gm)")
    calls = [n for n in gm.graph.nodes if is_checkpoint(gm, n)]
    if not calls:
        return gm, []
    decided, said = _decide(gm, calls, body_blocks, body_buckets, cut_at_blocks)
    splits = [decided[i] for i in said]
    if not any(s.regions is not None for s in splits):
        return gm, splits
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
        if node.op == "placeholder" and hasattr(node, "_dynamo_source"):
            env[node]._dynamo_source = node._dynamo_source
    attrs = {str(n.target): resolve_attr(gm, str(n.target)) for n in gm.graph.nodes if n.op == "get_attr"}
    for split in splits:
        if split.regions is not None:
            _rewrite(graph, attrs, env[split.call], split.regions)
    graph.lint()
    used = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    new = fx.GraphModule({k: v for k, v in attrs.items() if k in used}, graph, class_name=type(gm).__name__)
    new.meta = dict(getattr(gm, "meta", {}))
    for name in ("_param_name_to_source", "shape_env"):
        if hasattr(gm, name):
            setattr(new, name, getattr(gm, name))
    return new, splits


def log_splits(splits: Sequence[Split]) -> None:
    for split in splits:
        logger.info("%s", split.describe())
