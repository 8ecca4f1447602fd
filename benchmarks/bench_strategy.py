"""Measured pipeline iteration time against the simulator's prediction: from the profile, and
after calibration on the running schedule.

Two (or more) CPU processes over gloo, one thread each, an MLP whose ops take tens of
milliseconds. Steps:

1. profile: the engine runs the profiling schedule with measurement on (F, B, W and fused BW per
   stage and chunk; the warm-up step's op times are dropped), p2p time and copy bandwidth are
   measured, the runtime overhead per action is fitted to the timed profiling steps ->
   ``Profile`` -> ``Problem`` (what the strategy does);
2. rounds: in every round every schedule (baselines and the solver's) runs one warm-up step,
   ``--calibrate-steps`` steps that only feed its calibration, then ``--steps`` measured steps
   (barrier before each step; a step's time is the slowest rank's), so drift in machine load
   hits all schedules alike. The first ``--calibrate-rounds`` rounds only calibrate;
3. calibration is the strategy's: each schedule has its ``StepSampler`` (every
   ``--calibrate-every``-th step times its ops, rolling windows of walls and op samples) and,
   right before a round's measured steps, ``strategy.calibration.calibrate`` re-estimates the
   costs from that schedule's earlier steps only (the measured steps join the windows after
   they were measured), as the strategy does while it runs a schedule;
4. per schedule: the prediction from the profile; the calibrated prediction (median over the
   rounds); the prediction from the problem calibrated on the first schedule's latest steps
   (what the re-solve judges other schedules by while that one runs); the measured median.

Usage::

    python benchmarks/bench_strategy.py --rounds 4 --profile-steps 5 --width 1536
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
from _shared import add_mlp_args
from torch import nn

OPS = ("F", "B", "W", "BW")


def _layers(n: int, width: int) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(n)]


def _loadavg() -> list[float]:
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return []


def _worker(rank: int, world: int, init: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    from optpipe_lightning.strategy.runtime.host_allocator import tune_host_allocator

    # what OptPipeStrategy.setup_environment does on CPU
    allocator = tune_host_allocator() if args.tune_allocator else "allocator left as it is"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    from optpipe_lightning.schedule import Schedule, simulate
    from optpipe_lightning.strategy.planning.partition import balanced_partition
    from optpipe_lightning.strategy.planning.planner import (
        choose_schedule,
        initial_problem,
        profiling_schedule,
    )
    from optpipe_lightning.strategy.runtime.engine import PipelineEngine
    from optpipe_lightning.strategy.scheduling.calibration import (
        StepSampler,
        calibrate,
        robust_mean,
    )
    from optpipe_lightning.strategy.scheduling.profiler import (
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
    cur = engine.cursor
    walls = []
    prof_steps: list[dict[str, float]] = []  # per profiling step: median of each op (diagnosis)
    for i in range(args.profile_steps + 1):
        before = {k: len(v) for k, v in cur.times.items()}
        dist.barrier()
        t0 = time.perf_counter()
        engine.step(x, y)
        walls.append(time.perf_counter() - t0)
        prof_steps.append(
            {
                op: 1e3 * statistics.median(v[before.get((op, 0), 0) :])
                for (op, _c), v in cur.times.items()
                if v[before.get((op, 0), 0) :]
            }
        )
        if i == 0:
            warm_times = {k: list(v) for k, v in cur.times.items()}
            cur.drop_times()  # the warm-up step (its byte counts stay)
        cur.count_bytes = False  # bytes in the warm-up step only
        for p in engine.parameters:
            p.grad = None
    rows = local_measurements(cur, rank, 1)
    gathered = gather(rows, group)
    out_bytes = max(gather(max(cur.out_bytes), group))
    p2p = measure_p2p(int(out_bytes), rank, world, group, torch.device("cpu"))
    d2h, h2d = measure_copy_bandwidth(torch.device("cpu"))
    hw = hardware_fingerprint(torch.device("cpu"), world, "gloo")
    mf = model_fingerprint(
        "bench-mlp", layers, args.batch // m, world, 1, sizes, placement="interleaved"
    )
    raw = build_profile(gathered, hw, mf, m, "interleaved", p2p, d2h, h2d)
    walls = [max(ws) for ws in zip(*gather(walls[1:], group), strict=True)]
    delta = runtime_overhead(raw, engine.schedule.actions, walls) if args.overhead else 0.0
    profile = with_overhead(raw, delta)
    problem = profile.to_problem().with_changes(offload=None)
    old_problem = _old_profile_problem(
        cur.times, warm_times, m, rank, world, group, raw, walls, engine.schedule.actions
    )
    prof_steps_all = gather(prof_steps, group)
    cur.set_measure(False)
    cur.measure = True  # op times (not bytes) in every step, for the diagnosis

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
    names = list(scheds)
    # one sampler per schedule, as the strategy keeps one for the schedule it runs
    samplers = {
        n: StepSampler(sample_every=args.calibrate_every, min_steps=1, warmup=0) for n in names
    }
    ref = names[0] if names else ""
    meas_walls: dict[str, list[float]] = {n: [] for n in names}
    pred_cal: dict[str, list[float]] = {n: [] for n in names}  # per measured step
    pred_cross: dict[str, list[float]] = {n: [] for n in names}
    meas_ops: dict[str, dict[tuple[str, int], list[float]]] = {n: {} for n in names}
    last_cal: dict[str, Any] = {}
    load_rounds: list[list[float]] = []

    def run_step(name: str, time_ops: bool) -> float:
        cur.drop_times()
        cur.measure = time_ops
        dist.barrier()
        t0 = time.perf_counter()
        engine.step(x, y)
        t = time.perf_counter() - t0
        for p in engine.parameters:
            p.grad = None
        return t

    def calibrate_now(name: str) -> Any:
        """Rank 0: the strategy's calibration from this schedule's sampler (slowest rank's
        wall per step, every rank's op samples)."""
        sp = samplers[name]
        walls = [max(col) for col in zip(*gather(list(sp.walls), group), strict=True)]
        samples: dict[tuple[int, int, str], list[float]] = {}
        for part in gather(sp.op_samples(rank), group):
            samples.update(part)
        if rank != 0 or not walls:
            return None
        return calibrate(problem, scheds[name].actions, samples, walls, delta, sp.timed)

    for rnd in range(args.rounds):
        for name in names:
            engine.switch(scheds[name], problem)
            sp = samplers[name]
            for _ in range(args.warmup):
                run_step(name, False)
            for _ in range(args.calibrate_steps):  # steps that only feed the calibration
                timed = sp.time_ops_next()
                t = run_step(name, timed)
                sp.record(t, timed, cur.times)
            if rnd < args.calibrate_rounds:
                continue
            cal = calibrate_now(name)
            if rank == 0:
                last_cal[name] = cal
            # the measured steps: predicted from strictly earlier steps only
            ts, step_ops = [], []
            for _ in range(args.steps):
                ts.append(run_step(name, True))
                step_ops.append({k: list(v) for k, v in cur.times.items()})
                for k, v in cur.times.items():
                    meas_ops[name].setdefault(k, []).extend(v)
            meas_walls[name].extend(ts)
            if rank == 0:
                acts = scheds[name].actions
                pred_cal[name].extend([cal.predicted] * len(ts))
                rc = last_cal[ref]  # the first schedule's latest calibration (this round)
                pred_cross[name].extend(
                    [float(simulate(rc.problem, acts).makespan or 0.0)] * len(ts)
                )
            # afterwards they feed the calibration like any step of the running schedule (the
            # strategy times every n-th step's ops; here all were timed: pass the due ones)
            for t, ops in zip(ts, step_ops, strict=True):
                timed = sp.time_ops_next()
                sp.record(t, timed, ops if timed else {})
        load_rounds.append(_loadavg())

    for name in names:
        per_step = [max(col) for col in zip(*gather(meas_walls[name], group), strict=True)]
        mine = {op: robust_mean(ts) for (op, _c), ts in meas_ops[name].items() if ts}
        ops_all = gather(mine, group)
        if rank != 0:
            continue
        acts = scheds[name].actions
        pred = float(simulate(problem, acts).makespan or 0.0)
        pred_old = float(simulate(old_problem, acts).makespan or 0.0)
        meas = statistics.median(per_step) if per_step else float("nan")
        p_own = statistics.median(pred_cal[name])
        p_cross = statistics.median(pred_cross[name])
        own = last_cal[name]
        prof_ms = [
            {
                op: round(1e3 * (float(problem.cost(f)[s, 0]) - delta), 2)
                for op, f in zip(OPS, ("t_f", "t_b", "t_w", "t_bw"), strict=True)
            }
            for s in range(world)
        ]
        # per measured round: measured median over calibrated prediction (drift within a run)
        k = args.steps
        per_round = [
            statistics.median(per_step[i : i + k]) / pred_cal[name][i]
            for i in range(0, len(per_step), k)
        ]
        results.append(
            {
                "schedule": name,
                "generator": scheds[name].generator,
                "predicted_profile_s": pred,
                "predicted_profile_old_stats_s": pred_old,
                "ratio_profile_old_stats": meas / pred_old if pred_old else None,
                "predicted_calibrated_s": p_own,
                "predicted_cross_s": p_cross,
                "cross_calibrated_on": ref,
                "measured_median_s": meas,
                "measured_min_s": min(per_step) if per_step else None,
                "measured_steps": len(per_step),
                "ratio_profile": meas / pred if pred else None,
                "ratio_calibrated": meas / p_own if p_own else None,
                "ratio_cross": meas / p_cross if p_cross else None,
                "ratio_calibrated_per_round": per_round,
                "calibrated_overhead_s": own.overhead,
                "calibration_timed_steps": own.timed_steps,
                "calibration_steps": own.steps,
                "calibration_median_s": own.measured,
                # diagnosis: per stage, op compute ms inside the measured steps vs profile
                "op_ms_in_run": [{k: round(1e3 * v, 2) for k, v in d.items()} for d in ops_all],
                "op_ms_profile": prof_ms,
                "op_ms_calibrated": [
                    {
                        op: round(1e3 * float(own.compute.cost(f)[s, 0]), 2)
                        for op, f in zip(OPS, ("t_f", "t_b", "t_w", "t_bw"), strict=True)
                    }
                    for s in range(world)
                ],
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
            "profile_step_walls_s": walls,
            "profile_steps_op_ms": prof_steps_all,
            "t_f": problem.cost("t_f")[:, 0].tolist(),
            "t_b": problem.cost("t_b")[:, 0].tolist(),
            "t_w": problem.cost("t_w")[:, 0].tolist(),
            "t_bw": problem.cost("t_bw")[:, 0].tolist(),
            "loadavg_rounds": load_rounds,
            "allocator": allocator,
            "results": results,
        }
        with open(out, "w") as f:
            json.dump(info, f)
    dist.destroy_process_group()


def _old_profile_problem(
    times: Any,
    warm: Any,
    m: int,
    rank: int,
    world: int,
    group: Any,
    raw: Any,
    walls: list[float],
    actions: Any,
) -> Any:
    """Diagnosis: the problem the profiler gave before this change, from the same samples:
    plain means, the first ``m`` samples of every list dropped (the warm-up step's forwards,
    but two steps' worth of B, W and BW), overhead = residual / busiest rank's actions."""
    from optpipe_lightning.schedule import simulate
    from optpipe_lightning.strategy.scheduling.profiler import gather

    mine = {
        op: (warm.get((op, 0), []) + times.get((op, 0), []))[m:] for op in ("F", "B", "W", "BW")
    }
    allr = gather(mine, group)
    stages = []
    for s, d in enumerate(allr):
        upd = {}
        for op, key in (("F", "f"), ("B", "b"), ("W", "w"), ("BW", "bw")):
            xs = d[op] or [1e-7]
            upd[key] = raw.stages[s].f.model_copy(update={"mean": max(statistics.fmean(xs), 1e-7)})
        stages.append(raw.stages[s].model_copy(update=upd))
    prof = raw.model_copy(update={"stages": stages})
    pb = prof.to_problem().with_changes(offload=None)
    sim = float(simulate(pb, actions).makespan or 0.0)
    busiest = max(sum(1 for a in row if a.op in ("F", "B", "W", "BW")) for row in actions)
    delta = max(0.0, statistics.median(walls) - sim) / busiest if walls else 0.0
    from optpipe_lightning.strategy.scheduling.calibration import with_action_overhead

    # (the old code added the overhead to the profile's F, B, W and BW means alike)
    return with_action_overhead(pb, delta)


def _fmt_ops(d: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.1f}" for k, v in d.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_mlp_args(ap, layers=4)
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per schedule per round")
    ap.add_argument(
        "--calibrate-steps",
        type=int,
        default=4,
        help="steps per schedule per round that only feed the calibration (before the timed ones)",
    )
    ap.add_argument("--steps", type=int, default=4, help="measured steps per schedule per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--calibrate-rounds",
        type=int,
        default=1,
        help="first rounds that only calibrate (no measured steps)",
    )
    ap.add_argument(
        "--calibrate-every",
        type=int,
        default=4,
        help="in calibration rounds every n-th step times its ops (the strategy's default)",
    )
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--schedules", nargs="+", default=["1f1b", "gpipe", "zb-h1", "optimal"])
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument(
        "--no-overhead",
        dest="overhead",
        action="store_false",
        help="leave the per-action runtime overhead out of the profiled costs",
    )
    ap.add_argument(
        "--no-tune-allocator",
        dest="tune_allocator",
        action="store_false",
        help="leave glibc's allocator at its defaults (the strategy tunes it on CPU)",
    )
    args = ap.parse_args()
    if not 0 <= args.calibrate_rounds < args.rounds or args.calibrate_steps < 1:
        ap.error("need --calibrate-steps >= 1 and --calibrate-rounds below --rounds")
    load0 = _loadavg()
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
    info["loadavg_start"] = load0
    info["loadavg_end"] = _loadavg()
    info["args"] = vars(args)
    print(
        f"{args.procs} CPU processes (gloo, 1 thread each), {args.layers} x Linear({args.width})"
        f", batch {args.batch} in {args.microbatches} microbatches; p2p {1e3 * info['p2p_s']:.2f} ms"
        f", runtime overhead {1e3 * info['overhead_per_action_s']:.2f} ms/action; load average "
        f"{' '.join(map(str, load0))} at start, {' '.join(map(str, info['loadavg_end']))} at end"
        f"; {info['allocator']}"
    )
    print(
        "profiled F/B/W/BW ms per stage (with overhead): "
        + ", ".join(
            f"{1e3 * f:.1f}/{1e3 * b:.1f}/{1e3 * w:.1f}/{1e3 * bw:.1f}"
            for f, b, w, bw in zip(info["t_f"], info["t_b"], info["t_w"], info["t_bw"], strict=True)
        )
    )
    print(
        "profiling steps (ms, slowest rank): "
        + " ".join(f"{1e3 * w:.0f}" for w in info["profile_step_walls_s"])
        + "; per-step op medians, rank by rank: "
        + " | ".join(
            "; ".join(_fmt_ops(st) for st in steps) for steps in info["profile_steps_op_ms"]
        )
    )
    ref = next((r["cross_calibrated_on"] for r in info["results"] if "error" not in r), "")
    print(
        f"{'schedule':<10} {'pred(profile)':>13} {'pred(calib.)':>12} {'pred(cal. ' + ref + ')':>16}"
        f" {'measured':>9} {'ratio':>6} {'ratio':>6} {'ratio':>6}   (ms; ratio = measured/pred)"
        "   [old profile stats: pred, ratio]"
    )
    for r in info["results"]:
        if "error" in r:
            print(f"{r['schedule']:<10} {r['error']}")
            continue
        print(
            f"{r['schedule']:<10} {1e3 * r['predicted_profile_s']:>13.1f} "
            f"{1e3 * r['predicted_calibrated_s']:>12.1f} {1e3 * r['predicted_cross_s']:>16.1f} "
            f"{1e3 * r['measured_median_s']:>9.1f} {r['ratio_profile']:>6.3f} "
            f"{r['ratio_calibrated']:>6.3f} {r['ratio_cross']:>6.3f}   per round (calibrated): "
            + " ".join(f"{x:.3f}" for x in r["ratio_calibrated_per_round"])
            + f"   [{1e3 * r['predicted_profile_old_stats_s']:.1f}, "
            f"{r['ratio_profile_old_stats']:.3f}]"
        )
    print("op compute ms per stage: in the measurement rounds | profile | calibrated")
    for r in info["results"]:
        if "error" in r:
            continue
        for s, (run, prof) in enumerate(zip(r["op_ms_in_run"], r["op_ms_profile"], strict=True)):
            cal = r["op_ms_calibrated"][s] if r["op_ms_calibrated"] else {}
            print(
                f"  {r['schedule']:<10} s{s}: {_fmt_ops(run):<34} | "
                f"{_fmt_ops({k: prof[k] for k in run}):<34} | {_fmt_ops({k: cal[k] for k in run})}"
            )
        print(
            f"  {r['schedule']:<10} overhead ms/action: profile "
            f"{1e3 * info['overhead_per_action_s']:.2f}, calibrated "
            f"{1e3 * (r['calibrated_overhead_s'] or 0):.2f}; calibration steps median "
            f"{1e3 * (r['calibration_median_s'] or 0):.1f} ms ({r['calibration_steps']} steps, "
            f"{r['calibration_timed_steps']} op-timed)"
        )
    print(json.dumps(info))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
