"""The baselines' speed-ups change no schedule, and their cooperative deadline (issue 3)."""

from __future__ import annotations

import hashlib
import random
import time
from typing import Any

import numpy as np
import pytest

from optpipe_lightning.schedule import Action, Problem
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.schedule.baselines._deadline import (
    DeadlineExceeded,
    check_deadline,
    deadline_at,
)
from optpipe_lightning.schedule.baselines._listsched import (
    _fit_candidates,
    _pick_at_violations,
    list_schedule,
)
from optpipe_lightning.schedule.simulator import MemoryCurve


def _pb(v: int = 1, placement: str = "interleaved", comm: float = 0.0, p: int = 4) -> Problem:
    return Problem(
        num_stages=p,
        num_microbatches=8,
        num_chunks=v,
        placement=placement,
        t_f=[[1.0 + 0.1 * s + 0.05 * c for c in range(v)] for s in range(p)],
        t_b=[[1.3 - 0.1 * s + 0.02 * c for c in range(v)] for s in range(p)],
        t_w=[[0.7 + 0.03 * s for _c in range(v)] for s in range(p)],
        t_comm=comm,
        m_f=1.0,
        m_b=-0.6,
        m_w=-0.4,
        memory_limit=2.5 * v,
        offload={"bytes": 1.0, "d2h_bandwidth": 2.0, "h2d_bandwidth": 2.0},
    )


def _digest(rows: list[list[Action]]) -> str:
    text = "|".join(" ".join(f"{a.op}{a.mb}.{a.chunk}" for a in r) for r in rows)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


# list_schedule's orders as the code before the speed-up made them (it needs no simulator, so
# these hold whatever the simulator's rules): (chunks, placement, comm, cap factor, options)
_PINNED = [
    (1, "interleaved", 0.0, 1.0, {}, "48c2cba7c0a515e6"),
    (1, "interleaved", 0.0, 1.5, {"w_caps": [2.5] * 4}, "bc59ee57bedf3bab"),
    (1, "interleaved", 0.0, None, {}, "554d8ed97ac8b190"),
    (1, "interleaved", 0.0, 1.0, {"fill_w": False, "f_before_b": True}, "b594e7b8c882b12b"),
    (1, "interleaved", 0.1, 1.0, {}, "94eb556801cf3c1f"),
    (1, "interleaved", 0.1, None, {}, "9f890140d4f50a5d"),
    (2, "vshape", 0.05, 1.0, {}, "13b56b35b9d5f0bb"),
    (2, "vshape", 0.05, 1.5, {"w_caps": [5.0] * 4}, "5599517a1dee2aa9"),
    (2, "vshape", 0.05, None, {}, "731f4555669ab04d"),
    (2, "vshape", 0.05, 1.0, {"fill_w": False, "f_before_b": True}, "8c220de367397aba"),
    (2, "interleaved", 0.1, 1.0, {}, "308f1caef2ba7b65"),
    (2, "interleaved", 0.1, 1.5, {"w_caps": [5.0] * 4}, "34cd8c01826c3230"),
    (2, "interleaved", 0.1, 1.0, {"fill_w": False, "f_before_b": True}, "14851ff03cf79451"),
]


@pytest.mark.parametrize(("v", "placement", "comm", "cap", "opts", "digest"), _PINNED)
def test_solver_deadline_list_schedule_orders_are_unchanged(
    v: int, placement: str, comm: float, cap: float | None, opts: dict[str, Any], digest: str
) -> None:
    problem = _pb(v, placement, comm)
    caps = [None if cap is None else cap * 2.5 * v] * 4
    rows = list_schedule(problem, caps, **opts)
    assert rows is not None
    assert _digest(rows) == digest


