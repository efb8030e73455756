"""What goddp tells the user about its plans.

- ``records``: the record of each graph the backend compiled
  (``goddp.last_plans()``).
- ``table``: the plan table logged at INFO.
"""
