"""Models trained with activation checkpointing, the ways people write it.

``CheckpointLM`` is one small language model (embedding, repeated blocks,
norm, head) whose blocks are checkpointed according to ``how``:

- ``none``: no checkpointing (the reference for piece counts);
- ``per_block``: ``checkpoint(block, x, use_reentrant=False)`` per block,
  as torchtitan's per-layer mode and HF do; ``reentrant`` the same with
  ``use_reentrant=True``;
- ``wrapper``: torch.distributed's ``apply_activation_checkpointing``
  (``checkpoint_wrapper`` per block, as FSDP and Lightning users do);
- ``sac_list``: a selective checkpoint whose policy is a list of ops to save;
  ``sac_fn``: one whose policy is a function;
- ``whole``: one checkpoint around the whole stack of blocks; ``halves``:
  one around each half;
- ``whole_dropout``: ``whole`` over blocks with dropout (a random op);
- ``whole_autocast``: ``whole`` with an autocast region inside.

``block`` picks the block type: ``transformer`` (tests' TransformerBlock)
or ``residual`` (pre-norm residual feedforward).

``OneCheckpointLM`` (``build_one``) checkpoints modules that are no
repeated block, holding more than a bucket's parameters.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from torch import nn

from bench import probes
from models import Feedforward, TransformerBlock

HOWS = ("none", "per_block", "reentrant", "wrapper", "sac_list", "sac_fn", "whole", "halves",
        "whole_dropout", "whole_autocast")
VOCAB, WIDTH, SEQ = 256, 64, 8


class ResidualFeedforward(nn.Module):
    def __init__(self, width: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = Feedforward(width, 2 * width)
        self.dropout = dropout

    def forward(self, x):
        h = self.ff(self.norm(x))
        if self.dropout:
            h = F.dropout(h, self.dropout, self.training)
        return x + h


def _save_matmuls(ctx, op, *args, **kwargs):
    """A selective-checkpoint policy function: keep matmul outputs."""
    save = op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return cp.CheckpointPolicy.MUST_SAVE if save else cp.CheckpointPolicy.PREFER_RECOMPUTE


SAVED_OPS = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]


def sac_context(policy):
    return functools.partial(cp.create_selective_checkpoint_contexts, policy)


class CheckpointLM(nn.Module):
    def __init__(self, how: str = "per_block", block: str = "transformer", depth: int = 4) -> None:
        super().__init__()
        if how not in HOWS:
            raise ValueError(how)
        self.how = how
        self.embed = nn.Embedding(VOCAB, WIDTH)
        dropout = 0.1 if how == "whole_dropout" else 0.0
        if block == "transformer":
            blocks = [TransformerBlock(WIDTH, heads=4, mlp_ratio=2) for _ in range(depth)]
        else:
            blocks = [ResidualFeedforward(WIDTH, dropout) for _ in range(depth)]
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        if how == "wrapper":
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

            members = set(self.blocks)
            apply_activation_checkpointing(self, check_fn=lambda m: m in members)

    def run(self, x, first: int = 0, last: int | None = None):
        for block in list(self.blocks)[first:last]:
            x = block(x)
        return x

    def run_autocast(self, x):
        x = self.blocks[0](x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            x = self.run(x, 1, -1)
        return self.blocks[-1](x.float())

    def forward(self, tokens):
        x = self.embed(tokens)
        how = self.how
        if how in ("none", "wrapper"):
            x = self.run(x)
        elif how in ("per_block", "reentrant", "sac_list", "sac_fn"):
            kwargs = {"use_reentrant": how == "reentrant"}
            if how == "sac_list":
                kwargs["context_fn"] = sac_context(SAVED_OPS)
            elif how == "sac_fn":
                kwargs["context_fn"] = sac_context(_save_matmuls)
            for block in self.blocks:
                x = cp.checkpoint(block, x, **kwargs)
        elif how in ("whole", "whole_dropout"):
            x = cp.checkpoint(self.run, x, use_reentrant=False)
        elif how == "halves":
            half = len(self.blocks) // 2
            x = cp.checkpoint(self.run, x, 0, half, use_reentrant=False)
            x = cp.checkpoint(self.run, x, half, None, use_reentrant=False)
        elif how == "whole_autocast":
            x = cp.checkpoint(self.run_autocast, x, use_reentrant=False)
        return self.head(self.norm(x))


def make_tokens(seed: int, batch: int = 2):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, SEQ), generator=g)


def lm_loss(logits) -> torch.Tensor:
    return logits.float().pow(2).mean()


def build(how: str, block: str = "transformer", depth: int = 4, seed: int = 0) -> CheckpointLM:
    torch.manual_seed(seed)
    return CheckpointLM(how, block, depth)


def tiny_gpt2(seed: int = 0, n_layer: int = 3):
    """HF GPT-2, tiny and deterministic (no dropout), built from a config."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=WIDTH, n_layer=n_layer, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def saved_activation_bytes(step, params) -> tuple[int, object]:
    """(bytes autograd saves for backward during step(), parameters left
    out; step's result): bench.probes' measure, which the bench reports."""
    saved = probes.saved_activation_bytes(step, params)
    return saved.nbytes, saved.result


BUCKET_BODIES = ("stack", "block", "twins")


class OneCheckpointLM(nn.Module):
    """Embedding, checkpointed modules that are no repeated block, norm and
    head: the checkpoints that fewer than two blocks but more than a
    bucket's parameters make (Note [Checkpoint bodies]).

    body: ``stack``, one checkpoint around an nn.Sequential of dissimilar
    layers; ``block``, one checkpoint around one large TransformerBlock;
    ``twins``, two blocks of one type (not reached by index, so no
    repeated block) each in its own checkpoint. dropout adds a random op to
    the stack.
    """

    def __init__(self, body: str = "stack", reentrant: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        if body not in BUCKET_BODIES:
            raise ValueError(body)
        self.body_kind, self.reentrant = body, reentrant
        self.embed = nn.Embedding(VOCAB, WIDTH)
        if body == "stack":
            layers = [nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH), nn.LayerNorm(WIDTH),
                      nn.Linear(WIDTH, 3 * WIDTH), nn.Tanh(), nn.Linear(3 * WIDTH, WIDTH)]
            if dropout:
                layers.insert(2, nn.Dropout(dropout))
            self.body = nn.Sequential(*layers)
        elif body == "block":
            self.body = TransformerBlock(WIDTH, heads=4, mlp_ratio=4)
        else:
            self.first = TransformerBlock(WIDTH, heads=4, mlp_ratio=2)
            self.second = TransformerBlock(WIDTH, heads=4, mlp_ratio=2)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        bodies = [self.first, self.second] if self.body_kind == "twins" else [self.body]
        for body in bodies:
            x = cp.checkpoint(body, x, use_reentrant=self.reentrant)
        return self.head(self.norm(x))


def build_one(body: str = "stack", reentrant: bool = False, dropout: float = 0.0, seed: int = 0) -> OneCheckpointLM:
    torch.manual_seed(seed)
    return OneCheckpointLM(body, reentrant, dropout)
