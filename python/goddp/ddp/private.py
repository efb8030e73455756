"""torch's private DistributedDataParallel API: every use goddp makes of it.

DDP keeps what goddp needs behind underscored names that move between torch
releases: its reducer (bucket assignment, autograd hooks, modes), its comm
hooks, its logging data, its bucket settings, its forward steps. Nothing
else in goddp touches them; a torch upgrade changes this module alone.

The one rebuild of DDP's reducer lives here too (``rebuild_reducer``): both
goddp's alignment (new bucket caps) and goddp.trace (new comm hooks, same
buckets) replace DDP's reducer through it, with the same rollback.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CommHooks = list[tuple[Callable[..., Any], Any]]


def active_ddp_module() -> nn.Module | None:
    """The DDP module whose forward is running (Dynamo compiles inside it),
    or None outside any DDP forward."""
    if not torch.distributed.is_available():
        return None
    getter = getattr(DistributedDataParallel, "_get_active_ddp_module", None)
    return getter() if getter is not None else None


# --------------------------------------------------------------------------
# Reading DDP's state


def reducer_parameters(ddp: Any) -> tuple[list[torch.nn.Parameter], list[bool]]:
    """The parameters DDP's reducer manages (trainable and not ignored), in
    DDP's own index order, and whether each expects a sparse gradient."""
    parameters, expect_sparse = ddp._build_params_for_reducer()
    return list(parameters), list(expect_sparse)


def ddp_parameters(ddp: Any) -> list[torch.nn.Parameter]:
    """The parameters DDP's reducer manages, in DDP's own index order."""
    return reducer_parameters(ddp)[0]


def bucket_config(ddp: Any) -> Any:
    """DDP's bucket settings as they are now (None on a torch without them)."""
    return getattr(ddp, "_bucket_config", None)


def has_per_bucket_caps(ddp: Any) -> bool:
    return hasattr(bucket_config(ddp), "per_bucket_bytes_caps")


def with_per_bucket_caps(config: Any, caps: Sequence[int]) -> Any:
    return dataclasses.replace(config, per_bucket_bytes_caps=tuple(caps))


def first_bucket_cap(config: Any) -> int | None:
    """The first bucket's cap in DDP's bucket settings; None where this torch
    keeps none."""
    first = getattr(config, "first_bucket_bytes_cap", None)
    return None if first is None else int(first)


def per_bucket_caps(ddp: Any, config: Any) -> tuple[int, ...]:
    """The per-bucket caps of DDP's bucket settings (older torch: on the module)."""
    caps = getattr(config, "per_bucket_bytes_caps", None)
    if caps is None:
        caps = getattr(ddp, "bucket_bytes_cap_list", None)
    return tuple(int(c) for c in caps or ())


def cap_is_default(ddp: Any) -> bool:
    return bool(getattr(ddp, "bucket_bytes_cap_default", False))


def uses_python_reducer(ddp: Any) -> bool:
    """DDP runs its Python reducer (compiled autograd schedules DDP)."""
    return bool(getattr(ddp, "_use_python_reducer", False))


def delays_every_allreduce(ddp: Any) -> bool:
    return bool(getattr(ddp, "_delay_all_reduce_all_params", False))


def join_enabled(ddp: Any) -> bool:
    """A Join context (uneven inputs) is active on this DDP module."""
    return bool(getattr(getattr(ddp, "_join_config", None), "enable", False))


def override_join_sync_check(
    ddp: Any, contribution: Callable[[Any], float], keep: Callable[[Any, Any, torch.Tensor], None]
) -> None:
    """On ddp alone (an instance attribute), DDP's Join allreduce of each
    iteration (``_check_global_requires_backward_grad_sync``; a non-joined
    rank adds 1 where it reduces gradients this iteration, else 0, from its
    pre-forward; a joined rank's shadow adds 0 and reads whether the sum is
    0) adds contribution(ddp) instead on a non-joined rank that reduces
    gradients, and hands keep(ddp, work, tensor) the allreduce, which DDP
    never waits on there. A joined rank's shadow stays DDP's own (Note
    [Meeting under Join] in goddp.ranks.join)."""
    original = type(ddp)._check_global_requires_backward_grad_sync
    module_ref = weakref.ref(ddp)

    def check(is_joined_rank: bool) -> Any:
        module = module_ref()
        if is_joined_rank or module is None:
            return original(module, is_joined_rank)
        value = float(contribution(module)) if module.require_backward_grad_sync else 0.0
        tensor = torch.full((1,), value, device=module.device)
        work = dist.all_reduce(tensor, group=module.process_group, async_op=True)
        keep(module, work, tensor)
        return None

    ddp._check_global_requires_backward_grad_sync = check


