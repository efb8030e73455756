"""Hugging Face Trainer with goddp: a tiny GPT-2 on 2 CPU ranks.

    torchrun --standalone --nproc_per_node=2 examples/hf_trainer.py [--eager]

The recipe is one line before the Trainer is made:

    model.compile(backend="goddp", options={...})

``nn.Module.compile`` compiles the module in place: the model keeps its
class and its ``forward`` signature, so the Trainer still sees the column
names it feeds (no ``remove_unused_columns=False`` needed), saves the model
as usual, and accelerate wraps it in DistributedDataParallel as usual. The
compiled forward then runs inside DDP's forward, where goddp plans its cuts.

``TrainingArguments(torch_compile=True, torch_compile_backend="goddp")``
does not work: accelerate keeps the backend in a ``DynamoBackend`` enum that
lists a fixed set of names, and rejects any other ("'GODDP' is not a valid
DynamoBackend") before training starts.

The Trainer turns on DDP's ``find_unused_parameters`` unless gradient
checkpointing is on. DDP then never rebuilds its buckets and keeps the ones
it filled in declaration order; goddp gives it per-bucket caps for that
order, so those buckets are goddp's pieces (``goddp.last_plans()[i]
["alignment"] == "declaration-order caps"``).

The model is built from a config in code: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile

import torch
from torch.utils.data import Dataset

import goddp

VOCAB = 128
SEQ = 32


def tiny_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=3, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # deterministic: loss comparable with eager
    )
    return GPT2LMHeadModel(config)


class Tokens(Dataset):
    """Random token sequences, identical on every rank (the sampler shards them)."""

    def __init__(self, n: int, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(*, compiled: bool, steps: int, output_dir: str, options: dict | None = None, **training_args):
    """Trains the tiny GPT-2 for `steps` steps; returns the logged losses
    and the Trainer (``trainer.model_wrapped`` is the DDP module)."""
    from transformers import Trainer, TrainingArguments

    model = tiny_gpt2()
    if compiled:
        # The recipe: compile in place, before the Trainer wraps the model.
        model.compile(backend="goddp", options=options or {"inner": "aot_eager"})
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
        **training_args,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(4 * steps * max(1, args.world_size)))
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry], trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--bucket-cap-mb", type=float, default=0.25,
                        help="goddp's bucket cap: small, so that the tiny model is cut at all")
    parser.add_argument("--inner", default="aot_eager", help="goddp's inner compiler (aot_eager or inductor)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if int(os.environ.get("RANK", "0")) == 0:
        logging.getLogger("goddp").setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as out:
        eager, _ = train(compiled=False, steps=args.steps, output_dir=out)
        torch._dynamo.reset()
        options = {"inner": args.inner, "bucket_cap_mb": args.bucket_cap_mb}
        compiled, _ = train(compiled=True, steps=args.steps, output_dir=out, options=options)
    if int(os.environ.get("RANK", "0")) == 0:
        plans = goddp.last_plans()
        print("losses eager:", eager)
        print("losses goddp:", compiled)
        for plan in plans:
            print(json.dumps({k: plan[k] for k in ("num_pieces", "ddp_buckets", "fallback")}))


if __name__ == "__main__":
    main()
