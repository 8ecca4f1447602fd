"""A module built in ``configure_model`` on 2 and 4 CPU processes: own layers only, the bytes
each rank holds, sharded checkpoints resumed on another schedule, partition and stage count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from bigmodel_lm import N_LAYERS, SEED, BigLM, loss_fn, one_device, reference, run
from fit_helpers import assert_same_state, cpu_trainer, fork_strategy
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.distributed.checkpoint import FileSystemReader

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.schedule import Problem, Schedule
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.chunking import rechunk, stamped
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy
from optpipe_lightning.strategy.runtime.materialize import held_bytes, optimizer_state_bytes
from optpipe_lightning.strategy.runtime.sharded_checkpoint import consolidate, convert, is_sharded


class Probe(pl.Callback):
    """Per rank: the bytes held after setup and at the end, own layers' initial weights match
    one device, losses; a checkpoint at the end."""

    def __init__(self, out: Path, ckpt: str | None) -> None:
        self.out, self.ckpt = out, ckpt
        self.info: dict[str, Any] = {"losses": []}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strat = trainer.strategy
        assert isinstance(strat, OptPipeStrategy) and isinstance(pl_module, BigLM)
        assert pl_module.blocks is not None
        own = [i for i, b in enumerate(pl_module.blocks) if not next(b.parameters()).is_meta]
        own_bytes = sum(
            p.numel() * p.element_size() for i in own for p in pl_module.blocks[i].parameters()
        )
        self.info.update(
            own=own,
            own_bytes=own_bytes,
            held_after_setup=held_bytes(pl_module),
            own_params=sum(1 for i in own for _ in pl_module.blocks[i].parameters()),
        )
        if trainer.global_step == 0:
            ref = one_device().state_dict()
            for k, v in pl_module.state_dict().items():
                if not v.is_meta:
                    torch.testing.assert_close(v, ref[k], rtol=0, atol=0)

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.info["losses"].append(float(trainer.callback_metrics["train_loss"]))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.info["held_at_end"] = held_bytes(pl_module)
        self.info["params_at_end"] = sum(1 for p in pl_module.parameters() if not p.is_meta)
        self.info["optimizer_bytes"] = optimizer_state_bytes(trainer.optimizers)
        if self.ckpt is not None:
            trainer.save_checkpoint(self.ckpt)
        path = self.out / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.info))


def _trainer(
    devices: int, steps: int, callbacks: list[Any], validate: bool = False, **opts: Any
) -> pl.Trainer:
    opts.setdefault("profile_steps", 0)
    opts.setdefault("repartition", False)
    strategy = fork_strategy(num_microbatches=4, **opts)
    return cpu_trainer(
        devices,
        strategy,
        max_steps=steps,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        num_sanity_val_steps=0,
        limit_val_batches=1.0 if validate else 0,
        callbacks=callbacks,
    )


def fit(
    tmp: Path, devices: int, steps: int, ckpt_in: str | None = None, **opts: Any
) -> list[dict[str, Any]]:
    tmp.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(SEED, verbose=False)
    trainer = _trainer(devices, steps, [Probe(tmp, str(tmp / "final.ckpt"))], **opts)
    model = BigLM()
    trainer.fit(model, ckpt_path=ckpt_in)
    _last_module[:] = [model]
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(devices)]


_last_module: list[BigLM] = []  # the module ``fit`` left in this (the launching) process


def zbv_on_two_chunks(problem: Problem) -> Schedule:
    """A schedule in another chunking than the running one: the layers change ranks."""
    v2 = rechunk(problem, 2, "vshape")
    return stamped(generate("zbv", v2), v2)


def _shard_keys(path: Path) -> dict[str, set[str]]:
    """Which parameter names each shard file holds."""
    md = FileSystemReader(str(path)).read_metadata()
    out: dict[str, set[str]] = {}
    for index, info in md.storage_data.items():
        if index.fqn.startswith("model."):
            out.setdefault(info.relative_path, set()).add(index.fqn[len("model.") :])
    return out


@pytest.mark.dist
def test_own_layers_only_then_sharded_resume_on_four_stages(tmp_path: Path) -> None:
    ref_losses, ref_state = reference(3)
    first = fit(tmp_path / "first", 2, 2, num_stages=2, schedule="zb-h1")
    total = sum(v.numel() * v.element_size() for v in ref_state.values())
    for r in first:
        # after setup and after training a rank holds its own layers only (nothing else)
        assert r["held_after_setup"] == r["own_bytes"] == r["held_at_end"] < total
        # Adam: two moments per own parameter and a 4-byte step each, nothing for the others
        assert r["optimizer_bytes"] == 2 * r["own_bytes"] + 4 * r["own_params"]
        assert r["losses"] == pytest.approx(ref_losses[:2], abs=1e-5)
    assert sorted(i for r in first for i in r["own"]) == list(range(N_LAYERS))
    assert sum(r["own_bytes"] for r in first) == total
    # after fit the launching process's module holds rank 0's layers; the others' are in the
    # checkpoint (full_model_after_fit=True collects them)
    main = _last_module[0].state_dict()
    assert {k for k, v in main.items() if not v.is_meta} == {
        k for k in main if int(k.split(".")[1]) in first[0]["own"]
    }
    ckpt = tmp_path / "first" / "final.ckpt"
    assert is_sharded(ckpt)
    shards = _shard_keys(ckpt)
    assert len(shards) == 2 and all(0 < len(keys) < len(ref_state) for keys in shards.values())
    # resume on 4 stages, another schedule and partition: same numbers as the uninterrupted run
    resumed = fit(tmp_path / "resumed", 4, 3, ckpt_in=str(ckpt), num_stages=4, schedule="1f1b")
    assert resumed[0]["losses"] == pytest.approx(ref_losses[2:], abs=1e-5)
    assert len(_shard_keys(tmp_path / "resumed" / "final.ckpt")) == 4
    # one ordinary Lightning checkpoint for export; it resumes through the one-file path
    whole = consolidate(tmp_path / "resumed" / "final.ckpt")
    assert_same_state(whole["state_dict"], ref_state)
    assert whole["global_step"] == 3 and whole["optpipe"]["num_stages"] == 4
    out = convert(ckpt, tmp_path / "first.ckpt")
    again = fit(
        tmp_path / "again",
        2,
        3,
        ckpt_in=str(out),
        num_stages=2,
        num_chunks=2,
        schedule="interleaved-1f1b",
        checkpoint_format="full",
    )
    assert again[0]["losses"] == pytest.approx(ref_losses[2:], abs=1e-5)
    final = torch.load(tmp_path / "again" / "final.ckpt", weights_only=False)
    assert_same_state(final["state_dict"], ref_state)


@pytest.mark.dist
def test_model_checkpoint_writes_shards_and_validate_and_test_resume_them(tmp_path: Path) -> None:
    _, ref_state = reference(2)
    pl.seed_everything(SEED, verbose=False)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=-1)
    trainer = _trainer(2, 2, [saver], num_stages=2, schedule="1f1b", full_model_after_fit=True)
    trained_here = BigLM()
    trainer.fit(trained_here)
    assert_same_state(trained_here.state_dict(), ref_state)  # asked for: the whole trained model
    written = sorted((tmp_path / "ckpts").iterdir())
    assert [p.name for p in written] == ["epoch=1-step=2.ckpt"] and is_sharded(written[0])
    assert len(_shard_keys(written[0])) == 2
    # validation on 4 stages from the shards: the loss of the trained model
    pl.seed_everything(SEED, verbose=False)
    model = BigLM()
    val = _trainer(4, 2, [], validate=True, num_stages=4, schedule="1f1b")
    out = val.validate(model, ckpt_path=str(written[0]), verbose=False)
    trained = one_device()
    trained.load_state_dict(ref_state)
    x, y = trained.val_dataloader().dataset.tensors  # type: ignore[attr-defined]
    with torch.no_grad():
        expect = float(loss_fn(run(trained, x), y))
    assert out[0]["val_loss"] == pytest.approx(expect, abs=1e-5)
    tested = val.test(BigLM(), ckpt_path=str(written[0]), verbose=False)  # a fresh module
    assert tested[0]["test_loss"] == pytest.approx(expect, abs=1e-5)


@pytest.mark.dist
def test_layers_change_ranks_with_their_optimizer_state_when_the_chunking_changes(
    tmp_path: Path,
) -> None:
    """One profiled step on one chunk per device, then ZB-V on two: layers move between the
    ranks (with Adam's moments), one at a time; the numbers stay one device's."""
    ref_losses, ref_state = reference(3)
    out = fit(
        tmp_path / "v", 2, 3, num_stages=2, profile_steps=1, schedule_source=zbv_on_two_chunks
    )
    total = sum(v.numel() * v.element_size() for v in ref_state.values())
    for r in out:
        assert r["losses"] == pytest.approx(ref_losses, abs=1e-5)
        assert r["held_at_end"] < total
        assert r["optimizer_bytes"] == 2 * r["held_at_end"] + 4 * r["params_at_end"]
    assert sum(r["held_at_end"] for r in out) == total
    assert out[0]["held_at_end"] != out[0]["own_bytes"]  # rank 0's layers did change
    whole = consolidate(tmp_path / "v" / "final.ckpt")
    assert_same_state(whole["state_dict"], ref_state)


@pytest.mark.dist
def test_four_stages_and_two_replicas_start_from_one_devices_weights(tmp_path: Path) -> None:
    """4 stages, and 2 stages x 2 replicas: every rank's layers start as one device's (the
    probe compares them after setup); replicas write their stage once (DCP keeps one copy)."""
    ref_losses, ref_state = reference(2)
    total = sum(v.numel() * v.element_size() for v in ref_state.values())
    four = fit(tmp_path / "four", 4, 1, num_stages=4, schedule="1f1b")
    assert sorted(i for r in four for i in r["own"]) == list(range(N_LAYERS))
    assert sum(r["own_bytes"] for r in four) == total
    replicas = fit(tmp_path / "dp", 4, 2, num_stages=2, data_parallel=2, schedule="1f1b")
    for r in replicas:
        assert r["held_after_setup"] == r["own_bytes"] < total
    # ranks r*p + s are stage s of replica r: the two replicas hold the same layers
    assert replicas[0]["own"] == replicas[2]["own"] and replicas[1]["own"] == replicas[3]["own"]
    for r in replicas:  # each replica trains on half the batch; their mean is one device's
        assert r["losses"] == pytest.approx(ref_losses, abs=1e-5)
    assert_same_state(consolidate(tmp_path / "dp" / "final.ckpt")["state_dict"], ref_state)


class BuiltInInit(BigLM):
    def __init__(self) -> None:
        super().__init__()
        self.configure_model()  # real tensors, as a module written for one device makes them


@pytest.mark.dist
def test_a_module_built_in_init_keeps_only_its_layers_when_asked(tmp_path: Path) -> None:
    ref_losses, ref_state = reference(2)
    tmp_path.mkdir(exist_ok=True)
    pl.seed_everything(SEED, verbose=False)
    trainer = _trainer(
        2, 2, [Probe(tmp_path, None)], num_stages=2, schedule="1f1b", shard_model=True
    )
    model = BuiltInInit()
    trainer.fit(model)
    held = {k for k, v in model.state_dict().items() if not v.is_meta}
    info0 = json.loads((tmp_path / "rank0.json").read_text())
    assert held == {k for k in ref_state if int(k.split(".")[1]) in info0["own"]}  # rank 0's
    for k in held:
        torch.testing.assert_close(model.state_dict()[k], ref_state[k], atol=1e-5, rtol=0)
    total = sum(v.numel() * v.element_size() for v in ref_state.values())
    for r in range(2):
        info = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert info["held_after_setup"] == info["own_bytes"] < total
        assert info["losses"] == pytest.approx(ref_losses, abs=1e-5)
