"""Activation memory over time: each stage's step curve, and the memory limit's violations.

Read from a timed schedule: an F adds ``m_f`` when it ends, a B ``m_b`` and a W ``m_w`` (a BW both),
an OFFLOAD frees its bytes at its *settle point* (the start of the first compute action of its
stage that starts at or after the copy ends; the copy's end if none does) and a RELOAD allocates
them when it starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .problem import Problem
from .schedule import Violation
from .sim_ops import OpArrays
from .units import distinct

MEMORY_TOLERANCE = 1e-9  # relative slack on the memory limit (float sums of byte counts)
SETTLE_TOLERANCE = 1e-9  # relative slack on "starts at or after the copy ends" (float sums)


def event_times(ops: OpArrays, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """When each op changes its stage's activation memory: a compute op at its end, a RELOAD at
    its start, an OFFLOAD at its settle point: the start of the first compute action of its
    stage, or of the first RELOAD of its stage listed after it, that starts at or after its
    copy's end (a reload settles the offloads whose room it takes: the executor drops their
    device copies before it allocates); the copy's end if there is none. Also, per op, whether
    its event comes after the other events of its instant: an offload settled by a compute
    action's start (an F that ends at that instant allocated while the copy was still held,
    as the executor's F does; a reload settling it nets out with its own allocation)."""
    code, st = ops.code, ops.stage
    times = np.where(code == 5, start, end)
    late = np.zeros(times.shape, dtype=bool)
    offl = np.flatnonzero(code == 4)
    if offl.size:
        scale = max(float(np.abs(end).max()), 1e-30)
        is_c = ops.is_compute
        off = ops.offset
        for s in np.unique(st[offl]).tolist():
            lo, hi = int(off[s]), int(off[s + 1])
            mine = offl[st[offl] == s]
            ready = end[mine] - SETTLE_TOLERANCE * scale
            best = np.full(mine.size, np.inf)
            by_compute = np.zeros(mine.size, dtype=bool)
            # compute starts and reload starts are each non-decreasing in list order
            for ids, after in (
                (np.flatnonzero(is_c[lo:hi]) + lo, False),
                (np.flatnonzero(code[lo:hi] == 5) + lo, True),
            ):
                if not ids.size:
                    continue
                starts = start[ids]
                idx = np.searchsorted(starts, ready, side="left")
                if after:  # only a reload listed after the offload
                    idx = np.maximum(idx, np.searchsorted(ids, mine, side="right"))
                inside = idx < ids.size
                cand = np.where(inside, starts[np.minimum(idx, ids.size - 1)], np.inf)
                if after:  # a reload at the same instant settles it (no late event)
                    by_compute &= ~(cand <= best)
                else:
                    by_compute = np.isfinite(cand)
                best = np.minimum(best, cand)
            times[mine] = np.where(np.isfinite(best), best, end[mine])
            late[mine] = by_compute
    return times, late


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
    events of the simulator's docstring; changes at the same instant net out, but an offload
    settled by a compute action's start comes after them: ``event_times``). Host-held bytes
    follow the same events: an offload's bytes count as on the host from its settle point."""
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
    times, late = event_times(ops, start, end)
    order = np.lexsort((late, times, st))
    st_o, t_o, late_o = st[order], times[order], late[order]
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
            # one step per instant, two where a settle comes after that instant's allocations
            lt = late_o[lo:hi]
            last[:-1] = (np.diff(t_s) > 1e-12 * scale) | (lt[1:] != lt[:-1])
            t_s, level, offl = t_s[last], level[last], offl[last]
            t_s = np.concatenate(([min(0.0, float(t_s[0]))], t_s))
            level = np.concatenate(([0.0], level))
            offl = np.concatenate(([0.0], offl))
        curves.append(MemoryCurve(t_s, level, offl))
    return curves


def memory_violations(
    curves: list[MemoryCurve],
    limits: list[float | None],
    budgeted: Sequence[bool] = (),
) -> list[Violation]:
    """The first instant each stage's memory is above its limit (beyond ``MEMORY_TOLERANCE``).
    ``budgeted[s]``: stage s's limit is the schedule's ``memory_budget`` (below the device's
    limit), and the message says so."""
    found = []
    for s, (curve, lim) in enumerate(zip(curves, limits, strict=True)):
        if lim is None:
            continue
        over = curve.bytes > lim * (1 + MEMORY_TOLERANCE) + 1e-6
        if over.any():
            i = int(np.argmax(over))
            held, limit = distinct(float(curve.bytes[i]), lim)
            budget = s < len(budgeted) and budgeted[s]
            what = "memory budget (the schedule's memory_budget)" if budget else "limit"
            found.append(
                Violation(
                    kind="memory",
                    stage=s,
                    time=float(curve.times[i]),
                    message=f"stage {s} holds {held} bytes of activations at "
                    f"t={curve.times[i]:.6g}s, over its {what} {limit} "
                    f"(peak {curve.peak:.6g} at t={curve.peak_time():.6g}s)",
                )
            )
    return found
