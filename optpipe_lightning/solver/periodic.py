"""Periodic schedules: one pattern of K microbatches, repeated every T ticks, solved by CP-SAT.

Where copies are about as slow as the compute they hide behind or slower, the list rules move the
pipeline in waves and the full CP-SAT model does not improve on them in a minute (16x64x1 at a
quarter of 1F1B's memory, copies 2x: 521 from the planned-copies rule, nothing better after). Most
of such a schedule is its steady state, so the search here is over the steady state itself: the
start of every op of K consecutive microbatches (``k = 0..K-1``), the offload decision of each of
their activations, and a period T; microbatch ``j = q K + k`` runs pattern ``k`` shifted by ``q T``.

Model (integer ticks, the semantics of ``cpsat``): the pattern's precedences, durations, copies
(one no-overlap per copy lane: with duplex a channel's offloads and reloads on a lane each) and
FIFO order per op kind and group (including from ``K - 1`` to the next period's ``0``). Every
op of one pattern instance runs within ``[0, Q T]``, so instances more than ``Q`` periods apart
never meet; the model therefore lays out ``Q`` consecutive instances (``Q K`` microbatches, their
times tied to the pattern's by ``+ q T``) and puts all of them in the device no-overlaps, the
copy-channel no-overlaps and the memory reservoirs. Any two instances that can meet are then
checked (by periodicity, every pair at distance below ``Q`` is some pair of the window), and in
the window's last period every instance that can hold memory is present, so the memory of the
infinite repetition, and of its first ``m`` microbatches, stays within the limit. The objective is
the unrolled makespan ``max_k (q_k T + end_k)``, below the incumbent's.

``Q`` follows from an estimate of one microbatch's latency and of the period; a pattern whose
ops crowd the last period of a device's window is tried again with wider windows when time
allows. Patterns are tried for K = 1, 2, 4, 3, 8, 6, 5 with the time the caller gives (ending
early when none of the first three came within 1% of the incumbent); a pattern for K is hinted
with the best one whose K divides it. The unrolled times are turned into action lists and timed
by the simulator as every backend's are (``solve.schedule_from_ticks``): only the simulator's
makespan counts.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from ..schedule.bounds import least_time_for_memory
from ..schedule.lanes import is_duplex, stage_lanes
from ..schedule.problem import Problem
from .cpsat import add_resources, memory_scale, settle_delay, solve_stoppable
from .list_rules import slow_copies
from .ticks import OpKey, TickModel

# pattern sizes tried, in order (K microbatches per period), each after a divisor that can hint
# it, with their shares of the time (K = 1 rarely wins where copies are slow: one offload per
# period saturates the channel; K = 2 and 4 won most often in the benchmark)
PATTERN_SIZES = (1, 2, 4, 3, 8, 6, 5)
SIZE_WEIGHTS = {1: 0.5, 2: 2.0, 4: 2.0, 3: 1.0, 8: 1.0, 6: 0.5, 5: 0.5}
# one microbatch's latency is estimated at this multiple of its forward-and-backward chain
LATENCY_FACTOR = 1.2
# the window (Q K microbatches) must leave at least this many periods of the problem unrolled
MIN_REPEATS = 2
# copies at least this slow (offload time over the microbatch's F + B + W on the chunk) for
# the periodic search to run: faster copies are the list rules' and the full model's ground
MIN_COPY_RATIO = 1.0
# the search ends when none of the first this many sizes (1, 2, 4) came within PROBE_NEAR of the
# incumbent, and the full model gets the time. At 8x32x1, 0.25p, 1x (best pattern 2% over) the
# full model then improved 199 -> 197; at 8x32x1, 0.5p, 2x a K = 4 pattern 0.7% over the
# incumbent (152 against 151) was followed by a K = 6 pattern of 149
PROBE_SIZES = 3
PROBE_NEAR = 0.01

PatternKey = tuple[str, int, int]  # (op, group, k)

log = logging.getLogger(__name__)


@dataclass
class Pattern:
    """A solved periodic pattern: start tick of every op of microbatches 0..K-1."""

    size: int  # K
    windows: list[int]  # Q per device
    period: int  # T, ticks
    makespan: int  # unrolled makespan the model planned, ticks
    crowded: bool = False  # some device's ops reach into the last period of its window
    starts: dict[PatternKey, int] = field(default_factory=dict)
    offloaded: set[tuple[int, int]] = field(default_factory=set)  # (group, k)


def applies(problem: Problem) -> bool:
    """Memory limited, offload allowed, and copies at least as slow as compute (on most of the
    activations that can move)."""
    if all(x is None for x in problem.memory_limits()):
        return False
    return slow_copies(problem, MIN_COPY_RATIO, strict=False)


def chain_ticks(problem: Problem, tm: TickModel) -> int:
    """Ticks of one microbatch alone: every F up the pipeline, every B down, then W of group 0."""
    return round_trip_ticks(problem, tm, 0)


def work_ticks(problem: Problem, tm: TickModel) -> int:
    """The busiest device's compute ticks per microbatch."""
    return max(
        sum(tm.t_f[s][c] + tm.t_b[s][c] + tm.t_w[s][c] for c in range(problem.num_chunks))
        for s in range(problem.num_stages)
    )


