"""Trainer(strategy=OptPipeStrategy(...)) on CPU/gloo: numbers, checkpoints, profiles, errors."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from fit_helpers import assert_same_state, cpu_trainer, final_state, fork_strategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.strategy import PipelineSpec
from optpipe_lightning.strategy.lightning.strategy import OptPipeConfigError, OptPipeStrategy

BATCH, M, DIM, N_LAYERS = 8, 4, 6, 6


def _layers() -> list[nn.Module]:
    torch.manual_seed(0)
    out: list[nn.Module] = [
        nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(N_LAYERS - 1)
    ]
    out.append(nn.Linear(DIM, 2))
    return out


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, y)


class TinyModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_layers())

    def configure_pipeline(self) -> PipelineSpec:
        return PipelineSpec(layers=list(self.blocks), loss_fn=_loss)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(7)
        ds = TensorDataset(torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, 2, generator=g))
        return DataLoader(ds, batch_size=BATCH)


class NoHook(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)


class Recorder(pl.Callback):
    """Losses every step on every rank, the full checkpoint at the end, the switches."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.losses.append(float(trainer.callback_metrics["train_loss"]))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.save_checkpoint(os.path.join(self.out, "final.ckpt"))
        strat = trainer.strategy
        assert isinstance(strat, OptPipeStrategy)
        info = {
            "losses": self.losses,
            "switches": [
                {k: v for k, v in s.items() if k != "predicted_seconds"} for s in strat.switches
            ],
            "calibrations": strat.calibrations,
        }
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(info))


def reference(steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = TinyModel()
    opt = model.configure_optimizers()
    x, y = next(iter(model.train_dataloader()))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = (
            sum(
                _loss(model.blocks.forward if False else _run(model, xm), ym)
                for xm, ym in zip(x.chunk(M), y.chunk(M), strict=True)
            )
            / M
        )
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _run(model: TinyModel, x: torch.Tensor) -> torch.Tensor:
    for b in model.blocks:
        x = b(x)
    return x


def fit(tmp: Path, steps: int, ckpt: str | None = None, **opts: Any) -> list[dict[str, Any]]:
    tmp.mkdir(parents=True, exist_ok=True)
    opts.setdefault("use_database", False)
    opts.setdefault("profile_steps", 0)
    # re-balancing by profiled per-layer costs is timing-dependent on these microsecond layers;
    # the tests that want it say so (test_profiled_costs_repartition_without_changing_numbers)
    opts.setdefault("repartition", False)
    strategy = fork_strategy(num_stages=2, num_microbatches=M, **opts)
    trainer = cpu_trainer(2, strategy, max_steps=steps, callbacks=[Recorder(str(tmp))])
    trainer.fit(TinyModel(), ckpt_path=ckpt)
    return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]


def check_final(tmp: Path, ref: dict[str, torch.Tensor]) -> None:
    assert_same_state(final_state(tmp), ref)


@pytest.mark.dist
def test_lightning_zb_h1_matches_single_process_and_resumes(tmp_path: Path) -> None:
    ref_losses, ref_state = reference(3)
    full = fit(tmp_path / "full", 3, schedule="zb-h1")
    for r in full:  # the loss on every rank equals single-process training
        assert r["losses"] == pytest.approx(ref_losses, abs=1e-5)
    check_final(tmp_path / "full", ref_state)
    # stop after 2 steps, resume to 3 on another schedule: same numbers as the uninterrupted run
    fit(tmp_path / "first", 2, schedule="zb-h1")
    resumed = fit(
        tmp_path / "resumed", 3, ckpt=str(tmp_path / "first" / "final.ckpt"), schedule="1f1b"
    )
    assert resumed[0]["losses"] == pytest.approx(ref_losses[2:], abs=1e-5)
    check_final(tmp_path / "resumed", ref_state)


