"""How large the MILP (``milp``) may be: its variable cap, the error a build past it (or past
its deadline) raises, and a lower bound of its size that needs no build.
"""

from __future__ import annotations

from ..schedule.problem import Problem

MILP_MAX_VARIABLES = 1_000_000
"""The largest MILP built (HiGHS, Gurobi). The model is Python lists in the command's process,
about 1 KB per variable (0.36 GB at 248k variables, 8 x 16 x 2; 3.6 GB at 16 x 32 x 4 with
offload, issue 32, where its build took most of a 95 s HiGHS run against a 60 s limit), so at
most about 1 GB; the HiGHS child that solves it is capped at ``HIGHS_MEMORY_BYTES``. Larger
models are not built (``ModelNotBuilt``): the solve keeps its best schedule and says why."""


class ModelNotBuilt(Exception):
    """The MILP was not built: larger than ``MILP_MAX_VARIABLES``, or its build reached the
    deadline (or a stop) first. The message says which, in one line."""


def memory_check_binaries(problem: Problem) -> int:
    """How many binaries the memory checks alone need (each allocation event against every
    other event of its device): a lower bound of the MILP's size that needs no build."""
    limits = problem.memory_limits()
    ob = problem.cost("offload_bytes")
    use_off = problem.offload is not None and any(x is not None for x in limits)
    m_f, m_b, m_w = (problem.cost(n) for n in ("m_f", "m_b", "m_w"))
    m = problem.num_microbatches
    total = 0
    for s, lim in enumerate(limits):
        if lim is None:
            continue
        events = allocs = 0
        for c in range(problem.num_chunks):
            offl = use_off and ob[s, c] > 0
            deltas = [m_f[s, c], m_b[s, c], m_w[s, c]] + ([-1.0, 1.0] if offl else [])
            events += m * sum(1 for d in deltas if d != 0)
            allocs += m * sum(1 for d in deltas if d > 0)
        total += allocs * max(0, events - 1)
    return total
