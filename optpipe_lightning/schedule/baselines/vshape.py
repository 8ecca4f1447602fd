"""V-shape schedules (2 chunks, chunk 0 of device d = layer group d, chunk 1 = group 2p-1-d).

- ``zbv``: ZB-V (Zero Bubble paper §6; the hand-built order also used by PyTorch's
  ``ScheduleZBVZeroBubble``): warm-up 2(p-d)-1 chunk-0 forwards, d pairs (F chunk 1, F chunk 0),
  p-d triples (F, B, W of chunk 1), then the steady pattern F0 B0 W0 F1 B1 W1, then a cool-down
  that defers W. Peak 2p chunk units (p microbatches, as 1F1B), about zero bubble at F = B = W.
- ``v_half``, ``v_min``: the building-block schedules of "Pipeline Parallelism with Controllable
  Memory" (NeurIPS 2024): one microbatch's F and B of both chunks at fixed slot offsets per
  stage, repeated every 6 slots (one microbatch's work on a device at unit costs), W in the free
  slots after their B. The block's lifespan sets the peak: (p+2)//2 microbatches (V-Half) and
  (p+4)//3 (V-Min). Squeezing (the paper's step after the block) moves ops to earlier free slots
  where no stage's order peak rises above the block's (``_squeeze``); three variants are tried
  (all ops with W in place; F/B only with W re-filled afterwards; warm-up and cool-down only,
  steady state pinned, as the reference does) and the one with the smallest simulated makespan
  is kept (``params["variant"]``; "block" when none beats the plain block). Peak memory depends
  on the order alone, so the peaks hold with any costs; times come from the simulator.

Anchors at unit per-chunk costs, p = 8, m = 24 (stage-span rate / peak chunk units): ZB-V 0 / 16
(reference 0.0003 / 16), V-Half 0.1056 / 10 (0.106 / 10), V-Min 0.1579 / 8 (0.159 / 8; at unit
costs spans are integers and 171 gives 0.1579, 172 gives 0.1628).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..problem import Problem
from ..schedule import Action, Schedule
from ..simulator import simulate
from . import NotApplicable, make_schedule
from ._deadline import check_deadline
from ._listsched import Rows, drop_microbatches, fill_w_slots, order_peak


def _require_v(problem: Problem, name: str) -> None:
    if problem.num_chunks != 2 or problem.placement != "vshape":
        raise NotApplicable(
            f"{name} needs num_chunks=2 and placement='vshape' "
            f"(problem has num_chunks={problem.num_chunks}, placement={problem.placement!r})"
        )


# ---- ZB-V --------------------------------------------------------------------------------------


def zbv_rows(p: int, m: int) -> Rows:
    """ZB-V orders for p devices and m microbatches (built for max(m, 2p-1), extra dropped)."""
    n = max(m, 2 * p - 1)
    rows: Rows = []
    for d in range(p):
        row: list[Action] = []
        nf = [0, 0]  # forwards issued per chunk
        nb = [0, 0]  # backwards issued per chunk
        nw = [0, 0]  # weight-grads issued per chunk

        def f(c: int, row: list[Action] = row, nf: list[int] = nf) -> None:
            row.append(Action("F", nf[c], c))
            nf[c] += 1

        def b(c: int, row: list[Action] = row, nb: list[int] = nb) -> None:
            row.append(Action("B", nb[c], c))
            nb[c] += 1

        def w(c: int, row: list[Action] = row, nw: list[int] = nw) -> None:
            row.append(Action("W", nw[c], c))
            nw[c] += 1

        for _ in range(2 * (p - d) - 1):
            f(0)
        for _ in range(d):
            f(1)
            f(0)
        for _ in range(p - d):
            f(1)
            b(1)
            w(1)
        while nf[1] < nf[0] or nf[0] < n:
            if nf[0] < n:
                f(0)
            b(0)
            w(0)
            f(1)
            b(1)
            w(1)
        for _ in range(d):
            b(0)
            b(1)
        for _ in range(p - d):
            b(0)
            w(0)
        while nw[1] < nb[1]:
            w(1)
        while nw[0] < nb[0]:
            w(0)
        rows.append(row)
    return drop_microbatches(rows, m)


def zbv(problem: Problem) -> Schedule:
    """ZB-V: 2 chunks in V placement, peak 2p chunk units, about zero bubble when F = B = W."""
    _require_v(problem, "zbv")
    rows = zbv_rows(problem.num_stages, problem.num_microbatches)
    return make_schedule(problem, "zbv", rows, {"chunks": 2, "placement": "vshape"})


# ---- V-Half / V-Min building blocks ------------------------------------------------------------

# Slot offsets (F chunk 0, F chunk 1, B chunk 1, B chunk 0) of microbatch 0 on stage i; microbatch
# j adds 6j. Dependencies are one slot apart at least; the extra gap e lets the offsets stay
# distinct mod 6 for every p.


def _block_half(p: int, i: int) -> tuple[int, int, int, int]:
    e = 3 if p % 2 == 0 else 0
    return (2 * i, 3 * p - i - 2, 3 * p + e + 2 * i - 1, 6 * p + e - i - 2)


def _block_min(p: int, i: int) -> tuple[int, int, int, int]:
    e = 2 if p % 3 == 0 else 0
    return (i, 2 * p - i - 1, 2 * p + e + i, 4 * p + e - i - 1)


def block_slots(p: int, m: int, kind: str) -> list[list[tuple[int, Action]]]:
    """Repeated building-block slots (W filled in, before squeezing), ``kind`` "half" or "min"."""
    block = _block_half if kind == "half" else _block_min
    slots = []
    for i in range(p):
        f0, f1, b1, b0 = block(p, i)
        pairs: list[tuple[int, Action]] = []
        for j in range(m):
            o = 6 * j
            pairs += [
                (f0 + o, Action("F", j, 0)),
                (f1 + o, Action("F", j, 1)),
                (b1 + o, Action("B", j, 1)),
                (b0 + o, Action("B", j, 0)),
            ]
        slots.append(pairs)
    return fill_w_slots(slots)


def _v_block(problem: Problem, kind: str, name: str) -> Schedule:
    _require_v(problem, name)
    p, m = problem.num_stages, problem.num_microbatches
    slots = block_slots(p, m, kind)
    rows = [[a for _, a in row] for row in slots]
    caps = [order_peak(problem, r, s) for s, r in enumerate(rows)]
    best, best_ms, best_variant = rows, simulate(problem, rows).evaluation.makespan, "block"
    phase = _phases(problem, slots)

    def no_w(sl: list[list[tuple[int, Action]]]) -> list[list[tuple[int, Action]]]:
        return [[(t, a) for t, a in row if a.op != "W"] for row in sl]

    variants = {
        "squeeze": lambda: _squeeze(problem, slots, caps),
        "squeeze-lazy-w": lambda: fill_w_slots(_squeeze(problem, no_w(slots), caps, lazy_w=True)),
        "squeeze-ends": lambda: fill_w_slots(
            _squeeze(
                problem,
                no_w(_squeeze(problem, slots, caps, lambda s, a: phase[(s, a)] != 1)),
                caps,
                lambda s, a: phase[(s, a)] == 2,
                lazy_w=True,
            )
        ),
    }
    for vname, make in variants.items():
        check_deadline()
        cand = [[a for _, a in row] for row in make()]
        if any(order_peak(problem, r, s) > caps[s] * (1 + 1e-9) for s, r in enumerate(cand)):
            continue
        ms = simulate(problem, cand).evaluation.makespan
        if ms is not None and (best_ms is None or ms < best_ms - 1e-12):
            best, best_ms, best_variant = cand, ms, vname
    target = (p + 2) // 2 if kind == "half" else (p + 4) // 3
    return make_schedule(
        problem,
        name,
        best,
        {"chunks": 2, "placement": "vshape", "peak_microbatches": target, "variant": best_variant},
    )


def v_half(problem: Problem) -> Schedule:
    """V-Half: peak (p+2)//2 microbatches of activation, bubble about half of 1F1B's."""
    return _v_block(problem, "half", "v-half")


