"""The smallest memory limit a problem can be scheduled under, and the error when it is too low.

The bound (``bounds.memory_need_lower_bound``) says what no schedule can go below. The witness is
a one-microbatch-at-a-time schedule that offloads every lower chunk's activation while the higher
chunks run, timed under the bound (its forwards wait for the copies, the simulator's memory
wait) or, where that does not fit, without a limit: its simulated peak is a limit that surely
works. With one chunk, or when the copies
finish in time, the two agree and the smallest feasible limit is exact.
"""

from __future__ import annotations

from ..schedule.problem import Problem
from ..schedule.schedule import Action, Evaluation, Schedule
from ..schedule.simulator import evaluate
from ..schedule.units import distinct
from .bounds import memory_need_lower_bound
from .results import InfeasibleMemoryLimit


def sequential_rows(problem: Problem, offload: bool) -> list[list[Action]]:
    """One microbatch at a time, every chunk's activation but the top one offloaded."""
    pb = problem
    p, v, m = pb.num_stages, pb.num_chunks, pb.num_microbatches
    ob = pb.cost("offload_bytes")
    rows: list[list[Action]] = []
    for s in range(p):
        order = sorted(range(v), key=lambda c: pb.group_of(s, c))
        move = {
            c: offload and pb.offload is not None and ob[s, c] > 0 and c != order[-1] for c in order
        }
        row: list[Action] = []
        for j in range(m):
            for c in order:
                row.append(Action("F", j, c))
                if move[c]:
                    row.append(Action("OFFLOAD", j, c))
            rev = order[::-1]
            for k, c in enumerate(rev):
                row += [Action("B", j, c), Action("W", j, c)]
                if k + 1 < len(rev) and move[rev[k + 1]]:
                    row.append(Action("RELOAD", j, rev[k + 1]))
        rows.append(row)
    return rows


def minimal_memory_schedule(problem: Problem) -> Schedule:
    """The one-at-a-time schedule with offload (evaluated, memory limit ignored)."""
    rows = sequential_rows(problem, offload=problem.offload is not None)
    return Schedule.built(
        problem_hash=problem.hash,
        generator="optpipe-minimal-memory",
        params={},
        actions=rows,
        evaluation=evaluate(problem, rows),
        problem=problem,
    )


def smallest_feasible_limit(problem: Problem) -> tuple[list[float], list[float]]:
    """(per-stage bound no schedule beats, per-stage peak of a schedule that surely fits)."""
    need = memory_need_lower_bound(problem)
    # timed under the bound first: a forward then waits for the copy whose room it needs (an
    # offload's bytes leave at its settle point, the start of a compute action after the copy)
    ev: Evaluation | None = evaluate(
        problem.with_changes(memory_limit=need), sequential_rows(problem, True)
    )
    if ev is None or not ev.feasible:
        ev = minimal_memory_schedule(problem).evaluation
    assert ev is not None
    peaks = list(ev.peak_memory)
    return need, [max(a, b) for a, b in zip(need, peaks, strict=True)]


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def check_memory_limit(problem: Problem) -> None:
    """Raise ``InfeasibleMemoryLimit`` when a stage's limit is below what any schedule needs.

    The message and the exception name the smallest limit known to work (exact with one
    chunk, or when the witness schedule's copies finish in time).
    """
    limits = problem.memory_limits()
    if all(x is None for x in limits):
        return
    need = memory_need_lower_bound(problem)
    for s, (lim, nd) in enumerate(zip(limits, need, strict=True)):
        if lim is not None and lim < nd * (1 - 1e-9) - 1e-6:
            smallest = max(smallest_feasible_limit(problem)[1])
            how = (
                "even offloading every activation it can"
                if problem.offload is not None
                else "without offload (the problem has offload: null)"
            )
            have, needed = distinct(lim, nd)
            raise InfeasibleMemoryLimit(
                f"memory_limit {have} on stage {s} is below what any schedule needs there "
                f"({needed} bytes, {how}); the smallest feasible memory_limit is "
                f"{distinct(smallest, lim)[0]}",
                smallest,
            )


def infeasible_error(problem: Problem, works: list[float]) -> InfeasibleMemoryLimit:
    """The error when the search found no schedule under the limit."""
    smallest = max(works)
    lims = [x for x in problem.memory_limits() if x is not None]
    return InfeasibleMemoryLimit(
        f"no schedule fits memory_limit {_fmt(min(lims))}; the smallest feasible memory_limit "
        f"found is {_fmt(smallest)}",
        smallest,
    )
