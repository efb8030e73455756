"""Benchmark models, each with named size presets.

Every model is a Module of our own: Dynamo does not compile frames inside
torch.nn, so a bare nn.Sequential under DDP would silently run eagerly.
Weights are random (seeded); nothing is downloaded.

`build(name, size)` returns a `Workload`: the module, a fixed input batch
and the loss to minimise, so a training step is
    loss = workload.loss(model(*workload.inputs)); loss.backward()
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn


class MLPStack(nn.Module):
    """`depth` square Linear layers of `width` with ReLU in between; the
    layers listed in `half` are kept in bf16 (parameters of two dtypes)."""

    def __init__(self, width: int, depth: int, half: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        for i in half:
            self.layers[i].to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x.to(layer.weight.dtype))).float()
        return x


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.n_head, c // self.n_head)
        q, k, v = (y.view(shape).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


CHECKPOINTING = ("none", "block", "stack")


class GPTLike(nn.Module):
    """A GPT-2-shaped decoder: learned positions, pre-LN blocks, tied head.

    The tied embedding/head weight is used twice in the graph, which is
    exactly the case where counting bytes per use and per parameter differ.
    """

    def __init__(self, vocab: int, ctx: int, d_model: int, n_layer: int, n_head: int,
                 checkpoint: str = "none") -> None:
        super().__init__()
        if checkpoint not in CHECKPOINTING:
            raise ValueError(f"checkpoint={checkpoint!r}: expected one of {CHECKPOINTING}")
        # Activation checkpointing: "block" checkpoints each block,
        # non-reentrant (HF's, torchtitan's per-layer mode); "stack" puts one
        # checkpoint around all the blocks.
        self.checkpoint = checkpoint
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(ctx, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02 / (math.sqrt(2 * n_layer) if "out" in name or "proj" in name else 1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        if self.checkpoint == "block":
            for block in self.blocks:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        elif self.checkpoint == "stack":
            x = torch.utils.checkpoint.checkpoint(self.run_blocks, x, use_reentrant=False)
        else:
            x = self.run_blocks(x)
        return self.head(self.ln_f(x))

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class LossLM(GPTLike):
    """GPTLike as language-model training scripts write it (nanoGPT's
    train.py among them): the loss over the vocabulary inside forward, a
    tied or untied head, and position embeddings or none (the first piece
    then only the token embedding)."""

    def __init__(self, vocab: int, ctx: int, d_model: int, n_layer: int, n_head: int,
                 tied: bool = True, positions: bool = True) -> None:
        super().__init__(vocab, ctx, d_model, n_layer, n_head)
        if not tied:
            self.head.weight = nn.Parameter(self.wte.weight.detach().clone())
        if not positions:
            del self.wpe
        self.positions = positions

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        if self.positions:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        logits = self.head(self.ln_f(self.run_blocks(x)))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _hf_model(kind: str, **config):
    """A Hugging Face model built from its config (random weights, nothing
    downloaded): "bert_mlm" BertForMaskedLM, "vit" ViTForImageClassification."""
    import transformers

    if kind == "bert_mlm":
        return transformers.BertForMaskedLM(transformers.BertConfig(**config))
    return transformers.ViTForImageClassification(transformers.ViTConfig(**config))


class ConvNet(nn.Module):
    """A VGG-like stack of 3x3 convolutions with pooling and a linear head.

    Most parameters sit in the last layers, whose gradients are ready first
    in backward, the friendly case for overlapping allreduce with backward.
    """

    def __init__(self, channels: tuple[int, ...], image: int, classes: int) -> None:
        super().__init__()
        convs, c_in, side = [], 3, image
        for i, c_out in enumerate(channels):
            convs.append(nn.Conv2d(c_in, c_out, 3, padding=1))
            c_in = c_out
            if i % 2 == 1:
                side //= 2
        self.convs = nn.ModuleList(convs)
        self.fc = nn.Linear(c_in * side * side, 1024)
        self.head = nn.Linear(1024, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = torch.relu(conv(x))
            if i % 2 == 1:
                x = F.max_pool2d(x, 2)
        return self.head(torch.relu(self.fc(x.flatten(1))))


class DeepThinStack(nn.Module):
    """Thousands of tiny Linear + tanh layers: a big graph with little compute.

    Each layer adds about four FX nodes (two parameter placeholders, linear,
    tanh), so `layers` ~ nodes / 4. Used to measure compile and planning cost.
    """

    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _mse_to_zero(out: torch.Tensor) -> torch.Tensor:
    return out.float().pow(2).mean()


def _next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _the_loss(out: torch.Tensor) -> torch.Tensor:
    return out  # the model returns its loss


def _hf_loss(out) -> torch.Tensor:
    return out.loss


@dataclass
class Workload:
    name: str
    size: str
    model: nn.Module
    inputs: tuple
    loss: Callable[[torch.Tensor], torch.Tensor]
    description: str
    meta: dict = field(default_factory=dict)

    @property
    def grad_bytes(self) -> int:
        """Bytes DDP allreduces per step: each trainable parameter once."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)