def v_min(problem: Problem) -> Schedule:
    """V-Min: peak (p+4)//3 microbatches of activation, bubble about 2/3 of 1F1B's."""
    return _v_block(problem, "min", "v-min")


def _phases(
    problem: Problem, slots: list[list[tuple[int, Action]]]
) -> dict[tuple[int, Action], int]:
    """Phase of each op in slot order: 0 warm-up (before stage 0's first chunk-0 B), 1 steady
    (until stage 0's last chunk-0 F), 2 cool-down."""
    m = problem.num_microbatches
    phase = 0
    out: dict[tuple[int, Action], int] = {}
    for _t, s, a in sorted((t, s, a) for s, row in enumerate(slots) for t, a in row):
        if phase == 0 and s == 0 and a == Action("B", 0, 0):
            phase = 1
        out[(s, a)] = phase
        if phase == 1 and s == 0 and a == Action("F", m - 1, 0):
            phase = 2
    return out


def _lazy_w_level(
    occupied: np.ndarray, fb: np.ndarray, b_cnt: np.ndarray, b_w: np.ndarray
) -> np.ndarray:
    """Memory after each slot of stage s when W are not placed yet but fill the free slots after
    their B in arrival order: ``fb[t]`` is what the F/B in slot t change, ``b_cnt[t]`` 1 where
    slot t holds a B and ``b_w[t]`` the W-free it queues (m_w of its chunk)."""
    arrivals = b_cnt.astype(np.int64)
    a_cum = np.cumsum(arrivals)
    free = (~occupied).astype(np.int64)
    f_cum = np.cumsum(free)
    # W served by slot t: min over k <= t of A(k-1) + free slots in [k, t]; a W needs a free slot
    # strictly after its B, so the arrivals count at k is those before slot k.
    a_prev = np.concatenate(([0], a_cum[:-1]))
    f_prev = np.concatenate(([0], f_cum[:-1]))
    served = f_cum + np.minimum.accumulate(a_prev - f_prev)
    served = np.minimum(served, a_cum)
    order = np.flatnonzero(arrivals)
    w_cum = np.concatenate(([0.0], np.cumsum(b_w[order])))
    return np.cumsum(fb) + w_cum[served]


