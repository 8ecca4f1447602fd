"""Train a small GPT-style model pipelined with ``Trainer(strategy=OptPipeStrategy(...))``.

The data is generated: sequences of a noisy affine recurrence over a small vocabulary
(``x[t+1] = (a * x[t] + b) mod V`` with a few random tokens), so the loss visibly falls from
``ln V`` towards the noise floor within a few hundred steps.

CPU, 2 processes (gloo), a couple of minutes::

    python examples/train_gpt.py --devices 2 --steps 60

CPU, 4 processes, ZB-V (2 chunks per device)::

    python examples/train_gpt.py --devices 4 --schedule zbv --layers 8 --steps 60

GPUs (NCCL), same script::

    python examples/train_gpt.py --accelerator gpu --devices 8 --dim 1024 --layers 32 \\
        --seq 1024 --batch 64 --microbatches 16 --steps 1000

The module is written as for one device: its ``training_step`` and ``validation_step`` call
``self(x)`` (the pipeline answers it on the last stage) and log the loss, perplexity and
accuracy, shown in the progress bar. The first ``--profile-steps`` steps measure F/B/W per stage
and the activation bytes; the profile goes to the database (``--db``; default: optpipe's default
location) and the next run of the same model on the same hardware starts from it.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optpipe_lightning.strategy import PipelineSpec
from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy


class AffineSequences(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``n`` sequences of length ``seq + 1``; inputs are the first ``seq``, targets shifted."""

    def __init__(self, n: int, seq: int, vocab: int, noise: float = 0.05, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        a, b = 5, 3
        x = torch.empty(n, seq + 1, dtype=torch.long)
        x[:, 0] = torch.randint(vocab, (n,), generator=g)
        for t in range(seq):
            x[:, t + 1] = (a * x[:, t] + b) % vocab
        flip = torch.rand(n, seq + 1, generator=g) < noise
        x[flip] = torch.randint(vocab, (int(flip.sum()),), generator=g)
        self.x = x

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i, :-1], self.x[i, 1:]