def _plain_scan(
    curve: MemoryCurve,
    over: list[int],
    lim: float,
    tol: float,
    wins: dict[tuple[int, int], tuple[float, float, float]],
    s: int,
    o: float,
    r: float,
    nbytes: float,
) -> list[tuple[int, int, int]]:
    """AdaOffload's selection as first written: every candidate scanned at every step."""
    chosen: list[tuple[int, int, int]] = []
    planned: list[tuple[float, float, float]] = []
    for i in over:
        t = float(curve.times[i])
        t_next = float(curve.times[i + 1]) if i + 1 < curve.times.size else t
        excess = float(curve.bytes[i]) - lim
        excess -= sum(b for f0, f1, b in planned if f0 <= t + 1e-12 and t_next <= f1 + 1e-12)
        while excess > tol:
            best = None
            for (mb, c), (f_end, b_start, issue) in wins.items():
                key = (s, mb, c)
                if key in chosen:
                    continue
                if b_start - f_end < o + r:
                    continue
                lo, hi = f_end + o, issue
                if not (lo <= t + 1e-12 and t_next <= hi + 1e-12):
                    continue
                score = (b_start - f_end,)
                if best is None or score > best[0]:
                    best = (score, key, lo, hi)
            if best is None:
                break
            _, key, lo, hi = best
            chosen.append(key)
            planned.append((lo, hi, nbytes))
            excess -= nbytes
    return chosen


@pytest.mark.parametrize("seed", range(40))
def test_solver_deadline_fast_offload_choice_equals_the_plain_scan(seed: int) -> None:
    rng = random.Random(seed)
    # coarse times make ties in lifespans, offload ends and reload issues common
    n_win = rng.randint(1, 30)
    wins: dict[tuple[int, int], tuple[float, float, float]] = {}
    for mb in range(n_win):
        f_end = rng.randint(0, 20) * 0.5
        b_start = f_end + rng.randint(0, 20) * 0.5
        issue = rng.uniform(f_end, b_start) if rng.random() < 0.5 else round(b_start - 1.0, 1)
        wins[(mb, rng.randint(0, 1))] = (f_end, b_start, issue)
    times = np.array(sorted({rng.randint(0, 40) * 0.5 for _ in range(30)}))
    lim = 4.0
    levels = np.array([rng.choice([3.0, 4.0, 5.0, 6.5, 9.0]) for _ in times])
    curve = MemoryCurve(times=times, bytes=levels, offloaded=np.zeros_like(levels))
    tol = 1e-6
    over = np.nonzero(levels > lim + tol)[0].tolist()
    o, r, nb = 0.5, 0.5, rng.choice([1.0, 1.5])
    ob = np.full((1, 2), nb)
    cands = _fit_candidates(0, wins, set(), ob, [[o, o]], [[r, r]], None, 1.0)
    fast = list(_pick_at_violations(curve, over, lim, tol, cands))
    assert fast == _plain_scan(curve, over, lim, tol, wins, 0, o, r, nb)


def test_solver_deadline_check_is_silent_outside_a_deadline_block() -> None:
    check_deadline()  # no block: never raises
    with deadline_at(None):
        check_deadline()
    with deadline_at(time.perf_counter() + 3600):
        check_deadline()
    with pytest.raises(DeadlineExceeded), deadline_at(time.perf_counter() - 1.0):
        check_deadline()
    check_deadline()  # the block's deadline is gone after it


@pytest.mark.parametrize(
    ("name", "v", "placement"),
    [
        ("adaoffload", 1, "interleaved"),
        ("pipeoffload", 1, "interleaved"),
        ("v-half", 2, "vshape"),
        ("zb-auto", 1, "interleaved"),  # 0.5 s at 32x256x1: it ran on past the solve's limit
    ],
)
def test_solver_deadline_slow_baselines_stop_at_a_passed_deadline(
    name: str, v: int, placement: str
) -> None:
    problem = _pb(v, placement, 0.05)
    plain = generate(name, problem)
    with deadline_at(time.perf_counter() + 3600):
        assert generate(name, problem).actions == plain.actions  # same schedule under a deadline
    with pytest.raises(DeadlineExceeded), deadline_at(time.perf_counter() - 1.0):
        generate(name, problem)
