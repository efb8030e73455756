"""Running the compiled pieces as one callable.

All bookkeeping is done once, at compile time: every value gets a slot in a
flat list (graph inputs first, then each piece's outputs), and each step
holds a C-level getter for the slots it reads, the slots it writes and the
slots nobody reads afterwards. A call is then a short loop. While a
profiler records, the loop runs each piece named in its trace (Note [Piece
ranges] in goddp.tools.ranges).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import fx

from goddp.graph.cut import Piece
from goddp.graph.nodes import example_value
from goddp.tools.ranges import piece_ranges


def _gatherer(reads: tuple[int, ...]) -> Callable[[list], tuple]:
    """A function env -> tuple of env[i] for i in reads (itemgetter returns a
    bare item for one index, so that case is wrapped)."""
    if len(reads) >= 2:
        return itemgetter(*reads)
    if len(reads) == 1:
        (only,) = reads
        return lambda env: (env[only],)
    return lambda env: ()


def _example_requires_grad(node: fx.Node) -> bool:
    value = example_value(node, None)
    # Unknown metadata: assume it may require grad (nothing to check).
    return not isinstance(value, torch.Tensor) or value.requires_grad


class StitchedPieces:
    """Calls compiled pieces in order; returns exactly what the original
    graph returns (same structure).

    Compiled pieces are called the way Dynamo calls what a backend returns:
    with positional arguments. (A ``_boxed_call`` attribute on them can be a
    leftover copied by functools-style wrapping, so it is not consulted.)
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        pieces: Sequence[Piece],
        compiled: Sequence[Callable[..., Any]],
        labels: Sequence[str] | None = None,
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
        self._blank = [None] * (self.num_slots - self.num_inputs)

        # Values made by a piece are dropped after their last reader, so the
        # list holds no more than the unsplit graph would. (Graph inputs stay
        # alive in the caller anyway.)
        returned_leaves, self._out_spec = pytree.tree_flatten(output_node.args[0])
        returned_slots = {slot[leaf] for leaf in returned_leaves if isinstance(leaf, fx.Node)}
        last_reader: dict[int, int] = {}
        for step, piece in enumerate(pieces):
            for value in piece.input_nodes:
                last_reader[slot[value]] = step
        releases_at: list[list[int]] = [[] for _ in pieces]
        for s, step in last_reader.items():
            if s >= self.num_inputs and s not in returned_slots:
                releases_at[step].append(s)

        steps = []
        for step, (piece, fn) in enumerate(zip(pieces, compiled)):
            reads = tuple(slot[v] for v in piece.input_nodes)
            writes = tuple(slot[v] for v in piece.output_nodes)
            steps.append((fn, _gatherer(reads), writes, tuple(sorted(releases_at[step]))))
        self._steps = tuple(steps)
        # The same steps, each piece named (labels) while a profiler records.
        self._ranged = piece_ranges(self._steps, labels)

        # Output: a flat tuple of nodes is the common case (Dynamo); anything
        # else is rebuilt through pytree with constants kept as they are.
        self._out_slots = tuple(slot[leaf] if isinstance(leaf, fx.Node) else -1 for leaf in returned_leaves)
        self._out_constants = tuple(None if isinstance(leaf, fx.Node) else leaf for leaf in returned_leaves)
        self._flat_tuple = isinstance(output_node.args[0], tuple) and all(
            isinstance(leaf, fx.Node) for leaf in output_node.args[0]
        )
        self._gather_output = _gatherer(self._out_slots) if self._flat_tuple else None

        # Values compiled as not requiring grad in the pieces that read them.
        # Dynamo's metadata makes this exact; the first call checks it, since
        # a tensor that does require grad at run time would silently lose its
        # gradient (Dynamo's guards keep later calls like the first).
        self._no_grad_slots = {
            slot[value]: value.name
            for piece in pieces
            for value in piece.output_nodes
            if not _example_requires_grad(value)
        }
        self._checked = False
        # Called once, before the first run of the pieces: the training gate
        # (goddp.ranks.agreement.TrainingGate).
        self.before_first_call: Any = None
        # A gate that asks to run again at later calls (its "armed"), and to
        # see their outputs (after_call).
        self._armed: Any = None

    def __call__(self, *args: Any) -> Any:
        if not self._checked:
            return self._first_call(args)
        gate = self._armed
        if gate is not None:
            # The module decides at a later training call (goddp.ranks.forward,
            # goddp.ranks.auto).
            gate()
            if not gate.armed:
                self._armed = None
        steps = self._steps
        if self._ranged is not None and self._ranged.wanted():
            steps = self._ranged.steps
        env = [*args, *self._blank]
        for fn, gather, writes, releases in steps:
            results = fn(*gather(env))
            for s, value in zip(writes, results):
                env[s] = value
            for s in releases:
                env[s] = None
        out = self._collect(env)
        if gate is not None:
            gate.after_call(out)
        return out

    def _first_call(self, args: tuple) -> Any:
        if self.before_first_call is not None:
            self.before_first_call()
            if getattr(self.before_first_call, "armed", False):
                self._armed = self.before_first_call
        steps = self._steps
        if self._ranged is not None and self._ranged.wanted():
            steps = self._ranged.steps
        env = [*args, *self._blank]
        for fn, gather, writes, releases in steps:
            results = fn(*gather(env))
            for s, value in zip(writes, results):
                env[s] = value
                if s in self._no_grad_slots and isinstance(value, torch.Tensor) and value.requires_grad:
                    raise RuntimeError(
                        f"goddp: the value {self._no_grad_slots[s]!r} passed between pieces requires "
                        "grad at run time, but it was compiled as not requiring grad, so its gradient "
                        "would be lost. This is a goddp bug; please report it (workaround: "
                        "options={'max_pieces': 1})."
                    )
            for s in releases:
                env[s] = None
        self._checked = True
        out = self._collect(env)
        if self._armed is not None:
            self._armed.after_call(out)
        return out

    def _collect(self, env: list[Any]) -> Any:
        if self._gather_output is not None:
            return self._gather_output(env)
        leaves = [env[s] if s >= 0 else c for s, c in zip(self._out_slots, self._out_constants)]
        return pytree.tree_unflatten(leaves, self._out_spec)
