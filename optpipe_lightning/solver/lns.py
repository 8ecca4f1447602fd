"""Large-neighbourhood search: CP-SAT re-optimises one time window of the incumbent at a time.

The whole CP-SAT model is too large to improve schedules of 16 stages and more in the time
(BENCHMARKS.md: at 16-32 stages every gain came from the list-rule search); a window of a few
hundred ops is not. One step, on the incumbent's simulated timeline and a window ``[a, b)`` of it:

- ops that start before ``a`` are fixed (constants: their times, the device and copy lane they
  hold, the memory they leave);
- ops that start in ``[a, b)`` are free: any order on their device and copy lane, any start;
  an activation whose backward lies in the window (its forward in or after the window, or just
  before it) may also be offloaded or not, whatever the incumbent did;
- ops that start in ``[b, b + (b - a))`` follow: free starts in the incumbent's order per device
  and per stage's copies (so the window's gains carry on);
- the rest is left out: each device's left-out work is added to its last modelled end, and the
  objective is the largest such estimate of the makespan (then the sum over devices, so a window
  in the middle that finishes earlier is taken too).

Dependencies, one op at a time per device and per copy lane, and each device's memory limit (a
reservoir over the ops' memory events, the fixed ones included) hold as in ``cpsat``; ops may
idle (the relaxation), so the solution is an order, not a timing. The new order is spliced into
the action lists (fixed ops first, the window's in its new order, the left-out ops after, as they
were), repaired (reloads issued later where ASAP timing breaks the limit) and timed by the
simulator; a step is kept when the simulated makespan is lower, or equal with every device done
no later and one earlier (a plateau move: the next window starts from it).

Windows hold about ``window_ops`` compute ops; they overlap by half and are visited last first
(it ends the makespan), then first (the fill), then the middle in a seeded random order. After a
pass without an improvement the windows grow by half (up to ``MAX_GROWTH`` times); a pass at the
largest size without one ends the search. Each window's search has ``window_seconds`` (and, for
reproducible tests, ``deterministic_time``).
"""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from ..schedule.lanes import lane_of, stage_lanes
from ..schedule.problem import Problem
from ..schedule.schedule import Action, Schedule
from ..schedule.simulator import SimResult, simulate
from .cpsat import memory_scale, solve_stoppable
from .extract import actions_from_times, repair
from .ticks import OpKey, TickModel, tick_model

WINDOW_OPS = 240
WINDOW_SECONDS = 1.0
MAX_GROWTH = 4.0
PRESOLVE_MAX_OPS = 800
_REL = 1e-9

Key = OpKey  # (op, stage, chunk, mb)
Act = tuple[int, int, int]  # (stage, chunk, mb)


@dataclass
class LnsStats:
    """What one search did: windows solved, steps kept, seconds."""

    windows: int = 0
    improved: int = 0
    plateau: int = 0
    seconds: float = 0.0
    makespans: list[float] = field(default_factory=list)


@dataclass
class _Op:
    key: Key
    stage: int
    start: float  # incumbent times, seconds
    end: float
    zone: str = "dropped"  # prefix | window | follow | dropped


