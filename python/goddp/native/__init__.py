"""The binding to the Go planner.

- ``extension``: lazy loading of goddp._goddp (the Go runtime starts there,
  never at import), and the ABI codes of csrc/goddp.h (their one owner on
  the Python side).
- ``plan``: the request (caps, settings) and the reply decoded into a
  ``GraphPlan``; ``plan_graph_module``, planning without compiling.
"""