# Hugging Face configs drop out by default; the benchmarks compare variants
# step for step, so their models do not.
_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

# Size presets. "quick" keeps one developer run within minutes on 2 cores;
# "full" is what the lead's scheduled run uses.
PRESETS: dict[str, dict[str, dict]] = {
    "mlp": {
        "tiny": dict(width=512, depth=4, batch=8),
        "quick": dict(width=2048, depth=8, batch=32),
        "full": dict(width=2048, depth=8, batch=32),
    },
    "gpt": {
        "tiny": dict(vocab=512, ctx=32, d_model=64, n_layer=2, n_head=2, batch=2),
        "quick": dict(vocab=8192, ctx=128, d_model=384, n_layer=4, n_head=6, batch=2),
        # GPT-2 small: 124M parameters, ~500 MB of gradients per step.
        "full": dict(vocab=50257, ctx=128, d_model=768, n_layer=12, n_head=12, batch=2),
    },
    # The edges' class (Note [Edges] in planner/edges.go; bench.edges): what
    # lies before the first block and after the last differs per model.
    # "tiny" keeps the widths, depths and vocabularies that decide, with less batch.
    "nanogpt": {  # tied head, the loss over GPT-2's vocabulary inside forward
        "tiny": dict(vocab=50304, ctx=64, d_model=256, n_layer=4, n_head=4, batch=2),
        "quick": dict(vocab=50304, ctx=128, d_model=256, n_layer=4, n_head=4, batch=8),
    },
    "gpt_untied": {
        "tiny": dict(vocab=50304, ctx=64, d_model=256, n_layer=4, n_head=4, batch=2, tied=False),
        "quick": dict(vocab=50304, ctx=128, d_model=256, n_layer=4, n_head=4, batch=8, tied=False),
    },
    "char_gpt": {  # nanoGPT's shakespeare_char: a 65-character vocabulary
        "tiny": dict(vocab=65, ctx=64, d_model=256, n_layer=4, n_head=4, batch=2),
        "quick": dict(vocab=65, ctx=128, d_model=256, n_layer=4, n_head=4, batch=8),
    },
    "embed_only": {  # no position embedding: the first piece is the token embedding alone
        "tiny": dict(vocab=4096, ctx=64, d_model=256, n_layer=4, n_head=4, batch=2, positions=False),
        "quick": dict(vocab=4096, ctx=128, d_model=256, n_layer=4, n_head=4, batch=8, positions=False),
    },
    "bert_mlm": {  # HF BertForMaskedLM: the MLM head and its loss over 30,522 tokens
        "tiny": dict(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=128, ctx=64, batch=2, **_NO_DROPOUT),
        "quick": dict(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=1024, max_position_embeddings=128, ctx=128, batch=8, **_NO_DROPOUT),
    },
    "vit": {  # HF ViTForImageClassification: a patch-embedding convolution, a small class head
        "tiny": dict(image_size=64, patch_size=8, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, num_labels=10, batch=2, **_NO_DROPOUT),
        "quick": dict(image_size=128, patch_size=16, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=1024, num_labels=10, batch=16, **_NO_DROPOUT),
    },
    "conv": {
        "tiny": dict(channels=(8, 8, 16, 16), image=16, classes=10, batch=2),
        "quick": dict(channels=(32, 32, 64, 64, 128, 128), image=32, classes=100, batch=8),
        "full": dict(channels=(64, 64, 128, 128, 256, 256, 512, 512), image=64, classes=1000, batch=8),
    },
}


