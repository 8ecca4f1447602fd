"""A model built in ``configure_model`` (meta device, sharded) whose LM head is assigned the
input embedding's weight (``head.weight = embed.weight``, the usual way to tie): every holder
keeps the tied weight and training equals one device (a later stage holds a BatchNorm too)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from fit_helpers import assert_same_state, cpu_trainer, fork_strategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optpipe_lightning.strategy import PipelineSpec
from optpipe_lightning.strategy.runtime.materialize import build_on_meta, materialise

V, D, T, B, M, SEED, STEPS = 16, 8, 3, 8, 4, 0, 3


class Block(nn.Module):
    def __init__(self, bn: bool) -> None:
        super().__init__()
        # no bias before a BatchNorm: its gradient is zero up to rounding, which Adam would
        # blow up into steps of lr size that differ between any two summation orders
        self.lin = nn.Linear(D, D, bias=not bn)
        self.bn = nn.BatchNorm1d(D) if bn else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.bn is not None:
            y = self.bn(y.reshape(-1, D)).reshape(y.shape)
        return x + F.gelu(y)


class TiedLM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.blocks: nn.ModuleList | None = None

    def configure_model(self) -> None:
        if self.blocks is None:
            self.embed = nn.Embedding(V, D)
            self.blocks = nn.ModuleList(Block(bn=i >= 2) for i in range(4))
            self.head = nn.Linear(D, V, bias=False)
            self.head.weight = self.embed.weight  # tied: one parameter, two modules

    def layers(self) -> list[nn.Module]:
        assert self.blocks is not None
        return [self.embed, *self.blocks, self.head]

    def configure_pipeline(self) -> PipelineSpec:
        return PipelineSpec(layers=self.layers())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers():
            x = layer(x)
        return x

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader[Any]:
        x = torch.randint(V, (B * STEPS, T + 1), generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x[:, :-1], x[:, 1:]), batch_size=B)


def one_device(steps: int) -> dict[str, torch.Tensor]:
    """One device, each batch in M microbatches (gradient accumulation), as the pipeline runs."""
    pl.seed_everything(SEED, verbose=False)
    model = TiedLM()
    model.configure_model()
    opt = model.configure_optimizers()
    for k, (x, y) in enumerate(model.train_dataloader()):
        if k == steps:
            break
        opt.zero_grad()
        for xm, ym in zip(x.chunk(M), y.chunk(M), strict=True):
            (F.cross_entropy(model(xm).flatten(0, 1), ym.flatten()) / M).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("keep", [{0, 1, 2}, {3, 4, 5}])
def test_a_weight_assigned_to_two_layers_survives_the_drop_on_each_holder(keep: set[int]) -> None:
    ref = one_device(0)
    pl.seed_everything(SEED, verbose=False)
    model = TiedLM()
    build_on_meta(model)
    materialise(model, model.layers(), keep, torch.device("cpu"))
    assert model.head.weight is model.embed.weight
    assert not model.embed.weight.is_meta  # before: dropped with the other rank's layer
    torch.testing.assert_close(model.embed.weight.detach(), ref["embed.weight"], rtol=0, atol=0)


@pytest.mark.dist
@pytest.mark.parametrize(("schedule", "stages"), [("1f1b", 2), ("zbv", 2), ("zb-h1", 4)])
def test_a_meta_built_model_with_an_assigned_tied_weight_trains_as_on_one_device(
    schedule: str, stages: int
) -> None:
    ref = one_device(STEPS)
    pl.seed_everything(SEED, verbose=False)
    model = TiedLM()
    strategy = fork_strategy(
        num_microbatches=M,
        schedule=schedule,
        profile_steps=0,
        repartition=False,
        full_model_after_fit=True,
    )
    trainer = cpu_trainer(
        stages,
        strategy,
        max_steps=STEPS,
        use_distributed_sampler=False,  # batch statistics: the DataLoader's order, as one device
    )
    trainer.fit(model)
    assert_same_state(model.state_dict(), ref, atol=2e-5)
