"""The action search's moves (``action_search``) and the critical chain they aim at (issue 32).

A move takes a schedule's action lists and returns new ones (None where it does not apply); it
never checks timing or memory: the one simulator judges every candidate. Single moves change one
action (drop an offload, move one action past a few compute ops, swap two compute ops, add an
offload); the compound ones change several at once where no single move gets there without
passing through a slower or infeasible schedule:

- ``defer``: a compute op of a run of the critical chain on one stage moved past the run's last
  op (the run shortens by its duration: a step the swaps of neighbours cannot take, since every
  position inside the run times the same);
- ``swap_offload``: one activation's offload dropped and another's added on the same stage
  (which microbatch holds the copy lane);
- ``kick``: several random moves at once, for the iterated search's restarts.

``critical_chain`` reads the simulator's timeline: from the op that ends last, back along the
constraint that set each op's start (the previous compute op of its stage, a dependency on
another stage, its RELOAD, the OFFLOAD its memory waited for, the transfer before it on its copy
lane), so the moves can aim at where the makespan's chain waits.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from ..schedule.lanes import stage_lanes
from ..schedule.problem import Problem
from ..schedule.schedule import Action, Violation
from ..schedule.sim_ops import encode
from ..schedule.simulator import Timeline

Rows = list[list[Action]]
# how many compute ops past the run's end ``defer`` puts what it moves (drawn)
DEFER_REACH = (0, 0, 0, 1, 2, 4, 8)
# the share of ``defer``'s draws that move only W's
W_FIRST = 0.9


def drop(rows: Rows, s: int, keys: set[tuple[int, int]]) -> Rows | None:
    """Rows with stage ``s``'s OFFLOAD and RELOAD of the (mb, chunk) ``keys`` removed."""
    row = [a for a in rows[s] if not (a.op in ("OFFLOAD", "RELOAD") and (a.mb, a.chunk) in keys)]
    if len(row) == len(rows[s]):
        return None
    out = list(rows)
    out[s] = row
    return out


def move(rows: Rows, s: int, i: int, steps: int) -> Rows | None:
    """Rows with stage ``s``'s action ``i`` moved past ``steps`` compute ops (negative: earlier)."""
    row = list(rows[s])
    a = row.pop(i)
    j = i
    k = abs(steps)
    if steps < 0:
        while k and j > 0:
            j -= 1
            if row[j].is_compute:
                k -= 1
    else:
        while k and j < len(row):
            if row[j].is_compute:
                k -= 1
            j += 1
    if j == i:
        return None
    row.insert(j, a)
    out = list(rows)
    out[s] = row
    return out


def swap_compute(rows: Rows, s: int, i: int) -> Rows | None:
    """Rows with stage ``s``'s compute op ``i`` and the next compute op swapped."""
    row = list(rows[s])
    if not row[i].is_compute:
        return None
    j = i + 1
    while j < len(row) and not row[j].is_compute:
        j += 1
    if j >= len(row) or (row[i].mb, row[i].chunk) == (row[j].mb, row[j].chunk):
        return None
    row[i], row[j] = row[j], row[i]
    out = list(rows)
    out[s] = row
    return out


def add_offload(rows: Rows, s: int, mb: int, chunk: int) -> Rows | None:
    """Rows with (mb, chunk) offloaded on stage ``s``: OFFLOAD right after its F, RELOAD two
    compute ops before its B (or BW)."""
    row = list(rows[s])
    f = next((i for i, a in enumerate(row) if a.op == "F" and (a.mb, a.chunk) == (mb, chunk)), None)
    b = next(
        (i for i, a in enumerate(row) if a.op in ("B", "BW") and (a.mb, a.chunk) == (mb, chunk)),
        None,
    )
    if f is None or b is None or b <= f + 1:
        return None
    row.insert(f + 1, Action("OFFLOAD", mb, chunk))
    b += 1
    j, k = b, 2
    while k and j > f + 2:
        j -= 1
        if row[j].is_compute:
            k -= 1
    row.insert(max(j, f + 2), Action("RELOAD", mb, chunk))
    out = list(rows)
    out[s] = row
    return out


@dataclass(frozen=True)
class Chain:
    """The critical chain of a timed schedule: ``runs``, per run of consecutive chain ops on
    one stage, (stage, list positions of its compute ops in order); ``links``, per link of the
    chain that is not the previous compute op of the same stage, (stage, position) of the op
    whose end set the next one's start."""

    runs: list[tuple[int, list[int]]]
    links: list[tuple[int, int]]


# which tight constraint the walk back follows first (a wait rather than the stage's own queue)
_ORDER = {"memory": 0, "reload": 1, "stage": 2, "lane": 3, "issue": 4, "own": 5, "queue": 6}


