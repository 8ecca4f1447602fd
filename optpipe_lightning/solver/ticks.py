"""Integer time for the solvers: one tick per problem, and every duration in ticks.

CP-SAT and the MILPs work in integer ticks. When every duration is a whole multiple of one tick
small enough to keep the horizon under ``MAX_TICKS`` (the usual case for round benchmark numbers
and for profiles rounded to microseconds) the tick model is exact: the solver's objective is the
simulator's makespan. Otherwise durations are rounded up, so a tick solution still times no later
in the simulator, and the solver's proven bound is not used (see ``TickModel.exact``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..schedule.problem import Problem

MAX_TICKS = 10_000_000

OpKey = tuple[str, int, int, int]  # (op, stage, chunk, mb), op in F B W BW OFFLOAD RELOAD


def fusable(problem: Problem) -> set[tuple[int, int]]:
    """The (stage, chunk)s whose fused backward (BW) is cheaper than B then W: only there can a
    schedule gain by fusing, so only there do the solvers offer the choice."""
    t_b, t_w, t_bw = problem.cost("t_b"), problem.cost("t_w"), problem.cost("t_bw")
    cheaper = t_bw < (t_b + t_w) * (1 - 1e-9)
    return {(int(s), int(c)) for s, c in zip(*cheaper.nonzero(), strict=True)}


@dataclass(frozen=True)
class TickModel:
    tick: float  # seconds per tick
    exact: bool
    t_f: list[list[int]]
    t_b: list[list[int]]
    t_w: list[list[int]]
    comm: list[list[int]]
    t_off: list[list[int]]
    t_rel: list[list[int]]
    # the fused backward where it is cheaper than B + W (``fusable``); elsewhere t_b + t_w
    t_bw: list[list[int]]

    def to_ticks(self, seconds: float) -> int:
        return round(seconds / self.tick)

    def duration(self, op: str, s: int, c: int) -> int:
        table = {
            "F": self.t_f,
            "B": self.t_b,
            "W": self.t_w,
            "BW": self.t_bw,
            "OFFLOAD": self.t_off,
            "RELOAD": self.t_rel,
        }[op]
        return table[s][c]


def _durations(problem: Problem) -> list[float]:
    p, v = problem.num_stages, problem.num_chunks
    out: list[float] = []
    for name in ("t_f", "t_b", "t_w", "t_comm"):
        out.extend(float(x) for x in problem.cost(name).ravel())
    t_bw = problem.cost("t_bw")
    out.extend(float(t_bw[s, c]) for s, c in sorted(fusable(problem)))
    if problem.offload is not None:
        for s in range(p):
            for c in range(v):
                out.append(problem.offload_time(s, c))
                out.append(problem.reload_time(s, c))
    return out


def _exact_tick(values: list[float], horizon: float) -> float | None:
    """The largest tick that divides every value exactly (within 1e-9), if the horizon allows."""
    positive = [x for x in values if x > 0]
    if not positive:
        return 1.0
    for k in range(0, 10):
        scale = 10.0**k
        ints = []
        ok = True
        for x in positive:
            y = x * scale
            r = round(y)
            if r == 0 or abs(y - r) > 1e-9 * max(1.0, y):
                ok = False
                break
            ints.append(r)
        if ok:
            g = 0
            for r in ints:
                g = math.gcd(g, r)
            tick = g / scale
            if horizon / tick <= MAX_TICKS:
                return tick
            return None
    return None


def tick_model(problem: Problem, horizon_seconds: float) -> TickModel:
    """Choose the tick for a problem whose schedules end by ``horizon_seconds``."""
    values = _durations(problem)
    tick = _exact_tick(values, max(horizon_seconds, 1e-30))
    exact = tick is not None
    if tick is None:
        smallest = min((x for x in values if x > 0), default=1.0)
        tick = max(horizon_seconds / (MAX_TICKS / 10), smallest / 100)

    def conv(x: float) -> int:
        if x <= 0:
            return 0
        y = x / tick
        r = round(y)
        if abs(y - r) <= 1e-6 * max(1.0, y):
            return max(int(r), 1)
        return max(math.ceil(y), 1)

    p, v = problem.num_stages, problem.num_chunks

    def table(name: str) -> list[list[int]]:
        arr = problem.cost(name)
        return [[conv(float(arr[s, c])) for c in range(v)] for s in range(p)]

    t_b, t_w, t_bw = table("t_b"), table("t_w"), table("t_bw")
    fuse = fusable(problem)
    bw = [
        [
            min(t_bw[s][c], t_b[s][c] + t_w[s][c]) if (s, c) in fuse else t_b[s][c] + t_w[s][c]
            for c in range(v)
        ]
        for s in range(p)
    ]

    return TickModel(
        tick=tick,
        exact=exact,
        t_f=table("t_f"),
        t_b=t_b,
        t_w=t_w,
        comm=table("t_comm"),
        t_off=[[conv(problem.offload_time(s, c)) for c in range(v)] for s in range(p)],
        t_rel=[[conv(problem.reload_time(s, c)) for c in range(v)] for s in range(p)],
        t_bw=bw,
    )
