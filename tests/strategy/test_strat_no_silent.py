"""Nothing trains wrong silently (issue 37): batch statistics, buffers updated in forward, tied
weights across stages, a forward that is not the layer chain, and the stored profile of another
layout; each compared with one device (2 CPU processes, gloo, Lightning's fork launcher)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from fit_helpers import assert_same_state, cpu_trainer, fork_strategy
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import optpipe_lightning  # noqa: F401  (registers "optpipe")
from optpipe_lightning.schedule.profile import ModelFingerprint
from optpipe_lightning.strategy import PipelineSpec
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy
from optpipe_lightning.strategy.runtime.contract import ContractError

BATCH, M, DIM, STEPS = 8, 4, 6, 3
VOCAB, SEQ = 11, 5


class Count(nn.Module):
    """A buffer updated in forward: the samples this layer saw."""

    seen: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen += x.shape[0]
        return x


def _bn_layers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Sequential(nn.Linear(DIM, DIM), nn.BatchNorm1d(DIM), nn.Tanh()),
        Count(),
        nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()),
        nn.Sequential(nn.Linear(DIM, DIM), nn.BatchNorm1d(DIM), nn.Tanh()),
        Count(),
        nn.Linear(DIM, 2),
    ]


class TiedHead(nn.Module):
    """The LM head that reads the input embedding's weight (tied embeddings)."""

    def __init__(self, embed: nn.Embedding) -> None:
        super().__init__()
        self.embed = embed
        self.bias = nn.Parameter(torch.zeros(VOCAB))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.embed.weight.t() + self.bias


def _tied_layers() -> list[nn.Module]:
    torch.manual_seed(0)
    embed = nn.Embedding(VOCAB, DIM)
    blocks: list[nn.Module] = [nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(4)]
    return [embed, *blocks, TiedHead(embed)]


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y)


def _xent(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def _data(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    if kind == "tied":
        x = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=g)
        return x[:, :-1], x[:, 1:]
    return torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, 2, generator=g)


