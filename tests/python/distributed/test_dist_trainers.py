"""The README's trainer recipes, run as written in examples/, on 2 ranks.

Inside each rank (pytest under torchrun, 2 ranks, gloo, CPU):

- Hugging Face ``Trainer`` (examples/hf_trainer.py): a tiny GPT-2 built in
  code, compiled in place with ``model.compile(backend="goddp")`` before the
  Trainer is made;
- Lightning (examples/lightning_ddp.py): ``torch.compile`` of a
  LightningModule under ``DDPStrategy``.

Each recipe trains a few steps eagerly and then with goddp, from the same
weights and data; the logged losses must be equal (aot_eager runs eager's
aten kernels, so bit for bit), goddp must have cut the model's graph into
several pieces and set DDP's buckets to them (the Trainer's default
find_unused_parameters=True makes DDP keep declaration-order buckets, which
goddp aligns with caps for that order), and DDP's own report of its
buckets must list exactly the plan's bucket sizes.

A plain pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import importlib.util
import tempfile

import pytest
import torch

import goddp
from _dist_util import REPO_ROOT, assert_file_passes_under_torchrun, needs_two_ranks

STEPS = 3

pytest.importorskip("transformers")
pytest.importorskip("lightning")


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"goddp_example_{name}", REPO_ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model_plan() -> dict:
    """The plan of the graph that holds the model's parameters (a trainer
    may compile more graphs after graph breaks, holding none)."""
    plans = [p for p in goddp.last_plans() if p["buckets"]]
    assert len(plans) == 1, goddp.last_plans()
    return plans[0]


def _ddp_bucket_sizes(ddp) -> list[int]:
    """The bucket sizes DDP reports: its rebuilt buckets if it rebuilt them,
    else the ones it was built with (which is all it ever has under
    find_unused_parameters=True)."""
    data = ddp._get_ddp_logging_data()
    sizes = data["rebuilt_bucket_sizes"] if data.get("has_rebuilt_buckets") else data["bucket_sizes"]
    return [int(s) for s in sizes.split(", ")]


def _assert_planned_and_aligned(ddp, alignment: str) -> dict:
    plan = _model_plan()
    assert plan["fallback"] is None, plan["fallback"]
    assert plan["num_pieces"] > 1, plan
    assert plan["ddp_buckets"]["aligned"] is True, plan["ddp_buckets"]
    assert plan["alignment"] == alignment
    assert _ddp_bucket_sizes(ddp) == [b["bytes"] for b in plan["buckets"]]
    return plan


@needs_two_ranks
def test_hf_trainer_recipe(dist_group):
    hf = _example("hf_trainer")
    options = {"inner": "aot_eager", "bucket_cap_mb": 0.25, "strict": True, "log_plan": False}
    with tempfile.TemporaryDirectory() as out:
        eager, _ = hf.train(compiled=False, steps=STEPS, output_dir=out)
        torch._dynamo.reset()
        goddp.clear_plans()
        compiled, trainer = hf.train(compiled=True, steps=STEPS, output_dir=out, options=options)
    assert len(eager) == STEPS
    assert compiled == eager
    # The Trainer's default: DDP never rebuilds, goddp aligns its
    # declaration-order buckets (GPT-2 declares its blocks in forward order).
    ddp = trainer.model_wrapped
    assert ddp.find_unused_parameters is True
    _assert_planned_and_aligned(ddp, "declaration-order caps")


@needs_two_ranks
def test_hf_trainer_recipe_with_gradient_checkpointing(dist_group):
    # TrainingArguments(gradient_checkpointing=True): HF checkpoints each
    # GPT-2 block (Note [Checkpoint bodies]); the Trainer then leaves
    # find_unused_parameters off, so DDP rebuilds its buckets in ready order.
    hf = _example("hf_trainer")
    options = {"inner": "aot_eager", "bucket_cap_mb": 0.25, "strict": True, "log_plan": False}
    with tempfile.TemporaryDirectory() as out:
        eager, _ = hf.train(compiled=False, steps=STEPS, output_dir=out, gradient_checkpointing=True)
        torch._dynamo.reset()
        goddp.clear_plans()
        compiled, trainer = hf.train(
            compiled=True, steps=STEPS, output_dir=out, options=options, gradient_checkpointing=True
        )
    assert len(eager) == STEPS
    assert compiled == eager
    ddp = trainer.model_wrapped
    assert ddp.find_unused_parameters is False
    plan = _assert_planned_and_aligned(ddp, "ready-order caps")
    # three GPT-2 blocks, each checkpointed, compiled once
    blocks = [p for p in plan["pieces"] if p["same_as"] != p["index"]]
    assert len(blocks) == 2, plan["pieces"]


def _ddp_keeper():
    """A Lightning callback that keeps the DDP module at the end of training
    (Lightning unwraps it on teardown)."""
    import lightning as L

    class Keeper(L.Callback):
        ddp = None

        def on_train_end(self, trainer, pl_module):
            self.ddp = trainer.strategy.model

    return Keeper()


# torch 2.13's Dynamo cannot trace Lightning's self.log: an
# InternalTorchDynamoError inside inspect.signature, with backend="eager"
# just as with goddp; 2.14 traces it. Strict, so that a torch that can shows.
_TORCH_RELEASE = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
_lightning_needs_torch_2_14 = pytest.mark.xfail(
    _TORCH_RELEASE < (2, 14),
    raises=torch._dynamo.exc.InternalTorchDynamoError,
    strict=True,
    reason="torch 2.13's Dynamo fails to trace Lightning's self.log, whatever the backend",
)


@needs_two_ranks
@_lightning_needs_torch_2_14
def test_lightning_recipe(dist_group):
    lit = _example("lightning_ddp")
    keeper = _ddp_keeper()
    options = {"inner": "aot_eager", "strict": True, "log_plan": False}
    eager, eager_params, _ = lit.train(compiled=False, steps=STEPS)
    torch._dynamo.reset()
    goddp.clear_plans()
    compiled, goddp_params, _ = lit.train(compiled=True, steps=STEPS, options=options, callbacks=[keeper])
    assert len(eager) == STEPS
    assert compiled == eager
    torch.testing.assert_close(goddp_params, eager_params, rtol=0, atol=0)
    _assert_planned_and_aligned(keeper.ddp, "ready-order caps")


@pytest.mark.single_process
def test_trainer_recipes_under_torchrun():
    assert_file_passes_under_torchrun(__file__, timeout=540)