class _Window:
    """The CP-SAT model of one window of a timeline (module doc)."""

    def __init__(
        self,
        problem: Problem,
        tm: TickModel,
        ops: dict[Key, _Op],
        zone: Callable[[_Op], str],
    ) -> None:
        pb = problem
        self.pb, self.tm, self.ops = pb, tm, ops
        for item in ops.values():
            item.zone = zone(item)
        self.model = md = cp_model.CpModel()
        p = pb.num_stages
        tick = tm.tick
        makespan = max(o.end for o in ops.values())
        hi = math.ceil(makespan / tick) * 3 + 10
        self.horizon = hi

        def t_up(x: float) -> int:
            return math.ceil(x / tick - 1e-6)

        # releases: a device (a copy lane) is free once its fixed ops are done
        rel_dev = [0] * p
        rel_lane: dict[int, int] = {}
        for o in ops.values():
            if o.zone != "prefix":
                continue
            if o.key[0] in ("OFFLOAD", "RELOAD"):
                ln = lane_of(pb, o.stage, o.key[0])
                rel_lane[ln] = max(rel_lane.get(ln, 0), t_up(o.end))
            else:
                rel_dev[o.stage] = max(rel_dev[o.stage], t_up(o.end))
        modelled = {k for k, o in ops.items() if o.zone in ("window", "follow")}
        # activations whose offload is decided here
        limits = pb.memory_limits()
        ob = pb.cost("offload_bytes")
        back = {(k[1], k[2], k[3]): k for k in ops if k[0] in ("B", "BW")}
        fwd = {(k[1], k[2], k[3]): k for k in ops if k[0] == "F"}
        self.free: dict[Act, cp_model.IntVar] = {}
        for act, kb in back.items():
            s, c, _j = act
            if pb.offload is None or limits[s] is None or ob[s, c] <= 0:
                continue
            zb, zf = ops[kb].zone, ops[fwd[act]].zone
            if zb not in ("window", "follow"):
                continue
            if "window" not in (zb, zf):
                continue
            moved = [("OFFLOAD", *act), ("RELOAD", *act)]
            if any(k in ops and ops[k].zone not in ("window", "follow") for k in moved):
                continue
            self.free[act] = md.new_bool_var(f"o{act}")
        self.start: dict[Key, cp_model.IntVar] = {}
        self.dur: dict[Key, int] = {}
        dev_iv: list[list[cp_model.IntervalVar]] = [[] for _ in range(p)]
        lane_iv: dict[int, list[cp_model.IntervalVar]] = {}

        def add_op(key: Key, active: cp_model.IntVar | None) -> None:
            op, s, c, _j = key
            d = tm.duration(op, s, c)
            x = md.new_int_var(0, hi, f"{op}{s}.{c}.{_j}")
            self.start[key] = x
            self.dur[key] = d
            if op in ("OFFLOAD", "RELOAD"):
                ln = lane_of(pb, s, op)
                iv = (
                    md.new_fixed_size_interval_var(x, d, "")
                    if active is None
                    else md.new_optional_fixed_size_interval_var(x, d, active, "")
                )
                lane_iv.setdefault(ln, []).append(iv)
                if active is None:
                    md.add(x >= rel_lane.get(ln, 0))
                else:
                    md.add(x >= rel_lane.get(ln, 0)).only_enforce_if(active)
                    md.add(x == 0).only_enforce_if(~active)
            else:
                dev_iv[s].append(md.new_fixed_size_interval_var(x, d, ""))
                md.add(x >= rel_dev[s])

        for key in sorted(modelled):
            if key[0] in ("OFFLOAD", "RELOAD") and key[1:] in self.free:
                continue
            add_op(key, None)
        for act, lit in self.free.items():
            add_op(("OFFLOAD", *act), lit)
            add_op(("RELOAD", *act), lit)

        def end_of(key: Key) -> cp_model.LinearExprT | int:
            if key in self.start:
                return self.start[key] + self.dur[key]
            return t_up(ops[key].end)

        def active(key: Key) -> cp_model.IntVar | None:
            if key[0] in ("OFFLOAD", "RELOAD"):
                return self.free.get((key[1], key[2], key[3]))
            return None

        # dependencies (a predecessor is fixed or modelled: it started earlier)
        table = pb.group_table
        G = pb.num_virtual_stages
        for key, x in self.start.items():
            op, s, c, j = key
            g = pb.group_of(s, c)
            deps: list[tuple[Key, int, cp_model.IntVar | None]] = []
            if op == "F" and g > 0:
                ps, pc = table[g - 1]
                deps.append((("F", ps, pc, j), tm.comm[ps][pc] if ps != s else 0, None))
            elif op in ("B", "BW"):
                deps.append((("F", s, c, j), 0, None))
                if g < G - 1:
                    ns, nc = table[g + 1]
                    deps.append((back[(ns, nc, j)], tm.comm[ns][nc] if ns != s else 0, None))
                rk = ("RELOAD", s, c, j)
                if (s, c, j) in self.free:
                    deps.append((rk, 0, self.free[(s, c, j)]))
                elif rk in ops:
                    deps.append((rk, 0, None))
            elif op == "W":
                deps.append((("B", s, c, j), 0, None))
            elif op == "OFFLOAD":
                deps.append((("F", s, c, j), 0, active(key)))
            elif op == "RELOAD":
                deps.append((("OFFLOAD", s, c, j), 0, active(key)))
            for pk, lag, when in deps:
                cons = md.add(x >= end_of(pk) + lag)
                if when is not None:
                    cons.only_enforce_if(when)
        # the incumbent's order after the window: per device, and per stage's copies
        follow: dict[tuple[int, str], list[Key]] = {}
        for key in self.start:
            if key not in ops or active(key) is not None:
                continue
            what = "copy" if key[0] in ("OFFLOAD", "RELOAD") else "compute"
            if ops[key].zone != "follow":
                continue
            follow.setdefault((key[1], what), []).append(key)
        for keys in follow.values():
            keys.sort(key=lambda k: ops[k].start)
            for k0, k1 in itertools.pairwise(keys):
                md.add(self.start[k1] >= self.start[k0] + self.dur[k0])
        for ivs in dev_iv:
            md.add_no_overlap(ivs)
        for ivs in lane_iv.values():
            md.add_no_overlap(ivs)
        release = [
            min([rel_dev[s]] + [rel_lane.get(ln, 0) for ln in set(stage_lanes(pb)[s])])
            for s in range(p)
        ]
        self._add_memory(limits, ops, t_up, release, active)
        # objective: the largest estimate of the makespan, then the sum of the devices' ends
        # each device's tail: from the end of its last modelled op to the incumbent's makespan
        # (the left-out part, as if it only moved with the device's own end)
        last = [0.0] * p
        for k in self.start:
            if k[0] not in ("OFFLOAD", "RELOAD") and k in ops:
                last[k[1]] = max(last[k[1]], ops[k].end)
        cut = {o.stage for o in ops.values() if o.zone == "dropped"}
        rest = [max(0, t_up(makespan) - t_up(x)) if s in cut else 0 for s, x in enumerate(last)]
        z = md.new_int_var(0, 2 * hi, "z")
        ends = []
        # a complete hint (CP-SAT completes a partial one poorly): the ends and z as well
        self.end_hint: list[tuple[cp_model.IntVar, int]] = []
        z_hint = 0
        for s in range(p):
            mine = [k for k in self.start if k[1] == s and k[0] not in ("OFFLOAD", "RELOAD")]
            if not mine:
                continue
            e = md.new_int_var(rel_dev[s], hi, f"e{s}")
            for k in mine:
                md.add(e >= self.start[k] + self.dur[k])
            md.add(z >= e + rest[s])
            ends.append(e)
            e_hint = max(round(ops[k].start / tick) + self.dur[k] for k in mine if k in ops)
            self.end_hint.append((e, max(rel_dev[s], e_hint)))
            z_hint = max(z_hint, max(rel_dev[s], e_hint) + rest[s])
        self.end_hint.append((z, z_hint))
        self.z = z
        self.ends = ends
        md.minimize(len(ends) * z + sum(ends))

    def _add_memory(
        self,
        limits: list[float | None],
        ops: dict[Key, _Op],
        t_up: Callable[[float], int],
        release: list[int],
        active: Callable[[Key], cp_model.IntVar | None],
    ) -> None:
        """One reservoir per device with a limit: the modelled ops' events (a chosen transfer's
        only when chosen), the fixed ops' as constants, those before ``release[s]`` (no modelled
        event comes earlier) as one event at time 0."""
        pb, md = self.pb, self.model
        sc = memory_scale(pb)
        mf, mb, mw = pb.cost("m_f"), pb.cost("m_b"), pb.cost("m_w")
        ob = pb.cost("offload_bytes")

        def delta(op: str, s: int, c: int) -> int:
            x = {
                "F": float(mf[s, c]),
                "B": float(mb[s, c]),
                "W": float(mw[s, c]),
                "BW": float(mb[s, c] + mw[s, c]),
                "OFFLOAD": -float(ob[s, c]),
                "RELOAD": float(ob[s, c]),
            }[op]
            return round(x * sc)

        times: list[list[cp_model.LinearExprT]] = [[] for _ in limits]
        deltas: list[list[int]] = [[] for _ in limits]
        acts: list[list[cp_model.LiteralT]] = [[] for _ in limits]
        base = [0] * len(limits)
        for key, x in self.start.items():
            op, s, c, _j = key
            d = delta(op, s, c)
            if limits[s] is None or d == 0:
                continue
            lit = active(key)
            times[s].append(x if op == "RELOAD" else x + self.dur[key])
            deltas[s].append(d)
            acts[s].append(True if lit is None else lit)
        for key, o in ops.items():
            op, s, c, _j = key
            if o.zone != "prefix" or limits[s] is None:
                continue
            d = delta(op, s, c)
            at = t_up(o.start) if op == "RELOAD" else t_up(o.end)
            if at <= release[s]:
                base[s] += d
            elif d:
                times[s].append(at)
                deltas[s].append(d)
                acts[s].append(True)
        for s, lim in enumerate(limits):
            if lim is None or not times[s]:
                continue
            if base[s]:
                times[s].append(0)
                deltas[s].append(base[s])
                acts[s].append(True)
            cap = math.floor(lim * sc * (1 + 1e-12) + 1e-9)
            low = -sum(abs(x) for x in deltas[s]) - 1
            md.add_reservoir_constraint_with_active(
                times[s], deltas[s], acts[s], min(low, 0), max(cap, 0)
            )

    def hint(self) -> None:
        md = self.model
        tick = self.tm.tick
        for key, x in self.start.items():
            o = self.ops.get(key)
            md.add_hint(x, 0 if o is None else min(self.horizon, round(o.start / tick)))
        for act, lit in self.free.items():
            md.add_hint(lit, ("OFFLOAD", *act) in self.ops)
        for var, val in self.end_hint:
            md.add_hint(var, val)


