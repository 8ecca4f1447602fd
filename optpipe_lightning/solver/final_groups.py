"""PipeOffload's grouped order with groups of unequal sizes: no short final group (issue 32).

PipeOffload's order (``schedule.baselines._gis_order``) runs the microbatches in groups of ``g``.
When ``g`` does not divide ``m``, the last group is short, and the published generator keeps the
slots of a full group for it: after the last forward every stage runs ``v`` rounds of the short
group's backwards, each round waiting for the first of them to come back round the ``p`` stages
(on h4096-s8k-p8-75%, ``g`` = 7, ``m`` = 32: a last group of 4, 0.02 to 0.03 s idle per round,
8 rounds). This move lays the groups out with their own sizes: each group of size ``g_q`` gets the
building block of ``g_q`` (``k = ceil(g_min / g_q)``), placed right after the one before, so a
short group is compact, and the sizes can be balanced (32 as 7, 7, 6, 6, 6: no group holds more
than ``g``, the drain runs a group of 6). For each ``g`` from ``g_min`` to ``p``, a few size lists
(balanced largest first or last, the full groups with the remainder last or first), each list
once (``candidate_lists``); each order is timed without the memory limit, the fastest first, and
then fitted with PipeOffload's copy grid planned on the order's own timeline
(``_offload_grid.place_copies``: the lazy rule over every order, then the fit rule, fewest
offloaded chunks first), every candidate judged by the one simulator; those that fit and beat
the incumbent are yielded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from ..schedule.baselines import make_schedule
from ..schedule.baselines._gis_order import Plan, _postpone_warmup, block_shape, min_group_size
from ..schedule.baselines._offload_grid import RULES, GridError, Rule, place_copies
from ..schedule.problem import Problem
from ..schedule.schedule import Action, Schedule
from ..schedule.simulator import SimResult, simulate
from .gis_search import applies

Rows = list[list[Action]]

# relative makespan change that counts as faster
_REL = 1e-9


def mixed_order(problem: Problem, sizes: Sequence[int]) -> Rows:
    """The grouped compute order with groups of ``sizes`` (summing to ``m``), each laid out as
    the published building block of its own size, one after the other (module doc). Raises
    ValueError for a size the building block cannot take (``3 k g <= p``, or outside 1..p)."""
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    if sum(sizes) != m:
        raise ValueError(f"group sizes {list(sizes)} do not sum to {m} microbatches")
    g_min = min_group_size(problem)
    rows: Rows = []
    for d in range(p):
        slotted: list[tuple[int, int, int, Action]] = []
        base = first_mb = 0
        for g in sizes:
            k, period = block_shape(p, v, g, g_min)
            first_b = 3 * k * g * (v - 1) + d + 3 * g * ((v - 1) // period) + 3 * (p - 1 - d) + 1
            for i in range(g):
                j = first_mb + i
                for c in range(v):
                    f = base + 3 * k * g * c + 3 * i + d + 3 * g * (c // period)
                    b = base + first_b + 3 * k * g * c + 3 * i + 3 * g * (c // period)
                    slotted.append((f, 0, j, Action("F", j, c)))
                    slotted.append((b, 1, j, Action("B", j, v - 1 - c)))
                    slotted.append((b + 1, 2, j, Action("W", j, v - 1 - c)))
            base += 3 * g * v
            first_mb += g
        slotted.sort(key=lambda x: x[:3])
        rows.append([a for *_k, a in slotted])
    return rows


def size_lists(m: int, g: int) -> list[tuple[int, ...]]:
    """The size lists tried for largest group ``g`` (module doc), without repeats; none when
    ``g`` divides ``m`` (the published order)."""
    if g < 1 or m % g == 0:
        return []
    q = -(-m // g)
    lo, extra = divmod(m, q)
    balanced = [lo + 1] * extra + [lo] * (q - extra)
    full = [g] * (m // g)
    out: list[tuple[int, ...]] = []
    for sizes in (balanced, balanced[::-1], [*full, m % g], [m % g, *full]):
        if tuple(sizes) not in out:
            out.append(tuple(sizes))
    return out


def _plan(problem: Problem, rows: Rows, rule: Rule) -> Plan | None:
    """The timeline the copies are laid out on: for the lazy rule the order's run without p2p
    time with the warm-up postponed (as ``planning_times`` does for the published sizes), for
    the fit rule its real run without the limit; None if the order does not run."""
    if rule == "fit":
        res = simulate(problem.with_changes(memory_limit=None), rows)
        if res.timeline is None:
            return None
        return [res.timeline.compute_rows(s) for s in range(problem.num_stages)]
    timing = problem.with_changes(t_comm=0.0, memory_limit=None, offload=None)
    res = simulate(timing, rows)
    if res.timeline is None:
        return None
    return _postpone_warmup(
        problem, [res.timeline.compute_rows(s) for s in range(problem.num_stages)]
    )


def candidate_lists(problem: Problem) -> list[tuple[int, ...]]:
    """Every size list tried (``size_lists`` for each ``g`` from ``g_min`` to ``p``), each once:
    the order depends on the sizes only, and neighbouring ``g`` share lists (at 32 stages, 64
    microbatches, ``g`` = 22 to 31 all balance to 22, 21, 21: 55 lists, 33 different)."""
    p, m = problem.num_stages, problem.num_microbatches
    out: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    for g in range(min_group_size(problem), p + 1):
        for sizes in size_lists(m, g):
            if sizes not in seen:
                seen.add(sizes)
                out.append(sizes)
    return out


def members(
    problem: Problem,
    incumbent: float,
    deadline: float | None = None,
    max_tries: int | None = None,
) -> Iterator[Schedule]:
    """Schedules of the unequal group sizes (module doc) that fit and beat ``incumbent`` (each
    one yielded beats the ones before), until ``deadline`` (``time.perf_counter()``) or after
    ``max_tries`` simulations.

    The orders are timed without the limit, the fastest first; then fitted one rule at a time
    over all of them (the lazy rule first: it gave every fitted best at 32 stages, where one
    order's two rules take 1.4 s), an order already no faster than the best skipped (offload
    only delays)."""
    if not applies(problem):
        return
    tries = 0

    def late() -> bool:
        return (deadline is not None and time.perf_counter() > deadline) or (
            max_tries is not None and tries >= max_tries
        )

    def sim(rows: Rows, pb: Problem = problem) -> SimResult:
        nonlocal tries
        tries += 1
        return simulate(pb, rows)

    free = problem.with_changes(memory_limit=None)
    bases: list[tuple[float, tuple[int, ...], Rows]] = []
    for sizes in candidate_lists(problem):
        if late():
            return
        try:
            rows = mixed_order(problem, sizes)
        except ValueError:
            continue
        res = sim(rows, free)
        if res.makespan is not None and res.makespan < incumbent * (1 - _REL):
            bases.append((res.makespan, sizes, rows))
    bases.sort(key=lambda x: x[0])
    best = incumbent
    needs_copies: set[int] = set()  # orders that do not fit as they are
    for rule in RULES:
        for i, (free_ms, sizes, rows) in enumerate(bases):
            if free_ms >= best * (1 - _REL):
                break  # offload only delays: the rest are slower already
            if late():
                return
            found: tuple[Rows, float, int, str] | None
            if rule == RULES[0]:
                res = sim(rows)
                if res.feasible and res.makespan is not None:
                    found = (
                        (rows, res.makespan, 0, "") if res.makespan < best * (1 - _REL) else None
                    )
                else:
                    needs_copies.add(i)
                    found = _fit(problem, rows, best, sim, late, rule)
            elif i in needs_copies:
                found = _fit(problem, rows, best, sim, late, rule)
            else:
                continue
            if found is not None:
                fitted, ms, k, used = found
                best = ms
                params: dict[str, object] = {"group_sizes": list(sizes), "offload_chunks": k}
                if k:
                    params["rule"] = used
                yield make_schedule(problem, "optpipe", fitted, params)


def _fit(
    problem: Problem,
    rows: Rows,
    best: float,
    sim: Callable[[Rows], SimResult],
    late: Callable[[], bool],
    rule: Rule,
) -> tuple[Rows, float, int, str] | None:
    """The order with the copy grid of ``rule``, the fewest offloaded chunks that fit, if it
    beats ``best``; else None."""
    plan = _plan(problem, rows, rule)
    if plan is None:
        return None
    for k in range(1, problem.num_chunks + 1):
        if late():
            return None
        try:
            with_copies, _ = place_copies(problem, plan, k, rule)
        except GridError:
            return None
        r = sim(with_copies)
        if r.feasible and r.makespan is not None:
            ok = r.makespan < best * (1 - _REL)
            return (with_copies, r.makespan, k, rule) if ok else None  # more chunks: more copies
    return None
