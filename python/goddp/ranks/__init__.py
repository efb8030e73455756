"""The ranks of a DDP module's process group, and how they agree.

- ``group``: the one group type, the one timeout parser, the one set of
  messages about ranks that did not come.
- ``store_round``: one round of statements through the c10d store, bounded.
- ``layout``: what DDP will communicate for a module (the thing the ranks
  agree on; its digest comes from the Go planner).
- ``verdict``: what one round decides from every rank's statement, and its
  words (Note [The agreement verdict]).
- ``plan_check``: what each rank says (its layout, for the record its
  plan) and what they decide.
- ``agreement``: where the ranks agree (a DDP module's first training
  call, or the next one after a deferral), and what follows from the
  decision (Note [Agreeing on DDP's layout]).
"""
