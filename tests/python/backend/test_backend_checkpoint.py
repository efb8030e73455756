"""Activation checkpointing under goddp (docs: Note [Checkpoint bodies]).

- Per-block checkpoints, however written (torch.utils.checkpoint per block,
  use_reentrant=True, checkpoint_wrapper, selective policies, HF's
  gradient_checkpointing_enable), are cut at the blocks and each distinct
  block is compiled once, as without checkpointing.
- The checkpoint's settings are part of a piece's identity.
- A checkpoint spanning several blocks is split at the block boundaries
  into consecutive checkpoint regions; where that is not safe it stays
  whole and goddp says why at INFO.
- A checkpoint with fewer than two blocks but more than a bucket's
  parameters, in a graph cut by bytes, is split at the buckets of its body
  (either wrapping order, reentrant or not); per-block checkpoints of
  repeated blocks keep the block cuts.
- Training equals eager DDP with the same checkpointing, bit for bit
  (aot_eager), and recomputation still happens (saved activations).

One process, a 1-rank gloo group; test_dist_checkpoint runs 2 ranks.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from checkpoint_models import build, lm_loss, make_tokens, saved_activation_bytes, tiny_gpt2
from _fx_util import CountingCompiler

CAP_MB = 0.05  # a few blocks' worth: several buckets


def train(forward, steps=2, loss=lm_loss, inputs=make_tokens):
    losses = []
    for step in range(steps):
        out = forward(inputs(step))
        value = loss(out)
        value.backward()
        losses.append(value.detach().clone())
    return losses


# These toy models' edges hold a measurable share of their small steps, so
# "auto" compiles some (Note [Edge costs]); the cases here count the
# compiles of the checkpointed blocks, with the edges eager.
EDGES_EAGER = {"edges": "eager"}


def run_pair(make_model, steps=2, loss=lm_loss, inputs=make_tokens, **options):
    """Trains make_model() as eager DDP and compiled with goddp (aot_eager,
    counting compiles); returns (eager DDP, goddp DDP, eager losses, goddp
    losses, the plan of the graph, the counting compiler)."""
    eager = DDP(make_model(), bucket_cap_mb=CAP_MB)
    eager_losses = train(eager, steps, loss, inputs)
    torch._dynamo.reset()
    goddp.clear_plans()
    ddp = DDP(make_model(), bucket_cap_mb=CAP_MB)
    counting = CountingCompiler()
    opts = {"inner": counting, "strict": True, "log_plan": False, **EDGES_EAGER, **options}
    compiled = torch.compile(ddp, backend="goddp", options=opts)
    losses = train(compiled, steps, loss, inputs)
    plans = [p for p in goddp.last_plans() if p["buckets"]]
    assert len(plans) == 1, goddp.last_plans()
    return eager, ddp, eager_losses, losses, plans[0], counting


def assert_same_training(eager, ddp, eager_losses, losses):
    for step, (got, want) in enumerate(zip(losses, eager_losses)):
        assert torch.equal(got, want), f"step {step}: {got.item()!r} != eager {want.item()!r}"
    for (name, p), q in zip(ddp.module.named_parameters(), eager.module.parameters()):
        assert p.grad is not None and torch.equal(p.grad, q.grad), name


def piece_shape(plan):
    return plan["num_pieces"], plan["distinct_pieces"], plan["eager_pieces"]


@pytest.fixture(scope="module")
def reference_shapes(dist_group):
    """(pieces, distinct, eager) per block type without checkpointing."""
    shapes = {}
    for block in ("transformer", "residual"):
        *_, plan, _ = run_pair(lambda: build("none", block), steps=1)
        shapes[block] = piece_shape(plan)
    return shapes


class TestPerBlockCheckpoints:
    """Every way of checkpointing each block gives the pieces of the
    unchekpointed model, compiles each distinct block once, and trains like
    eager DDP with the same checkpointing."""

    CASES = [
        ("per_block", "transformer"),
        ("per_block", "residual"),
        ("wrapper", "transformer"),
        ("wrapper", "residual"),
        ("reentrant", "transformer"),
        ("sac_list", "transformer"),
        ("sac_fn", "residual"),
    ]

    @pytest.mark.parametrize(("how", "block"), CASES, ids=[f"{h}-{b}" for h, b in CASES])
    def test_pieces_compiles_and_numerics(self, dist_group, reference_shapes, how, block):
        before = counters["aot_autograd"]["total"]
        eager, ddp, eager_losses, losses, plan, counting = run_pair(lambda: build(how, block))
        assert plan["fallback"] is None
        assert piece_shape(plan) == reference_shapes[block], plan["pieces"]
        # one AOTAutograd compile per distinct piece that is not an eager edge
        assert len(counting.graphs) == plan["distinct_pieces"] - plan["eager_pieces"] == 1
        assert counters["aot_autograd"]["total"] - before == 1
        assert plan["ddp_buckets"]["aligned"]
        # the compiled piece really holds a checkpoint
        (gm,) = counting.graphs
        hops = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.tag_activation_checkpoint]
        assert len(hops) == 1
        assert hops[0].kwargs.get("use_reentrant") is (how == "reentrant")
        assert_same_training(eager, ddp, eager_losses, losses)

    def test_hf_gpt2_gradient_checkpointing(self, dist_group):
        shapes = self.hf_shapes()
        # three GPT-2 blocks, compiled once, the same edges eager under
        # "auto" (a checkpoint call weighs its body: Note [Node weights],
        # and costs it: Note [Edge costs]), with or without checkpointing
        assert shapes[0][:3] == shapes[1][:3], shapes
        assert shapes[1][0] >= 3 and shapes[1][1] - shapes[1][2] == 2, shapes
        # the checkpoints reached the compiled pieces, and only with checkpointing on
        assert shapes[0][3] == 0 and shapes[1][3] >= 1, shapes

    def hf_shapes(self):
        """Per run (checkpointing off, on): the pieces' shape, and how many
        checkpoint calls the inner compiler was given."""
        pytest.importorskip("transformers")

        def model(checkpointing):
            def make():
                m = tiny_gpt2()
                if checkpointing:
                    m.gradient_checkpointing_enable()
                m.train()
                return m

            return make

        def loss(out):
            return out.loss

        def inputs(step):
            tokens = make_tokens(step)
            return tokens

        def forward_of(ddp):
            return lambda tokens: ddp(input_ids=tokens, labels=tokens)

        shapes = []
        for checkpointing in (False, True):
            eager = DDP(model(checkpointing)(), bucket_cap_mb=CAP_MB)
            eager_losses = train(forward_of(eager), 2, loss, inputs)
            torch._dynamo.reset()
            goddp.clear_plans()
            ddp = DDP(model(checkpointing)(), bucket_cap_mb=CAP_MB)
            counting = CountingCompiler()
            compiled = torch.compile(ddp, backend="goddp", options={"inner": counting, "strict": True})
            losses = train(forward_of(compiled), 2, loss, inputs)
            # HF's forward breaks the graph: the blocks' graph has the most pieces
            plan = max(goddp.last_plans(), key=lambda p: p["num_pieces"])
            assert plan["fallback"] is None
            hops = sum(n.target is torch.ops.higher_order.tag_activation_checkpoint
                       for gm in counting.graphs for n in gm.graph.nodes)
            shapes.append((*piece_shape(plan), hops))
            assert_same_training(eager, ddp, eager_losses, losses)
        return shapes


class TestCheckpointIdentity:
    """A checkpoint's settings are part of what makes two pieces the same."""

    def test_blocks_with_different_settings_are_compiled_apart(self, dist_group):
        import torch.utils.checkpoint as cp

        from checkpoint_models import SAVED_OPS, CheckpointLM, sac_context

        settings = [
            {"use_reentrant": False},
            {"use_reentrant": False, "preserve_rng_state": False},
            {"use_reentrant": False, "context_fn": sac_context(SAVED_OPS)},
            {"use_reentrant": False, "context_fn": sac_context(SAVED_OPS[:1])},
            {"use_reentrant": False},  # as block 0: shares its code
            {"use_reentrant": False, "context_fn": sac_context(list(SAVED_OPS))},  # as block 2
        ]

        class Mixed(CheckpointLM):
            def forward(self, tokens):
                x = self.embed(tokens)
                for block, kwargs in zip(self.blocks, settings):
                    x = cp.checkpoint(block, x, **kwargs)
                return self.head(self.norm(x))

        def make():
            torch.manual_seed(0)
            return Mixed("none", "residual", depth=len(settings))

        eager, ddp, eager_losses, losses, plan, counting = run_pair(make)
        blocks = plan["pieces"][1:-1]
        assert len(blocks) == len(settings)
        assert [p["same_as"] for p in blocks] == [1, 2, 3, 4, 1, 3]
        assert_same_training(eager, ddp, eager_losses, losses)


