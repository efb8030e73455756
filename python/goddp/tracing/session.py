"""goddp.trace's public object, ``Trace``: entering and leaving, agreed by
every rank of the DDP module's group, and its records (see goddp.tracing)."""

from __future__ import annotations

import itertools
import logging
import os
import threading
from typing import Any

import torch.distributed as dist

from goddp.ddp.private import ddp_parameters
from goddp.ddp.refusals import trace_refusal
from goddp.ddp.state import state_of
from goddp.graph.export import parameter_names
from goddp.ranks.group import group_of, round_error, store_for, timeout_s
from goddp.ranks.store_round import gather, publish, unanimous
from goddp.reports.records import last_plans
from goddp.tracing.figures import format_summary, median_step, normalized, report, verdict
from goddp.tracing.install import Installation, unwrap_ddp
from goddp.tracing.prediction import predicted_row
from goddp.tracing.recorder import TraceError, Recorder
from goddp.tracing.summary import MEASURED_COLOR, PREDICTED_COLOR, plot_steps

logger = logging.getLogger("goddp")

DEFAULT_TIMEOUT_S = 300.0
# Steps kept per trace; older ones are dropped (a trace left open for a
# whole run must not grow without bound).
MAX_STEPS = 1000


# --------------------------------------------------------------------------
# Agreeing across ranks


TIMEOUT_ENV = "GODDP_TRACE_TIMEOUT"

_seq_lock = threading.Lock()
_seqs: dict[str, "itertools.count[int]"] = {}


class _Rounds:
    """This trace's rounds and records in the c10d store, for the DDP
    module's group (goddp.ranks: the group, the store, how a round settles)."""

    def __init__(self, ddp: Any, timeout: float) -> None:
        self.group = group_of(ddp, timeout)
        self.store = store_for(self.group)
        # The sequence counts this process's traces on that group, so each
        # trace gets keys of its own.
        with _seq_lock:
            seq = next(_seqs.setdefault(self.group.name, itertools.count()))
        self.prefix = f"goddp/trace/{self.group.name}/{seq}"

    def agree(self, phase: str, verdict: str) -> None:
        """Publishes this rank's verdict ("ok" or a reason) for `phase`;
        returns when every rank said "ok", else raises TraceError (on every
        rank alike: they follow the round's one outcome)."""
        ended = unanimous(self.store, f"{self.prefix}/{phase}", self.group, verdict, f"{phase} the trace")
        if ended.decision != "go":
            raise TraceError(round_error(phase, self.group, ended))

    def publish(self, record: dict[str, Any]) -> None:
        publish(self.store, f"{self.prefix}/record/{self.group.rank}", record)

    def gather(self, timeout: float) -> dict[int, dict[str, Any]]:
        """Every rank's published record; ranks that did not publish within
        `timeout` seconds are left out."""
        return gather(self.store, {r: f"{self.prefix}/record/{r}" for r in self.group.ranks}, timeout)


# --------------------------------------------------------------------------
# Plans goddp made for this model


def _attributed_plans(ddp: Any) -> list[dict[str, Any]]:
    """goddp_plans_for, never raising: a record must still be published
    when the attribution fails, since the other ranks gather it."""
    try:
        return goddp_plans_for(ddp)
    except Exception:  # the record matters more than its plans: the other ranks wait for it
        logger.debug("goddp.trace: could not attribute goddp's plans", exc_info=True)
        return []


def goddp_plans_for(ddp: Any) -> list[dict[str, Any]]:
    """The goddp plans (from ``goddp.last_plans()``) of this DDP module's
    graphs, oldest first, one per fingerprint; empty when goddp did not
    compile it (Note [A trace's plans])."""
    state = state_of(ddp, create=False)
    if state is None or state.key is None:
        return []
    return traced_plans(state.key, last_plans())


# Note [A trace's plans]
#
# A trace record lists the goddp plans of its DDP module's graphs: the
# plan records (goddp.last_plans()) whose "ddp_module" key is the
# module's, one per fingerprint (the latest record of a fingerprint wins
# and takes its place, so the list stays oldest first), and only records
# with buckets (a graph without DDP's parameters has none). Each is
# projected to what the trace shows: the fingerprint as 16 hex digits
# (None when planning failed), the buckets' bytes and parameter names, and
# mode, num_pieces, ddp_buckets, fallback, ddp_module and forward as the
# record has them (None where absent).


