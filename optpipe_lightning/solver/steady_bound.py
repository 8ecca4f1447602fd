"""Argument 8, the steady state: the least time per microbatch one device's relaxation allows.

The cheap arguments of ``schedule.bounds`` count memory as a fluid: where only one or two
activations fit and copies are slow, a device loses time to whole activations not fitting, which
they miss (8x32x1 at a quarter of 1F1B's memory, copies 2x: 7.33 per microbatch by the cheap bound, 7.92
here, 8.25 in the solved schedule). This argument is exact for one device's steady state, so it only runs
where the state graph stays small (one chunk per stage; a few activations fit).

**The relaxation** (as ``cpsat.solve_device_relaxation``): only device ``s``'s resources bind
(one op at a time, its copy channel, its memory limit); every other device is free, so each
microbatch's backward may start ``R`` after its forward ends (the chain above: every F up, every
B down, each hop), and forwards may start from the device's ``head`` on.

**The state graph.** Time in exact ticks (``solver.ticks``). A state is what the device holds at
a tick: its running op and the ticks it has left, its channel's transfer and ticks left, the
W-parts held, and per pending microbatch (F ended, B not started, oldest first) the ticks until
its backward is released and where its activation is (on the device, going to the host, on the
host, coming back, back). Every tick the device starts the next F, the oldest pending B
(released and on the device), a W, or nothing; the channel offloads the newest activation never
offloaded, reloads the oldest on the host, or nothing; the memory (simulator semantics: F adds its
activation when it ends, B and W free at their ends, an offload frees when it ends, a reload
allocates when it starts, changes at one instant net out) stays within the limit. Each edge lasts
one tick and counts the forwards it starts. Ops of one kind run in microbatch order (the symmetry
every solver model uses); offloading the newest and reloading the oldest is no loss (swap the two
activations' copies). Two further relaxations keep the graph small: a countdown on the host is
set to 0 (its backward counts as released; it still needs its reload), and at most ``cap``
microbatches are pending (``m`` loses nothing).

**The bound.** The device's work from its head to its last op is a closed walk from the empty
state to itself with m forwards, so it lasts at least ``m * lambda`` ticks, ``lambda`` the least
ticks per forward over the graph's cycles: ``makespan >= head + m * lambda``. ``lambda`` is found
by bisection, each step a Bellman-Ford run with weights ``1 - lambda * forwards``: it converges
(no negative cycle: ``lambda`` is proven) or its predecessor graph shows a cycle, whose ratio some
cyclic schedule of the relaxation achieves. ``benchmarks/bench_device_cycle.py`` prints both.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..schedule.problem import Problem
from .ticks import fusable, tick_model

# where an activation is
ON, GOING, HOST, COMING, BACK = 0, 1, 2, 3, 4
# what the device runs
IDLE, FWD, BWD, WGT = 0, 1, 2, 3

# (W-parts held, running op, its ticks left, the copy's ticks left, pending (countdown, where))
State = tuple[int, int, int, int, tuple[tuple[int, int], ...]]


@dataclass(frozen=True)
class Device:
    """One device's relaxation in ticks (one chunk)."""

    head: int
    f: int
    b: int
    w: int
    release: int  # F end to the earliest B start
    off: int
    rel: int
    act: float
    wpart: float
    moved: float
    limit: float