class TestSplitCheckpoints:
    """A checkpoint around several blocks becomes one checkpoint region per
    block: the pieces of per-block checkpointing, one compile, eager DDP's
    numbers, one more saved boundary activation per cut."""

    @pytest.mark.parametrize("how", ["whole", "halves"])
    @pytest.mark.parametrize("block", ["transformer", "residual"])
    def test_split_at_blocks(self, dist_group, reference_shapes, caplog, how, block):
        with caplog.at_level(logging.INFO, logger="goddp"):
            eager, ddp, eager_losses, losses, plan, counting = run_pair(lambda: build(how, block))
        assert plan["fallback"] is None
        assert piece_shape(plan) == reference_shapes[block]
        assert len(counting.graphs) == 1
        splits = [r.getMessage() for r in caplog.records if "checkpoint regions" in r.getMessage()]
        regions = 4 if how == "whole" else 2
        assert len(splits) == (1 if how == "whole" else 2), splits
        assert all(f"split into {regions} checkpoint regions at block boundaries" in m for m in splits)
        assert_same_training(eager, ddp, eager_losses, losses)

    def test_recompute_happens_and_each_cut_saves_one_activation(self, dist_group):
        tokens = make_tokens(0)

        def saved(how, backend):
            torch._dynamo.reset()
            goddp.clear_plans()
            ddp = DDP(build(how, "residual"), bucket_cap_mb=CAP_MB)
            compiled = torch.compile(ddp, backend=backend)
            with torch._dynamo.config.patch(optimize_ddp=False):
                lm_loss(compiled(tokens)).backward()  # compile
                nbytes, out = saved_activation_bytes(lambda: compiled(tokens), ddp.parameters())
            lm_loss(out).backward()
            plans = goddp.last_plans()
            return nbytes, plans[0]["num_pieces"] if plans else 1

        goddp_backend = goddp.backend(inner="aot_eager")
        plain, _ = saved("none", goddp_backend)
        whole_unsplit, _ = saved("whole", "aot_eager")
        whole_goddp, pieces = saved("whole", goddp_backend)
        per_unsplit, _ = saved("per_block", "aot_eager")
        per_goddp, _ = saved("per_block", goddp_backend)
        boundary = tokens.numel() * 64 * 4  # one (batch, seq, width) float activation
        # recomputation still happens: far less is kept than without checkpoints
        assert whole_goddp < plain / 2, (whole_goddp, plain)
        # embedding | 4 blocks | head: each cut keeps one boundary activation,
        # but for the last, which the head's norm keeps in the unsplit graph too
        assert pieces == 6
        assert whole_goddp - whole_unsplit == (pieces - 2) * boundary, (whole_goddp, whole_unsplit)
        # split, the whole-stack checkpoint keeps what per-block checkpoints
        # keep; those already keep each block's input, all but the first
        # (recomputed from the embedding within one unsplit graph)
        assert whole_goddp == per_goddp
        assert per_goddp - per_unsplit == boundary, (per_goddp, per_unsplit)


