"""Zero Bubble's automatic schedule: a greedy under the memory limit (Qi et al., ICLR 2024, §3.1).

One chunk per stage, split backward (``B`` then ``W``). The greedy walks the microbatches and,
keeping its own estimate of every op's end time (ASAP, with ``t_comm`` of the sending stage on
each cross-stage edge -- the simulator's semantics), decides per stage:

1. Warm-up (first microbatch): one ``F`` on every stage, then as many more ``F`` as memory allows
   before the first ``B`` would arrive from the next stage; the knob ``allow_bubble_before_first_b``
   stops one ``F`` earlier instead of letting it overrun the arrival. Stage ``s`` gets fewer
   warm-up ``F`` than stage ``s-1`` (unless it already holds every microbatch).
2. Steady state, one step per microbatch: one ``F`` per stage (stages ascending), then one ``B``
   per stage (descending). Before each op: ``W`` run while memory blocks it (a ``W`` frees
   ``m_w``); ``W`` fill any idle gap they fit in before the op's input arrives; a smaller gap gets
   a ``W`` when leaving it idle would raise the largest cumulative bubble among stages (always,
   with the knob ``no_bubble_greedy``). Stage 0 runs its pending ``W`` before its ``B`` once it has
   no forward left.
3. With ``prioritize_b``, a stage ahead of the next by two or more forwards skips its ``F`` when the
   next stage's ``B`` is already due, or when the idle time that saves stays within the largest
   cumulative bubble; a stage never runs an ``F`` the next stage skips.
4. The remaining ``W`` close every stage.

The 8 knob combinations are simulated (the one simulator) and the best kept: the smallest largest
stage span (the paper's objective; ties: the smaller makespan). If the greedy cannot fit the
limit with any knobs, a 1F1B order with split backward and memory-capped warm-up is returned
(``params["fallback"]``). Not applicable: more than one chunk, or a limit below what one
microbatch needs on some stage (``max(m_f, m_f + m_b)``).
"""

from __future__ import annotations

import itertools
import math

from ..problem import Problem
from ..schedule import Action, Schedule
from ..simulator import Timeline, simulate
from ..units import distinct
from . import NotApplicable, make_schedule
from ._common import require_single_chunk
from ._deadline import check_deadline

_KNOBS = ("allow_bubble_before_first_b", "prioritize_b", "no_bubble_greedy")
_EPS = 1e-12  # relative slack in time comparisons (float sums of the same costs)


class _CannotFit(Exception):
    """This knob setting cannot keep the memory limit (or reached an unplaced dependency)."""


