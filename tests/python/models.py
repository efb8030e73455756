"""The model zoo shared by goddp's parity and distributed tests.

Every model is a module class of its own: Dynamo never compiles frames that
live inside torch.nn itself, so a bare nn.Sequential placed directly under
DistributedDataParallel would run eagerly and nothing would be planned.
Containers from torch.nn are fine *inside* these models, because their
forward is inlined into the frame of the model that calls them.

Sizes are kept small enough for CPU tests but large enough (mostly 1-2 MiB of
parameters) that both DDP's default 1 MiB first bucket and the small explicit
caps listed on each entry close buckets in the middle of the model, so the
planners have several cuts to agree or disagree on.

Each ZooEntry knows how to build its model deterministically, how to make a
batch (per-seed, so ranks can feed different data), how to turn the output
into a scalar loss, and how to wrap it in DDP (including the parameters DDP
must ignore, which have to be registered before wrapping).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from torch.nn.parallel import DistributedDataParallel as DDP

KIB = 1024
MIB = 1024 * 1024


# --------------------------------------------------------------------------
# Building blocks


class Feedforward(nn.Module):
    """Linear-ReLU-Linear, the unit that several zoo models repeat."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(F.relu(self.up(x)))


class MMLinear(nn.Module):
    """A linear layer written as torch.mm(x, self.w.t()).

    The transpose reaches the Dynamo graph as a call_method node on the
    parameter placeholder, which torch's DDPOptimizer counts through a
    separate code path from plain function arguments.
    """

    def __init__(self, fan_in: int, fan_out: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(fan_out, fan_in) / fan_in**0.5)
        self.b = nn.Parameter(torch.zeros(fan_out))

    def forward(self, x):
        return torch.mm(x, self.w.t()) + self.b


# --------------------------------------------------------------------------
# The models


class MLPStack(nn.Module):
    """A plain stack of Linear+ReLU layers (about 1.4 MiB of parameters)."""

    def __init__(self, fan_in: int = 64, width: int = 256, depth: int = 5, fan_out: int = 16):
        super().__init__()
        self.inp = nn.Linear(fan_in, width)
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.out = nn.Linear(width, fan_out)

    def forward(self, x):
        h = F.relu(self.inp(x))
        for layer in self.hidden:
            h = F.relu(layer(h))
        return self.out(h)