class TestCheckpointsKeptWhole:
    """Where splitting is not safe the checkpoint stays one piece, trains,
    and goddp says why at INFO."""

    @pytest.mark.parametrize(
        ("how", "reason"),
        [
            ("whole_dropout", "random op"),
            ("whole_autocast", "grad mode or autocast"),
        ],
    )
    def test_kept_whole_with_reason(self, dist_group, caplog, how, reason):
        with caplog.at_level(logging.INFO, logger="goddp"):
            ddp = DDP(build(how, "residual"), bucket_cap_mb=CAP_MB)
            compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "strict": True})
            train(compiled, 1)
        kept = [r.getMessage() for r in caplog.records if "kept whole" in r.getMessage()]
        assert len(kept) == 1 and reason in kept[0], kept
        (plan,) = [p for p in goddp.last_plans() if p["buckets"]]
        assert plan["fallback"] is None
        for p in ddp.module.parameters():
            assert p.grad is not None

    def test_function_policy_stays_whole(self, dist_group, caplog):
        import torch.utils.checkpoint as cp

        from checkpoint_models import CheckpointLM, _save_matmuls, sac_context

        class WholeSAC(CheckpointLM):
            def forward(self, tokens):
                x = cp.checkpoint(self.run, self.embed(tokens), use_reentrant=False,
                                  context_fn=sac_context(_save_matmuls))
                return self.head(self.norm(x))

        def make():
            torch.manual_seed(0)
            return WholeSAC("none", "residual")

        with caplog.at_level(logging.INFO, logger="goddp"):
            eager, ddp, eager_losses, losses, plan, _ = run_pair(make)
        kept = [r.getMessage() for r in caplog.records if "kept whole" in r.getMessage()]
        assert len(kept) == 1 and "policy" in kept[0], kept
        assert_same_training(eager, ddp, eager_losses, losses)


