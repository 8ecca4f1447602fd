"""Each misuse of a pipelined step is one clear error, the same on every rank, before any hang.

One set of two processes (as Lightning's popen workers) tries every misuse in turn: the next
case runs only if every rank came back from the previous one with its error. The run that fails
on its second step is recorded as ``failed`` in the database, the one interrupted by Ctrl-C as
``interrupted``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from pipelined_lm import LM, launch, trainer

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

pytestmark = pytest.mark.dist


def _loss(module: LM, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


class NoForward(LM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        h = self.embed(x)  # runs the layers itself instead of self(x)
        return _loss(self, self.head(self.norm(h)), y)


class TwoForwards(LM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return _loss(self, self(x), y) + _loss(self, self(x), y)


class KeywordForward(LM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return _loss(self, self(x=x), y)


class ReturnsNone(LM):
    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("loss", _loss(self, self(x), y))


class DetachedLoss(LM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return _loss(self, self(x), y).detach()


class LogsAMetricObject(LM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        from torchmetrics import MeanMetric

        x, y = batch
        loss = _loss(self, self(x), y)
        metric = MeanMetric()
        metric.update(loss.detach())
        self.log("mean", metric)
        return loss


class GathersInStep(LM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = _loss(self, self(x), y)
        self.log("everyone", self.all_gather(loss.detach()).mean())
        return loss


class FailsOnSecondBatch(LM):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)  # only the last stage gets past this point
        if batch_idx == 1:
            raise ValueError("the second batch is broken")
        return _loss(self, logits, y)


class RandomInputsOnSecondBatch(LM):
    """Random inputs from the second step on: the step's run on the last stage calls the
    forward with other values than its run on every rank (only that rank fingerprints them
    after the first step)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if batch_idx == 1:
            x = torch.randint(0, 2, x.shape, dtype=x.dtype)
        return _loss(self, self(x), y)


class ManualOptimization(LM):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class NoSteps(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lm = LM()

    def configure_pipeline(self) -> Any:
        return self.lm.configure_pipeline()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return self.lm.train_dataloader()


class ValidationWithoutForward(LM):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, _ = batch
        self.log("val", float(x.float().mean()))


class Interrupt(pl.Callback):
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == 2:
            raise KeyboardInterrupt


# name -> (module, strategy options, trainer options, what the error says)
CASES: dict[str, tuple[Callable[[], pl.LightningModule], dict[str, Any], dict[str, Any], str]] = {
    "forward not called": (NoForward, {}, {}, "did not call the module's forward"),
    "forward twice": (TwoForwards, {}, {}, "called the module's forward twice"),
    "forward keywords": (KeywordForward, {}, {}, "with keyword arguments (x)"),
    "returns None": (ReturnsNone, {}, {}, "training_step returned None"),
    "loss not from output": (DetachedLoss, {}, {}, "does not depend on the forward's output"),
    "logs a Metric": (LogsAMetricObject, {}, {}, "self.log('mean') got a MeanMetric"),
    "collective in step": (GathersInStep, {}, {}, "a step called all_gather, a collective"),
    "raises on last stage": (
        FailsOnSecondBatch,
        {"use_database": True},
        {},
        "training_step raised ValueError: the second batch is broken (on the last pipeline "
        "stage, microbatch 0)",
    ),
    "random inputs": (
        RandomInputsOnSecondBatch,
        {},
        {},
        "training_step computed other inputs for the forward when it ran again",
    ),
    "manual optimization": (ManualOptimization, {}, {}, "uses manual optimization"),
    "no steps, no loss_fn": (
        NoSteps,
        {},
        {},
        "has no training_step and its PipelineSpec no loss_fn",
    ),
    "validation without forward": (
        ValidationWithoutForward,
        {},
        {"num_sanity_val_steps": 1, "limit_val_batches": 1},
        "validation_step did not call the module's forward",
    ),
    "batch does not divide": (
        lambda: LM(train_samples=6),
        {},
        {},
        "batch size 6 does not divide into num_microbatches=4; use a batch size that is a "
        "multiple of 4 (and drop_last=True in the DataLoader), or num_microbatches in [2, 3, 6]",
    ),
    "auto finds no count": (
        lambda: LM(train_samples=1),
        {"num_microbatches": "auto"},
        {},
        "batch size 1 does not divide into 2 or more microbatches",
    ),
    "shape changes": (
        lambda: LM(train_samples=12),
        {},
        {},
        "the pipeline's input shape changed between training batches",
    ),
}


def _session(workdir: Path, url: str) -> None:
    rank = int(__import__("os").environ["LOCAL_RANK"])
    got: dict[str, str] = {}
    for name, (make, opts, trainer_opts, _) in CASES.items():
        options: dict[str, Any] = {
            "num_microbatches": 4,
            "profile_steps": 0,
            "online_resolve": False,
            "use_database": False,
            "database": url,
            "schedule": "1f1b",
        }
        options.update(opts)
        trainer_opts = {"max_steps": 2, "num_sanity_val_steps": 0, **trainer_opts}
        tr = trainer(2, OptPipeStrategy(**options), **trainer_opts)
        try:
            tr.fit(make())
            got[name] = "no error"
        except Exception as e:
            got[name] = f"{type(e).__name__}: {e}"
        Path(workdir, f"cases{rank}.json").write_text(json.dumps(got))
    options = {"num_microbatches": 4, "profile_steps": 0, "online_resolve": False}
    tr = trainer(2, OptPipeStrategy(database=url, **options), max_steps=4, callbacks=[Interrupt()])
    tr.fit(LM())  # Lightning ends the process (exit 1) after recording the interrupt


def test_each_misuse_is_one_clear_error_on_every_rank(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optpipe.db'}"
    errors = launch(2, lambda: _session(tmp_path, url), tmp_path)
    assert errors == ["SystemExit: 1", "SystemExit: 1"]  # the last case: Ctrl-C
    ranks = [json.loads(Path(tmp_path, f"cases{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]  # the same error on every rank
    for name, (*_, expected) in CASES.items():
        assert expected in ranks[0][name], (name, ranks[0][name])
        assert "\n" not in ranks[0][name], name  # one line
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo

    db = open_database(url)
    with db.session() as s:
        runs = repo.list_training_runs(s)
    db.close()
    assert sorted(r.status for r in runs) == ["failed", "interrupted"]
