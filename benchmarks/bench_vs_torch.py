"""The strategy against torch.distributed.pipelining driven directly, schedule by schedule.

Same model on both sides (``--layers`` x (Linear(``--width``) + GELU), batch ``--batch`` in
``--microbatches`` microbatches, MSE loss, AdamW), ``--procs`` CPU processes over gloo with one
thread each, glibc's allocator tuned the same way on both sides (``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` set for every process, the values ``tune_host_allocator`` uses; the
strategy leaves the allocator alone when they are set). ``--allocator default`` runs both at
glibc's defaults instead.

- **torch**: every rank builds its ``PipelineStage`` (s) and torch's schedule class
  (``Schedule1F1B``, ``ScheduleInterleaved1F1B``, ``ScheduleZBVZeroBubble``,
  ``ScheduleInterleavedZeroBubble``) and loops ``schedule.step``, ``optimizer.step``,
  ``zero_grad``. All ranks are started at once with the environment ``torchrun`` sets.
- **optpipe**: ``Trainer(strategy=OptPipeStrategy(schedule=...))`` on a LightningModule with the
  same layers, started as a user starts it (``python script.py``: Lightning's launcher starts the
  other ranks at ``fit()``; ``--optpipe-launch fork``: ``start_method="fork"``, the other
  ranks forked at ``fit()`` with the imports done; ``direct`` starts all ranks at once like
  torch, ``torchrun`` through torch's launcher). torch's ranks are started at once (``--torch-launch
  direct``, the environment torchrun sets, without its agent) or by ``torchrun``.
  The strategy runs its own schedule of that name (same order as torch's for 1f1b, zbv and
  interleaved-1f1b); ``interleaved-zb`` (no generator of ours) runs torch's order through the
  strategy (``schedule_source``), as does every schedule with ``--optpipe-order torch``.
  Progress bar, logger, checkpointing and model summary are off (the torch loop prints nothing);
  the strategy's own defaults are kept (profiling steps, calibration, the run log in a fresh
  SQLite file per run, loss logging), except that a named schedule runs no solver.
- **default**: the strategy's default mode (``schedule="optimal"``: profiling, the best
  baseline, the background solver and its switches), for ``--default-steps`` steps.

Runs are interleaved: every round runs every configuration once, in a rotated order, each in
fresh processes, so a change of machine load hits all of them alike; ratios are taken within a
round and their median reported. Per run: the median step time on rank 0 (optimizer step to
optimizer step) over the steps after ``--skip``, and its spread (interquartile range); the
pipeline (``schedule.step`` / the runtime's step), the optimizer update and the rest ("around":
loss hand-out, calibration, run log, Lightning's loop) per step; start-up (process launch to the
end of the first optimizer step); peak RSS per rank. For the default mode: the time lost before
its steady phase against the strategy's 1f1b of the same round, its steady gain per step, and
the steps to break even.

``--paired``: torch's own step runs inside each strategy run, right after every strategy step
(barriers around it), so both meet the same load; each strategy step is divided by the torch
step after it. Per schedule the report gives the median of these per-step ratios pooled over
all rounds and its bootstrap interval (``--level``, default 90%: rounds drawn with replacement,
then steps within each drawn round, ``--resamples`` times, seeded), the range of the rounds'
own medians, the CPU ratio likewise, and whether the interval lies below ``--target`` (default
1.03: "within"), above it ("above") or across it ("undecided"); then the noise: the per-step
ratio's spread inside a run, the spread of the runs' medians, and the rounds that would give
+-1% at this many steps per run. The rounds rotate the schedules' order, so a slow phase of the
machine falls on different schedules. On the 2-core machine (2026-11-28) one step's ratio
scatters by 5-11% (s.d.), so +-1% needs ~300 paired steps per schedule: e.g. ``--rounds 4
--steps 90 --skip 14`` (the strategy calibrates its costs in its first ~13 steps).

Usage::

    python benchmarks/bench_vs_torch.py                       # the issue's setting, 3 rounds
    python benchmarks/bench_vs_torch.py --quick               # small model, 1 round, smoke test
    python benchmarks/bench_vs_torch.py --schedules 1f1b zbv --rounds 5 --json out.json
    python benchmarks/bench_vs_torch.py --paired --rounds 4 --steps 90 --skip 14 --json p.json
    python benchmarks/bench_vs_torch.py --report p.json --target 1.02   # the tables again
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _shared import add_mlp_args

TORCH_CLASSES = {
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "zbv": "ScheduleZBVZeroBubble",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
}
OWN_NAMES = {"1f1b": "1f1b", "interleaved-1f1b": "interleaved-1f1b", "zbv": "zbv"}
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 << 20, 1 << 30  # what strategy/runtime/host_allocator.py sets


# ---- the model, the same on both sides ---------------------------------------------------------


def make_layers(n: int, width: int) -> list[Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(n)]


def make_batch(batch: int, width: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


def mse(out: Any, y: Any) -> Any:
    from torch.nn import functional

    return functional.mse_loss(out, y)


def placement(schedule: str, procs: int) -> tuple[int, str]:
    """(chunks per rank, "interleaved" | "vshape") of a schedule."""
    if schedule == "1f1b":
        return 1, "interleaved"
    return 2, "vshape" if schedule == "zbv" else "interleaved"


def local_groups(schedule: str, procs: int, rank: int) -> list[int]:
    v, place = placement(schedule, procs)
    if v == 1:
        return [rank]
    if place == "vshape":
        return [rank, 2 * procs - 1 - rank]
    return [c * procs + rank for c in range(v)]


def group_bounds(n_layers: int, n_groups: int) -> list[tuple[int, int]]:
    base, extra = divmod(n_layers, n_groups)
    out, start = [], 0
    for g in range(n_groups):
        size = base + (1 if g < extra else 0)
        out.append((start, start + size))
        start += size
    return out


def torch_order(schedule: str, procs: int, m: int) -> dict[int, list[Any]]:
    """torch's compute order of ``schedule`` (its class's ``pipeline_order``), built on
    stand-in stages (no process group needed); 1F1B's hand-written loop as its order."""
    from unittest import mock

    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as sch

    if schedule == "1f1b":
        order: dict[int, list[Any]] = {}
        for r in range(procs):
            warm = min(m, procs - r)
            row = [sch._Action(r, sch.FORWARD, i) for i in range(warm)]
            f, b = warm, 0
            while b < m:
                row.append(sch._Action(r, sch.FULL_BACKWARD, b))
                b += 1
                if f < m:
                    row.append(sch._Action(r, sch.FORWARD, f))
                    f += 1
            order[r] = row
        return order
    cls = getattr(sch, TORCH_CLASSES[schedule])
    v, _ = placement(schedule, procs)
    stages = []
    for g in local_groups(schedule, procs, 0):
        st = mock.create_autospec(PipelineStage, instance=True)
        st.group_rank, st.group_size, st.num_stages, st.stage_index = 0, procs, procs * v, g
        st.submod, st.is_first, st.is_last = None, g == 0, g == procs * v - 1
        stages.append(st)
    built = cls(stages, m, loss_fn=mse)
    return {r: [a for a in row if a is not None] for r, row in built.pipeline_order.items()}


