"""A model larger than one process: memory per rank, pipelined over CPU processes (issue 31).

Two measurements, each in fresh child processes (peak RSS is the process's ``ru_maxrss``):

1. ``sizes``: an MLP of ``--gb`` GB of fp32 parameters (``--width`` x ``--width`` linear layers,
   built in ``configure_model``) trains ``--steps`` Adam steps on one process (plain torch:
   the model built as usual, parameters + gradients + two Adam moments) and pipelined with
   ``OptPipeStrategy`` on ``--procs`` CPU processes (gloo, 1F1B). Per rank: the parameter bytes
   it holds after setup, its optimizer state bytes after training, its peak RSS, and the RSS it
   started from (after imports and process-group setup, before the model).
2. ``limit``: every process may allocate ``--limit-mb`` MB beyond the address space it has once
   its imports and process group are up (``RLIMIT_AS``, set from inside the process right before
   the model is built). A model whose one-process training state (16 bytes per parameter:
   parameters, gradients, two Adam moments) is ``--factor`` (2) times that limit fails on one
   process and trains pipelined on ``--procs`` processes under the same per-process limit.

Usage (the figures in BENCHMARKS.md)::

    python benchmarks/bench_big_model.py --gb 1.5 --procs 4 --steps 2 --json big.json
    python benchmarks/bench_big_model.py --skip-sizes --limit-mb 512    # only part 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MB = 1024 * 1024


def _vm_bytes(field: str = "VmSize") -> int:
    """This process's address space now (VmSize), or its peak (VmPeak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _limit(extra: int) -> None:
    """From now on this process may allocate ``extra`` bytes more address space."""
    if extra > 0:
        cap = _vm_bytes() + extra
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _module(width: int, layers: int) -> Any:
    import lightning.pytorch as pl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from optpipe_lightning.strategy import PipelineSpec

    class BigMLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.blocks: nn.ModuleList | None = None

        def configure_model(self) -> None:
            if self.blocks is None:
                self.blocks = nn.ModuleList(
                    [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)]
                )

        def configure_pipeline(self) -> PipelineSpec:
            assert self.blocks is not None
            return PipelineSpec(
                layers=list(self.blocks), loss_fn=lambda o, y: nn.functional.mse_loss(o, y)
            )

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> DataLoader:
            g = torch.Generator().manual_seed(0)
            n = 8 * 64
            x, y = torch.randn(n, width, generator=g), torch.randn(n, width, generator=g)
            return DataLoader(TensorDataset(x, y), batch_size=8)

    return BigMLP()


def _layers(gb: float, width: int) -> int:
    return max(1, round(gb * 1e9 / (4 * (width * width + width))))


# ---- children ----------------------------------------------------------------------------------


def one_process(args: argparse.Namespace) -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch

    torch.set_num_threads(1)
    start_rss = _rss_bytes()
    _limit(args.limit_mb * MB)
    pl.seed_everything(0, verbose=False)
    model = _module(args.width, _layers(args.gb, args.width))
    t0 = time.perf_counter()
    try:
        model.configure_model()
        opt = model.configure_optimizers()
        x, y = next(iter(model.train_dataloader()))
        for _ in range(args.steps):
            opt.zero_grad()
            out = x
            for b in model.blocks:
                out = b(out)
            torch.nn.functional.mse_loss(out, y).backward()
            opt.step()
    except (MemoryError, RuntimeError) as e:
        return {"ok": False, "error": str(e).splitlines()[0][:160], "peak_rss": _peak_rss()}
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "ok": True,
        "param_bytes": params,
        "start_rss": start_rss,
        "peak_rss": _peak_rss(),
        "seconds": time.perf_counter() - t0,
    }


def pipelined(args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    import lightning.pytorch as pl

    from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy
    from optpipe_lightning.strategy.runtime.materialize import held_bytes, optimizer_state_bytes

    class Probe(pl.Callback):
        def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
            self.info: dict[str, Any] = {"start_rss": _rss_bytes(), "start_vm": _vm_bytes()}
            _limit(args.limit_mb * MB)
            self.t0 = time.perf_counter()

        def on_train_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.info["param_bytes_after_setup"] = held_bytes(pl_module)
            self.info["setup_seconds"] = time.perf_counter() - self.t0

        def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
            self.info["optimizer_bytes"] = optimizer_state_bytes(trainer.optimizers)
            self.info["loss"] = float(trainer.callback_metrics["train_loss"])
            self.info["steps"] = trainer.global_step
            self.info["peak_rss"] = _peak_rss()
            self.info["peak_vm"] = _vm_bytes("VmPeak")
            self.info["seconds"] = time.perf_counter() - self.t0
            Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(self.info))

    pl.seed_everything(0, verbose=False)
    strategy = OptPipeStrategy(
        num_stages=args.procs,
        num_microbatches=args.procs * 2,
        schedule="1f1b",
        start_method="fork",
        profile_steps=0,
        online_resolve=False,
        use_database=False,
        repartition=False,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.procs,
        strategy=strategy,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Probe()],
    )
    try:
        trainer.fit(_module(args.width, _layers(args.gb, args.width)))
    except Exception as e:  # a rank failed (out of memory under the limit)
        return {"ok": False, "error": str(e).strip().splitlines()[-1][:160]}
    ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(args.procs)]
    return {"ok": True, "ranks": ranks}