def build(name: str, size: str = "quick", seed: int = 0, **overrides) -> Workload:
    """Build model `name` at preset `size`; keyword overrides win over the preset."""
    params = {**PRESETS[name][size], **overrides}
    gen = torch.Generator().manual_seed(seed + 1)
    torch.manual_seed(seed)
    batch = params.pop("batch")
    if name == "mlp":
        half = tuple(params.get("half", ()))
        model = MLPStack(params["width"], params["depth"], half)
        inputs = (torch.randn(batch, params["width"], generator=gen),)
        loss = _mse_to_zero
        desc = f"MLP {params['depth']}x{params['width']}^2, batch {batch}" + (f", layers {list(half)} in bf16" if half else "")
    elif name == "gpt":
        model = GPTLike(**params)
        tokens = torch.randint(params["vocab"], (batch, params["ctx"] + 1), generator=gen)
        inputs = (tokens[:, :-1].contiguous(),)
        targets = tokens[:, 1:].contiguous()
        loss = lambda logits: _next_token_loss(logits, targets)  # noqa: E731
        desc = (f"GPT {params['n_layer']}L d{params['d_model']} vocab {params['vocab']}, "
                f"batch {batch}x{params['ctx']}"
                + (f", checkpoint per {params['checkpoint']}" if params.get("checkpoint", "none") != "none" else ""))
    elif name in ("nanogpt", "gpt_untied", "char_gpt", "embed_only"):
        model = LossLM(**params)
        tokens = torch.randint(params["vocab"], (batch, params["ctx"] + 1), generator=gen)
        inputs = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        loss = _the_loss
        desc = (f"GPT {params['n_layer']}L d{params['d_model']} vocab {params['vocab']}, loss inside, "
                f"{'tied' if params.get('tied', True) else 'untied'} head, batch {batch}x{params['ctx']}")
    elif name == "bert_mlm":
        ctx = params.pop("ctx")
        model = _hf_model(name, **params)
        tokens = torch.randint(params["vocab_size"], (batch, ctx), generator=gen)
        labels = torch.where(torch.rand(batch, ctx, generator=gen) < 0.15, tokens, -100)
        inputs = (tokens, None, None, None, None, None, None, labels)  # forward(input_ids, 6 more, labels)
        loss = _hf_loss
        desc = f"BertForMaskedLM {params['num_hidden_layers']}L d{params['hidden_size']} vocab {params['vocab_size']}, batch {batch}x{ctx}"
    elif name == "vit":
        model = _hf_model(name, **params)
        inputs = (torch.randn(batch, 3, params["image_size"], params["image_size"], generator=gen),
                  torch.randint(params["num_labels"], (batch,), generator=gen))  # pixel_values, labels
        loss = _hf_loss
        desc = (f"ViTForImageClassification {params['num_hidden_layers']}L d{params['hidden_size']}, "
                f"{params['image_size']}px / {params['patch_size']}, batch {batch}")
    elif name == "conv":
        model = ConvNet(tuple(params["channels"]), params["image"], params["classes"])
        inputs = (torch.randn(batch, 3, params["image"], params["image"], generator=gen),)
        loss = _mse_to_zero
        desc = f"ConvNet {len(params['channels'])} convs to {params['channels'][-1]}ch, {params['image']}px, batch {batch}"
    elif name == "deep":
        model = DeepThinStack(params["layers"], params["width"])
        inputs = (torch.randn(batch, params["width"], generator=gen),)
        loss = _mse_to_zero
        desc = f"{params['layers']} x Linear({params['width']}) + tanh, batch {batch}"
    else:
        raise KeyError(f"unknown model {name!r}; known: {sorted(PRESETS)}")
    n_params = sum(p.numel() for p in model.parameters())
    return Workload(name, size, model, inputs, loss, desc,
                    meta={**params, "batch": batch, "parameters": n_params})


def deep_stack(nodes: int, width: int = 32, batch: int = 4, seed: int = 0) -> Workload:
    """A DeepThinStack with about `nodes` FX nodes."""
    return build("deep", "custom", seed=seed, layers=max(1, nodes // 4), width=width, batch=batch)


PRESETS["deep"] = {"custom": dict(layers=256, width=32, batch=4)}
