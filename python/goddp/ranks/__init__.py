"""The ranks of a DDP module's process group, and how they agree.

- ``group``: the one group type, the one timeout parser, the one set of
  messages about ranks that did not come.
- ``layout``: what DDP will communicate for a module (the thing the ranks
  agree on; its digest comes from the Go planner).
- ``verdict``: the one module that decides: what each rank says
  (``Statement``), what every rank decides from all of them, the strict
  error, and their words (Note [The agreement verdict]).
- ``store_round``: the one module that runs rounds over the c10d store,
  bounded: the plan check's (a DDP module's first training call, its
  install round) and goddp.trace's (entering and leaving).
- ``agreement``: where the ranks agree (a DDP module's first training
  call, or the next one after a deferral), and what follows from the
  decision (Note [Agreeing on DDP's layout]).
- ``forward``: the graphs of one forward planned as one layout (Note
  [Graphs of one forward]).
- ``join``: where the ranks meet inside DDP's Join context (Note
  [Meeting under Join]).
"""
