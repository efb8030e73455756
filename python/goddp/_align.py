"""Make DDP's gradient buckets the pieces that goddp cut (why: docs/align.md).

goddp installs each piece's byte total as DDP's per-bucket caps and rebuilds
DDP's reducer. The rebuild happens at the DDP module's first training call,
inside DDP's forward (after DDP's pre-forward, before its post-forward),
never while Dynamo traces with fake tensors, and only if every rank of the
module's process group proposes the very same caps (goddp._agreement
decides). It only touches DDP modules where that is known to be safe;
``alignment_blocker``, ``coverage_blocker`` and ``rebuild_blocker`` name the
reason otherwise and goddp keeps DDP's own buckets (the plan's cuts still
apply).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
import torch.distributed as dist

from goddp._export import parameter_names


# Set on a DDP module once goddp has installed its caps: the caps, and DDP's
# own bucket settings from before, which planning keeps reading.
ALIGNED_CAPS_ATTR = "_goddp_aligned_caps"
ORIGINAL_CONFIG_ATTR = "_goddp_original_bucket_config"


def ddp_parameters(ddp: Any) -> list[torch.nn.Parameter]:
    """The parameters DDP's reducer manages (trainable and not ignored), in
    DDP's own index order."""
    parameters, _ = ddp._build_params_for_reducer()
    return list(parameters)


STAND_IN = (
    "not a DDP module (no process group or reducer, a stand-in such as torch's FakeDDP): "
    "planned and cut; no agreement across ranks and DDP's buckets left alone"
)


def stand_in_blocker(ddp: Any) -> str | None:
    """STAND_IN for a module that marks itself as DDP's active module but has
    no process group or reducer (what torch's own DDPOptimizer tests use);
    None for a real DDP."""
    if getattr(ddp, "process_group", None) is None or getattr(ddp, "reducer", None) is None:
        return STAND_IN
    return None


def alignment_blocker(ddp: Any) -> str | None:
    """Why goddp must leave this DDP module's buckets alone, or None."""
    try:
        return _settings_blocker(ddp)
    except Exception as exc:  # a DDP whose private API differs: leave it alone
        return f"could not inspect DDP ({type(exc).__name__}: {exc})"


def _settings_blocker(ddp: Any) -> str | None:
    if not hasattr(ddp, "_bucket_config") or not hasattr(ddp._bucket_config, "per_bucket_bytes_caps"):
        return "this torch's DDP has no per-bucket caps (needs torch >= 2.9)"
    if getattr(ddp, "_use_python_reducer", False):
        return "DDP uses the Python reducer, which has no per-bucket caps"
    if ddp.static_graph:
        return "static_graph=True: DDP's delayed-allreduce setup is not rebuilt by goddp"
    if getattr(ddp, "mixed_precision", None) is not None:
        return "DDP mixed precision is on"
    logging_data = ddp._get_ddp_logging_data()
    if logging_data.get("comm_hook") and not ddp._comm_hooks:
        # A built-in hook (or fused optimizer) is registered on the reducer and
        # DDP keeps no record from which to register it again.
        return f"a built-in comm hook ({logging_data.get('comm_hook')}) is registered"
    if getattr(ddp, "_delay_all_reduce_params", None):
        return "delay_all_reduce_named_params is set: those parameters bypass DDP's buckets"
    keys = {(p.dtype, p.device) for p in ddp_parameters(ddp)}
    if len(keys) != 1:
        return f"parameters span {len(keys)} (dtype, device) groups; DDP buckets each group apart"
    return None


def coverage_blocker(ddp: Any, bucket_param_names: Sequence[Sequence[str]]) -> str | None:
    """Why the planned buckets cannot be DDP's: they must hold exactly DDP's
    parameters. ``bucket_param_names`` lists, per bucket, fully qualified
    names relative to the DDP-wrapped module."""
    try:
        names = parameter_names(ddp.module)
        parameters = ddp_parameters(ddp)
    except Exception as exc:
        return f"could not inspect DDP ({type(exc).__name__}: {exc})"
    expected = sorted(names.get(id(p), "?") for p in parameters)
    planned = sorted(name for bucket in bucket_param_names for name in bucket)
    if planned != expected:
        return (
            f"the graph uses {len(planned)} of DDP's {len(expected)} parameters "
            "(a graph break, or parameters used outside this graph); DDP buckets the whole model"
        )
    return None


def rebuild_blocker(ddp: Any) -> str | None:
    """Why DDP's reducer cannot be replaced right now, or None. Asked at the
    first training call, where the rebuild would happen."""
    join_config = getattr(ddp, "_join_config", None)
    if getattr(join_config, "enable", False):
        # DDP's pre-forward has just handed the old reducer this step's
        # Join work handle, which cannot be read back to hand it on.
        return "the first training step runs inside a Join context, whose state lives in DDP's reducer"
    # A module that trained before (DDP rebuilt its buckets) can still be
    # aligned: nobody installs before the ranks decided, and a failed install
    # gives every rank a fresh reducer alike (Note [Agreeing on DDP's layout]).
    return None


