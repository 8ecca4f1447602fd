"""A schedule's simulated timeline as integer tick starts: the solver's hint and horizon."""

from __future__ import annotations

from ..schedule.lanes import stage_lanes
from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from ..schedule.simulator import simulate
from .ticks import OpKey, TickModel


def tick_times(
    problem: Problem, schedule: Schedule, tm: TickModel, keep_fused: bool = False
) -> tuple[dict[OpKey, int], set[tuple[int, int, int]], int] | None:
    """(tick start of every op, offloaded activations, tick makespan) of a schedule.

    Exact ticks: the simulated times divided by the tick. Otherwise the simulated order is
    re-timed ASAP with the (rounded-up) tick durations, so the hint keeps every precedence.
    A schedule with fused BW ops is split into B then W, unless ``keep_fused`` (for CP-SAT,
    whose model can fuse) and the ticks are exact: then each stays one ``BW`` key.
    """
    res = simulate(problem, schedule)
    if not res.feasible or res.timeline is None:
        return None
    tl = res.timeline
    pb = problem
    G = pb.num_virtual_stages
    table = pb.group_table
    items: list[tuple[float, float, str, int, int, int]] = []
    offloaded: set[tuple[int, int, int]] = set()
    for s, row in enumerate(tl.actions):
        for i, a in enumerate(row):
            st, en = float(tl.start[s][i]), float(tl.end[s][i])
            if a.op == "BW" and not (keep_fused and tm.exact):
                mid = st + float(pb.cost("t_b")[s, a.chunk])
                items.append((st, mid, "B", s, a.chunk, a.mb))
                items.append((mid, en, "W", s, a.chunk, a.mb))
            else:
                items.append((st, en, a.op, s, a.chunk, a.mb))
            if a.op == "OFFLOAD":
                offloaded.add((s, a.chunk, a.mb))
    starts: dict[OpKey, int] = {}
    if tm.exact:
        for st, _en, op, s, c, j in items:
            starts[(op, s, c, j)] = tm.to_ticks(st)
    else:
        items.sort(key=lambda x: (x[0], x[1]))
        ends: dict[OpKey, int] = {}
        dev = [0] * pb.num_stages
        lanes = stage_lanes(pb)
        lane_free: dict[int, int] = {}
        gof = {
            (s, c): pb.group_of(s, c) for s in range(pb.num_stages) for c in range(pb.num_chunks)
        }
        for _st, _en, op, s, c, j in items:
            g = gof[(s, c)]
            t = 0
            if op == "F" and g > 0:
                ps, pc = table[g - 1]
                t = ends[("F", ps, pc, j)] + (tm.comm[ps][pc] if ps != s else 0)
            elif op == "B":
                t = ends[("F", s, c, j)]
                if g < G - 1:
                    ns, nc = table[g + 1]
                    t = max(t, ends[("B", ns, nc, j)] + (tm.comm[ns][nc] if ns != s else 0))
                if ("RELOAD", s, c, j) in ends:
                    t = max(t, ends[("RELOAD", s, c, j)])
            elif op == "W":
                t = ends[("B", s, c, j)]
            elif op == "OFFLOAD":
                t = ends[("F", s, c, j)]
            elif op == "RELOAD":
                t = ends[("OFFLOAD", s, c, j)]
            if op in ("OFFLOAD", "RELOAD"):
                lane = lanes[s][op == "RELOAD"]
                t = max(t, lane_free.get(lane, 0))
                e = t + tm.duration(op, s, c)
                lane_free[lane] = e
            else:
                t = max(t, dev[s])
                e = t + tm.duration(op, s, c)
                dev[s] = e
            starts[(op, s, c, j)] = t
            ends[(op, s, c, j)] = e
    makespan = max(
        starts[k] + tm.duration(k[0], k[1], k[2]) for k in starts if k[0] in ("F", "B", "W", "BW")
    )
    return starts, offloaded, makespan