class Net(pl.LightningModule):
    """``kind``: "bn" (batch statistics and running counts), "tied" (tied embeddings)."""

    def __init__(self, kind: str, forward_is_chain: bool = False) -> None:
        super().__init__()
        self.kind = kind
        self.forward_is_chain = forward_is_chain
        self.blocks = nn.ModuleList(_tied_layers() if kind == "tied" else _bn_layers())

    def configure_pipeline(self) -> PipelineSpec:
        return PipelineSpec(layers=list(self.blocks), forward_is_chain=self.forward_is_chain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _chain(self.blocks, x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = (_xent if self.kind == "tied" else _mse)(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(*_data(self.kind)), batch_size=BATCH)


class WithValidation(Net):
    """Validation through the forward-only pipeline (in eval mode: running statistics)."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", _mse(self(x), y))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(*_val_data()), batch_size=BATCH)


def _val_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(8)
    return torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, 2, generator=g)


class ValLosses(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out
        self.seen: list[tuple[int, float]] = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.seen.append((trainer.global_step, float(trainer.callback_metrics["val_loss"])))
            Path(self.out, f"val{trainer.global_rank}.json").write_text(json.dumps(self.seen))


class ActivationBetween(Net):
    """A forward that is not the chain: an activation between two layers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](x)
        return _chain(self.blocks[1:], torch.relu(h))


def _chain(layers: Any, x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = layer(x)
    return x


def reference(
    kind: str, steps: int, clip: float | None = None, val_losses: list[float] | None = None
) -> dict[str, torch.Tensor]:
    """One device, the batch in M microbatches (gradient accumulation), as the pipeline runs;
    ``val_losses`` gets the validation loss (eval mode) after each step."""
    model = Net(kind)
    opt = model.configure_optimizers()
    x, y = _data(kind)
    loss_fn = _xent if kind == "tied" else _mse
    for _ in range(steps):
        opt.zero_grad()
        for xm, ym in zip(x.chunk(M), y.chunk(M), strict=True):
            (loss_fn(model(xm), ym) / M).backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if val_losses is not None:
            vx, vy = _val_data()
            model.eval()
            with torch.no_grad():
                val_losses.append(float(_mse(model(vx), vy)))
            model.train()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Switches(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strat = trainer.strategy
        assert isinstance(strat, OptPipeStrategy)
        sw = [(s["step"], s["to"], s["reason"]) for s in strat.switches]
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(sw))


def fit(
    model: Net,
    steps: int,
    tmp: Path | None = None,
    clip: float | None = None,
    stages: int = 2,
    replicas: int = 1,
    callbacks: list[pl.Callback] | None = None,
    **opts: Any,
) -> list[Any] | None:
    opts.setdefault("use_database", False)
    opts.setdefault("profile_steps", 0)
    opts.setdefault("repartition", False)
    strategy = fork_strategy(num_stages=stages, data_parallel=replicas, num_microbatches=M, **opts)
    trainer = cpu_trainer(
        stages * replicas,
        strategy,
        max_steps=steps,
        gradient_clip_val=clip,
        # every rank sees the whole batch in the DataLoader's order (Lightning's distributed
        # sampler would shuffle it, and batch statistics depend on the grouping; replicas then
        # average equal gradients, which one device's match)
        use_distributed_sampler=False,
        callbacks=[Switches(tmp)] if tmp is not None else (callbacks or []),
    )
    trainer.fit(model)
    if tmp is None:
        return None
    return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(stages)]


def _assert_state(model: nn.Module, ref: dict[str, torch.Tensor]) -> None:
    assert_same_state(model.state_dict(), ref, atol=2e-5)


@pytest.mark.dist
@pytest.mark.parametrize(
    ("schedule", "partition", "stages"),
    [("1f1b", [3, 3], 2), ("zbv", [2, 1, 1, 2], 2), ("zb-h1", None, 4)],
)
def test_batch_statistics_and_running_counts_match_one_device(
    schedule: str, partition: list[int] | None, stages: int
) -> None:
    """Profiling (1 warm-up + 1 timed step) and torch's shape inference leave no trace: running
    statistics, num_batches_tracked and a count updated in forward equal one device that
    accumulates gradients over the same microbatches; the trained module evaluates as it does."""
    ref = reference("bn", STEPS)
    model = Net("bn")
    fit(model, STEPS, stages=stages, schedule=schedule, partition=partition, profile_steps=1)
    _assert_state(model, ref)
    state = model.state_dict()  # one update per microbatch; 24 samples, not one microbatch more
    assert int(state["blocks.0.1.num_batches_tracked"]) == STEPS * M
    assert int(state["blocks.1.seen"]) == STEPS * BATCH
    one = Net("bn")
    one.load_state_dict(ref)
    x, _ = _data("bn")
    torch.testing.assert_close(model.eval()(x), one.eval()(x), atol=2e-5, rtol=0)


@pytest.mark.dist
def test_validation_through_the_pipeline_uses_the_running_statistics_of_one_device(
    tmp_path: Path,
) -> None:
    """The sanity check, then a validation after every step (one batch per epoch), through the
    forward-only pipeline in eval mode: each val_loss is one device's after as many steps."""
    val: list[float] = []
    ref = reference("bn", STEPS, val_losses=val)
    model = WithValidation("bn")
    fit(model, STEPS, callbacks=[ValLosses(tmp_path)], schedule="1f1b", partition=[3, 3])
    _assert_state(model, ref)
    for r in range(2):
        got = json.loads(Path(tmp_path, f"val{r}.json").read_text())
        assert [s for s, _ in got] == list(range(1, len(got) + 1)) and len(got) >= STEPS - 1
        assert [v for _, v in got] == pytest.approx(val[: len(got)], abs=1e-5)


class TiedCopies(pl.Callback):
    """Each rank's own copy of the tied weight as training ends (before the strategy hands every
    rank the whole model)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        weight = pl_module.state_dict()["blocks.0.weight"].detach().cpu()
        torch.save(weight, Path(self.out, f"tied{trainer.global_rank}.pt"))


@pytest.mark.dist
@pytest.mark.parametrize(
    ("schedule", "stages", "replicas", "holders"),
    # tied across 2 ranks / within rank 0 (V placement) / across ranks 0 and 3 with the split
    # backward / in 2 replicas of 2 stages (a holders' group per replica)
    [
        ("1f1b", 2, 1, [0, 1]),
        ("zbv", 2, 1, [0]),
        ("zb-h1", 4, 1, [0, 3]),
        ("1f1b", 2, 2, [0, 1, 2, 3]),
        ("sharded", 2, 1, [0, 1]),  # each rank holds only its layers: the tied weight stays
    ],
)
def test_tied_embeddings_train_as_on_one_device_with_norm_clipping(
    schedule: str, stages: int, replicas: int, holders: list[int], tmp_path: Path
) -> None:
    ref = reference("tied", STEPS, clip=0.05)
    model = Net("tied")
    sharded = schedule == "sharded"
    extra: dict[str, Any] = {"shard_model": True, "full_model_after_fit": True} if sharded else {}
    fit(
        model,
        STEPS,
        clip=0.05,
        stages=stages,
        replicas=replicas,
        callbacks=[TiedCopies(tmp_path)],
        schedule="1f1b" if sharded else schedule,
        **extra,
    )
    head = model.blocks[-1]
    assert isinstance(head, TiedHead) and model.blocks[0].weight is head.embed.weight
    _assert_state(model, ref)
    for r in holders:  # every holder's own copy is one device's weight (the copies stay equal)
        copy = torch.load(tmp_path / f"tied{r}.pt")
        torch.testing.assert_close(copy, ref["blocks.0.weight"], atol=2e-5, rtol=0, msg=str(r))


@pytest.mark.dist
def test_a_forward_that_is_not_the_chain_is_refused_unless_declared() -> None:
    with pytest.raises(
        Exception,
        match=r"ActivationBetween.forward is not the chain of "
        r"configure_pipeline\(\)'s layers: the input of layer 1",
    ):
        fit(ActivationBetween("bn"), 1, schedule="1f1b")
    ref = reference("bn", 1)  # the pipeline trains the chain, as the user declared
    model = ActivationBetween("bn", forward_is_chain=True)
    fit(model, 1, schedule="1f1b")
    _assert_state(model, ref)


def test_a_forward_failing_on_one_sample_microbatches_is_refused_in_one_line() -> None:
    """BatchNorm on one-sample microbatches: the probe's one line, not a failure in a rank."""
    model = Net("bn")
    with pytest.raises(ContractError, match=r"failed on the first microbatch \(1 samples\)"):
        from optpipe_lightning.strategy.runtime.chain_probe import probe_forward

        probe_forward(model, list(model.blocks), (torch.randn(1, DIM),))


def test_the_fingerprint_key_holds_the_placement_and_keeps_old_keys() -> None:
    base = ModelFingerprint(
        layer_structure=["Linear"], microbatch_size=2, num_stages=2, num_chunks=2, partition=[1]
    )
    old_key = base.key  # a fingerprint stored before the placement was recorded
    v = base.model_copy(update={"placement": "vshape"})
    i = base.model_copy(update={"placement": "interleaved"})
    assert len({old_key, v.key, i.key}) == 3
    assert ModelFingerprint.model_validate_json(base.model_dump_json()).key == old_key


@pytest.mark.dist
def test_a_stored_profile_of_another_placement_is_never_used(tmp_path: Path) -> None:
    """After a zbv run (V placement), interleaved 1F1B on the same database profiles its own
    layout (no NoScheduleError), and the next interleaved run reuses that one; every run
    trains as one device does."""
    ref = reference("bn", STEPS)
    url = f"sqlite:///{tmp_path / 'optpipe.db'}"
    # a partition both placements run (each device's layers divide into its 2 chunks)
    db: dict[str, Any] = {
        "use_database": True,
        "database": url,
        "profile_steps": 1,
        "partition": [1, 1, 1, 3],
    }
    for name, schedule, reason in [
        ("zbv", "zbv", "profiled"),
        ("il", "interleaved-1f1b", "profiled"),
        ("il2", "interleaved-1f1b", "stored profile"),
    ]:
        out = tmp_path / name
        out.mkdir()
        model = Net("bn")
        ranks = fit(model, STEPS, tmp=out, schedule=schedule, **db)
        assert ranks is not None
        assert [(to, why) for _, to, why in ranks[0]] == [(schedule, reason)], name
        _assert_state(model, ref)
