"""The goddp backend's options: the one table of them and the one validator.

Options arrive either as keyword arguments of ``goddp.backend(**options)`` or
as the ``options=`` dict of ``torch.compile(m, backend="goddp", options=...)``.
Every bad key or value raises ValueError naming what is accepted, so a typo
never silently changes behaviour.

``OPTIONS`` is the one place each option is documented (key, default, valid
values, meaning); the ``goddp.backend`` docstring and the README's options
table are rendered from it (``python -m goddp.options --markdown`` prints
the README's table; tests/python/package/test_options_doc.py checks that they
match), and the validator's messages use the same choices.
"""

from __future__ import annotations

import re
import sys
import warnings
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping

from torch._dynamo.backends.registry import list_backends

MODES = ("ddp", "torch")

# The values of option "edges" (OPTIONS says what each does).
EDGE_CHOICES = ("auto", "compile", "eager")

# The inner compilers most users pick; any other registered Dynamo backend
# name (or a callable) is accepted as well.
COMMON_INNER = ("inductor", "aot_eager", "eager")

BOOLS = (True, False)

# The planner takes caps in bytes and max_pieces as int64 (goddp_config in
# csrc/goddp.h), each cap at least one byte (planner/settings.go). A cap in
# MiB makes int(mb * MIB) bytes, as DDP's bucket_cap_mb does, so the caps
# it takes are exactly 2**-20 <= mb < 2**43: the one rule, here.
MIB = 1 << 20  # bytes per MiB, as DDP's bucket_cap_mb and goddp's caps count them
INT64_MAX = (1 << 63) - 1
AUTO = "auto"  # bucket_cap_mb chosen by measured cost
CAP_MB_RANGE = "a number of MiB from 2**-20 (1 byte) up to, not including, 2**43 (2**63 bytes)"


@dataclass(frozen=True)
class OptionDoc:
    """One row of the options table. Text is Markdown (code in backticks,
    links to README sections); ``choices`` are the exact values where they
    can be listed, shown first in the valid values."""

    key: str
    default_note: str  # what the default means, after its value ("" for nothing)
    valid: str  # the accepted values beyond ``choices`` ("" for none)
    meaning: str
    choices: tuple = ()
    deprecated: bool = False  # accepted, warned about, no effect: no default to show


OPTIONS: tuple[OptionDoc, ...] = (
    OptionDoc(
        "inner",
        "",
        "any registered Dynamo backend name but `\"goddp\"`, or a callable `(gm, example_inputs) -> callable`",
        "the compiler for each piece",
        COMMON_INNER,
    ),
    OptionDoc(
        "inner_options",
        "",
        "a dict or `None`",
        "passed as `options=` to a named inner backend (Inductor's config)",
    ),
    OptionDoc(
        "mode",
        "",
        "",
        "`\"ddp\"`: cut where DDP's buckets close; `\"torch\"`: reproduce torch's DDPOptimizer",
        MODES,
    ),
    OptionDoc(
        "bucket_cap_mb",
        ": the DDP module's",
        "a number of MiB, at least `2**-20` (1 byte) and below `2**43`, `\"auto\"` (`\"ddp\"` mode, "
        "buckets aligned), or `None`",
        "bucket cap, overriding the DDP module's; `\"auto\"` starts from the DDP module's cap, measures "
        "the backward and the allreduce over a few training steps, then sets the buckets that the "
        "planner's timeline model predicts fastest, on every rank or none "
        "([docs/auto-buckets.md](docs/auto-buckets.md))",
    ),
    OptionDoc(
        "first_bucket_cap_mb",
        ": the DDP module's (`\"torch\"` mode: 1 MiB)",
        "a number of MiB as for `bucket_cap_mb`, at most `bucket_cap_mb` when both are given, or `None`",
        "first-bucket cap",
    ),
    OptionDoc(
        "max_pieces",
        " (no limit)",
        "an int from 1 to `2**63 - 1`, or `None`; `\"ddp\"` mode only",
        "at most this many pieces, whatever the bucket size",
    ),
    OptionDoc(
        "align_buckets",
        ": the mode's default, on in `\"ddp\"` mode",
        "`True`, `False` or `None`; `True` only in `\"ddp\"` mode",
        "make DDP's own buckets close at the cuts ([docs/align.md](docs/align.md)); `False` leaves DDP's "
        "buckets alone",
    ),
    OptionDoc(
        "block_cuts",
        ": the mode's default, on in `\"ddp\"` mode",
        "`True`, `False` or `None`; `True` only in `\"ddp\"` mode",
        "cut at the boundaries of repeated module blocks (transformer layers) and compile each distinct "
        "piece once ([below](#behaviour-worth-knowing)); `False`: cut where buckets close",
    ),
    OptionDoc(
        "edges",
        ": `\"auto\"` where block cuts apply",
        "`None` (`\"auto\"`); only with block cuts",
        "what runs the pieces before the first repeated block and after the last (embeddings, final "
        "norm, head, a loss inside forward): `\"auto\"` runs an edge eagerly, as regional compilation "
        "does, only when what compiling it would save is under 2 % of the step, estimated from its shapes "
        "(a loss over a large vocabulary is compiled, a small head is not: "
        "[below](#behaviour-worth-knowing)); `\"compile\"` compiles them with `inner`; `\"eager\"` runs them "
        "eagerly whatever they cost, which saves their compile for short runs and quick experiments",
        EDGE_CHOICES,
    ),
    OptionDoc(
        "strict",
        "",
        "",
        "raise instead of warning and compiling the whole graph when planning or a piece's compilation "
        "fails, and raise `PlanMismatchError` when the ranks' layouts for DDP's buckets differ (see "
        "[Several ranks](#several-ranks))",
        BOOLS,
    ),
    OptionDoc("log_plan", "", "", "log the plan table at INFO on logger `goddp`", BOOLS),
    OptionDoc(
        "check_plans",
        "",
        "",
        "deprecated, no effect (a `DeprecationWarning` says so): the ranks compare DDP's layout, not their "
        "plans (see [Several ranks](#several-ranks))",
        BOOLS,
        deprecated=True,
    ),
)