def critical_chain(problem: Problem, rows: Rows, timeline: Timeline) -> Chain:
    """The chain of ops that sets the makespan (module doc), from the timeline of ``rows``."""
    pb = problem
    violations: list[Violation] = []
    ops = encode(pb, rows, violations)
    assert ops is not None
    ops.link(pb)
    n = ops.n
    start = np.concatenate(timeline.start) if n else np.zeros(0)
    end = np.concatenate(timeline.end) if n else np.zeros(0)
    off = ops.offset.tolist()
    stage = ops.stage.tolist()
    is_c = ops.is_compute.tolist()
    code = ops.code.tolist()
    # the previous op of the same queue (compute, or transfer of the same kind) on each stage
    prev = [-1] * n
    for s in range(pb.num_stages):
        last: dict[bool | int, int] = {}
        for x in range(off[s], off[s + 1]):
            q: bool | int = True if is_c[x] else code[x]
            prev[x] = last.get(q, -1)
            last[q] = x
    # per lane, its transfers by end time (a transfer that waited for its lane)
    lanes = stage_lanes(pb)
    by_lane: dict[int, list[tuple[float, int]]] = {}
    for x in range(n):
        if not is_c[x]:
            lane = lanes[stage[x]][1 if code[x] == 5 else 0]
            by_lane.setdefault(lane, []).append((float(end[x]), x))
    for v in by_lane.values():
        v.sort()
    waited: dict[int, int] = {}
    for s in range(pb.num_stages):
        for a, b in timeline.memory_waits[s] + timeline.reload_waits[s]:
            waited[off[s] + a] = off[s] + b
    eps = 1e-9 * max(1.0, float(end.max()) if n else 1.0)
    x = int(np.argmax(end)) if n else -1
    path: list[tuple[int, str]] = []
    seen = {x}
    while x >= 0:
        t = float(start[x])
        tight: list[tuple[int, int]] = []  # (order, op)
        if prev[x] >= 0 and abs(end[prev[x]] - t) <= eps:
            tight.append((_ORDER["queue"], prev[x]))
        for k in range(3):
            d = int(ops.dep[k, x])
            if d >= n:
                continue
            lag = float(ops.lag[k, x]) if k < 2 else 0.0
            if abs(end[d] + lag - t) <= eps:
                if not is_c[x] and k == 1:
                    kind = "issue"
                elif stage[d] != stage[x]:
                    kind = "stage"
                elif code[d] == 5:
                    kind = "reload"
                else:
                    kind = "own"
                tight.append((_ORDER[kind], d))
        if x in waited and abs(end[waited[x]] - t) <= eps:
            tight.append((_ORDER["memory"], waited[x]))
        if not is_c[x]:
            lane = by_lane[lanes[stage[x]][1 if code[x] == 5 else 0]]
            i = bisect_left(lane, (t - eps, -1))
            if i < len(lane) and lane[i][0] <= t + eps and lane[i][1] != x:
                tight.append((_ORDER["lane"], lane[i][1]))
        if not tight:
            path.append((x, "start"))
            break
        _order, y = min(tight)
        if y in seen:  # zero-length ops tied on a lane: the walk would go round
            path.append((x, "start"))
            break
        seen.add(y)
        # a compute op of the same stage ends the run's previous op (its queue or its own
        # dependency): the run goes on
        same = is_c[y] and is_c[x] and stage[y] == stage[x]
        path.append((x, "queue" if same else "link"))
        x = y
    path.reverse()
    runs: list[tuple[int, list[int]]] = []
    links: list[tuple[int, int]] = []
    for j, (x, why) in enumerate(path):
        s = stage[x]
        if why == "link" and j > 0:
            y = path[j - 1][0]
            links.append((stage[y], y - off[stage[y]]))
        if not is_c[x]:
            continue
        if runs and runs[-1][0] == s and why == "queue":
            runs[-1][1].append(x - off[s])
        else:
            runs.append((s, [x - off[s]]))
    return Chain(runs, links)


def defer(rows: Rows, chain: Chain, rng: random.Random) -> Rows | None:
    """One to three compute ops of a run of the critical chain (``Chain.runs``) moved past the
    run's last op, and up to ``DEFER_REACH`` compute ops further: the run no longer waits for
    them (several at once: a run tied with another chain shortens only when both do)."""
    runs = [r for r in chain.runs if len(r[1]) > 1]
    if not runs:
        return None
    s, pos = rng.choice(runs)
    count = min(len(pos) - 1, rng.choice((1, 1, 1, 1, 2, 2, 3)))
    # mostly W's: nothing waits for them, so they cannot stall another op (a B or F moved
    # later may)
    ws = [y for y in pos[:-1] if rows[s][y].op == "W"]
    pool = ws if len(ws) >= count and rng.random() < W_FIRST else pos[:-1]
    picked = sorted(rng.sample(pool, count), reverse=True)
    extra = rng.choice(DEFER_REACH)
    row = list(rows[s])
    z = pos[-1]
    moved = [row.pop(y) for y in picked]  # from the last: the positions before stay put
    z -= count
    j = z + 1
    while extra and j < len(row):
        if row[j].is_compute:
            extra -= 1
        j += 1
    for a in moved:  # the last picked goes in last (``moved`` is in reverse list order)
        row.insert(j, a)
    out = list(rows)
    out[s] = row
    return out


def advance(rows: Rows, chain: Chain, rng: random.Random) -> Rows | None:
    """The op behind one of the chain's waits (``Chain.links``: a dependency on another stage,
    a reload, the offload a forward waited for, a transfer ahead on the lane) moved one to
    three compute ops earlier on its stage; where it is a copy, half the time that activation's
    offload dropped instead (the wait goes with it, if the memory allows)."""
    if not chain.links:
        return None
    s, i = rng.choice(chain.links)
    a = rows[s][i]
    if not a.is_compute and rng.random() < 0.5:
        return drop(rows, s, {(a.mb, a.chunk)})
    return move(rows, s, i, -rng.choice((1, 1, 2, 3)))
