"""The edges' class: goddp's default against what else a user would run,
first step and steady step, on models whose edges differ.

    .venv/bin/python -m bench.edges [--rounds 2] [--size quick] [--models ...] [--out FILE.json]

For each model of the class (bench.models: a tied head with the loss over
GPT-2's vocabulary (nanoGPT), the same untied, HF BertForMaskedLM, HF
ViTForImageClassification, a 65-character GPT, a GPT whose first piece is
the token embedding alone), one rank, Inductor, default DDP settings, each
variant in a fresh process with a fresh Inductor cache (bench.compile_overhead
--e2e), the variants interleaved by round:

  goddp_ddp  goddp, default options (edges="auto": Note [Edge costs])
  torch      torch.compile(DDP) with torch's DDPOptimizer
  unsplit    torch.compile(DDP) without it
  regional   each repeated block compiled alone, eager DDP

The first step is the first forward and backward (the compile); the steady
step is the median of --steady steps after it, in CPU seconds of the
process (one rank and one thread: no communication to wait for, so on an
idle machine CPU and wall time agree, and on a shared one the CPU time does
not count the waits for other jobs). Ratios are paired by round (goddp over
torch's first step; goddp's steady step over the fastest alternative's in
the same round), median [min-max] over the rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import compile_overhead, stats

MODELS = ("nanogpt", "gpt_untied", "bert_mlm", "vit", "char_gpt", "embed_only")
TOOLS = ("goddp_ddp", "torch", "unsplit", "regional")
ALTERNATIVES = ("torch", "unsplit", "regional")
STEADY = "steady_step_cpu_s"


def _first(r: dict) -> float:
    return r["first_forward_s"] + r["first_backward_s"]


def _spread(values: list[float], fmt=stats.fmt_s) -> str:
    if not values:
        return "-"
    text = fmt(stats.median(values))
    return text + (f" [{fmt(min(values))}-{fmt(max(values))}]" if len(values) > 1 else "")


def report(res: dict) -> str:
    """The table of docs/benchmarks.md ("The edges")."""
    rows, by_model = [], {}
    for r in res["e2e"]:
        by_model.setdefault(r["model"], {})[r["tool"]] = [x for x in r.get("runs", [r]) if "error" not in x]
    for model, tools in by_model.items():
        goddp = tools.get("goddp_ddp", [])
        rounds = range(min(len(v) for v in tools.values()))
        first = [_first(goddp[k]) / _first(tools["torch"][k]) for k in rounds if "torch" in tools]
        best = [goddp[k][STEADY] / min(tools[t][k][STEADY] for t in ALTERNATIVES if t in tools) for k in rounds]
        eager = goddp[0].get("eager_pieces") if goddp else None
        cells = [model, f"{goddp[0].get('pieces')} ({eager or 0} eager)" if goddp else "-"]
        for t in TOOLS:
            runs = tools.get(t, [])
            cells.append(f"{_spread([_first(x) for x in runs])} / {_spread([x[STEADY] for x in runs])}")
        cells += [_spread(first, stats.fmt_ratio), _spread(best, stats.fmt_ratio)]
        rows.append(cells)
    headers = ["model", "goddp pieces", *(f"{t}: first (wall) / steady (CPU)" for t in TOOLS),
               "goddp ÷ torch, first", "goddp ÷ fastest other, steady"]
    return stats.table(headers, rows, title=f"== edges: one rank, Inductor, fresh caches, {res.get('repeat')} rounds ==")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    ap.add_argument("--size", default="quick", choices=("tiny", "quick"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steady", type=int, default=5)
    ap.add_argument("--core", type=int, default=None, help="pin the measured processes to this core")
    ap.add_argument("--out", help="JSON of every run")
    args = ap.parse_args(argv)
    res = compile_overhead.run([], list(TOOLS), [f"{m}:{args.size}" for m in args.models], repeat=args.rounds,
                               core=args.core, caches="fresh", steady=args.steady)
    for r in res["e2e"]:
        r["model"] = r["model"].split(":")[0]
    print(report(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