@pytest.mark.dist
def test_lightning_profiles_then_reuses_the_stored_profile(tmp_path: Path) -> None:
    ref_losses, ref_state = reference(3)
    url = f"sqlite:///{tmp_path / 'optpipe.db'}"
    first = fit(
        tmp_path / "a", 3, schedule="1f1b", profile_steps=1, use_database=True, database=url
    )
    check_final(tmp_path / "a", ref_state)
    assert first[0]["losses"] == pytest.approx(ref_losses, abs=1e-5)
    # profiling ran steps 0-1 (warm-up + 1 measured), then 1f1b from the profiled problem
    assert [(s["step"], s["to"], s["reason"]) for s in first[0]["switches"]] == [
        (2, "1f1b", "profiled")
    ]
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo

    db = open_database(url)
    with db.session() as s:
        profiles = repo.list_profiles(s)
        runs = repo.list_training_runs(s)
        steps = repo.training_steps(s, runs[0].id)
        switches = repo.schedule_switches(s, runs[0].id)
    db.close()
    assert len(profiles) == 1 and len(runs) == 1
    assert runs[0].status == "finished"  # recorded as it ended (teardown ran before Lightning's)
    assert [st.step for st in steps] == [1, 2, 3]  # every optimizer step, measured + predicted
    assert all(st.measured_seconds > 0 for st in steps)
    # profiling steps have no prediction; the step on the chosen schedule has one
    assert [st.predicted_seconds is not None for st in steps] == [False, False, True]
    assert [(sw.step, sw.reason) for sw in switches] == [(2, "profiled")]
    second = fit(
        tmp_path / "b", 1, schedule="1f1b", profile_steps=1, use_database=True, database=url
    )
    assert [(s["step"], s["reason"]) for s in second[0]["switches"]] == [(0, "stored profile")]


@pytest.mark.dist
def test_calibration_from_the_running_schedule_updates_the_recorded_prediction(
    tmp_path: Path,
) -> None:
    ref_losses, ref_state = reference(7)
    url = f"sqlite:///{tmp_path / 'optpipe.db'}"
    ranks = fit(
        tmp_path / "c",
        7,
        schedule="1f1b",
        profile_steps=1,
        use_database=True,
        database=url,
        calibrate_every=1,
        calibrate_min_steps=2,
        calibrate_budget=None,  # every due step (the default keeps to 0.5% of the time)
    )
    for r in ranks:  # calibrating changes no numbers
        assert r["losses"] == pytest.approx(ref_losses, abs=1e-5)
    check_final(tmp_path / "c", ref_state)
    # profiling: steps 1-2; 1f1b from step 3 (a warm-up for the sampler), then 2 timed steps:
    # calibrations at the boundaries of steps 5, 6, 7, the same on every rank
    cals = ranks[0]["calibrations"]
    assert [c["step"] for c in cals] == [5, 6, 7] == [c["step"] for c in ranks[1]["calibrations"]]
    assert [c["predicted_seconds"] for c in cals] == [
        c["predicted_seconds"] for c in ranks[1]["calibrations"]
    ]
    assert [c["steps"] for c in cals] == [2, 3, 4]  # rolling window of the schedule's steps
    for c in cals:
        assert c["schedule"] == "1f1b" and c["overhead_seconds"] >= 0
        assert len(c["t_f"]) == 2 and all(x[0] > 0 for x in c["t_f"] + c["t_bw"])
        # fitted to the measured steps: the prediction matches their median (unless the
        # compute alone already takes longer, then the overhead is 0)
        if c["overhead_seconds"] > 0:
            assert c["predicted_seconds"] == pytest.approx(c["measured_seconds"], rel=1e-3)
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo

    db = open_database(url)
    with db.session() as s:
        run = repo.list_training_runs(s)[0]
        steps = repo.training_steps(s, run.id)
    db.close()
    pred = {st.step: st.predicted_seconds for st in steps}
    wall = {st.step: st.measured_seconds for st in steps}
    assert sorted(pred) == list(range(1, 8))  # every step, profiling ones without prediction
    assert pred[1] is None and pred[2] is None and all(pred[k] for k in range(3, 8))
    # the run log's prediction is the whole optimizer step's: the calibrated pipeline step
    # (from the next step on) plus the time the recent steps spent outside the pipeline
    for k, cal in ((6, cals[0]), (7, cals[1])):
        assert cal["predicted_seconds"] <= pred[k] <= cal["predicted_seconds"] + max(wall.values())


@pytest.mark.dist
def test_memory_limit_nothing_fits_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"no schedule fits|does not fit"):
        fit(tmp_path / "m", 3, schedule="1f1b", profile_steps=1, memory_limit=1.0, offload=False)


def _trainer(strategy: OptPipeStrategy, devices: int = 2) -> pl.Trainer:
    return cpu_trainer(devices, strategy, max_steps=1)


def test_model_without_hook_is_one_clear_error() -> None:
    trainer = _trainer(OptPipeStrategy(num_stages=2, num_microbatches=2, start_method="fork"))
    with pytest.raises(TypeError, match="has no configure_pipeline"):
        trainer.fit(NoHook())