OPTION_KEYS = tuple(o.key for o in OPTIONS)
# The plain switches: True or False, nothing else.
BOOL_KEYS = tuple(o.key for o in OPTIONS if o.choices == BOOLS)


@dataclass(frozen=True)
class Options:
    """The validated options of one goddp backend instance, one field per
    key of OPTIONS (which says what each means; None where the default
    depends on the mode or on the DDP module)."""

    inner: str | Callable[..., Any] = "inductor"
    inner_options: Mapping[str, Any] | None = None
    mode: str = "ddp"
    bucket_cap_mb: float | str | None = None  # AUTO: chosen by measured cost
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
    def bucket_cap_bytes(self) -> int | None:
        """bucket_cap_mb as the planner takes it (None: not given, or
        "auto", whose starting layout is the DDP module's cap)."""
        return None if self.auto_buckets else cap_bytes(self.bucket_cap_mb)

    @property
    def auto_buckets(self) -> bool:
        """bucket_cap_mb="auto" (Note [Buckets chosen by cost] in goddp.ranks.auto)."""
        return self.bucket_cap_mb == AUTO

    @property
    def first_bucket_cap_bytes(self) -> int | None:
        """first_bucket_cap_mb as the planner takes it (None: not given)."""
        return cap_bytes(self.first_bucket_cap_mb)

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


def cap_bytes(mb: float | None) -> int | None:
    """A cap in MiB that _check_cap accepted, in bytes as the planner takes
    it (None: not given): the one conversion."""
    return None if mb is None else int(mb * MIB)


def valid_cap_bytes(nbytes: int) -> bool:
    """Whether the planner takes nbytes as a cap."""
    return 1 <= nbytes <= INT64_MAX


def _check_cap(key: str, value: Any) -> float | None:
    if value is None:
        return None
    # 2**-20 <= value < 2**43 is exactly valid_cap_bytes(cap_bytes(value)),
    # without the float overflow of a huge value; NaN fails it too.
    if not _is_number(value) or not 2.0**-20 <= value < 2.0**43:
        auto = ", 'auto' to choose the buckets by measured cost" if key == "bucket_cap_mb" else ""
        raise ValueError(
            f"goddp option {key!r} must be {CAP_MB_RANGE}{auto}, or None to use the DDP module's setting; "
            f"got {value!r}"
        )
    return float(value)


