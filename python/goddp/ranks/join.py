"""Where the ranks of a DDP module meet when its training runs inside a
Join context (uneven inputs).

Note [Meeting under Join]: a rank that has run out of inputs inside
``with Join([ddp]):`` no longer runs DDP's forward: it shadows the others'
collectives in Join's exit (DDP's ``_DDPJoinHook.main_hook``), and a rank
with no input at all never reaches goddp. So inside Join no training call
is one every rank is certain to reach (Note [Where the ranks meet] in
goddp.ranks.agreement), and the agreement must not wait at one blindly.
What every rank does take part in, each iteration, joined or not, is DDP's
own Join allreduce (``_check_global_requires_backward_grad_sync``): a
non-joined rank adds 1 from its pre-forward, a joined rank's shadow adds 0.
goddp, on each rank where the module's decision is still to come, makes
that rank add ``size + 1`` instead of 1 (goddp.ddp.private
``override_join_sync_check``; from the module's first training call on,
since goddp first sees the module inside that call's forward), and its
gate waits on that allreduce, which every rank issues in this iteration.
The sum exceeds size**2 exactly when every rank of the group added
``size + 1``: every rank is in this iteration's training forward, with
its decision still to come, so every rank reaches the gate of this very
call and reads the same sum. Only then do the ranks meet; at any other
call under Join no rank waits and the module keeps DDP's buckets for now.
A joined rank still reads the sum as non-zero exactly when some rank
reduces gradients, as DDP's shadow asks.

The first training call under Join therefore never meets (this rank's
pre-forward ran before goddp saw the module): the ranks meet at the first
later one that every rank runs, or at the first training call outside
Join. A round the ranks put off to the module's next training forward
("LATER", a forward split over several graphs: Note [Graphs of one
forward] in goddp.ranks.forward) is a decision still to come: the ranks
hold it the same way, at the first later training call that every rank
runs, inside Join or after it; until then DDP's buckets stay.

The Join state DDP hands the reducer at each forward (the work of its
notify allreduce, which counts the non-joined ranks and, with
``divide_by_initial_world_size=False``, divides the gradients) cannot be
read back and does not reach a reducer rebuilt in that forward. It is not
needed: the ranks meet, and install, only at an iteration that every rank
runs, where that count is the group's size, the divisor a reducer without
the work uses. A rank that joins later shadows the rebuilt reducer's
buckets, which DDP rebuilds on every rank from rank 0's order (the joined
rank's shadow calls the same bucket rebuild).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from goddp.ddp import private
from goddp.ddp.state import state_of
from goddp.ranks.verdict import LATER


@dataclasses.dataclass
class _Check:
    """One iteration's Join allreduce on this rank, and once read, whether
    every rank is ready to meet."""

    work: Any
    tensor: torch.Tensor
    ready: bool | None = None


def inside_join(ddp: Any) -> bool:
    return private.join_enabled(ddp)


def meets_now(ddp: Any) -> bool:
    """Whether every rank of ddp's group is certain to reach this training
    call's agreement (Note [Meeting under Join]): outside Join, yes (Note
    [Where the ranks meet]); inside Join, only where every rank said so in
    this iteration's Join allreduce. Call it from the gate, inside DDP's
    forward, while the module's decision is still to come."""
    if not inside_join(ddp):
        return True
    state = state_of(ddp)
    if "_check_global_requires_backward_grad_sync" not in vars(ddp):
        private.override_join_sync_check(ddp, _contribution, _keep)
        return False  # this forward's allreduce went out before goddp saw it
    check = state.join_check
    if check is None:
        return False
    if check.ready is None:
        check.work.wait()  # every rank issues this allreduce in this iteration (DDP's Join)
        size = _size(ddp)
        check.ready = float(check.tensor.item()) > size * size + size / 2
    return check.ready


def stop(ddp: Any) -> None:
    """The module decided: DDP's own Join allreduce again."""
    private.restore_join_sync_check(ddp)
    state_of(ddp).join_check = None


def _size(ddp: Any) -> int:
    return int(ddp.process_group.size())


def _contribution(ddp: Any) -> float:
    state = state_of(ddp)
    to_come = state.decision is None or state.decision.action == LATER
    return float(_size(ddp) + 1) if to_come and state.fatal is None else 1.0


def _keep(ddp: Any, work: Any, tensor: torch.Tensor) -> None:
    state_of(ddp).join_check = _Check(work, tensor)
