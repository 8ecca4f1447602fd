"""Precision under the pipeline (CPU/gloo): bf16-mixed, bf16-true and 16-mixed (grad scaler)
train equal to one device in the same precision, with every stage skipping the same steps.

Each run is compared with one device in the same precision accumulating the microbatches'
gradients (one backward of ``loss / M`` per microbatch, the same samples in each): the pipeline
computes the same low-precision matmuls over the same rows and sums the fp32 (bf16-true: bf16)
gradients in the same order, so the parameters after 4 SGD steps are equal (0.0 difference
measured; 1e-6 allowed). The same samples must form the same microbatches: low precision rounds
each microbatch's sums, so a permutation of the batch (Lightning's distributed sampler shuffles
training data) moves bf16 results by an ulp, which SGD carries on (up to 4e-4 after 4 steps).

On CPU, ``Trainer(precision="16-mixed")`` is turned into ``bf16-mixed`` by Lightning itself
("AMP with fp16 is not supported on CPU"); torch's CPU autocast and ``GradScaler("cpu")`` do run
fp16, so the 16-mixed cases pass Lightning's plugin explicitly:
``plugins=[MixedPrecision("16-mixed", "cpu", scaler=GradScaler("cpu"))]``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from fit_helpers import ChainModule, assert_same_state, cpu_trainer, final_state, fork_strategy, mse
from lightning.pytorch.plugins import MixedPrecision
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.strategy.lightning.precision import activation_dtype
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

BATCH, M, DIM, N_LAYERS, STEPS = 8, 4, 8, 6, 4
POISON_STEP = 1  # 16-mixed: layer 0's weight gradient is inf in this step (stage 0 only)


class _Poison(torch.autograd.Function):
    """Identity on the weight; its gradient is inf in step ``POISON_STEP`` (counted by calls)."""

    @staticmethod
    def forward(ctx: Any, w: torch.Tensor, owner: PoisonLinear) -> torch.Tensor:
        ctx.owner = owner
        return w.view_as(w)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        owner = ctx.owner
        owner.calls += 1
        if owner.poison and (owner.calls - 1) // M == POISON_STEP:
            return torch.full_like(grad, float("inf")), None
        return grad, None


class PoisonLinear(nn.Linear):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, _Poison.apply(self.weight, self), self.bias)


def _layers() -> list[nn.Module]:
    torch.manual_seed(0)
    out: list[nn.Module] = [nn.Sequential(PoisonLinear(DIM, DIM), nn.Tanh())]
    out += [nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(N_LAYERS - 2)]
    out.append(nn.Linear(DIM, 2))
    return out


class Model(ChainModule):
    def __init__(self, poison: bool = False) -> None:
        super().__init__(_layers())
        for m in self.blocks.modules():
            if isinstance(m, PoisonLinear):
                m.poison = poison

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(7)
        ds = TensorDataset(
            torch.randn(BATCH, DIM, generator=g) * 3, torch.randn(BATCH, 2, generator=g)
        )
        return DataLoader(ds, batch_size=BATCH)


def reference(precision: str, clip: float | None = None) -> tuple[dict[str, torch.Tensor], float]:
    """One device, the same precision, the loss the mean over the M microbatches."""
    model = Model(poison=precision == "16-mixed")
    x, y = next(iter(model.train_dataloader()))
    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
        x, y = x.bfloat16(), y.bfloat16()
    opt = model.configure_optimizers()
    scaler = torch.amp.GradScaler("cpu") if precision == "16-mixed" else None
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    for _ in range(STEPS):
        opt.zero_grad()
        # one backward per microbatch of loss / M (gradient accumulation on one device: the
        # order the pipeline sums the microbatches' gradients in)
        for xm, ym in zip(x.chunk(M), y.chunk(M), strict=True):
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = mse(model(xm), ym) / M
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        if scaler is not None:
            scaler.unscale_(opt)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
    scale = scaler.get_scale() if scaler is not None else 1.0
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}, scale


class Recorder(pl.Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.save_checkpoint(os.path.join(self.out, "final.ckpt"))
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        strat = trainer.strategy
        assert isinstance(strat, OptPipeStrategy) and strat.scheduler is not None
        fp = strat.scheduler._model_fp
        profile = strat.scheduler.profile
        info = {
            "scale": None if scaler is None else float(scaler.get_scale()),
            "dtype": None if fp is None else fp.dtype,
            "activation_bytes": None
            if profile is None
            else [s.activation_bytes for s in sorted(profile.stages, key=lambda s: s.stage)],
        }
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(info))


def run(
    tmp: Path, precision: str, schedule: str, profile_steps: int = 0, **trainer_kw: Any
) -> list[dict[str, Any]]:
    tmp.mkdir(parents=True, exist_ok=True)
    kw: dict[str, Any] = dict(trainer_kw)
    if precision == "32-true":
        pass
    elif precision == "16-mixed":
        kw["plugins"] = [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))]
    else:
        kw["precision"] = precision
    strategy = fork_strategy(
        num_stages=2,
        num_microbatches=M,
        schedule=schedule,
        profile_steps=profile_steps,
        repartition=False,
    )
    trainer = cpu_trainer(
        2,
        strategy,
        max_steps=STEPS,
        callbacks=[Recorder(str(tmp))],
        # the batch in its order (one replica: every stage gets the same data): low precision
        # rounds each microbatch's sums, so the same samples must form the same microbatches
        use_distributed_sampler=False,
        **kw,
    )
    trainer.fit(Model(poison=precision == "16-mixed"))
    return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]


def check(tmp: Path, ref: dict[str, torch.Tensor], precision: str) -> None:
    assert_same_state({k: v.float() for k, v in final_state(tmp).items()}, ref, atol=1e-6)


@pytest.mark.dist
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true", "16-mixed"])
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "zbv", "interleaved-1f1b"])
def test_precision_equals_one_device(tmp_path: Path, precision: str, schedule: str) -> None:
    ref, ref_scale = reference(precision)
    infos = run(tmp_path, precision, schedule)
    check(tmp_path, ref, precision)
    if precision == "16-mixed":
        # the poisoned step was skipped on both stages: the scale halved once, on every rank
        assert ref_scale == 2.0**15
        assert [i["scale"] for i in infos] == [ref_scale, ref_scale]
    expected = {"bf16-mixed": "float32+bfloat16-autocast", "16-mixed": "float32+float16-autocast"}
    assert {i["dtype"] for i in infos} == {expected.get(precision, "bfloat16")}


@pytest.mark.dist
def test_fp16_clipping_and_accumulation(tmp_path: Path) -> None:
    """16-mixed with norm clipping: the norm of the unscaled gradients over both stages."""
    ref, ref_scale = reference("16-mixed", clip=0.05)
    infos = run(tmp_path, "16-mixed", "zb-h1", gradient_clip_val=0.05)
    check(tmp_path, ref, "16-mixed")
    assert [i["scale"] for i in infos] == [ref_scale, ref_scale]


@pytest.mark.dist
def test_profiled_activation_bytes_follow_the_dtype(tmp_path: Path) -> None:
    """The profile measures what autograd saves, in the precision that runs: bf16-true saves
    exactly half of fp32's bytes; bf16-mixed saves bf16 activations plus the bf16 copies of the
    weights autocast makes for the backward (memory too: not parameters), here
    [384, 384] bytes against fp32's [448, 192] (tiny microbatches: the copies dominate)."""
    got = {}
    for precision in ("32-true", "bf16-true", "bf16-mixed"):
        infos = run(tmp_path / precision, precision, "1f1b", profile_steps=1)
        got[precision] = infos[0]["activation_bytes"]
        assert all(b > 0 for b in got[precision])
    assert got["bf16-true"] == [b / 2 for b in got["32-true"]]
    # stage 1: its 3 Linear inputs in bf16 (48 values) and the bf16 copies of its weights
    # (8x8, 8x8, 2x8); stage 0's first Linear needs no input gradient, so no weight copy
    assert got["bf16-mixed"][1] == 2 * 48 + 2 * (64 + 64 + 16)
    assert got["bf16-mixed"] != got["32-true"]


