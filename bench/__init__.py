"""goddp benchmarks: step time over a shaped two-host link and compile overhead.

Entry points: `python -m bench.run` (everything), `python -m bench.compile_overhead`.
"""
