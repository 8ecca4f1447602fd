"""What the Lightning fit tests of the strategy share: the strategy and the Trainer as they run
them (forked ranks on CPU, quiet), a module of chained layers, the final checkpoint, and the
comparison with a one-device reference."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from optpipe_lightning.strategy import PipelineSpec
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy


def fork_strategy(**opts: Any) -> OptPipeStrategy:
    """``OptPipeStrategy(**opts)`` with the tests' defaults: forked ranks, no re-solve during the
    run, no profiles database (each one can be given)."""
    opts.setdefault("start_method", "fork")
    opts.setdefault("online_resolve", False)
    opts.setdefault("use_database", False)
    return OptPipeStrategy(**opts)


def cpu_trainer(devices: int, strategy: Any = "auto", **kwargs: Any) -> pl.Trainer:
    """A Trainer on ``devices`` CPU processes that writes nothing of its own (no logger, no
    checkpoint callback, no progress bar, no model summary); ``kwargs`` go to the Trainer."""
    kwargs.setdefault("enable_checkpointing", False)
    return pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


class SaveFinal(pl.Callback):
    """The full checkpoint at the end of fit: ``<out>/final.ckpt`` (``final_state`` reads it)."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.save_checkpoint(os.path.join(self.out, "final.ckpt"))


def final_state(out: Path) -> dict[str, torch.Tensor]:
    """The module's state in the checkpoint ``SaveFinal`` wrote to ``out``."""
    state: dict[str, torch.Tensor] = torch.load(out / "final.ckpt", weights_only=False)[
        "state_dict"
    ]
    return state


def assert_same_state(
    state: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], atol: float = 1e-5
) -> None:
    """The same keys as ``ref``; floating tensors within ``atol`` (no relative slack), the rest
    equal."""
    assert set(state) == set(ref)
    for k, v in ref.items():
        if v.dtype.is_floating_point:
            torch.testing.assert_close(state[k], v, atol=atol, rtol=0, msg=k)
        else:
            assert torch.equal(state[k], v), (k, state[k], v)


def fingerprints() -> tuple[Any, Any]:
    """A hardware and a model fingerprint (two 4x4 linear layers on two CPU stages) for the run
    log's tests."""
    from optpipe_lightning.strategy.scheduling.profiler import (
        hardware_fingerprint,
        model_fingerprint,
    )

    layers = [nn.Linear(4, 4), nn.Linear(4, 4)]
    hw = hardware_fingerprint(torch.device("cpu"), 2, "gloo")
    return hw, model_fingerprint("m", layers, 2, 2, 1, [1, 1])


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, y)


class ChainModule(pl.LightningModule):
    """A module of ``layers`` run one after another (``self.blocks``, the pipeline's layers), the
    mean squared error as its loss and SGD at lr 0.1; a subclass gives the layers and the data."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(layers)

    def configure_pipeline(self) -> PipelineSpec:
        return PipelineSpec(layers=list(self.blocks), loss_fn=mse)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class StepModule(ChainModule):
    """A ``ChainModule`` whose loss is its own ``training_step`` (the path a module's step takes
    through the pipeline: ``ModuleStep``), SGD at lr 0.01, and ``steps`` generated batches of
    ``batch`` rows of width ``dim``."""

    def __init__(self, layers: list[nn.Module], dim: int, batch: int, steps: int) -> None:
        super().__init__(layers)
        self.dim, self.batch, self.steps = dim, batch, steps

    def configure_pipeline(self) -> PipelineSpec:
        return PipelineSpec(layers=list(self.blocks))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return mse(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        from torch.utils.data import DataLoader, TensorDataset

        g = torch.Generator().manual_seed(1)
        n, d = self.batch * self.steps, self.dim
        data = TensorDataset(torch.randn(n, d, generator=g), torch.randn(n, d, generator=g))
        return DataLoader(data, batch_size=self.batch)
