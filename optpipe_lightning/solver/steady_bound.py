"""Arguments 8 and 9 of the bound: one device's relaxation, solved exactly on its state graph.

The cheap arguments of ``schedule.bounds`` count memory as a fluid: where only a few activations
fit and copies are slow, a device loses time to whole activations not fitting, which they miss
(8x32x1 at a quarter of 1F1B's memory, copies 2x: 7.33 per microbatch by the cheap bound, 7.92
here, 8.25 in the solved schedule; 4x8x2 at a quarter, copies 2x: the cheap bound is 38, device 3
proves 50.5, the optimum). These arguments are exact for one device's relaxation, so they only
run where its state graph stays small (a few activations fit).

**The relaxation** (as ``cpsat.solve_device_relaxation``): only device ``s``'s resources bind
(one op at a time, its copy channel, its memory limit); every other device is free, so each
microbatch's chain (every F up, every B down, each hop) sets only releases: on the device's
chunks ``k = 0..v-1``, in the order of their groups, a microbatch runs F_0 .. F_{v-1} and then
B_{v-1} .. B_0, each op released a fixed ``gap`` after the one before it on this device ends
(the ops of the other devices between them, and the hops); forwards may start from the device's
``head`` on.

**The state graph.** Time in exact ticks (``solver.ticks``). A state is what the device holds at
a tick: its running op and the ticks it has left, its channel's transfer and ticks left, the
W-parts held per chunk, and per microbatch in flight (F_0 started, B_0 not), by phase (the last op
it ran here) and oldest first, the ticks until its next op is released and where each of its
activations is (its forward still running, on the device, going to the host, on the host, coming
back, back). Every tick the device starts a new F_0, the next op of the oldest microbatch of a
phase (released, and a backward's activation on the device), a W, or nothing; the channel, per
chunk, offloads the newest activation never offloaded or reloads the oldest on the host, or
nothing; the memory (simulator semantics: F adds its activation when it ends, B and W free at
their ends, an offload frees when it ends, a reload allocates when it starts, changes at one
instant net out) stays within the limit. Each edge lasts one tick and counts the new
microbatches it starts. Ops of one kind and chunk run in microbatch order (the symmetry every
solver model uses); offloading the newest and reloading the oldest of a chunk is no loss (swap
the two activations' copies: same sizes, and the older one's backward comes first). Two further
relaxations keep the graph small: a backward's countdown is set to 0 once its activation is on
the host (it counts as released; it still needs its reload), and at most ``cap`` microbatches are
in flight (``m`` loses nothing).

**Argument 8, the steady state.** The device's work from its head to its last op is a closed
walk from the empty state to itself with m new microbatches, so it lasts at least
``m * lambda`` ticks, ``lambda`` the least ticks per microbatch over the graph's cycles:
``makespan >= head + m * lambda``. ``lambda`` is found by bisection, each step a Bellman-Ford
run with weights ``1 - lambda * forwards``: it converges (no negative cycle: ``lambda`` is
proven) or its predecessor graph shows a cycle, whose ratio some cyclic schedule of the
relaxation achieves. ``benchmarks/bench_device_cycle.py`` prints both.

**Argument 9, start and end** (``walk_ticks``): the least such walk exactly, breadth first over
ticks with the count of microbatches started kept as bits per state. It adds what the steady
state misses: the fill (no backward before the first round trip) and the drain, and after the
device's last B_0 the chain below it (``tail``: the B of every lower group, the last W of
group 0). It is at least argument 8, and costs a few ticks' sweeps of the graph.

``steady_state_bound`` (the solver's) takes argument 9 alone (``device_walk``: never below
argument 8, and a fraction of its cost). It first builds each device's graph without copies
(every activation stays; small), whose walk is a ceiling on the device's bound (copies only add
edges), and runs the devices with copies highest ceiling first, skipping those that cannot raise
the bound.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from ..schedule.problem import Problem
from .ticks import TickModel, fusable, tick_model

# where an activation is (NONE: its forward still runs)
ON, GOING, HOST, COMING, BACK, NONE = 0, 1, 2, 3, 4, 5
# what the device runs
IDLE, FWD, BWD, WGT = 0, 1, 2, 3

# a microbatch in flight: ticks until its next op is released, where its activations are
Entry = tuple[int, tuple[int, ...]]
# (W-parts held per chunk, running op, its chunk, ticks left, the copy's ticks left, the
# microbatches in flight per phase, oldest first)
State = tuple[tuple[int, ...], int, int, int, int, tuple[tuple[Entry, ...], ...]]


@dataclass(frozen=True)
class Device:
    """One device's relaxation in ticks. Its chunks are numbered ``k = 0..v-1`` in the order of
    their groups (a microbatch runs F_0 .. F_{v-1}, then B_{v-1} .. B_0 here). Phase ``q`` of a
    microbatch in flight: ``q < v`` after F_q (waiting for F_{q+1}, or B_{v-1} when
    ``q = v - 1``); ``q = 2v - 1 - k`` after B_k (waiting for B_{k-1}); ``gap[q]`` is the
    release, from the end of the op that entered phase ``q`` to the start of the next one."""

    head: int  # the first forward's earliest start
    tail: int  # from the last B_0's end to the end of the pipeline
    f: tuple[int, ...]
    b: tuple[int, ...]
    w: tuple[int, ...]
    gap: tuple[int, ...]
    off: tuple[int, ...]
    rel: tuple[int, ...]
    act: tuple[float, ...]
    wpart: tuple[float, ...]
    moved: tuple[float, ...]
    limit: float

    @property
    def chunks(self) -> int:
        return len(self.f)


def _stopped(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


def _hop(pb: Problem, tm: TickModel, sender: int, receiver: int) -> int:
    table = pb.group_table
    s, c = table[sender]
    return tm.comm[s][c] if table[receiver][0] != s else 0


def device_model(pb: Problem, s: int, horizon: float) -> tuple[Device, float] | str:
    """Device ``s``'s relaxation and the seconds per tick (ticks exact up to ``horizon``
    seconds), or why it is not modelled."""
    lim = pb.memory_limits()[s]
    if lim is None:
        return "no memory limit"
    table = pb.group_table
    groups = [g for g, (d, _c) in enumerate(table) if d == s]
    cs = [table[g][1] for g in groups]
    if any((s, c) in fusable(pb) for c in cs):
        return "a fused backward is cheaper than B + W (not modelled)"
    if any(float(pb.cost("m_b")[s, c]) > 0 or float(pb.cost("m_w")[s, c]) > 0 for c in cs):
        return "a backward that allocates (not modelled)"
    tm = tick_model(pb, horizon)
    if not tm.exact:
        return "durations are not whole ticks"
    if min(min(tm.t_f[s][c], tm.t_b[s][c], tm.t_w[s][c]) for c in cs) == 0:
        return "an op of zero ticks (not modelled)"
    moved = tuple(
        float(pb.cost("offload_bytes")[s, c]) if pb.offload is not None else 0.0 for c in cs
    )
    if any(
        x > 0 and min(tm.t_off[s][c], tm.t_rel[s][c]) == 0 for x, c in zip(moved, cs, strict=True)
    ):
        return "copies of zero ticks (not modelled)"

    def f_of(g: int) -> int:
        return tm.t_f[table[g][0]][table[g][1]]

    def b_of(g: int) -> int:
        return tm.t_b[table[g][0]][table[g][1]]

    def up(lo: int, hi: int) -> int:  # F_lo's end to F_hi's start
        return sum(_hop(pb, tm, g, g + 1) for g in range(lo, hi)) + sum(
            f_of(g) for g in range(lo + 1, hi)
        )

    def down(hi: int, lo: int) -> int:  # B_hi's end to B_lo's start
        return sum(_hop(pb, tm, g + 1, g) for g in range(lo, hi)) + sum(
            b_of(g) for g in range(lo + 1, hi)
        )

    top = len(table) - 1
    v = len(groups)
    last = groups[-1]
    turn = up(last, top) + f_of(top) + b_of(top) + down(top, last) if last < top else 0
    gap = (
        [up(groups[k], groups[k + 1]) for k in range(v - 1)]
        + [turn]
        + [down(groups[k], groups[k - 1]) for k in range(v - 1, 0, -1)]
    )
    g0 = groups[0]
    tail = (down(g0, 0) + b_of(0) + tm.t_w[table[0][0]][table[0][1]]) if g0 > 0 else 0
    act = tuple(float(pb.cost("m_f")[s, c]) for c in cs)
    device = Device(
        head=sum(f_of(g) + _hop(pb, tm, g, g + 1) for g in range(g0)),
        tail=tail,
        f=tuple(tm.t_f[s][c] for c in cs),
        b=tuple(tm.t_b[s][c] for c in cs),
        w=tuple(tm.t_w[s][c] for c in cs),
        gap=tuple(gap),
        off=tuple(tm.t_off[s][c] for c in cs),
        rel=tuple(tm.t_rel[s][c] for c in cs),
        act=act,
        wpart=tuple(a + float(pb.cost("m_b")[s, c]) for a, c in zip(act, cs, strict=True)),
        moved=moved,
        limit=lim * (1 + 1e-9) + 1e-12,
    )
    return device, tm.tick


def _copies(dv: Device, phases: tuple[tuple[Entry, ...], ...]) -> list[tuple[int, int, int, int]]:
    """The copies that may start: per chunk, offload its newest activation never offloaded and
    reload its oldest on the host, as (phase, entry, chunk, new location)."""
    out: list[tuple[int, int, int, int]] = []
    for c in range(dv.chunks):
        if dv.moved[c] <= 0:
            continue
        newest = next(
            (
                (q, i)
                for q in range(len(phases))
                for i in range(len(phases[q]) - 1, -1, -1)
                if len(phases[q][i][1]) > c and phases[q][i][1][c] == ON
            ),
            None,
        )
        if newest is not None:
            out.append((*newest, c, GOING))
        oldest = next(
            (
                (q, i)
                for q in range(len(phases) - 1, -1, -1)
                for i in range(len(phases[q]))
                if len(phases[q][i][1]) > c and phases[q][i][1][c] == HOST
            ),
            None,
        )
        if oldest is not None:
            out.append((*oldest, c, COMING))
    return out


def _moves(
    dv: Device, phases: tuple[tuple[Entry, ...], ...], nw: tuple[int, ...]
) -> list[tuple[int, int]]:
    """The ops that may start on an idle device, as (op, chunk)."""
    v = dv.chunks
    out = [(FWD, 0)]
    for q in range(len(phases)):
        if not phases[q]:
            continue
        r, locs = phases[q][0]
        if r:
            continue
        if q < v - 1:
            out.append((FWD, q + 1))
        elif locs[-1] in (ON, BACK):
            out.append((BWD, len(locs) - 1))
    out.extend((WGT, c) for c in range(v) if nw[c])
    return out


@dataclass(frozen=True)
class Graph:
    """A device's state graph: each edge one tick, from ``src`` to ``dst``, starting ``fwd``
    forwards of its first chunk (new microbatches); state 0 is the empty one. ``drained``: no
    microbatch in flight and no backward running (every B of the first chunk done)."""

    src: np.ndarray
    dst: np.ndarray
    fwd: np.ndarray
    drained: np.ndarray

    @property
    def states(self) -> int:
        return len(self.drained)


def _tick_phase(
    dv: Device, q: int, entries: tuple[Entry, ...], ended: bool
) -> tuple[tuple[Entry, ...], float]:
    """Phase ``q``'s entries one tick on (``ended``: the copy in flight ends now), and the
    memory that frees."""
    out = []
    freed = 0.0
    for r, locs in entries:
        if ended:
            for c, x in enumerate(locs):
                if x == GOING:
                    freed += dv.moved[c]  # an offload frees when it ends
            locs = tuple(HOST if x == GOING else BACK if x == COMING else x for x in locs)
        # the backward of an activation on the host counts as released
        r = 0 if q >= dv.chunks - 1 and locs[-1] == HOST else max(0, r - 1)
        out.append((r, locs))
    return tuple(out), freed


def build(
    dv: Device,
    cap: int,
    max_states: int,
    deadline: float = math.inf,
    stop: threading.Event | None = None,
) -> Graph | None:
    """The graph reachable from the empty state. None past ``max_states`` states, or when the
    states found but not yet expanded cannot be at the rate so far before the ``deadline``
    (``time.perf_counter()``)."""
    v = dv.chunks
    start: State = ((0,) * v, IDLE, 0, 0, 0, ((),) * (2 * v - 1))
    index = {start: 0}
    order = [start]
    # each state's memory, kept by its changes: its W-parts, a running B's activation or W's
    # part, every activation of a microbatch in flight (what stays on the device of those on
    # the host; a forward's only once it ends)
    level = [0.0]
    src: list[int] = []
    dst: list[int] = []
    fwd: list[int] = []
    # a phase's entries one tick on, with the memory its offloads free (phases repeat a lot)
    ticked: dict[tuple[int, tuple[Entry, ...], bool], tuple[tuple[Entry, ...], float]] = {}
    i = 0
    t_start = time.perf_counter()
    while i < len(order):
        if i % 512 == 0 and i:
            now = time.perf_counter()
            # the states found but not yet expanded, at the rate so far, must fit before the
            # deadline: where they cannot, give the time back now rather than at the deadline
            if now + (len(order) - i) * (now - t_start) / i > deadline or _stopped(stop):
                return None
        st = order[i]
        nw, op, k, left, copy, phases = st
        moves: list[tuple[int, int] | None] = [None]
        if op == IDLE:
            moves.extend(_moves(dv, phases, nw))
        copies: list[tuple[int, int, int, int] | None] = [None]
        if copy == 0:
            copies.extend(_copies(dv, phases))
        for mv in moves:
            for cp in copies:
                ph = [list(e) for e in phases]
                nw2, op2, k2, left2, copy2 = list(nw), op, k, left, copy
                mem = level[i]
                if cp is not None:
                    q, j, c, loc = cp
                    r, locs = ph[q][j]
                    ph[q][j] = (r, (*locs[:c], loc, *locs[c + 1 :]))
                    if loc == GOING:
                        copy2 = dv.off[c]
                    else:
                        copy2 = dv.rel[c]
                        mem += dv.moved[c]  # a reload allocates when it starts
                if mv is not None:
                    kind, c = mv
                    op2, k2 = kind, c
                    if kind == FWD:
                        left2 = dv.f[c]
                        if c == 0:
                            ph[0].append((dv.f[0] + dv.gap[0], (NONE,)))
                        else:
                            _r, locs = ph[c - 1].pop(0)
                            ph[c].append((dv.f[c] + dv.gap[c], (*locs, NONE)))
                    elif kind == BWD:
                        q = 2 * v - 2 - c if c < v - 1 else v - 1
                        _r, locs = ph[q][0]
                        if locs[-1] not in (ON, BACK):
                            continue  # a copy of the backward's own activation starts now
                        ph[q].pop(0)
                        left2 = dv.b[c]
                        if c > 0:
                            ph[2 * v - 1 - c].append((dv.b[c] + dv.gap[2 * v - 1 - c], locs[:-1]))
                    else:
                        nw2[c] -= 1
                        left2 = dv.w[c]
                # starting an op moves memory between its entry and the op: no change
                if mem > dv.limit:
                    continue
                # one tick on
                if op2 != IDLE:
                    left2 -= 1
                    if left2 == 0:
                        if op2 == FWD:
                            r, locs = ph[k2][-1]
                            ph[k2][-1] = (r, (*locs[:-1], ON))
                            mem += dv.act[k2]
                        elif op2 == BWD:
                            nw2[k2] += 1
                            mem += dv.wpart[k2] - dv.act[k2]
                        else:
                            mem -= dv.wpart[k2]
                        op2, k2 = IDLE, 0
                ended = False
                if copy2:
                    copy2 -= 1
                    ended = copy2 == 0
                nxt_ph = []
                for q, entries in enumerate(ph):
                    key = (q, tuple(entries), ended)
                    hit = ticked.get(key)
                    if hit is None:
                        hit = ticked[key] = _tick_phase(dv, q, key[1], ended)
                    nxt_ph.append(hit[0])
                    mem -= hit[1]
                if sum(len(e) for e in nxt_ph) > cap:
                    continue
                if mem > dv.limit:
                    continue
                nxt: State = (tuple(nw2), op2, k2, left2, copy2, tuple(nxt_ph))
                n = index.get(nxt)
                if n is None:
                    if len(order) >= max_states:
                        return None
                    n = index[nxt] = len(order)
                    order.append(nxt)
                    level.append(mem)
                src.append(i)
                dst.append(n)
                fwd.append(1 if mv is not None and mv == (FWD, 0) else 0)
        i += 1
    drained = np.array([st[1] != BWD and not any(st[5]) for st in order], dtype=bool)
    return Graph(np.array(src), np.array(dst), np.array(fwd), drained)


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
    stop: threading.Event | None = None,
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
            if time.perf_counter() > deadline or _stopped(stop):
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


def walk_ticks(
    graph: Graph,
    m: int,
    tail: int,
    *,
    max_ticks: int,
    deadline: float = math.inf,
    stop: threading.Event | None = None,
) -> int | None:
    """Argument 9, start and end: the least ticks from the device's head to the end of the
    pipeline over the graph's walks that start ``m`` microbatches, from the empty state to itself.
    Every schedule's work on the device is such a walk (from its head on), so the makespan is at
    least ``head`` plus the most of: the ticks to the empty state again, and the ticks until the
    last microbatch leaves (``drained``) plus ``tail``. Breadth first over ticks, the counts of
    microbatches started kept as bits of each state. None past ``max_ticks`` or the
    ``deadline``."""
    n = graph.states
    words = (m + 1 + 63) // 64
    by_dst = np.argsort(graph.dst, kind="stable")
    src, dst, fwd = graph.src[by_dst], graph.dst[by_dst], graph.fwd[by_dst].astype(bool)
    top_word, top_bit = divmod(m, 64)
    top = np.uint64(1) << np.uint64(top_bit)
    mask = np.full(words, np.uint64(0xFFFFFFFFFFFFFFFF))
    mask[-1] = (top << np.uint64(1)) - np.uint64(1) if top_bit < 63 else mask[-1]
    bits = np.zeros((n, words), dtype=np.uint64)
    bits[0, 0] = 1
    drained_at: int | None = None
    one, carry_shift = np.uint64(1), np.uint64(63)
    for t in range(1, max_ticks + 1):
        if t % 16 == 0 and (time.perf_counter() > deadline or _stopped(stop)):
            return None
        live = bits[src].any(axis=1)
        e_src, e_dst, e_fwd = src[live], dst[live], fwd[live]
        vals = bits[e_src]
        moved = vals[e_fwd]
        shifted = moved << one
        shifted[:, 1:] |= moved[:, :-1] >> carry_shift
        vals[e_fwd] = shifted & mask
        bits = np.zeros((n, words), dtype=np.uint64)
        if len(e_dst):
            heads, first = np.unique(e_dst, return_index=True)
            bits[heads] = np.bitwise_or.reduceat(vals, first, axis=0)
        if drained_at is None and (bits[graph.drained, top_word] & top).any():
            drained_at = t
        if bits[0, top_word] & top:
            return max(t, (drained_at if drained_at is not None else t) + tail)
    return None


@dataclass(frozen=True)
class DeviceSteadyState:
    """What argument 8 found for one device (times in seconds)."""

    device: int
    states: int
    per_microbatch: float  # proven least time per microbatch of its relaxation's steady state
    cycle: float | None  # a cyclic schedule of the relaxation achieves this per microbatch
    steady: float  # head + m * per_microbatch, rounded up to whole ticks (argument 8)
    walk: float | None  # argument 9 (start and end), None where it ran out of time
    bound: float  # the larger


def _walk_end(
    dv: Device,
    graph: Graph,
    m: int,
    horizon: float,
    tick: float,
    deadline: float,
    stop: threading.Event | None,
) -> int | None:
    """Argument 9 in ticks from 0 (the head included), None past the horizon or the deadline."""
    limit = math.ceil(horizon / tick) + 1
    walk = walk_ticks(graph, m, dv.tail, max_ticks=limit, deadline=deadline, stop=stop)
    return None if walk is None else dv.head + walk


def _device_graph(
    problem: Problem,
    s: int,
    horizon: float,
    max_states: int,
    cap: int | None,
    deadline: float,
    stop: threading.Event | None,
) -> tuple[Device, float, Graph] | str:
    """Device ``s``'s model, seconds per tick and graph (``cap`` None: m in flight), or why not."""
    got = device_model(problem, s, horizon)
    if isinstance(got, str):
        return got
    dv, tick = got
    graph = build(dv, problem.num_microbatches if cap is None else cap, max_states, deadline, stop)
    if graph is None:
        past = time.perf_counter() > deadline or _stopped(stop)
        return "out of time" if past else "too many states"
    return dv, tick, graph


