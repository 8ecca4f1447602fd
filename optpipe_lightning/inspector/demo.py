"""Demo problems and schedules for the inspector's tests, screenshots and benchmark.

``greedy_schedule`` is a small list scheduler (backward first, forward while few microbatches are
in flight, weight gradients fill the gaps) that offloads every ``offload_every``-th microbatch: it
needs nothing but the schedule core, so the inspector can be exercised on any size (16 x 64 x 2
with copies for the benchmark) while the real baselines live in ``schedule.baselines``.
"""

from __future__ import annotations

import heapq
from typing import Any

from ..schedule import Action, Problem, Schedule, evaluate
from ..schedule.problem import OffloadSpec
from ..schedule.profile import (
    HardwareFingerprint,
    ModelFingerprint,
    OpStats,
    Profile,
    StageProfile,
)


def demo_problem(
    num_stages: int = 4,
    num_microbatches: int = 8,
    num_chunks: int = 1,
    *,
    offload: bool = True,
    memory_limit: float | None = None,
    name: str | None = None,
) -> Problem:
    """A problem shaped like a 1.5B GPT layer stack (times in seconds, bytes in bytes)."""
    act = 2.0e9 / num_chunks
    return Problem(
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        num_chunks=num_chunks,
        placement="vshape" if num_chunks == 2 else "interleaved",
        t_f=[0.018 / num_chunks * (1.0 + 0.03 * (s % 3)) for s in range(num_stages)],
        t_b=0.019 / num_chunks,
        t_w=0.009 / num_chunks,
        t_comm=0.0006,
        m_f=act,
        m_b=-0.8 * act,
        m_w=-0.2 * act,
        memory_limit=memory_limit,
        offload=OffloadSpec(bytes=0.8 * act, d2h_bandwidth=2.0e11, h2d_bandwidth=2.0e11)
        if offload
        else None,
        name=name or f"demo p{num_stages} m{num_microbatches} v{num_chunks}",
    )


def greedy_actions(problem: Problem, *, offload_every: int = 0) -> list[list[Action]]:
    """Per-stage action lists from earliest-start list scheduling (B > F > W at ties).

    Forwards of a layer group are capped at ``G - g`` microbatches in flight (1F1B's rule per
    layer group), so memory stays bounded. Every ``offload_every``-th microbatch (0: none) is
    offloaded right after its F and reloaded two compute actions before its B.
    """
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    G = p * v
    table = problem.group_table
    t_f, t_b, t_w, t_comm = (problem.cost(n) for n in ("t_f", "t_b", "t_w", "t_comm"))
    f_end: dict[tuple[int, int], float] = {}
    b_end: dict[tuple[int, int], float] = {}
    next_f = [0] * G  # next microbatch whose F group g may start
    in_flight = [0] * G
    free = [0.0] * p
    order: list[list[Action]] = [[] for _ in range(p)]
    # ready ops: (ready time, priority, group, mb, kind)
    ready: list[tuple[float, int, int, int, str]] = []
    pending_w: set[tuple[int, int]] = set()

    def push_f(g: int) -> None:
        mb = next_f[g]
        if mb >= m or in_flight[g] >= G - g:
            return
        if g == 0:
            t = 0.0
        elif (g - 1, mb) in f_end:
            ps, pc = table[g - 1]
            t = f_end[(g - 1, mb)] + (float(t_comm[ps, pc]) if ps != table[g][0] else 0.0)
        else:
            return
        next_f[g] += 1
        in_flight[g] += 1
        heapq.heappush(ready, (t, 1, g, mb, "F"))

    for g in range(G):
        push_f(g)
    total = 3 * G * m
    done = 0
    while done < total:
        # the op that can start first on its device (ties: B, then F, then W)
        best_i, best_start = -1, 0.0
        for i, (t, _prio, g, _mb, _k) in enumerate(ready):
            s = table[g][0]
            st = max(t, free[s])
            if best_i < 0 or (st, ready[i][1]) < (best_start, ready[best_i][1]):
                best_i, best_start = i, st
        t, _prio, g, mb, kind = ready.pop(best_i)
        heapq.heapify(ready)
        s, c = table[g]
        dur = {"F": t_f, "B": t_b, "W": t_w}[kind][s, c]
        end = best_start + float(dur)
        free[s] = end
        order[s].append(Action(kind, mb, c))
        done += 1
        if kind == "F":
            f_end[(g, mb)] = end
            push_f(g)
            if g + 1 < G:
                push_f(g + 1)
            else:
                heapq.heappush(ready, (end, 0, g, mb, "B"))
        elif kind == "B":
            b_end[(g, mb)] = end
            in_flight[g] -= 1
            heapq.heappush(ready, (end, 2, g, mb, "W"))
            pending_w.add((g, mb))
            push_f(g)
            if g > 0:
                ns, nc = table[g]
                lag = float(t_comm[ns, nc]) if table[g - 1][0] != ns else 0.0
                heapq.heappush(ready, (max(end + lag, f_end[(g - 1, mb)]), 0, g - 1, mb, "B"))
        else:
            pending_w.discard((g, mb))
    if offload_every > 0 and problem.offload is not None:
        order = [_with_copies(row, offload_every) for row in order]
    return order