class _Greedy:
    def __init__(self, pb: Problem, allow_bubble: bool, prioritize_b: bool, no_bubble: bool):
        p, m = pb.num_stages, pb.num_microbatches
        self.p, self.m = p, m
        self.allow_bubble, self.prioritize_b, self.no_bubble = allow_bubble, prioritize_b, no_bubble
        col = 0
        self.tf = [float(x) for x in pb.cost("t_f")[:, col]]
        self.tb = [float(x) for x in pb.cost("t_b")[:, col]]
        self.tw = [float(x) for x in pb.cost("t_w")[:, col]]
        comm = [float(x) for x in pb.cost("t_comm")[:, col]]
        # lag of the edge into stage s: forward from s-1, backward from s+1 (sender's t_comm)
        self.lag_f = [comm[s - 1] if s > 0 else 0.0 for s in range(p)]
        self.lag_b = [comm[s + 1] if s + 1 < p else 0.0 for s in range(p)]
        self.mf = [float(x) for x in pb.cost("m_f")[:, col]]
        self.mb = [float(x) for x in pb.cost("m_b")[:, col]]
        self.mw = [float(x) for x in pb.cost("m_w")[:, col]]
        self.limit = [math.inf if x is None else x for x in pb.memory_limits()]
        scale = max(max(self.tf), max(self.tb), max(self.tw), 1e-30)
        self.eps = _EPS * scale * (m + p) * 4
        self.n_f, self.n_b, self.n_w = [0] * p, [0] * p, [0] * p
        self.mem = [0.0] * p
        self.clock = [0.0] * p
        self.bubble = [0.0] * p
        self.end_f = [[math.nan] * m for _ in range(p)]
        self.end_b = [[math.nan] * m for _ in range(p)]
        self.rows: list[list[Action]] = [[] for _ in range(p)]

    # ---- primitives ----------------------------------------------------------------------

    def fits(self, s: int, level: float) -> bool:
        lim = self.limit[s]
        return level <= lim + 1e-10 * max(abs(lim), 1.0)

    def put(self, s: int, op: str) -> None:
        if op == "F":
            mb, dur, delta = self.n_f[s], self.tf[s], self.mf[s]
            ready = self.end_f[s - 1][mb] + self.lag_f[s] if s > 0 else 0.0
        elif op == "B":
            mb, dur, delta = self.n_b[s], self.tb[s], self.mb[s]
            if mb >= self.n_f[s]:
                raise _CannotFit(f"stage {s} B{mb} before its F")
            ready = self.end_b[s + 1][mb] + self.lag_b[s] if s + 1 < self.p else 0.0
        else:
            mb, dur, delta = self.n_w[s], self.tw[s], self.mw[s]
            ready = 0.0
        if math.isnan(ready):
            raise _CannotFit(f"stage {s} {op}{mb} before its input")
        start = max(self.clock[s], ready)
        if self.n_f[s] > 0:
            self.bubble[s] += start - self.clock[s]
        self.clock[s] = start + dur
        self.mem[s] += delta
        if op == "F":
            self.end_f[s][mb] = self.clock[s]
            self.n_f[s] += 1
        elif op == "B":
            self.end_b[s][mb] = self.clock[s]
            self.n_b[s] += 1
        else:
            self.n_w[s] += 1
        self.rows[s].append(Action(op, mb))

    def make_room(self, s: int, delta: float) -> None:
        """Run pending W until an op that changes memory by ``delta`` fits."""
        while not self.fits(s, self.mem[s] + delta):
            if self.n_w[s] >= self.n_b[s]:
                raise _CannotFit(f"stage {s} has no W left to free memory")
            self.put(s, "W")

    def fill_gap(self, s: int, arrival: float) -> None:
        """Put W into the idle time before an input arrives at ``arrival``."""
        while self.n_w[s] < self.n_b[s] and self.clock[s] + self.tw[s] <= arrival + self.eps:
            self.put(s, "W")
        if self.n_w[s] < self.n_b[s] and self.clock[s] < arrival - self.eps:
            gap = arrival - self.clock[s]
            if gap > max(self.bubble) - self.bubble[s] + self.eps or self.no_bubble:
                self.put(s, "W")

    # ---- phases --------------------------------------------------------------------------

    def warm_up(self) -> None:
        p, m = self.p, self.m
        for s in range(p):
            self.make_room(s, self.mf[s])
            self.put(s, "F")
        extra = [0] * p
        b_end = self.end_f[p - 1][0] + self.tb[p - 1]  # estimated end of B0 on the last stage
        for s in range(p - 2, -1, -1):
            level, clock = self.mem[s], self.clock[s]
            arrival = b_end + self.lag_b[s]
            while self.n_f[s] + extra[s] < m and self.fits(s, level + self.mf[s]):
                if self.allow_bubble:
                    if clock + self.tf[s] > arrival + self.eps:
                        break
                elif clock >= arrival - self.eps:
                    break
                level += self.mf[s]
                clock += self.tf[s]
                extra[s] += 1
            b_end = max(clock, arrival) + self.tb[s]
        for s in range(1, p):
            while extra[s] > 0 and extra[s] >= extra[s - 1] and self.n_f[s] + extra[s] < m:
                extra[s] -= 1
            extra[s] = min(extra[s], extra[s - 1])  # never ahead of the stage feeding it
        for s in range(p):
            for _ in range(extra[s]):
                self.make_room(s, self.mf[s])
                self.put(s, "F")
        for s in range(p - 1, -1, -1):
            self.make_room(s, self.mb[s])
            self.put(s, "B")

    def wants_forward(self, s: int) -> bool:
        if self.n_f[s] >= self.m:
            return False
        if not (self.prioritize_b and s + 1 < self.p and self.n_f[s] >= self.n_f[s + 1] + 2):
            return True
        nxt = s + 1
        next_b = self.clock[nxt] + self.tf[nxt] + self.tb[nxt] + self.lag_b[s]
        if self.clock[s] >= next_b - self.eps:
            return False
        # W needed to make room for the F, then: does the F fit before the next B arrives?
        level, w_cost, k = self.mem[s] + self.mf[s], 0.0, 0
        while not self.fits(s, level) and self.n_w[s] + k < self.n_b[s]:
            w_cost += self.tw[s]
            level += self.mw[s]
            k += 1
        if self.clock[s] + self.tf[s] + w_cost <= next_b + self.eps:
            return True
        # skipping leaves next_b - clock idle: fine while it stays within the largest bubble
        return next_b - self.clock[s] > max(self.bubble) - self.bubble[s] + self.eps

    def step(self, i: int) -> None:
        p = self.p
        want = [self.wants_forward(s) for s in range(p)]
        for s in range(p - 2, -1, -1):
            want[s] = want[s] and want[s + 1]
        for s in range(p):
            if not want[s]:
                continue
            self.make_room(s, self.mf[s])
            if s > 0:
                arrival = self.end_f[s - 1][self.n_f[s]] + self.lag_f[s]
                if math.isnan(arrival):
                    raise _CannotFit(f"stage {s} F{self.n_f[s]} before stage {s - 1}'s")
                self.fill_gap(s, arrival)
            self.put(s, "F")
        for s in range(p - 1, -1, -1):
            self.make_room(s, self.mb[s])
            if s + 1 < p:
                self.fill_gap(s, self.end_b[s + 1][i] + self.lag_b[s])
            if s == 0 and self.n_f[s] == self.m:
                while self.n_w[s] < self.n_b[s]:
                    self.put(s, "W")
            self.put(s, "B")

    def run(self) -> list[list[Action]]:
        self.warm_up()
        for i in range(1, self.m):
            check_deadline()
            self.step(i)
        for s in range(self.p):
            while self.n_w[s] < self.m:
                self.put(s, "W")
        return self.rows