def device_model(pb: Problem, s: int, horizon: float) -> tuple[Device, float] | str:
    """Device ``s``'s relaxation and the seconds per tick (ticks exact up to ``horizon``
    seconds), or why it is not modelled."""
    if pb.num_chunks != 1 or pb.group_table[s] != (s, 0):
        return "one chunk per stage only"
    lim = pb.memory_limits()[s]
    if lim is None:
        return "no memory limit"
    if (s, 0) in fusable(pb):
        return "a fused backward is cheaper than B + W (not modelled)"
    m_b, m_w = float(pb.cost("m_b")[s, 0]), float(pb.cost("m_w")[s, 0])
    if m_b > 0 or m_w > 0:
        return "a backward that allocates (not modelled)"
    tm = tick_model(pb, horizon)
    if not tm.exact:
        return "durations are not whole ticks"
    if min(tm.t_f[s][0], tm.t_b[s][0], tm.t_w[s][0]) == 0:
        return "an op of zero ticks (not modelled)"
    offloads = pb.offload is not None and float(pb.cost("offload_bytes")[s, 0]) > 0
    if offloads and min(tm.t_off[s][0], tm.t_rel[s][0]) == 0:
        return "copies of zero ticks (not modelled)"
    p = pb.num_stages
    t_c = [tm.comm[d][0] for d in range(p)]
    # group g = stage g with one chunk: up from s to the top, back down to s
    head = sum(tm.t_f[d][0] + t_c[d] for d in range(s))
    up = sum(t_c[d] + tm.t_f[d + 1][0] for d in range(s, p - 1))
    down = sum(tm.t_b[d + 1][0] + t_c[d + 1] for d in range(s, p - 1))
    act = float(pb.cost("m_f")[s, 0])
    moved = float(pb.cost("offload_bytes")[s, 0]) if offloads else 0.0
    device = Device(
        head=head,
        f=tm.t_f[s][0],
        b=tm.t_b[s][0],
        w=tm.t_w[s][0],
        release=up + down,
        off=tm.t_off[s][0],
        rel=tm.t_rel[s][0],
        act=act,
        wpart=act + m_b,
        moved=moved,
        limit=lim * (1 + 1e-9) + 1e-12,
    )
    return device, tm.tick


def memory(dv: Device, st: State) -> float:
    nwp, op, _left, _copy, pend = st
    level = nwp * dv.wpart + (dv.act if op == BWD else 0.0) + (dv.wpart if op == WGT else 0.0)
    for _r, loc in pend:
        level += dv.act - dv.moved if loc == HOST else dv.act
    return level


