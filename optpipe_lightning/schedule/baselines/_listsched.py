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
  simulated timeline; the lifetimes and reload issue times PipeOffload's selection ranks by.
- ``below_one_activation``: limits no schedule can meet (a reason for ``NotApplicable``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..problem import Problem
from ..schedule import Action
from ..simulator import MEMORY_TOLERANCE, SimResult, simulate

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
            return (
                f"stage {s}'s memory limit {lim:.4g} is below one activation "
                f"(m_f {float(m_f[s].max()):.4g}), which no schedule or offload avoids"
            )
        if problem.offload is None and float(m_f[s].sum()) > slack:
            return (
                f"stage {s}'s memory limit {lim:.4g} is below one microbatch's activations over "
                f"its {problem.num_chunks} chunks ({float(m_f[s].sum()):.4g}) and offload is null"
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
    assert res.timeline is not None
    by_stage: dict[int, list[Key]] = {}
    for k in chosen:
        by_stage.setdefault(k[0], []).append(k)
    out: Rows = []
    for s, row in enumerate(rows):
        keys = by_stage.get(s)
        comp = [a for a in row if a.is_compute]
        if not keys:
            out.append(comp)
            continue
        old = {a: (st, en) for a, st, en in res.timeline.compute_rows(s)}
        ends = [old[a][1] for a in comp]
        index = {a: i for i, a in enumerate(comp)}
        after: dict[int, list[Action]] = {}
        for _s, mb, c in keys:
            after.setdefault(index[Action("F", mb, c)], []).append(Action("OFFLOAD", mb, c))
        reloads: list[tuple[int, int, int]] = []
        for _s, mb, c in keys:
            i_b = index.get(Action("B", mb, c), index.get(Action("BW", mb, c)))
            assert i_b is not None
            reloads.append((i_b, mb, c))
        reloads.sort()
        for i_b, mb, c in reloads:
            i_f = index[Action("F", mb, c)]
            at = _reload_issue(ends, i_f, i_b, old[comp[i_b]][0], problem.reload_time(s, c))
            after.setdefault(at, []).append(Action("RELOAD", mb, c))
        row_out: list[Action] = []
        for i, a in enumerate(comp):
            row_out.append(a)
            extra = after.get(i)
            if extra:
                row_out.extend(x for x in extra if x.op == "OFFLOAD")
                row_out.extend(x for x in extra if x.op == "RELOAD")
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
    chosen: list[Key] = []
    chosen_set: set[Key] = set()
    for _round in range(max_rounds):
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
            wins = live_windows(problem, res, s)
            planned: list[tuple[float, float, float]] = []  # (from, to, bytes freed)
            for i in over.tolist():
                t = float(curve.times[i])
                t_next = float(curve.times[i + 1]) if i + 1 < curve.times.size else t
                excess = float(curve.bytes[i]) - lim
                excess -= sum(
                    b for f0, f1, b in planned if f0 <= t + 1e-12 and t_next <= f1 + 1e-12
                )
                while excess > tol:
                    best: tuple[tuple[float, ...], Key, float, float] | None = None
                    for (mb, c), (f_end, b_start, issue) in wins.items():
                        key = (s, mb, c)
                        if key in chosen_set or ob[s, c] <= 0:
                            continue
                        o, r = problem.offload_time(s, c), problem.reload_time(s, c)
                        if b_start - f_end < min_window_factor * (o + r):
                            continue
                        lo, hi = f_end + o, issue
                        if not (lo <= t + 1e-12 and t_next <= hi + 1e-12):
                            continue
                        score = rank(key, f_end, b_start) if rank else (b_start - f_end,)
                        if best is None or score > best[0]:
                            best = (score, key, lo, hi)
                    if best is None:
                        break
                    _, key, lo, hi = best
                    chosen.append(key)
                    chosen_set.add(key)
                    planned.append((lo, hi, float(ob[s, key[2]])))
                    excess -= float(ob[s, key[2]])
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


def prune_offloads(
    problem: Problem, rows: Rows, chosen: list[Key], res: SimResult, budget: int
) -> OffloadPlan:
    """Drop offloads the fitted plan does not need: try removing runs of them (halving the run
    length down to one, latest chosen first) and keep a removal when the schedule still fits
    and is no slower. At most ``budget`` simulations."""
    assert res.timeline is not None and res.makespan is not None
    cur = list(chosen)
    best_ms = res.makespan
    sims = 0
    size = max(1, len(cur) // 2)
    while size >= 1 and sims < budget and cur:
        i = len(cur)
        while i > 0 and sims < budget:
            lo = max(0, i - size)
            trial = cur[:lo] + cur[i:]
            r = simulate(problem, with_transfers(problem, rows, trial, res))
            sims += 1
            if r.feasible and r.makespan is not None and r.makespan <= best_ms * (1 + 1e-9):
                cur, res = trial, r
            i = lo
        size //= 2
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
    t_f, t_b, t_w = problem.cost("t_f"), problem.cost("t_b"), problem.cost("t_w")
    t_comm = problem.cost("t_comm")
    m_f, m_b, m_w = problem.cost("m_f"), problem.cost("m_b"), problem.cost("m_w")
    grp = [[problem.group_of(s, c) for c in range(v)] for s in range(p)]
    # chunks of a device in dataflow order (the first one admits a microbatch)
    chunk_order = [sorted(range(v), key=grp[s].__getitem__) for s in range(p)]
    foot = np.maximum(m_f, m_f + m_b)  # most a (stage, chunk) activation ever holds
    full = foot.sum(axis=1)
    capv = [float("inf") if c is None else float(c) * (1 + 1e-12) + 1e-12 for c in caps]
    if any(full[s] > capv[s] for s in range(p)):
        return None
    wcapv = [
        float("inf") if w_caps is None or w_caps[s] is None else float(w_caps[s])  # type: ignore[arg-type]
        for s in range(p)
    ]
    inf = float("inf")
    f_end = np.full((p, v, m), inf)
    b_end = np.full((p, v, m), inf)
    nf = [[0] * v for _ in range(p)]
    nb = [[0] * v for _ in range(p)]
    pend_w: list[list[Action]] = [[] for _ in range(p)]
    mem = [0.0] * p
    reserved = [0.0] * p  # activation still to come for admitted microbatches
    free_at = [0.0] * p
    rows: Rows = [[] for _ in range(p)]
    events: list[float] = [0.0]
    total = 3 * p * v * m
    n_done = 0

    def lag(s: int, c: int, other: int) -> float:
        return float(t_comm[s, c]) if other != s else 0.0

    def start(s: int, a: Action, T: float) -> None:
        nonlocal n_done
        c = a.chunk
        if a.op == "F":
            d = float(t_f[s, c])
            f_end[s, c, a.mb] = T + d
            nf[s][c] += 1
            mem[s] += float(m_f[s, c])
            reserved[s] -= float(foot[s, c])
            if grp[s][c] < G - 1:
                ns, _nc = table[grp[s][c] + 1]
                heapq.heappush(events, T + d + lag(s, c, ns))
        elif a.op == "B":
            d = float(t_b[s, c])
            b_end[s, c, a.mb] = T + d
            nb[s][c] += 1
            mem[s] += float(m_b[s, c])
            pend_w[s].append(Action("W", a.mb, c))
            if grp[s][c] > 0:
                ps, _pc = table[grp[s][c] - 1]
                heapq.heappush(events, T + d + lag(s, c, ps))
        else:
            d = float(t_w[s, c])
            mem[s] += float(m_w[s, c])
        rows[s].append(a)
        free_at[s] = T + d
        heapq.heappush(events, T + d)
        n_done += 1

    def choose(s: int, T: float) -> Action | None:
        eps = 1e-12 * max(1.0, T)
        if pend_w[s] and mem[s] > wcapv[s] * (1 + 1e-12):
            return pend_w[s].pop(0)
        b_pick: Action | None = None
        for c in sorted(range(v), key=lambda c: -grp[s][c]):
            mb = nb[s][c]
            if mb >= m or f_end[s, c, mb] > T + eps:
                continue
            g = grp[s][c]
            if g < G - 1:
                ns, nc = table[g + 1]
                if b_end[ns, nc, mb] + lag(s, c, ns) > T + eps:
                    continue
            if mem[s] + max(0.0, float(m_b[s, c])) > capv[s]:
                continue
            if b_pick is None or mb < b_pick.mb:
                b_pick = Action("B", mb, c)
        f_pick: Action | None = None
        f_blocked = False
        for c in sorted(range(v), key=lambda c: -grp[s][c]):
            mb = nf[s][c]
            if mb >= m:
                continue
            g = grp[s][c]
            if g > 0:
                ps, pc = table[g - 1]
                if f_end[ps, pc, mb] + lag(s, c, ps) > T + eps:
                    continue
            if c == chunk_order[s][0]:
                need = mem[s] + reserved[s] + full[s]
            else:
                need = mem[s] + float(foot[s, c])
            if need > capv[s]:
                f_blocked = True
                continue
            f_pick = Action("F", mb, c)
            break
        if (
            f_pick is not None
            and pend_w[s]
            and mem[s] + float(m_f[s, f_pick.chunk]) > wcapv[s] * (1 + 1e-12)
        ):
            return pend_w[s].pop(0)
        if f_before_b and f_pick is not None:
            return f_pick
        if b_pick is not None:
            return b_pick
        if f_pick is not None:
            return f_pick
        if pend_w[s] and (f_blocked or fill_w or all(nb[s][c] >= m for c in range(v))):
            return pend_w[s].pop(0)
        return None

    while events:
        T = heapq.heappop(events)
        while events and events[0] <= T:
            heapq.heappop(events)
        for s in range(p):
            while free_at[s] <= T + 1e-12 * max(1.0, T):
                a = choose(s, T)
                if a is None:
                    break
                if a.op == "F" and a.chunk == chunk_order[s][0]:
                    reserved[s] += float(full[s])
                start(s, a, T)
        if n_done == total:
            return rows
    return None