def greedy_order(
    problem: Problem,
    allow_bubble_before_first_b: bool,
    prioritize_b: bool,
    no_bubble_greedy: bool,
) -> list[list[Action]] | None:
    """The greedy's per-stage order for one knob setting, or None if it cannot fit the limit."""
    try:
        return _Greedy(problem, allow_bubble_before_first_b, prioritize_b, no_bubble_greedy).run()
    except _CannotFit:
        return None


def capped_1f1b_order(problem: Problem) -> list[list[Action]]:
    """1F1B with split backward (W right after B) and warm-up capped by the memory limit."""
    p, m = problem.num_stages, problem.num_microbatches
    mf, mb = problem.cost("m_f")[:, 0], problem.cost("m_b")[:, 0]
    rows: list[list[Action]] = []
    prev = m
    for s, lim in enumerate(problem.memory_limits()):
        warm = min(p - s - 1, m - 1, prev)
        if lim is not None and mf[s] > 0:
            one = max(mf[s], mf[s] + mb[s])
            warm = min(warm, max(0, math.floor((lim - one) / mf[s] + 1e-9)))
        prev = warm
        row = [Action("F", k) for k in range(warm)]
        for k in range(m):
            if warm + k < m:
                row.append(Action("F", warm + k))
            row += [Action("B", k), Action("W", k)]
        rows.append(row)
    return rows


def zb_auto(problem: Problem) -> Schedule:
    require_single_chunk(problem, "zb-auto", "zbv, v-half or v-min")
    mf, mb = problem.cost("m_f")[:, 0], problem.cost("m_b")[:, 0]
    for s, lim in enumerate(problem.memory_limits()):
        need = max(float(mf[s]), float(mf[s] + mb[s]))
        if lim is not None and lim < need * (1 - 1e-9):
            have, needed = distinct(lim, need)
            raise NotApplicable(
                f"memory_limit {have} on stage {s} is below one microbatch's activation "
                f"{needed} (zb-auto never offloads; raise the limit or use an offload schedule)"
            )
    best: tuple[tuple[float, float], list[list[Action]], dict[str, object]] | None = None
    seen: set[tuple[tuple[Action, ...], ...]] = set()
    for values in itertools.product((True, False), repeat=3):
        check_deadline()
        knobs = dict(zip(_KNOBS, values, strict=True))
        rows = greedy_order(problem, *values)
        if rows is None:
            continue
        frozen = tuple(tuple(r) for r in rows)
        if frozen in seen:  # several knob settings often give the same order
            continue
        seen.add(frozen)
        check_deadline()
        res = simulate(problem, rows)
        ev = res.evaluation
        if not ev.feasible or ev.makespan is None or res.timeline is None:
            continue
        key = (_largest_span(res.timeline, problem.num_stages), ev.makespan)
        if best is None or key < best[0]:
            best = (key, rows, {**knobs, "fallback": False})
    if best is None:
        return make_schedule(problem, "zb-auto", capped_1f1b_order(problem), {"fallback": True})
    return make_schedule(problem, "zb-auto", best[1], best[2])


def _largest_span(tl: Timeline, num_stages: int) -> float:
    """max over stages of (end of its last op - start of its first F): the paper's objective."""
    span = 0.0
    for s in range(num_stages):
        ops = tl.compute_rows(s)
        first_f = min(st for a, st, _ in ops if a.op == "F")
        span = max(span, max(en for _, _, en in ops) - first_f)
    return span
