"""Only the rank of the last stage fingerprints a training step's inputs (``ModuleStep.inputs``
with ``fingerprint``): it alone checks that the step, run again there, calls the forward with
the same values; the other ranks skip it (issue 34.3). The check itself reduces no tensor when
the rerun's inputs are the first run's memory, untouched (``InputFingerprint``; a step that
takes its inputs from the batch). Counted, not timed: the fingerprints, checks and signatures
per rank over a short 1F1B fit; then ``InputFingerprint`` alone on each kind of rerun."""

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
from optpipe_lightning.strategy.runtime import microbatch
from optpipe_lightning.strategy.runtime.microbatch import InputFingerprint

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
        path.write_text(json.dumps(CALLS))


CALLS = {"fingerprints": 0, "checks": 0, "signatures": 0}


class Counted(InputFingerprint):
    def __init__(self, args: Any) -> None:
        CALLS["fingerprints"] += 1
        super().__init__(args)

    def matches(self, args: Any) -> bool:
        CALLS["checks"] += 1
        return super().matches(args)


@pytest.mark.dist
def test_only_the_last_stage_fingerprints_the_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = microbatch.signature

    def counted(x: Any) -> list[float]:
        CALLS["signatures"] += 1
        return real(x)

    # the forked ranks inherit both
    monkeypatch.setattr(microbatch, "signature", counted)
    monkeypatch.setattr(module_steps, "InputFingerprint", Counted)
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
    # rerun; rank 0 only on the first step (the pipeline is not built yet). The step's inputs
    # are the batch's microbatches, the same memory in both runs: no signature anywhere
    assert calls == [
        {"fingerprints": M, "checks": 0, "signatures": 0},
        {"fingerprints": M * STEPS, "checks": M * STEPS, "signatures": 0},
    ]


def _sigs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    n = [0]
    real = microbatch.signature

    def counted(x: Any) -> list[float]:
        n[0] += 1
        return real(x)

    monkeypatch.setattr(microbatch, "signature", counted)
    return n


def test_the_same_memory_matches_without_reducing(monkeypatch: pytest.MonkeyPatch) -> None:
    n = _sigs(monkeypatch)
    batch = torch.arange(12.0).reshape(4, 3)
    first = InputFingerprint((batch[:2],))
    assert first.matches((batch[:2],))  # another view object of the same memory
    assert n[0] == 0


def test_other_memory_with_the_same_values_matches_by_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = _sigs(monkeypatch)
    batch = torch.arange(12.0).reshape(4, 3)
    first = InputFingerprint((batch * 2,))
    assert first.matches((batch * 2,))
    assert n[0] == 2  # the first run's (from the kept tensor) and the rerun's
    assert first.matches((batch * 2,)) and n[0] == 3  # the first run's once


def test_other_values_do_not_match() -> None:
    batch = torch.arange(12.0).reshape(4, 3)
    first = InputFingerprint((batch + 1,))
    assert not first.matches((batch + 2,))
    assert not first.matches((batch[:, :2] + 1,))  # another shape


def test_inputs_written_in_place_between_the_runs_do_not_match() -> None:
    # a step that scales its batch in place: the rerun's inputs are the same memory, written
    # again; the values the first run gave the pipeline are gone
    batch = torch.arange(12.0).reshape(4, 3)
    x = batch[:2]
    x.mul_(2)
    first = InputFingerprint((x,))
    x.mul_(2)
    assert not first.matches((x,))


def test_inference_tensors_are_fingerprinted_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    n = _sigs(monkeypatch)
    with torch.inference_mode():
        batch = torch.arange(12.0).reshape(4, 3)
    first = InputFingerprint((batch[:2],))  # no version counter: the signature at once
    assert n[0] == 1
    assert first.matches((batch[:2],)) and not first.matches((batch[2:],))