def _squeeze(
    problem: Problem,
    slots: list[list[tuple[int, Action]]],
    caps: list[float],
    movable: Callable[[int, Action], bool] | None = None,
    lazy_w: bool = False,
) -> list[list[tuple[int, Action]]]:
    """Move ops to earlier free slots without raising any stage's order peak above its cap.

    Ops are visited in slot order (all stages together); each goes to the earliest free slot
    after its dependencies (previous layer group's F, own F, next group's B, own B for W) and
    after the same op of the previous microbatch, provided the stage's memory level stays within
    ``caps``. ``movable(stage, action)`` can pin ops in place. With ``lazy_w`` the slots hold F
    and B only and memory assumes each W takes the first free slot after its B (as
    ``fill_w_slots`` will place them afterwards).
    """
    p, v = problem.num_stages, problem.num_chunks
    m_f, m_b, m_w = problem.cost("m_f"), problem.cost("m_b"), problem.cost("m_w")
    table = problem.group_table
    last = max((t for row in slots for t, _ in row), default=0)
    horizon = last + 2 + (4 * problem.num_microbatches if lazy_w else 0)
    where: dict[tuple[int, Action], int] = {}
    occupied = [np.zeros(horizon, dtype=bool) for _ in range(p)]
    fb = [np.zeros(horizon) for _ in range(p)]  # memory change of the op in each slot
    b_w = [np.zeros(horizon) for _ in range(p)]  # lazy W: W-free queued by the B in each slot
    b_cnt = [np.zeros(horizon, dtype=np.int64) for _ in range(p)]
    level = [np.zeros(horizon) for _ in range(p)]

    def delta(s: int, a: Action) -> float:
        c = a.chunk
        return float(m_f[s, c] if a.op == "F" else m_b[s, c] if a.op == "B" else m_w[s, c])

    def put(s: int, a: Action, t: int, sign: int) -> None:
        occupied[s][t] = sign > 0
        fb[s][t] += sign * delta(s, a)
        if lazy_w and a.op == "B":
            b_w[s][t] += sign * float(m_w[s, a.chunk])
            b_cnt[s][t] += sign

    for s, row in enumerate(slots):
        for t, a in row:
            where[(s, a)] = t
            put(s, a, t, +1)
        level[s] = (
            _lazy_w_level(occupied[s], fb[s], b_cnt[s], b_w[s]) if lazy_w else np.cumsum(fb[s])
        )
    visit = sorted(((t, s, a) for s, row in enumerate(slots) for t, a in row))
    for n_visited, (t1, s, a) in enumerate(visit):
        if n_visited % 256 == 0:
            check_deadline()
        if movable is not None and not movable(s, a):
            continue
        g = problem.group_of(s, a.chunk)
        deps: list[tuple[int, Action]] = []
        if a.op == "F":
            if g > 0:
                ps, pc = table[g - 1]
                deps.append((ps, Action("F", a.mb, pc)))
        elif a.op == "B":
            deps.append((s, Action("F", a.mb, a.chunk)))
            if g < p * v - 1:
                ns, nc = table[g + 1]
                deps.append((ns, Action("B", a.mb, nc)))
        else:
            deps.append((s, Action("B", a.mb, a.chunk)))
        if a.mb > 0:
            deps.append((s, Action(a.op, a.mb - 1, a.chunk)))
        lo = 1 + max((where[k] for k in deps if k in where), default=-1)
        if lo >= t1:
            continue
        cand = lo + np.flatnonzero(~occupied[s][lo:t1])
        if cand.size == 0:
            continue
        dl = delta(s, a)
        if not lazy_w:
            if dl > 0:
                seg = level[s][lo:t1]
                sufmax = np.maximum.accumulate(seg[::-1])[::-1]
                ok = sufmax[cand - lo] + dl <= caps[s] * (1 + 1e-12) + 1e-12
                cand = cand[ok]
            if cand.size == 0:
                continue
            t0 = int(cand[0])
            put(s, a, t1, -1)
            put(s, a, t0, +1)
            level[s][t0:t1] += dl
            where[(s, a)] = t0
            continue
        for t0 in cand.tolist():
            put(s, a, t1, -1)
            put(s, a, t0, +1)
            lev = _lazy_w_level(occupied[s], fb[s], b_cnt[s], b_w[s])
            if lev.max() <= caps[s] * (1 + 1e-12) + 1e-12:
                level[s] = lev
                where[(s, a)] = t0
                break
            put(s, a, t0, -1)
            put(s, a, t1, +1)
    out: list[list[tuple[int, Action]]] = [[] for _ in range(p)]
    for (s, a), t in where.items():
        out[s].append((t, a))
    for row in out:
        row.sort()
    return out
