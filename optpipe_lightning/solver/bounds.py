"""A cheap lower bound on the memory limit any schedule needs.

(The makespan bound is ``optpipe_lightning.schedule.bounds.lower_bound``, shared by every tool.)
"""

from __future__ import annotations

from ..schedule.problem import Problem


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
