"""The compile pipeline: what happens to one Dynamo graph.

- ``pipeline``: the coordinator (plan, cut, compile the pieces, stitch; or
  the whole graph), each step returning what it made.
- ``plan``: one graph planned (export's arrays and a request in, the
  GraphPlan out), ``plan_graph_module``; the request from the options.
- ``fallback``: the one fallback context, and which exceptions are Dynamo's
  own control flow (never a failure).
- ``inner``: the inner compiler each piece goes to.
- ``pieces``: compiling the pieces (example inputs, the compile loop).
- ``notes``: the INFO lines a graph's plan deserves.
- ``ddp_optimizer``: torch's DDPOptimizer, which must not cut as well.
- ``compiled_autograd``: torch's compiled autograd, which schedules DDP's
  allreduces itself under the Python reducer (goddp then does not cut).
"""