def traced_plans(key: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plans of the DDP module whose key is `key` among plan records,
    as a trace record lists them (Note [A trace's plans])."""
    found: dict[Any, dict[str, Any]] = {}
    for record in records:
        buckets = record.get("buckets") or []
        if not buckets or (record.get("ddp_module") or {}).get("key") != key:
            continue
        fingerprint = record.get("fingerprint")
        found.pop(fingerprint, None)
        found[fingerprint] = _traced_plan(record, buckets)
    return list(found.values())


def _traced_plan(record: dict[str, Any], buckets: list[dict[str, Any]]) -> dict[str, Any]:
    fingerprint = record.get("fingerprint")
    return {
        "fingerprint": f"{fingerprint:016x}" if isinstance(fingerprint, int) else None,
        "mode": record.get("mode"),
        "num_pieces": record.get("num_pieces"),
        "bucket_bytes": [b["bytes"] for b in buckets],
        "bucket_param_names": [list(b.get("param_names", ())) for b in buckets],
        "ddp_buckets": record.get("ddp_buckets"),
        "fallback": record.get("fallback"),
        "ddp_module": record.get("ddp_module"),
        # The graphs planned together with this one (goddp.ranks.forward).
        "forward": record.get("forward"),
    }


# --------------------------------------------------------------------------
# The public object


class Trace:
    """A context manager recording one DDP module's allreduce timeline; see
    the module doc. Create it with ``goddp.trace(module)``."""

    def __init__(self, module: Any, *, timeout: float | None = None, max_steps: int = MAX_STEPS) -> None:
        self._ddp = unwrap_ddp(module)
        self._timeout = timeout_s(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, timeout, "goddp.trace")
        if max_steps < 1:
            raise ValueError(f"goddp.trace: max_steps must be at least 1, got {max_steps!r}")
        self._max_steps = max_steps
        self._rounds: _Rounds | None = None
        self._installation: Installation | None = None
        self._recorder: Recorder | None = None
        self._closed_record: dict[str, Any] | None = None
        self._hook_name = ""
        self._plans: list[dict[str, Any]] = []
        self._leave_tried = False

    # -- entering and leaving

    def __enter__(self) -> "Trace":
        if self._rounds is not None:
            raise TraceError("goddp.trace: this trace object was already entered; create a new one")
        ddp = self._ddp
        refusal = trace_refusal(ddp)
        rounds = self._rounds = _Rounds(ddp, self._timeout)
        try:
            rounds.agree("enter", refusal or "ok")
        except TraceError as refused:
            raise TraceError(f"{refused}; nothing was changed") from None
        recorder = self._recorder = Recorder(parameter_names(ddp.module), self._max_steps)
        installation = Installation(ddp, recorder)
        installation.install()
        self._installation = installation
        self._hook_name = installation.hook_name
        logger.info("goddp.trace: recording %s (comm hook: %s)", type(ddp.module).__name__, self._hook_name)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def close(self) -> None:
        """Leaves the trace (what ``with`` does on exit); idempotent."""
        installation, rounds = self._installation, self._rounds
        if installation is None or installation.removed or rounds is None or self._leave_tried:
            return
        recorder = installation.recorder
        verdict = "ok"
        if recorder.in_backward():
            verdict = "a backward of the traced module has not finished"
        elif recorder.pending_forward and self._ddp.find_unused_parameters:
            verdict = "a forward ran whose backward has not (find_unused_parameters=True)"
        elif recorder.pending_forward and self._ddp.static_graph:
            # Note [Static graph across a rebuild] in goddp.ddp.private
            verdict = "a forward ran whose backward has not (static_graph=True)"
        self._leave_tried = True
        try:
            rounds.agree("leave", verdict)
        except TraceError as refused:
            # Not every rank leaves now: keep the same reducer on all of them,
            # so they keep communicating alike. The hook passes through.
            raise TraceError(
                f"{refused}; DDP keeps goddp.trace's pass-through comm hook (same communication, same gradients)"
            ) from None
        finally:
            recorder.recording = False
        # Nothing that can fail on one rank alone may run between the agreed
        # "go" and the removal: every rank must change its reducer alike.
        installation.remove()
        self._plans = _attributed_plans(self._ddp)
        self._closed_record = self._record()
        rounds.publish(self._closed_record)

    # -- results

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The recorded steps (``StepRecord.to_dict``), oldest first."""
        return normalized(self._raw_steps())

    def _raw_steps(self) -> list[dict[str, Any]]:
        if self._recorder is None:
            return []
        return [s.raw(self._recorder.names) for s in list(self._recorder.steps)]

    def _record(self) -> dict[str, Any]:
        rounds = self._rounds
        record = {
            "rank": dist.get_rank() if dist.is_initialized() else 0,
            "ranks": list(rounds.group.ranks) if rounds else [],
            "module": type(self._ddp.module).__name__,
            "dtype_groups": len({(p.dtype, p.device) for p in ddp_parameters(self._ddp)}),
            "comm_hook": self._hook_name,
            "goddp_plans": self._plans or _attributed_plans(self._ddp),
            "steps": self._raw_steps(),
            "step_stats": [],
            "dropped_steps": self._recorder.dropped if self._recorder else 0,
            "verdict": "",
            "prediction": {"unavailable": "no figures"},
        }
        try:
            figures = report(record)
        except Exception as exc:
            # The record is still published: the other ranks gather it.
            logger.warning("goddp.trace: the figures of this rank's steps failed: %s", exc)
            logger.debug("goddp.trace: the figures' failure:", exc_info=True)
            record["verdict"] = f"no figures: {exc}"
            return record
        record.update(steps=figures["steps"], step_stats=figures["step_stats"], verdict=figures["verdict"],
                      prediction=figures["prediction"])
        return record

    def to_dict(self, gather: bool = False) -> dict[str, Any]:
        """This rank's record (JSON-serialisable); with gather=True, a dict
        {"ranks": {rank: record}} of every rank that published (see the
        module doc for the contract)."""
        mine = self._closed_record or self._record()
        if not gather:
            return mine
        return {"ranks": {str(r): rec for r, rec in self._gathered(mine).items()}}

    def _gathered(self, mine: dict[str, Any]) -> dict[int, dict[str, Any]]:
        if self._rounds is None or self._closed_record is None:
            raise TraceError("goddp.trace: gather=True needs a trace that was entered and left")
        records = self._rounds.gather(self._timeout)
        records[self._rounds.group.rank] = mine
        return dict(sorted(records.items()))

    def summary(self, gather: bool = False) -> str:
        """A readable table: per-bucket bytes, launch offset and duration of
        the median step, per-step figures, the verdict, goddp's plan."""
        mine = self.to_dict()
        if not gather:
            return format_summary(mine)
        records = self._gathered(mine)
        missing = [r for r in (self._rounds.group.ranks if self._rounds else []) if r not in records]
        text = "\n\n".join(format_summary(rec) for rec in records.values())
        if missing:
            text += f"\n\n(ranks {missing} had not published their trace within {self._timeout:g} s)"
        return text

    def plot(self, path: str | os.PathLike, gather: bool = False, title: str | None = None) -> str:
        """Writes the launch timeline as a PNG: one row per step of this rank,
        or with gather=True one row per rank (its median step); after them,
        in another colour, the timeline model's prediction for the median
        step (Note [Trace prediction]), one row per rank with gather=True."""
        if gather:
            records = self._gathered(self.to_dict())
            rows = [(f"rank {r}", median_step(rec["steps"])) for r, rec in records.items()]
            predicted = [predicted_row(f"rank {r}", rec.get("prediction") or {}) for r, rec in records.items()]
        else:
            mine = self.to_dict()
            rows = [(f"step {i}", s) for i, s in enumerate(mine["steps"])]
            prediction = mine.get("prediction") or {}
            predicted = [predicted_row(f"step {prediction.get('step')}", prediction)]
        title = title or f"{type(self._ddp.module).__name__}: {verdict(self.to_dict()['steps'])}"
        colors = [MEASURED_COLOR] * len(rows) + [PREDICTED_COLOR] * len(predicted)
        return plot_steps(path, rows + predicted, title, colors)


def trace(module: Any, *, timeout: float | None = None, max_steps: int = MAX_STEPS) -> Trace:
    """Records when each DDP bucket's allreduce runs relative to backward;
    use it as ``with goddp.trace(ddp_model) as tr: ...`` on every rank (see
    the goddp.trace module doc for what is recorded and the contract across
    ranks). `module`: a DistributedDataParallel module or torch.compile of
    one. `timeout`: seconds to wait for the other ranks (default
    GODDP_TRACE_TIMEOUT or 300). `max_steps`: steps kept (oldest dropped)."""
    return Trace(module, timeout=timeout, max_steps=max_steps)
