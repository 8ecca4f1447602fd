"""Section 4 of ``benchmarks/gpu_check``: one stage's schedule on the device.

A pipeline problem from the measured op costs (``stage.op_costs``) and copy
bandwidths, solved under a memory limit that forces offload; the stage with the most offloads
runs its action list alone with the executor's ``OptPipeStage`` and the real ``OffloadManager``
(its input batch and the incoming gradients made up, as if the neighbours had sent them: the
loss ``(out * g).sum()`` hands ``g`` to the backward; layer group 0, ``Scale``, hands the input
on). Measured peak of ``torch.cuda.max_memory_allocated`` above the static memory (weights,
gradients, optimizer state, inputs) against the prediction the strategy's memory model makes:
the simulator's peak on the per-op memory the profiler's allocator watch measured, plus the
reserve the strategy keeps out of the solver's limit (the largest transient of the stage's
ops); the measured step time against the simulated one; one more step watched per action
(where the allocator and the model part); then the same list with the limit just under its
need must be refused by the executor before anything runs.

Every number is written into the section's ``results`` dict as soon as it is known.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from . import stage as gpu_check_stage
from .stage import (
    LayerShape,
    _sync,
    device_kind,
    estimate,
    harness_problem,
    harness_row,
    incoming_grad_loss,
    make_layers,
    process_group,
)

if TYPE_CHECKING:
    from optpipe_lightning.schedule import Action, Problem, Schedule
    from optpipe_lightning.strategy.runtime.engine import PipelineEngine
    from optpipe_lightning.strategy.runtime.op_memory import OpMemoryWatch


@dataclass(frozen=True)
class StageMemory:
    """The stage's memory model in the harness: (m_f, m_b, m_w) per chunk (0: group 0, 1: the
    stage under test) and the reserve kept out of the solver's limit."""

    chunk_changes: dict[int, tuple[float, float, float]]
    reserve: float
    model: str


def stage_memory(costs: dict[str, Any], act: float) -> StageMemory:
    """The memory the strategy's profile gives the stage: what the allocator measured per op
    (``OpMemory.changes``: F's bytes, B's, and W frees the rest) and, as the reserve, the largest
    transient of the stage's ops (``Profile.memory_reserve``, what ``memory_limit="auto"`` keeps
    out of the solver's limit). Without a measurement (CPU) the profile's rule: F leaves the saved
    bytes ``act``, B frees nothing, W frees them; no reserve."""
    from optpipe_lightning.schedule.profile import OpMemory

    raw = costs.get("memory") or {}
    if 1 not in raw:
        return StageMemory(
            {1: (act, 0.0, -act)}, 0.0, "rule (no allocator): B frees nothing, W frees all"
        )
    ops = {int(c): OpMemory.model_validate(v) for c, v in raw.items()}
    return StageMemory(
        {c: o.changes() for c, o in ops.items()},
        max(o.transient for o in ops.values()),
        "measured per op (the profile's OpMemory) plus the largest op transient as reserve",
    )