def order_as_schedule(problem: Any, order: dict[int, list[Any]]) -> Any:
    """torch's order as our ``Schedule`` (F -> F, I -> B, W -> W, full B -> BW)."""
    from torch.distributed.pipelining import schedules as sch

    from optpipe_lightning.schedule import Action, Schedule

    ops = {sch.FORWARD: "F", sch.BACKWARD_INPUT: "B", sch.BACKWARD_WEIGHT: "W"}
    ops[sch.FULL_BACKWARD] = "BW"
    chunk_of = {
        problem.group_of(s, c): (s, c)
        for s in range(problem.num_stages)
        for c in range(problem.num_chunks)
    }
    rows: list[list[Action]] = [[] for _ in range(problem.num_stages)]
    for _rank, row in sorted(order.items()):
        for a in row:
            op = ops.get(a.computation_type)
            if op is None:
                continue
            s, c = chunk_of[a.stage_index]
            rows[s].append(Action(op=op, mb=a.microbatch_index, chunk=c))
    return Schedule(problem_hash=problem.hash, generator="torch-order", actions=rows)


# ---- one run's child processes ---------------------------------------------------------------


def process_start() -> float:
    """This process's start (epoch seconds, 10 ms resolution), from /proc (else now)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # seconds after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - started)
    except (OSError, ValueError, IndexError):
        return time.time()


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def native_pipeline(args: argparse.Namespace, rank: int, world: int) -> Any:
    """torch's own pipeline of the model on this rank (stages, schedule class, AdamW): a
    function running one optimizer step of it, returning the seconds of the pipeline and of the
    optimizer update, wall and CPU (all threads)."""
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as sch

    layers = make_layers(args.layers, args.width)
    v, _ = placement(args.schedule, world)
    bounds = group_bounds(args.layers, world * v)
    groups = local_groups(args.schedule, world, rank)
    mods = [torch.nn.Sequential(*layers[slice(*bounds[g])]) for g in groups]
    stages = [
        PipelineStage(mod, g, world * v, torch.device("cpu"))
        for mod, g in zip(mods, groups, strict=True)
    ]
    cls = getattr(sch, TORCH_CLASSES[args.schedule])
    sched = cls(stages[0] if v == 1 else stages, args.microbatches, loss_fn=mse)
    opt = torch.optim.AdamW([p for m in mods for p in m.parameters()], lr=1e-4)
    x, y = make_batch(args.batch, args.width)
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)

    def step() -> tuple[float, float, float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        kw: dict[str, Any] = {"target": y, "losses": []} if last else {}
        if first:
            sched.step(x, **kw)
        else:
            sched.step(**kw)
        t1, c1 = time.perf_counter(), time.process_time()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return t1 - t0, time.perf_counter() - t1, c1 - c0, time.process_time() - c1

    return step


def torch_child(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    timeline = {"start": process_start(), "imported": time.time()}
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    timeline["connected"] = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    native_step = native_pipeline(args, rank, world)
    steps: list[dict[str, float]] = []
    t_first = None
    timeline["first_begin"] = time.time()
    cpu = time.process_time  # every thread of the process (gloo's too)
    for _ in range(args.steps):
        pipeline, optimizer, cpu_pipeline, cpu_optimizer = native_step()
        end = time.perf_counter()
        if t_first is None:
            t_first = time.time()
        steps.append(
            {
                "end": end,
                "pipeline": pipeline,
                "optimizer": optimizer,
                "cpu_end": cpu(),
                "cpu_pipeline": cpu_pipeline,
                "cpu_optimizer": cpu_optimizer,
            }
        )
    _write(args, rank, steps, t_first, {"timeline": timeline})
    dist.destroy_process_group()


def optpipe_child(args: argparse.Namespace) -> None:
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, Dataset

    import optpipe_lightning.strategy.runtime.engine as engine_mod
    from optpipe_lightning.strategy import PipelineSpec
    from optpipe_lightning.strategy.lightning.module_steps import ModuleStep
    from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy
    from optpipe_lightning.strategy.scheduling.scheduler import Scheduler

    timeline = {"start": process_start(), "imported": time.time()}
    keys = ("pipeline", "loss", "boundary", "optimizer")
    acc: dict[str, float] = {k: 0.0 for k in keys} | {f"cpu_{k}": 0.0 for k in keys}
    backward_end = [0.0, 0.0]  # Lightning runs the step inside ``optimizer.step(closure)``
    cpu = time.process_time  # every thread of the process (gloo's too)

    marks: dict[str, float] = {}  # the last pipeline step's start and end (perf_counter)

    def timed(fn: Any, key: str) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0, c0 = time.perf_counter(), cpu()
            try:
                return fn(*a, **k)
            finally:
                t1 = time.perf_counter()
                acc[key] += t1 - t0
                acc[f"cpu_{key}"] += cpu() - c0
                if key == "pipeline":
                    marks.update(pipeline_start=t0, pipeline_end=t1)
                else:
                    marks[f"{key}_end"] = t1

        return wrapper

    # the breakdown: torch's runtime step, the loss hand-out, the boundary (calibration, run
    # log, re-solve), the optimizer update (its step hooks)
    engine_mod.run_step = timed(engine_mod.run_step, "pipeline")
    for cls, name, key in (
        (engine_mod.PipelineEngine, "_broadcast_loss", "loss"),
        # the Lightning path's hand-out (loss, logs, outputs): a training step's, whose wait for
        # the last stage is where a late hand-out shows (the pickled ``share`` runs inside it)
        (ModuleStep, "share_training", "loss"),
        (Scheduler, "at_boundary", "boundary"),
    ):
        if hasattr(cls, name):
            setattr(cls, name, timed(getattr(cls, name), key))
    strategy_backward = OptPipeStrategy.backward

    def backward(self: Any, *a: Any, **k: Any) -> Any:
        out = strategy_backward(self, *a, **k)
        backward_end[:] = [time.perf_counter(), cpu()]
        marks["backward_end"] = backward_end[0]
        return out

    OptPipeStrategy.backward = backward  # type: ignore[method-assign]
    strategy_training_step = OptPipeStrategy.training_step

    def training_step(self: Any, *a: Any, **k: Any) -> Any:
        marks["step_start"] = time.perf_counter()  # Lightning's loop ends, the strategy's begins
        return strategy_training_step(self, *a, **k)

    OptPipeStrategy.training_step = training_step  # type: ignore[method-assign]

    class OneBatch(Dataset):
        """The same batch every step, no collation (torch's loop reuses one tensor too)."""

        def __init__(self, n: int) -> None:
            self.n = n
            self.xy = make_batch(args.batch, args.width)

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> Any:
            return self.xy

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(make_layers(args.layers, args.width))

        def configure_pipeline(self) -> PipelineSpec:
            return PipelineSpec(layers=list(self.blocks), loss_fn=mse)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=1e-4)

            def after_update(*_: Any) -> None:  # the update: from the closure's end
                marks["optimizer_end"] = time.perf_counter()
                acc["optimizer"] += marks["optimizer_end"] - backward_end[0]
                acc["cpu_optimizer"] += cpu() - backward_end[1]

            opt.register_step_post_hook(after_update)
            return opt

        def train_dataloader(self) -> Any:
            return DataLoader(OneBatch(args.steps), batch_size=None)

    steps: list[dict[str, Any]] = []
    first: list[float] = []
    native: list[Any] = []  # --paired: torch's own pipeline, built at the first step's end

    prof: Any = None
    native_prof: Any = None  # --paired: torch's steps profiled apart (same process, same load)
    if args.cprofile:
        import cProfile

        prof = cProfile.Profile(time.thread_time)  # CPU time: load on the machine moves it less
        if args.paired:
            native_prof = cProfile.Profile(time.thread_time)

    class Clock(pl.Callback):
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            timeline["connected"] = time.time()  # process group up, before the strategy's setup

        def on_train_batch_start(self, trainer: Any, *a: Any) -> None:
            timeline.setdefault("first_begin", time.time())

        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            if not first:
                first.append(time.time())
            if prof is not None and len(steps) == args.skip:
                prof.enable()
            sched = trainer.strategy.scheduler
            row: dict[str, Any] = {"end": time.perf_counter(), "cpu_end": cpu(), **acc, **marks}
            row["schedule"] = sched.engine.schedule.generator if sched and sched.engine else ""
            row["solving"] = bool(sched is not None and sched.resolve.active)
            steps.append(row)
            for k in acc:
                acc[k] = 0.0
            if args.paired:  # torch's own step, now, in these processes (see --paired)
                import torch.distributed as dist

                if not native:
                    native.append(native_pipeline(args, dist.get_rank(), dist.get_world_size()))
                profiling = prof is not None and len(steps) > args.skip
                if profiling:
                    prof.disable()
                dist.barrier()
                t0, c0 = time.perf_counter(), cpu()
                if profiling:
                    native_prof.enable()
                pipeline, optimizer, _, _ = native[0]()
                row["native_pipeline_end"] = time.perf_counter() - optimizer
                if profiling:
                    native_prof.disable()
                row.update(
                    native=time.perf_counter() - t0,
                    native_pipeline=pipeline,
                    native_optimizer=optimizer,
                    cpu_native=cpu() - c0,
                )
                dist.barrier()
                row["resume"], row["cpu_resume"] = time.perf_counter(), cpu()
                if profiling:
                    prof.enable()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if prof is not None:
                prof.disable()
                prof.dump_stats(os.path.join(args.cprofile, f"rank{trainer.global_rank}.prof"))
            if native_prof is not None:
                path = os.path.join(args.cprofile, f"rank{trainer.global_rank}.torch.prof")
                native_prof.dump_stats(path)
            extra = {
                "timeline": timeline,
                "heavy_imports": sorted(
                    m
                    for m in ("ortools", "sqlalchemy", "alembic", "scipy", "pandas", "highspy")
                    if m in sys.modules
                ),
                "switches": [
                    {k: s[k] for k in ("step", "from", "to", "reason")}
                    for s in trainer.strategy.switches
                ],
            }
            _write(args, trainer.global_rank, steps, first[0] if first else None, extra)

    name = args.schedule
    kwargs: dict[str, Any] = {"num_microbatches": args.microbatches}
    if name == "optimal":
        kwargs["solver_time_limit"] = args.solver_time_limit
    elif name in OWN_NAMES and args.optpipe_order == "own":
        kwargs["schedule"] = OWN_NAMES[name]
    else:
        order = torch_order(name, args.procs, args.microbatches)
        kwargs.update(
            schedule="optimal",
            num_chunks=placement(name, args.procs)[0],
            online_resolve=False,
            schedule_source=lambda problem: order_as_schedule(problem, order),
        )
        if placement(name, args.procs)[1] == "vshape":
            raise SystemExit("--optpipe-order torch for zbv: use --optpipe-order own (same order)")
    if args.allocator == "default":
        kwargs["tune_host_allocator"] = False
    if args.optpipe_launch == "fork":  # Lightning's fork launcher: ranks inherit the imports
        kwargs["start_method"] = "fork"
    kwargs["database"] = f"sqlite:///{args.out}/runs.db"
    if args.strategy_options:  # what a default costs: e.g. '{"use_database": false}'
        kwargs.update(json.loads(args.strategy_options))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.procs,
        max_steps=args.steps,
        strategy=OptPipeStrategy(**kwargs),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[Clock()],
    )
    timeline["fit"] = time.time()
    trainer.fit(Model())


