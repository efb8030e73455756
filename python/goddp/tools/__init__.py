"""goddp inside torch's own tools (docs/tools.md).

People who run torch.compile at scale debug it with torch's tools, not
goddp's: ``TORCH_TRACE`` and tlparse for what a compile did,
``torch._dynamo.utils.compile_times()`` and the compile trace events for
where the compile time went, ``torch.profiler`` for what a step does.
goddp shows up in each:

- ``structured``: under ``TORCH_TRACE``, goddp's artifacts (the plan, the
  cut graph and each distinct piece's graph, which pieces reuse which, a
  fallback, the ranks' agreement) beside the compile id they belong to.
- ``phases``: each phase of goddp's compile (export, plan, cut, ...) and
  the agreement's wait, timed by torch's ``dynamo_timed`` under names
  starting with ``goddp.``.
- ``ranges``: each piece's forward and backward, and under goddp.trace each
  bucket's allreduce, as named ranges of ``torch.profiler``.

Each costs nothing while its tool is off (the modules say how).
"""
