"""goddp.trace's hooks on a DDP module: a timing comm hook, and DDP's
forward steps wrapped to see backward start (see goddp.tracing).

Every change to DDP itself goes through goddp.ddp.private.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from goddp.ddp import private
from goddp.ddp.private import ReducerLost
from goddp.ddp.state import state_of
from goddp.tracing.recorder import TraceError, Recorder, timing_hook


def ddp_default_reduction(ddp: Any) -> Callable[[Any, Any], Any]:
    """DDP's built-in reduction, as a Python hook with DDP's own arithmetic.

    Without a hook, DDP's reducer scales each gradient by 1/world while
    copying it into the bucket (a multiplication by the reciprocal) or, when
    the gradient already is a view of the bucket (gradient_as_bucket_view
    after the first step) or copies are batched, divides in place; then it
    sums the bucket over the group. With a hook it only copies, so the hook
    does the scaling, the same way. Multiplying by 1/n and dividing by n
    agree bit for bit when n is a power of two; for other world sizes the
    first step of a gradient_as_bucket_view module may differ in the last
    bit (DDP mixes both there). DDP's Join (uneven inputs) changes the
    divisor and is not reproduced."""
    group = ddp.process_group
    size = group.size()
    divide = bool(ddp.gradient_as_bucket_view or getattr(ddp, "batched_grad_copy", False))
    reciprocal = 1.0 / size

    def reduce(state, bucket):
        buf = bucket.buffer()
        if divide:
            buf.div_(size)
        else:
            buf.mul_(reciprocal)
        # The group's own allreduce (a sum), as DDP's reducer calls it,
        # without torch.distributed.all_reduce's per-call Python checks.
        return group.allreduce([buf]).get_future()

    return reduce


def builtin_reduction(ddp: Any, kind: Any) -> tuple[Callable[[Any, Any], Any], bool]:
    """DDP's built-in comm hook ``kind`` as a Python hook with the C++ hook's
    own arithmetic (torch/csrc/distributed/c10d/default_comm_hooks.cpp),
    and whether its future holds a list (a collective's own future). The
    trace times this replica in the C++ hook's place: the same buckets and
    numbers, plus the cost of calling Python per bucket (Note [Built-in
    comm hooks] in goddp.ddp.private)."""
    group = ddp.process_group
    size = group.size()
    if kind == dist.BuiltinCommHookType.ALLREDUCE:

        def allreduce(state, bucket):
            buf = bucket.buffer()
            buf.div_(size)  # before the sum, as the C++ hook does
            return group.allreduce([buf]).get_future()

        return allreduce, True
    if kind == dist.BuiltinCommHookType.FP16_COMPRESS:

        def fp16_compress(state, bucket):
            buf = bucket.buffer()
            compressed = buf.to(torch.float16)
            compressed.div_(size)
            future = group.allreduce([compressed]).get_future()

            def decompress(fut):
                buf.copy_(fut.value()[0])
                return buf

            return future.then(decompress)

        return fp16_compress, False
    raise TraceError(f"goddp.trace has no replica of DDP's built-in comm hook {kind}")


def unwrap_ddp(module: Any) -> Any:
    """The DistributedDataParallel module behind `module` (itself, or what
    torch.compile wrapped); TraceError otherwise."""
    inner = getattr(module, "_orig_mod", module)
    if not isinstance(inner, DistributedDataParallel):
        raise TraceError(
            f"goddp.trace needs a DistributedDataParallel module (or torch.compile of one), "
            f"got {type(module).__name__}"
        )
    return inner


def _rebuild_reducer(ddp: Any, hooks: list[tuple[Callable, Any]], in_forward: bool = False) -> None:
    """A fresh reducer for ddp with its current buckets and `hooks`
    (goddp.ddp.private.rebuild_reducer). The fresh reducer derives its
    buckets once more after its first step, from the same settings and
    gradient order, which gives the same buckets."""
    try:
        private.rebuild_reducer(ddp, hooks=hooks, keep_buckets=True, in_forward=in_forward)
    except ReducerLost as lost:
        raise TraceError(str(lost).replace("goddp:", "goddp.trace:", 1)) from lost


class Installation:
    """The hooks of one trace on one DDP module, and how to take them off."""

    def __init__(self, ddp: Any, recorder: Recorder) -> None:
        self.ddp = ddp
        self.recorder = recorder
        self.user_hooks = private.registered_comm_hooks(ddp)
        if self.user_hooks and private.is_builtin_hook(self.user_hooks[0][0]):
            kind = self.user_hooks[0][0]
            self.hook_name = f"DDP's built-in {kind.name}, timed as its Python replica"
            reduce, first = builtin_reduction(ddp, kind)
            self.hooks = [(timing_hook(weakref.ref(recorder), reduce, first=first), None)]
        elif self.user_hooks:
            user_hook, state = self.user_hooks[0]
            self.hook_name = getattr(user_hook, "__qualname__", repr(user_hook))
            self.hooks = [(timing_hook(weakref.ref(recorder), user_hook, first=False), state)]
        else:
            self.hook_name = "DDP's default allreduce"
            self.hooks = [(timing_hook(weakref.ref(recorder), ddp_default_reduction(ddp), first=True), None)]
        self.removed = False
        # Where a user hook must be swapped for ours, the fresh reducer is
        # built at the start of the next forward that reduces, after DDP's
        # pre-forward (as goddp's alignment does): a reducer swapped between
        # a forward and its backward would not reduce that backward.
        self.rebuild_pending = bool(self.user_hooks)

    def install(self) -> None:
        ddp = self.ddp
        if not self.user_hooks:
            # No hook yet: the reducer takes ours as it is; nothing to rebuild.
            private.register_comm_hooks(ddp, self.hooks)
        recorder = self.recorder
        pre_forward, post_forward = private.forward_steps(ddp)

        @torch.compiler.disable(recursive=True)
        def _pre_forward(*inputs, **kwargs):
            result = pre_forward(ddp, *inputs, **kwargs)
            if self.rebuild_pending and torch.is_grad_enabled() and ddp.require_backward_grad_sync:
                self.rebuild_pending = False
                _rebuild_reducer(ddp, self.hooks, in_forward=True)
            return result

        # Dynamo skips DDP's forward but would convert the frames it calls
        # that live outside torch (this one, under torch.compile): costly on
        # every step and useless, so it runs eagerly like DDP's own.
        @torch.compiler.disable(recursive=True)
        def _post_forward(output):
            # Read before DDP's post-forward, as DDP's pre-forward saw it.
            reduces = torch.is_grad_enabled() and ddp.require_backward_grad_sync
            output = post_forward(ddp, output)
            recorder.after_forward(output, reduces)
            return output

        private.override_forward_steps(ddp, _pre_forward, _post_forward)
        state_of(ddp).trace = self

    def remove(self) -> None:
        ddp = self.ddp
        self.recorder.recording = False
        private.restore_forward_steps(ddp)
        state_of(ddp).trace = None
        self.removed = True
        if self.rebuild_pending:  # no forward swapped the reducer: it is DDP's own still
            return
        _rebuild_reducer(ddp, self.user_hooks)
        if self.recorder.pending_forward:
            # A forward ran and its backward has not: arm the fresh reducer
            # the way DDP's forward armed the old one, or that backward
            # would not reduce (find_unused_parameters and static_graph are
            # refused before: Trace.close).
            private.arm_for_backward(ddp)