def pair_child(args: argparse.Namespace) -> None:
    """The runtimes alone, in one process pair: torch's schedule class and the strategy's
    engine (same order, own copies of the same layers) take turns step by step (no optimizer,
    no Lightning), so the machine's load hits both alike."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as sch

    from optpipe_lightning.schedule.baselines import generate
    from optpipe_lightning.strategy.planning.planner import initial_problem
    from optpipe_lightning.strategy.runtime.engine import PipelineEngine

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    v, place = placement(args.schedule, world)
    bounds = group_bounds(args.layers, world * v)
    groups = local_groups(args.schedule, world, rank)
    mods = [
        torch.nn.Sequential(*make_layers(args.layers, args.width)[slice(*bounds[g])])
        for g in groups
    ]
    stages = [
        PipelineStage(mod, g, world * v, torch.device("cpu"))
        for mod, g in zip(mods, groups, strict=True)
    ]
    cls = getattr(sch, TORCH_CLASSES[args.schedule])
    native = cls(stages[0] if v == 1 else stages, args.microbatches, loss_fn=mse)
    problem = initial_problem(world, args.microbatches, v, place, [1.0] * (world * v))  # type: ignore[arg-type]
    if args.schedule in OWN_NAMES and args.optpipe_order == "own":
        ours_sched = generate(OWN_NAMES[args.schedule], problem)
    else:
        ours_sched = order_as_schedule(
            problem, torch_order(args.schedule, world, args.microbatches)
        )
    sizes = [b - a for a, b in bounds]
    engine = PipelineEngine(
        make_layers(args.layers, args.width),
        mse,
        problem,
        ours_sched,
        sizes,
        rank,
        dist.group.WORLD,
        torch.device("cpu"),
    )
    engine.async_loss = True
    x, y = make_batch(args.batch, args.width)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    params = {"torch": [p for m in mods for p in m.parameters()], "optpipe": engine.parameters}

    def step(side: str) -> None:
        if side == "optpipe":
            engine.step(x, y)
            return
        kw: dict[str, Any] = {"target": y, "losses": []} if last else {}
        if first:
            native.step(x, **kw)
        else:
            native.step(**kw)

    rows: list[dict[str, Any]] = []
    for i in range(args.steps):
        for side in ("torch", "optpipe") if i % 2 == 0 else ("optpipe", "torch"):
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            step(side)
            rows.append(
                {"side": side, "wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
            )
            for p in params[side]:
                p.grad = None
    engine.finish_loss_handout()
    walls = [
        [r["wall"] for r in part]
        for part in _gather(rows, rank, world, dist)  # every rank's rows, in order
    ]
    _write(
        args,
        rank,
        [dict(r, slowest=max(w[i] for w in walls)) for i, r in enumerate(rows)],
        None,
        {},
    )
    dist.destroy_process_group()


def _gather(
    rows: list[dict[str, Any]], rank: int, world: int, dist: Any
) -> list[list[dict[str, Any]]]:
    out: list[Any] = [None] * world
    dist.all_gather_object(out, rows)
    return out


def _write(
    args: argparse.Namespace,
    rank: int,
    steps: list[dict[str, Any]],
    t_first: float | None,
    extra: dict[str, Any],
) -> None:
    info = {"rank": rank, "steps": steps, "t_first": t_first, "rss_mb": _rss_mb(), **extra}
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(info))


# ---- the driver --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_once(args: argparse.Namespace, side: str, schedule: str, steps: int) -> dict[str, Any]:
    """One run in fresh processes; its per-rank records, start-up and RSS."""
    with tempfile.TemporaryDirectory(prefix="optpipe-bench-") as out:
        env = dict(os.environ)
        env.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        if args.allocator == "tuned":
            env.update(
                MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD),
                MALLOC_TRIM_THRESHOLD_=str(TRIM_THRESHOLD),
            )
        cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--schedule", schedule]
        cmd += ["--out", out, "--steps", str(steps), "--procs", str(args.procs)]
        for k in ("layers", "width", "batch", "microbatches", "solver_time_limit", "allocator"):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        cmd += ["--optpipe-order", args.optpipe_order, "--optpipe-launch", args.optpipe_launch]
        cmd += ["--paired"] if args.paired else []
        cmd += ["--verbose"] if args.verbose else []
        cmd += ["--strategy-options", args.strategy_options] if args.strategy_options else []
        if side == "base":  # the strategy from another checkout (--compare-code)
            env["PYTHONPATH"] = os.pathsep.join(
                [os.path.abspath(args.compare_code), env.get("PYTHONPATH", "")]
            )
            cmd[cmd.index("--child") + 1] = "optpipe"
        launch = args.torch_launch if side == "torch" else args.optpipe_launch
        if side == "pair":
            launch = "direct"
        t0 = time.time()
        procs = []
        if launch == "torchrun":  # torch's launcher: an agent process starts every rank
            run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            run += [f"--nproc-per-node={args.procs}", *cmd[1:]]
            procs.append(
                subprocess.Popen(run, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            )
        one = launch in ("lightning", "fork")  # the strategy's launcher starts the others
        for r in range(args.procs if launch == "direct" else 1 if one else 0):
            e = dict(env)
            if launch == "direct":  # every rank at once, with the environment torchrun sets
                e.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.procs), NODE_RANK="0")
                e.update(LOCAL_WORLD_SIZE=str(args.procs))
            procs.append(
                subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            )
        logs = []
        for p in procs:
            try:
                text, _ = p.communicate(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
            logs.append(text.decode(errors="replace"))
            if p.returncode != 0:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"{side}/{schedule} failed:\n" + "\n".join(logs)[-4000:])
        ranks_out = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(args.procs)]
    return {"side": side, "schedule": schedule, "t0": t0, "ranks": ranks_out}


def summarize(run: dict[str, Any], skip: int) -> dict[str, Any]:
    """Rank 0's step times after ``skip`` (optimizer step to optimizer step) and the parts."""
    r0 = run["ranks"][0]
    ends = [s["end"] for s in r0["steps"]]
    steps = [b - a for a, b in itertools.pairwise(ends)]  # step i+1's time
    rows = r0["steps"][1:]
    keep = list(range(max(0, skip - 1), len(steps)))
    if not keep:
        raise ValueError("no steps left after --skip; raise --steps")
    wall = [steps[i] for i in keep]
    parts: dict[str, float] = {}
    for key in ("pipeline", "optimizer", "loss", "boundary"):
        parts[key] = statistics.median(rows[i].get(key, 0.0) for i in keep)
    around = [
        steps[i] - rows[i]["pipeline"] - rows[i]["optimizer"] - rows[i].get("loss", 0.0)
        for i in keep
    ]
    cpu_ends = [s.get("cpu_end", 0.0) for s in r0["steps"]]
    cpu_steps = [b - a for a, b in itertools.pairwise(cpu_ends)]
    cpu_around = [
        cpu_steps[i]
        - rows[i].get("cpu_pipeline", 0.0)
        - rows[i].get("cpu_optimizer", 0.0)
        - rows[i].get("cpu_loss", 0.0)
        for i in keep
    ]
    for key in ("pipeline", "optimizer", "loss"):
        parts[f"cpu_{key}"] = statistics.median(rows[i].get(f"cpu_{key}", 0.0) for i in keep)
    q = statistics.quantiles(wall, n=4) if len(wall) >= 2 else [wall[0]] * 3
    return {
        "median": statistics.median(wall),
        "p10": sorted(wall)[len(wall) // 10],  # the steps the machine's load hit least
        "iqr": q[2] - q[0],
        "min": min(wall),
        "max": max(wall),
        "n": len(wall),
        "around": statistics.median(around),
        "cpu_step": statistics.median(cpu_steps[i] for i in keep),
        "cpu_around": statistics.median(cpu_around),
        "startup": (r0["t_first"] - run["t0"]) if r0["t_first"] else None,
        "timeline": [
            {k: v - run["t0"] for k, v in r.get("timeline", {}).items()} for r in run["ranks"]
        ],
        "rss_mb": [r["rss_mb"] for r in run["ranks"]],
        **parts,
    }


def summarize_paired(run: dict[str, Any], skip: int) -> dict[str, Any]:
    """``--paired``: each strategy step (from the barrier after torch's step to its end, rank
    0) against torch's step right before it; medians after ``skip`` steps."""
    rows = run["ranks"][0]["steps"]
    pairs = [
        (
            rows[j]["end"] - rows[j - 1]["resume"],
            rows[j]["native"],
            rows[j]["cpu_end"] - rows[j - 1]["cpu_resume"],
            rows[j]["cpu_native"],
        )
        for j in range(max(1, skip), len(rows))
    ]
    med = statistics.median
    ratios = [p[0] / p[1] for p in pairs]
    return {
        "strategy": med(p[0] for p in pairs),
        "torch": med(p[1] for p in pairs),
        "ratio": med(ratios),
        "cpu_ratio": med(p[2] / p[3] for p in pairs),
        "q": statistics.quantiles(ratios, n=4),
        "n": len(pairs),
        "ratios": ratios,  # per step, for the pooled median and its interval (``report_paired``)
        "cpu_ratios": [p[2] / p[3] for p in pairs],
        "phases": step_phases(rows, skip),
    }


def step_phases(rows: list[dict[str, Any]], skip: int) -> dict[str, float]:
    """Where a rank's strategy step goes besides the pipeline (medians, seconds): from torch's
    step before it to the strategy's ``training_step`` (Lightning's loop), from there to the
    pipeline's start (the step's inputs, the gradient hand-over), from the
    pipeline's end to the loss hand-out's end (the wait for the last stage's loss), and from
    there to the end of the step less the optimizer update (Lightning's closure and hooks)."""
    keys = ("step_start", "pipeline_start", "pipeline_end", "loss_end", "end")
    js = [j for j in range(max(1, skip), len(rows)) if all(k in rows[j] for k in keys)]
    if not js:
        return {}
    med = statistics.median
    return {
        "before (Lightning)": med(rows[j]["step_start"] - rows[j - 1]["resume"] for j in js),
        "before (strategy)": med(rows[j]["pipeline_start"] - rows[j]["step_start"] for j in js),
        "handout": med(rows[j]["loss_end"] - rows[j]["pipeline_end"] for j in js),
        "after": med(rows[j]["end"] - rows[j]["loss_end"] - rows[j]["optimizer"] for j in js),
    }


def bootstrap_median(
    groups: list[list[float]], level: float = 0.9, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The median of the pooled values of ``groups`` (one list per round) and its ``level``
    bootstrap interval, resampling rounds and then steps within each drawn round (so the
    interval widens with the rounds' disagreement, not only with the steps' spread). Seeded:
    the same records give the same interval."""
    import random

    pooled = [x for g in groups for x in g]
    if not pooled:
        raise ValueError("no paired steps to summarise")
    rng = random.Random(seed)
    meds = []
    for _ in range(resamples):
        draw: list[float] = []
        for _ in groups:
            g = groups[rng.randrange(len(groups))]
            draw += rng.choices(g, k=len(g))
        meds.append(statistics.median(draw))
    meds.sort()
    lo = meds[int((1 - level) / 2 * (resamples - 1))]
    hi = meds[int((1 + level) / 2 * (resamples - 1))]
    return statistics.median(pooled), lo, hi


def rounds_needed(run_medians: list[float], half_width: float = 0.01, z: float = 1.645) -> float:
    """Rounds whose mean run median has a 90% interval of +-``half_width``, at the spread the
    runs showed (same steps per run); inf with fewer than 2 runs."""
    if len(run_medians) < 2:
        return float("inf")
    return (z * statistics.stdev(run_medians) / half_width) ** 2


def default_mode(run: dict[str, Any], ref_step: float, skip: int) -> dict[str, Any]:
    """The default mode against a reference step time: time lost before its steady phase
    (the steps up to the last switch or the solver's end), steady gain, steps to break even."""
    r0 = run["ranks"][0]
    ends = [s["end"] for s in r0["steps"]]
    steps = [b - a for a, b in itertools.pairwise(ends)]
    rows = r0["steps"][1:]
    last_switch = max((s["step"] for s in r0.get("switches", [])), default=0)
    solving = [i for i, row in enumerate(rows) if row.get("solving")]
    settle = max(last_switch, (solving[-1] + 2) if solving else 0) + skip
    settle = min(settle, max(0, len(steps) - 3))
    steady = statistics.median(steps[settle:])
    lost = sum(s - ref_step for s in steps[:settle])
    gain = ref_step - steady
    return {
        "steps_before_steady": settle,
        "steps_overlapping_solver": len(solving),
        "median_while_solving": statistics.median([steps[i] for i in solving]) if solving else None,
        "steady": steady,
        "reference": ref_step,
        "time_lost": lost,
        "gain_per_step": gain,
        # steps of the steady phase that pay the time lost back (0: nothing to pay back)
        "break_even_steps": max(0.0, lost / gain) if gain > 0 else (0.0 if lost <= 0 else None),
        "switches": r0.get("switches", []),
        "startup": (r0["t_first"] - run["t0"]) if r0["t_first"] else None,
    }


def run_pairs(args: argparse.Namespace) -> None:
    """``--pair``: each schedule's runtimes side by side; per-step medians after ``--skip``."""
    print(
        f"runtimes alone, {args.procs} processes, {args.layers} x Linear({args.width}), batch "
        f"{args.batch} in {args.microbatches} microbatches; load {_loadavg()}\n\n"
        "| schedule | torch step (ms, slowest rank) | engine step (ms) | ratio | CPU ms/step "
        "rank 0 torch / engine | CPU ratio rank 0 / rank 1 |\n|---|---|---|---|---|---|"
    )
    med = statistics.median
    for sched in args.schedules:
        run = run_once(args, "pair", sched, args.steps)
        out: dict[str, Any] = {}
        for side in ("torch", "optpipe"):
            per = [
                [r for r in rk["steps"] if r["side"] == side][args.skip :] for rk in run["ranks"]
            ]
            out[side] = {
                "wall": med(r["slowest"] for r in per[0]),
                "cpu": [med(r["cpu"] for r in p) for p in per],
            }
        t, o = out["torch"], out["optpipe"]
        print(
            f"| {sched} | {1e3 * t['wall']:.1f} | {1e3 * o['wall']:.1f} | "
            f"{o['wall'] / t['wall']:.3f} | {1e3 * t['cpu'][0]:.1f} / {1e3 * o['cpu'][0]:.1f} | "
            + " / ".join(f"{oc / tc:.3f}" for tc, oc in zip(t["cpu"], o["cpu"], strict=True))
            + " |",
            flush=True,
        )


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--schedules", nargs="+", default=list(TORCH_CLASSES), choices=list(TORCH_CLASSES)
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    ap.add_argument("--skip", type=int, default=8, help="steps left out of the medians (start)")
    ap.add_argument(
        "--default-steps", type=int, default=0, help="steps of the default-mode run (0: none)"
    )
    ap.add_argument("--solver-time-limit", type=float, default=30.0)
    add_mlp_args(ap, layers=8)
    ap.add_argument("--allocator", choices=("tuned", "default"), default="tuned")
    ap.add_argument(
        "--optpipe-launch",
        choices=("lightning", "fork", "direct", "torchrun"),
        default="lightning",
    )
    ap.add_argument("--torch-launch", choices=("direct", "torchrun"), default="direct")
    ap.add_argument("--optpipe-order", choices=("own", "torch"), default="own")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument(
        "--compare-code",
        default="",
        help="also run the strategy from this directory (holding optpipe_lightning: an older "
        "checkout), interleaved with the rest, as side 'base'",
    )
    ap.add_argument(
        "--strategy-options",
        default="",
        help="OptPipeStrategy keyword arguments as JSON, e.g. '{\"use_database\": false}' "
        "(what a default costs)",
    )
    ap.add_argument("--quick", action="store_true", help="4 x Linear(256), batch 64, 1 round")
    ap.add_argument("--verbose", action="store_true", help="the strategy's INFO log (child output)")
    ap.add_argument("--json", default=None, help="also write every run's records here")
    ap.add_argument("--report", default=None, help="print the tables of a --json file again")
    ap.add_argument(
        "--paired",
        action="store_true",
        help="torch's own step runs inside each strategy run, after every strategy step (a "
        "callback; barriers around it), so both meet the same load: per-step ratios",
    )
    ap.add_argument(
        "--target",
        type=float,
        default=1.03,
        help="--paired: the ratio each schedule's interval is held against (within / above / "
        "undecided)",
    )
    ap.add_argument(
        "--level", type=float, default=0.9, help="--paired: the interval's confidence level"
    )
    ap.add_argument("--resamples", type=int, default=2000, help="--paired: bootstrap resamples")
    ap.add_argument(
        "--pair",
        action="store_true",
        help="the runtimes alone: torch's schedule and the strategy's engine take turns step by "
        "step in one process pair (no optimizer, no Lightning)",
    )
    ap.add_argument(
        "--child", choices=("torch", "optpipe", "pair"), default=None, help=argparse.SUPPRESS
    )
    ap.add_argument("--schedule", default="1f1b", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument(
        "--cprofile",
        default="",
        help="with --child optpipe: cProfile (CPU time) after --skip into this directory "
        "(rankN.prof; with --paired torch's steps apart, rankN.torch.prof)",
    )
    args = ap.parse_args()
    if args.child == "torch":
        return torch_child(args)
    if args.child == "optpipe":
        return optpipe_child(args)
    if args.child == "pair":
        return pair_child(args)
    if args.quick:
        args.layers, args.width, args.batch, args.rounds = 4, 256, 64, 1
        args.steps, args.skip = min(args.steps, 16), min(args.skip, 5)
    if args.pair:
        return run_pairs(args)
    if args.report:  # the tables again from a --json file (summaries recomputed)
        saved = read_report(args.report)
        analysis = {k: getattr(args, k) for k in ("target", "level", "resamples")}
        args = argparse.Namespace(**{**vars(args), **saved["args"], **analysis})
        for run in saved["runs"]:
            if args.paired:
                run["paired"] = summarize_paired(run, args.skip)
            elif run["schedule"] != "optimal":
                run["summary"] = summarize(run, args.skip)
        return (report_paired if args.paired else report)(args, saved["runs"])
    sides: tuple[str, ...] = (
        ("torch", "optpipe", "base") if args.compare_code else ("torch", "optpipe")
    )
    if args.paired:
        sides = ("optpipe", "base") if args.compare_code else ("optpipe",)
    configs = [(side, s) for s in args.schedules for side in sides]
    if args.default_steps:
        configs.append(("optpipe", "optimal"))
    print(
        f"{args.procs} CPU processes (gloo, 1 thread each), {args.layers} x (Linear({args.width}) "
        f"+ GELU), batch {args.batch} in {args.microbatches} microbatches, AdamW; allocator "
        f"{args.allocator} on both sides; launched by {args.torch_launch} (torch) and "
        f"{args.optpipe_launch} (optpipe), optpipe order "
        f"{args.optpipe_order}; {args.rounds} rounds x {len(configs)} runs; load {_loadavg()}",
        flush=True,
    )
    runs: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        k = rnd % len(configs)
        for side, sched in configs[k:] + configs[:k]:
            steps = args.default_steps if sched == "optimal" else args.steps
            run = run_once(args, side, sched, steps)
            run["round"], run["load"] = rnd, _loadavg()
            if args.paired:
                run["paired"] = p = summarize_paired(run, args.skip)
                print(
                    f"  round {rnd} {side:<7} {sched:<16} paired: strategy "
                    f"{1e3 * p['strategy']:.1f} ms, torch {1e3 * p['torch']:.1f} ms, per-step "
                    f"ratio {p['ratio']:.3f} (IQR {p['q'][0]:.3f}-{p['q'][2]:.3f}), CPU ratio "
                    f"{p['cpu_ratio']:.3f}  load {run['load']}",
                    flush=True,
                )
                if p["phases"]:
                    print(
                        "      rank 0 besides the pipeline and the update (ms): "
                        + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in p["phases"].items()),
                        flush=True,
                    )
            elif sched != "optimal":
                run["summary"] = summarize(run, args.skip)
                s = run["summary"]
                print(
                    f"  round {rnd} {side:<7} {sched:<16} step {1e3 * s['median']:7.1f} ms "
                    f"(IQR {1e3 * s['iqr']:5.1f}) pipeline {1e3 * s['pipeline']:6.1f} optimizer "
                    f"{1e3 * s['optimizer']:5.1f} loss {1e3 * s['loss']:5.1f} around "
                    f"{1e3 * s['around']:5.1f} start-up {s['startup']:5.2f} s RSS "
                    f"{'/'.join(f'{x:.0f}' for x in s['rss_mb'])} MB  load {run['load']}",
                    flush=True,
                )
                print(
                    f"      CPU per step (rank 0, all threads): {1e3 * s['cpu_step']:.1f} ms: "
                    f"pipeline {1e3 * s['cpu_pipeline']:.1f}, optimizer "
                    f"{1e3 * s['cpu_optimizer']:.1f}, loss {1e3 * s['cpu_loss']:.2f}, around "
                    f"{1e3 * s['cpu_around']:.2f}",
                    flush=True,
                )
                print(
                    "      start-up, s after launch: "
                    + " | ".join(
                        f"rank {r}: " + " ".join(f"{k} {v:.2f}" for k, v in tl.items())
                        for r, tl in enumerate(s["timeline"])
                    ),
                    flush=True,
                )
            runs.append(run)
    if args.paired:
        report_paired(args, runs)
    else:
        report(args, runs)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}))


