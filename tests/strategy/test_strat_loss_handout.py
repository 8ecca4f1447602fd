"""The training step's hand-out of the last stage's payload (``ModuleStep.share_training``):
every rank gets what ``share`` would give, the loss bit for bit, whichever rank is the last
stage; the last stage does not wait for the others when it sends the loss alone."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from optpipe_lightning.strategy.lightning.module_steps import ModuleStep, PipelineStepError
from optpipe_lightning.strategy.runtime.process_groups import PipelineComm

LOSSES = [0.1, 0.7, 1.0 / 3.0]


def _step(losses: list[float], logs: bool, error: str | None) -> ModuleStep:
    step = ModuleStep(None, "training_step", train=True)  # type: ignore[arg-type]
    step._losses = [torch.tensor(v) for v in losses]
    if logs:
        step._logs = [[("acc", torch.tensor(0.5), {})]]
    step.error = error
    return step


def _worker(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        comm = PipelineComm(num_stages=world, global_rank=rank, pp_group=dist.group.WORLD)
        rows: list[Any] = []
        for last in range(world):  # the last stage on rank 1 (1F1B) and on rank 0 (V-shape)
            for losses, logs, error in (
                (LOSSES, False, None),
                ([], False, None),
                (LOSSES, True, None),
                (LOSSES, False, "boom"),
            ):
                kept: list[Any] = []
                step = _step(losses, logs, error)
                try:
                    got = step.share_training(
                        comm, last, torch.device("cpu"), lambda w, t, held=kept: held.append((w, t))
                    )
                    rows.append((got.loss, [n for n, _, _ in got.logs], len(kept)))
                except PipelineStepError as e:
                    rows.append(("error", str(e), len(kept)))
                for work, _ in kept:
                    work.wait()
        torch.save(rows, os.path.join(out, f"{rank}.pt"))
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
        rows = [torch.load(os.path.join(d, f"{r}.pt")) for r in range(world)]
    mean = float(torch.stack([torch.tensor(v) for v in LOSSES]).double().mean())
    for rank, mine in enumerate(rows):
        for last in range(world):
            loss_only, empty, logged, failed = mine[4 * last : 4 * last + 4]
            sender = rank == last
            assert loss_only == (mean, [], 1 if sender else 0)  # exact; only the sender keeps it
            assert empty == (None, [], 1 if sender else 0)
            assert logged == (mean, ["acc"], 0)  # logs: the pickled path, blocking
            assert failed[0] == "error" and "boom" in failed[1] and failed[2] == 0