# ---- the launching process ----------------------------------------------------------------------


def _child(role: str, args: argparse.Namespace, **over: Any) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--role", role]
    for k, v in {**vars(args), **over}.items():
        if k in ("role", "json", "skip_sizes", "skip_limit") or v is None:
            continue
        argv += [f"--{k.replace('_', '-')}", str(v)]
    env = {**os.environ, "MALLOC_ARENA_MAX": "2"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            out: dict[str, Any] = json.loads(line)
            return out
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    return {"ok": False, "error": tail[0][:160], "returncode": proc.returncode}


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default="main", choices=["main", "one", "pipelined"])
    ap.add_argument("--gb", type=float, default=1.5, help="fp32 parameter GB of part 1's model")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--limit-mb", type=int, default=0, help="part 2's per-process limit (MB)")
    ap.add_argument("--factor", type=float, default=2.0, help="part 2: training state / limit")
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip-sizes", action="store_true")
    ap.add_argument("--skip-limit", action="store_true")
    args = ap.parse_args()
    if args.role == "one":
        print(json.dumps(one_process(args)))
        return
    if args.role == "pipelined":
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(pipelined(args, d)))
        return
    report: dict[str, Any] = {"args": vars(args), "loadavg": os.getloadavg()}
    if not args.skip_sizes:
        one = _child("one", args, limit_mb=0)
        pipe = _child("pipelined", args, limit_mb=0)
        report["sizes"] = {"one_process": one, "pipelined": pipe}
        print(f"model: {_gb(_layers(args.gb, args.width) * 4 * (args.width**2 + args.width))} GB")
        print("| process | param GB | optimizer GB | start RSS GB | peak RSS GB |")
        print("|---|---|---|---|---|")
        if one.get("ok"):
            p = one["param_bytes"]
            print(
                f"| one process | {_gb(p)} | {_gb(2 * p)} | {_gb(one['start_rss'])} | "
                f"{_gb(one['peak_rss'])} |"
            )
        else:
            print(f"| one process | failed: {one.get('error')} | | | |")
        for r, info in enumerate(pipe.get("ranks", [])):
            print(
                f"| rank {r} of {args.procs} | {_gb(info['param_bytes_after_setup'])} | "
                f"{_gb(info['optimizer_bytes'])} | {_gb(info['start_rss'])} | "
                f"{_gb(info['peak_rss'])} |"
            )
        if not pipe.get("ok"):
            print(f"pipelined failed: {pipe.get('error')}")
    if not args.skip_limit:
        limit = args.limit_mb or 512
        # one process's training state (16 B per parameter: 4x the fp32 parameter bytes) is
        # ``--factor`` times the limit
        gb = args.factor * limit * MB / 4 / 1e9
        lim = argparse.Namespace(**{**vars(args), "gb": gb, "limit_mb": limit})
        one = _child("one", lim)
        pipe = _child("pipelined", lim)
        report["limit"] = {"limit_mb": limit, "model_gb": gb, "one_process": one, "pipelined": pipe}
        print(
            f"limit {limit} MB per process; model {gb:.3f} GB fp32 parameters "
            f"(one process's training state {4 * gb:.2f} GB = {args.factor:g}x the limit)"
        )
        print(f"one process: {'trains' if one.get('ok') else 'fails: ' + str(one.get('error'))}")
        if pipe.get("ok"):
            peaks = [_gb(r["peak_rss"]) for r in pipe["ranks"]]
            steps = pipe["ranks"][0]["steps"]
            print(f"pipelined on {args.procs} processes: trains {steps} steps; peak RSS {peaks} GB")
        else:
            print(f"pipelined on {args.procs} processes: fails: {pipe.get('error')}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