def windows_for(problem: Problem, tm: TickModel, size: int, rate: float) -> list[int] | None:
    """Q per device for pattern size K: the device's estimated span (its round trip, from the F
    of its lowest group to that group's W, and the period's spread of K microbatches) over the
    period at ``rate`` ticks per microbatch (the incumbent's: a pattern must beat it; a pattern
    that crowds its windows is retried with wider ones). Devices that share a copy channel share the whole pipeline's
    window. None when the widest window would not leave ``MIN_REPEATS`` periods of the problem."""
    period = max(1.0, size * rate)
    spread = (size - 1) / size
    whole = max(2, math.ceil(LATENCY_FACTOR * chain_ticks(problem, tm) / period + spread))
    shared = _shared_channel_devices(problem)
    out = []
    for s in range(problem.num_stages):
        if s in shared:
            out.append(whole)
            continue
        trip = round_trip_ticks(problem, tm, _lowest_group(problem, s))
        out.append(max(2, math.ceil(LATENCY_FACTOR * trip / period + spread)))
    if max(out) * size * MIN_REPEATS > problem.num_microbatches:
        return None
    return out


def round_trip_ticks(problem: Problem, tm: TickModel, low: int) -> int:
    """Ticks from the start of group ``low``'s F to the end of its W for one microbatch alone."""
    table = problem.group_table
    G = len(table)
    total = 0
    for g in range(low, G):
        s, c = table[g]
        total += tm.t_f[s][c] + tm.t_b[s][c]
        if g + 1 < G and table[g + 1][0] != s:
            ns, nc = table[g + 1]
            total += tm.comm[s][c] + tm.comm[ns][nc]
    s0, c0 = table[low]
    return total + tm.t_w[s0][c0]


