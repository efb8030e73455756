"""Lightning with goddp: a compiled LightningModule under DDPStrategy, 2 CPU ranks.

    torchrun --standalone --nproc_per_node=2 examples/lightning_ddp.py

The recipe:

    module = torch.compile(MyLightningModule(), backend="goddp", options={...})
    trainer = L.Trainer(strategy=DDPStrategy(process_group_backend="gloo"), ...)
    trainer.fit(module, loader)

Lightning unwraps the compiled module and compiles its ``forward`` and
``training_step`` with the same Dynamo settings; DDPStrategy wraps the
module in DistributedDataParallel, whose forward calls ``training_step``,
so goddp plans inside DDP's forward. ``self.log`` breaks the graph: the
first graph holds every parameter, the one after the break none (goddp
lists the break in its plan log and spends nothing on that graph).
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import goddp

WIDTH = 128


def make_data(n: int = 256, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, WIDTH, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return TensorDataset(x, y)


def lightning_module(depth: int = 6, seed: int = 0):
    import lightning as L

    class MLPModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(seed)
            self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(depth))
            self.head = nn.Linear(WIDTH, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            return self.head(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            self.log("train_loss", loss)  # breaks the graph: see the module doc
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return MLPModule()


class LossRecorder:
    """Collects each step's loss (a Lightning callback, built lazily so that
    importing this file does not import Lightning)."""

    def __new__(cls):
        import lightning as L

        class _Recorder(L.Callback):
            def __init__(self) -> None:
                self.losses: list[float] = []

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                self.losses.append(float(outputs["loss"]))

        return _Recorder()


def train(*, compiled: bool, steps: int, options: dict | None = None, bucket_cap_mb: float = 0.125,
          find_unused_parameters: bool = False, callbacks: list | None = None):
    """Trains for `steps` steps; returns the per-step losses, the final
    parameters (flattened) and the Trainer (``trainer.strategy.model`` is
    the DDP module)."""
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    module = lightning_module()
    if compiled:
        module = torch.compile(module, backend="goddp", options=options or {"inner": "aot_eager"})
    recorder = LossRecorder()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy=DDPStrategy(
            process_group_backend="gloo", bucket_cap_mb=bucket_cap_mb,
            find_unused_parameters=find_unused_parameters,
        ),
        max_steps=steps,
        callbacks=[recorder, *(callbacks or [])],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(make_data(), batch_size=16, shuffle=False)
    trainer.fit(module, loader)
    target = getattr(module, "_orig_mod", module)
    return recorder.losses, torch.cat([p.detach().flatten() for p in target.parameters()]), trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--inner", default="aot_eager", help="goddp's inner compiler (aot_eager or inductor)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if int(os.environ.get("RANK", "0")) == 0:
        logging.getLogger("goddp").setLevel(logging.INFO)
    eager, eager_params, _ = train(compiled=False, steps=args.steps)
    torch._dynamo.reset()
    compiled, goddp_params, _ = train(compiled=True, steps=args.steps, options={"inner": args.inner})
    if int(os.environ.get("RANK", "0")) == 0:
        print("losses eager:", eager)
        print("losses goddp:", compiled)
        print("largest parameter difference:", float((eager_params - goddp_params).abs().max()))
        for plan in goddp.last_plans():
            print(json.dumps({k: plan[k] for k in ("num_pieces", "ddp_buckets", "fallback")}))


if __name__ == "__main__":
    main()
