"""A certificate that a schedule timed without the memory wait goes over its memory limit.

``simulate`` times an offloading schedule under a limit twice when it does not fit as listed:
first without the memory wait (the answer when that fits), then with it. In the searches over
PipeOffload's family almost no candidate fits without the wait (0 of 301 candidates of the
action search on h8192-s32k-p16-m32-25%), so the first run was 40% of every candidate's cost.
With ``certify``, that first run stops as soon as its timing so far proves that the memory curve
(``sim_memory``) will go over the limit; ``simulate`` then returns the run with the wait, which
is what it returned before. A run the certificate does not stop is timed and judged in full, so
every result is the same, bit for bit (``tests/test_simulator_overlimit.py`` compares them).
Where the first run fits, the check is a third more work for nothing: ``simulate`` runs it
only while most of a problem's recent first runs went over (``simulator._OVER_SCORE``).

The check, at every ``STRIDE``-th allocating F ``x`` of stage ``s`` (a run over the limit stays
over for several forwards), timed from ``t`` to ``e``, once every transfer of the stage listed
before it is timed (the lanes lag behind the compute queues in the event loop): every step of
the curve at ``e`` holds at least

    (the memory changes of the compute ops listed before x, and x's)
    + (the bytes of the stage's reloads that started by e)
    - (the bytes of the stage's offloads that may have settled by then)

where an offload "may have settled" when its copy ended by ``t`` plus the settle tolerance, or,
if any reload of the stage can start between ``t`` and just after ``e`` (a reload settles the
offloads listed before it), by just after ``e``. Why that is a lower bound of the step that
holds the F's allocation (``memory_curves``' events; ``M`` is an upper bound of every op's end
time without the wait: the sum of all durations and lags):

- compute ops listed before ``x`` ended by ``t``; those after it start at ``e`` or later and last
  more than the merge window (``2e-12 * n_s * M``: steps closer than ``1e-12`` of the stage's
  last time are merged, over at most the stage's ``n_s`` events) plus the settle tolerance
  (``1e-9 * M``): none of their changes is in the step (checked per stage: ``min compute``);
- an offload settles at the first compute start (or listed-later reload start) at or after its
  copy's end less the tolerance. No compute op starts between ``t`` and ``e``, and one that
  starts at or after ``e`` settles it after the F's allocation (a "late" event: its own step).
  At least two compute ops follow ``x`` (checked), so no offload whose copy ends before the
  second's start settles at its copy's end. Offloads listed after ``x`` are issued after ``e``
  and last longer than the window (checked: ``min offload``);
- transfers not timed yet start no earlier than their lane's current free time (a lane starts
  each transfer at or after it): the check gives up unless that is past the window;
- the memory changes are summed in another order than the curve's: the threshold is the
  limit's (``MEMORY_TOLERANCE`` and ``1e-6``) plus ``1e-8`` of the stage's summed magnitudes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .problem import Problem
from .sim_memory import MEMORY_TOLERANCE, SETTLE_TOLERANCE
from .sim_ops import OpArrays

# the float-sum slack of the threshold, relative to the stage's summed magnitudes
SUM_SLACK = 1e-8
# the check runs at every STRIDE-th allocating F of a stage
STRIDE = 4


class OverLimit(Exception):
    """The timing without the memory wait certainly goes over a stage's memory limit."""

    def __init__(self, stage: int) -> None:
        super().__init__(f"stage {stage} certainly goes over its memory limit")
        self.stage = stage


@dataclass
class Certificate:
    """The check's tables (module doc): per stage its threshold (None: not checked), merge
    window and shortest offload; per op whether it is a checked F and whether a RELOAD follows
    it before the next compute op; the settle tolerance."""

    threshold: list[float | None]
    window: list[float]
    min_offload: list[float]
    checked: list[bool]
    reload_next: list[bool]
    tol: float


