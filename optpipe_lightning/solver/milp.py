"""The OptPipe-style MILP (Gurobi; HiGHS as an open-source cross-check).

Same decisions and semantics as the CP-SAT model, in big-M form over integer tick start times:
ordering binaries for op pairs of one device not ordered by the dependency DAG (with microbatch
order as symmetry breaking, and pairs the transitive closure orders dropped), offload binaries,
ordering binaries for transfers of one copy lane (``schedule.lanes``: with duplex a channel's
offloads and its reloads on separate lanes), and the memory level checked at every
allocation event (F end, RELOAD start): each other event of that device has a binary saying
whether it happened by then (an allocation must count when it did, a free may count only when
it did; same-instant events net out, as in the simulator). An offload's free sits at its
settle point, conservatively its copy's end plus the stage's longest F (``cpsat.settle_delay``). Starts are integers, so the big-M
float noise is rounded away; the simulator re-times and re-checks every solution anyway.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..schedule.lanes import stage_lanes
from ..schedule.problem import Problem
from .milp_size import MILP_MAX_VARIABLES as MILP_MAX_VARIABLES
from .milp_size import ModelNotBuilt, memory_check_binaries
from .ticks import OpKey, TickModel

SolutionFn = Callable[[dict[OpKey, int], dict[OpKey, int], int, int], None]


@dataclass
class MilpOutcome:
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown"
    objective: int | None
    bound: int | None
    starts: dict[OpKey, int] = field(default_factory=dict)
    ends: dict[OpKey, int] = field(default_factory=dict)
    message: str | None = None


# an event: (start var, constant, delta, active var or -1)
_Event = tuple[int, int, float, int]
# how to derive a binary from start times, for complete MIP starts
_Aux = tuple[str, int, int, int, int]  # (kind, a, b, act_a, act_b) on variable indices


@dataclass
class LinearModel:
    """A solver-neutral MILP: bounds, integrality, sparse rows lo <= a.x <= hi, min c.x."""

    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[list[int], list[float], float, float]] = field(default_factory=list)
    obj: dict[int, float] = field(default_factory=dict)
    start: dict[OpKey, int] = field(default_factory=dict)
    dur: dict[OpKey, int] = field(default_factory=dict)
    offload: dict[tuple[int, int, int], int] = field(default_factory=dict)
    makespan: int = -1
    aux: dict[int, _Aux] = field(default_factory=dict)
    event_const: dict[int, int] = field(default_factory=dict)

    def var(self, lb: float, ub: float, integer: bool) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        return len(self.lb) - 1

    def row(self, coef: dict[int, float], lo: float, hi: float) -> None:
        idx = [k for k, v in coef.items() if v != 0]
        self.rows.append((idx, [coef[k] for k in idx], lo, hi))

    def size(self) -> tuple[int, int]:
        """(variables, constraints), as Gurobi's size limit counts them."""
        return len(self.lb), len(self.rows)

    def complete_start(
        self, starts: dict[OpKey, int], offloaded: set[tuple[int, int, int]]
    ) -> list[float]:
        """A full solution vector (all binaries derived) from start times."""
        x = [0.0] * len(self.lb)
        mk = 0
        for key, i in self.start.items():
            op, s, c, j = key
            if op in ("OFFLOAD", "RELOAD") and (s, c, j) not in offloaded:
                x[i] = 0.0
            else:
                x[i] = float(starts.get(key, 0))
            if op in ("F", "B", "W"):
                mk = max(mk, int(x[i]) + self.dur[key])
        for (s, c, j), i in self.offload.items():
            x[i] = 1.0 if (s, c, j) in offloaded else 0.0
        x[self.makespan] = float(mk)
        for i, (kind, a, b, act_a, act_b) in self.aux.items():
            ta = x[a] + self.event_const.get(i * 2, 0)
            tb = x[b] + self.event_const.get(i * 2 + 1, 0)
            on_a = act_a < 0 or x[act_a] > 0.5
            on_b = act_b < 0 or x[act_b] > 0.5
            if kind == "order":
                x[i] = 1.0 if ta <= tb else 0.0
            elif kind == "tight0":
                x[i] = 1.0 if x[a] == 0 else 0.0
            elif kind == "tight":
                x[i] = 1.0 if on_a and on_b and ta == tb else 0.0
            else:  # "mem": event a happened by event b (and is active)
                x[i] = 1.0 if on_a and on_b and ta <= tb else 0.0
                if kind == "mem-alloc" and on_a and ta <= tb:
                    x[i] = 1.0
        return x