def test_activation_dtype_names_autocast() -> None:
    class Plugin:
        precision = "bf16-mixed"

    assert activation_dtype(Plugin(), "float32") == "float32+bfloat16-autocast"
    Plugin.precision = "32-true"
    assert activation_dtype(Plugin(), "float32") == "float32"


class ReplicaModel(Model):
    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(9)
        ds = TensorDataset(
            torch.randn(4 * BATCH, DIM, generator=g) * 3, torch.randn(4 * BATCH, 2, generator=g)
        )
        return DataLoader(ds, batch_size=BATCH)


@pytest.mark.dist
def test_norm_clipping_over_stages_and_replicas(tmp_path: Path) -> None:
    """2 stages x 2 replicas, 2 batches accumulated: each optimizer step takes the whole
    dataset (32 samples), clipped by the norm over all stages of the replica-averaged gradient,
    as one device clips the whole dataset's gradient."""
    model = ReplicaModel()
    opt = model.configure_optimizers()
    ds = ReplicaModel().train_dataloader().dataset
    assert isinstance(ds, TensorDataset)
    x, y = ds.tensors
    norms = []
    for _ in range(2):  # 2 epochs = 2 optimizer steps
        opt.zero_grad()
        mse(model(x), y).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)))
        opt.step()
    assert min(norms) > 0.05  # the clipping acts
    ref = {k: v.detach().clone() for k, v in model.state_dict().items()}

    tmp_path.mkdir(parents=True, exist_ok=True)
    strategy = fork_strategy(
        num_stages=2,
        data_parallel=2,
        num_microbatches=M,
        schedule="zb-h1",
        profile_steps=0,
        repartition=False,
    )
    trainer = cpu_trainer(
        4,
        strategy,
        max_epochs=2,
        accumulate_grad_batches=2,
        gradient_clip_val=0.05,
        callbacks=[Recorder(str(tmp_path))],
    )
    trainer.fit(ReplicaModel())
    assert_same_state(final_state(tmp_path), ref)
