"""The binding to the Go planner.

- ``extension``: lazy loading of goddp._goddp (the Go runtime starts there,
  never at import), and the ABI codes of csrc/goddp.h (their one owner on
  the Python side).
- ``plan``: the request (caps, settings) as goddp_config's fields and the
  reply decoded into a ``GraphPlan``, its codes in words.

A leaf: nothing here imports goddp beyond goddp.native (tests/python/
package/test_layout.py); goddp.compile.plan exports, calls and decodes.
"""
