"""Every layout the layers allow runs, equal to one device (CPU/gloo), or is one line up front.

- Uneven layer groups: 6 layers in 2 stages x 2 chunks ([2, 2, 1, 1]: 3 layers per device,
  which 2 chunks do not divide) after profiling (the profiled problem once failed validation
  with a pydantic traceback).
- What crosses a boundary is made sendable by the strategy: a layer whose output is
  non-contiguous (a transpose), a middle stage ending in ``nn.Linear`` on a 3-D input (a view:
  torch's split backward cannot detach it in place), a stage starting with a transpose (its input
  gradient is non-contiguous, which gloo refuses).
- ``BatchNorm1d`` on one-sample microbatches: one line on every rank naming the fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import pytest
import torch
from fit_helpers import ChainModule, SaveFinal, assert_same_state, final_state, fork_strategy, mse
from pipelined_lm import launch, trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.strategy import PipelineSpec
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

pytestmark = pytest.mark.dist

BATCH, M, D, STEPS = 8, 4, 6, 3


class Transposed(nn.Module):
    """[B, D, S] -> [B, D, S] through a transpose on each side: the output is non-contiguous and
    so is the gradient of the input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x.transpose(1, 2))).transpose(1, 2)


def _layers(kind: str) -> list[nn.Module]:
    torch.manual_seed(0)
    if kind == "plain":
        return [nn.Sequential(nn.Linear(D, D), nn.Tanh()) for _ in range(6)]
    if kind == "views":  # nn.Linear on a contiguous 3-D input: every layer's output is a view
        return [nn.Sequential(nn.Tanh(), nn.Linear(D, D)) for _ in range(6)]
    # alternating: a transposing layer, then nn.Linear on the 3-D input (its output is a view)
    return [Transposed() if i % 2 == 0 else nn.Linear(D, D) for i in range(6)]


class Model(ChainModule):
    def __init__(self, kind: str) -> None:
        super().__init__(_layers(kind))
        self.kind = kind

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(3)
        shape = (BATCH, D) if self.kind == "plain" else (BATCH, D, D)  # 3-D: [B, D, S]
        ds = TensorDataset(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g))
        return DataLoader(ds, batch_size=BATCH)


def reference(kind: str) -> dict[str, torch.Tensor]:
    model = Model(kind)
    opt = model.configure_optimizers()
    x, y = next(iter(model.train_dataloader()))
    for _ in range(STEPS):
        opt.zero_grad()
        for xm, ym in zip(x.chunk(M), y.chunk(M), strict=True):
            (mse(model(xm), ym) / M).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def fit(tmp: Path, kind: str, devices: int = 2, **opts: Any) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    opts.setdefault("profile_steps", 0)
    strategy = fork_strategy(num_stages=devices, num_microbatches=M, repartition=False, **opts)
    tr = trainer(
        devices,
        strategy,
        max_steps=STEPS,
        max_epochs=None,
        callbacks=[SaveFinal(str(tmp))],
        use_distributed_sampler=False,
    )
    tr.fit(Model(kind))


def check(tmp: Path, ref: dict[str, torch.Tensor]) -> None:
    assert_same_state(final_state(tmp), ref)


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "zbv"])
def test_uneven_layer_groups_after_profiling(tmp_path: Path, schedule: str) -> None:
    """6 layers on 2 stages x 2 chunks: groups [2, 2, 1, 1] (3 layers per device), profiled."""
    fit(tmp_path, "plain", schedule=schedule, profile_steps=1)
    check(tmp_path, reference("plain"))


def test_views_on_four_stages_with_profiling(tmp_path: Path) -> None:
    """4 processes, 1F1B after a profiled step: profiling runs the split backward, where the
    two middle stages end in nn.Linear on a 3-D input (views)."""
    fit(tmp_path, "views", devices=4, schedule="1f1b", profile_steps=1)
    check(tmp_path, reference("views"))


@pytest.mark.parametrize(
    ("kind", "schedule", "partition"),
    [
        ("transposed", "1f1b", [3, 3]),  # stage 0 ends in a transpose: non-contiguous output
        ("transposed", "zb-h1", [2, 4]),  # split backward; stage 1 starts with a transpose
        ("transposed", "zbv", None),  # non-contiguous outputs and input gradients in a V
        ("transposed", "interleaved-1f1b", None),
        # split backward in a V: the middle groups end in nn.Linear on 3-D (a view, which the
        # input-gradient pass cannot detach in place: "Can't detach views in-place")
        ("views", "zbv", None),
    ],
)
def test_boundaries_are_made_sendable(
    tmp_path: Path, kind: str, schedule: str, partition: list[int] | None
) -> None:
    fit(tmp_path, kind, schedule=schedule, partition=partition)
    check(tmp_path, reference(kind))


class BatchNormModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            [nn.Linear(D, D), nn.Sequential(nn.BatchNorm1d(D), nn.Tanh()), nn.Linear(D, 2)]
        )

    def configure_pipeline(self) -> PipelineSpec:
        return PipelineSpec(layers=list(self.blocks), loss_fn=mse)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(3)
        ds = TensorDataset(torch.randn(4, D, generator=g), torch.randn(4, 2, generator=g))
        return DataLoader(ds, batch_size=4)


def _batchnorm_session(workdir: Path) -> None:
    rank = int(os.environ["LOCAL_RANK"])
    got: dict[str, str] = {}
    cases: list[tuple[str, int | Literal["auto"]]] = [("explicit", 4), ("auto", "auto")]
    for name, m in cases:
        strategy = OptPipeStrategy(
            num_microbatches=m,
            schedule="1f1b",
            profile_steps=0,
            online_resolve=False,
            use_database=False,
        )
        try:
            trainer(2, strategy, max_steps=1).fit(BatchNormModel())
            got[name] = "no error"
        except Exception as e:
            got[name] = f"{type(e).__name__}: {e}"
    Path(workdir, f"bn{rank}.json").write_text(json.dumps(got))


def test_batchnorm_one_sample_microbatches_refused_on_every_rank(tmp_path: Path) -> None:
    launch(2, lambda: _batchnorm_session(tmp_path), tmp_path)
    ranks = [json.loads(Path(tmp_path, f"bn{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]
    explicit = ranks[0]["explicit"]
    assert explicit.startswith("OptPipeConfigError: BatchNorm1d 'blocks.1.0' cannot train on")
    assert "num_microbatches in [2]" in explicit and "\n" not in explicit
    # "auto" keeps two samples per microbatch: 2 microbatches of 2 on 2 stages
    assert ranks[0]["auto"] == "no error"