def period_lower_bound(problem: Problem, tm: TickModel, size: int) -> int:
    """The least period (ticks) any pattern of ``size`` microbatches can have.

    Each device runs K microbatches' ops per period (``K x work``). And its memory over one period
    of the steady state: each activation is resident from its F end to its B end, at least the
    chain above it, or for an offloaded one at least its copies and its B; its W-part until its W
    ends; and while an F runs the level stays ``act`` below the limit (argument 4 of
    ``schedule.bounds``, per period: the copies of one period fit in T on its channel's lanes,
    each offloaded activation counting its offload plus its reload on one lane, the longer of
    the two with duplex lanes; at most K per chunk).
    """
    pb = problem
    table = pb.group_table
    G = len(table)
    limits = pb.memory_limits()
    m_f, m_w, ob = pb.cost("m_f"), pb.cost("m_w"), pb.cost("offload_bytes")
    if bool((pb.cost("m_b") > 0).any() or (m_w > 0).any()):
        return size * work_ticks(pb, tm)

    def lag(a: int, b: int) -> int:  # hop from group a to its neighbour b
        (sa, ca), (sb, _cb) = table[a], table[b]
        return tm.comm[sa][ca] if sa != sb else 0

    fwd_rest = [0] * G  # end of F_g to end of the last F
    down = [0] * G  # end of the last F to the start of B_g
    for g in range(G - 2, -1, -1):
        s1, c1 = table[g + 1]
        fwd_rest[g] = fwd_rest[g + 1] + lag(g, g + 1) + tm.t_f[s1][c1]
        down[g] = down[g + 1] + tm.t_b[s1][c1] + lag(g + 1, g)
    best = size * work_ticks(pb, tm)
    duplex = is_duplex(pb)
    for s in range(pb.num_stages):
        lim = limits[s]
        if lim is None:
            continue
        full = 0.0
        options: list[tuple[float, float, int]] = []
        f_longest = max(tm.t_f[s][c] for c in range(pb.num_chunks))
        for c in range(pb.num_chunks):
            g = pb.group_of(s, c)
            act, wpart = float(m_f[s, c]), -float(m_w[s, c])
            resident = fwd_rest[g] + down[g] + tm.t_b[s][c]
            full += size * (act * resident + max(wpart, 0.0) * tm.t_w[s][c] + act * tm.t_f[s][c])
            if pb.offload is not None and ob[s, c] > 0:
                trip = tm.t_off[s][c] + tm.t_rel[s][c]
                lane = max(tm.t_off[s][c], tm.t_rel[s][c]) if duplex else trip
                saving = float(ob[s, c]) * (resident - (trip + tm.t_b[s][c]) + f_longest)
                if saving > 0:
                    options.append((saving, float(lane), size))
        room = lim * (1 + 1e-9)
        t = max(best, math.ceil(least_time_for_memory(full, room, options) - 1e-6))
        if options and len(options) <= 3:
            # a period holds a whole number of offloads of each chunk: the least T at which
            # some whole counts fit the channel and save enough
            counts = list(itertools.product(*(range(size + 1) for _ in options)))
            while full - _best_whole_saving(options, counts, t) > room * t:
                t += 1
        best = max(best, t)
    return best


def _best_whole_saving(
    options: list[tuple[float, float, int]], counts: list[tuple[int, ...]], capacity: int
) -> float:
    best = 0.0
    for n in counts:
        if sum(k * trip for k, (_s, trip, _c) in zip(n, options, strict=True)) <= capacity:
            best = max(best, sum(k * sv for k, (sv, _t, _c) in zip(n, options, strict=True)))
    return best


def _lowest_group(problem: Problem, s: int) -> int:
    return min(problem.group_of(s, c) for c in range(problem.num_chunks))


def _shared_channel_devices(problem: Problem) -> set[int]:
    chan = problem.channel_of()
    return {s for s in range(problem.num_stages) if chan.count(chan[s]) > 1}


