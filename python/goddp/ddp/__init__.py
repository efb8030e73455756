"""Everything that touches DistributedDataParallel.

- ``private``: the one module that uses torch's private DDP API (the
  reducer, its comm hooks, DDP's logging data, its bucket settings), and
  the one rebuild of DDP's reducer, with rollback. A torch upgrade that
  moves DDP's internals touches that module alone.
- ``refusals``: why goddp leaves a DDP module alone (alignment) or cannot
  trace it, in one place.
- ``state``: what goddp knows and decided about a DDP module, in one
  object (Note [One object per DDP module]).
- ``settings``: the active DDP module's real settings and the caps to plan
  with; the module as plan records name it.
- ``declaration``: DDP's declaration order (find_unused_parameters=True).
- ``align``: installing goddp's per-bucket caps on DDP (docs/align.md).
"""