def run_ordered(make_model, order, cap_mb=CAP_MB, steps=2, ddp_kwargs=None, **options):
    """run_pair in either wrapping order: "compile_ddp" compiles the DDP
    module (compile(DDP(m))), "ddp_compile" wraps the compiled model in DDP
    (DDP(compile(m))); ddp_kwargs go to both DDP modules."""
    ddp_kwargs = {"bucket_cap_mb": cap_mb, **(ddp_kwargs or {})}
    eager = DDP(make_model(), **ddp_kwargs)
    eager_losses = train(eager, steps)
    torch._dynamo.reset()
    goddp.clear_plans()
    counting = CountingCompiler()
    opts = {"inner": counting, "strict": True, "log_plan": False, **options}
    if order == "compile_ddp":
        ddp = DDP(make_model(), **ddp_kwargs)
        forward = torch.compile(ddp, backend="goddp", options=opts)
    else:
        ddp = forward = DDP(torch.compile(make_model(), backend="goddp", options=opts), **ddp_kwargs)
    losses = train(forward, steps)
    plans = [p for p in goddp.last_plans() if p["buckets"]]
    assert len(plans) == 1, goddp.last_plans()
    return eager, ddp, eager_losses, losses, plans[0], counting


def checkpoint_calls(graphs):
    """Per compiled graph, its checkpoint calls."""
    return [
        sum(1 for n in gm.graph.nodes if n.target is torch.ops.higher_order.tag_activation_checkpoint) for gm in graphs
    ]


def checkpoints_run(plan, graphs):
    """Checkpoint calls that the pieces run, a reused piece counting its
    leader's (graphs: one per compiled piece, in piece order)."""
    leaders = [p["index"] for p in plan["pieces"] if p["same_as"] == p["index"] and not p["eager"]]
    assert len(leaders) == len(graphs)
    calls = dict(zip(leaders, checkpoint_calls(graphs)))
    return sum(calls[p["same_as"]] for p in plan["pieces"] if not p["eager"])


def messages(caplog, text):
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


ORDERS = ["compile_ddp", "ddp_compile"]


@pytest.fixture(scope="module")
def whole_pieces(dist_group):
    """Pieces per (body, reentrant) with the checkpoints kept whole
    (block_cuts=False: goddp does not rewrite the graph)."""
    from checkpoint_models import build_one

    cache = {}

    def pieces(body, reentrant):
        if (body, reentrant) not in cache:
            *_, plan, counting = run_ordered(
                lambda: build_one(body, reentrant), "compile_ddp", steps=1, block_cuts=False
            )
            assert sum(checkpoint_calls(counting.graphs)) == (2 if body == "twins" else 1)
            cache[body, reentrant] = plan["num_pieces"]
        return cache[body, reentrant]

    return pieces