def certificate_tables(
    problem: Problem,
    ops: OpArrays,
    limits: Sequence[float | None],
    has_transfers: Sequence[bool],
) -> Certificate:
    """The tables of the check for ``ops`` (linked) under per-stage ``limits``;
    ``has_transfers[q]``: transfer queue ``q`` (2s, 2s + 1 of stage s) is not empty."""
    pb = problem
    p, n = pb.num_stages, ops.n
    code, stage, ch = ops.code, ops.stage, ops.ch
    off = ops.offset
    is_c = ops.is_compute
    dur = ops.dur
    bound = (float(dur.sum()) + float(np.abs(ops.lag).sum())) * (1 + 1e-6) + 1e-12
    tol = 2 * SETTLE_TOLERANCE * bound
    m_f, m_b, m_w = pb.cost("m_f"), pb.cost("m_b"), pb.cost("m_w")
    ob = pb.cost("offload_bytes")
    delta = np.stack([m_f, m_b, m_w, m_b + m_w, -ob, ob])[code, stage, ch]
    threshold: list[float | None] = [None] * p
    window = [0.0] * p
    min_offload = [0.0] * p
    for s in range(p):
        lo, hi = int(off[s]), int(off[s + 1])
        lim = limits[s]
        if lim is None or not (has_transfers[2 * s] or has_transfers[2 * s + 1]) or hi == lo:
            continue
        window[s] = 2e-12 * (hi - lo) * bound
        need = window[s] + 3 * tol
        comp = dur[lo:hi][is_c[lo:hi]]
        offl = dur[lo:hi][code[lo:hi] == 4]
        if not comp.size or float(comp.min()) <= need:
            continue
        if offl.size and float(offl.min()) <= need:
            continue
        min_offload[s] = float(offl.min()) if offl.size else float("inf")
        mags = float(np.abs(delta[lo:hi]).sum())
        threshold[s] = lim * (1 + MEMORY_TOLERANCE) + 1e-6 + SUM_SLACK * (mags + abs(lim))
    # per op: compute ops listed after it on its stage, and whether a RELOAD comes before the
    # next of them
    comp_i = np.cumsum(is_c)  # compute ops up to and including each op (all stages)
    stage_comp_end = comp_i[off[1:] - 1] if n else np.zeros(p, dtype=np.int64)
    after = stage_comp_end[stage] - comp_i if n else np.zeros(0, dtype=np.int64)
    stage_ok = np.array([t is not None for t in threshold], dtype=bool)
    checked = (code == 0) & (delta > 0) & stage_ok[stage] & (after >= 2) if n else np.zeros(0, bool)
    if n and STRIDE > 1:
        # every STRIDE-th allocating F of each stage (a run over the limit stays over for
        # several forwards; each check costs about a fifth of timing the forward)
        cnt = np.cumsum(checked)
        first = cnt[off[:-1]] - checked[off[:-1]]  # checked ops before each stage
        checked &= (cnt - first[stage]) % STRIDE == 1 % STRIDE
    # the next op of the same stage is a RELOAD, or a transfer followed (before a compute op)
    # by one: scan each stage's transfers backwards from its next compute op
    reload_next = np.zeros(n, dtype=bool)
    if n:
        ids = np.arange(n)
        # for each op, the first compute op (or the stage's end) after it
        nxt = np.full(n + 1, n, dtype=np.int64)
        pos = np.where(is_c, ids, n)
        # next compute strictly after i: reverse minimum accumulate over positions i+1..
        rev = np.minimum.accumulate(pos[::-1])[::-1]
        nxt[:-1] = np.append(rev[1:], n)
        stop = np.minimum(nxt[:-1], off[stage + 1])
        rel = np.concatenate(([0], np.cumsum(code == 5)))
        reload_next = (rel[stop] - rel[ids + 1]) > 0
    return Certificate(threshold, window, min_offload, checked.tolist(), reload_next.tolist(), tol)
