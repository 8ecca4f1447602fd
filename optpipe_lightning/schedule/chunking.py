"""Chunks as a decision: the chunkings a problem allows, and the problem of each.

A problem with ``layers_per_stage`` says how many equal layers each stage holds, so a stage may
run as ``v`` chunks (virtual stages) for any ``v`` dividing every stage's layers, in either
placement (``interleaved`` or ``vshape``; with one chunk placement means nothing). ``rechunk``
gives the problem of one chunking: per chunk, the stage's times, memory changes and offload bytes
divided by ``v`` (a stage's total over its chunks stays what it was); ``t_comm`` per hop, the
memory limit and the copy channels unchanged. A schedule built for a re-chunking records its
``num_chunks`` and ``placement`` and embeds that problem; ``problem_for`` finds the problem a
schedule must be checked against, given the problem the user passed.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .problem import COST_FIELDS, Problem
from .schedule import Schedule
from .simulator import ScheduleMismatchError

Placement = Literal["interleaved", "vshape"]
Chunking = tuple[int, Placement]
PLACEMENTS: tuple[Placement, ...] = ("interleaved", "vshape")
# fields whose per-chunk value is the stage's total divided by the chunk count
_SPLIT = ("t_f", "t_b", "t_w", "m_f", "m_b", "m_w")
_REL = 1e-9


def own_chunking(problem: Problem) -> Chunking:
    """The problem's own chunk count and placement (placement ``interleaved`` for one chunk)."""
    v = problem.num_chunks
    return (v, problem.placement if v > 1 else "interleaved")


def chunk_counts(problem: Problem) -> list[int]:
    """Every chunk count the problem allows, ascending: the divisors of every stage's layers,
    or only its own ``num_chunks`` without ``layers_per_stage``."""
    layers = problem.layers()
    if layers is None:
        return [problem.num_chunks]
    g = int(np.gcd.reduce(np.asarray(layers, dtype=np.int64)))
    return [v for v in range(1, g + 1) if g % v == 0]


def chunkings(problem: Problem) -> list[Chunking]:
    """Every (chunk count, placement) the problem allows, its own first; both placements for
    two chunks or more, one for one chunk."""
    own = own_chunking(problem)
    out: list[Chunking] = [own]
    if problem.layers() is None:
        return out
    for v in chunk_counts(problem):
        for pl in PLACEMENTS if v > 1 else PLACEMENTS[:1]:
            if (v, pl) != own:
                out.append((v, pl))
    return out


def rechunk(problem: Problem, num_chunks: int, placement: str = "interleaved") -> Problem:
    """The problem with each stage split into ``num_chunks`` chunks placed by ``placement``.

    Per chunk: the stage's times (``t_f``, ``t_b``, ``t_w``, ``t_bw`` when given), memory changes
    and offload bytes, summed over its chunks, divided by ``num_chunks``; ``t_comm`` per hop stays
    (the mean over the stage's chunks where they differ); ``memory_limit``, the offload channels
    and bandwidths unchanged. The problem's own chunking gives the problem itself. Raises
    ``ValueError`` (naming the fix) for a chunking the layers do not allow.
    """
    v = int(num_chunks)
    pl = placement if v > 1 else "interleaved"
    if pl not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if (v, pl) == own_chunking(problem):
        return problem
    if v not in chunk_counts(problem):
        if problem.layers() is None:
            raise ValueError(
                f"the problem fixes num_chunks={problem.num_chunks} (it gives no "
                "layers_per_stage): add layers_per_stage to let tools choose the chunk count"
            )
        raise ValueError(
            f"num_chunks={v} does not divide every stage's layers_per_stage "
            f"{problem.layers()}; allowed chunk counts: "
            + ", ".join(str(x) for x in chunk_counts(problem))
        )

    def per_chunk(name: str) -> list[float]:
        return [float(x) / v for x in problem.cost(name).sum(axis=1)]

    changes: dict[str, object] = {n: per_chunk(n) for n in _SPLIT}
    comm = problem.cost("t_comm")
    changes["t_comm"] = [
        float(row[0]) if np.all(row == row[0]) else float(row.mean()) for row in comm
    ]
    if problem.t_bw is not None:
        changes["t_bw"] = per_chunk("t_bw")
    if problem.offload is not None:
        changes["offload"] = {
            **problem.offload.model_dump(),
            "bytes": per_chunk("offload_bytes"),
        }
    changes["num_chunks"] = v
    changes["placement"] = pl
    if problem.name:
        changes["name"] = f"{problem.name} [{describe((v, pl))}]"
    return problem.with_changes(**changes)


