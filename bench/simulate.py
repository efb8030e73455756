"""Simulated exposed communication on machines this one is not: the
planner's timeline model (planner/timeline.go, Note [Timeline]) fed with a
GPT's shapes and a hardware profile. A simulation, not a measurement.

    .venv/bin/python -m bench.simulate [--slowdown 1.0] [--markdown] [--profile FILE.json]

For GPT-2 small and a 1B-parameter GPT, on an H100 node over NVLink (8
ranks) and a 400 Gbit/s InfiniBand cluster (8, 64, 512 ranks), it predicts
the communication left exposed after backward (and the backward + exposed
time) for five ways to bucket DDP's gradients:

- unsplit: one allreduce after all of backward (torch.compile(DDP) without
  an optimizer of its own);
- eager DDP: DDP's rebuilt buckets (ready order, DDP's default 25 MiB cap,
  the first bucket 1 MiB), each parameter's gradient ready when its
  layer's backward ends;
- torch's DDPOptimizer: the graph cut at 25 MiB of parameters (the first
  piece 1 MiB, a tied weight counted at every use, as torch counts); each
  piece's gradients ready when the piece's backward ends; DDP's buckets
  (25 MiB, first 1 MiB) over them, so a bucket that straddles two pieces
  waits for the later;
- goddp, DDP's default cap: the graph cut at block boundaries, consecutive
  pieces grouped into buckets of about 25 MiB (the first about 1 MiB),
  each closing at a piece boundary (planner/blocks.go, groupPieces);
- goddp, timeline: the same pieces, grouped by the planner's search for the
  least predicted step (PlanTimeline through goddp_timeline).

The model (in docs/benchmarks.md, "Simulated: other machines", with the
profiles' sources): backward time per node from its flops at a stated
throughput (every node at least 1 us); fp32 gradients; a ring allreduce,
2(N-1)/N * bytes / bandwidth + 2(N-1) * hop latency; a launch overhead per
bucket; compute slowed by --slowdown while a transfer runs. Forward, the
optimizer and gradient copies are outside it, as are NCCL's trees and the
hierarchy of a real cluster.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, fields

from goddp import measure

MIB = 1 << 20
DDP_CAP, DDP_FIRST_CAP = measure.DDP_CAP, measure.DDP_FIRST_CAP
GRAD_BYTES = 4  # fp32 gradients (DDP with autocast keeps fp32 parameters)
MIN_NODE_S = 1e-6


@dataclass(frozen=True)
class GPT:
    name: str
    layers: int
    d: int
    vocab: int
    ctx: int
    tokens: int  # per rank per step


MODELS = (
    GPT("GPT-2 small (124M)", layers=12, d=768, vocab=50257, ctx=1024, tokens=8 * 1024),
    GPT("GPT 1B (1.0B)", layers=18, d=2048, vocab=50257, ctx=2048, tokens=4 * 2048),
)


@dataclass(frozen=True)
class Profile:
    name: str
    ranks: int
    link_bytes_per_s: float  # each rank's link, one direction
    hop_latency_s: float
    flops_per_s: float  # achieved in backward
    launch_s: float = 10e-6

    def allreduce(self) -> dict[str, int]:
        """The ring's cost as goddp_timeline's latency and bandwidth."""
        n = self.ranks
        return {"latency_ns": round(2 * (n - 1) * self.hop_latency_s * 1e9),
                "bytes_per_second": round(self.link_bytes_per_s * n / (2 * (n - 1)))}


H100_FLOPS = 0.4 * 989e12  # 40 % of the H100 SXM's dense BF16 peak
PROFILES = (
    Profile("H100 node, NVLink", 8, 450e9, 2e-6, H100_FLOPS),
    Profile("400 Gbit/s IB", 8, 50e9, 5e-6, H100_FLOPS),
    Profile("400 Gbit/s IB", 64, 50e9, 5e-6, H100_FLOPS),
    Profile("400 Gbit/s IB", 512, 50e9, 5e-6, H100_FLOPS),
)


def load_profiles(path: str) -> tuple[Profile, ...]:
    """Profiles from a JSON file: a list of objects with Profile's fields
    (launch_s optional). ValueError naming the file, the entry and what is
    wrong: a missing or unknown field, a value of the wrong kind."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"bench.simulate: cannot read the profile file {path}: {exc}") from exc
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"bench.simulate: {path} must hold a non-empty JSON list of profiles")
    names = [f.name for f in fields(Profile)]
    required = [f.name for f in fields(Profile) if f.name != "launch_s"]
    out = []
    for i, entry in enumerate(raw):
        where = f"bench.simulate: {path}, profile {i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: must be an object with the fields {', '.join(names)}")
        missing = [k for k in required if k not in entry]
        unknown = sorted(set(entry) - set(names))
        if missing or unknown:
            raise ValueError(f"{where}: missing {missing}, unknown {unknown}; the fields are {', '.join(names)} "
                             "(launch_s optional)")
        if not isinstance(entry["name"], str) or not isinstance(entry["ranks"], int) or entry["ranks"] < 2:
            raise ValueError(f"{where}: name must be a string and ranks an int of at least 2")
        for k in ("link_bytes_per_s", "hop_latency_s", "flops_per_s", "launch_s"):
            v = entry.get(k, 0.0 if k == "launch_s" else None)
            positive = k in ("link_bytes_per_s", "flops_per_s")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v == 0):
                raise ValueError(f"{where}: {k} must be a finite number {'above' if positive else 'of at least'} 0, got {v!r}")
        out.append(Profile(**entry))
    return tuple(out)


