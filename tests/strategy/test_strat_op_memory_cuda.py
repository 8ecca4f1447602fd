"""The profiler's allocator watch on CUDA (``strategy/runtime/op_memory.py``): its windows, one per
action, tile a real step of the executor, and torch's split backward shows in them (F leaves at
least what autograd saved, B keeps gradients for W, W frees).

Marked ``gpu`` (skipped without CUDA); ``benchmarks/gpu_check`` runs it on the GPU machine.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from optpipe_lightning.schedule import Action
from optpipe_lightning.schedule.baselines import make_schedule

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_the_windows_tile_a_cuda_step_and_show_the_split_backward() -> None:
    from gpu_check.stage import (
        LayerShape,
        harness_problem,
        harness_row,
        incoming_grad_loss,
        make_layers,
        process_group,
    )

    from optpipe_lightning.strategy.runtime.engine import PipelineEngine

    dev = torch.device("cuda", torch.cuda.current_device())
    shape, n, m = LayerShape(512, 8, 256, 2), 2, 4
    order: list[Action] = []
    for i in range(m):  # split and fused backward alternate, as the profiling schedule's
        order.append(Action("F", i))
        order += [Action("B", i), Action("W", i)] if i % 2 == 0 else [Action("BW", i)]
    costs = {"t_f": 1.0, "t_b": 1.0, "t_w": 1.0, "t_bw": 2.0, "m_f": 1.0}
    pb = harness_problem(m, costs, 0.1)
    engine = PipelineEngine(
        make_layers(shape, n, torch.float32, dev, seed=5),
        incoming_grad_loss,
        pb,
        make_schedule(pb, "t", [harness_row(order)]),
        [1, n],
        0,
        process_group(),
        dev,
        measure=True,
    )
    watch = engine.cursor.memory
    assert watch is not None and engine.cursor.watch_memory
    x = torch.randn(m * shape.batch, shape.seq, shape.hidden, device=dev)
    g = torch.randn_like(x)
    engine.step(x, g)  # warm-up
    engine.cursor.drop_times()
    assert watch.samples == {}
    watch.trace = []
    engine.step(x, g)
    trace = watch.trace
    assert len(trace) == len(harness_row(order))
    # each window starts where the one before it ended: nothing falls between them
    for (_, _, start, left, _), (_, _, nxt, _, _) in itertools.pairwise(trace):
        assert start + left == nxt
    assert all(t >= 0 for *_, t in trace)
    s = watch.chunk_samples(1)
    saved = engine.cursor.saved_bytes[1][-1]
    assert all(d >= 0.9 * saved for d, _ in s["F"])  # what autograd saved, and the output
    assert all(d > 0 for d, _ in s["B"])  # the input-gradient pass keeps gradients for W
    assert all(d < 0 for d, _ in s["W"]) and all(d < 0 for d, _ in s["BW"])
    assert watch.take_peak() >= max(start for _, _, start, _, _ in trace)