def restore_join_sync_check(ddp: Any) -> None:
    ddp.__dict__.pop("_check_global_requires_backward_grad_sync", None)


def reducer_of(ddp: Any) -> Any:
    """DDP's reducer object (compared by identity: was it replaced?)."""
    return getattr(ddp, "reducer", None)


def comm_hooks(ddp: Any) -> CommHooks:
    """The Python comm hooks DDP keeps a record of, as (hook, state)."""
    return list(ddp._comm_hooks)


def registered_comm_hooks(ddp: Any) -> CommHooks:
    """The comm hooks registered on DDP's reducer, as (hook, state): the
    Python hooks DDP keeps a record of, or a built-in hook as (its
    ``dist.BuiltinCommHookType``, None) (Note [Built-in comm hooks]).
    UnknownBuiltinHook where DDP's logging data names a built-in hook this
    torch has no type for."""
    hooks = comm_hooks(ddp)
    name = builtin_comm_hook(ddp)
    if name is None:
        return hooks
    kind = builtin_hook_type(name)
    if kind is None:
        raise UnknownBuiltinHook(f"a built-in comm hook goddp cannot identify ({name}) is registered")
    return [(kind, None)]


class UnknownBuiltinHook(RuntimeError):
    """DDP's logging data names a built-in comm hook that is no
    ``dist.BuiltinCommHookType`` of this torch: it cannot be registered again."""


def logged_comm_hook(ddp: Any) -> str | None:
    """The comm hook DDP's logging data names (any kind of hook), or None."""
    return ddp._get_ddp_logging_data().get("comm_hook") or None


# Note [Built-in comm hooks]: DDP keeps no record of a built-in (C++) comm
# hook (``_register_builtin_comm_hook``) but the name it gives DDP's logger,
# ``str(comm_hook_type)`` ("BuiltinCommHookType.FP16_COMPRESS"); a Python
# hook is named there too, and recorded in ``ddp._comm_hooks``. So a logged
# name with no Python hook recorded is a built-in hook, and the type whose
# str() is that name is the one to register on a rebuilt reducer, which
# gets a fresh logger. A name that no type of this torch gives stays
# unknown: goddp then refuses what would need the hook registered again.


def builtin_comm_hook(ddp: Any) -> str | None:
    """The name of a built-in (C++) comm hook registered on DDP's reducer, or
    None (Note [Built-in comm hooks])."""
    name = logged_comm_hook(ddp)
    return name if name and not ddp._comm_hooks else None


def builtin_hook_type(name: str) -> Any:
    """The ``dist.BuiltinCommHookType`` whose name in DDP's logging data is
    name, or None."""
    for kind in dist.BuiltinCommHookType.__members__.values():
        if str(kind) == name:
            return kind
    return None


def is_builtin_hook(hook: Any) -> bool:
    """hook (of a (hook, state) pair of registered_comm_hooks) is a built-in
    hook's type."""
    return isinstance(hook, dist.BuiltinCommHookType)


def current_buckets(ddp: Any) -> list[list[int]]:
    """DDP's buckets now, in reducer order, as indices into DDP's parameter
    list."""
    index = {id(p): i for i, p in enumerate(ddp_parameters(ddp))}
    return [[index[id(p)] for p in b.parameters()] for b in ddp.reducer._get_zeros_like_grad_buckets()]


# --------------------------------------------------------------------------
# DDP's forward steps (goddp.trace wraps them)


