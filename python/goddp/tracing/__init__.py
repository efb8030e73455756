"""goddp.trace: when does each DDP bucket's allreduce run, relative to backward?

See goddp.tracing.session for what is recorded and the contract across ranks.
"""

from goddp.tracing.session import (
    Trace,
    TraceError,
    draw_launch_rows,
    format_summary,
    median_step,
    plot_steps,
    step_stats,
    trace,
    verdict,
)

__all__ = ["trace", "Trace", "TraceError", "step_stats", "verdict", "median_step", "plot_steps", "draw_launch_rows", "format_summary"]