def time_zones(a: float, b: float, follow_end: float) -> Callable[[_Op], str]:
    """Fixed before ``a``, free in ``[a, b)``, in order until ``follow_end``, left out after."""
    eps = 1e-9 * max(1.0, b)

    def zone(op: _Op) -> str:
        if op.start < a - eps:
            return "prefix"
        if op.start < b - eps:
            return "window"
        return "follow" if op.start < follow_end - eps else "dropped"

    return zone


def _ops_of(problem: Problem, res: SimResult) -> dict[Key, _Op]:
    tl = res.timeline
    assert tl is not None
    out: dict[Key, _Op] = {}
    for s, row in enumerate(tl.actions):
        for i, a in enumerate(row):
            key = (a.op, s, a.chunk, a.mb)
            out[key] = _Op(key, s, float(tl.start[s][i]), float(tl.end[s][i]))
    return out


def _splice(problem: Problem, win: _Window, solver: cp_model.CpSolver) -> list[list[Action]] | None:
    """The action lists of the window's solution: fixed ops as they were, the modelled ones in
    their new order, the left-out ones after them, as they were."""
    tick = win.tm.tick
    starts: dict[Key, float] = {}
    ends: dict[Key, float] = {}
    new_end = 0.0
    for key, x in win.start.items():
        if key[0] in ("OFFLOAD", "RELOAD"):
            lit = win.free.get((key[1], key[2], key[3]))
            if lit is not None and not solver.boolean_value(lit):
                continue
        st = solver.value(x) * tick
        starts[key] = st
        ends[key] = st + win.dur[key] * tick
        new_end = max(new_end, ends[key])
    dropped = [o for o in win.ops.values() if o.zone == "dropped"]
    shift = 0.0
    if dropped:
        first = min(o.start for o in dropped)
        shift = max(0.0, new_end - first + tick)
    for key, o in win.ops.items():
        if key in starts or o.zone in ("window", "follow"):
            continue  # modelled (a transfer not chosen is left out)
        if o.zone == "prefix":
            starts[key], ends[key] = o.start, o.end
        else:
            starts[key], ends[key] = o.start + shift, o.end + shift
    return actions_from_times(problem, starts, ends)