class Embed(nn.Module):
    def __init__(self, vocab: int, dim: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos[: idx.shape[1]]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class TinyGPT(pl.LightningModule):
    def __init__(
        self,
        vocab: int = 64,
        dim: int = 128,
        heads: int = 4,
        layers: int = 4,
        seq: int = 64,
        batch: int = 16,
        lr: float = 3e-3,
        samples: int = 4096,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = Embed(vocab, dim, seq)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = Head(dim, vocab)

    # the one hook optpipe needs: the layers in the order they run
    def configure_pipeline(self) -> PipelineSpec:
        blocks = list(self.blocks)
        # relative costs for the partition: a block ~ 12 d^2, embedding ~ 0, head ~ d * V
        d, v = self.hparams["dim"], self.hparams["vocab"]
        costs = [0.1 * d * d, *([12.0 * d * d] * len(blocks)), 2.0 * d * v]
        return PipelineSpec(layers=[self.embed, *blocks, self.head], layer_costs=costs)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # pipelined: the pipeline answers it
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)

    def _metrics(self, batch: Any, prefix: str) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        acc = (logits.argmax(-1) == y).float().mean()
        self.log(f"{prefix}_loss", loss, prog_bar=True)
        self.log(f"{prefix}_ppl", torch.exp(loss.detach()), prog_bar=True)
        self.log(f"{prefix}_acc", acc, prog_bar=True)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._metrics(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._metrics(batch, "val")

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"], weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self) -> DataLoader[Any]:
        h = self.hparams
        ds = AffineSequences(h["samples"], h["seq"], h["vocab"])
        return DataLoader(ds, batch_size=h["batch"], shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader[Any]:
        h = self.hparams
        ds = AffineSequences(4 * h["batch"], h["seq"], h["vocab"], seed=1)
        return DataLoader(ds, batch_size=h["batch"], drop_last=True)


class Progress(pl.Callback):
    """Loss, perplexity, accuracy and step time every ``every`` steps (0: only at the end),
    and the schedule switches, on global rank 0."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.t = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        step = trainer.global_step
        if self.every and trainer.is_global_zero and step % self.every == 0:
            now = time.perf_counter()
            m = trainer.callback_metrics
            print(
                f"step {step:5d}  loss {float(m['train_loss']):.4f}  ppl "
                f"{float(m['train_ppl']):.3f}  acc {float(m['train_acc']):.3f}  "
                f"{1000 * (now - self.t) / self.every:.1f} ms/step",
                flush=True,
            )
            self.t = now

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        strat = trainer.strategy
        if trainer.is_global_zero and isinstance(strat, OptPipeStrategy):
            for s in strat.switches:
                pred = s["predicted_seconds"]
                print(
                    f"switch at step {s['step']}: {s['from']} -> {s['to']} ({s['reason']}), "
                    f"predicted {pred if pred is None else f'{1000 * pred:.1f} ms'}"
                )
            m = trainer.callback_metrics
            print(
                f"final loss {float(m.get('train_loss', float('nan'))):.4f} "
                f"(ln V = {math.log(pl_module.hparams['vocab']):.4f}), val ppl "
                f"{float(m.get('val_ppl', float('nan'))):.3f}, val acc "
                f"{float(m.get('val_acc', float('nan'))):.3f}"
            )


def count(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse turns the error into one usage line)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--devices", type=count, default=2)
    ap.add_argument("--stages", type=count, default=None, help="default: devices / data-parallel")
    ap.add_argument("--data-parallel", type=count, default=1)
    ap.add_argument(
        "--microbatches",
        type=lambda v: v if v == "auto" else int(v),
        default="auto",
        help="microbatches per batch (auto: divides the batch, >= 2 per stage if it can)",
    )
    ap.add_argument("--schedule", default="optimal")
    ap.add_argument("--layers", type=count, default=4)
    ap.add_argument("--dim", type=count, default=128)
    ap.add_argument("--heads", type=count, default=4)
    ap.add_argument("--seq", type=count, default=64)
    ap.add_argument("--vocab", type=count, default=64)
    ap.add_argument("--batch", type=count, default=16)
    ap.add_argument("--steps", type=count, default=60)
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--memory-limit", type=float, default=None, help="bytes (default: auto)")
    ap.add_argument("--no-offload", action="store_true")
    ap.add_argument("--no-resolve", action="store_true")
    ap.add_argument("--time-limit", type=float, default=20.0, help="solver seconds")
    ap.add_argument("--db", default=None, help="database URL (default: optpipe's default)")
    ap.add_argument("--no-db", action="store_true")
    ap.add_argument("--precision", default="32-true")
    ap.add_argument("--every", type=int, default=0, help="print a line every N steps (0: no)")
    ap.add_argument("--val-every", type=count, default=20, help="validate every N steps")
    ap.add_argument("--no-progress-bar", action="store_true")
    args = ap.parse_args()

    pl.seed_everything(0, workers=True)
    model = TinyGPT(
        vocab=args.vocab,
        dim=args.dim,
        heads=args.heads,
        layers=args.layers,
        seq=args.seq,
        batch=args.batch,
    )
    strategy = OptPipeStrategy(
        num_stages=args.stages or "auto",
        data_parallel=args.data_parallel,
        num_microbatches=args.microbatches,
        schedule=args.schedule,
        memory_limit=args.memory_limit if args.memory_limit is not None else "auto",
        offload=not args.no_offload,
        online_resolve=not args.no_resolve,
        solver_time_limit=args.time_limit,
        profile_steps=args.profile_steps,
        database=args.db,
        use_database=not args.no_db,
    )
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=strategy,
        max_steps=args.steps,
        precision=args.precision,
        gradient_clip_val=1.0,
        val_check_interval=min(args.val_every, args.steps),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=not args.no_progress_bar,
        enable_model_summary=False,
        callbacks=[Progress(args.every)],
    )
    trainer.fit(model)


if __name__ == "__main__":
    main()
