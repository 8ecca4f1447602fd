"""Only the rank of the last stage fingerprints a training step's inputs (``ModuleStep.inputs``
with ``fingerprint``): it alone checks that the step, run again there, calls the forward with
the same values; the other ranks skip two reductions per input tensor, microbatch and step
(issue 34.3). Counted, not timed: the fingerprint calls per rank over a short 1F1B fit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from fit_helpers import StepModule, cpu_trainer, fork_strategy
from torch import nn

from optpipe_lightning.strategy.lightning import module_steps

DIM, BATCH, M, STEPS = 4, 8, 4, 3


class Model(StepModule):
    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__([nn.Linear(DIM, DIM) for _ in range(4)], DIM, BATCH, STEPS)


class Count(pl.Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer: pl.Trainer, *args: Any) -> None:
        path = Path(self.out, f"calls{trainer.global_rank}.json")
        path.write_text(json.dumps(CALLS["n"]))


CALLS = {"n": 0}


@pytest.mark.dist
def test_only_the_last_stage_fingerprints_the_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = module_steps.signature

    def counted(x: Any) -> list[float]:
        CALLS["n"] += 1
        return real(x)

    monkeypatch.setattr(module_steps, "signature", counted)  # the forked ranks inherit it
    strategy = fork_strategy(num_stages=2, num_microbatches=M, schedule="1f1b", profile_steps=0)
    trainer = cpu_trainer(
        2,
        strategy,
        max_steps=STEPS,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[Count(str(tmp_path))],
    )
    trainer.fit(Model())
    calls = [json.loads(Path(tmp_path, f"calls{r}.json").read_text()) for r in range(2)]
    # 1F1B: the last stage on rank 1, which fingerprints every step's inputs and checks its
    # rerun (2 per microbatch); rank 0 only on the first step (the pipeline is not built yet)
    assert calls == [M, 2 * M * STEPS]