def describe(chunking: Chunking) -> str:
    """``v=1``, ``v=2 interleaved``, ``v=2 vshape``."""
    v, pl = chunking
    return f"v={v}" if v == 1 else f"v={v} {pl}"


def is_rechunking_of(candidate: Problem, base: Problem) -> bool:
    """Whether ``candidate`` is ``base`` re-chunked (to a relative 1e-9 in every number)."""
    if candidate.hash == base.hash:
        return True
    if candidate.layers() != base.layers() or base.layers() is None:
        return False
    try:
        ref = rechunk(base, candidate.num_chunks, candidate.placement)
    except ValueError:
        return False
    if ref.hash == candidate.hash:
        return True
    return _close(ref, candidate)


def _close(a: Problem, b: Problem) -> bool:
    same = (
        a.num_stages == b.num_stages
        and a.num_microbatches == b.num_microbatches
        and own_chunking(a) == own_chunking(b)
        and (a.t_bw is None) == (b.t_bw is None)
        and (a.offload is None) == (b.offload is None)
    )
    if not same:
        return False
    for name in (*COST_FIELDS, "t_bw", "offload_bytes"):
        if not np.allclose(a.cost(name), b.cost(name), rtol=_REL, atol=0.0):
            return False
    la, lb = a.memory_limits(), b.memory_limits()
    if any((x is None) != (y is None) for x, y in zip(la, lb, strict=True)):
        return False
    if any(
        x is not None and y is not None and abs(x - y) > _REL * abs(x)
        for x, y in zip(la, lb, strict=True)
    ):
        return False
    if a.offload is not None and b.offload is not None:
        da = a.offload.model_dump(exclude={"bytes"})
        db = b.offload.model_dump(exclude={"bytes"})
        return bool(da == db)
    return True


def problem_for(problem: Problem, schedule: Schedule) -> Problem:
    """The problem ``schedule`` must be checked against when the user gives ``problem``: the
    problem itself, or the re-chunking of it the schedule was built for (its embedded problem,
    or ``rechunk`` by its recorded ``num_chunks`` and ``placement``). Raises
    ``ScheduleMismatchError`` when the schedule belongs to neither."""
    if schedule.problem_hash == problem.hash:
        return problem
    own = schedule.problem
    if own is not None and own.hash == schedule.problem_hash and is_rechunking_of(own, problem):
        return own
    if schedule.num_chunks is not None and problem.layers() is not None:
        try:
            ref = rechunk(problem, schedule.num_chunks, schedule.placement or "interleaved")
        except ValueError:
            ref = None
        if ref is not None and ref.hash == schedule.problem_hash:
            return ref
    raise ScheduleMismatchError(
        f"the schedule was made for problem {schedule.problem_hash}, which is neither problem "
        f"{problem.hash} nor a re-chunking of it; check it against its own problem"
    )


def stamped(schedule: Schedule, problem: Problem) -> Schedule:
    """The schedule with the problem it was built for embedded and its chunking recorded."""
    v, pl = own_chunking(problem)
    if schedule.problem is problem and schedule.num_chunks == v and schedule.placement == pl:
        return schedule
    return schedule.model_copy(update={"problem": problem, "num_chunks": v, "placement": pl})
