"""The training step's loss hand-out leaves the last stage as soon as its last microbatch's loss
is computed, not after its whole pipeline step (issue 34.3): in the V-shape (zbv) the last stage
sits on rank 0 beside the first, so rank 0 finishes last; rank 1 must get the step's loss and
run its optimizer step while rank 0 still runs its last backwards, as under torch's own
schedule. Order, not wall time: rank 0's last backward of a step waits until rank 1 has reached
that step's optimizer step (a file rank 1 writes); a hand-out sent after rank 0's step could
never arrive, and the step would fail after the wait's limit."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from fit_helpers import StepModule, cpu_trainer, fork_strategy
from torch import nn

DIM, BATCH, M, STEPS = 4, 8, 4, 3
WAIT_LIMIT_S = 60.0  # only a failure waits this long


class _Gate(torch.autograd.Function):
    """The identity; its backward runs ``gate.before_backward`` first."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, gate: Gated) -> torch.Tensor:  # type: ignore[override]
        ctx.gate = gate
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.gate.before_backward()
        return grad, None


class Gated(nn.Module):
    """The first layer (stage 0, on rank 0 in the V-shape, whose backward is rank 0's last
    action): the last microbatch's backward of training step ``k >= 2`` waits for rank 1's
    ``opt{k}`` file (step 1 hands out pickled, blocking: it learns the logged names)."""

    def __init__(self, out: str) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.out = out
        self.backwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return _Gate.apply(y, self) if torch.is_grad_enabled() else y  # type: ignore[no-any-return]

    def before_backward(self) -> None:
        self.backwards += 1
        step, left = divmod(self.backwards, M)
        if left or step < 2:
            return
        flag = Path(self.out, f"opt{step}")
        deadline = time.monotonic() + WAIT_LIMIT_S
        while not flag.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rank 1 did not reach its optimizer step {step} while rank 0 ran its last "
                    "backward: the loss hand-out waited for rank 0's whole step"
                )
            time.sleep(0.01)


class Model(StepModule):
    def __init__(self, out: str) -> None:
        torch.manual_seed(0)
        layers = [Gated(out), nn.Linear(DIM, DIM), nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)]
        super().__init__(layers, DIM, BATCH, STEPS)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, prog_bar=True)
        return loss


class OptimizerSteps(pl.Callback):
    """Rank 1 writes ``opt{k}`` when it reaches its ``k``-th optimizer step; every rank keeps
    the losses its training steps returned."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.steps = 0
        self.losses: list[float] = []

    def on_before_optimizer_step(self, trainer: pl.Trainer, *args: Any) -> None:
        self.steps += 1
        if trainer.global_rank == 1:
            Path(self.out, f"opt{self.steps}").touch()

    def on_train_batch_end(self, trainer: pl.Trainer, module: Any, outputs: Any, *a: Any) -> None:
        self.losses.append(float(outputs["loss"]))

    def on_train_end(self, trainer: pl.Trainer, *args: Any) -> None:
        Path(self.out, f"losses{trainer.global_rank}.json").write_text(json.dumps(self.losses))


@pytest.mark.dist
def test_the_other_rank_steps_its_optimizer_before_the_last_stage_ends(tmp_path: Path) -> None:
    strategy = fork_strategy(num_stages=2, num_microbatches=M, schedule="zbv", profile_steps=0)
    trainer = cpu_trainer(
        2,
        strategy,
        max_steps=STEPS,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[OptimizerSteps(str(tmp_path))],
    )
    trainer.fit(Model(str(tmp_path)))
    losses = [json.loads(Path(tmp_path, f"losses{r}.json").read_text()) for r in range(2)]
    assert len(losses[0]) == STEPS and losses[0] == losses[1]  # the step's loss on every rank
