"""Measured pipeline iteration time against the simulator's prediction from profiled costs.

Two (or more) CPU processes over gloo, one thread each, an MLP whose ops take tens of
milliseconds. Steps:

1. profile: the engine runs the profiling schedule with measurement on (F, B, W per stage and
   chunk, activation bytes), p2p time and copy bandwidth are measured -> ``Profile`` ->
   ``Problem``;
2. for each schedule (baselines and the solver's): switch the engine to it, run warm-up steps,
   then time ``--steps`` steps (barrier before each, wall time of ``engine.step``);
3. report measured median / predicted makespan per schedule.

Usage::

    python benchmarks/bench_strategy.py                 # 2 processes, table + JSON line
    python benchmarks/bench_strategy.py --procs 4 --layers 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def _layers(n: int, width: int) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(n)]


def _problem_from_ops(problem: Any, ops: list[dict[str, float]]) -> Any:
    """The problem with t_f/t_b/t_w replaced by op times measured in a run (a fused BW is split
    in the profile's B:W proportion)."""
    t_f, t_b, t_w = (problem.cost(k)[:, 0].tolist() for k in ("t_f", "t_b", "t_w"))
    for s, d in enumerate(ops):
        if "F" in d:
            t_f[s] = d["F"]
        if "B" in d and "W" in d:
            t_b[s], t_w[s] = max(d["B"], 1e-7), d["W"]
        elif "BW" in d:
            share = t_b[s] / (t_b[s] + t_w[s])
            t_b[s], t_w[s] = max(d["BW"] * share, 1e-7), d["BW"] * (1 - share)
    return problem.with_changes(t_f=t_f, t_b=t_b, t_w=t_w)


def _worker(rank: int, world: int, init: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    from optpipe_lightning.schedule import simulate
    from optpipe_lightning.strategy.engine import PipelineEngine
    from optpipe_lightning.strategy.partition import balanced_partition
    from optpipe_lightning.strategy.planner import (
        choose_schedule,
        initial_problem,
        profiling_schedule,
    )
    from optpipe_lightning.strategy.profiler import (
        build_profile,
        gather,
        hardware_fingerprint,
        local_measurements,
        measure_copy_bandwidth,
        measure_p2p,
        model_fingerprint,
        runtime_overhead,
        with_overhead,
    )

    m = args.microbatches
    layers = _layers(args.layers, args.width)
    sizes = balanced_partition([1.0] * args.layers, world)
    base = initial_problem(world, m, 1, "interleaved", [1.0] * world)
    group = dist.group.WORLD

    def loss_fn(o: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(o, y)

    engine = PipelineEngine(
        layers,
        loss_fn,
        base,
        profiling_schedule(base),
        sizes,
        rank,
        group,
        torch.device("cpu"),
        measure=True,
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randn(args.batch, args.width, generator=g)
    walls = []
    for _ in range(args.profile_steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        engine.step(x, y)
        walls.append(time.perf_counter() - t0)
        engine.cursor.count_bytes = False  # bytes in the warm-up step only
        for p in engine.parameters:
            p.grad = None
    rows = local_measurements(engine.cursor, rank, 1, skip=m)
    gathered = gather(rows, group)
    out_bytes = max(gather(max(engine.cursor.out_bytes), group))
    p2p = measure_p2p(int(out_bytes), rank, world, group, torch.device("cpu"))
    d2h, h2d = measure_copy_bandwidth(torch.device("cpu"))
    hw = hardware_fingerprint(torch.device("cpu"), world, "gloo")
    mf = model_fingerprint("bench-mlp", layers, args.batch // m, world, 1, sizes)
    profile = build_profile(gathered, hw, mf, m, "interleaved", p2p, d2h, h2d)
    walls = [max(ws) for ws in zip(*gather(walls[1:], group), strict=True)]
    delta = runtime_overhead(profile, engine.schedule.actions, walls) if args.calibrate else 0.0
    profile = with_overhead(profile, delta)
    problem = profile.to_problem().with_changes(offload=None)
    engine.cursor.set_measure(False)
    engine.cursor.measure = True  # keep timing ops (not bytes) to compare with the profile

    from optpipe_lightning.schedule import Schedule

    scheds: dict[str, Schedule] = {}
    results: list[dict[str, Any]] = []
    for name in args.schedules:
        if rank == 0:
            try:
                payload: Any = choose_schedule(name, problem, time_limit=args.time_limit).to_json()
            except ValueError as e:
                payload = f"error: {e}"
        else:
            payload = None
        box = [payload]
        dist.broadcast_object_list(box, 0)
        if str(box[0]).startswith("error"):
            results.append({"schedule": name, "error": box[0]})
        else:
            scheds[name] = Schedule.from_json(box[0])
    # rounds: every schedule runs a few steps per round, so drift in machine load hits all alike
    step_times: dict[str, list[float]] = {n: [] for n in scheds}
    op_times: dict[str, dict[tuple[str, int], list[float]]] = {n: {} for n in scheds}
    for _round in range(args.rounds):
        for name, sched in scheds.items():
            engine.switch(sched, problem)
            engine.cursor.times.clear()
            for i in range(args.warmup + args.steps):
                dist.barrier()
                t0 = time.perf_counter()
                engine.step(x, y)
                t = time.perf_counter() - t0
                for p in engine.parameters:
                    p.grad = None
                if i >= args.warmup:
                    step_times[name].append(t)
                elif i == args.warmup - 1:
                    engine.cursor.times.clear()
            for k, v in engine.cursor.times.items():
                op_times[name].setdefault(k, []).extend(v)
    for name, sched in scheds.items():
        worst = gather(step_times[name], group)
        per_step = [max(ts) for ts in zip(*worst, strict=True)]
        pred = float(simulate(problem, sched.actions).makespan or 0.0)
        meas = statistics.median(per_step)
        # the same simulator fed with the op times measured during these very steps: separates
        # the simulator's model error from drift of the machine between profiling and timing
        mine = {op: statistics.median(ts) for (op, _c), ts in op_times[name].items() if ts}
        ops_all = gather(mine, group)
        in_run = _problem_from_ops(problem, ops_all)
        pred_run = float(simulate(in_run, sched.actions).makespan or 0.0)
        results.append(
            {
                "schedule": name,
                "generator": sched.generator,
                "predicted_s": pred,
                "measured_median_s": meas,
                "measured_min_s": min(per_step),
                "ratio": meas / pred if pred else None,
                "predicted_from_run_ops_s": pred_run,
                "ratio_run_ops": meas / pred_run if pred_run else None,
                "op_ms_in_run": [{k: round(1e3 * v, 2) for k, v in d.items()} for d in ops_all],
            }
        )
    if rank == 0:
        info = {
            "procs": world,
            "layers": args.layers,
            "width": args.width,
            "batch": args.batch,
            "microbatches": m,
            "p2p_s": p2p,
            "overhead_per_action_s": delta,
            "t_f": problem.cost("t_f")[:, 0].tolist(),
            "t_b": problem.cost("t_b")[:, 0].tolist(),
            "t_w": problem.cost("t_w")[:, 0].tolist(),
            "results": results,
        }
        with open(out, "w") as f:
            json.dump(info, f)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4, help="timed steps per schedule per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "zb-h1", "optimal"])
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument(
        "--no-calibrate",
        dest="calibrate",
        action="store_false",
        help="leave the per-action runtime overhead out of the profiled costs",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result.json")
        mp.start_processes(
            _worker,
            args=(args.procs, f"file://{d}/store", args, out),
            nprocs=args.procs,
            join=True,
            start_method="fork",
        )
        with open(out) as f:
            info = json.load(f)
    print(
        f"{args.procs} CPU processes (gloo, 1 thread each), {args.layers} x Linear({args.width})"
        f", batch {args.batch} in {args.microbatches} microbatches; p2p {1e3 * info['p2p_s']:.2f} ms"
        f", runtime overhead {1e3 * info['overhead_per_action_s']:.2f} ms/action"
    )
    print(
        "per-stage F/B/W ms: "
        + ", ".join(
            f"{1e3 * f:.1f}/{1e3 * b:.1f}/{1e3 * w:.1f}"
            for f, b, w in zip(info["t_f"], info["t_b"], info["t_w"], strict=True)
        )
    )
    print(
        f"{'schedule':<12} {'generator':<14} {'predicted ms':>12} {'measured ms':>12} "
        f"{'ratio':>7} {'pred(run ops)':>13} {'ratio':>7}"
    )
    for r in info["results"]:
        if "error" in r:
            print(f"{r['schedule']:<12} {r['error']}")
            continue
        print(
            f"{r['schedule']:<12} {r['generator']:<14} {1e3 * r['predicted_s']:>12.1f} "
            f"{1e3 * r['measured_median_s']:>12.1f} {r['ratio']:>7.3f} "
            f"{1e3 * r['predicted_from_run_ops_s']:>13.1f} {r['ratio_run_ops']:>7.3f}"
            "   ops in run (ms): "
            + "; ".join(
                f"s{s} " + " ".join(f"{k}={v}" for k, v in d.items())
                for s, d in enumerate(r["op_ms_in_run"])
            )
        )
    print(json.dumps(info))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