def forward_steps(ddp: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """DDP's own pre-forward and post-forward, unbound (from its class)."""
    return type(ddp)._pre_forward, type(ddp)._post_forward


def override_forward_steps(ddp: Any, pre_forward: Callable[..., Any], post_forward: Callable[..., Any]) -> None:
    """Instance attributes: DDP's forward runs outside Dynamo's graphs, so no
    guard sees them and nothing recompiles."""
    ddp._pre_forward = pre_forward
    ddp._post_forward = post_forward


def restore_forward_steps(ddp: Any) -> None:
    ddp.__dict__.pop("_pre_forward", None)
    ddp.__dict__.pop("_post_forward", None)


# --------------------------------------------------------------------------
# Comm hooks and the reducer


def register_comm_hooks(ddp: Any, hooks: CommHooks) -> None:
    """Registers hooks (as registered_comm_hooks lists them) on DDP's
    current reducer and makes them DDP's record: the Python ones in
    ``ddp._comm_hooks``, each one's name in its logging data. The one place
    goddp registers a comm hook."""
    ddp._comm_hooks[:] = [(hook, state) for hook, state in hooks if not is_builtin_hook(hook)]
    for hook, state in hooks:
        if is_builtin_hook(hook):
            ddp._register_builtin_comm_hook(hook)  # names it in the logging data too
            continue
        dist._register_comm_hook(ddp.reducer, state, hook)
        ddp.logger._set_comm_hook_name(getattr(hook, "__qualname__", repr(hook)))


def arm_for_backward(ddp: Any) -> None:
    """Arms the reducer the way DDP's forward arms it for the backward that
    follows (goddp.trace, leaving between a forward and its backward)."""
    ddp.reducer.prepare_for_forward()
    ddp.reducer.prepare_for_backward([])


class ReducerLost(RuntimeError):
    """DDP's reducer could not be rebuilt: gradients would not be reduced."""


# The rebuild patches torch.distributed for its duration (keep_buckets); one
# rebuild at a time in this process.
_rebuild_lock = threading.Lock()


def rebuild_reducer(
    ddp: Any,
    *,
    config: Any = None,
    hooks: CommHooks | None = None,
    keep_buckets: bool = False,
    in_forward: bool = False,
) -> None:
    """Gives ddp a fresh reducer, built by DDP's own ``_ddp_init_helper``.

    config: new bucket settings (None: keep DDP's). hooks: the comm hooks of
    the new reducer (None: DDP's current ones). keep_buckets: the new
    reducer starts with the buckets DDP has now, not the ones DDP would
    derive from its settings (the one thing asked of
    ``dist._compute_bucket_assignment_by_size`` is replaced), so that
    buckets DDP rebuilt after its first step, or that goddp aligned, stay.
    in_forward: the rebuild happens inside DDP's forward, after its
    pre-forward, which already told the old reducer that a forward began;
    the new one is told too.

    Carried from the old reducer (DDP's own __setstate__ is the model): the
    comm hooks (a built-in one too), the hook name in DDP's logging data, manual backward
    finalization, optimizer-in-backward mode, static_graph (Note [Static
    graph across a rebuild]). Settings that cannot be
    carried are refused beforehand (goddp.ddp.refusals).

    If the build fails, a reducer with the previous settings and hooks is
    put back and the error re-raised; if even that fails, ReducerLost:
    without its autograd hooks DDP would silently skip the allreduce of
    every gradient, and training must stop rather than diverge.
    """
    # Everything that can be computed before the old reducer loses its hooks.
    parameters, expect_sparse = reducer_parameters(ddp)
    names = ddp._build_debug_param_to_name_mapping(parameters)
    previous_config = bucket_config(ddp) if config is not None else None
    previous_hooks = registered_comm_hooks(ddp)
    assignment = _assignment_of_current_buckets(ddp, parameters) if keep_buckets else None

    def build(with_config: Any, with_hooks: CommHooks) -> None:
        if with_config is not None:
            ddp._bucket_config = with_config
            ddp.bucket_bytes_cap_list = list(with_config.per_bucket_bytes_caps)
        if assignment is None:
            ddp._ddp_init_helper(parameters, expect_sparse, names, ddp.static_graph)
        else:
            original = dist._compute_bucket_assignment_by_size
            dist._compute_bucket_assignment_by_size = assignment
            try:
                ddp._ddp_init_helper(parameters, expect_sparse, names, ddp.static_graph)
            finally:
                dist._compute_bucket_assignment_by_size = original
        register_comm_hooks(ddp, with_hooks)
        _carry_reducer_modes(ddp)
        _restart_static_graph(ddp)
        if in_forward and ddp.require_backward_grad_sync:
            ddp.reducer.prepare_for_forward()

    with _rebuild_lock:
        ddp.reducer._remove_autograd_hooks()
        try:
            build(config, previous_hooks if hooks is None else list(hooks))
        except Exception as exc:
            try:
                build(previous_config, previous_hooks)
            except Exception as again:
                raise ReducerLost(
                    "goddp: rebuilding DDP's reducer failed twice (with the new settings: "
                    f"{type(exc).__name__}: {exc}; with the previous ones: {type(again).__name__}: {again}); "
                    "DDP can no longer reduce gradients"
                ) from again
            raise


def _assignment_of_current_buckets(ddp: Any, parameters: Sequence[torch.Tensor]) -> Callable[..., Any]:
    """A stand-in for ``dist._compute_bucket_assignment_by_size`` that
    returns the buckets DDP has now."""
    buckets = current_buckets(ddp)
    sizes = [sum(parameters[i].numel() * parameters[i].element_size() for i in b) for b in buckets]

    def assignment(*_args: Any, **_kwargs: Any) -> tuple[list[list[int]], list[int]]:
        # DDP reverses what it gets (it assumes forward order); hand it the
        # reverse of the reducer order.
        return [list(b) for b in reversed(buckets)], list(reversed(sizes))

    return assignment


# Note [Static graph across a rebuild]: with static_graph=True DDP's
# reducer spends its first iteration recording: its autograd hooks only
# count each gradient, and ``_DDPSink`` (wrapped around the outputs by DDP's
# post-forward while ``_static_graph_delay_allreduce_enqueued`` is False)
# queues ``reducer._delay_all_reduce`` at the end of that backward, which
# reduces every bucket at once and learns the unused parameters; from the
# second iteration the hooks reduce, and the buckets are rebuilt from that
# iteration's gradient order. A fresh reducer knows nothing of static_graph
# (DDP's constructor and __setstate__ set it apart from _ddp_init_helper,
# before any forward), so it is set on the new reducer and its logger
# before it is told of a forward, and DDP is told that no delayed allreduce
# is queued yet: the new reducer runs DDP's recording first iteration
# again, at a forward whose post-forward is still to come (a rebuild inside
# DDP's forward, or between steps), and then rebuilds its buckets to the
# new caps. A reducer rebuilt between a forward and its backward would have
# no _DDPSink to queue its delayed allreduce: that backward would reduce
# nothing, so none is made there (goddp.trace refuses to be left there:
# Trace.close).


def _restart_static_graph(ddp: Any) -> None:
    """Sets static_graph on DDP's fresh reducer as DDP's constructor does
    (Note [Static graph across a rebuild])."""
    if not getattr(ddp, "static_graph", False):
        return
    ddp.reducer._set_static_graph()
    ddp.logger._set_static_graph()
    ddp._static_graph_delay_allreduce_enqueued = False


def _carry_reducer_modes(ddp: Any) -> None:
    """Sets on DDP's new reducer the modes the user (or DDP's lazy init or
    constructor) set on the old one and DDP keeps no other record of: manual
    backward finalization, optimizer-in-backward, the parameter dtype of DDP
    mixed precision."""
    reducer = ddp.reducer
    mixed = getattr(ddp, "mixed_precision", None)
    if mixed is not None:
        # DDP's constructor tells the reducer the low-precision parameter
        # dtype (its gradients arrive in it); _ddp_init_helper does not.
        reducer._set_mixed_precision_param_dtype(mixed.param_dtype)
    if getattr(ddp, "_require_manual_backward_finalization", False):
        reducer._set_manual_finalization_required(True)
    if getattr(ddp, "_lazy_init_ran", False) and any(
        hasattr(p, "_in_backward_optimizers") for p in ddp._module_parameters
    ):
        # DDP's lazy init (its first pre-forward) set this on the old reducer.
        reducer._set_optimizer_in_backward()
