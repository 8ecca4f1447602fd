"""What the strategy does per step beyond torch's own pipeline, removed where it changes
nothing (issue 34.3); counted, not timed:

- the strategy's ``optpipe/...`` metrics are logged when a value changes or Lightning no longer
  holds them (a new epoch), and a logger still sees them on every logging step;
- ``self.log`` inside a step is parsed without ``inspect`` in the common call;
- a rank's cursor leaves the offload manager alone when its list has no transfers;
- the strategy's default step (a module with ``PipelineSpec.loss_fn`` and no step of its own)
  runs without calling the module or patching its forward and ``self.log``, unless a forward
  hook would see the call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import lightning.pytorch as pl
import pytest
import torch
from fit_helpers import ChainModule, StepModule, cpu_trainer, fork_strategy
from lightning.pytorch.loggers.logger import Logger
from torch import nn

from optpipe_lightning.schedule import Action
from optpipe_lightning.strategy.lightning import module_steps
from optpipe_lightning.strategy.runtime.offload import OffloadManager
from optpipe_lightning.strategy.runtime.stage import RankCursor

DIM, BATCH, M, STEPS = 4, 8, 2, 3


class Model(StepModule):
    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__([nn.Linear(DIM, DIM) for _ in range(2)], DIM, BATCH, STEPS)


class Seen(Logger):
    """What a logger is handed: the ``optpipe/...`` names at each step it writes."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "seen"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        ours = {k: float(v) for k, v in metrics.items() if k.startswith("optpipe/")}
        self.steps.append((int(step or 0), ours))


class Report(pl.Callback):
    def __init__(self, out: str, seen: Seen) -> None:
        self.out, self.seen = out, seen

    def on_train_end(self, trainer: pl.Trainer, *args: Any) -> None:
        metrics = trainer.strategy._steps.metrics  # type: ignore[attr-defined]
        report = {
            "calls": metrics.calls,
            "logged": self.seen.steps,
            "callback": sorted(k for k in trainer.callback_metrics if k.startswith("optpipe/")),
        }
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


@pytest.mark.dist
def test_strategy_metrics_are_logged_when_they_change_and_seen_every_step(
    tmp_path: Path,
) -> None:
    seen = Seen()
    strategy = fork_strategy(num_stages=2, num_microbatches=M, schedule="1f1b", profile_steps=0)
    trainer = cpu_trainer(
        2,
        strategy,
        max_epochs=2,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        log_every_n_steps=1,
        callbacks=[Report(str(tmp_path), seen)],
    )
    trainer.logger = seen  # type: ignore[assignment]
    trainer.fit(Model())
    for r in range(2):
        got = json.loads(Path(tmp_path, f"rank{r}.json").read_text())
        names = ["optpipe/schedule/1f1b", "optpipe/schedule_switches"]
        # one schedule all along, unit costs (no prediction): each name once per epoch (the
        # epoch's end resets Lightning's results), not once per step
        assert got["calls"] == len(names) * 2, got
        assert got["callback"] == names
        # the logger gets them at every step of both epochs, as when every step logged them
        assert len(got["logged"]) == 2 * STEPS
        for _, logged in got["logged"]:
            assert sorted(logged) == names


def test_a_log_call_is_parsed_without_inspect_in_the_common_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signature = module_steps._LOG_SIGNATURE
    binds = [0]

    class Counting:
        parameters = signature.parameters

        def bind(self, *a: Any, **k: Any) -> Any:
            binds[0] += 1
            return signature.bind(*a, **k)

    monkeypatch.setattr(module_steps, "_LOG_SIGNATURE", Counting())
    value = torch.tensor(2.0)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("loss", value), {}),
        (("loss", value), {"prog_bar": True, "sync_dist": False, "batch_size": 4}),
        (("loss", value, True), {}),  # prog_bar positional: the general path
        ((), {"name": "loss", "value": value, "on_step": True}),
    ]
    for args, kwargs in calls:
        bound = signature.bind(None, *args, **kwargs).arguments
        expect = {k: v for k, v in bound.items() if k not in ("self", "name", "value")}
        name, got_value, options = module_steps._log_arguments(args, kwargs)
        assert (name, got_value, options) == (bound["name"], bound["value"], expect)
    assert binds[0] == 2  # only the two calls not of the form ("name", value, **keywords)
    with pytest.raises(TypeError):  # an unknown keyword still fails as Lightning's would
        module_steps._log_arguments(("loss", value), {"prog_barr": True})


def _walk(cursor: RankCursor, actions: list[Action]) -> None:
    for a in actions:
        if a.is_compute:
            cursor.begin(a.op, a.mb, a.chunk)
            cursor.end(a.op, a.mb, a.chunk)


def test_a_list_without_transfers_skips_the_offload_bookkeeping() -> None:
    plain = [Action("F", 0), Action("F", 1), Action("BW", 0), Action("BW", 1)]
    manager = mock.create_autospec(OffloadManager, instance=True)
    cursor = RankCursor(plain, manager, torch.device("cpu"))
    manager.reset_mock()
    _walk(cursor, plain)
    assert cursor.finished()
    assert manager.mock_calls == []  # no poll, settle, release per action
    with_offload = [Action("F", 0), Action("OFFLOAD", 0), Action("F", 1), Action("RELOAD", 0)]
    with_offload += [Action("BW", 0), Action("BW", 1)]
    cursor = RankCursor(with_offload, manager, torch.device("cpu"))
    manager.reset_mock()
    manager.holds_offload.return_value = False
    _walk(cursor, with_offload)
    assert cursor.finished()
    names = [c[0] for c in manager.mock_calls]
    assert names.count("offload") == 1 and names.count("reload") == 1
    assert "poll" in names and names.count("release") == 2


class LossFnModel(ChainModule):
    """No step of its own: the strategy's default step (``PipelineSpec.loss_fn``)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__([nn.Linear(DIM, DIM) for _ in range(2)])

    def train_dataloader(self) -> Any:
        from torch.utils.data import DataLoader, TensorDataset

        g = torch.Generator().manual_seed(1)
        n = BATCH * STEPS
        data = TensorDataset(torch.randn(n, DIM, generator=g), torch.randn(n, DIM, generator=g))
        return DataLoader(data, batch_size=BATCH)


PATCHED = {"n": 0}


class CountPatched(pl.Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer: pl.Trainer, *args: Any) -> None:
        logged = float(trainer.callback_metrics["train_loss"])
        report = {"patched": PATCHED["n"], "train_loss": logged}
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


@pytest.mark.dist
@pytest.mark.parametrize("hooked", [False, True], ids=["default", "forward-hook"])
def test_the_default_step_runs_without_patching_the_module(
    hooked: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = module_steps.ModuleStep._patched

    def counted(self: Any, *a: Any, **k: Any) -> Any:
        PATCHED["n"] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(module_steps.ModuleStep, "_patched", counted)  # forked ranks inherit
    model = LossFnModel()
    if hooked:
        model.register_forward_pre_hook(lambda *_: None)
    strategy = fork_strategy(num_stages=2, num_microbatches=M, schedule="1f1b", profile_steps=0)
    trainer = cpu_trainer(
        2,
        strategy,
        max_steps=STEPS,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[CountPatched(str(tmp_path))],
    )
    trainer.fit(model)
    got = [json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(2)]
    # with a hook: every microbatch's inputs pass on both ranks, the answer on the last stage
    expect = [M * STEPS, 2 * M * STEPS] if hooked else [0, 0]
    assert [g["patched"] for g in got] == expect
    assert got[0]["train_loss"] == got[1]["train_loss"]  # logged alike on every rank