def _schedule_with_offloads(problem: Problem, seconds: float) -> tuple[Schedule, str, Problem]:
    """The solver's schedule when it offloads; else the fastest feasible baseline that does
    (this section is about running offloads; the note says when the solver chose none)."""
    from optpipe_lightning.schedule import simulate
    from optpipe_lightning.schedule.baselines import NotApplicable, generate

    notes: list[str] = []
    cands: list[tuple[float, Schedule, str]] = []
    try:
        from optpipe_lightning.solver import InfeasibleMemoryLimit, solve
    except ImportError as e:  # pragma: no cover - a machine without the solver's dependencies
        notes.append(f"solver unavailable ({e})")
    else:
        try:
            r = solve(problem, time_limit=seconds, workers=2, seed=0)
        except InfeasibleMemoryLimit as e:
            problem = problem.with_changes(memory_limit=e.smallest_feasible_limit * 1.02)
            notes.append(f"limit raised to the smallest feasible ({e.smallest_feasible_limit:.4g})")
            r = solve(problem, time_limit=seconds, workers=2, seed=0)
        how = f"solver ({r.backend}, {r.status}, {r.solve_seconds:.1f} s)"
        if r.schedule.num_offloaded() > 0:
            return r.schedule, "; ".join([how, *notes]), problem
        notes.append(f"{how} offloads nothing (makespan {r.makespan:.4g} s)")

    def baselines(pb: Problem) -> None:
        for name in ("adaoffload", "pipeoffload"):
            try:
                s = generate(name, pb)
            except NotApplicable:
                continue
            except Exception as e:  # a baseline that fails here is noted, the others still count
                notes.append(f"{name}: {type(e).__name__}: {e}")
                continue
            ev = simulate(pb, s).evaluation
            if ev.feasible and ev.makespan is not None and s.num_offloaded() > 0:
                cands.append((ev.makespan, s, f"baseline {name}"))

    baselines(problem)
    if not cands:
        # offloads may not pay at this limit (an offload's bytes leave only at its settle
        # point): go down to the smallest limit known to work, where they must
        from optpipe_lightning.solver.feasibility import smallest_feasible_limit

        low = max(smallest_feasible_limit(problem)[1]) * 1.02
        limits = [x for x in problem.memory_limits() if x is not None]
        if limits and low < min(limits):
            problem = problem.with_changes(memory_limit=low)
            notes.append(f"limit lowered to 1.02x the smallest feasible ({low:.4g})")
            baselines(problem)
    if not cands:
        raise RuntimeError("no schedule with offloads fits the limit: " + "; ".join(notes))
    _, best, how = min(cands, key=lambda c: c[0])
    return best, "; ".join([how, *notes]), problem


