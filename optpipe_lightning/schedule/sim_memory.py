"""Activation memory over time: each stage's step curve, and the memory limit's violations.

Read from a timed schedule: an F adds ``m_f`` when it ends, a B ``m_b`` and a W ``m_w`` (a BW both),
an OFFLOAD frees its bytes when it ends and a RELOAD allocates them when it starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import Problem
from .schedule import Violation
from .sim_ops import OpArrays
from .units import distinct

MEMORY_TOLERANCE = 1e-9  # relative slack on the memory limit (float sums of byte counts)


@dataclass
class MemoryCurve:
    """Step curve of one stage's activation memory: ``bytes[i]`` holds from ``times[i]`` on."""

    times: np.ndarray
    bytes: np.ndarray
    offloaded: np.ndarray  # bytes of this stage's activations sitting on the host, same steps

    @property
    def peak(self) -> float:
        return float(self.bytes.max()) if self.bytes.size else 0.0

    def peak_time(self) -> float:
        return float(self.times[int(np.argmax(self.bytes))]) if self.bytes.size else 0.0


def memory_curves(
    problem: Problem, ops: OpArrays, start: np.ndarray, end: np.ndarray
) -> list[MemoryCurve]:
    """Each stage's activation memory and host-held bytes over time, from the ops' times (the
    events of the simulator's docstring; changes at the same instant net out)."""
    pb = problem
    p = pb.num_stages
    m_f, m_b, m_w = pb.cost("m_f"), pb.cost("m_b"), pb.cost("m_w")
    ob = pb.cost("offload_bytes")
    zero = np.zeros_like(ob)
    # delta of activation memory and of host-held bytes per op code
    DM = np.stack([m_f, m_b, m_w, m_b + m_w, -ob, ob])
    DH = np.stack([zero, zero, zero, zero, ob, -ob])
    code, st, ch = ops.code, ops.stage, ops.ch
    delta = DM[code, st, ch]
    host = DH[code, st, ch]
    times = np.where(code == 5, start, end)
    order = np.lexsort((times, st))
    st_o, t_o = st[order], times[order]
    curves = []
    bounds = np.searchsorted(st_o, np.arange(p + 1))
    for s in range(p):
        lo, hi = bounds[s], bounds[s + 1]
        t_s = t_o[lo:hi]
        level = np.cumsum(delta[order[lo:hi]])
        offl = np.cumsum(host[order[lo:hi]])
        k = hi - lo
        if k:
            scale = max(float(abs(t_s[-1])), 1e-30)
            last = np.ones(k, dtype=bool)
            last[:-1] = np.diff(t_s) > 1e-12 * scale
            t_s, level, offl = t_s[last], level[last], offl[last]
            t_s = np.concatenate(([min(0.0, float(t_s[0]))], t_s))
            level = np.concatenate(([0.0], level))
            offl = np.concatenate(([0.0], offl))
        curves.append(MemoryCurve(t_s, level, offl))
    return curves


def memory_violations(curves: list[MemoryCurve], limits: list[float | None]) -> list[Violation]:
    """The first instant each stage's memory is above its limit (beyond ``MEMORY_TOLERANCE``)."""
    found = []
    for s, (curve, lim) in enumerate(zip(curves, limits, strict=True)):
        if lim is None:
            continue
        over = curve.bytes > lim * (1 + MEMORY_TOLERANCE) + 1e-6
        if over.any():
            i = int(np.argmax(over))
            held, limit = distinct(float(curve.bytes[i]), lim)
            found.append(
                Violation(
                    kind="memory",
                    stage=s,
                    time=float(curve.times[i]),
                    message=f"stage {s} holds {held} bytes of activations at "
                    f"t={curve.times[i]:.6g}s, over its limit {limit} "
                    f"(peak {curve.peak:.6g} at t={curve.peak_time():.6g}s)",
                )
            )
    return found