def build(
    dv: Device, cap: int, max_states: int, deadline: float = math.inf
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Edges (from, to, forwards started) of the graph reachable from the empty state; state 0 is
    the empty one. None past ``max_states`` states, or when the states found but not yet expanded
    cannot be at the rate so far before the ``deadline`` (``time.perf_counter()``)."""
    start: State = (0, IDLE, 0, 0, ())
    index = {start: 0}
    order = [start]
    src: list[int] = []
    dst: list[int] = []
    fwd: list[int] = []
    i = 0
    t_start = time.perf_counter()
    while i < len(order):
        if i % 512 == 0 and i:
            now = time.perf_counter()
            # the states found but not yet expanded, at the rate so far, must fit before the
            # deadline: where they cannot, give the time back now rather than at the deadline
            if now + (len(order) - i) * (now - t_start) / i > deadline:
                return None
        st = order[i]
        nwp, op, left, copy, pend = st
        moves: list[int | None] = [None]
        if op == IDLE:
            moves.append(FWD)
            if pend and pend[0][0] == 0 and pend[0][1] in (ON, BACK):
                moves.append(BWD)
            if nwp:
                moves.append(WGT)
        copies: list[tuple[int, int] | None] = [None]
        if copy == 0 and dv.moved > 0:
            newest = next((j for j in range(len(pend) - 1, -1, -1) if pend[j][1] == ON), None)
            if newest is not None:
                copies.append((GOING, newest))
            oldest = next((j for j in range(len(pend)) if pend[j][1] == HOST), None)
            if oldest is not None:
                copies.append((COMING, oldest))
        for mv in moves:
            for cp in copies:
                pl = list(pend)
                nwp2, op2, left2, copy2 = nwp, op, left, copy
                if mv == FWD:
                    op2, left2 = FWD, dv.f
                elif mv == BWD:
                    if cp is not None and cp[1] == 0:
                        continue  # the backward's own activation
                    pl = pl[1:]
                    op2, left2 = BWD, dv.b
                elif mv == WGT:
                    nwp2, op2, left2 = nwp - 1, WGT, dv.w
                if cp is not None:
                    loc, j = cp
                    j -= 1 if mv == BWD else 0
                    pl[j] = (pl[j][0], loc)
                    copy2 = dv.off if loc == GOING else dv.rel
                if memory(dv, (nwp2, op2, left2, copy2, tuple(pl))) > dv.limit:
                    continue
                # one tick on
                pl = [(max(0, r - 1), loc) for r, loc in pl]
                if op2 != IDLE:
                    left2 -= 1
                    if left2 == 0:
                        if op2 == FWD:
                            pl.append((dv.release, ON))
                        elif op2 == BWD:
                            nwp2 += 1
                        op2 = IDLE
                if copy2:
                    copy2 -= 1
                    if copy2 == 0:
                        pl = [
                            (r, HOST if c == GOING else BACK if c == COMING else c) for r, c in pl
                        ]
                pl = [(0 if c == HOST else r, c) for r, c in pl]
                if len(pl) > cap:
                    continue
                nxt: State = (nwp2, op2, left2, copy2, tuple(pl))
                if memory(dv, nxt) > dv.limit:
                    continue
                k = index.get(nxt)
                if k is None:
                    if len(order) >= max_states:
                        return None
                    k = index[nxt] = len(order)
                    order.append(nxt)
                src.append(i)
                dst.append(k)
                fwd.append(1 if mv == FWD else 0)
        i += 1
    return np.array(src), np.array(dst), np.array(fwd)


def _cycle_in(parent: np.ndarray) -> list[int] | None:
    """A cycle of the functional graph ``node -> parent[node]`` (-1: none), as its nodes: by
    pointer doubling, ``parent`` applied ``2^k >= n`` times lands every node whose path does not
    end on a cycle."""
    n = len(parent)
    sink = n  # where the paths that end go; it loops on itself
    jump = np.append(np.where(parent < 0, sink, parent), sink)
    for _ in range(max(1, int(n).bit_length())):
        jump = jump[jump]
    on_cycle = jump[:n][jump[:n] != sink]
    if len(on_cycle) == 0:
        return None
    c = int(on_cycle[0])
    cycle = [c]
    u = int(parent[c])
    while u != c:
        cycle.append(u)
        u = int(parent[u])
    return cycle


def cycle_ratio(
    n: int,
    src: np.ndarray,
    dst: np.ndarray,
    fwd: np.ndarray,
    lo: float,
    tol: float,
    deadline: float = math.inf,
) -> tuple[float, float | None]:
    """(proven, upper): every cycle has at least ``proven`` ticks per forward (``lo``, given,
    must hold), and some cycle has at most ``upper`` (None if none was seen). Stops at the
    ``deadline`` with what is proven."""
    order = np.argsort(src, kind="stable")
    src, dst, fwd = src[order], dst[order], fwd[order]
    starts = np.searchsorted(src, np.arange(n))
    has_edge = np.zeros(n, dtype=bool)
    has_edge[src] = True

    def test(lam: float) -> tuple[str, float | None]:
        """Bellman-Ford with weights ``1 - lam * forwards``: ("proven", None) when it converges,
        ("cycle", its ratio) when the predecessor graph shows a negative cycle, ("negative",
        None) when it still improves after n sweeps, ("time", None) at the deadline."""
        weight = 1.0 - lam * fwd
        dist = np.zeros(n)
        parent = np.full(n, -1)
        parent_f = np.zeros(n, dtype=int)
        for sweep in range(1, n + 2):
            if time.perf_counter() > deadline:
                return "time", None
            cand = dist[dst] + weight
            best = np.full(n, np.inf)
            best[has_edge] = np.minimum.reduceat(cand, starts[has_edge])
            improved = best < dist - 1e-9
            if not improved.any():
                return "proven", None
            dist = np.where(improved, best, dist)
            # each improved node's best edge joins the predecessor graph
            hit = improved[src] & (cand <= best[src] + 1e-9)
            nodes, first = np.unique(src[hit], return_index=True)
            parent[nodes] = dst[hit][first]
            parent_f[nodes] = fwd[hit][first]
            if sweep % 8 == 0:
                cyc = _cycle_in(parent)
                if cyc is not None:
                    forwards = int(parent_f[cyc].sum())
                    if forwards and len(cyc) - lam * forwards < -1e-9:
                        return "cycle", len(cyc) / forwards
        return "negative", None

    hi: float | None = None
    lam = lo
    for _ in range(60):
        verdict, ratio = test(lam)
        if verdict == "time":
            return lo, hi
        if verdict == "proven":
            lo = lam
        elif ratio is not None:
            hi = ratio if hi is None else min(hi, ratio)
        elif hi is None or lam < hi:
            hi = lam  # some cycle has fewer ticks per forward than lam (not seen)
        if hi is None:
            lam = lo * 2
            continue
        if hi - lo <= tol:
            break
        lam = (lo + hi) / 2
    if hi is not None and hi > lo and test(hi * (1 - 1e-9))[0] == "proven":
        lo = hi * (1 - 1e-9)  # a cycle's ratio is often the answer: just under it holds
    return lo, hi


@dataclass(frozen=True)
class DeviceSteadyState:
    """What argument 8 found for one device (times in seconds)."""

    device: int
    states: int
    per_microbatch: float  # proven least time per microbatch of its relaxation's steady state
    cycle: float | None  # a cyclic schedule of the relaxation achieves this per microbatch
    bound: float  # head + m * per_microbatch, rounded up to whole ticks


def device_steady_state(
    problem: Problem,
    s: int,
    *,
    horizon: float,
    max_states: int = 50_000,
    cap: int | None = None,
    deadline: float = math.inf,
) -> DeviceSteadyState | str:
    """Argument 8 for device ``s``, or why it did not run (not modelled, too many states, out of
    time). ``cap``: pending microbatches (default m; below m the result is no bound)."""
    got = device_model(problem, s, horizon)
    if isinstance(got, str):
        return got
    dv, tick = got
    m = problem.num_microbatches
    graph = build(dv, m if cap is None else cap, max_states, deadline)
    if graph is None:
        return "out of time" if time.perf_counter() > deadline else "too many states"
    src, dst, fwd = graph
    n = int(max(src.max(), dst.max())) + 1
    # a cycle runs as many B and W as F: at least f + b + w ticks per forward
    proven, upper = cycle_ratio(
        n, src, dst, fwd, float(dv.f + dv.b + dv.w), tol=0.25 / m, deadline=deadline
    )
    return DeviceSteadyState(
        device=s,
        states=n,
        per_microbatch=proven * tick,
        cycle=None if upper is None else upper * tick,
        bound=(dv.head + math.ceil(m * proven - 1e-6)) * tick,
    )


def steady_state_bound(
    problem: Problem, *, horizon: float, deadline: float, max_states: int = 50_000
) -> float:
    """The best argument-8 bound over the devices that fit ``max_states`` states before the
    ``deadline`` (0 where none does). The devices with the longest round trip go first (their
    graphs are the largest, their bounds mostly the highest), and the first whose graph does not
    fit ends the search: at 8x32x1 the later ones would not fit either, and only cost time."""
    if problem.num_chunks != 1 or all(lim is None for lim in problem.memory_limits()):
        return 0.0
    best = 0.0
    for s in range(problem.num_stages):  # stage 0 has the longest round trip
        if time.perf_counter() > deadline:
            break
        got = device_steady_state(
            problem, s, horizon=horizon, max_states=max_states, deadline=deadline
        )
        if isinstance(got, DeviceSteadyState):
            best = max(best, got.bound)
        elif got in ("too many states", "out of time"):
            break
    return best
