"""A memory check without simulating: orders that cannot fit, whatever their timing.

A device runs its compute ops one after another in its listed order, and the simulator counts
an op's activation change when the op ends. So when the i-th compute op of a stage ends, the
stage holds at least the prefix sum of the compute deltas up to it, less the bytes of every
offloaded activation whose F has run and whose backward has not (its copy out may be done, and
its copy back cannot have started before its F). An OFFLOAD ends after its F and a RELOAD
starts before its backward, so no timing holds less. Where that bound exceeds a stage's limit,
``simulate`` reports the order infeasible (with or without memory waits: a wait only moves ops
in time, never past each other on a device), and the sweeps that only keep orders that fit
(PipeOffload's least fitting ``k``, AdaOffload's offload pruning) skip the simulation.

The simulator merges events closer than ``1e-12`` of the stage's time scale; the check is off
for problems with a compute op so short that two consecutive ends could merge.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

import numpy as np

from ..problem import Problem
from ..schedule import Action

SHORTEST_OP = 1e-6  # shortest compute op the check allows, relative to all the work there is
SLACK = 1e-6  # relative margin over the limit before the bound says "cannot fit"


def _check_applies(problem: Problem) -> bool:
    durations = [problem.cost(n) for n in ("t_f", "t_b", "t_w", "t_bw")]
    work = sum(float(np.sum(d)) for d in durations) * problem.num_microbatches
    if problem.offload is not None:
        work += (
            sum(
                problem.offload_time(s, c) + problem.reload_time(s, c)
                for s in range(problem.num_stages)
                for c in range(problem.num_chunks)
            )
            * problem.num_microbatches
        )
    shortest = min(float(np.min(d)) for d in durations)
    return shortest > SHORTEST_OP * work


def surely_over_limit(
    problem: Problem,
    rows: Sequence[Sequence[Action]],
    moved: Sequence[Set[tuple[int, int]]] | None = None,
) -> bool:
    """True when some stage's order exceeds its memory limit under any timing (module doc);
    False says nothing (simulate to know). ``moved``: per stage, the (microbatch, chunk)
    activations offloaded, for compute-only ``rows`` (default: the rows' OFFLOAD actions)."""
    limits = problem.memory_limits()
    if all(x is None for x in limits) or len(rows) != problem.num_stages:
        return False
    if not _check_applies(problem):
        return False
    m_f, m_b, m_w = problem.cost("m_f"), problem.cost("m_b"), problem.cost("m_w")
    ob = problem.cost("offload_bytes")
    for s, (row, lim) in enumerate(zip(rows, limits, strict=True)):
        if lim is None:
            continue
        cap = lim * (1 + SLACK) + SLACK
        out = {(a.mb, a.chunk) for a in row if a.op == "OFFLOAD"} if moved is None else moved[s]
        f, b, w = m_f[s].tolist(), m_b[s].tolist(), m_w[s].tolist()
        o = ob[s].tolist()
        level = 0.0
        for a in row:
            op = a.op
            if op == "F":
                level += f[a.chunk]
                if (a.mb, a.chunk) in out:
                    level -= o[a.chunk]
            elif op == "B" or op == "BW":
                level += b[a.chunk] + (w[a.chunk] if op == "BW" else 0.0)
                if (a.mb, a.chunk) in out:
                    level += o[a.chunk]
            elif op == "W":
                level += w[a.chunk]
            else:
                continue
            if level > cap:
                return True
    return False