def _with_copies(row: list[Action], every: int) -> list[Action]:
    out: list[Action] = []
    moved = {(a.mb, a.chunk) for a in row if a.op == "F" and a.mb % every == 0}
    for a in row:
        out.append(a)
        if a.op == "F" and (a.mb, a.chunk) in moved:
            out.append(Action("OFFLOAD", a.mb, a.chunk))
    # reloads: two compute actions before the B (never before the offload)
    for mb, chunk in moved:
        b_at = out.index(Action("B", mb, chunk))
        off_at = out.index(Action("OFFLOAD", mb, chunk))
        k, seen = b_at, 0
        while k > off_at + 1 and seen < 2:
            k -= 1
            if out[k].is_compute:
                seen += 1
        out.insert(max(k, off_at + 1), Action("RELOAD", mb, chunk))
    return out


def greedy_schedule(problem: Problem, *, offload_every: int = 0, name: str = "greedy") -> Schedule:
    """``greedy_actions`` wrapped as an evaluated, self-contained schedule."""
    actions = greedy_actions(problem, offload_every=offload_every)
    return Schedule(
        problem_hash=problem.hash,
        generator=name,
        params={"offload_every": offload_every},
        actions=actions,
        evaluation=evaluate(problem, actions),
        problem=problem,
    )


def fitted_problem(
    problem: Problem, schedule_actions: list[list[Action]], headroom: float = 1.1
) -> Problem:
    """The problem with a memory limit ``headroom`` above the schedule's highest peak."""
    ev = evaluate(problem, schedule_actions)
    return problem.with_changes(memory_limit=max(ev.peak_memory) * headroom)


def demo_profile(num_stages: int = 4, num_chunks: int = 1) -> Profile:
    """A measured-looking profile (spread included) of a small GPT-like model on 4 GPUs."""
    stages = []
    for s in range(num_stages):
        for c in range(num_chunks):
            k = 1.0 + 0.05 * s

            def stats(mean: float, k: float = k) -> OpStats:
                m = mean * k
                return OpStats(mean=m, std=0.04 * m, min=0.93 * m, max=1.12 * m, samples=20)

            stages.append(
                StageProfile(
                    stage=s,
                    chunk=c,
                    f=stats(0.018 / num_chunks),
                    b=stats(0.019 / num_chunks),
                    w=stats(0.009 / num_chunks),
                    activation_bytes=2.0e9 / num_chunks,
                    weight_grad_bytes=0.4e9 / num_chunks,
                    offloadable_bytes=1.6e9 / num_chunks,
                )
            )
    return Profile(
        hardware=HardwareFingerprint(
            device_kind="NVIDIA H100 80GB HBM3",
            device_count=num_stages,
            device_memory=80 * 2**30,
            interconnect="nvlink",
            torch_version="2.13.0",
            hostname="demo-node",
        ),
        model=ModelFingerprint(
            name="gpt-1.5b",
            layer_structure=["TransformerBlock"] * (8 * num_stages),
            microbatch_size=1,
            sequence_length=1024,
            num_stages=num_stages,
            num_chunks=num_chunks,
        ),
        num_microbatches=8,
        stages=stages,
        p2p_seconds=0.0006,
        d2h_bandwidth=2.0e10,
        h2d_bandwidth=2.2e10,
        measured_at="2026-11-20T10:00:00+00:00",
    )