def _check_auto(options: Options) -> None:
    """bucket_cap_mb="auto" needs what it chooses for: DDP's buckets set by
    goddp ("ddp" mode, aligned), and every bucket its own choice."""
    if not options.aligns_buckets:
        raise ValueError(
            "goddp option bucket_cap_mb='auto' sets DDP's buckets, so it needs mode='ddp' with "
            f"align_buckets True or None; got mode={options.mode!r}, align_buckets={options.align_buckets!r}"
        )
    if options.first_bucket_cap_mb is not None:
        raise ValueError(
            "goddp option 'first_bucket_cap_mb' must be None with bucket_cap_mb='auto', which chooses "
            f"every bucket, the first too; got {options.first_bucket_cap_mb!r}"
        )


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
        not isinstance(max_pieces, int) or isinstance(max_pieces, bool) or not 1 <= max_pieces <= INT64_MAX
    ):
        raise ValueError(
            f"goddp option 'max_pieces' must be an int >= 1 or None (no limit), at most 2**63 - 1; got {max_pieces!r}"
        )
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
            values[key] = AUTO if key == "bucket_cap_mb" and raw[key] == AUTO else _check_cap(key, raw[key])
    if "max_pieces" in raw:
        values["max_pieces"] = check_max_pieces(raw["max_pieces"])
    for key in BOOL_KEYS:
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
    if options.auto_buckets:
        _check_auto(options)
    elif (
        options.bucket_cap_mb is not None
        and options.first_bucket_cap_mb is not None
        and options.first_bucket_cap_mb > options.bucket_cap_mb
    ):
        raise ValueError(
            "goddp option 'first_bucket_cap_mb' must be <= 'bucket_cap_mb', got "
            f"{options.first_bucket_cap_mb!r} > {options.bucket_cap_mb!r}"
        )
    return options


# -- rendering the table: the README's options table, goddp.backend's docstring


def default_of(key: str) -> Any:
    """The default value of option key (the Options field's)."""
    return {f.name: f.default for f in fields(Options)}[key]


def _code(value: Any) -> str:
    return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def default_cell(doc: OptionDoc) -> str:
    return "—" if doc.deprecated else _code(default_of(doc.key)) + doc.default_note


def valid_cell(doc: OptionDoc) -> str:
    return ", ".join([_code(c) for c in doc.choices] + ([doc.valid] if doc.valid else []))


def markdown_table() -> str:
    """The README's options table (between its goddp-options markers)."""
    rows = ["| key | default | valid values | meaning |", "|---|---|---|---|"]
    rows += [f"| `{d.key}` | {default_cell(d)} | {valid_cell(d)} | {d.meaning} |" for d in OPTIONS]
    return "\n".join(rows) + "\n"


def _plain(markdown: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\(#([^)]*)\)", r"README.md#\2", markdown)
    text = re.sub(r"\[([^\]]*)\]\(([^)]*)\)", r"\2", text)
    return text.replace("`", "")


def options_text() -> str:
    """The options as plain text, one item each (goddp.backend's docstring)."""
    out = []
    for d in OPTIONS:
        out.append(f"- {d.key} (default {_plain(default_cell(d))}): {_plain(valid_cell(d))}.\n"
                   f"  {_plain(d.meaning)}.")
    return "\n".join(out) + "\n"


README_BEGIN = "<!-- options table: generated by `python -m goddp.options --readme README.md` -->"
README_END = "<!-- end of options table -->"


def with_readme_table(readme: str) -> str:
    """readme with the text between its options-table markers replaced by
    markdown_table(); ValueError when the markers are missing."""
    start, end = readme.find(README_BEGIN), readme.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no options table markers ({README_BEGIN!r} ... {README_END!r})")
    return readme[: start + len(README_BEGIN)] + "\n" + markdown_table() + readme[end:]


def main(argv: list[str] | None = None) -> int:
    """python -m goddp.options [--markdown | --readme README.md]: print the
    options (as text, or as the README's Markdown table), or rewrite the
    README's table in place."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == []:
        sys.stdout.write(options_text())
    elif argv == ["--markdown"]:
        sys.stdout.write(markdown_table())
    elif len(argv) == 2 and argv[0] == "--readme":
        with open(argv[1], encoding="utf-8") as f:
            text = f.read()
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(with_readme_table(text))
    else:
        print("usage: python -m goddp.options [--markdown | --readme README.md]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
