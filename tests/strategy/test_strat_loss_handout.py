"""The training step's hand-out of the last stage's payload (``ModuleStep.share_training``):
every rank gets what ``share`` would give, the loss bit for bit, whichever rank is the last
stage; the last stage does not wait for the others when it sends the loss alone, or the loss
and values logged under the names, options and dtypes of the last pickled hand-out; the same
when the last stage started the hand-out inside the pipeline (``post_training``), and when the
other ranks posted their receive before the pipeline ran (``expect_training``: their hand-out
then makes no blocking broadcast of its own, issue 34.3)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from optpipe_lightning.strategy.lightning.module_steps import (
    LogLayout,
    ModuleStep,
    PipelineStepError,
)
from optpipe_lightning.strategy.runtime.process_groups import PipelineComm

LOSSES = [0.1, 0.7, 1.0 / 3.0]


ACC = 1.0 / 7.0  # not exact in float32's neighbours: a value carried through float64 must stay
COUNT = 2**40 + 3  # an integer log beyond float32


def _step(losses: list[float], logs: bool | str, error: str | None) -> ModuleStep:
    step = ModuleStep(None, "training_step", train=True)  # type: ignore[arg-type]
    step._losses = [torch.tensor(v) for v in losses]
    if logs:
        step._logs = [[("acc", torch.tensor(ACC), {"prog_bar": True})]]
        if logs == "count":
            step._logs[0].append(("count", torch.tensor(COUNT), {"reduce_fx": "sum"}))
    step.error = error
    return step


STEPS: list[tuple[list[float], bool | str, str | None]] = [
    (LOSSES, False, None),  # the loss alone: a tensor, the sender does not wait
    ([], False, None),
    (LOSSES, True, None),  # new logs: pickled, blocking; every rank learns their layout
    (LOSSES, False, "boom"),
    (LOSSES, True, None),  # the same logs again: values in the tensor, the sender does not wait
    (LOSSES, "count", None),  # another layout: pickled
    (LOSSES, "count", None),  # a large integer value travels exactly
    (LOSSES, False, None),  # no logs after some: pickled once, then the loss alone again
    (LOSSES, False, None),
]


MODES = (
    (0, "plain"),
    (1, "plain"),
    (0, "posted"),
    (1, "posted"),
    (0, "expected"),
    (1, "expected"),
)


def _worker(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        plain = PipelineComm(num_stages=world, global_rank=rank, pp_group=dist.group.WORLD)
        early = PipelineComm(
            num_stages=world,
            global_rank=rank,
            pp_group=dist.group.WORLD,
            handout_group=dist.new_group(list(range(world))),
        )
        rows: list[Any] = []
        blocking: list[Any] = []  # the hand-out group's broadcasts that wait, per mode
        real_broadcast = dist.broadcast

        def counted(tensor: Any, *a: Any, **kw: Any) -> Any:
            if kw.get("group") is early.handout_group and not kw.get("async_op", False):
                blocking[-1] += 1
            return real_broadcast(tensor, *a, **kw)

        dist.broadcast = counted  # type: ignore[assignment]
        # the last stage on rank 1 (1F1B) and on rank 0 (V-shape); then again with the hand-out
        # started inside the pipeline (``post_training``, on a group of its own); then with the
        # other ranks' receive also posted before the pipeline (``expect_training``)
        for last, mode in MODES:
            comm = early if mode != "plain" else plain
            layout = LogLayout()  # kept across steps, as the strategy keeps it
            blocking.append(0)
            for losses, logs, error in STEPS:
                kept: list[Any] = []
                step = _step(losses, logs, error)
                if mode == "expected":
                    step.expect_training(comm, last, torch.device("cpu"), layout)
                    assert (step._expected is not None) == (rank != last)
                if mode != "plain":
                    step.post_training(comm, last, torch.device("cpu"), layout)
                    assert (step._posted is not None) == (rank == last)
                try:
                    got = step.share_training(
                        comm,
                        last,
                        torch.device("cpu"),
                        lambda w, t, held=kept: held.append((w, t)),
                        layout,
                    )
                    rows.append(
                        (got.loss, [(n, v.dtype, v.item(), o) for n, v, o in got.logs], len(kept))
                    )
                except PipelineStepError as e:
                    rows.append(("error", str(e), len(kept)))
                assert step._expected is None  # taken by the hand-out
                for work, _ in kept:
                    work.wait()
        dist.broadcast = real_broadcast  # type: ignore[assignment]
        torch.save((rows, blocking), os.path.join(out, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_training_handout_matches_share_on_every_rank() -> None:
    world = 2
    with tempfile.TemporaryDirectory() as d:
        init = f"file://{os.path.join(d, 'store')}"
        mp.start_processes(
            _worker, args=(world, init, d), nprocs=world, join=True, start_method="fork"
        )
        saved = [torch.load(os.path.join(d, f"{r}.pt")) for r in range(world)]
    mean = float(torch.stack([torch.tensor(v) for v in LOSSES]).double().mean())
    acc = ("acc", torch.float32, torch.tensor(ACC).item(), {"prog_bar": True})
    count = ("count", torch.int64, COUNT, {"reduce_fx": "sum"})
    n = len(STEPS)
    for rank, (mine, blocking) in enumerate(saved):
        for run, (last, mode) in enumerate(MODES):
            if mode == "posted":  # the others receive after their step: one wait each
                assert blocking[run] == (0 if rank == last else n)
            if mode == "expected":  # their receive was posted before: no wait of its own
                assert blocking[run] == 0
            loss_only, empty, logged, failed, again, other, other_again, unlogged, plain = mine[
                n * run : n * run + n
            ]
            kept = 1 if rank == last else 0  # only the sender keeps a hand-out it did not wait for
            assert loss_only == (mean, [], kept)  # exact
            assert empty == (None, [], kept)
            assert logged == (mean, [acc], 0)  # new logs: the pickled path, blocking
            assert failed[0] == "error" and "boom" in failed[1] and failed[2] == 0
            assert again == (mean, [acc], kept)  # same layout: bit for bit, not waited for
            assert other == (mean, [acc, count], 0)
            assert other_again == (mean, [acc, count], kept)
            assert unlogged == (mean, [], 0)
            assert plain == (mean, [], kept)