def device_steady_state(
    problem: Problem,
    s: int,
    *,
    horizon: float,
    max_states: int = 50_000,
    cap: int | None = None,
    deadline: float = math.inf,
    stop: threading.Event | None = None,
) -> DeviceSteadyState | str:
    """Arguments 8 and 9 for device ``s``, or why they did not run (not modelled, too many states,
    out of time). ``cap``: microbatches in flight (default m; below m the result is no bound, and
    the walk is not run)."""
    got = _device_graph(problem, s, horizon, max_states, cap, deadline, stop)
    if isinstance(got, str):
        return got
    dv, tick, graph = got
    m = problem.num_microbatches
    n = graph.states
    # a cycle runs as many B and W as F: at least f + b + w ticks per forward
    work = sum(dv.f) + sum(dv.b) + sum(dv.w)
    proven, upper = cycle_ratio(
        n, graph.src, graph.dst, graph.fwd, float(work), tol=0.25 / m, deadline=deadline, stop=stop
    )
    steady = dv.head + math.ceil(m * proven - 1e-6)
    walk = None if cap is not None else _walk_end(dv, graph, m, horizon, tick, deadline, stop)
    return DeviceSteadyState(
        device=s,
        states=n,
        per_microbatch=proven * tick,
        cycle=None if upper is None else upper * tick,
        steady=steady * tick,
        walk=None if walk is None else walk * tick,
        bound=max(steady, walk or 0) * tick,
    )


