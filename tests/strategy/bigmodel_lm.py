"""A module that builds its layers in ``configure_model`` (the big-model path), for the tests."""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optpipe_lightning.strategy import PipelineSpec

BATCH, M, DIM, N_LAYERS, SEED = 8, 4, 6, 8, 1234


class Scaled(nn.Module):
    """A layer with its own ``init_weights`` (run at construction, as on one device)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.gain = nn.Parameter(torch.empty(DIM))
        self.init_weights()

    def init_weights(self) -> None:
        self.lin.reset_parameters()
        nn.init.normal_(self.gain, 1.0, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) * self.gain


def make_layers() -> list[nn.Module]:
    out: list[nn.Module] = [nn.Linear(DIM, DIM)]
    for i in range(N_LAYERS - 2):
        if i % 2:
            out.append(Scaled())
        else:
            out.append(nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, DIM), nn.Tanh()))
    out.append(nn.Linear(DIM, 2))
    return out


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, y)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, 2, generator=g))


class BigLM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.blocks: nn.ModuleList | None = None

    def configure_model(self) -> None:
        if self.blocks is None:  # idempotent, as Lightning asks
            self.blocks = nn.ModuleList(make_layers())

    def configure_pipeline(self) -> PipelineSpec:
        assert self.blocks is not None
        return PipelineSpec(layers=list(self.blocks), loss_fn=loss_fn)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(data(), batch_size=BATCH)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(data(), batch_size=BATCH)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(data(), batch_size=BATCH)


def one_device() -> BigLM:
    """The module as one device builds it under the same seed."""
    pl.seed_everything(SEED, verbose=False)
    model = BigLM()
    model.configure_model()
    return model


def run(model: BigLM, x: torch.Tensor) -> torch.Tensor:
    assert model.blocks is not None
    for b in model.blocks:
        x = b(x)
    return x


def reference(steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single-process training: losses per step and the final state."""
    model = one_device()
    opt = model.configure_optimizers()
    x, y = data().tensors
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        parts = [loss_fn(run(model, xm), ym) for xm, ym in zip(x.chunk(M), y.chunk(M), strict=True)]
        loss = torch.stack(parts).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def env_rank(trainer: Any) -> int:
    return int(os.environ.get("LOCAL_RANK", trainer.global_rank))