class _PatternModel:
    def __init__(
        self,
        problem: Problem,
        tm: TickModel,
        size: int,
        windows: list[int],
        cutoff: int,
        minimize_period: bool = False,
    ) -> None:
        pb = problem
        K, m = size, pb.num_microbatches
        p = pb.num_stages
        Q = max(windows)
        table = pb.group_table
        G = len(table)
        limits = pb.memory_limits()
        ob = pb.cost("offload_bytes")
        sc = memory_scale(pb)
        md = cp_model.CpModel()
        self.model = md
        self.size, self.windows = K, list(windows)
        work = work_ticks(pb, tm)
        t_max = max(K * work, cutoff // max(1, (m - 1) // K))
        t_min = period_lower_bound(pb, tm, K)
        self.T = T = md.new_int_var(min(t_min, t_max), t_max, "T")
        span = Q * t_max
        self.base: dict[PatternKey, cp_model.IntVar] = {}
        self.dur: dict[tuple[str, int], int] = {}
        self.off: dict[tuple[int, int], cp_model.IntVar] = {}
        inst: dict[tuple[str, int, int], cp_model.IntVar] = {}

        def at(op: str, g: int, j: int) -> cp_model.IntVar:
            """The start of op of group g for microbatch j of the window."""
            k, q = j % K, j // K
            if q == 0:
                return self.base[(op, g, k)]
            key = (op, g, j)
            if key not in inst:
                x = md.new_int_var(0, span + q * t_max, f"{op}{g}.{j}")
                md.add(x == self.base[(op, g, k)] + q * T)
                inst[key] = x
            return inst[key]

        for g, (s, c) in enumerate(table):
            for op in ("F", "B", "W"):
                d = tm.duration(op, s, c)
                self.dur[(op, g)] = d
                for k in range(K):
                    self.base[(op, g, k)] = md.new_int_var(0, span, f"{op}{g}.{k}")
        # every op of a device in pattern instance 0 lies within its window: from the device's
        # anchor (the F of its lowest group for k = 0, before all of them; 0 where devices share
        # a copy channel, whose copies meet across devices) to Q_s periods later
        shared = _shared_channel_devices(pb)
        # (anchor, op end, Q) of the ops that bound each device's window
        self.reach: list[tuple[cp_model.LinearExprT, cp_model.LinearExprT, int]] = []
        for g, (s, _c) in enumerate(table):
            anchor = 0 if s in shared else self.base[("F", _lowest_group(pb, s), 0)]
            for k in range(K):
                end = self.base[("W", g, k)] + self.dur[("W", g)]
                md.add(end <= anchor + windows[s] * T)
                self.reach.append((anchor, end, windows[s]))
        self.ends = [md.new_int_var(0, span, f"end{k}") for k in range(K)]
        use_off = pb.offload is not None
        dev: list[list[cp_model.IntervalVar]] = [[] for _ in range(p)]
        lanes = stage_lanes(pb)
        lane_ivs: dict[int, list[cp_model.IntervalVar]] = {}
        r_t: list[list[cp_model.LinearExprT]] = [[] for _ in range(p)]
        r_d: list[list[int]] = [[] for _ in range(p)]
        r_a: list[list[cp_model.LiteralT]] = [[] for _ in range(p)]
        m_f, m_b, m_w = pb.cost("m_f"), pb.cost("m_b"), pb.cost("m_w")
        for g, (s, c) in enumerate(table):
            lag_in = tm.comm[table[g - 1][0]][table[g - 1][1]] if g and table[g - 1][0] != s else 0
            lag_back = (
                tm.comm[table[g + 1][0]][table[g + 1][1]]
                if g + 1 < G and table[g + 1][0] != s
                else 0
            )
            df, db, dw = self.dur[("F", g)], self.dur[("B", g)], self.dur[("W", g)]
            movable = use_off and ob[s, c] > 0 and limits[s] is not None
            if movable:
                d_off, d_rel = tm.t_off[s][c], tm.t_rel[s][c]
                self.dur[("OFFLOAD", g)], self.dur[("RELOAD", g)] = d_off, d_rel
            for k in range(K):
                F, B, W = (self.base[(op, g, k)] for op in ("F", "B", "W"))
                if g:
                    md.add(self.base[("F", g - 1, k)] + self.dur[("F", g - 1)] + lag_in <= F)
                md.add(F + df <= B)
                if g + 1 < G:
                    md.add(self.base[("B", g + 1, k)] + self.dur[("B", g + 1)] + lag_back <= B)
                md.add(B + db <= W)
                md.add(self.ends[k] >= W + dw)
                for op, d in (("F", df), ("B", db), ("W", dw)):
                    later = self.base[(op, g, k + 1)] if k + 1 < K else self.base[(op, g, 0)] + T
                    md.add(later >= self.base[(op, g, k)] + d)
                if movable:
                    o = md.new_bool_var(f"o{g}.{k}")
                    self.off[(g, k)] = o
                    so = md.new_int_var(0, span, f"off{g}.{k}")
                    sr = md.new_int_var(0, span, f"rel{g}.{k}")
                    self.base[("OFFLOAD", g, k)], self.base[("RELOAD", g, k)] = so, sr
                    md.add(so >= F + df).only_enforce_if(o)
                    md.add(sr >= so + d_off).only_enforce_if(o)
                    md.add(sr + d_rel <= B).only_enforce_if(o)
                    md.add(so == 0).only_enforce_if(~o)
                    md.add(sr == 0).only_enforce_if(~o)
            for j in range(windows[s] * K):
                for op in ("F", "B", "W"):
                    x = at(op, g, j)
                    d = self.dur[(op, g)]
                    dev[s].append(md.new_fixed_size_interval_var(x, d, f"i{op}{g}.{j}"))
                if limits[s] is not None:
                    for op, d, delta in (("F", df, m_f), ("B", db, m_b), ("W", dw, m_w)):
                        r_t[s].append(at(op, g, j) + d)
                        r_d[s].append(round(float(delta[s, c]) * sc))
                        r_a[s].append(True)
                if movable:
                    o = self.off[(g, j % K)]
                    so, sr = at("OFFLOAD", g, j), at("RELOAD", g, j)
                    lane_ivs.setdefault(lanes[s][0], []).append(
                        md.new_optional_fixed_size_interval_var(so, d_off, o, "")
                    )
                    lane_ivs.setdefault(lanes[s][1], []).append(
                        md.new_optional_fixed_size_interval_var(sr, d_rel, o, "")
                    )
                    moved = round(float(ob[s, c]) * sc)
                    # the bytes leave at the settle point: conservatively, the stage's longest
                    # F after the copy's end (``cpsat.settle_delay``)
                    r_t[s] += [so + d_off + settle_delay(tm, pb, s), sr]
                    r_d[s] += [-moved, moved]
                    r_a[s] += [o, o]
        add_resources(md, dev, lane_ivs, limits, sc, r_t, r_d, r_a)
        self.makespan = md.new_int_var(0, cutoff, "makespan")
        for k in range(K):
            md.add(self.makespan >= ((m - 1 - k) // K) * T + self.ends[k])
        md.minimize(T if minimize_period else self.makespan)

    def add_hint(self, hint: Pattern) -> None:
        """Hint with a pattern of this size (a smaller one repeated: see ``repeated``)."""
        md = self.model
        md.add_hint(self.T, hint.period)
        for key, var in self.base.items():
            md.add_hint(var, hint.starts.get(key, 0))
        for gk, o in self.off.items():
            md.add_hint(o, gk in hint.offloaded)

    def pattern(self, solver: cp_model.CpSolver) -> Pattern:
        starts: dict[PatternKey, int] = {}
        offloaded = {gk for gk, o in self.off.items() if solver.boolean_value(o)}
        for (op, g, k), var in self.base.items():
            if op in ("OFFLOAD", "RELOAD") and (g, k) not in offloaded:
                continue
            starts[(op, g, k)] = int(solver.value(var))
        period = int(solver.value(self.T))
        return Pattern(
            size=self.size,
            windows=self.windows,
            period=period,
            crowded=any(
                int(solver.value(end)) > int(solver.value(anchor)) + (q - 1) * period
                for anchor, end, q in self.reach
            ),
            makespan=int(solver.value(self.makespan)),
            starts=starts,
            offloaded=offloaded,
        )


def repeated(pattern: Pattern, times: int) -> Pattern:
    """The same schedule as a pattern of ``times`` x K microbatches every ``times`` x T."""
    K, T = pattern.size, pattern.period
    starts = {
        (op, g, k + r * K): x + r * T
        for (op, g, k), x in pattern.starts.items()
        for r in range(times)
    }
    return Pattern(
        size=K * times,
        windows=pattern.windows,
        period=T * times,
        makespan=pattern.makespan,
        starts=starts,
        offloaded={(g, k + r * K) for g, k in pattern.offloaded for r in range(times)},
    )


def solve_pattern(
    problem: Problem,
    tm: TickModel,
    size: int,
    windows: int | list[int],
    *,
    cutoff: int,
    time_limit: float,
    workers: int = 1,
    seed: int = 0,
    hint: Pattern | None = None,
    stop: threading.Event | None = None,
    deadline: float | None = None,
    minimize_period: bool = False,
) -> Pattern | None:
    """The best pattern of ``size`` microbatches in ``time_limit`` whose unrolled makespan is at
    most ``cutoff`` ticks; None if none was found. ``deadline`` (a ``time.perf_counter()`` value)
    also caps the search once the model is built. ``windows``: Q per device (or one for all).
    ``minimize_period``: the least T instead (within the cutoff)."""
    if isinstance(windows, int):
        windows = [windows] * problem.num_stages
    model = _PatternModel(problem, tm, size, windows, cutoff, minimize_period)
    if hint is not None and size % hint.size == 0:
        model.add_hint(repeated(hint, size // hint.size))
    solver = cp_model.CpSolver()
    prm = solver.parameters
    if deadline is not None:
        time_limit = min(time_limit, deadline - time.perf_counter())
    prm.max_time_in_seconds = max(0.01, time_limit)
    prm.num_workers = max(1, workers)
    prm.random_seed = seed
    prm.expand_reservoir_constraints = False
    t0 = time.perf_counter()
    code = solve_stoppable(solver, model.model, None, stop)
    found = model.pattern(solver) if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    log.debug(
        "pattern K=%d Q=%s cutoff=%d: %s in %.2f s%s",
        size,
        windows,
        cutoff,
        solver.status_name(code),
        time.perf_counter() - t0,
        "" if found is None else f" (T={found.period}, makespan {found.makespan} ticks)",
    )
    return found


def unrolled(
    problem: Problem, tm: TickModel, pattern: Pattern
) -> tuple[dict[OpKey, int], dict[OpKey, int]]:
    """Start and end ticks of every op of the problem's m microbatches under ``pattern``."""
    table = problem.group_table
    K, T = pattern.size, pattern.period
    starts: dict[OpKey, int] = {}
    ends: dict[OpKey, int] = {}
    for (op, g, k), x in pattern.starts.items():
        s, c = table[g]
        d = tm.duration(op, s, c)
        for j in range(k, problem.num_microbatches, K):
            t = x + ((j - k) // K) * T
            starts[(op, s, c, j)] = t
            ends[(op, s, c, j)] = t + d
    return starts, ends


def search(
    problem: Problem,
    tm: TickModel,
    *,
    incumbent: float,
    lower_bound: float,
    deadline: float,
    workers: int = 1,
    seed: int = 0,
    stop: threading.Event | None = None,
) -> Iterator[Pattern]:
    """Patterns of growing size, each better (planned) than the last and than ``incumbent``
    (seconds), until ``deadline`` (a ``time.perf_counter()`` value) or ``stop``."""
    m = problem.num_microbatches
    chain = chain_ticks(problem, tm)
    best_ticks = math.floor(incumbent / tm.tick + 1e-6)
    rate_lo = max(float(work_ticks(problem, tm)), (lower_bound / tm.tick - chain) / max(1, m - 1))
    sizes = [k for k in PATTERN_SIZES if 2 * k <= m]
    found: dict[int, Pattern] = {}
    start_ticks = best_ticks
    for i, size in enumerate(sizes):
        left = deadline - time.perf_counter()
        if left <= 0 or (stop is not None and stop.is_set()):
            return
        nearest = min((p.makespan for p in found.values()), default=math.inf)
        if i >= PROBE_SIZES and nearest > start_ticks * (1 + PROBE_NEAR):
            log.debug("no pattern of %s came near %d ticks: search ended", sizes[:i], start_ticks)
            return
        rate_hi = max(rate_lo, (best_ticks - chain) / max(1, m - 1))
        windows = windows_for(problem, tm, size, rate_hi)
        if windows is None:
            continue
        if ((m - 1) // size) * period_lower_bound(problem, tm, size) + chain >= best_ticks:
            log.debug("pattern K=%d cannot beat %d ticks: skipped", size, best_ticks)
            continue
        hints = [found[d] for d in found if size % d == 0]
        hint = min(hints, key=lambda h: h.makespan) if hints else None
        share = left * SIZE_WEIGHTS[size] / sum(SIZE_WEIGHTS[k] for k in sizes[i:])
        pat = solve_pattern(
            problem,
            tm,
            size,
            windows,
            # a hint (a smaller pattern repeated) must stay feasible: its own makespan is the cutoff
            cutoff=max(best_ticks, hint.makespan) if hint is not None else 2 * best_ticks,
            time_limit=share,
            workers=workers,
            seed=seed,
            hint=hint,
            stop=stop,
            deadline=deadline,
        )
        if pat is None:
            continue
        found[size] = pat
        if pat.makespan >= best_ticks:
            continue  # no better than its hint
        if pat.crowded and time.perf_counter() < deadline:
            # the windows may have cut off a shorter period with a longer latency: one more try
            wider = solve_pattern(
                problem,
                tm,
                size,
                [q + 1 for q in windows],
                cutoff=pat.makespan,
                time_limit=min(deadline - time.perf_counter(), share / 2),
                workers=workers,
                seed=seed,
                hint=pat,
                stop=stop,
                deadline=deadline,
            )
            if wider is not None and wider.makespan < pat.makespan:
                pat = wider
                found[size] = pat
        best_ticks = min(best_ticks, pat.makespan)
        yield pat