def build_milp(
    problem: Problem,
    tm: TickModel,
    *,
    horizon: int,
    lower_bound: int,
    tight: bool = True,
    max_variables: int | None = None,
    deadline: float | None = None,
    stop: threading.Event | None = None,
) -> LinearModel:
    """The MILP of a problem in ticks, with all ops ending by ``horizon``.

    ``tight``: only timings the simulator reproduces (``cpsat.tight_options``), as the
    CP-SAT model does, so both backends have the same optimum. Raises ``ModelNotBuilt`` when
    the model would have more than ``max_variables`` variables (None: no limit; checked
    before building where ``memory_check_binaries`` tells, else as it grows), or at
    ``deadline`` (a ``time.perf_counter()`` value) or ``stop``: checked between steps of at
    most one device's ops each, so a build never runs much past it.
    """
    pb = problem
    lm = LinearModel()
    if max_variables is not None and memory_check_binaries(pb) > max_variables:
        raise ModelNotBuilt(
            f"its MILP would have more than {max_variables:,} variables (at least "
            f"{memory_check_binaries(pb):,} for the memory checks alone)"
        )

    def check() -> None:
        if max_variables is not None and len(lm.lb) > max_variables:
            raise ModelNotBuilt(f"its MILP has more than {max_variables:,} variables")
        if (deadline is not None and time.perf_counter() > deadline) or (
            stop is not None and stop.is_set()
        ):
            raise ModelNotBuilt(
                f"its MILP was not built by the deadline ({len(lm.lb):,} variables so far)"
            )

    p, v, m = pb.num_stages, pb.num_chunks, pb.num_microbatches
    G = p * v
    table = pb.group_table
    limits = pb.memory_limits()
    ob = pb.cost("offload_bytes")
    use_off = pb.offload is not None and any(x is not None for x in limits)
    H = max(horizon, 1)
    big = (
        H
        + max(
            [
                tm.duration(op, s, c)
                for op in ("F", "B", "W", "OFFLOAD", "RELOAD")
                for s in range(p)
                for c in range(v)
            ]
        )
        + 1
    )
    lm.makespan = lm.var(lower_bound, H, True)
    lm.obj[lm.makespan] = 1.0
    S = lm.start
    D = lm.dur
    succ: dict[OpKey, list[OpKey]] = {}

    deps: dict[OpKey, list[tuple[OpKey, int]]] = {}

    def edge(a: OpKey, b: OpKey, lag: int, dep: bool = True) -> None:
        """start[b] >= start[a] + dur[a] + lag."""
        lm.row({S[b]: 1.0, S[a]: -1.0}, D[a] + lag, float("inf"))
        succ.setdefault(a, []).append(b)
        deps.setdefault(b, [])
        if dep:
            deps[b].append((a, lag))

    for g in range(G):
        s, c = table[g]
        for j in range(m):
            for op in ("F", "B", "W"):
                d = tm.duration(op, s, c)
                S[(op, s, c, j)] = lm.var(0, max(0, H - d), True)
                D[(op, s, c, j)] = d
    events: list[list[_Event]] = [[] for _ in range(p)]
    transfers: dict[int, list[tuple[OpKey, int]]] = {}  # per copy lane
    lanes = stage_lanes(pb)
    from .cpsat import settle_delay

    for g in range(G):
        s, c = table[g]
        check()
        for j in range(m):
            F, B, W = ("F", s, c, j), ("B", s, c, j), ("W", s, c, j)
            deps.setdefault(F, [])
            if g > 0:
                ps, pc = table[g - 1]
                edge(("F", ps, pc, j), F, tm.comm[ps][pc] if ps != s else 0)
            edge(F, B, 0)
            if g < G - 1:
                ns, nc = table[g + 1]
                edge(("B", ns, nc, j), B, tm.comm[ns][nc] if ns != s else 0)
            edge(B, W, 0)
            lm.row({lm.makespan: 1.0, S[W]: -1.0}, D[W], float("inf"))
            if j + 1 < m:
                for op in ("F", "B", "W"):
                    edge((op, s, c, j), (op, s, c, j + 1), 0, dep=False)
            if limits[s] is not None:
                events[s] += [
                    (S[F], D[F], float(pb.cost("m_f")[s, c]), -1),
                    (S[B], D[B], float(pb.cost("m_b")[s, c]), -1),
                    (S[W], D[W], float(pb.cost("m_w")[s, c]), -1),
                ]
            if use_off and ob[s, c] > 0 and limits[s] is not None:
                o = lm.var(0, 1, True)
                lm.offload[(s, c, j)] = o
                kO, kR = ("OFFLOAD", s, c, j), ("RELOAD", s, c, j)
                D[kO], D[kR] = tm.t_off[s][c], tm.t_rel[s][c]
                S[kO] = lm.var(0, H, True)
                S[kR] = lm.var(0, H, True)
                # enforced when o = 1:  x_b - x_a >= d + lag - big (1 - o)
                lm.row({S[kO]: 1.0, S[F]: -1.0, o: -big}, D[F] - big, float("inf"))
                lm.row({S[kR]: 1.0, S[kO]: -1.0, o: -big}, D[kO] - big, float("inf"))
                lm.row({S[B]: 1.0, S[kR]: -1.0, o: -big}, D[kR] - big, float("inf"))
                transfers.setdefault(lanes[s][0], []).append((kO, o))
                transfers.setdefault(lanes[s][1], []).append((kR, o))
                deps[kO] = [(F, 0)]
                deps[kR] = [(kO, 0)]
                deps[B].append((kR, 0))
                nbytes = float(ob[s, c])
                # the bytes leave at the settle point: conservatively the copy's end plus
                # the stage's longest F (``cpsat.settle_delay``)
                settle = settle_delay(tm, pb, s)
                events[s] += [(S[kO], D[kO] + settle, -nbytes, o), (S[kR], 0, nbytes, o)]
    # device disjunctions for pairs the DAG does not order
    reach: dict[OpKey, set[OpKey]] = {}

    def reachable(a: OpKey) -> set[OpKey]:
        if a in reach:
            return reach[a]
        out: set[OpKey] = set()
        stack = list(succ.get(a, []))
        while stack:
            x = stack.pop()
            if x in out:
                continue
            out.add(x)
            if x in reach:
                out |= reach[x]
            else:
                stack.extend(succ.get(x, []))
        reach[a] = out
        return out

    for s in range(p):
        ops = [k for k in S if k[1] == s and k[0] in ("F", "B", "W")]
        for i, a in enumerate(ops):
            check()
            for b in ops[i + 1 :]:
                if b in reachable(a) or a in reachable(b):
                    continue
                y = lm.var(0, 1, True)  # 1: a before b
                lm.row({S[b]: 1.0, S[a]: -1.0, y: -big}, D[a] - big, float("inf"))
                lm.row({S[a]: 1.0, S[b]: -1.0, y: big}, D[b], float("inf"))
                lm.aux[y] = ("order", S[a], S[b], -1, -1)
    # copy-lane disjunctions (both transfers active)
    for lst in transfers.values():
        for i, (ta, oa) in enumerate(lst):
            check()
            for tb, ob_ in lst[i + 1 :]:
                if ta[1:] == tb[1:]:
                    continue  # OFFLOAD before RELOAD of one activation already
                z = lm.var(0, 1, True)
                # z=1: ta before tb; relaxed unless oa = ob = 1
                lm.row(
                    {S[tb]: 1.0, S[ta]: -1.0, z: -big, oa: -big, ob_: -big},
                    D[ta] - 3 * big,
                    float("inf"),
                )
                lm.row(
                    {S[ta]: 1.0, S[tb]: -1.0, z: big, oa: -big, ob_: -big},
                    D[tb] - 2 * big,
                    float("inf"),
                )
                lm.aux[z] = ("order", S[ta], S[tb], -1, -1)
    if tight:
        from .cpsat import tight_options

        def active(k: OpKey) -> int:
            return lm.offload[(k[1], k[2], k[3])] if k[0] in ("OFFLOAD", "RELOAD") else -1

        for key, opts in tight_options(pb, list(S), deps, None).items():
            check()
            lits: dict[int, float] = {}
            for pred, lag in opts:
                t = lm.var(0, 1, True)
                lits[t] = 1.0
                if pred is None:
                    lm.row({S[key]: 1.0, t: big}, -float("inf"), big)  # t=1 => start <= 0
                    lm.aux[t] = ("tight0", S[key], S[key], -1, -1)
                    continue
                # t = 1  =>  start[key] == start[a] + dur[a] + lag
                lm.row({S[key]: 1.0, S[pred]: -1.0, t: big}, -float("inf"), D[pred] + lag + big)
                lm.row({S[key]: 1.0, S[pred]: -1.0, t: -big}, D[pred] + lag - big, float("inf"))
                lm.aux[t] = ("tight", S[pred], S[key], active(pred), active(key))
                lm.event_const[t * 2] = D[pred] + lag
                if active(pred) >= 0:
                    lm.row({active(pred): 1.0, t: -1.0}, 0.0, float("inf"))
            if active(key) >= 0:
                lits[active(key)] = -1.0
                lm.row(lits, 0.0, float("inf"))
            else:
                lm.row(lits, 1.0, float("inf"))
    # memory at every allocation event
    for s in range(p):
        lim = limits[s]
        if lim is None:
            continue
        ev = events[s]
        big_mem = sum(abs(e[2]) for e in ev) + abs(lim) + 1.0
        for ie, (ve, ce, de, ae) in enumerate(ev):
            if de <= 0:
                continue
            check()
            coef: dict[int, float] = {}
            rhs = lim
            if ae >= 0:  # only checked when this (optional) event happens
                coef[ae] = coef.get(ae, 0.0) + big_mem
                rhs += big_mem
            const = de
            for ie2, (v2, c2, d2, a2) in enumerate(ev):
                if ie2 == ie or d2 == 0:
                    continue
                x = lm.var(0, 1, True)
                lm.aux[x] = ("mem-alloc" if d2 > 0 else "mem-free", v2, ve, a2, ae)
                lm.event_const[x * 2] = c2
                lm.event_const[x * 2 + 1] = ce
                coef[x] = coef.get(x, 0.0) + d2
                # t2 = S[v2] + c2, te = S[ve] + ce
                if d2 > 0:
                    # x = 0 and active  =>  t2 >= te + 1
                    row = {v2: 1.0, ve: -1.0, x: big}
                    lo = ce - c2 + 1
                    if a2 >= 0:
                        row[a2] = row.get(a2, 0.0) - big
                        lo -= big
                    lm.row(row, lo, float("inf"))
                else:
                    # x = 1  =>  t2 <= te  and  active
                    lm.row({ve: 1.0, v2: -1.0, x: -big}, c2 - ce - big, float("inf"))
                    if a2 >= 0:
                        lm.row({a2: 1.0, x: -1.0}, 0.0, float("inf"))
            lm.row(coef, -float("inf"), rhs - const)
    check()
    return lm
