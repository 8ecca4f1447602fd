"""A LightningModule written the ordinary way, and a launcher that runs it as Lightning's popen
workers would (processes started outside Lightning, one per device: ``LOCAL_RANK`` set).

``LM`` is what a user writes for one device: embedding, residual blocks, norm, head; AdamW with a
step LR scheduler; ``training_step`` / ``validation_step`` / ``test_step`` / ``predict_step``
calling ``self.log`` (loss and accuracy); plus the one hook, ``configure_pipeline``.
``run_session`` runs fit (with the sanity check and in-loop validation), validate, test and
predict in one set of processes and saves on rank 0 what every logged metric was after each
training batch and validation epoch, what validate/test/predict returned, and the module's
parameters after fit (rank 0 is the user's process under the default launcher).
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from fit_helpers import cpu_trainer
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from optpipe_lightning.strategy import PipelineSpec
from optpipe_lightning.strategy.runtime.fork_safety import inherited_objects_frozen

VOCAB, DIM, SEQ, BATCH = 16, 16, 8, 8


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.ln(x))


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(VOCAB, (n, SEQ + 1), generator=g)
    return TensorDataset(x[:, :-1], x[:, 1:])


class LM(pl.LightningModule):
    def __init__(self, blocks: int = 5, train_samples: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(DIM) for _ in range(blocks))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.train_samples = train_samples

    def configure_pipeline(self) -> PipelineSpec:
        return PipelineSpec(layers=[self.embed, *self.blocks, self.norm, self.head])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def _loss_acc(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        acc = (logits.argmax(-1) == y).float().mean()
        return loss, acc

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss, acc = self._loss_acc(batch)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", acc, prog_bar=True, on_step=True, on_epoch=True)
        self.log("train_max_acc", acc, on_step=False, on_epoch=True, reduce_fx="max")
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        loss, acc = self._loss_acc(batch)
        self.log_dict({"val_loss": loss, "val_acc": acc}, prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss, acc = self._loss_acc(batch)
        self.log("test_loss", loss)
        self.log("test_acc", acc)
        return loss

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        return self(x).argmax(-1)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}

    def train_dataloader(self) -> DataLoader:
        # the sampler Lightning would add under a distributed strategy (shuffled, seed 0),
        # given here so that one device sees the same order
        ds = dataset(self.train_samples, 1)
        sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
        return DataLoader(ds, batch_size=BATCH, sampler=sampler)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(dataset(12, 2), batch_size=BATCH)  # the last batch is smaller

    def test_dataloader(self) -> DataLoader:
        return DataLoader(dataset(12, 3), batch_size=BATCH)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(dataset(10, 4), batch_size=BATCH)


class MetricsRecorder(pl.Callback):
    """Every logged metric after each training batch, validation epoch and training epoch."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, float]]] = []
        self.optpipe: dict[str, float] = {}  # the strategy's own metrics, latest values

    def _snap(self, trainer: pl.Trainer, where: str) -> None:
        metrics = trainer.callback_metrics
        row = {k: float(v) for k, v in metrics.items() if not k.startswith("optpipe/")}
        self.optpipe.update({k: float(v) for k, v in metrics.items() if k.startswith("optpipe/")})
        self.rows.append((where, row))

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self._snap(trainer, "train")

    def on_validation_epoch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self._snap(trainer, "val")

    def on_train_epoch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self._snap(trainer, "epoch")


def trainer(devices: int, strategy: Any = "auto", **kwargs: Any) -> pl.Trainer:
    """``fit_helpers.cpu_trainer``, two epochs unless told."""
    kwargs.setdefault("max_epochs", 2)
    return cpu_trainer(devices, strategy, **kwargs)


def run_session(
    devices: int,
    strategy: Any,
    out: Path,
    after_fit: Callable[[pl.Trainer], None] | None = None,
) -> None:
    """fit, validate, test, predict; rank 0 saves metrics, returns and parameters to ``out``."""
    model = LM()
    rec = MetricsRecorder()
    tr = trainer(devices, strategy, callbacks=[rec])
    tr.fit(model)
    if after_fit is not None:
        after_fit(tr)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    extra: dict[str, Any] = {"optpipe": dict(rec.optpipe)}
    if hasattr(tr.strategy, "switches"):
        extra["switches"] = [dict(s) for s in tr.strategy.switches]
    val, test, pred = tr.validate(model), tr.test(model), tr.predict(model)
    if tr.global_rank == 0:
        torch.save(
            {"rows": rec.rows, "val": val, "test": test, "pred": pred, "state": state, **extra},
            out,
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, fn: Callable[[], None], errors: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
        WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    # a hang is diagnosed, not just killed: SIGUSR1 writes every thread's stack to a file
    stacks = open(Path(errors, f"rank{rank}.stacks"), "w")  # noqa: SIM115 (lives as the process)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    try:
        fn()
    except BaseException as e:
        Path(errors, f"rank{rank}.txt").write_text(
            f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}"
        )
        os._exit(1)
    os._exit(0)


def launch(world: int, fn: Callable[[], None], workdir: Path, timeout: float = 240) -> list[str]:
    """Run ``fn`` in ``world`` processes launched as Lightning's popen workers are (forked);
    the first line of each rank's error (empty: none). A process still alive at ``timeout``
    is a hang: killed, and reported as such."""
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = multiprocessing.get_context("fork")
    port = free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world, port, fn, str(workdir))) for r in range(world)
    ]
    # the ranks must never collect objects of this test session (a gloo process group an
    # earlier in-process test left behind joins threads a fork does not have: a hang)
    with inherited_objects_frozen():
        for p in procs:
            p.start()
    deadline = time.monotonic() + timeout  # one deadline for all ranks
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:  # where each hung rank is, before it goes
        os.kill(procs[r].pid or 0, signal.SIGUSR1)
    if hung:
        time.sleep(2.0)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    if hung:
        stacks = "\n".join(
            f"--- rank {r} ---\n" + Path(workdir, f"rank{r}.stacks").read_text()[-6000:]
            for r in hung
            if Path(workdir, f"rank{r}.stacks").exists()
        )
        raise AssertionError(f"ranks {hung} still running after {timeout}s (a hang)\n{stacks}")
    out = []
    for r in range(world):
        f = Path(workdir, f"rank{r}.txt")
        out.append(f.read_text().splitlines()[0] if f.exists() else "")
    return out
