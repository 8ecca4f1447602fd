"""Cheap lower bounds on the makespan and on the memory limit any schedule needs.

``makespan_lower_bound`` uses the project's ``schedule.bounds.lower_bound`` when it exists and
takes the max with this module's own work+fill bound: a stage cannot start before the first
forward reaches it and then has all its work to do, ``max_s (min_c arrival(s, c) + work_s)``;
and one microbatch's critical path (every F, every B, the last W, the hops between).
"""

from __future__ import annotations

from ..schedule.problem import Problem


def _arrivals(problem: Problem) -> list[float]:
    """Earliest start of the first forward of every layer group."""
    pb = problem
    G = pb.num_virtual_stages
    table = pb.group_table
    t_f, comm = pb.cost("t_f"), pb.cost("t_comm")
    arr = [0.0] * G
    for g in range(1, G):
        ps, pc = table[g - 1]
        s, _ = table[g]
        lag = float(comm[ps, pc]) if ps != s else 0.0
        arr[g] = arr[g - 1] + float(t_f[ps, pc]) + lag
    return arr


def work_fill_bound(problem: Problem) -> float:
    """``max_s (min_c arrival(s, c) + work_s)`` and the one-microbatch critical path."""
    pb = problem
    m = pb.num_microbatches
    G = pb.num_virtual_stages
    table = pb.group_table
    t_f, t_b, t_w, comm = pb.cost("t_f"), pb.cost("t_b"), pb.cost("t_w"), pb.cost("t_comm")
    arr = _arrivals(pb)
    best = 0.0
    for s in range(pb.num_stages):
        work = m * float((t_f[s] + t_b[s] + t_w[s]).sum())
        head = min(arr[pb.group_of(s, c)] for c in range(pb.num_chunks))
        best = max(best, head + work)
    # critical path of one microbatch: up through F, down through B, then group 0's W
    path = arr[G - 1] + float(t_f[table[G - 1]])
    for g in range(G - 1, -1, -1):
        s, c = table[g]
        path += float(t_b[s, c])
        if g > 0:
            ps, _pc = table[g - 1]
            path += float(comm[s, c]) if ps != s else 0.0
    s0, c0 = table[0]
    path += float(t_w[s0, c0])
    return max(best, path)


def makespan_lower_bound(problem: Problem) -> tuple[float, str]:
    """The best cheap valid bound and where it came from."""
    own = work_fill_bound(problem)
    try:
        from ..schedule.bounds import lower_bound  # type: ignore[attr-defined,unused-ignore]
    except (ImportError, AttributeError):
        return own, "solver.work_fill"
    try:
        theirs = float(lower_bound(problem))
    except Exception:  # a bug there must not break solving; ours stays valid
        return own, "solver.work_fill"
    if theirs > own:
        return theirs, "schedule.bounds"
    return own, "solver.work_fill"


def memory_need_lower_bound(problem: Problem) -> list[float]:
    """Per stage, memory no schedule can go below, even offloading everything it can.

    When the forward of a device's chunk ends, its whole activation is there, and every lower
    chunk of the same microbatch on that device still holds what cannot move to the host (the
    backward of a lower chunk comes after the higher one's). A positive ``m_b`` adds on top.
    """
    pb = problem
    m_f, m_b = pb.cost("m_f"), pb.cost("m_b")
    ob = pb.cost("offload_bytes")
    out = []
    for s in range(pb.num_stages):
        order = sorted(range(pb.num_chunks), key=lambda c: pb.group_of(s, c))
        need = 0.0
        below = 0.0
        for c in order:
            own = max(float(m_f[s, c]), float(m_f[s, c] + m_b[s, c]))
            need = max(need, below + own)
            stay = float(m_f[s, c]) - (float(ob[s, c]) if pb.offload is not None else 0.0)
            below += stay
        out.append(need)
    return out