class TestBucketSplitCheckpoints:
    """A checkpoint whose body holds fewer than two blocks but more than a
    bucket's parameters, in a graph the planner cuts by bytes, becomes one
    checkpoint region per bucket of its body (planned alone, every bucket
    under DDP's cap): more pieces than the checkpoint kept whole, DDP's
    buckets set to them, eager DDP's gradients bit for bit."""

    BODIES = [("stack", 1), ("block", 1), ("twins", 2)]

    @pytest.mark.parametrize("order", ORDERS)
    @pytest.mark.parametrize("reentrant", [False, True], ids=["nonreentrant", "reentrant"])
    @pytest.mark.parametrize(("body", "calls"), BODIES, ids=[b for b, _ in BODIES])
    def test_split_at_buckets(self, dist_group, caplog, whole_pieces, body, calls, reentrant, order):
        from checkpoint_models import build_one

        with caplog.at_level(logging.INFO, logger="goddp"):
            eager, ddp, eager_losses, losses, plan, counting = run_ordered(lambda: build_one(body, reentrant), order)
        assert plan["fallback"] is None
        assert plan["ddp_buckets"]["aligned"], plan["ddp_buckets"]
        splits = messages(caplog, "at bucket boundaries")
        assert len(splits) == calls, messages(caplog, "checkpoint")
        regions = []
        for line in splits:
            assert "of DDP's parameters" in line and f"under the {CAP_MB:.3g} MiB bucket cap" in line, line
            regions.append(int(line.split("split into ")[1].split()[0]))
        assert all(r >= 2 for r in regions), splits
        # identical bodies are cut identically (every bucket under the cap)
        assert len({line.split(" holds ")[1] for line in splits}) == 1, splits
        # every region is a checkpoint of its own, recomputed in a piece
        assert checkpoints_run(plan, counting.graphs) == sum(regions)
        assert plan["num_pieces"] > whole_pieces(body, reentrant), plan["pieces"]
        assert not messages(caplog, "kept whole")
        assert_same_training(eager, ddp, eager_losses, losses)

    @pytest.mark.parametrize("order", ORDERS)
    def test_random_op_keeps_it_whole(self, dist_group, caplog, order):
        from checkpoint_models import build_one

        with caplog.at_level(logging.INFO, logger="goddp"):
            *_, ddp, _, _, plan, counting = run_ordered(lambda: build_one("stack", dropout=0.1), order, steps=1)
        (kept,) = messages(caplog, "kept whole")
        assert "random op" in kept and "of DDP's parameters" in kept and "bucket cap" in kept, kept
        assert not messages(caplog, "checkpoint regions")
        # one piece holds the one checkpoint, whole
        assert checkpoints_run(plan, counting.graphs) == 1
        assert plan["fallback"] is None
        for p in ddp.module.parameters():
            assert p.grad is not None

    def test_a_checkpoint_within_one_bucket_is_left_alone(self, dist_group, caplog):
        from checkpoint_models import build_one

        with caplog.at_level(logging.INFO, logger="goddp"):
            eager, ddp, eager_losses, losses, plan, counting = run_ordered(lambda: build_one("stack"), ORDERS[0], cap_mb=25)
        assert not messages(caplog, "checkpoint '"), messages(caplog, "checkpoint")
        assert sum(checkpoint_calls(counting.graphs)) == 1
        assert_same_training(eager, ddp, eager_losses, losses)

    @pytest.mark.parametrize("options", [{"mode": "torch"}, {"block_cuts": False}], ids=["torch", "no_block_cuts"])
    def test_torch_mode_and_no_block_cuts_keep_it_whole(self, dist_group, caplog, options):
        from checkpoint_models import build_one

        with caplog.at_level(logging.INFO, logger="goddp"):
            eager, ddp, eager_losses, losses, plan, counting = run_ordered(lambda: build_one("stack"), ORDERS[0], **options)
        assert not messages(caplog, "checkpoint regions")
        assert sum(checkpoint_calls(counting.graphs)) == 1
        assert_same_training(eager, ddp, eager_losses, losses)

    @pytest.mark.parametrize("order", ORDERS)
    def test_per_block_checkpoints_over_a_bucket_keep_block_cuts(self, dist_group, caplog, order):
        """Repeated blocks each over a bucket: the planner cuts at the blocks
        (a block is one piece, checkpointed or not), so per-block
        checkpoints stay one per block, and the blocks compile once."""
        cap = 0.01  # each TransformerBlock (width 64) holds about 0.13 MiB
        *_, reference, _ = run_ordered(lambda: build("none", "transformer"), order, cap_mb=cap, steps=1, **EDGES_EAGER)
        with caplog.at_level(logging.INFO, logger="goddp"):
            eager, ddp, eager_losses, losses, plan, counting = run_ordered(
                lambda: build("per_block", "transformer"), order, cap_mb=cap, **EDGES_EAGER
            )
        assert not messages(caplog, "checkpoint '"), messages(caplog, "checkpoint")
        assert piece_shape(plan) == piece_shape(reference)
        assert plan["distinct_pieces"] - plan["eager_pieces"] == 1 == len(counting.graphs)
        assert plan["ddp_buckets"]["aligned"]
        assert_same_training(eager, ddp, eager_losses, losses)

    @pytest.mark.parametrize("order", ORDERS)
    def test_find_unused_per_block_checkpoints_split_at_buckets(self, dist_group, caplog, order):
        """The same repeated blocks under find_unused_parameters=True (every
        parameter used): DDP keeps declaration order, so the planner cuts
        the graph by bytes, not at the blocks (its block_runs is false);
        each block's checkpoint, over a bucket, is split at its buckets,
        the blocks' regions still compile once per region kind, DDP's
        buckets are set to the pieces, and the gradients are eager DDP's
        bit for bit."""
        cap = 0.01
        unused = {"find_unused_parameters": True}
        *_, whole, _ = run_ordered(
            lambda: build("per_block", "transformer"), order, cap_mb=cap, steps=1, ddp_kwargs=unused, block_cuts=False
        )
        with caplog.at_level(logging.INFO, logger="goddp"):
            eager, ddp, eager_losses, losses, plan, counting = run_ordered(
                lambda: build("per_block", "transformer"), order, cap_mb=cap, ddp_kwargs=unused
            )
        assert plan["fallback"] is None
        assert plan["ddp_buckets"]["aligned"], plan["ddp_buckets"]
        assert plan["alignment"].startswith("declaration"), plan["alignment"]
        splits = messages(caplog, "at bucket boundaries")
        assert len(splits) == 4, messages(caplog, "checkpoint")  # one per block
        assert len({line.split(" holds ")[1] for line in splits}) == 1, splits
        regions = [int(line.split("split into ")[1].split()[0]) for line in splits]
        assert all(r >= 2 for r in regions), splits
        assert checkpoints_run(plan, counting.graphs) == sum(regions)
        assert plan["num_pieces"] > whole["num_pieces"], (plan["pieces"], whole["pieces"])
        assert not messages(caplog, "kept whole")
        assert_same_training(eager, ddp, eager_losses, losses)

    def test_each_cut_saves_what_crosses_it(self, dist_group):
        """Between the layers of a stack a cut keeps one boundary
        activation; inside a block it keeps more (the residual stream and
        the value at the cut); recomputation still happens."""
        from checkpoint_models import OneCheckpointLM, build_one

        tokens = make_tokens(0)
        boundary = tokens.numel() * 64 * 4  # one (batch, seq, width) float activation

        def saved(make, **options):
            torch._dynamo.reset()
            goddp.clear_plans()
            ddp = DDP(make(), bucket_cap_mb=CAP_MB)
            compiled = torch.compile(ddp, backend=goddp.backend(inner="aot_eager", **options))
            lm_loss(compiled(tokens)).backward()  # compile
            nbytes, out = saved_activation_bytes(lambda: compiled(tokens), ddp.parameters())
            lm_loss(out).backward()
            (plan,) = [p for p in goddp.last_plans() if p["buckets"]]
            return nbytes, plan["num_pieces"]

        class Unchecked(OneCheckpointLM):
            def forward(self, tokens):
                return self.head(self.norm(self.body(self.embed(tokens))))

        for body in ("stack", "block"):
            whole, whole_pieces = saved(lambda: build_one(body), block_cuts=False)
            split, pieces = saved(lambda: build_one(body))
            plain, _ = saved(lambda: (torch.manual_seed(0), Unchecked(body))[1])
            cuts = pieces - whole_pieces
            assert cuts >= 1
            assert split < plain, (body, split, plain)
            if body == "stack":
                assert split - whole == cuts * boundary, (split, whole, cuts)
            else:
                assert split - whole > cuts * boundary, (split, whole, cuts)