def _left_shift(res: SimResult) -> float:
    """The sum of every op's end: lower means the schedule is packed further to the left."""
    tl = res.timeline
    assert tl is not None
    return float(sum(float(e.sum()) for e in tl.end))


def improve(
    problem: Problem,
    schedule: Schedule,
    *,
    deadline: float,
    on_better: Callable[[Schedule], object] | None = None,
    seed: int = 0,
    workers: int = 1,
    window_ops: int = WINDOW_OPS,
    window_seconds: float = WINDOW_SECONDS,
    deterministic_time: float | None = None,
    max_windows: int | None = None,
    stop: threading.Event | None = None,
    stats: LnsStats | None = None,
    lower_bound: float = 0.0,
) -> Schedule:
    """The schedule improved window by window until ``deadline`` (``time.perf_counter()``),
    ``max_windows`` windows, ``stop``, a local optimum (module doc) or ``lower_bound``. Every
    improvement of the makespan goes to ``on_better`` (simulated, problem embedded)."""
    t_begin = time.perf_counter()
    st = stats if stats is not None else LnsStats()
    res = simulate(problem, schedule)
    if not res.feasible or res.makespan is None or res.timeline is None:
        return schedule
    best = schedule
    cur = res
    tm = tick_model(problem, res.makespan * 3)
    rng = random.Random(seed)
    n_compute = sum(1 for row in schedule.actions for a in row if a.is_compute)
    growth = 1.0
    queue: list[int] = []
    since_gain = 0  # windows since the last step kept
    n_windows = 0

    def positions() -> tuple[float, list[float]]:
        assert cur.makespan is not None
        span = cur.makespan
        length = span * min(1.0, window_ops * growth / max(1, n_compute))
        step = length / 2
        count = max(1, math.ceil((span - length) / step) + 1) if length < span else 1
        return length, [min(span - length, i * step) for i in range(count)]

    while True:
        if time.perf_counter() >= deadline or (stop is not None and stop.is_set()):
            break
        if cur.makespan is not None and cur.makespan <= lower_bound * (1 + _REL):
            break
        if max_windows is not None and st.windows >= max_windows:
            break
        length, starts = positions()
        n_windows = len(starts)
        if not queue:
            if since_gain >= n_windows and st.windows > 0:
                if growth >= MAX_GROWTH or length >= (cur.makespan or 0):
                    break
                growth = min(MAX_GROWTH, growth * 1.5)
                since_gain = 0
                length, starts = positions()
                n_windows = len(starts)
            middle = list(range(1, n_windows - 1))
            rng.shuffle(middle)
            queue = ([n_windows - 1] if n_windows > 1 else []) + [0] + middle
        idx = min(queue.pop(0), n_windows - 1)
        a = starts[idx]
        b = a + length
        left = deadline - time.perf_counter()
        if left <= 0.05:
            break
        ops = _ops_of(problem, cur)
        win = _Window(problem, tm, ops, time_zones(a, b, b + length))
        if not any(o.zone == "window" for o in ops.values()):
            since_gain += 1
            continue
        win.hint()
        solver = cp_model.CpSolver()
        prm = solver.parameters
        # with a deterministic time (tests) the wall clock must not decide where a search ends
        per_window = window_seconds if deterministic_time is None else left
        prm.max_time_in_seconds = max(0.01, min(per_window, left * 0.8))
        prm.num_workers = max(1, workers)
        prm.random_seed = seed + st.windows
        prm.expand_reservoir_constraints = False
        prm.max_alldiff_domain_size = 1
        # presolve loses the hint of large windows (nothing found in 5 s at 16x64x2 with 1,100
        # free ops; the hint itself without presolve), and proves small ones optimal fast
        prm.cp_model_presolve = len(win.start) <= PRESOLVE_MAX_OPS
        if deterministic_time is not None:
            prm.max_deterministic_time = deterministic_time
        code = solve_stoppable(solver, win.model, None, stop)
        st.windows += 1
        since_gain += 1
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            continue
        rows = _splice(problem, win, solver)
        if rows is None:
            continue
        new = repair(problem, rows)
        if not new.feasible or new.makespan is None or cur.makespan is None:
            continue
        faster = new.makespan < cur.makespan * (1 - _REL) - 1e-12
        plateau = False
        if not faster and new.makespan <= cur.makespan * (1 + _REL) + 1e-12:
            old_l, new_l = _left_shift(cur), _left_shift(new)
            plateau = new_l < old_l * (1 - 1e-9) - 1e-9
        if not (faster or plateau):
            continue
        cur = new
        since_gain = 0
        if plateau:
            st.plateau += 1
            continue
        st.improved += 1
        st.makespans.append(new.makespan)
        best = Schedule.built(
            problem_hash=problem.hash,
            generator="optpipe-solver",
            params={**schedule.params, "lns_windows": st.windows},
            actions=[list(r) for r in rows],
            evaluation=new.evaluation,
            problem=problem,
        )
        if on_better is not None:
            on_better(best)
    st.seconds += time.perf_counter() - t_begin
    return best