def test_more_stages_than_layers_is_one_clear_error() -> None:
    strategy = OptPipeStrategy(
        num_stages=2, num_microbatches=4, schedule="zbv", start_method="fork", partition=None
    )
    trainer = _trainer(strategy)
    model = TinyModel()
    model.blocks = nn.ModuleList(list(model.blocks)[:3])
    with pytest.raises(ValueError, match="only 3 layers"):
        trainer.fit(model)


def test_world_size_not_divisible_is_one_clear_error() -> None:
    trainer = _trainer(
        OptPipeStrategy(num_stages=2, num_microbatches=4, start_method="fork"), devices=3
    )
    with pytest.raises(OptPipeConfigError, match="world size 3"):
        trainer.fit(TinyModel())


def test_too_few_microbatches_is_one_clear_error() -> None:
    with pytest.raises(OptPipeConfigError, match="num_microbatches=1 is fewer than num_stages=2"):
        OptPipeStrategy(num_stages=2, num_microbatches=1)


def test_registered_by_name() -> None:
    trainer = pl.Trainer(strategy="optpipe", accelerator="cpu", devices=2, logger=False)
    assert isinstance(trainer.strategy, OptPipeStrategy)


class WaitForSolver(pl.Callback):
    """Rank 0 waits (once) for the background solver to finish, so its schedule arrives in time."""

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        strat = trainer.strategy
        assert isinstance(strat, OptPipeStrategy)
        solver = strat.scheduler.resolve.solver if strat.scheduler is not None else None
        if solver is not None and not getattr(self, "waited", False):
            solver.proc.join(timeout=60)
            self.waited = True


@pytest.mark.dist
def test_online_resolve_switches_at_a_step_boundary_and_changes_no_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optpipe_lightning.schedule.baselines import generate
    from optpipe_lightning.strategy.scheduling import profiler, resolve, schedule_choice

    # start from GPipe so the solver has something to improve on (forked workers inherit this)
    monkeypatch.setattr(schedule_choice, "best_baseline", lambda pb: generate("gpipe", pb))
    # price a fused backward as B + W: whether a measured fused backward happens to be cheaper
    # on this machine must not decide whether the solver's schedule beats GPipe here
    real_build = profiler.build_profile

    def split_priced(*args: Any, **kwargs: Any) -> Any:
        prof = real_build(*args, **kwargs)
        stages = [sp.model_copy(update={"bw": None}) for sp in prof.stages]
        return prof.model_copy(update={"stages": stages})

    monkeypatch.setattr(profiler, "build_profile", split_priced)
    # the solve's gain-vs-cost gate has tests of its own (a 2 s solve never pays back in a
    # 7-step run): here it always starts
    real_plan = resolve.plan_solve
    monkeypatch.setattr(
        resolve, "plan_solve", lambda **kw: dataclasses.replace(real_plan(**kw), start=True)
    )
    ref_losses, ref_state = reference(7)
    out = tmp_path / "r"
    out.mkdir()
    strategy = fork_strategy(
        num_stages=2,
        num_microbatches=M,
        schedule="optimal",
        online_resolve=True,
        profile_steps=1,
        repartition=False,  # timing-dependent on these tiny layers
        solver_time_limit=2.0,
        resolve_start_method="fork",
    )
    trainer = cpu_trainer(2, strategy, max_steps=7, callbacks=[WaitForSolver(), Recorder(str(out))])
    trainer.fit(TinyModel())
    ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["losses"] == pytest.approx(ref_losses, abs=1e-5)
    check_final(out, ref_state)
    sw = ranks[0]["switches"]
    assert sw == ranks[1]["switches"]  # same switches at the same steps on every rank
    assert sw[0]["reason"] == "profiled" and sw[0]["to"] == "gpipe"
    # profiled at step 2; the solve is planned and started at step 3 (WaitForSolver lets it
    # finish), rank 0 posts the switch at step 4, every rank switches at step 5
    assert len(sw) == 2 and sw[1]["reason"].startswith("solver incumbent") and sw[1]["step"] == 5


class TwoBatchModel(TinyModel):
    """Two different batches per epoch and a validation set."""

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(11)
        ds = TensorDataset(
            torch.randn(2 * BATCH, DIM, generator=g), torch.randn(2 * BATCH, 2, generator=g)
        )
        return DataLoader(ds, batch_size=BATCH)

    def val_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(12)
        ds = TensorDataset(torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, 2, generator=g))
        return DataLoader(ds, batch_size=BATCH)


