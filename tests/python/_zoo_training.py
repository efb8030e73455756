"""Training loops that the two-rank files of DDP's settings share
(test_dist_builtin_hooks, test_dist_static_graph, test_dist_delayed_allreduce):
a zoo entry trained step by step, compared bitwise with eager DDP."""

from __future__ import annotations

import torch
import torch.distributed as dist

from _dist_util import rank


def train(entry, ddp, forward, steps, first=0, evaluate_first=False, optimizer=None, barrier_group=None, inputs_for=None):
    """SGD with momentum (a fresh one unless given); (losses, gradients
    after each backward). With evaluate_first, rank 0 alone first evaluates
    a batch of another size. barrier_group: a barrier before the gradients
    are read (gloo's waits for the work before it), for an allreduce DDP
    itself never waits on (delay_all_reduce_named_params). inputs_for(step):
    the step's inputs, instead of the entry's for this rank and step (a
    case's own doings before a step go there too)."""
    if evaluate_first and rank() == 0:
        ddp.eval()
        with torch.no_grad():
            forward(torch.randn(5, 8, 64, generator=torch.Generator().manual_seed(7)))
        ddp.train()
    optimizer = optimizer or torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses, grads = [], []
    for step in range(first, first + steps):
        optimizer.zero_grad(set_to_none=True)
        inputs = inputs_for(step) if inputs_for is not None else entry.make_inputs(100 * rank() + step)
        loss = entry.loss(forward(*inputs))
        loss.backward()
        if barrier_group is not None:
            dist.barrier(barrier_group)
        grads.append([p.grad.clone() for p in ddp.parameters()])
        optimizer.step()
        losses.append(loss.detach().clone())
    return losses, grads


def assert_bitwise(got, want, what):
    """Each step's tensors (or lists of them) equal to the last bit."""
    assert len(got) == len(want), what
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g if isinstance(g, list) else [g], w if isinstance(w, list) else [w])):
            assert torch.equal(a, b), f"{what}, step {step}, tensor {i}: max diff {(a - b).abs().max().item()}"
