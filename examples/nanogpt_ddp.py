"""A nanoGPT-shaped training loop with goddp, on CPU with gloo.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 examples/nanogpt_ddp.py
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 examples/nanogpt_ddp.py --inner aot_eager --iters 4
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 examples/nanogpt_ddp.py --vocab-size 50304 \
        --n-layer 4 --n-embd 256 --block-size 128 --iters 12 --backend inductor   # torch's DDPOptimizer, to compare
    ... --auto-buckets --iters 10   # goddp measures the steps and chooses DDP's buckets (bucket_cap_mb="auto")
    ... --bf16-weights   # weights in bf16, LayerNorms in float32: DDP buckets the two dtypes apart
    ... --find-unused-parameters   # DDP as the Hugging Face Trainer sets it up: declaration-order buckets
    TORCH_LOGS=goddp ...   # also shows goddp's plan tables and the ranks' agreement

It has the shape of the training scripts people copy (nanoGPT's train.py
among them), written for this repository:

- ``model = DDP(torch.compile(model, backend="goddp"))``: Dynamo compiles the
  GPT's forward, which runs inside DDP's forward, so goddp plans it against
  that DDP module's buckets;
- the master process alone evaluates, under ``torch.no_grad()``, before the
  first training step and every ``--eval-interval`` steps. Rank 0 therefore
  compiles an evaluation graph that the other ranks never see;
- gradient accumulation turns DDP's gradient sync off for all but the last
  micro-step (``require_backward_grad_sync``).

goddp keeps the ranks in step here without any waiting at compile time: the
ranks agree on DDP's buckets at the first training call, where all of them
arrive (see README.md, "Several ranks"). Copy this file as a starting point;
the data is a synthetic token stream so that it runs anywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclasses.dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 256
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.dropout = config.dropout

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        # No causal-mask buffer: DDP would broadcast buffers at every forward,
        # a collective the rank evaluating alone cannot make.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, seq, width))


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm computed in its own dtype: with --bf16-weights the norms
    stay in float32 while the rest of the model is bf16."""

    def forward(self, x):
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(), nn.Linear(4 * config.n_embd, config.n_embd)
        )

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as GPT-2 does
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1)
        return logits, loss


@dataclasses.dataclass
class TrainConfig:
    iters: int = 6
    eval_interval: int = 4
    eval_iters: int = 2
    batch_size: int = 8
    grad_accum: int = 2
    lr: float = 1e-3
    bucket_cap_mb: float = 0.1  # small buckets, so that this small model has several
    compile: bool = True
    backend: str = "goddp"  # or "inductor": torch.compile's own, with torch's DDPOptimizer
    inner: str = "inductor"  # goddp's compiler for each piece
    auto_buckets: bool = False  # goddp chooses DDP's buckets by measured cost (bucket_cap_mb="auto")
    bf16_weights: bool = False  # weights in bf16, LayerNorms in float32 (two dtype groups)
    find_unused_parameters: bool = False  # as the Hugging Face Trainer's DDP sets it by default
    seed: int = 1337
    out: str = ""  # save a checkpoint here at the end (rank 0), as train.py does


def synthetic_tokens(config: GPTConfig, length: int = 1 << 14) -> torch.Tensor:
    """A token stream with structure to learn: a noisy repeating ramp."""
    g = torch.Generator().manual_seed(0)
    ramp = torch.arange(length) % config.vocab_size
    noise = torch.randint(0, config.vocab_size, (length,), generator=g)
    keep = torch.rand(length, generator=g) < 0.8
    return torch.where(keep, ramp, noise)


def get_batch(data: torch.Tensor, config: GPTConfig, batch_size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - config.block_size - 1, (batch_size,), generator=g)
    x = torch.stack([data[s : s + config.block_size] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + 1 + config.block_size] for s in starts.tolist()])
    return x, y


@torch.no_grad()
def estimate_loss(model, data, config: GPTConfig, train: TrainConfig) -> float:
    """Mean loss over a few batches, evaluated on this rank alone."""
    model.eval()
    losses = [model(*get_batch(data, config, train.batch_size, seed=10_000 + k))[1].item() for k in range(train.eval_iters)]
    model.train()
    return sum(losses) / len(losses)


def train(train: TrainConfig, config: GPTConfig | None = None, process_group=None, log=print) -> dict:
    """Trains a GPT under DDP; returns the loss of each iteration (the mean
    over micro-steps, on this rank), rank 0's evaluations, and the DDP
    module. Needs an initialized default process group."""
    config = config or GPTConfig()
    rank = dist.get_rank()
    master_process = rank == 0
    torch.manual_seed(train.seed)  # the same initial weights on every rank
    model = GPT(config)
    if train.bf16_weights:
        model.to(torch.bfloat16)
        for module in model.modules():
            if isinstance(module, LayerNorm):
                module.float()
    if train.compile and train.backend == "goddp":
        options = {"inner": train.inner, **({"bucket_cap_mb": "auto"} if train.auto_buckets else {})}
        model = torch.compile(model, backend="goddp", options=options)
    elif train.compile:
        model = torch.compile(model, backend=train.backend)
    model = DDP(model, process_group=process_group, bucket_cap_mb=train.bucket_cap_mb,
                find_unused_parameters=train.find_unused_parameters)
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.lr)
    data = synthetic_tokens(config)

    losses, evaluations, seconds = [], [], []
    for iter_num in range(train.iters):
        if iter_num % train.eval_interval == 0 and master_process:
            evaluations.append(estimate_loss(model, data, config, train))
            log(f"iter {iter_num}: eval loss {evaluations[-1]:.4f}")
        started = time.perf_counter()
        total = 0.0
        for micro_step in range(train.grad_accum):
            # Sync gradients on the last micro-step only.
            model.require_backward_grad_sync = micro_step == train.grad_accum - 1
            seed = 1_000_000 * rank + 1000 * iter_num + micro_step
            _, loss = model(*get_batch(data, config, train.batch_size, seed))
            (loss / train.grad_accum).backward()
            total += loss.item() / train.grad_accum
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
        seconds.append(time.perf_counter() - started)
        if master_process:
            log(f"iter {iter_num}: loss {total:.4f}, {1000 * seconds[-1]:.0f} ms")
    if master_process and train.out:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": train.iters},
                   train.out)
    return {"losses": losses, "evaluations": evaluations, "model": model, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.type == "bool" or isinstance(field.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            parser.add_argument(flag, type=type(field.default), default=field.default)
    for field in dataclasses.fields(GPTConfig):  # the model's size, e.g. --vocab-size 50257
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(field.default), default=field.default)
    args = vars(parser.parse_args())
    model_args = {f.name: args.pop(f.name) for f in dataclasses.fields(GPTConfig)}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo")
    try:
        result = train(TrainConfig(**args), GPTConfig(**model_args))
        if dist.get_rank() == 0:
            final = result["losses"][-1]
            steady = sorted(result["seconds"][2:])  # after the compile and DDP's bucket rebuild
            median = steady[len(steady) // 2] if steady else float("nan")
            print(f"done: final loss {final:.4f} (perplexity {math.exp(final):.1f}), first iteration "
                  f"{result['seconds'][0]:.2f} s, steady iteration {1000 * median:.0f} ms (median of {len(steady)})")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