# a device whose graph without copies has more states is skipped: with copies the measured graphs
# were 600-9,000 times larger (8x32x1 0.25p 2x device 0: 155 -> 92,884; 4x8x2 0.25p 2x device 3:
# 19 -> 168,091; 4x8x2 0.5p 2x device 3: 367 -> over 2 million), past what the solver's share builds
CEILING_MAX_STATES = 300
# and one where more activations than this fit: each one more multiplies the states on the host
# (8x32x1 at 0.5p, copies 2x, 4 fit: 3 million states with at most 10 in flight; 2 fit in every
# graph the solver's share built)
MAX_FIT = 3


def _without_copies(dv: Device) -> Device:
    return dataclasses.replace(dv, moved=tuple(0.0 for _ in dv.moved))


def steady_state_bound(
    problem: Problem,
    *,
    horizon: float,
    deadline: float,
    max_states: int = 400_000,
    stop: threading.Event | None = None,
) -> float:
    """The best bound of argument 9 (``device_walk``) over the devices whose graphs fit
    ``max_states`` states before the ``deadline`` (0 where none does).

    First each device's graph without copies (small: every activation stays): where nothing can
    move, its walk is that device's bound; elsewhere it is a ceiling on it (copies only add
    edges), so a device whose ceiling is no higher than the best bound so far cannot raise it,
    and one whose graph without copies exceeds ``CEILING_MAX_STATES``, or where more than
    ``MAX_FIT`` activations fit, is skipped.
    The others then run with their copies, highest ceiling first; the first whose graph does not
    fit before the deadline ends the search (the next ones are mostly larger)."""
    if all(lim is None for lim in problem.memory_limits()):
        return 0.0
    m = problem.num_microbatches
    best = 0.0
    ceilings: list[tuple[float, int]] = []
    for s in range(problem.num_stages):
        if time.perf_counter() > deadline or _stopped(stop):
            return best
        got = device_model(problem, s, horizon)
        if isinstance(got, str):
            continue
        dv, tick = got
        moves = max(dv.moved) > 0
        if moves and dv.limit / min(x for x in dv.act if x > 0) >= MAX_FIT + 1:
            continue  # with copies its graph would be far too large
        graph = build(
            _without_copies(dv), m, CEILING_MAX_STATES if moves else max_states, deadline, stop
        )
        if graph is None:
            continue  # with copies its graph would be far too large
        walk = _walk_end(dv, graph, m, horizon, tick, deadline, stop)
        if walk is None and (time.perf_counter() > deadline or _stopped(stop)):
            return best
        # no walk within the horizon: the device needs its copies
        ceiling = math.inf if walk is None else walk * tick
        if not moves:
            if walk is not None:
                best = max(best, ceiling)  # nothing moves: the walk is the bound
        else:
            ceilings.append((ceiling, s))
    for ceiling, s in sorted(ceilings, key=lambda x: (-x[0], x[1])):
        if ceiling <= best * (1 + 1e-12) or time.perf_counter() > deadline or _stopped(stop):
            break
        found = device_walk(
            problem, s, horizon=horizon, max_states=max_states, deadline=deadline, stop=stop
        )
        if isinstance(found, float):
            best = max(best, found)
        elif found in ("too many states", "out of time"):
            break
    return best


def device_walk(
    problem: Problem,
    s: int,
    *,
    horizon: float,
    max_states: int = 400_000,
    deadline: float = math.inf,
    stop: threading.Event | None = None,
) -> float | str:
    """Argument 9 alone for device ``s`` (seconds), or why it did not run. What the solver uses:
    it is never below argument 8, and the walk costs a fraction of the cycle search (8x32x1
    0.25p 2x device 0: build 5 s, walk 1 s, cycle search 10.5 s)."""
    got = _device_graph(problem, s, horizon, max_states, None, deadline, stop)
    if isinstance(got, str):
        return got
    dv, tick, graph = got
    m = problem.num_microbatches
    walk = _walk_end(dv, graph, m, horizon, tick, deadline, stop)
    if walk is None:
        past = time.perf_counter() > deadline or _stopped(stop)
        return "out of time" if past else "no walk within the horizon"
    return float(walk * tick)
