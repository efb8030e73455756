"""Validation of the goddp backend's options.

Options arrive either as keyword arguments of ``goddp.backend(**options)`` or
as the ``options=`` dict of ``torch.compile(m, backend="goddp", options=...)``.
Every bad key or value raises ValueError naming what is accepted, so a typo
never silently changes behaviour.
"""

from __future__ import annotations

import warnings

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from torch._dynamo.backends.registry import list_backends

MODES = ("ddp", "torch")

# The values of option "edges" (Options.edges says what each does).
EDGE_CHOICES = ("auto", "compile", "eager")

# The inner compilers most users pick; any other registered Dynamo backend
# name (or a callable) is accepted as well.
COMMON_INNER = ("inductor", "aot_eager", "eager")

OPTION_KEYS = (
    "inner",
    "inner_options",
    "mode",
    "bucket_cap_mb",
    "first_bucket_cap_mb",
    "max_pieces",
    "align_buckets",
    "block_cuts",
    "edges",
    "strict",
    "log_plan",
    "check_plans",
)


@dataclass(frozen=True)
class Options:
    """The validated options of one goddp backend instance.

    inner: the compiler each piece goes to: a registered Dynamo backend name
        ("inductor", "aot_eager", "eager", ...) or a callable
        ``(gm, example_inputs) -> callable``.
    inner_options: keyword ``options=`` handed to a named inner backend
        (Inductor's config dict, for instance); None for none.
    mode: "ddp" cuts where DDP's rebuilt buckets close; "torch" reproduces
        torch's DDPOptimizer.
    bucket_cap_mb / first_bucket_cap_mb: override the DDP module's caps (MiB).
    max_pieces: at most this many pieces (ddp mode), decoupling the piece
        count from the bucket size; None for no limit.
    align_buckets: ddp mode: make DDP's own buckets the pieces
        (docs/align.md); on by default in ddp mode, off in torch mode.
    block_cuts: ddp mode: cut at the boundaries of repeated module blocks
        (transformer layers) so that identical pieces are compiled once,
        each DDP bucket spanning several consecutive pieces; on by default
        in ddp mode, off in torch mode. Without repeated blocks the cuts are
        byte-driven either way.
    edges: with block cuts, what runs the pieces wholly before the first
        repeated block or after the last (embeddings, final norm and head):
        "auto" (None means it) runs each eagerly when it is no bigger than
        the mean block, as regional compilation does (why:
        goddp.graph.blocks, "Edges"); "compile" compiles them with the inner
        compiler; "eager" runs them eagerly whatever their size.
    strict: raise instead of warning and compiling the whole graph when
        planning or a piece's compilation fails, and raise PlanMismatchError
        when the ranks' layouts for DDP's buckets differ.
    log_plan: log the bucket table at INFO on logger "goddp".
    check_plans: deprecated, no effect: the ranks compare the layout of
        DDP's buckets, not their plans (Note [Agreeing on DDP's layout]);
        strict=True makes differing layouts an error.
    """

    inner: str | Callable[..., Any] = "inductor"
    inner_options: Mapping[str, Any] | None = None
    mode: str = "ddp"
    bucket_cap_mb: float | None = None
    first_bucket_cap_mb: float | None = None
    max_pieces: int | None = None
    align_buckets: bool | None = None  # None: on in ddp mode, off in torch mode
    block_cuts: bool | None = None  # None: on in ddp mode, off in torch mode
    edges: str | None = None  # None: "auto" wherever block cuts apply
    strict: bool = False
    log_plan: bool = True
    check_plans: bool = True
    # Not an option: set by goddp_backend from torch.compile(mode=...), and
    # forwarded to a named inner backend that understands it (Inductor).
    compile_mode: str | None = field(default=None, compare=False)

    def with_compile_mode(self, compile_mode: str | None) -> "Options":
        return replace(self, compile_mode=compile_mode)

    @property
    def aligns_buckets(self) -> bool:
        return self.mode == "ddp" and self.align_buckets is not False

    @property
    def cuts_at_blocks(self) -> bool:
        return self.mode == "ddp" and self.block_cuts is not False

    @property
    def edge_policy(self) -> str:
        """What runs the edge pieces (EDGE_CHOICES); "compile" where the
        graph is not cut at blocks, so that there are no edges to treat."""
        if not self.cuts_at_blocks:
            return "compile"
        return self.edges or "auto"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_cap(key: str, value: Any) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"goddp option {key!r} must be a number of MiB greater than 0 "
            f"(or None to use the DDP module's setting), got {value!r}"
        )
    return float(value)


def _check_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"goddp option {key!r} must be True or False, got {value!r}")
    return value


def _check_inner(value: Any) -> str | Callable[..., Any]:
    if callable(value) and not isinstance(value, str):
        return value
    if not isinstance(value, str):
        raise ValueError(
            "goddp option 'inner' must be a Dynamo backend name "
            f"(for example {', '.join(repr(c) for c in COMMON_INNER)}) or a callable, "
            f"got {value!r}"
        )
    if value == "goddp":
        raise ValueError(
            "goddp option 'inner' cannot be 'goddp' itself; choose the compiler for "
            f"each piece, for example {', '.join(repr(c) for c in COMMON_INNER)}"
        )
    if value in COMMON_INNER:
        return value
    # Only unusual names pay for the registry scan.
    known = list_backends(exclude_tags=())
    if value not in known:
        choices = [b for b in known if b != "goddp"]
        raise ValueError(
            f"goddp option 'inner' names an unknown Dynamo backend {value!r}; "
            f"valid choices: {', '.join(repr(c) for c in choices)} (or a callable)"
        )
    return value


