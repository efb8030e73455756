"""goddp.trace: when does each DDP bucket's allreduce run, relative to backward?

(This package is goddp.tracing; ``goddp.trace`` is its ``trace`` function.
Its modules: ``recorder``, what is recorded; ``figures``, what is derived
from it, the summary text included; ``prediction``, the planner's timeline
model fed with it (Note [Trace prediction]); ``install``,
the hooks on DDP; ``session``, the ``Trace`` object and its agreement
across ranks; ``summary``, the picture.)

    with goddp.trace(ddp_model) as tr:      # every rank of the DDP group
        for batch in batches:               # a few ordinary training steps
            train_step(batch)
    print(tr.summary())                     # per-bucket and per-step table, verdict, prediction
    tr.plot("overlap.png")                  # launch timeline, one row per step
    json.dumps(tr.to_dict())

Works on any DistributedDataParallel module: eager, compiled with goddp, or
compiled with torch's DDPOptimizer (pass the DDP module or what
``torch.compile`` returned for it).

What is recorded, per step (one backward pass that reduced gradients):
- backward start: the moment the gradient reaches the DDP module's output
  (a pre-hook on the output's autograd node, added by wrapping DDP's
  ``_post_forward`` for the duration of the trace). The loss's own backward
  before that is not the model's and is left out.
- backward compute end: an autograd-engine final callback queued at backward
  start. The engine runs final callbacks in the order they were queued, and
  DDP's reducer queues its own (which waits for every allreduce) only when
  the first gradient is ready, so ours runs after the last autograd node and
  before DDP starts waiting: it marks when backward would have returned
  without communication. A second callback, queued from the first, runs
  after DDP's and marks when ``loss.backward()`` really returns.
- per bucket: bytes, parameters, when the comm hook was called (launch) and
  when the future it returned completed (done). The duration includes
  waiting for the slower ranks to launch the same bucket.
- on a CUDA device every time is a CUDA event on the current stream, not the
  host's clock (Note [Trace clocks on CUDA] in goddp.tools.timing).

What the figures mean (exposed communication, the overlapped share, a
bucket launched during backward, the median step) is Note [Trace figures]
in goddp.tracing.figures, which computes them.

How it hooks DDP (goddp.tracing.install): DDP's C++ reducer takes one comm
hook, once, and cannot forget it. Entering the trace registers a timing hook
that either chains to the user's Python hook or performs DDP's own default
reduction with DDP's own arithmetic (so gradients are bit-identical); where a
hook is already registered (at the start of the next forward), or when
leaving, DDP gets a fresh reducer built by DDP's own ``_ddp_init_helper``
with exactly the buckets it has now, and the comm hooks it should have.
Built-in C++ hooks cannot be wrapped and are refused.

Ranks (the contract): entering and leaving the trace are collective over the
DDP module's process group. Every rank must enter at the same step and leave
at the same step, because a fresh reducer makes DDP re-derive its buckets
after its next step, which includes a broadcast. Each rank waits for the
others through the c10d store (see Note [The store, not the process group]
in goddp.ranks.group) for at most
``timeout`` seconds (``GODDP_TRACE_TIMEOUT``, default 300); all ranks then
follow one decision: if any rank refused or did not arrive, nobody changes
anything (on entry) and ``TraceError`` is raised on every rank that arrived;
if they do not leave together, every rank keeps the trace's hook, which
then only passes through, so that all still communicate alike. Enter and
leave between steps; leaving between a forward and its backward is handled
too (the fresh reducer is armed as DDP's forward armed the old one).
When leaving, each rank also publishes its record in the store, so
``summary(gather=True)`` and ``to_dict(gather=True)`` on any rank, any number
of times, only read what the others published (waiting at most ``timeout``
for ranks that have not left yet, then showing the ranks it has): calling
them on one rank only, or on every rank, never deadlocks.
"""

from goddp.tracing.figures import format_summary, median_step, step_stats, verdict
from goddp.tracing.recorder import TraceError
from goddp.tracing.session import Trace, trace
from goddp.tracing.summary import draw_launch_rows, plot_steps

__all__ = ["trace", "Trace", "TraceError", "step_stats", "verdict", "median_step", "plot_steps", "draw_launch_rows", "format_summary"]
