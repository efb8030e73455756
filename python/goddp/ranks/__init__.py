"""The ranks of a DDP module's process group, and how they agree.

- ``group``: the one group type, the one timeout parser, the one set of
  messages about ranks that did not come.
- ``store_round``: one round of statements through the c10d store, bounded.
- ``plan_check``: what each rank says about its plan and what they decide.
- ``agreement``: where the ranks agree (a DDP module's first training
  call), and what follows from the decision.
"""