def fill_database(
    url: str, *, running_solver: bool = False, baselines: bool = True
) -> dict[str, Any]:
    """Fill a database with demo content for every inspector page; returns what was stored.

    Two problems (4 x 8 x 1 and 4 x 8 x 2 with offload), greedy schedules with and without
    offload on each (plus every baseline that applies, when the generators are installed), a
    finished solver run with incumbents and bounds (and a running one when asked), a profile,
    and a training run with a schedule switch.
    """
    from optpipe_lightning.profiles_db import open_database, repository

    out: dict[str, Any] = {"schedules": {}, "problems": []}
    with open_database(url) as db, db.session() as s:
        for v in (1, 2):
            base = demo_problem(4, 8, v)
            plain = greedy_actions(base)
            pb = fitted_problem(base, plain, headroom=1.05)
            out["problems"].append(pb.hash)
            store = out["schedules"]
            for every, name in ((0, "greedy"), (2, "greedy-offload")):
                sc = greedy_schedule(pb, offload_every=every, name=name)
                store[(v, name)] = repository.store_schedule(s, sc, source="demo")
            for bname, bsc in (_baselines(pb) if baselines else {}).items():
                store[(v, bname)] = repository.store_schedule(s, bsc, source="baseline")
        pb_hash = out["problems"][0]
        best = repository.best_schedule(s, pb_hash)
        best_id, best_sc = best if best is not None else (None, None)
        ev = best_sc.evaluation if best_sc is not None else None
        mk = ev.makespan if ev is not None and ev.makespan else 0.5
        run = repository.start_solver_run(s, pb_hash, "demo", {"time_limit": 10})
        events = [
            (0.2, 1.25 * mk, 0.70 * mk),
            (0.9, 1.10 * mk, 0.80 * mk),
            (2.5, mk, 0.88 * mk),
            (6.0, mk, 0.93 * mk),
        ]
        _add_events(s, run, events)
        repository.finish_solver_run(
            s, run, status="feasible", makespan=mk, lower_bound=0.93 * mk, schedule_id=best_id
        )
        out["solver_run"] = run
        out["solver_events"] = events
        if running_solver:
            live = repository.start_solver_run(s, pb_hash, "demo", {"time_limit": 60})
            _add_events(s, live, [(0.3, 1.2 * mk, 0.6 * mk)])
            out["running_solver_run"] = live
        prof = demo_profile(4, 1)
        out["profile"] = repository.store_profile(s, prof)
        train = repository.start_training_run(
            s, hardware=prof.hardware, model=prof.model, config={"max_steps": 12}
        )
        first = out["schedules"][(1, "greedy")]
        second = out["schedules"][(1, "greedy-offload")]
        for step in range(12):
            sid = first if step < 6 else second
            predicted = 0.53 if step < 6 else 0.50
            repository.record_step(
                s,
                train,
                step=step,
                measured_seconds=predicted * (1.04 + 0.01 * (step % 3)),
                predicted_seconds=predicted,
                schedule_id=sid,
                peak_memory=[(8.0 - r) * 1e9 * (0.9 if step >= 6 else 1.0) for r in range(4)],
            )
            if step == 6:
                repository.record_switch(
                    s,
                    train,
                    step=6,
                    from_schedule_id=first,
                    to_schedule_id=second,
                    reason="solver found a 5% faster schedule",
                )
        repository.finish_training_run(s, train, status="finished")
        out["training_run"] = train
    return out


def _add_events(s: Any, run_id: int, events: list[tuple[float, float, float]]) -> None:
    from optpipe_lightning.profiles_db.models import SolverEventRecord

    for wall, mk, bound in events:
        s.add(SolverEventRecord(run_id=run_id, wall_time=wall, makespan=mk, bound=bound))
    s.flush()


def _baselines(problem: Problem) -> dict[str, Schedule]:
    """Every baseline that applies, when the generators are importable."""
    try:
        from optpipe_lightning.schedule.baselines import generate_all
    except ImportError:
        return {}
    try:
        generated = generate_all(problem)
    except Exception:  # a generator still being written must not break the demo
        return {}
    return {
        name: sc
        for name, sc in generated.items()
        if isinstance(sc, Schedule) and sc.evaluation is not None and sc.evaluation.makespan
    }
