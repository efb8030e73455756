"""The binding to the Go planner.

- ``extension``: the cffi binding to libgoddp.so, loaded lazily (the Go
  runtime starts there, never at import), with the structs and codes of
  csrc/goddp.h read from the header itself.
- ``plan``: the request (caps, settings) as goddp_config's fields and the
  reply decoded into a ``GraphPlan``, its codes in words.

A leaf: nothing here imports goddp beyond goddp.native (tests/python/
package/test_layout.py); goddp.compile.plan exports, calls and decodes.
"""