class ReducerLost(RuntimeError):
    """DDP's reducer could not be rebuilt: gradients would not be reduced."""


def install_bucket_caps(ddp: Any, caps_bytes: Sequence[int]) -> bool:
    """Gives DDP per-bucket caps ``caps_bytes`` (DDP order) and rebuilds its
    reducer so that its next bucket rebuild uses them. Must run inside DDP's
    forward, after its pre-forward. Returns False if the caps were already in
    place."""
    # A bucket of zero-byte parameters only (possible for the forward-first
    # piece) gets cap 1 rather than 0, which would make DDP give each of
    # them a bucket of its own.
    caps = tuple(max(1, int(c)) for c in caps_bytes)
    if getattr(ddp, ALIGNED_CAPS_ATTR, None) == caps:
        return False
    if not hasattr(ddp, ORIGINAL_CONFIG_ATTR):
        setattr(ddp, ORIGINAL_CONFIG_ATTR, ddp._bucket_config)
    _replace_reducer(ddp, dataclasses.replace(ddp._bucket_config, per_bucket_bytes_caps=caps))
    setattr(ddp, ALIGNED_CAPS_ATTR, caps)
    return True


def remove_bucket_caps(ddp: Any) -> bool:
    """Undoes install_bucket_caps: a reducer with DDP's own bucket settings.
    Same conditions; returns False if goddp's caps were not in place."""
    if not hasattr(ddp, ALIGNED_CAPS_ATTR):
        return False
    _replace_reducer(ddp, getattr(ddp, ORIGINAL_CONFIG_ATTR))
    delattr(ddp, ALIGNED_CAPS_ATTR)
    return True


def _replace_reducer(ddp: Any, config: Any) -> None:
    """Rebuilds DDP's reducer under bucket settings config. If that fails,
    puts one with the previous settings back and re-raises; if even that
    fails, raises ReducerLost: without its autograd hooks DDP would silently
    skip the allreduce of every gradient, and training must stop rather than
    diverge."""
    # Everything that can be computed before the old reducer loses its hooks.
    parameters, expect_sparse_gradient = ddp._build_params_for_reducer()
    param_to_name_mapping = ddp._build_debug_param_to_name_mapping(parameters)
    previous = ddp._bucket_config
    rebuild_args = (parameters, expect_sparse_gradient, param_to_name_mapping)

    ddp.reducer._remove_autograd_hooks()
    try:
        _rebuild_reducer(ddp, config, *rebuild_args)
    except Exception as exc:
        try:
            _rebuild_reducer(ddp, previous, *rebuild_args)
        except Exception as again:
            raise ReducerLost(
                "goddp: rebuilding DDP's reducer failed twice (with the new bucket caps: "
                f"{type(exc).__name__}: {exc}; with the previous ones: {type(again).__name__}: {again}); "
                "DDP can no longer reduce gradients"
            ) from again
        raise


def carry_reducer_modes(ddp: Any) -> None:
    """Sets on DDP's new reducer the modes the user (or DDP's lazy init) set
    on the old one and DDP keeps no other record of: manual backward
    finalization, optimizer-in-backward. Every rebuild of the reducer, by
    goddp's alignment or by goddp.trace, calls this."""
    reducer = ddp.reducer
    if getattr(ddp, "_require_manual_backward_finalization", False):
        reducer._set_manual_finalization_required(True)
    if getattr(ddp, "_lazy_init_ran", False) and any(
        hasattr(p, "_in_backward_optimizers") for p in ddp._module_parameters
    ):
        # DDP's lazy init (its first pre-forward) set this on the old reducer.
        reducer._set_optimizer_in_backward()


def _rebuild_reducer(ddp: Any, config: Any, parameters, expect_sparse_gradient, param_to_name_mapping) -> None:
    """A new reducer (with autograd hooks) for ddp under bucket settings
    config, carrying what the user set on the old one, in the state DDP's
    pre-forward leaves one in.

    DDP's own __setstate__ is the model: it rebuilds the reducer and then
    re-applies settings that live in the C++ reducer. Carried here: comm
    hooks (DDP keeps a list; optimizer-in-backward and fused optimizers are
    registered as comm hooks), the comm hook's name in DDP's logging data,
    manual backward finalization, optimizer-in-backward mode. Settings that
    cannot be carried block the rebuild beforehand (alignment_blocker,
    rebuild_blocker).
    """
    ddp._bucket_config = config
    ddp.bucket_bytes_cap_list = list(config.per_bucket_bytes_caps)
    ddp._ddp_init_helper(parameters, expect_sparse_gradient, param_to_name_mapping, ddp.static_graph)
    reducer = ddp.reducer
    for hook, state in ddp._comm_hooks:
        ddp.logger._set_comm_hook_name(hook.__qualname__)
        dist._register_comm_hook(reducer, state, hook)
    carry_reducer_modes(ddp)
    if ddp.require_backward_grad_sync:
        # DDP's pre-forward already told the old reducer that a forward began.
        reducer.prepare_for_forward()
