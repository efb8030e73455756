"""Running the compiled pieces as one callable.

All bookkeeping is done once, at compile time: every value gets a slot in a
flat list (graph inputs first, then each piece's outputs), and each step
holds the slot indices it reads, writes and may release. A call is then a
short loop of list indexing.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import fx

from goddp._cut import Piece


class StitchedPieces:
    """Calls compiled pieces in order; returns exactly what the original
    graph returns (same structure)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        pieces: Sequence[Piece],
        compiled: Sequence[Callable[..., Any]],
    ) -> None:
        nodes = list(gm.graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        output_node = nodes[-1]
        slot: dict[fx.Node, int] = {node: i for i, node in enumerate(placeholders)}
        for piece in pieces:
            for value in piece.output_nodes:
                slot[value] = len(slot)
        self.num_inputs = len(placeholders)
        self.num_slots = len(slot)

        # The last step reading each slot, so the list drops values nobody
        # needs any more (keeps peak memory like the unsplit graph's).
        returned_leaves, self._out_spec = pytree.tree_flatten(output_node.args[0])
        returned = {leaf for leaf in returned_leaves if isinstance(leaf, fx.Node)}
        last_reader: dict[int, int] = {}
        for step, piece in enumerate(pieces):
            for value in piece.input_nodes:
                last_reader[slot[value]] = step

        returned_slots = {slot[value] for value in returned}
        releases_at: list[list[int]] = [[] for _ in pieces]
        for s, step in last_reader.items():
            if s not in returned_slots:
                releases_at[step].append(s)

        steps = []
        for step, (piece, fn) in enumerate(zip(pieces, compiled)):
            reads = tuple(slot[v] for v in piece.input_nodes)
            writes = tuple(slot[v] for v in piece.output_nodes)
            releases = tuple(sorted(releases_at[step]))
            steps.append((fn, reads, writes, releases))
        self._steps = tuple(steps)

        # Output: a flat tuple of nodes is the common case (Dynamo); anything
        # else is rebuilt through pytree with constants kept as they are.
        self._out_slots = tuple(slot[leaf] if isinstance(leaf, fx.Node) else -1 for leaf in returned_leaves)
        self._out_constants = tuple(None if isinstance(leaf, fx.Node) else leaf for leaf in returned_leaves)
        self._flat_tuple = (
            isinstance(output_node.args[0], tuple)
            and all(isinstance(leaf, fx.Node) for leaf in output_node.args[0])
        )

        # Values compiled as not requiring grad in the piece that reads them.
        # Dynamo's metadata makes this exact; the first call checks it, since
        # a tensor that does require grad at run time would silently lose its
        # gradient (Dynamo's guards keep later calls like the first).
        self._no_grad_slots = tuple(
            (slot[value], value.name)
            for piece in pieces
            for value in piece.output_nodes
            if not _example_requires_grad(value)
        )
        self._checked = False

    def __call__(self, *args: Any) -> Any:
        if not self._checked:
            return self._first_call(args)
        return self._run(args)

    def _first_call(self, args: tuple) -> Any:
        env: list[Any] = list(args)
        env.extend([None] * (self.num_slots - len(env)))
        for fn, reads, writes, releases in self._steps:
            results = fn(*[env[i] for i in reads])
            for s, value in zip(writes, results):
                env[s] = value
            self._check_first_call_values(env, writes)
            for s in releases:
                env[s] = None
        self._checked = True
        return self._collect(env)

    def _check_first_call_values(self, env: list[Any], writes: tuple) -> None:
        written = set(writes)
        for s, name in self._no_grad_slots:
            if s not in written:
                continue
            value = env[s]
            if isinstance(value, torch.Tensor) and value.requires_grad:
                raise RuntimeError(
                    f"goddp: the value {name!r} passed between pieces requires grad at run time, "
                    "but it was compiled as not requiring grad, so its gradient would be lost. "
                    "This is a goddp bug; please report it (workaround: options={'max_pieces': 1})."
                )

    def _collect(self, env: list[Any]) -> Any:
        if self._flat_tuple:
            return tuple(env[s] for s in self._out_slots)
        leaves = [env[s] if s >= 0 else c for s, c in zip(self._out_slots, self._out_constants)]
        return pytree.tree_unflatten(leaves, self._out_spec)

    def _run(self, args: tuple) -> Any:
        env: list[Any] = list(args)
        env.extend([None] * (self.num_slots - len(env)))
        # Compiled pieces follow Dynamo's convention for what a backend
        # returns: positional arguments. (A ``_boxed_call`` attribute on
        # them can be a leftover copied by functools-style wrapping.)
        for fn, reads, writes, releases in self._steps:
            results = fn(*[env[i] for i in reads])
            for s, value in zip(writes, results):
                env[s] = value
            for s in releases:
                env[s] = None
        if self._flat_tuple:
            return tuple(env[s] for s in self._out_slots)
        leaves = [env[s] if s >= 0 else c for s, c in zip(self._out_slots, self._out_constants)]
        return pytree.tree_unflatten(leaves, self._out_spec)


def _example_requires_grad(node: fx.Node) -> bool:
    value = node.meta.get("example_value", node.meta.get("val"))
    # Unknown metadata: assume it may require grad (nothing to check).
    return not isinstance(value, torch.Tensor) or value.requires_grad