class SquareStack(nn.Module):
    """``depth`` Linear(width, width) layers with ReLU after each: every layer
    holds the same bytes, which makes bucket arithmetic in tests easy."""

    def __init__(self, width: int = 64, depth: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class Tower(nn.Module):
    """``depth`` Linear(32, 32) layers with tanh after each: the workers'
    model (_elastic_worker.py, _compiled_autograd_worker.py)."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class ConvBNNet(nn.Module):
    """Convolutions with BatchNorm: running statistics are buffers (not
    parameters) that DDP broadcasts and neither planner may count."""

    def __init__(self, channels=(3, 32, 64, 128, 128, 128), classes: int = 10):
        super().__init__()
        layers = []
        for c_in, c_out in zip(channels[:-1], channels[1:]):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels[-1], classes)

    def forward(self, x):
        h = self.features(x)
        return self.head(h.mean(dim=(2, 3)))


class TransformerBlock(nn.Module):
    """Pre-norm attention + MLP block. Attention is written out with matmul
    and softmax (not scaled_dot_product_attention) so eager and compiled runs
    use the same kernels and can be compared bitwise."""

    def __init__(self, width: int = 192, heads: int = 4, mlp_ratio: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = Feedforward(width, mlp_ratio * width)

    def forward(self, x):
        batch, seq, width = x.shape
        head_dim = width // self.heads
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.reshape(batch, seq, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) * head_dim**-0.5
        attended = torch.matmul(scores.softmax(dim=-1), v)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.mlp(self.norm2(x))


class TransformerStack(nn.Module):
    """Three TransformerBlocks and a Linear head: the repeated blocks that
    goddp cuts at and compiles once."""

    def __init__(self, width: int = 64, heads: int = 4, depth: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(TransformerBlock(width, heads) for _ in range(depth))
        self.head = nn.Linear(width, width)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class TiedEmbeddingLM(nn.Module):
    """A tiny language model whose output projection reuses the embedding
    matrix. The shared weight appears twice in the graph: torch's
    DDPOptimizer counts it at both uses, DDP counts it once, and its gradient
    is ready only after the embedding's backward (the very end)."""

    def __init__(self, vocab: int = 2048, width: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.body = nn.ModuleList(Feedforward(width, 2 * width) for _ in range(2))
        self.norm = nn.LayerNorm(width)
        self.out_bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.body:
            h = h + block(h)
        return F.linear(self.norm(h), self.embed.weight, self.out_bias)


class PartlyIgnoredMLP(MLPStack):
    """An MLP of which one hidden layer is excluded from DDP via
    DDP._set_params_and_buffers_to_ignore_for_model (see IGNORED below)."""

    IGNORED = ("hidden.2.weight", "hidden.2.bias")


class PartlyFrozenMLP(MLPStack):
    """An MLP whose first two layers do not require gradients."""

    def __init__(self):
        super().__init__()
        for p in list(self.inp.parameters()) + list(self.hidden[0].parameters()):
            p.requires_grad_(False)


class MMStack(nn.Module):
    """Layers written as torch.mm(x, w.t()) (see MMLinear)."""

    def __init__(self, fan_in: int = 64, width: int = 256, depth: int = 5):
        super().__init__()
        self.layers = nn.ModuleList(MMLinear(fan_in if i == 0 else width, width) for i in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = F.relu(layer(x))
        return x


class PreambleMLP(nn.Module):
    """An MLP behind a parameter-free preamble: the first nodes of the graph
    use no parameter, so the last bucket found walking backwards is empty and
    torch's DDPOptimizer folds it into its neighbour."""

    def __init__(self, fan_in: int = 32, width: int = 256, depth: int = 5):
        super().__init__()
        self.inp = nn.Linear(2 * fan_in, width)
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        x = F.layer_norm(x, x.shape[-1:])
        x = torch.cat([x, torch.sin(x) * 0.5], dim=-1)
        h = F.relu(self.inp(x))
        for layer in self.hidden:
            h = F.relu(layer(h))
        return h


class CheckpointedStack(nn.Module):
    """Feedforward blocks under non-reentrant activation checkpointing: each
    checkpointed call is one higher-order-op node in the Dynamo graph, taking
    the block's parameters as arguments, that a cut cannot split."""

    def __init__(self, width: int = 192, depth: int = 4):
        super().__init__()
        self.blocks = nn.ModuleList(Feedforward(width, 2 * width) for _ in range(depth))
        self.head = nn.Linear(width, width)

    def forward(self, x):
        for block in self.blocks:
            x = x + torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return self.head(x)


class AutocastMLP(nn.Module):
    """An MLP whose middle layers run under CPU bfloat16 autocast; the
    autocast enter/exit nodes bracket part of the graph, and cuts may fall
    inside the region. Parameters stay float32."""

    def __init__(self, fan_in: int = 64, width: int = 256, depth: int = 5):
        super().__init__()
        self.inp = nn.Linear(fan_in, width)
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.out = nn.Linear(width, 16)

    def forward(self, x):
        h = F.relu(self.inp(x))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for layer in self.hidden[:-1]:
                h = F.relu(layer(h))
        h = F.relu(self.hidden[-1](h.float()))
        return self.out(h)


class GraphBreakMLP(nn.Module):
    """Two halves separated by an explicit graph break: Dynamo compiles two
    frames (the forward and its resume function), each planned on its own."""

    def __init__(self, fan_in: int = 64, width: int = 256, depth: int = 10):
        super().__init__()
        self.inp = nn.Linear(fan_in, width)
        self.first = nn.ModuleList(nn.Linear(width, width) for _ in range(depth // 2))
        self.second = nn.ModuleList(nn.Linear(width, width) for _ in range(depth - depth // 2))

    def forward(self, x):
        h = F.relu(self.inp(x))
        for layer in self.first:
            h = F.relu(layer(h))
        torch._dynamo.graph_break()
        for layer in self.second:
            h = F.relu(layer(h))
        return h


class ToyModel(nn.Module):
    """torch's DDPOptimizer example: 10 -> 5000 -> 5000 -> 5000 -> 5 with
    ReLUs (about 191 MiB of float32 parameters). With a 25 MiB cap torch
    splits it into 3 pieces."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(10, 5000), nn.ReLU(),
            nn.Linear(5000, 5000), nn.ReLU(),
            nn.Linear(5000, 5000), nn.ReLU(),
            nn.Linear(5000, 5),
        )

    def forward(self, x):
        return self.net(x)


# --------------------------------------------------------------------------
# Inputs and losses


def _float_batch(*shape):
    def make(seed: int):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, generator=g),)

    return make


def _token_batch(vocab, *shape):
    def make(seed: int):
        g = torch.Generator().manual_seed(seed)
        return (torch.randint(0, vocab, shape, generator=g),)

    return make


def mean_square_loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().pow(2).mean()


# --------------------------------------------------------------------------
# The registry


@dataclasses.dataclass(frozen=True)
class ZooEntry:
    name: str
    model_cls: Callable[[], nn.Module]
    make_inputs: Callable[[int], tuple]  # seed -> positional args of forward
    # Small caps for planner-vs-planner tests so that several pieces appear.
    cap_bytes: int
    first_cap_bytes: int
    # bucket_cap_mb for DDP itself (DDP then uses it as the first cap too).
    ddp_cap_mb: float
    ignored: tuple = ()
    frames: int = 1  # number of Dynamo frames (graph breaks + 1)
    shares_params: bool = False
    big: bool = False  # too large for many iterations on CPU

    def build(self, seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        return self.model_cls()

    def wrap(self, model: nn.Module, **ddp_kwargs) -> DDP:
        """Wrap in DDP, first registering the parameters it must ignore."""
        if self.ignored:
            DDP._set_params_and_buffers_to_ignore_for_model(model, list(self.ignored))
        return DDP(model, **ddp_kwargs)

    def loss(self, out) -> torch.Tensor:
        return mean_square_loss(out)


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in [
        ZooEntry("mlp", MLPStack, _float_batch(8, 64), 200 * KIB, 100 * KIB, 0.25),
        ZooEntry("conv_bn", ConvBNNet, _float_batch(4, 3, 8, 8), 400 * KIB, 200 * KIB, 0.5),
        ZooEntry("transformer", TransformerBlock, _float_batch(2, 16, 192), 400 * KIB, 200 * KIB, 0.5),
        ZooEntry("blocks", TransformerStack, _float_batch(2, 8, 64), 100 * KIB, 50 * KIB, 0.125),
        ZooEntry("tied", TiedEmbeddingLM, _token_batch(2048, 4, 16), 300 * KIB, 150 * KIB, 0.25, shares_params=True),
        ZooEntry(
            "ignored", PartlyIgnoredMLP, _float_batch(8, 64), 200 * KIB, 100 * KIB, 0.25,
            ignored=PartlyIgnoredMLP.IGNORED,
        ),
        ZooEntry("frozen", PartlyFrozenMLP, _float_batch(8, 64), 200 * KIB, 100 * KIB, 0.25),
        ZooEntry("mm", MMStack, _float_batch(8, 64), 200 * KIB, 100 * KIB, 0.25),
        ZooEntry("preamble", PreambleMLP, _float_batch(8, 32), 200 * KIB, 100 * KIB, 0.25),
        ZooEntry("checkpoint", CheckpointedStack, _float_batch(8, 192), 400 * KIB, 200 * KIB, 0.5),
        ZooEntry("autocast", AutocastMLP, _float_batch(8, 64), 200 * KIB, 100 * KIB, 0.25),
        ZooEntry("graph_break", GraphBreakMLP, _float_batch(8, 64), 200 * KIB, 100 * KIB, 0.25, frames=2),
        ZooEntry("toy", ToyModel, _float_batch(1, 10), 25 * MIB, MIB, 25, big=True),
    ]
}

SMALL_ZOO = [name for name, e in ZOO.items() if not e.big]


def param_bytes(model: nn.Module) -> int:
    """Bytes of the distinct parameters that require gradients."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
