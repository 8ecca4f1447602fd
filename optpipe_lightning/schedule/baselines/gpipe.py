"""GPipe: every forward, then every backward (fused ``BW``), for any chunk count.

Each stage runs the forwards of its chunks in layer-group order (all microbatches of the earlier
group first), then the backwards in reverse group order. Peak activation: every microbatch of every
chunk at once (``m`` microbatches); bubble ``(p-1)(F+B+W)`` at one chunk and uniform costs.
"""

from __future__ import annotations

from ..problem import Problem
from ..schedule import Action, Schedule
from . import make_schedule


def gpipe(problem: Problem) -> Schedule:
    p, m = problem.num_stages, problem.num_microbatches
    rows: list[list[Action]] = []
    for s in range(p):
        chunks = sorted(range(problem.num_chunks), key=lambda c: problem.group_of(s, c))
        row = [Action("F", mb, c) for c in chunks for mb in range(m)]
        row += [Action("BW", mb, c) for c in reversed(chunks) for mb in range(m)]
        rows.append(row)
    return make_schedule(problem, "gpipe", rows, {"backward": "fused"})