def read_report(path: str) -> dict[str, Any]:
    """A ``--json`` file's records; one line naming the problem (no traceback) when it cannot
    be read or is not one."""
    try:
        saved = json.loads(Path(path).read_text())
    except OSError as e:
        raise SystemExit(
            f"bench_vs_torch: cannot read --report {path}: {e.strerror or e}; give the file "
            "a run wrote with --json"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(
            f"bench_vs_torch: --report {path} is not JSON ({e}); give the file a run wrote "
            "with --json"
        ) from None
    if not (isinstance(saved, dict) and isinstance(saved.get("args"), dict) and "runs" in saved):
        raise SystemExit(
            f"bench_vs_torch: --report {path} holds no runs (no 'args' and 'runs'); give the "
            "file a run wrote with --json"
        )
    return saved


def report_paired(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """Per schedule: the pooled per-step ratio's median and its bootstrap interval (rounds,
    then steps; ``bootstrap_median``), the range of the rounds' own medians, the CPU ratio, and
    whether the interval lies below, above or across ``--target``; then the noise: spread of
    the per-step ratios inside a run and of the runs' medians, and the rounds that would
    resolve +-1% at this many steps per run."""
    med = statistics.median
    level = round(100 * args.level)
    print(
        f"\n| schedule | strategy | torch step (ms) | strategy step (ms) | per-step ratio "
        f"(median of all rounds' steps) | {level}% interval | rounds' medians (range) | CPU "
        f"ratio ({level}% interval) | against {args.target:g} |\n|---|---|---|---|---|---|---|---|---|"
    )
    noise = []
    for sched in args.schedules:
        for side in ("optpipe", "base"):
            ps = [r["paired"] for r in runs if r["side"] == side and r["schedule"] == sched]
            if not ps:
                continue
            per_round = [p["ratio"] for p in ps]
            ratio, lo, hi = bootstrap_median([p["ratios"] for p in ps], args.level, args.resamples)
            cpu, clo, chi = bootstrap_median(
                [p["cpu_ratios"] for p in ps], args.level, args.resamples
            )
            verdict = "within" if hi < args.target else "above" if lo > args.target else "undecided"
            label = "this" if side == "optpipe" else os.path.basename(args.compare_code.rstrip("/"))
            print(
                f"| {sched} | {label} | {1e3 * med(p['torch'] for p in ps):.1f} | "
                f"{1e3 * med(p['strategy'] for p in ps):.1f} | {ratio:.3f} | {lo:.3f}-{hi:.3f} | "
                f"{min(per_round):.3f}-{max(per_round):.3f} | {cpu:.3f} ({clo:.3f}-{chi:.3f}) | "
                f"{verdict} |"
            )
            within = med(statistics.stdev(p["ratios"]) for p in ps if len(p["ratios"]) > 1)
            between = statistics.stdev(per_round) if len(per_round) > 1 else float("nan")
            noise.append((sched, label, within, between, rounds_needed(per_round), ps[0]["n"]))
    print(
        "\nnoise: per-step ratio's spread inside a run (s.d., median over runs); the runs' "
        "medians' s.d.; rounds for a 90% interval of +-1% on the mean of run medians at "
        "these steps per run"
    )
    for sched, label, within, between, need, n in noise:
        print(
            f"  {sched:<16} {label}: within a run {within:.3f} ({n} steps), between runs "
            f"{between:.3f}, rounds for +-1%: {need:.0f}"
        )


def report(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    def runs_of(side: str, sched: str) -> list[dict[str, Any]]:
        return [r for r in runs if r["side"] == side and r["schedule"] == sched]

    print(
        "\n| schedule | strategy | torch step (ms) | strategy step (ms) | ratio (median of rounds; "
        "range) | ratio of the fastest 10% | CPU ratio | pipeline torch / strategy | optimizer torch / strategy | around torch / "
        "strategy (loss) | CPU ms/step torch / strategy: all, outside pipeline+optimizer | "
        "start-up torch / strategy (s) | peak RSS torch / strategy (MB, ranks) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    med = statistics.median

    def m(xs: list[dict[str, Any]], k: str, scale: float = 1e3) -> float:
        return scale * med(x[k] for x in xs if x[k] is not None)

    def rss(xs: list[dict[str, Any]]) -> str:
        return "/".join(f"{med(x['rss_mb'][i] for x in xs):.0f}" for i in range(args.procs))

    for sched in args.schedules:
        t = runs_of("torch", sched)
        for side in ("optpipe", "base"):
            o = runs_of(side, sched)
            if not t or not o:
                continue
            pairs = [(a["summary"], b["summary"]) for a in t for b in o if a["round"] == b["round"]]
            ratios = [b["median"] / a["median"] for a, b in pairs]
            fast = [b["p10"] / a["p10"] for a, b in pairs]
            ts, os_ = [r["summary"] for r in t], [r["summary"] for r in o]
            label = "this" if side == "optpipe" else os.path.basename(args.compare_code.rstrip("/"))
            print(
                f"| {sched} | {label} | {m(ts, 'median'):.1f} (IQR {m(ts, 'iqr'):.1f}) | "
                f"{m(os_, 'median'):.1f} (IQR {m(os_, 'iqr'):.1f}) | {med(ratios):.3f} "
                f"({min(ratios):.3f}-{max(ratios):.3f}) | {med(fast):.3f} | "
                f"{med(b['cpu_step'] / a['cpu_step'] for a, b in pairs):.3f} | "
                f"{m(ts, 'pipeline'):.1f} / "
                f"{m(os_, 'pipeline'):.1f} | {m(ts, 'optimizer'):.1f} / {m(os_, 'optimizer'):.1f} "
                f"| {m(ts, 'around'):.1f} / {m(os_, 'around'):.1f} ({m(os_, 'loss'):.1f}) | "
                f"{m(ts, 'cpu_step'):.1f} / {m(os_, 'cpu_step'):.1f}, {m(ts, 'cpu_around'):.2f} / "
                f"{m(os_, 'cpu_around'):.2f} | "
                f"{m(ts, 'startup', 1):.2f} / {m(os_, 'startup', 1):.2f} | {rss(ts)} / {rss(os_)} |"
            )
    defaults = runs_of("optpipe", "optimal")
    for r in defaults:
        refs = [
            x["summary"]["median"] for x in runs_of("optpipe", "1f1b") if x["round"] == r["round"]
        ]
        if not refs:
            refs = [
                x["summary"]["median"] for x in runs_of("torch", "1f1b") if x["round"] == r["round"]
            ]
        if not refs:
            print("default mode: no 1f1b run in its round to compare with")
            continue
        d = default_mode(r, refs[0], args.skip)
        r["default_mode"] = d
        be = d["break_even_steps"]
        print(
            f"default mode, round {r['round']}: start-up {d['startup']:.2f} s; steady after step "
            f"{d['steps_before_steady']} ({d['steps_overlapping_solver']} steps overlapped the "
            f"solver, median {1e3 * (d['median_while_solving'] or 0):.1f} ms); steady "
            f"{1e3 * d['steady']:.1f} ms vs 1f1b {1e3 * d['reference']:.1f} ms; time lost "
            f"{d['time_lost']:.2f} s; gain {1e3 * d['gain_per_step']:.1f} ms/step; break-even "
            f"{'never' if be is None else f'{be:.0f} steps'}; switches "
            + "; ".join(f"{s['step']}: {s['from']} -> {s['to']}" for s in d["switches"])
        )


if __name__ == "__main__":
    main()