@dataclass(frozen=True)
class Node:
    """One forward node: its piece (-1 the embeddings, the block index, or
    layers for the tail), its backward flops, the parameters it uses first
    (name, bytes; listed in forward order, ready in reverse) and the bytes
    torch's DDPOptimizer counts at it (every use)."""
    piece: int
    flops: float
    params: tuple[tuple[str, int], ...]
    torch_bytes: int


def nodes(m: GPT) -> list[Node]:
    """The GPT's nodes in forward order. Backward flops: 4 per weight per
    token for a matrix product (two products of 2 flops a multiply-add),
    8 * ctx * d per token per layer for attention's scores and values;
    norms, biases, the embedding's scatter nothing but the 1 us floor. The
    head is tied to the token embedding: its gradient is complete only
    after the embedding's backward, the last."""
    d, t = m.d, m.tokens

    def linear(piece: int, name: str, n_in: int, n_out: int, extra: float = 0.0) -> Node:
        params = ((f"{name}.weight", n_in * n_out * GRAD_BYTES), (f"{name}.bias", n_out * GRAD_BYTES))
        return Node(piece, 4.0 * n_in * n_out * t + extra, params, sum(b for _, b in params))

    def norm(piece: int, name: str) -> Node:
        params = ((f"{name}.weight", d * GRAD_BYTES), (f"{name}.bias", d * GRAD_BYTES))
        return Node(piece, 0.0, params, 2 * d * GRAD_BYTES)

    wte, wpe = m.vocab * d * GRAD_BYTES, m.ctx * d * GRAD_BYTES
    out = [Node(-1, 0.0, (("wte", wte), ("wpe", wpe)), wte + wpe)]
    for i in range(m.layers):
        out += [
            norm(i, f"h.{i}.ln_1"),
            linear(i, f"h.{i}.attn.c_attn", d, 3 * d, extra=8.0 * m.ctx * d * t),
            linear(i, f"h.{i}.attn.c_proj", d, d),
            norm(i, f"h.{i}.ln_2"),
            linear(i, f"h.{i}.mlp.c_fc", d, 4 * d),
            linear(i, f"h.{i}.mlp.c_proj", 4 * d, d),
        ]
    out += [norm(m.layers, "ln_f"), Node(m.layers, 4.0 * d * m.vocab * t, (), wte)]
    return out


def node_seconds(n: Node, p: Profile) -> float:
    return max(n.flops / p.flops_per_s, MIN_NODE_S)


def param_units(m: GPT, p: Profile, ready_at: str) -> tuple[list[int], list[int]]:
    """One unit per parameter in ready order (backward_ns, bytes). Each
    parameter is ready when its node's backward ends (ready_at "node") or
    its piece's (torch's pieces, ready_at "piece"): the first parameter of
    the node or piece carries the compute since the last one ready, the
    others 1 ns."""
    ns, sizes = [], []
    pending = 0.0
    ns_nodes = list(reversed(nodes(m)))
    pieces = torch_pieces(m) if ready_at == "piece" else list(range(len(ns_nodes)))
    for k, node in enumerate(ns_nodes):
        pending += node_seconds(node, p)
        closes = k + 1 == len(ns_nodes) or pieces[k + 1] != pieces[k]
        if ready_at == "piece" and not closes:
            continue
        group = [node] if ready_at == "node" else [n for j, n in enumerate(ns_nodes) if pieces[j] == pieces[k]]
        for g in group:
            for _, b in reversed(g.params):
                ns.append(max(round(pending * 1e9), 1))
                sizes.append(b)
                pending = 0.0
    if pending:
        ns[-1] += round(pending * 1e9)
    return ns, sizes


def torch_pieces(m: GPT) -> list[int]:
    """torch's DDPOptimizer's piece per node, in backward order: walking the
    nodes from the last, a piece closes before the node that finds it at
    its cap (the first piece's 1 MiB while it is the only one)."""
    out, piece, size = [], 0, 0
    for node in reversed(nodes(m)):
        cap = DDP_FIRST_CAP if piece == 0 else DDP_CAP
        if size >= cap:
            piece, size = piece + 1, 0
        out.append(piece)
        size += node.torch_bytes
    return out


