"""What edges="auto" (the default) runs eagerly, by what each edge costs
(Note [Edges], Note [Edge costs] in planner/edges.go), across models whose
edges differ: the bench's edge class (bench.models, "tiny": the widths,
depths and vocabularies of the benchmark, with less batch)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from bench import models

pytest.importorskip("transformers")

PREAMBLE, TAIL = "preamble", "tail"

# model -> the edges that "auto" runs eagerly
CASES = {
    # the loss over GPT-2's vocabulary makes the tail several blocks' worth
    # of unfused work; the embeddings are a gather and an add
    "nanogpt": {PREAMBLE},
    "gpt_untied": {PREAMBLE},
    # BERT's MLM head: a transform, the decoder and the loss over 30,522 tokens
    "bert_mlm": {PREAMBLE},
    # a ViT's patch-embedding convolution is a kernel; its class head is small
    "vit": {PREAMBLE, TAIL},
    # a 65-character vocabulary: both edges are negligible, as regional
    # compilation leaves them
    "char_gpt": {PREAMBLE, TAIL},
    # the first piece is the token embedding alone
    "embed_only": {PREAMBLE},
}


def edges_run_eagerly(name, **options):
    torch._dynamo.reset()
    goddp.clear_plans()
    wl = models.build(name, "tiny")
    compiled = torch.compile(DDP(wl.model), backend="goddp",
                             options={"inner": "aot_eager", "strict": True, "log_plan": False, **options})
    wl.loss(compiled(*wl.inputs)).backward()
    plans = [p for p in goddp.last_plans() if p["num_pieces"] > 1]
    assert len(plans) == 1, goddp.last_plans()
    (plan,) = plans
    assert plan["fallback"] is None
    last = plan["num_pieces"] - 1
    eager = {p["index"] for p in plan["pieces"] if p["eager"]}
    assert eager <= {0, last}, plan["pieces"]
    return {PREAMBLE for p in eager if p == 0} | {TAIL for p in eager if p == last}


@pytest.mark.parametrize("name", sorted(CASES))
def test_auto_runs_eagerly_only_the_negligible_edges(dist_group, name):
    assert edges_run_eagerly(name) == CASES[name]


def test_eager_and_compile_override_the_costs(dist_group):
    assert edges_run_eagerly("nanogpt", edges="eager") == {PREAMBLE, TAIL}
    assert edges_run_eagerly("char_gpt", edges="compile") == set()