def stage_schedule(
    res: dict[str, Any],
    flush: Callable[[], None],
    shape: LayerShape,
    layers_per_stage: int,
    stages: int,
    microbatches: int,
    limit_fraction: float,
    steps: int,
    solver_seconds: float,
    costs: dict[str, Any] | None,
    bandwidth: tuple[float, float] | None,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Section 4 (the module docstring says what it does)."""
    from optpipe_lightning.schedule import Problem, simulate
    from optpipe_lightning.schedule.baselines import make_schedule
    from optpipe_lightning.schedule.model_estimate import DEVICES
    from optpipe_lightning.strategy.runtime.engine import PipelineEngine, ScheduleRejectedError
    from optpipe_lightning.strategy.runtime.op_memory import CudaAllocator, OpMemoryWatch

    cuda = device.type == "cuda"
    kind, _ = device_kind(device)
    p, m, n = stages, microbatches, layers_per_stage
    if costs is None:  # the op-cost section did not run: the estimate stands in
        est = estimate(shape, n, dtype, kind, m)
        costs = {
            "t_f": est["t_f"],
            "t_b": est["t_b"],
            "t_w": est["t_w"],
            "t_bw": est["t_bw"],
            "t_comm": est["t_comm"],
            "activation_bytes": est["m_f"],
            "offloadable_bytes": est["m_f"],
        }
        res["costs_from"] = "estimate (op-cost section missing)"
    else:
        res["costs_from"] = "measured (op-cost section)"
    if bandwidth is None:
        bw = DEVICES[kind].copy_bandwidth
        bandwidth = (bw, bw)
        res["bandwidth_from"] = "estimate (copy section missing)"
    else:
        res["bandwidth_from"] = "measured (copy section)"
    act = costs.get("allocated_bytes", costs["activation_bytes"])
    mem = stage_memory(costs, act)
    m_f, m_b, m_w = mem.chunk_changes[1]
    off = min(costs["offloadable_bytes"], m_f)
    problem = Problem(
        num_stages=p,
        num_microbatches=m,
        t_f=costs["t_f"],
        t_b=costs["t_b"],
        t_w=costs["t_w"],
        t_bw=costs["t_bw"],
        t_comm=costs["t_comm"],
        m_f=m_f,
        m_b=m_b,
        m_w=m_w,
        memory_limit=limit_fraction * p * m_f,
        offload={"bytes": off, "d2h_bandwidth": bandwidth[0], "h2d_bandwidth": bandwidth[1]},
        name=f"gpu_check {shape.describe()} x{n}",
    )
    res["problem"] = {
        "layer": shape.describe(),
        "layers_per_stage": n,
        "stages": p,
        "microbatches": m,
        "activation_bytes": act,
        "memory_model": mem.model,
        "m_f": m_f,
        "m_b": m_b,
        "m_w": m_w,
        "offload_bytes": off,
        "d2h_bandwidth": bandwidth[0],
        "h2d_bandwidth": bandwidth[1],
    }
    sched, how, problem = _schedule_with_offloads(problem, solver_seconds)
    full = simulate(problem, sched)
    assert full.evaluation.makespan is not None
    offloads = [sum(a.op == "OFFLOAD" for a in row) for row in sched.actions]
    s = max(range(p), key=lambda i: (offloads[i], -i))
    limits = problem.memory_limits()
    res["schedule"] = {
        "from": how,
        "makespan": full.evaluation.makespan,
        "offloads_per_stage": offloads,
        "memory_limit": limits[0],
        "stage": s,
    }
    flush()
    # the stage's list run alone (neighbours answer at once), as the harness runs it: group 0
    # (``Scale``) hands the made-up input on, group 1 is the stage
    row = harness_row(list(sched.actions[s]))
    c1 = {k: costs[k] for k in ("t_f", "t_b", "t_w", "t_bw")} | {"m_f": m_f, "m_b": m_b}
    in_bytes = float(shape.batch * shape.seq * shape.hidden * torch.finfo(dtype).bits // 8)
    group0 = mem.chunk_changes[0][0] if 0 in mem.chunk_changes else in_bytes
    # the limit covers the stage and group 0's outputs (the inputs a real stage receives), one
    # per microbatch in flight
    in_flight, most = 0, 0
    for a in sched.actions[s]:
        in_flight += {"F": 1, "B": -1, "BW": -1}.get(a.op, 0)
        most = max(most, in_flight)
    assert limits[s] is not None
    limit = float(limits[s] or 0.0) + most * max(group0, in_bytes)

    def harness(lim: float | None, transfers: bool = True) -> Problem:
        kw: dict[str, Any] = {"memory_limit": lim}
        if transfers:
            kw.update(offload_bytes=off, bandwidth=bandwidth)
        return harness_problem(m, c1, group0, **kw)

    alone = harness(limit)
    sim = simulate(alone, [row])
    if not sim.feasible:
        # alone (neighbours answer at once) the list runs in another timing than in the
        # pipeline; where that timing needs more than the limit, the harness runs it at the
        # limit the alone timing needs (the measurement compares the same list, same timing)
        free = simulate(harness(None), [row])
        if free.feasible and free.evaluation.peak_memory is not None:
            res["limit_raised_for_the_alone_timing"] = {
                "pipeline_limit_bytes": limit,
                "alone_peak_bytes": float(free.evaluation.peak_memory[0]),
            }
            limit = max(limit, float(free.evaluation.peak_memory[0]))
            alone = harness(limit)
            sim = simulate(alone, [row])
    if not sim.feasible:
        raise RuntimeError(
            "the stage's list does not fit its limit when it runs alone: "
            + "; ".join(v.message for v in sim.evaluation.violations[:2])
        )
    assert sim.evaluation.makespan is not None and sim.evaluation.peak_memory is not None
    sim_peak = float(sim.evaluation.peak_memory[0])
    # the rule the profile used before per-op memory (and still uses on CPU): B frees nothing,
    # W frees the saved bytes; group 0's output lives until its backward (same limit: the same
    # memory waits; its peak is reported even where the rule would not fit it)
    rule = harness_problem(
        m,
        c1 | {"m_f": act, "m_b": 0.0},
        in_bytes,
        memory_limit=limit,
        offload_bytes=min(off, act),
        bandwidth=bandwidth,
    )
    rule_peak = float((simulate(rule, [row]).evaluation.peak_memory or [0.0])[0])
    res["predicted"] = {
        "stage_time_s": sim.evaluation.makespan,
        # what decides the goal: the simulator's peak on the problem as the strategy builds it
        # (per-op memory) plus the reserve the strategy keeps out of the solver's limit
        "activation_peak_bytes": sim_peak + mem.reserve,
        "simulator_peak_bytes": sim_peak,
        # the same model in the executor's order of events (frees at settle points)
        "executor_order_peak_bytes": executor_order_peak(alone, sim),
        "reserve_bytes": mem.reserve,
        "model": mem.model,
        "rule_model_peak_bytes": rule_peak,
        "memory_limit_bytes": limit,
        "memory_waits": len(sim.timeline.memory_waits[0]) if sim.timeline else 0,
        "stage_peak_in_pipeline_bytes": float((full.evaluation.peak_memory or [0.0] * p)[s]),
    }
    flush()
    pg = process_group()
    layers = make_layers(shape, n, dtype, device, seed=1)
    engine = PipelineEngine(
        layers,
        incoming_grad_loss,
        alone,
        make_schedule(alone, f"stage {s} of {sched.generator}", [row]),
        [1, n],
        0,
        pg,
        device,
        offload_min_bytes=1024,
    )
    opt = torch.optim.AdamW(engine.parameters, lr=1e-4)
    x = torch.randn(m * shape.batch, shape.seq, shape.hidden, dtype=dtype, device=device)
    g = torch.randn_like(x)
    engine.step(x, g)  # warm-up: shape inference, kernels, pinned pages
    opt.step()  # optimizer state exists from here on
    opt.zero_grad(set_to_none=False)  # gradients stay allocated: static memory
    _sync(device)
    measured: dict[str, Any] = {}
    res["measured"] = measured
    frac_set = False
    static = 0
    try:
        if cuda:
            static = torch.cuda.memory_allocated(device)
            total = torch.cuda.get_device_properties(device).total_memory
            # a cap well above the prediction: it stops a runaway executor, while a model that
            # is somewhat off still gets measured (the ratios below say by how much)
            cap = static + limit * 2.0 + max(mem.reserve, costs.get("transient_bytes", 0.0))
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
            frac_set = True
            measured["static_bytes"] = static
            measured["device_cap_bytes"] = cap
            torch.cuda.reset_peak_memory_stats(device)
            reserved0 = torch.cuda.memory_reserved(device)
        times, peaks, settle_waits = [], [], []
        for _ in range(steps):
            _sync(device)
            t0 = time.perf_counter()
            try:
                engine.step(x, g)
            except RuntimeError as e:  # the executor broke the model's memory
                # torch's stage backward re-raises an out-of-memory as a plain RuntimeError
                oom = _out_of_memory(e)
                if oom is None:
                    raise
                measured["oom"] = str(oom).strip().splitlines()[0][:300]
                measured["peak_at_oom_bytes"] = torch.cuda.max_memory_allocated(device) - static
                break
            _sync(device)
            times.append(time.perf_counter() - t0)
            # compute's waits at settle points this step (the manager resets at each step):
            # a copy slower than the model shows here, not in memory
            settle_waits.append(engine.offload.settle_wait_seconds())
            if cuda:
                peaks.append(torch.cuda.max_memory_allocated(device) - static)
            opt.zero_grad(set_to_none=False)
        if not times:
            raise RuntimeError(f"out of memory under the cap: {measured['oom']}")
        hist = engine.offload.history
        measured["stage_time_s"] = statistics.median(times)
        measured["stage_times_s"] = times
        measured["offloads_per_step"] = sum(h[0] == "OFFLOAD" for h in hist)
        measured["waits_per_step"] = sum(h[0] == "WAIT" for h in hist)
        measured["bytes_offloaded_per_step"] = engine.offload.offloaded_total
        measured["schedule_offloads"] = offloads[s]
        measured["time_over_predicted"] = measured["stage_time_s"] / sim.evaluation.makespan
        measured["settle_wait_s"] = statistics.median(settle_waits)
        measured["settle_wait_share_of_step"] = measured["settle_wait_s"] / measured["stage_time_s"]
        if cuda:
            peak = max(peaks)
            measured["activation_peak_bytes"] = peak
            # the goal: within 5% of the strategy's model (simulator peak + reserve)
            ratio = peak / (sim_peak + mem.reserve)
            measured["peak_over_predicted"] = ratio
            measured["peak_within_5pct"] = abs(ratio - 1.0) <= 0.05
            measured["peak_over_simulator_peak"] = peak / sim_peak
            measured["peak_over_executor_order_plus_reserve"] = peak / (
                res["predicted"]["executor_order_peak_bytes"] + mem.reserve
            )
            measured["peak_over_rule_model"] = peak / rule_peak
            measured["reserved_growth_bytes"] = torch.cuda.max_memory_reserved(device) - reserved0
            pool = getattr(engine.offload.engine, "pool", None)
            if pool is not None:
                measured["pinned_host_bytes"] = pool.held_bytes
        else:
            measured["activation_peak_bytes"] = None
            measured["peak_over_predicted"] = None
            measured["memory_note"] = (
                "CPU: no allocator statistics, copies are synchronous (settle waits ~0); "
                "peak and settle waits are measured on a GPU"
            )
        flush()
        watch = gpu_check_stage.memory_watch(device) or (
            OpMemoryWatch(CudaAllocator(device)) if cuda else None
        )
        if watch is not None:  # one more step, watched per action: where the model is off
            try:
                res["level_trace"] = level_trace(engine, x, g, sim, watch)
            except Exception as e:  # a diagnostic: its failure is noted, the section goes on
                res["level_trace"] = {"error": f"{type(e).__name__}: {e}"[:300]}
            opt.zero_grad(set_to_none=False)
            flush()
    finally:
        if frac_set:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
    # offload changes no numbers: the same list without its transfers, from the same weights
    plain = harness(None, transfers=False)
    grads_off = _one_step_grads(engine, x, g)
    ref_layers = make_layers(shape, n, dtype, device, seed=1)
    for mine, theirs in zip(ref_layers, layers, strict=True):
        mine.load_state_dict(theirs.state_dict())
    ref = PipelineEngine(
        ref_layers,
        incoming_grad_loss,
        plain,
        make_schedule(plain, "no transfers", [[a for a in row if a.is_compute]]),
        [1, n],
        0,
        pg,
        device,
    )
    grads_ref = _one_step_grads(ref, x, g)
    scale = max(float(t.abs().max()) for t in grads_ref) or 1.0
    diff = max(float((a - b).abs().max()) for a, b in zip(grads_off, grads_ref, strict=True))
    measured["grad_max_abs_diff_over_max"] = diff / scale
    flush()
    del ref, ref_layers, grads_ref, grads_off
    # the same list with the limit just under its need (the smallest limit the simulator
    # accepts, memory waits included): refused before anything runs
    need = _least_limit(harness, [row], limit)
    tight = harness(need * 0.99)
    before = torch.cuda.memory_allocated(device) if cuda else 0
    refused: dict[str, Any] = {"needed_limit": need, "memory_limit": need * 0.99}
    res["tight_limit"] = refused
    try:
        PipelineEngine(
            layers,
            incoming_grad_loss,
            tight,
            make_schedule(tight, f"stage {s}", [row]),
            [1, n],
            0,
            pg,
            device,
        )
        refused["refused"] = False
    except ScheduleRejectedError as e:
        refused["refused"] = True
        refused["error"] = str(e).splitlines()[0]
        refused["one_line"] = "\n" not in str(e)
    except torch.cuda.OutOfMemoryError as e:  # pragma: no cover - the failure this guards
        refused["refused"] = False
        refused["oom"] = str(e).splitlines()[0]
    if cuda:
        refused["allocated_change_bytes"] = torch.cuda.memory_allocated(device) - before
    flush()
    if "oom" in measured:
        raise RuntimeError(f"a step ran out of memory under the cap: {measured['oom']}")


def executor_order_peak(problem: Problem, sim: Any) -> float:
    """Stage 0's peak in the executor's order of events (what the caching allocator sees, the
    host issuing in list order): each compute action's bytes at its end, a RELOAD's at its issue
    (the end of the compute action listed before it: the executor allocates the buffers then,
    even while the offload's device copy is still held), and an OFFLOAD's freed at its settle
    point (the start of the first action the simulator starts after the copy's end, or the F
    that waits for it: ``offload.settle_points``), as the simulator now does too (issue 34); the
    difference left is the reload, allocated here at its issue, in the simulator at its start. The executor may drop a copy earlier (``poll``, when the
    host sees it done: always on CPU, rarely on a GPU the host runs ahead of), so this is the
    GPU's worst case. A diagnostic beside the simulator's peak."""
    from optpipe_lightning.strategy.runtime.offload import settle_points

    tl = sim.timeline
    row = tl.actions[0]
    ob = problem.cost("offload_bytes")[0]
    m_f, m_b, m_w = (problem.cost(k)[0] for k in ("m_f", "m_b", "m_w"))
    delta = {"F": m_f, "B": m_b, "W": m_w, "BW": m_b + m_w}
    frees: dict[int, list[int]] = {}
    for k, o in settle_points(tl)[0]:
        frees.setdefault(k, []).append(o)
    level = peak = 0.0
    for k, a in enumerate(row):
        if a.op == "RELOAD":
            level += float(ob[a.chunk])
        elif a.op != "OFFLOAD":
            level -= sum(float(ob[row[o].chunk]) for o in frees.get(k, ()))
            level += float(delta[a.op][a.chunk])
        peak = max(peak, level)
    return peak


def level_trace(
    engine: PipelineEngine, x: torch.Tensor, g: torch.Tensor, sim: Any, watch: OpMemoryWatch
) -> dict[str, Any]:
    """One step of the stage with the allocator watched per action (``op_memory``'s windows):
    at every compute action's start, the bytes allocated above the step's start against the
    simulator's level at that action's start, and what the action left and its transient. The
    largest gap says where the memory model parts from the executor."""
    watch.trace = []
    cur = engine.cursor
    cur.memory, cur.watch_memory = watch, True
    base = watch.allocator.allocated()
    try:
        engine.step(x, g)
    finally:
        cur.memory, cur.watch_memory = None, False
    curve, rows = sim.memory[0], sim.timeline.compute_rows(0)
    out: list[dict[str, Any]] = []
    for (op, chunk, start, left, transient), (a, t0, _) in zip(watch.trace, rows, strict=True):
        assert (op, chunk) == (a.op, a.chunk), f"trace {op}.{chunk} against the list's {a}"
        before = curve.times <= t0 + 1e-12 * max(abs(t0), 1e-30)
        model = float(curve.bytes[before][-1]) if before.any() else 0.0
        out.append(
            {
                "action": f"{op}{a.mb}.{chunk}",
                "measured": float(start - base),
                "model": model,
                "left": float(left),
                "transient": float(transient),
            }
        )
    gap = max(out, key=lambda r: r["measured"] - r["model"])
    top = max(out, key=lambda r: r["measured"] + max(r["left"], 0.0) + r["transient"])
    return {
        "rows": out,
        "largest_gap_bytes": gap["measured"] - gap["model"],
        "largest_gap_before": gap["action"],
        "highest_action": top["action"],
        "highest_bytes": top["measured"] + max(top["left"], 0.0) + top["transient"],
    }


def _out_of_memory(e: BaseException) -> BaseException | None:
    """The out-of-memory error in ``e``'s chain of causes, if any."""
    c: BaseException | None = e
    for _ in range(6):
        if c is None:
            return None
        if isinstance(c, torch.cuda.OutOfMemoryError) or "out of memory" in str(c).lower():
            return c
        c = c.__cause__ or c.__context__
    return None


def _least_limit(
    harness: Callable[[float], Problem], rows: list[list[Action]], feasible: float
) -> float:
    """The smallest memory limit under which the simulator accepts ``rows`` (bisection)."""
    from optpipe_lightning.schedule import simulate

    lo, hi = 0.0, feasible
    for _ in range(40):
        mid = (lo + hi) / 2
        if simulate(harness(mid), rows).feasible:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-4 * hi:
            break
    return hi


def _one_step_grads(engine: PipelineEngine, x: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    for p in engine.parameters:
        p.grad = None
    engine.step(x, g)
    return [p.grad.detach().float().clone() for p in engine.parameters if p.grad is not None]
