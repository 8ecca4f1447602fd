"""Shared helpers of the V-shape and offload generators.

- ``fill_w_slots``: per-stage slot positions of F and B (a building block repeated per
  microbatch) with each W put into the first free slot after its B.
- ``order_peak``: a stage's peak activation implied by its order alone (a device runs its compute
  ops one after another and memory changes when they end, so it is a prefix sum of the order).
- ``list_schedule``: a greedy event-driven order under per-stage memory caps (the memory-aware
  base of AdaOffload); admission control keeps it from stalling.
- ``offload_to_fit``: AdaOffload's loop: while a stage's memory exceeds its limit, offload live
  activations at the violation (OFFLOAD right after the F, RELOAD listed so that its copy ends
  before the B: a transfer is issued when the compute action listed before it ends), simulate
  again, repeat; ``prune_offloads`` then drops the offloads the fitted plan does not need.
- ``with_transfers``, ``live_windows``: place transfers for a chosen set of activations on a
  simulated timeline (``TransferPlacer`` for many sets on one timeline); the lifetimes and
  reload issue times PipeOffload's selection ranks by.
- ``below_one_activation``: limits no schedule can meet (a reason for ``NotApplicable``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..problem import Problem
from ..schedule import Action
from ..simulator import MEMORY_TOLERANCE, MemoryCurve, SimResult, simulate
from ..units import distinct
from ._deadline import check_deadline
from ._memory_bound import surely_over_limit

Rows = list[list[Action]]
Key = tuple[int, int, int]  # (stage, microbatch, chunk)


# ---- orders ------------------------------------------------------------------------------------


def drop_microbatches(rows: Sequence[Sequence[Action]], m: int) -> Rows:
    """The orders without the ops of microbatches ``>= m`` (a schedule built for more)."""
    return [[a for a in row if a.mb < m] for row in rows]


def order_peak(problem: Problem, row: Sequence[Action], stage: int) -> float:
    """Peak activation of one stage implied by its compute order (no offload)."""
    m_f, m_b, m_w = problem.cost("m_f"), problem.cost("m_b"), problem.cost("m_w")
    cur = peak = 0.0
    for a in row:
        if a.op == "F":
            cur += m_f[stage, a.chunk]
        elif a.op == "B":
            cur += m_b[stage, a.chunk]
        elif a.op == "W":
            cur += m_w[stage, a.chunk]
        elif a.op == "BW":
            cur += m_b[stage, a.chunk] + m_w[stage, a.chunk]
        peak = max(peak, cur)
    return peak


def fill_w_slots(slots: Sequence[Sequence[tuple[int, Action]]]) -> list[list[tuple[int, Action]]]:
    """Slots of F and B ops plus a W for each B in the first free slot after it (oldest waiting W
    first); W that find no free slot go after the last one. Sorted by slot per stage."""
    out: list[list[tuple[int, Action]]] = []
    for stage_slots in slots:
        taken = sorted(stage_slots, key=lambda x: x[0])
        if len({t for t, _ in taken}) != len(taken):
            raise ValueError("two ops share a slot")
        res: list[tuple[int, Action]] = []
        pending: list[Action] = []
        i = 0
        t = taken[0][0] if taken else 0
        last = taken[-1][0] if taken else -1
        while t <= last:
            if i < len(taken) and taken[i][0] == t:
                a = taken[i][1]
                res.append((t, a))
                if a.op == "B":
                    pending.append(Action("W", a.mb, a.chunk))
                i += 1
            elif pending:
                res.append((t, pending.pop(0)))
            t += 1
        for a in pending:
            t += 1
            res.append((t, a))
        out.append(res)
    return out


def below_one_activation(problem: Problem) -> str | None:
    """Why no schedule at all fits, when a stage's limit is below one chunk's activation (it is
    all on the device when its F ends; an offload frees it only when the copy ends) or, with no
    offload allowed, below one microbatch's activations over the stage's chunks (all are held
    when its last chunk's F ends, before any of its B)."""
    m_f = problem.cost("m_f")
    for s, lim in enumerate(problem.memory_limits()):
        if lim is None:
            continue
        slack = lim * (1 + MEMORY_TOLERANCE) + 1e-6
        if float(m_f[s].max()) > slack:
            have, need = distinct(lim, float(m_f[s].max()), 4)
            return (
                f"stage {s}'s memory limit {have} is below one activation "
                f"(m_f {need}), which no schedule or offload avoids"
            )
        if problem.offload is None and float(m_f[s].sum()) > slack:
            have, need = distinct(lim, float(m_f[s].sum()), 4)
            return (
                f"stage {s}'s memory limit {have} is below one microbatch's activations over "
                f"its {problem.num_chunks} chunks ({need}) and offload is null"
            )
    return None


# ---- offload plans -----------------------------------------------------------------------------


@dataclass
class OffloadPlan:
    """Which activations move to the host, and the resulting orders and simulation."""

    rows: Rows
    offloaded: list[Key] = field(default_factory=list)
    result: SimResult | None = None


RELOAD_MARGIN = 1.05  # a reload is issued at least this many reload times before its B


def _reload_issue(ends: Sequence[float], i_f: int, i_b: int, b_start: float, r: float) -> int:
    """Index of the compute action after which a reload is listed: the last one before the B
    that ends at least ``RELOAD_MARGIN`` reload times before the B starts (else right after F)."""
    k = i_b - 1
    while k > i_f and ends[k] > b_start - r * RELOAD_MARGIN - 1e-12 * max(1.0, b_start):
        k -= 1
    return k


def with_transfers(
    problem: Problem, rows: Sequence[Sequence[Action]], chosen: Sequence[Key], res: SimResult
) -> Rows:
    """``rows`` with OFFLOAD right after each chosen F and its RELOAD listed as late as still
    hides the copy (``_reload_issue``) on the timeline ``res`` of a previous simulation."""
    return TransferPlacer(problem, rows, res).place(chosen)


class TransferPlacer:
    """``with_transfers`` for one pair of orders and timeline, many choices: what depends only
    on the orders and the timeline (per stage: compute order, op ends, positions) is made once,
    on first use."""

    def __init__(self, problem: Problem, rows: Sequence[Sequence[Action]], res: SimResult) -> None:
        assert res.timeline is not None
        self.problem = problem
        self.rows = rows
        self.timeline = res.timeline
        self._comp: dict[int, list[Action]] = {}
        # per stage: op ends in order, op starts by position, position of each action
        self._times: dict[int, tuple[list[float], list[float], dict[Action, int]]] = {}
        self._reload: dict[tuple[int, int], float] = {}

    def compute(self, s: int) -> list[Action]:
        comp = self._comp.get(s)
        if comp is None:
            comp = self._comp[s] = [a for a in self.rows[s] if a.is_compute]
        return comp

    def _stage_times(self, s: int) -> tuple[list[float], list[float], dict[Action, int]]:
        got = self._times.get(s)
        if got is None:
            comp = self.compute(s)
            old = {a: (st, en) for a, st, en in self.timeline.compute_rows(s)}
            starts = [old[a][0] for a in comp]
            ends = [old[a][1] for a in comp]
            got = self._times[s] = (ends, starts, {a: i for i, a in enumerate(comp)})
        return got

    def place(self, chosen: Sequence[Key]) -> Rows:
        by_stage: dict[int, list[Key]] = {}
        for k in chosen:
            by_stage.setdefault(k[0], []).append(k)
        out: Rows = []
        for s in range(len(self.rows)):
            keys = by_stage.get(s)
            comp = self.compute(s)
            if not keys:
                out.append(list(comp))
                continue
            ends, starts, index = self._stage_times(s)
            # (Action is a NamedTuple: plain tuples find it in ``index``, and are cheaper)
            after: dict[int, list[Action]] = {}
            reloads: list[tuple[int, int, int, int]] = []
            for _s, mb, c in keys:
                i_f = index[("F", mb, c)]  # type: ignore[index]
                after.setdefault(i_f, []).append(Action("OFFLOAD", mb, c))
                i_b = index.get(("B", mb, c), index.get(("BW", mb, c)))  # type: ignore[call-overload]
                assert i_b is not None
                reloads.append((i_b, mb, c, i_f))
            reloads.sort()
            for i_b, mb, c, i_f in reloads:
                r = self._reload.get((s, c))
                if r is None:
                    r = self._reload[(s, c)] = self.problem.reload_time(s, c)
                at = _reload_issue(ends, i_f, i_b, starts[i_b], r)
                after.setdefault(at, []).append(Action("RELOAD", mb, c))
            row_out: list[Action] = []
            prev = 0
            for i in sorted(after):
                row_out.extend(comp[prev : i + 1])
                extra = after[i]
                row_out.extend(x for x in extra if x.op == "OFFLOAD")
                row_out.extend(x for x in extra if x.op == "RELOAD")
                prev = i + 1
            row_out.extend(comp[prev:])
            out.append(row_out)
        return out


def live_windows(
    problem: Problem, res: SimResult, s: int
) -> dict[tuple[int, int], tuple[float, float, float]]:
    """Per (microbatch, chunk) of stage s on the timeline: (F end, B start, reload issue time)."""
    assert res.timeline is not None
    comp = res.timeline.compute_rows(s)
    ends = [en for _a, _st, en in comp]
    idx_f: dict[tuple[int, int], int] = {}
    out: dict[tuple[int, int], tuple[float, float, float]] = {}
    for i, (a, st, _en) in enumerate(comp):
        key = (a.mb, a.chunk)
        if a.op == "F":
            idx_f[key] = i
        elif a.op in ("B", "BW") and key in idx_f:
            i_f = idx_f[key]
            k = _reload_issue(ends, i_f, i, st, problem.reload_time(s, a.chunk))
            out[key] = (comp[i_f][2], st, ends[k])
    return out


# (rank position, offload-end time, reload issue time, key, bytes freed)
_Cand = tuple[int, float, float, Key, float]


def _fit_candidates(
    s: int,
    wins: dict[tuple[int, int], tuple[float, float, float]],
    chosen_set: set[Key],
    ob: np.ndarray,
    o_time: list[list[float]],
    r_time: list[list[float]],
    rank: Callable[[Key, float, float], tuple[float, ...]] | None,
    min_window_factor: float,
) -> list[_Cand]:
    """Stage s's activations ``offload_to_fit`` may still choose, with their rank position: 0 is
    the highest ``rank`` (ties: the earlier in ``wins``, the order the plain scan met them)."""
    scored: list[tuple[tuple[float, ...], float, float, Key, float]] = []
    for (mb, c), (f_end, b_start, issue) in wins.items():
        key = (s, mb, c)
        if key in chosen_set or ob[s, c] <= 0:
            continue
        o, r = o_time[s][c], r_time[s][c]
        if b_start - f_end < min_window_factor * (o + r):
            continue
        score = rank(key, f_end, b_start) if rank else (b_start - f_end,)
        scored.append((score, f_end + o, issue, key, float(ob[s, c])))
    order = sorted(range(len(scored)), key=lambda k: scored[k][0], reverse=True)  # stable
    return [(pos, *scored[k][1:]) for pos, k in enumerate(order)]


def _pick_at_violations(
    curve: MemoryCurve, over: list[int], lim: float, tol: float, cands: list[_Cand]
) -> Iterator[Key]:
    """AdaOffload's choice on one stage, in time order of its violations ``over`` (indices into
    the memory curve): while the excess at a violation, less what the choices so far free
    there, stays above ``tol``, choose the best-ranked candidate whose copy can be out by then
    (offload end <= t) and whose reload is issued after (t_next <= issue).

    Equivalent to scanning every candidate at every step, in O(n log n): times only grow, so a
    candidate whose copy is out stays so, one whose reload is issued before t_next stays
    excluded, and a choice that stops covering a violation never covers a later one.
    """
    by_lo = sorted(range(len(cands)), key=lambda k: cands[k][1])
    ptr = 0
    ready: list[tuple[int, int]] = []  # (rank position, candidate index)
    freed: dict[int, float] = {}  # chosen candidates still covering, in the order chosen
    expiry: list[tuple[float, int]] = []  # (reload issue, candidate index) of ``freed``
    times, levels = curve.times, curve.bytes
    for i in over:
        t = float(times[i])
        t_next = float(times[i + 1]) if i + 1 < times.size else t
        while expiry and not (t_next <= expiry[0][0] + 1e-12):
            del freed[heapq.heappop(expiry)[1]]
        excess = float(levels[i]) - lim
        excess -= sum(freed.values())
        while ptr < len(by_lo) and cands[by_lo[ptr]][1] <= t + 1e-12:
            k = by_lo[ptr]
            heapq.heappush(ready, (cands[k][0], k))
            ptr += 1
        while excess > tol:
            while ready and not (t_next <= cands[ready[0][1]][2] + 1e-12):
                heapq.heappop(ready)
            if not ready:
                break
            k = heapq.heappop(ready)[1]
            _pos, _lo, hi, key, b = cands[k]
            freed[k] = b
            heapq.heappush(expiry, (hi, k))
            excess -= b
            yield key


def offload_to_fit(
    problem: Problem,
    base: Sequence[Sequence[Action]],
    rank: Callable[[Key, float, float], tuple[float, ...]] | None = None,
    min_window_factor: float = 1.0,
    max_rounds: int = 40,
    prune_budget: int = 0,
    base_result: SimResult | None = None,
) -> tuple[OffloadPlan | None, str]:
    """Offload activations until every stage fits its memory limit (AdaOffload's loop).

    Each round, for each stage over its limit: walk its violations in time order and, while the
    excess (less what this round's choices already free there) stays positive, choose the live
    activation with the highest ``rank`` (default: longest lifespan, F end to B start) among
    those whose window hides the round trip (``B start - F end >= min_window_factor * (offload
    + reload)``), whose copy out can be done by then and whose reload is issued after. Then the
    transfers are rebuilt on the new timeline and simulated again. A fitting plan is then pruned
    (``prune_offloads``, at most ``prune_budget`` simulations). Returns the plan, or None and
    the reason. ``base_result`` is the simulation of ``base`` when the caller has it already.
    """
    limits = problem.memory_limits()
    rows = [[a for a in r if a.is_compute] for r in base]
    res = base_result if base_result is not None else simulate(problem, rows)
    if res.timeline is None:
        return None, "the base order does not run: " + "; ".join(
            v.message for v in res.evaluation.violations[:2]
        )
    if res.feasible:
        return OffloadPlan(rows, [], res), ""
    if problem.offload is None:
        return None, "over the memory limit and the problem allows no offload (offload: null)"
    ob = problem.cost("offload_bytes")
    v = problem.num_chunks
    o_time = [[problem.offload_time(s, c) for c in range(v)] for s in range(problem.num_stages)]
    r_time = [[problem.reload_time(s, c) for c in range(v)] for s in range(problem.num_stages)]
    chosen: list[Key] = []
    chosen_set: set[Key] = set()
    for _round in range(max_rounds):
        check_deadline()
        assert res.timeline is not None
        added = 0
        for s, lim in enumerate(limits):
            if lim is None:
                continue
            curve = res.memory[s]
            tol = lim * MEMORY_TOLERANCE + 1e-6
            over = np.nonzero(curve.bytes > lim + tol)[0]
            if over.size == 0:
                continue
            cands = _fit_candidates(
                s,
                live_windows(problem, res, s),
                chosen_set,
                ob,
                o_time,
                r_time,
                rank,
                min_window_factor,
            )
            for key in _pick_at_violations(curve, over.tolist(), lim, tol, cands):
                chosen.append(key)
                chosen_set.add(key)
                added += 1
        if added == 0:
            worst = res.evaluation.violations[0].message if res.evaluation.violations else ""
            return None, "no live activation at the peak can be offloaded in time" + (
                f" ({worst})" if worst else ""
            )
        res = simulate(problem, with_transfers(problem, rows, chosen, res))
        if res.timeline is None:
            return None, "offloading made the order stall: " + "; ".join(
                v.message for v in res.evaluation.violations[:2]
            )
        if res.feasible:
            return prune_offloads(problem, rows, chosen, res, prune_budget), ""
    return None, f"still over the memory limit after {max_rounds} offload rounds"


def _moved(p: int, chosen: Sequence[Key]) -> list[set[tuple[int, int]]]:
    out: list[set[tuple[int, int]]] = [set() for _ in range(p)]
    for s, mb, c in chosen:
        out[s].add((mb, c))
    return out


def prune_offloads(
    problem: Problem, rows: Rows, chosen: list[Key], res: SimResult, budget: int
) -> OffloadPlan:
    """Drop offloads the fitted plan does not need: try removing runs of them (halving the run
    length down to one, latest chosen first), then each one alone from the timed rows, and keep
    a removal when the schedule still fits and is no slower. At most ``budget`` simulations."""
    assert res.timeline is not None and res.makespan is not None
    cur = list(chosen)
    best_ms = res.makespan
    sims = 0
    size = max(1, len(cur) // 2)
    while size >= 1 and sims < budget and cur:
        i = len(cur)
        while i > 0 and sims < budget:
            check_deadline()
            lo = max(0, i - size)
            trial = cur[:lo] + cur[i:]
            sims += 1
            if surely_over_limit(problem, rows, _moved(problem.num_stages, trial)):
                i = lo  # cannot fit whatever its timing (counted as a simulation all the same)
                continue
            r = simulate(problem, with_transfers(problem, rows, trial, res))
            if r.feasible and r.makespan is not None and r.makespan <= best_ms * (1 + 1e-9):
                cur, res = trial, r
            i = lo
        size //= 2
    # then each one alone, taken out of the timed rows as they are (where an offload's bytes
    # leave only at its settle point, one may make no room the limit needs)
    for key in list(reversed(cur)):
        if sims >= budget:
            break
        check_deadline()
        assert res.timeline is not None and res.makespan is not None
        s_, mb, c = key
        rows_now = [list(r) for r in res.timeline.actions]
        rows_now[s_] = [
            a
            for a in rows_now[s_]
            if not (a.op in ("OFFLOAD", "RELOAD") and a.mb == mb and a.chunk == c)
        ]
        sims += 1
        r = simulate(problem, rows_now)
        if r.feasible and r.makespan is not None and r.makespan <= res.makespan * (1 + 1e-9):
            cur = [k for k in cur if k != key]
            res = r
    assert res.timeline is not None
    return OffloadPlan(res.timeline.actions, cur, res)


# ---- memory-capped list scheduling -------------------------------------------------------------


def list_schedule(
    problem: Problem,
    caps: Sequence[float | None],
    fill_w: bool = True,
    f_before_b: bool = False,
    w_caps: Sequence[float | None] | None = None,
) -> Rows | None:
    """A greedy event-driven order under per-stage activation caps (None = unlimited).

    Each device, whenever it is free, starts the first of: a ready B (earliest microbatch,
    deepest layer group first; F first instead when ``f_before_b``), a ready F that fits under its
    cap (deepest group first), a W when an F is held back by memory or (``fill_w``) when nothing
    else is ready, or before anything while the stage holds more than its ``w_caps`` entry or
    before an F that would take it there (so the memory only a W frees stays under it; offload
    can move the rest). A microbatch is admitted to a device (its first chunk there) only if the
    activations of every chunk of every admitted microbatch still fit the cap, so the oldest
    microbatch can always finish: the order never stalls when each cap holds one microbatch.
    Returns None when a cap is below one microbatch's activation on its stage.
    """
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    G = p * v
    table = problem.group_table
    t_f, t_b, t_w = (problem.cost(n).tolist() for n in ("t_f", "t_b", "t_w"))
    t_comm = problem.cost("t_comm").tolist()
    m_f_a, m_b_a = problem.cost("m_f"), problem.cost("m_b")
    m_f, m_b, m_w = m_f_a.tolist(), m_b_a.tolist(), problem.cost("m_w").tolist()
    grp = [[problem.group_of(s, c) for c in range(v)] for s in range(p)]
    # chunks of a device in dataflow order (the first one admits a microbatch)
    chunk_order = [sorted(range(v), key=grp[s].__getitem__) for s in range(p)]
    # chunks of a device, deepest layer group first (the order B and F are looked for in)
    deep_first = [sorted(range(v), key=grp[s].__getitem__, reverse=True) for s in range(p)]
    foot_a = np.maximum(m_f_a, m_f_a + m_b_a)  # most a (stage, chunk) activation ever holds
    full = foot_a.sum(axis=1).tolist()
    foot = foot_a.tolist()
    capv = [float("inf") if c is None else float(c) * (1 + 1e-12) + 1e-12 for c in caps]
    if any(full[s] > capv[s] for s in range(p)):
        return None
    wcapv = [
        float("inf") if w_caps is None or w_caps[s] is None else float(w_caps[s])  # type: ignore[arg-type]
        for s in range(p)
    ]
    inf = float("inf")
    # neighbours of (s, c) in the dataflow: (stage, chunk, lag of the hop) or None at the ends
    nxt: list[list[tuple[int, int, float] | None]] = [[None] * v for _ in range(p)]
    prv: list[list[tuple[int, int, float] | None]] = [[None] * v for _ in range(p)]
    for s in range(p):
        for c in range(v):
            g = grp[s][c]
            if g < G - 1:
                ns, nc = table[g + 1]
                nxt[s][c] = (ns, nc, float(t_comm[s][c]) if ns != s else 0.0)
            if g > 0:
                ps, pc = table[g - 1]
                prv[s][c] = (ps, pc, float(t_comm[s][c]) if ps != s else 0.0)
    f_end = [[[inf] * m for _ in range(v)] for _ in range(p)]
    b_end = [[[inf] * m for _ in range(v)] for _ in range(p)]
    nf = [[0] * v for _ in range(p)]
    nb = [[0] * v for _ in range(p)]
    pend_w: list[list[Action]] = [[] for _ in range(p)]
    mem = [0.0] * p
    reserved = [0.0] * p  # activation still to come for admitted microbatches
    free_at = [0.0] * p
    rows: Rows = [[] for _ in range(p)]
    events: list[float] = [0.0]
    # a free device whose ``choose`` found nothing waits (``idle``) until one of its wake-ups:
    # the end of one of its own ops or an input arriving from a neighbour (what ``choose`` reads
    # of other devices); nothing else can change its choice, so it is not asked again before
    # (the same orders, far fewer ``choose`` calls: 828k -> about 2 per op at 8 x 32 x 8)
    wake: list[list[float]] = [[] for _ in range(p)]
    idle = [False] * p
    total = 3 * p * v * m
    n_done = 0

    def start(s: int, a: Action, T: float) -> None:
        nonlocal n_done
        c = a.chunk
        if a.op == "F":
            d = t_f[s][c]
            f_end[s][c][a.mb] = T + d
            nf[s][c] += 1
            mem[s] += m_f[s][c]
            reserved[s] -= foot[s][c]
            hop = nxt[s][c]
            if hop is not None:
                heapq.heappush(events, T + d + hop[2])
                heapq.heappush(wake[hop[0]], T + d + hop[2])
        elif a.op == "B":
            d = t_b[s][c]
            b_end[s][c][a.mb] = T + d
            nb[s][c] += 1
            mem[s] += m_b[s][c]
            pend_w[s].append(Action("W", a.mb, c))
            hop = prv[s][c]
            if hop is not None:
                heapq.heappush(events, T + d + hop[2])
                heapq.heappush(wake[hop[0]], T + d + hop[2])
        else:
            d = t_w[s][c]
            mem[s] += m_w[s][c]
        rows[s].append(a)
        free_at[s] = T + d
        heapq.heappush(events, T + d)
        heapq.heappush(wake[s], T + d)
        n_done += 1

    def choose(s: int, T: float) -> Action | None:
        eps = 1e-12 * max(1.0, T)
        pend = pend_w[s]
        if pend and mem[s] > wcapv[s] * (1 + 1e-12):
            return pend.pop(0)
        b_mb = b_c = -1
        for c in deep_first[s]:
            mb = nb[s][c]
            if mb >= m or f_end[s][c][mb] > T + eps:
                continue
            hop = nxt[s][c]
            if hop is not None and b_end[hop[0]][hop[1]][mb] + hop[2] > T + eps:
                continue
            if mem[s] + max(0.0, m_b[s][c]) > capv[s]:
                continue
            if b_mb < 0 or mb < b_mb:
                b_mb, b_c = mb, c
        f_mb = f_c = -1
        f_blocked = False
        for c in deep_first[s]:
            mb = nf[s][c]
            if mb >= m:
                continue
            hop = prv[s][c]
            if hop is not None and f_end[hop[0]][hop[1]][mb] + hop[2] > T + eps:
                continue
            # (mem + reserved) + full: the sum's order matters to the last bit
            need = mem[s] + reserved[s] + full[s] if c == chunk_order[s][0] else mem[s] + foot[s][c]
            if need > capv[s]:
                f_blocked = True
                continue
            f_mb, f_c = mb, c
            break
        if f_mb >= 0 and pend and mem[s] + m_f[s][f_c] > wcapv[s] * (1 + 1e-12):
            return pend.pop(0)
        if f_before_b and f_mb >= 0:
            return Action("F", f_mb, f_c)
        if b_mb >= 0:
            return Action("B", b_mb, b_c)
        if f_mb >= 0:
            return Action("F", f_mb, f_c)
        if pend and (f_blocked or fill_w or all(nb[s][c] >= m for c in range(v))):
            return pend.pop(0)
        return None

    while events:
        T = heapq.heappop(events)
        while events and events[0] <= T:
            heapq.heappop(events)
        # (the tolerance ``choose`` compares times with: a wake-up within it is due)
        due = T + 1e-12 * max(1.0, T)
        for s in range(p):
            if free_at[s] > due:
                continue
            wk = wake[s]
            if wk and wk[0] <= due:
                while wk and wk[0] <= due:
                    heapq.heappop(wk)
                idle[s] = False
            if idle[s]:
                continue
            while free_at[s] <= due:
                a = choose(s, T)
                if a is None:
                    idle[s] = True
                    break
                if a.op == "F" and a.chunk == chunk_order[s][0]:
                    reserved[s] += full[s]
                start(s, a, T)
        if n_done == total:
            return rows
    return None
