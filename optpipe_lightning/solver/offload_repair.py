"""Offload repair: make a fast order that ignores the memory limit fit it by offloading.

Take an order that is fast with unlimited memory (ZB-H1, ZB-V, the greedy's...), simulate it
under the limit, and wherever a stage holds too much, offload the activations resident there
whose backward is farthest away (they free the most byte-seconds per copy), reloading each just
in time for its backward: the RELOAD is issued after the last compute op of the stage that ends
no later than the backward's start minus the reload time (and a slack: copies queue on the
channel). Re-simulate and repeat until the
simulator accepts the schedule (the memory wait absorbs copies that end a little late) or no
activation can help. The compute order never changes, so a base order that is optimal with
unlimited memory keeps its timing wherever the copies hide behind compute.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..schedule.baselines import NotApplicable, generate
from ..schedule.problem import Problem
from ..schedule.schedule import Action, Schedule
from ..schedule.simulator import MEMORY_TOLERANCE, SimResult, Timeline, simulate

BASE_ORDERS = ("zbv", "zb-h1", "1f1b", "interleaved-1f1b", "zb-h2")  # cheap, likely first
# reloads issued just in time, or 1 or 2 forwards earlier (room for copies queued on the channel:
# ZB-H1 at 8x32, half memory: 177.5 just in time, 107.5 one forward earlier)
SLACKS = (0, 1, 2)

Key = tuple[int, int]  # (mb, chunk)


def applicable(problem: Problem) -> bool:
    return problem.offload is not None and any(x is not None for x in problem.memory_limits())


def base_orders(problem: Problem) -> list[tuple[str, list[list[Action]]]]:
    """Orders that are fast with unlimited memory: the zero-bubble baselines and 1F1B."""
    free = problem.with_changes(memory_limit=None)
    out: list[tuple[str, list[list[Action]]]] = []
    for name in BASE_ORDERS:
        try:
            sched = generate(name, free)
        except NotApplicable:
            continue
        if sched.evaluation is not None and sched.evaluation.feasible:
            out.append((name, [list(r) for r in sched.actions]))
    return out


def repair_offload(
    problem: Problem,
    base: Sequence[Sequence[Action]],
    max_rounds: int = 40,
    deadline: float | None = None,
    slack: float = 0.0,
) -> list[list[Action]] | None:
    """The base order with offloads that make it fit the memory limit, or None. ``slack``
    (seconds) issues each reload that much earlier than just in time."""
    if not applicable(problem):
        return None
    p = problem.num_stages
    comp = [[a for a in row if a.is_compute] for row in base]
    chosen: list[dict[Key, int]] = [{} for _ in range(p)]  # key -> compute index to reload after
    for _ in range(max_rounds):
        if deadline is not None and time.perf_counter() > deadline:
            return None
        rows = _build(comp, chosen)
        res = simulate(problem, rows)
        if res.timeline is None:
            return None
        if res.feasible:
            return rows
        if any(v.kind != "memory" for v in res.evaluation.violations):
            return None
        progress = False
        for s in range(p):
            progress |= _fix_stage(problem, s, comp[s], chosen[s], res, slack)
        if not progress:
            return None
    return None


def repaired_schedules(problem: Problem, deadline: float | None = None) -> list[Schedule]:
    """Every base order repaired (those the simulator accepts), best first."""
    out: list[Schedule] = []
    if not applicable(problem):
        return out
    unit = float(problem.cost("t_f").mean())  # reload slack, in forwards
    for name, rows in base_orders(problem):
        for k in SLACKS:
            if deadline is not None and time.perf_counter() > deadline:
                break
            fixed = repair_offload(problem, rows, deadline=deadline, slack=k * unit)
            if fixed is None:
                continue
            res = simulate(problem, fixed)
            if res.feasible:
                out.append(
                    Schedule.built(
                        problem_hash=problem.hash,
                        generator="optpipe-heuristic",
                        params={"rule": f"offload-repair:{name}", "reload_slack_forwards": k},
                        actions=fixed,
                        evaluation=res.evaluation,
                        problem=problem,
                    )
                )
    out.sort(key=lambda s: s.evaluation.makespan if s.evaluation and s.evaluation.makespan else 0)
    return out


def _build(comp: list[list[Action]], chosen: list[dict[Key, int]]) -> list[list[Action]]:
    rows: list[list[Action]] = []
    for s, ops in enumerate(comp):
        reload_after: dict[int, list[Key]] = {}
        for key, idx in chosen[s].items():
            reload_after.setdefault(idx, []).append(key)
        row: list[Action] = []
        for i, a in enumerate(ops):
            row.append(a)
            if a.op == "F" and (a.mb, a.chunk) in chosen[s]:
                row.append(Action("OFFLOAD", a.mb, a.chunk))
            for mb, c in reload_after.get(i, ()):
                row.append(Action("RELOAD", mb, c))
        rows.append(row)
    return rows


def _fix_stage(
    pb: Problem,
    s: int,
    ops: list[Action],
    chosen: dict[Key, int],
    res: SimResult,
    slack: float = 0.0,
) -> bool:
    """Choose more activations of stage ``s`` to offload where its memory goes over the limit
    (times from this simulation; the next one checks)."""
    lim = pb.memory_limits()[s]
    if lim is None:
        return False
    cap = lim * (1 + MEMORY_TOLERANCE) + 1e-6
    curve = res.memory[s]
    over = [(float(t), float(b)) for t, b in zip(curve.times, curve.bytes, strict=True) if b > cap]
    if not over:
        return False
    tl = res.timeline
    assert tl is not None
    f_end: dict[Key, float] = {}
    f_idx: dict[Key, int] = {}
    b_start: dict[Key, float] = {}
    ends: list[float] = []  # end of each compute op of the stage, in list order
    k = 0
    for a, st, en in zip(tl.actions[s], tl.start[s], tl.end[s], strict=True):
        if not a.is_compute:
            continue
        key = (a.mb, a.chunk)
        if a.op == "F":
            f_end[key] = float(en)
            f_idx[key] = k
        elif a.op in ("B", "BW"):
            b_start[key] = float(st)
        ends.append(float(en))
        k += 1
    ob = pb.cost("offload_bytes")
    t_off = {c: pb.offload_time(s, c) for c in range(pb.num_chunks)}
    t_rel = {c: pb.reload_time(s, c) for c in range(pb.num_chunks)}
    # activations that may still be offloaded, farthest backward first
    free = sorted(
        (key for key in f_end if key not in chosen and ob[s, key[1]] > 0),
        key=lambda key: -b_start[key],
    )
    saved: list[tuple[float, float, float]] = []  # (from, to, bytes) of this round's choices
    progress = False
    for t, level in over:
        level -= sum(b for lo, hi, b in saved if lo <= t < hi)
        while level > cap:
            pick = None
            for key in free:
                c = key[1]
                if f_end[key] > t or b_start[key] - t_rel[c] <= t:
                    continue  # not resident at t, or needed back before t
                pick = key
                break
            if pick is None:
                # nothing to offload: run a pending W (its weight-gradient memory) before the
                # forward that allocates at t, if there is one
                moved = _move_w_before(pb, s, ops, chosen, tl, t)
                if moved is None:
                    moved = _delay_reload_at(pb, s, ops, chosen, tl, t)
                if moved is None:
                    break
                level += moved
                progress = True
                break  # indices moved: the next round re-simulates
            free.remove(pick)
            c = pick[1]
            bytes_ = float(ob[s, c])
            saved.append((f_end[pick] + t_off[c], b_start[pick] - t_rel[c], bytes_))
            chosen[pick] = _reload_point(ends, f_idx[pick], b_start[pick] - t_rel[c] - slack)
            progress = True
            # freed by t, or the forward that allocates at t waits for this copy
            level -= bytes_
    return progress


def _move_w_before(
    pb: Problem, s: int, ops: list[Action], chosen: dict[Key, int], tl: Timeline, t: float
) -> float | None:
    """Move the first W of stage ``s`` whose B has ended before the F that ends at ``t`` (and
    that is listed after it) to just before that F; the memory change it brings, or None.

    Positions are looked up in ``ops`` (which earlier moves of this round may have changed);
    times come from the last simulation."""
    rows = tl.compute_rows(s)
    hit = next(((a, st) for a, st, en in rows if a.op == "F" and abs(en - t) <= 1e-9), None)
    if hit is None:
        return None
    f_action, f_start = hit
    b_end = {(a.mb, a.chunk): en for a, _st, en in rows if a.op == "B"}
    fi = ops.index(f_action)
    for j in range(fi + 1, len(ops)):
        a = ops[j]
        if a.op == "W" and b_end.get((a.mb, a.chunk), float("inf")) <= f_start + 1e-9:
            w = ops.pop(j)
            ops.insert(fi, w)
            for key, idx in chosen.items():
                if fi <= idx < j:  # after an op that moved one place down
                    chosen[key] = idx + 1
                # idx == j (after the W itself): now after the op that preceded the W, at j
            return float(pb.cost("m_w")[s, w.chunk])
    return None


def _delay_reload_at(
    pb: Problem, s: int, ops: list[Action], chosen: dict[Key, int], tl: Timeline, t: float
) -> float | None:
    """Issue the reload that starts at ``t`` one compute op later (still before its backward);
    the memory change at ``t`` that brings, or None."""
    for a, st, _en in tl.transfer_rows(s):
        if a.op != "RELOAD" or abs(st - t) > 1e-9:
            continue
        key = (a.mb, a.chunk)
        idx = chosen.get(key)
        if idx is None:
            continue
        back = next(i for i, b in enumerate(ops) if b.op in ("B", "BW") and (b.mb, b.chunk) == key)
        if idx + 1 < back:
            chosen[key] = idx + 1
            return -float(pb.cost("offload_bytes")[s, a.chunk])
    return None


def _reload_point(ends: list[float], f_index: int, latest_start: float) -> int:
    """Index of the compute op after which the reload is issued: the last one that ends by
    ``latest_start`` (never before the activation's own F)."""
    lo, hi = f_index, len(ends) - 1
    best = f_index
    # ends are non-decreasing in list order on one device
    while lo <= hi:
        mid = (lo + hi) // 2
        if ends[mid] <= latest_start + 1e-12:
            best = mid
            lo = mid + 1
        else:
            hi = mid - 1
    return best
