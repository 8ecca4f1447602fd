"""Local search over the list-scheduling rules' parameters, in the heuristic phase's spare time.

The fixed portfolio (``list_rules.default_rules``) tries each rule at one setting; the best
setting differs by problem (8x32x2 at a quarter of the memory, copies 0.5x: the portfolio's best
is 114.5, the same rule family with 0.75 of 1F1B's depth and reloads two stages ahead gives 111).
So, from the best rules found, hill-climb: try each neighbour (in-flight depth a step up or down,
reload lead one more or less, the round trip that offloaded copies must fit in half a trip more
or less, waiting, reserve, order and offload policy switched), move to the
first that is faster; at a setting none of whose neighbours is, try the two-step moves (the depth
together with the reload lead or the round trip, ``pair_moves``) and go on from the first that
is faster; stop where none is either, or when time is up.
Every schedule is the simulator's: a neighbour whose schedule does not fit counts as no better.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from .heuristics import run_rule
from .list_rules import ListRule

# neighbours' steps: the in-flight factor of the fitted rules and of the others
FIT_STEPS = (-0.1, -0.05, 0.05, 0.1)
DEPTH_STEPS = (-0.25, -0.1, 0.1, 0.25, 0.5)
# ... and of the round trip an offloaded group's copies must fit in (``ListRule.trip_room``)
TRIP_STEPS = (-0.5, 0.5)
TRIP_MAX = 3.0


def rule_label(rule: ListRule) -> str:
    """A name that says every parameter of a rule found by the search."""
    depth = "inf" if rule.inflight is None else f"{rule.inflight:g}"
    parts = [rule.offload, f"x{depth}"]
    if rule.offload == "plan":
        parts.append(f"margin{rule.margin:g}")
        if not rule.eager:
            parts.append("lazy")
    elif rule.offload != "none":
        parts.append(f"lead{rule.reload_lead}")
        if rule.trip_room > 0:
            parts.append(f"trip{rule.trip_room:g}")
    if rule.wait:
        parts.append("wait")
    if rule.fit:
        parts.append("fit")
    if rule.reserve:
        parts.append("reserve")
    if not rule.deep_first:
        parts.append("mbfirst")
    if rule.offload == "lazy" and rule.headroom != 1:
        parts.append(f"room{rule.headroom}")
    return "search:" + "-".join(parts)


def neighbours(rule: ListRule, problem: Problem) -> list[ListRule]:
    """Rules one parameter away from ``rule`` (those that make sense for the problem)."""
    out: list[ListRule] = []
    chunks = problem.num_chunks > 1
    if rule.inflight is not None:
        steps = FIT_STEPS if rule.fit else DEPTH_STEPS
        out += [replace(rule, inflight=rule.inflight + d) for d in steps if rule.inflight + d > 0]
    if chunks:
        out.append(replace(rule, reserve=not rule.reserve))
        if rule.inflight is not None:
            out.append(replace(rule, fit=not rule.fit))
    if rule.offload == "plan":
        out += [
            replace(rule, margin=rule.margin + d) for d in (-0.25, 0.25) if rule.margin + d >= 0
        ]
        out.append(replace(rule, eager=not rule.eager))
    elif rule.offload != "none":
        out += [
            replace(rule, reload_lead=rule.reload_lead + d)
            for d in (-1, 1)
            if 1 <= rule.reload_lead + d <= 4
        ]
        out.append(replace(rule, wait=not rule.wait))
        out += [
            replace(rule, trip_room=rule.trip_room + d)
            for d in TRIP_STEPS
            if 0 <= rule.trip_room + d <= TRIP_MAX
        ]
        out.append(replace(rule, offload="lazy" if rule.offload == "all" else "all"))
        if rule.offload == "lazy":
            out.append(replace(rule, headroom=3 - rule.headroom if rule.headroom <= 2 else 1))
    out.append(replace(rule, deep_first=not rule.deep_first))
    return [replace(r, name=rule_label(r)) for r in out]


def pair_moves(rule: ListRule, problem: Problem) -> list[ListRule]:
    """Rules two steps away: the in-flight depth together with the reload lead or the round
    trip (tried once no single step helps: at 16x64x2, half the memory, copies 0.5x, the climb
    stopped at lazy x0.75 lead 3 trip 0 with 204.5, and x0.85 with trip 1 gives 203.25)."""
    if rule.inflight is None or rule.offload not in ("all", "lazy"):
        return []
    steps = FIT_STEPS if rule.fit else DEPTH_STEPS
    out: list[ListRule] = []
    for d in steps:
        if rule.inflight + d <= 0:
            continue
        deeper = replace(rule, inflight=rule.inflight + d)
        out += [
            replace(deeper, trip_room=rule.trip_room + t)
            for t in (*TRIP_STEPS, 2 * TRIP_STEPS[-1])
            if 0 <= rule.trip_room + t <= TRIP_MAX
        ]
        out += [
            replace(deeper, reload_lead=rule.reload_lead + k)
            for k in (-1, 1)
            if 1 <= rule.reload_lead + k <= 4
        ]
    return [replace(r, name=rule_label(r)) for r in out]


def _key(rule: ListRule) -> tuple[object, ...]:
    r = rule
    depth = None if r.inflight is None else round(r.inflight, 6)
    return (
        r.offload,
        depth,
        r.deep_first,
        r.reload_lead,
        r.wait,
        r.headroom,
        r.fit,
        r.reserve,
        round(r.margin, 6),
        r.eager,
        round(r.trip_room, 6),
    )


def search_rules(
    problem: Problem,
    starts: Iterable[tuple[float, ListRule]],
    keep_going: Callable[[], bool],
    tried: Iterable[ListRule] = (),
    max_starts: int = 3,
) -> Iterator[tuple[ListRule, Schedule]]:
    """Hill-climb from the best ``starts`` (makespan, rule), at most ``max_starts`` of them, and
    yield every (rule, schedule) that improves on the best makespan seen so far. ``keep_going()``
    is asked before each rule runs; ``tried`` rules are not run again."""
    seen = {_key(r) for r in tried}
    ranked = sorted(starts, key=lambda x: x[0])
    best = ranked[0][0] if ranked else float("inf")
    for makespan, start in ranked[:max_starts]:
        here, cur = makespan, start
        seen.add(_key(cur))
        moved = True
        pairs = False  # single steps first; two-step moves once none of those helps
        while moved:
            moved = False
            for nb in pair_moves(cur, problem) if pairs else neighbours(cur, problem):
                k = _key(nb)
                if k in seen:
                    continue
                if not keep_going():
                    return
                seen.add(k)
                sched = run_rule(problem, nb)
                ev = sched.evaluation if sched is not None else None
                if ev is None or not ev.feasible or ev.makespan is None:
                    continue
                if ev.makespan < here - 1e-9:
                    here, cur, moved = ev.makespan, nb, True
                    if ev.makespan < best - 1e-9:
                        best = ev.makespan
                        assert sched is not None
                        yield nb, sched
                    break
            if moved:
                pairs = False
            elif not pairs:
                pairs = moved = True  # a local optimum of single steps: try the pairs
