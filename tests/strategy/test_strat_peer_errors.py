"""The first real error of any rank reaches every rank's console as one line naming the rank,
and a lost rank ends the others with one line (issues 37.6 and 33.2). Two processes as
Lightning's popen workers; rank 1 (the last stage) fails or is killed in its third forward."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from pipelined_lm import launch, trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.strategy import PipelineSpec
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

pytestmark = pytest.mark.dist

DIM = 4


class Bomb(nn.Module):
    """A layer that fails (or kills its process) in its ``at``-th forward."""

    def __init__(self, how: str, at: int = 3) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.how, self.at, self.calls = how, at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.at:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("boom in the last stage")
        return self.lin(x)


class Model(pl.LightningModule):
    def __init__(self, how: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Linear(DIM, DIM), nn.Linear(DIM, DIM), Bomb(how)])

    def configure_pipeline(self) -> PipelineSpec:
        return PipelineSpec(layers=list(self.blocks), loss_fn=nn.functional.mse_loss)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(1)
        ds = TensorDataset(torch.randn(16, DIM, generator=g), torch.randn(16, DIM, generator=g))
        return DataLoader(ds, batch_size=4)


def _session(workdir: Path, how: str) -> None:
    rank = int(os.environ["LOCAL_RANK"])
    err = os.open(Path(workdir, f"stderr{rank}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(err, 2)  # this rank's console (fd 2 and Python's stderr)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 (the process's)
    strategy = OptPipeStrategy(
        num_stages=2,
        num_microbatches=2,
        partition=[2, 1],
        schedule="gpipe",
        profile_steps=0,
        online_resolve=False,
        use_database=False,
    )
    trainer(2, strategy, max_steps=4).fit(Model(how))


def _console(workdir: Path, rank: int) -> str:
    return Path(workdir, f"stderr{rank}.txt").read_text()


def test_a_real_error_on_one_rank_is_one_line_on_every_rank(tmp_path: Path) -> None:
    errors = launch(2, lambda: _session(tmp_path, "raise"), tmp_path)
    assert errors[0] == "SystemExit: 1", errors  # rank 0: no traceback of the hang-up
    assert "ValueError: boom in the last stage" in Path(tmp_path, "rank1.txt").read_text()
    line = "optpipe: rank 1 failed: ValueError: boom in the last stage"
    for rank in range(2):
        assert line in _console(tmp_path, rank), (rank, _console(tmp_path, rank)[-3000:])
    zero = _console(tmp_path, 0)
    assert "Traceback" not in zero and "Connection closed by peer" not in zero, zero[-3000:]


def test_a_lost_rank_ends_the_others_with_one_line(tmp_path: Path) -> None:
    errors = launch(2, lambda: _session(tmp_path, "kill"), tmp_path)
    assert errors[0] == "SystemExit: 1", errors
    zero = _console(tmp_path, 0)
    assert "optpipe: rank 1 was lost (process " in zero, zero[-3000:]
    assert "Traceback" not in zero, zero[-3000:]
