"""Fill the warm-up's latency gaps with the next microbatches' forwards (issue 32).

In an interleaved schedule (``v`` > 1 chunks), a stage runs the first chunk of a group of ``g``
microbatches, then waits for the first of them to come back round the pipeline before it can run
their second chunk: when ``g`` forwards take less than the round trip over ``p`` stages (``g <
p``, or comm latency), every warm-up round leaves a gap (PipeOffload's ``g`` = 4 at 8 stages, 50%
memory: 7 gaps of 0.05 s on every stage, half its idle time). The rules cannot fill it without a
larger ``g``, which holds more activations for the whole run. This move fills only the warm-up:
it takes the first-chunk forwards of the next microbatches (those the stage would run right after
the warm-up) and runs ``per`` of them before the group's forward of chunk ``c``, for ``c`` = 1 ..
``rounds``, each offloaded right after it ends (the copy lane is idle in the warm-up); the stage
then skips them later. The same on every stage; a grid of (``per``, ``rounds``), each candidate
judged by the one simulator, the fastest that fits kept.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from ..schedule.problem import Problem
from ..schedule.schedule import Action
from ..schedule.simulator import SimResult, simulate

Rows = list[list[Action]]

# forwards moved per gap, and gaps filled (capped by the chunk count)
PERS = (1, 2, 3, 4)
ROUNDS = (1, 2, 3, 4, 5, 6, 7)
# relative makespan change that counts as faster
_REL = 1e-9


def fill_row(row: Sequence[Action], per: int, rounds: int, offload: bool) -> list[Action] | None:
    """``row`` with ``per`` first-chunk forwards of the microbatches after the warm-up group
    moved before the group's first forward of chunk ``c`` (``c`` = 1 .. ``rounds``), each with
    an OFFLOAD right after it when ``offload`` (or when it was offloaded already: its OFFLOAD
    moves with it); None when the row has no such structure (one chunk, too few forwards)."""
    first_c1 = next((i for i, a in enumerate(row) if a.op == "F" and a.chunk == 1), None)
    if first_c1 is None or per < 1 or rounds < 1:
        return None
    f0 = [a for a in row if a.op == "F" and a.chunk == 0]
    group = sum(1 for a in row[:first_c1] if a.op == "F" and a.chunk == 0)
    extra = f0[group : group + per * rounds]
    if len(extra) < per * rounds:
        return None
    lead = row[first_c1].mb
    anchors = {c for c in range(1, rounds + 1)}
    present = {a.chunk for a in row if a.op == "F" and a.mb == lead}
    if not anchors <= present:
        return None
    keys = {(a.mb, 0) for a in extra}
    was_offloaded = {(a.mb, a.chunk) for a in row if a.op == "OFFLOAD"}
    kept = [a for a in row if not (a.op in ("F", "OFFLOAD") and (a.mb, a.chunk) in keys)]
    out: list[Action] = []
    for a in kept:
        if a.op == "F" and a.mb == lead and a.chunk in anchors:
            for e in extra[(a.chunk - 1) * per : a.chunk * per]:
                out.append(e)
                if offload or (e.mb, 0) in was_offloaded:
                    out.append(Action("OFFLOAD", e.mb, 0))
        out.append(a)
    # an activation offloaded now must be reloaded before its backward
    reloaded = {(a.mb, a.chunk) for a in out if a.op == "RELOAD"}
    for e in extra:
        if (e.mb, 0) not in reloaded and (offload or (e.mb, 0) in was_offloaded):
            b = next(
                (
                    i
                    for i, a in enumerate(out)
                    if a.op in ("B", "BW") and (a.mb, a.chunk) == (e.mb, 0)
                ),
                None,
            )
            if b is None:
                return None
            # issued two compute ops before its backward, as the action search adds them
            j, k = b, 2
            while k and j > 0:
                j -= 1
                if out[j].is_compute:
                    k -= 1
            out.insert(j, Action("RELOAD", e.mb, 0))
    return out


def candidates(rows: Sequence[Sequence[Action]], num_chunks: int) -> Iterator[tuple[str, Rows]]:
    """Every grid point's rows (module doc), labelled ``per/rounds/offload``."""
    for per in PERS:
        for rounds in ROUNDS:
            if rounds > num_chunks - 1:
                break
            for offload in (True, False):
                filled = [fill_row(r, per, rounds, offload) for r in rows]
                if any(f is None for f in filled):
                    continue
                yield (
                    f"{per}/{rounds}/{'offload' if offload else 'keep'}",
                    [list(f) for f in filled if f is not None],
                )


def best_fill(
    problem: Problem,
    rows: Sequence[Sequence[Action]],
    *,
    deadline: float | None = None,
    max_tries: int | None = None,
) -> tuple[Rows, SimResult, str] | None:
    """The fastest filled rows that fit (module doc), faster than ``rows``; None when none is.
    Ends at ``deadline`` (``time.perf_counter()``) or after ``max_tries`` simulations."""
    if problem.num_chunks < 2:
        return None
    base = simulate(problem, rows)
    if not base.feasible or base.makespan is None:
        return None
    best: tuple[Rows, SimResult, str] | None = None
    limit = base.makespan * (1 - _REL)
    for tried, (label, cand) in enumerate(candidates(rows, problem.num_chunks)):
        if (max_tries is not None and tried >= max_tries) or (
            deadline is not None and time.perf_counter() >= deadline
        ):
            break
        res = simulate(problem, cand)
        if res.feasible and res.makespan is not None and res.makespan < limit:
            best, limit = (cand, res, label), res.makespan * (1 - _REL)
    return best