ddp_starts = measure.ddp_starts  # DDP's default buckets, as goddp.trace predicts them


def block_units(m: GPT, p: Profile) -> tuple[list[int], list[int]]:
    """goddp's pieces at block boundaries, in backward order: the tail
    (final norm and head), the blocks, the embeddings."""
    ns: dict[int, float] = {}
    sizes: dict[int, int] = {}
    for node in nodes(m):
        ns[node.piece] = ns.get(node.piece, 0.0) + node_seconds(node, p)
        sizes[node.piece] = sizes.get(node.piece, 0) + sum(b for _, b in node.params)
    order = sorted(ns, reverse=True)
    return [round(ns[k] * 1e9) for k in order], [sizes[k] for k in order]


def group_pieces(sizes: list[int], caps: list[int]) -> list[int]:
    """planner/blocks.go's groupPieces over pieces in backward order: a
    bucket closes at the boundary whose bytes are nearest its cap (ties
    past it), returned as unit starts."""
    starts: list[int] = []
    acc = 0
    for i, s in enumerate(sizes):
        limit = caps[min(len(starts), len(caps) - 1)]
        if acc > 0 and s > 0 and acc + s > limit and limit - acc < acc + s - limit:
            starts.append(i)
            acc = 0
            limit = caps[min(len(starts), len(caps) - 1)]
        acc += s
        if acc >= limit and acc > 0 and i + 1 < len(sizes):
            starts.append(i + 1)
            acc = 0
    return starts


def timeline(units: tuple[list[int], list[int]], p: Profile, slowdown: float,
             starts: list[int] | None) -> dict:
    ns, sizes = units
    return measure.timeline({
        "backward_ns": ns, "bytes": sizes, "allreduce": p.allreduce(),
        "launch_ns": round(p.launch_s * 1e9), "slowdown_permille": round(slowdown * 1000),
        "starts": starts,
    })


STRATEGIES = ("unsplit", "eager DDP", "DDPOptimizer", "goddp, DDP's cap", "goddp, timeline")


def simulate(m: GPT, p: Profile, slowdown: float) -> dict[str, dict]:
    per_node = param_units(m, p, "node")
    per_piece = param_units(m, p, "piece")
    blocks = block_units(m, p)
    return {
        "unsplit": timeline(per_node, p, slowdown, []),
        "eager DDP": timeline(per_node, p, slowdown, ddp_starts(per_node[1])),
        "DDPOptimizer": timeline(per_piece, p, slowdown, ddp_starts(per_piece[1])),
        "goddp, DDP's cap": timeline(blocks, p, slowdown, group_pieces(blocks[1], [DDP_FIRST_CAP, DDP_CAP])),
        "goddp, timeline": timeline(blocks, p, slowdown, None),
    }


def cell(r: dict, slowdown: float) -> str:
    """Exposed ms and buckets; with slowdown, backward differs by strategy,
    so the step (backward + exposed) too."""
    step = f" / {r['step_ns'] / 1e6:.1f}" if slowdown != 1.0 else ""
    return f"{r['exposed_ns'] / 1e6:.2f}{step} ({len(r['buckets'])})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slowdown", type=float, default=1.0,
                    help="how much longer compute takes while a transfer runs (1.0: not at all)")
    ap.add_argument("--markdown", action="store_true", help="print the tables as docs/benchmarks.md has them")
    ap.add_argument("--profile", help="a JSON list of profiles (Profile's fields) instead of the built-in ones")
    args = ap.parse_args(argv)
    try:
        profiles = load_profiles(args.profile) if args.profile else PROFILES
    except ValueError as exc:
        ap.error(str(exc))
    for m in MODELS:
        params = sum(b for n in nodes(m) for _, b in n.params) // GRAD_BYTES
        print(f"\n{m.name}: {params / 1e6:.0f}M parameters, {m.tokens} tokens a rank, "
              f"{args.slowdown:g}x compute while a transfer runs")
        head = ["profile", "ranks", "backward alone (ms)"] + list(STRATEGIES)
        rows = []
        for p in profiles:
            res = simulate(m, p, args.slowdown)
            cells = [cell(r, args.slowdown) for r in res.values()]
            rows.append([p.name, str(p.ranks), f"{res['unsplit']['backward_ns'] / 1e6:.1f}"] + cells)
        if args.markdown:
            print("| " + " | ".join(head) + " |")
            print("|" + "---|" * len(head))
            for r in rows:
                print("| " + " | ".join(r) + " |")
        else:
            widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
            for r in [head] + rows:
                print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    steps = " / backward + exposed, ms" if args.slowdown != 1.0 else ""
    print(f"\nexposed communication after backward, ms{steps} (buckets); a simulation, not a measurement")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