def check_mode(mode: Any) -> str:
    """goddp's cutting mode, "ddp" or "torch"."""
    if mode not in MODES:
        raise ValueError(f"goddp option 'mode' must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
    return mode


def check_max_pieces(max_pieces: Any) -> int | None:
    if max_pieces is not None and (
        not isinstance(max_pieces, int) or isinstance(max_pieces, bool) or max_pieces < 1
    ):
        raise ValueError(f"goddp option 'max_pieces' must be an int >= 1 or None (no limit), got {max_pieces!r}")
    return max_pieces


def _check_mode_default(key: str, value: Any, if_true: str, if_false: str) -> bool | None:
    """A switch whose None means the mode's default (align_buckets,
    block_cuts)."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(
            f"goddp option {key!r} must be True ({if_true}), False ({if_false}) "
            f"or None (the mode's default), got {value!r}"
        )
    return value


def check_edges(edges: Any) -> str | None:
    if edges is not None and edges not in EDGE_CHOICES:
        raise ValueError(
            f"goddp option 'edges' must be one of {', '.join(repr(c) for c in EDGE_CHOICES)} "
            f"or None (meaning 'auto'), got {edges!r}"
        )
    return edges


def check_ddp_mode_only(
    mode: str,
    max_pieces: int | None,
    align_buckets: bool | None,
    block_cuts: bool | None = None,
    edges: str | None = None,
) -> None:
    """max_pieces, align_buckets, block_cuts and edges change what ddp mode
    plans or compiles; torch mode reproduces torch's DDPOptimizer and has
    none of them. The one owner of this rule on the Python side
    (goddp.plan_graph_module checks through it too)."""
    if max_pieces is not None and mode != "ddp":
        raise ValueError(
            "goddp option 'max_pieces' applies only to mode='ddp' "
            f"(mode='torch' reproduces torch's DDPOptimizer exactly), got mode={mode!r}"
        )
    if align_buckets and mode != "ddp":
        raise ValueError(
            "goddp option 'align_buckets' applies only to mode='ddp' "
            f"(mode='torch' leaves DDP's buckets alone, as torch's DDPOptimizer does), got mode={mode!r}"
        )
    if block_cuts and mode != "ddp":
        raise ValueError(
            "goddp option 'block_cuts' applies only to mode='ddp' "
            f"(mode='torch' reproduces torch's DDPOptimizer exactly), got mode={mode!r}"
        )
    if edges is not None and (mode != "ddp" or block_cuts is False):
        raise ValueError(
            "goddp option 'edges' applies only to graphs cut at repeated blocks (mode='ddp' with "
            f"block_cuts on), got mode={mode!r}, block_cuts={block_cuts!r}"
        )


CHECK_PLANS_DEPRECATED = (
    "goddp option 'check_plans' is deprecated and has no effect: the ranks of a DDP module now "
    "compare what DDP will communicate (the layout of its buckets), not how each rank's graph looks, "
    "and ranks whose layouts differ keep DDP's own buckets and train on (README.md, 'Several ranks'). "
    "Pass strict=True to make differing layouts an error."
)
_warned_check_plans = False


def _warn_check_plans() -> None:
    global _warned_check_plans
    if not _warned_check_plans:
        _warned_check_plans = True
        warnings.warn(CHECK_PLANS_DEPRECATED, DeprecationWarning, stacklevel=4)


def parse_options(raw: Mapping[str, Any] | None) -> Options:
    """Validates a mapping of options and returns an Options.

    Raises ValueError naming the valid keys (for an unknown key) or the valid
    values (for a bad value).
    """
    raw = dict(raw or {})
    unknown = sorted(k for k in raw if k not in OPTION_KEYS)
    if unknown:
        raise ValueError(
            f"unknown goddp option(s) {', '.join(repr(k) for k in unknown)}; "
            f"valid keys: {', '.join(OPTION_KEYS)}"
        )
    values: dict[str, Any] = {}
    if "inner" in raw:
        values["inner"] = _check_inner(raw["inner"])
    if "inner_options" in raw:
        inner_options = raw["inner_options"]
        if inner_options is not None and not isinstance(inner_options, Mapping):
            raise ValueError(
                "goddp option 'inner_options' must be a dict (passed as options= to "
                f"the inner backend) or None, got {inner_options!r}"
            )
        values["inner_options"] = dict(inner_options) if inner_options else None
    if "mode" in raw:
        values["mode"] = check_mode(raw["mode"])
    for key in ("bucket_cap_mb", "first_bucket_cap_mb"):
        if key in raw:
            values[key] = _check_cap(key, raw[key])
    if "max_pieces" in raw:
        values["max_pieces"] = check_max_pieces(raw["max_pieces"])
    for key in ("strict", "log_plan", "check_plans"):
        if key in raw:
            values[key] = _check_bool(key, raw[key])
    if "check_plans" in raw:
        _warn_check_plans()
    if "align_buckets" in raw:
        values["align_buckets"] = _check_mode_default(
            "align_buckets", raw["align_buckets"], "DDP's buckets close at the cuts", "DDP keeps its own"
        )
    if "block_cuts" in raw:
        values["block_cuts"] = _check_mode_default(
            "block_cuts", raw["block_cuts"], "cut at repeated module blocks", "byte-driven cuts"
        )
    if "edges" in raw:
        values["edges"] = check_edges(raw["edges"])

    options = Options(**values)
    check_ddp_mode_only(options.mode, options.max_pieces, options.align_buckets, options.block_cuts, options.edges)
    if (
        options.bucket_cap_mb is not None
        and options.first_bucket_cap_mb is not None
        and options.first_bucket_cap_mb > options.bucket_cap_mb
    ):
        raise ValueError(
            "goddp option 'first_bucket_cap_mb' must be <= 'bucket_cap_mb', got "
            f"{options.first_bucket_cap_mb!r} > {options.bucket_cap_mb!r}"
        )
    return options