class ValRecorder(pl.Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            Path(self.out, f"val{trainer.global_rank}.json").write_text(
                json.dumps(float(trainer.callback_metrics["val_loss"]))
            )


@pytest.mark.dist
def test_lightning_clipping_accumulation_and_validation(tmp_path: Path) -> None:
    # reference: 2 optimizer steps, each over both batches (accumulate 2), norm clipped at 0.05
    model = TwoBatchModel()
    opt = model.configure_optimizers()
    batches = list(model.train_dataloader())
    for _ in range(2):
        opt.zero_grad()
        for x, y in batches:
            loss = (
                sum(
                    _loss(_run(model, xm), ym)
                    for xm, ym in zip(x.chunk(M), y.chunk(M), strict=True)
                )
                / M
                / 2
            )
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
    xv, yv = next(iter(model.val_dataloader()))
    with torch.no_grad():
        ref_val = float(_loss(_run(model, xv), yv))
    ref_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    out = tmp_path / "c"
    out.mkdir()
    strategy = fork_strategy(num_stages=2, num_microbatches=M, schedule="zbv", profile_steps=0)
    # (no model summary: the sanity-check validation runs before any training)
    trainer = cpu_trainer(
        2,
        strategy,
        max_epochs=2,
        accumulate_grad_batches=2,
        gradient_clip_val=0.05,
        callbacks=[Recorder(str(out)), ValRecorder(str(out))],
    )
    trainer.fit(TwoBatchModel())
    check_final(out, ref_state)
    for r in range(2):
        assert json.loads(Path(out, f"val{r}.json").read_text()) == pytest.approx(ref_val, abs=1e-6)


@pytest.mark.dist
def test_lightning_two_stages_by_two_replicas(tmp_path: Path) -> None:
    model = TwoBatchModel()  # 16 samples: each of 2 replicas takes 8 (one batch) per step
    opt = model.configure_optimizers()
    x, y = next(iter(DataLoader(model.train_dataloader().dataset, batch_size=2 * BATCH)))
    for _ in range(2):
        opt.zero_grad()
        loss = _loss(_run(model, x), y)
        loss.backward()
        opt.step()
    ref_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = tmp_path / "dp"
    out.mkdir()
    strategy = fork_strategy(
        num_stages=2, data_parallel=2, num_microbatches=M, schedule="1f1b", profile_steps=0
    )
    trainer = cpu_trainer(
        4,
        strategy,
        max_epochs=2,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[Recorder(str(out))],
    )
    trainer.fit(TwoBatchModel())
    check_final(out, ref_state)


class Heavy(nn.Module):
    """No parameters but costly: a parameter-count partition misjudges it, profiling does not."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("m", torch.eye(DIM) * 0.9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(300):
            x = torch.tanh(x @ self.m)
        return x


class HeavyFirstModel(TinyModel):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Heavy(), Heavy(), *list(self.blocks)[2:]])


@pytest.mark.dist
def test_profiled_costs_repartition_without_changing_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optpipe_lightning.strategy.runtime.engine import PipelineEngine

    # injected timings (the forked workers inherit them): the real per-layer instrumentation
    # runs, its seconds are replaced by 10 ms per Heavy layer and 1 ms per other layer, so the
    # decision does not depend on this machine's load
    real_costs = PipelineEngine.layer_costs

    def injected(self: PipelineEngine) -> dict[int, Any]:
        out = {}
        for idx, (_c, saved, samples, ident) in real_costs(self).items():
            cost = 0.01 if ident.startswith("Heavy") else 0.001
            out[idx] = (cost, saved, [cost] * len(samples), ident)
        return out

    monkeypatch.setattr(PipelineEngine, "layer_costs", injected)
    model = HeavyFirstModel()
    opt = model.configure_optimizers()
    x, y = next(iter(model.train_dataloader()))
    for _ in range(6):
        opt.zero_grad()
        loss = (
            sum(_loss(_run(model, xm), ym) for xm, ym in zip(x.chunk(M), y.chunk(M), strict=True))
            / M
        )
        loss.backward()
        opt.step()
    ref_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = tmp_path / "rp"
    out.mkdir()
    strategy = fork_strategy(num_stages=2, num_microbatches=M, schedule="1f1b", profile_steps=1)
    trainer = cpu_trainer(2, strategy, max_steps=6, callbacks=[Recorder(str(out))])
    trainer.fit(HeavyFirstModel())
    check_final(out, ref_state)
    sw = json.loads(Path(out, "rank0.json").read_text())["switches"]
    # parameter counts put both parameter-free heavy layers on stage 0 ([4, 2]); the profile
    # splits them
    assert [(s["step"], s["reason"]) for s in sw] == [
        (2, "repartitioned [4, 2] -> [1, 5]"),
        (4, "profiled"),
    ]
