"""A stronger lower bound: each device on its own, solved exactly with CP-SAT (a one-machine
relaxation with heads, delays and tails).

Keep one device d and everything that happens on it: its F, B, W of every microbatch and chunk,
its optional OFFLOAD/RELOAD on its copy channel, and its memory limit. Replace every other device
by pure delays: a microbatch's ops on d follow its chain (F of groups 0..G-1, then B of groups
G-1..0, W after each B) and between two of them on d lie at least the durations of the chain ops
elsewhere and the hops. Before the first op on d lies the forward chain below it (the head);
after the last B on d the rest of the backward chain and W of group 0 (the tail).

Why it is a relaxation (every schedule the simulator accepts maps onto a solution no longer than
its makespan): other devices' contention, the issue points of transfers, other stages' transfers
on a shared channel and the list order are dropped; ops are given their least durations (``B_g``
and ``W_g`` as in :mod:`optpipe_lightning.schedule.bounds`, so a fused BW maps onto B then W);
backward memory frees come no later than in the real schedule (so this bound needs ``m_b`` and
``m_w`` <= 0, as does the cheap memory bound); the forwards of d's first group may be relabelled
in the order they start (microbatches are interchangeable on one device). Time is floored to
integer ticks (``floor(a + b) >= floor(a) + floor(b)`` keeps precedences and no-overlaps; an
instant's memory level is a real level just before the next tick), byte counts are floored and
the limit rounded up. CP-SAT's proven bound on this model, times the tick, is then a valid bound
on the makespan even when it is stopped before proving optimality.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from ..schedule.bounds import bound_parts
from ..schedule.problem import Problem
from .ticks import _exact_tick

TICKS = 20_000  # resolution of the relaxation's time grid over the best known makespan


@dataclass(frozen=True)
class RelaxationBound:
    value: float  # seconds; valid lower bound on every schedule's makespan
    device: int
    proved: bool  # the device's relaxation was solved to optimality
    seconds: float


def _chain_tables(
    pb: Problem,
) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    p, v = pb.num_stages, pb.num_chunks
    G = p * v
    table = pb.group_table
    t_f, t_b, t_w, t_c = pb.cost("t_f"), pb.cost("t_b"), pb.cost("t_w"), pb.cost("t_comm")
    t_bw = pb.cost("t_bw")
    F = [float(t_f[table[g]]) for g in range(G)]
    B = [min(float(t_b[table[g]]), float(t_bw[table[g]])) for g in range(G)]
    W = [min(float(t_b[table[g]] + t_w[table[g]]), float(t_bw[table[g]])) - B[g] for g in range(G)]
    cf = [0.0] * G
    cb = [0.0] * G
    for g in range(G - 1):
        (s0, c0), (s1, c1) = table[g], table[g + 1]
        if s0 != s1:
            cf[g] = float(t_c[s0, c0])
            cb[g] = float(t_c[s1, c1])
    return F, B, W, cf, cb


def applicable(problem: Problem) -> bool:
    """Whether the relaxation can say more than the cheap bounds (a memory limit somewhere) and
    is valid here (backward memory changes are frees)."""
    if all(x is None for x in problem.memory_limits()):
        return False
    return bool((problem.cost("m_b") <= 0).all() and (problem.cost("m_w") <= 0).all())


def device_order(problem: Problem) -> list[int]:
    """Limited devices, the one whose cheap memory bound is largest first (device 0 usually)."""
    limits = problem.memory_limits()
    devs = [d for d in range(problem.num_stages) if limits[d] is not None]
    # devices holding the earliest groups keep activations longest: try them first
    first_group = {d: min(problem.group_of(d, c) for c in range(problem.num_chunks)) for d in devs}
    return sorted(devs, key=lambda d: first_group[d])


def relaxation_bound(
    problem: Problem,
    upper: float,
    time_limit: float,
    workers: int = 1,
    devices: list[int] | None = None,
    seed: int = 0,
) -> RelaxationBound | None:
    """The best bound of the devices' relaxations within ``time_limit`` seconds in total.

    ``upper`` is a known makespan (it sets the time grid). None when not applicable."""
    if not applicable(problem) or upper <= 0 or time_limit <= 0:
        return None
    t0 = time.perf_counter()
    order = devices if devices is not None else device_order(problem)
    best: RelaxationBound | None = None
    for i, d in enumerate(order):
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0.05:
            break
        share = left / (len(order) - i)
        value, proved = _solve_device(problem, d, upper, share, workers, seed)
        rb = RelaxationBound(value, d, proved, time.perf_counter() - t0)
        if best is None or rb.value > best.value:
            best = rb
    return best


def _solve_device(
    pb: Problem, d: int, upper: float, time_limit: float, workers: int, seed: int
) -> tuple[float, bool]:
    p, v, m = pb.num_stages, pb.num_chunks, pb.num_microbatches
    G = p * v
    F, B, W, cf, cb = _chain_tables(pb)
    values = [*F, *B, *W, *cf, *cb]
    if pb.offload is not None:
        values += [pb.offload_time(d, c) for c in range(v)] + [
            pb.reload_time(d, c) for c in range(v)
        ]
    exact = _exact_tick(values, upper)
    tick = exact if exact is not None and upper / exact <= 50 * TICKS else upper / TICKS

    def ticks(x: float) -> int:
        return max(0, math.floor(x / tick + 1e-9))

    # the chain of one microbatch: (kind, group, duration); edges between consecutive entries
    chain: list[tuple[str, int, float]] = [("F", g, F[g]) for g in range(G)]
    chain += [("B", g, B[g]) for g in range(G - 1, -1, -1)]
    edge = [cf[g] for g in range(G - 1)] + [0.0] + [cb[g] for g in range(G - 2, -1, -1)]
    on_d = [k for k, (_, g, _) in enumerate(chain) if pb.group_table[g][0] == d]
    if not on_d:
        return 0.0, True
    pos = [0.0] * (2 * G)  # earliest start of each chain entry with no contention
    for k in range(1, 2 * G):
        pos[k] = pos[k - 1] + chain[k - 1][2] + edge[k - 1]
    below = [0.0] * G  # from the end of B_g to the end of W_0 down the chain
    below[0] = W[0]
    for g in range(1, G):
        below[g] = cb[g - 1] + B[g - 1] + below[g - 1]

    md = cp_model.CpModel()
    horizon = ticks(upper) + 1
    ms = md.new_int_var(0, horizon, "makespan")
    limits = pb.memory_limits()
    lim = limits[d]
    ob = pb.cost("offload_bytes")
    m_f, m_b, m_w = pb.cost("m_f"), pb.cost("m_b"), pb.cost("m_w")
    scale = 1.0
    deltas_abs = [abs(float(x)) for x in (*m_f[d], *m_b[d], *m_w[d], *ob[d]) if x]
    if deltas_abs:
        scale = 1e6 / max(deltas_abs)

    def mem(x: float) -> int:
        return math.floor(x * scale + 1e-9)

    intervals: list[cp_model.IntervalVar] = []
    chan: list[cp_model.IntervalVar] = []
    r_times: list[cp_model.LinearExprT] = []
    r_deltas: list[int] = []
    r_active: list[cp_model.LiteralT] = []
    first_f: list[cp_model.IntVar] = []
    offloadable = pb.offload is not None and lim is not None
    for j in range(m):
        prev: tuple[int, cp_model.IntVar, int] | None = None  # (chain index, start, duration)
        f_end: dict[int, cp_model.LinearExprT] = {}
        b_start: dict[int, cp_model.IntVar] = {}
        for k in on_d:
            kind, g, dur = chain[k]
            c = pb.group_table[g][1]
            dt = ticks(dur)
            x = md.new_int_var(ticks(pos[k]), horizon, f"{kind}{g}.{j}")
            intervals.append(md.new_fixed_size_interval_var(x, dt, ""))
            if prev is None:
                first_f.append(x)
            else:
                pk, px, pd = prev
                gap = sum(chain[q][2] for q in range(pk + 1, k)) + sum(
                    edge[q] for q in range(pk, k)
                )
                md.add(x >= px + pd + ticks(gap))
            prev = (k, x, dt)
            if kind == "F":
                f_end[g] = x + dt
                r_times.append(x + dt)
                r_deltas.append(mem(float(m_f[d, c])))
                r_active.append(True)
            else:
                b_start[g] = x
                r_times.append(x + dt)
                r_deltas.append(mem(float(m_b[d, c])))
                r_active.append(True)
                wd = ticks(W[g])
                y = md.new_int_var(0, horizon, f"W{g}.{j}")
                intervals.append(md.new_fixed_size_interval_var(y, wd, ""))
                md.add(y >= x + dt)
                md.add(ms >= y + wd)
                r_times.append(y + wd)
                r_deltas.append(mem(float(m_w[d, c])))
                r_active.append(True)
                md.add(ms >= x + dt + ticks(below[g]))
        if offloadable:
            for g, fe in f_end.items():
                c = pb.group_table[g][1]
                if float(ob[d, c]) <= 0 or g not in b_start:
                    continue
                o = md.new_bool_var("")
                d_off, d_rel = ticks(pb.offload_time(d, c)), ticks(pb.reload_time(d, c))
                so = md.new_int_var(0, horizon, "")
                sr = md.new_int_var(0, horizon, "")
                chan.append(md.new_optional_fixed_size_interval_var(so, d_off, o, ""))
                chan.append(md.new_optional_fixed_size_interval_var(sr, d_rel, o, ""))
                md.add(so >= fe).only_enforce_if(o)
                md.add(sr >= so + d_off).only_enforce_if(o)
                md.add(sr + d_rel <= b_start[g]).only_enforce_if(o)
                byte = mem(float(ob[d, c]))
                r_times += [so + d_off, sr]
                r_deltas += [-byte, byte]
                r_active += [o, o]
    md.add_no_overlap(intervals)
    if chan:
        md.add_no_overlap(chan)
    for a, b in itertools.pairwise(first_f):
        md.add(b >= a)  # relabel microbatches by the start of their first op on d
    if lim is not None:
        cap = math.ceil(lim * scale * (1 + 1e-9) + 1e-6)
        low = -sum(abs(x) for x in r_deltas) - 1
        md.add_reservoir_constraint_with_active(r_times, r_deltas, r_active, low, cap)
    cheap = bound_parts(pb).value
    md.add(ms >= ticks(cheap))
    md.minimize(ms)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, time_limit)
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    solver.parameters.expand_reservoir_constraints = False
    status = solver.solve(md)
    if status == cp_model.OPTIMAL:
        return solver.objective_value * tick, True
    if status == cp_model.INFEASIBLE:
        # nothing fits within ``upper``: the caller's makespan is not achievable; be safe
        return 0.0, False
    bnd = solver.best_objective_bound
    return (bnd * tick if math.isfinite(bnd) else 0.0), False
