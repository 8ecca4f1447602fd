"""The CP-SAT backend: fixed-size intervals, one no-overlap per device and per copy lane,
optional transfer intervals per offload decision, and one memory reservoir per device.

Model (all times integer ticks, see ``ticks``): for every (group g, microbatch j) a start for F,
B, W; F(g, j) after F(g-1, j) plus the hop, B(g, j) after F(g, j) and after B(g+1, j) plus the
hop, W after B. Where memory is limited and offload allowed, a Boolean ``o`` per activation with
optional OFFLOAD/RELOAD intervals (OFFLOAD after F, RELOAD after OFFLOAD, B after RELOAD), one
no-overlap per copy lane (``schedule.lanes``: with duplex a channel's offloads and its reloads
each on a lane of their own, else both on one). Memory
per device is a reservoir (unexpanded, as measured for this project): +m_f at F end, m_b at B end,
m_w at W end, -bytes at the OFFLOAD's settle point (conservatively its end plus the stage's
longest F: ``settle_delay``) and +bytes at RELOAD start when ``o``; events at one instant net
out, as in the simulator. Where a fused backward is cheaper than B then W
(``ticks.fusable``), a Boolean per backward chooses: B lasts t_bw and W nothing, right at B's end
(one BW op, freeing m_b and m_w at its end), or B then W as usual. Symmetry breaking: ops of one
kind on one group run in microbatch order (W's only among the split ones: a fused W is pinned to
its BW). The objective is the makespan.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from ..schedule.lanes import stage_lanes
from ..schedule.problem import Problem
from . import fusing
from .ticks import OpKey, TickModel, fusable
from .tight import tight_model_size as tight_model_size  # re-exported: callers import it here
from .tight import tight_options

SolutionFn = Callable[[dict[OpKey, int], dict[OpKey, int], int, int], None]


@dataclass
class CpOutcome:
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown"
    objective: int | None
    bound: int | None
    wall_time: float
    starts: dict[OpKey, int] = field(default_factory=dict)
    ends: dict[OpKey, int] = field(default_factory=dict)


def settle_delay(tm: TickModel, problem: Problem, s: int) -> int:
    """Ticks after an offload's copy ends by which its bytes have surely left stage ``s`` for
    every allocation that matters (the simulator's settle point, ``sim_memory``): an F ending at
    ``T`` with ``T >= copy end + this`` started at or after the copy's end, so it (or an action
    before it) is the settle point; a reload starting then settles it itself. Exact where the
    F that waits for the copy is the stage's longest; otherwise conservative."""
    return max(tm.duration("F", s, c) for c in range(problem.num_chunks))


def memory_scale(problem: Problem) -> float:
    """Factor that turns every memory delta and limit into (nearly exact) integers."""
    vals = [
        abs(float(x))
        for n in ("m_f", "m_b", "m_w", "offload_bytes")
        for x in problem.cost(n).ravel()
    ]
    vals = [x for x in vals if x > 0]
    if not vals:
        return 1.0
    for k in range(0, 7):
        sc = 10.0**k
        if all(abs(x * sc - round(x * sc)) <= 1e-9 * max(1.0, x * sc) for x in vals):
            if max(vals) * sc < 2**40:
                return sc
            break
    return 1e6 / max(vals)  # 1e-6 of the largest delta per unit; allocations rounded up


def add_resources(
    md: cp_model.CpModel,
    devices: list[list[cp_model.IntervalVar]],
    lanes: dict[int, list[cp_model.IntervalVar]],
    limits: list[float | None],
    scale: float,
    times: list[list[cp_model.LinearExprT]],
    deltas: list[list[int]],
    actives: list[list[cp_model.LiteralT]],
) -> None:
    """One op at a time per device and per copy lane, and per device with a limit a memory
    reservoir over its events (``scale``: ``memory_scale``; events at one instant net out)."""
    for ivs in devices:
        md.add_no_overlap(ivs)
    for ivs in lanes.values():
        md.add_no_overlap(ivs)
    for s, lim in enumerate(limits):
        if lim is None:
            continue
        cap = math.floor(lim * scale * (1 + 1e-12) + 1e-9)
        low = -sum(abs(x) for x in deltas[s]) - 1
        md.add_reservoir_constraint_with_active(
            times[s], deltas[s], actives[s], min(low, 0), max(cap, 0)
        )


class _Model:
    def __init__(
        self,
        problem: Problem,
        tm: TickModel,
        horizon: int,
        lb: int,
        tight: bool,
        window: int | None = None,
    ) -> None:
        pb = problem
        self.pb = pb
        self.tm = tm
        md = cp_model.CpModel()
        self.model = md
        p, v, m = pb.num_stages, pb.num_chunks, pb.num_microbatches
        G = p * v
        table = pb.group_table
        limits = pb.memory_limits()
        ob = pb.cost("offload_bytes")
        use_off = pb.offload is not None and any(x is not None for x in limits)
        self.start: dict[OpKey, cp_model.IntVar] = {}
        self.dur: dict[OpKey, int] = {}
        # where fusing pays (``ticks.fusable``), each backward is a BW (``fused`` true: B lasts
        # t_bw and W none, right at its end) or B then W; ``end`` holds every op's end
        self.fused: dict[tuple[int, int, int], cp_model.IntVar] = {}
        self.end: dict[OpKey, cp_model.LinearExprT] = {}
        fuse = {
            (s, c)
            for s, c in (fusable(pb) if fusing.FUSE_BACKWARDS else ())
            if tm.duration("BW", s, c) < tm.duration("B", s, c) + tm.duration("W", s, c)
        }
        self.offload: dict[tuple[int, int, int], cp_model.IntVar] = {}
        dev_iv: list[list[cp_model.IntervalVar]] = [[] for _ in range(p)]
        lanes = stage_lanes(pb)
        lane_iv: dict[int, list[cp_model.IntervalVar]] = {}
        sc = memory_scale(pb)

        def mem(x: float) -> int:
            return round(x * sc)

        res_times: list[list[cp_model.LinearExprT]] = [[] for _ in range(p)]
        res_deltas: list[list[int]] = [[] for _ in range(p)]
        res_active: list[list[cp_model.LiteralT]] = [[] for _ in range(p)]
        ms = md.new_int_var(lb, horizon, "makespan")
        self.makespan = ms
        self.horizon = horizon
        deps: dict[OpKey, list[tuple[OpKey, int]]] = {}
        self.deps = deps
        for g in range(G):
            s, c = table[g]
            for j in range(m):
                for op in ("F", "B", "W"):
                    d = tm.duration(op, s, c)
                    key = (op, s, c, j)
                    # a fused W lasts nothing (at its BW's end), a fused B lasts t_bw
                    least = (
                        {"B": min(d, tm.duration("BW", s, c)), "W": 0}.get(op, d)
                        if (s, c) in fuse
                        else d
                    )
                    x = md.new_int_var(0, max(0, horizon - least), f"{op}{s}.{c}.{j}")
                    self.start[key] = x
                    self.dur[key] = d
                    self.end[key] = x + d
                    if (s, c) not in fuse:
                        dev_iv[s].append(md.new_fixed_size_interval_var(x, d, f"i{op}{s}.{c}.{j}"))
                if (s, c) in fuse:
                    self._add_fusable(md, dev_iv[s], s, c, j)
        for g in range(G):
            s, c = table[g]
            lag_in = (
                tm.comm[table[g - 1][0]][table[g - 1][1]] if g > 0 and table[g - 1][0] != s else 0
            )
            lag_back = (
                tm.comm[table[g + 1][0]][table[g + 1][1]]
                if g < G - 1 and table[g + 1][0] != s
                else 0
            )
            offloadable = use_off and ob[s, c] > 0 and limits[s] is not None
            settle = settle_delay(tm, pb, s) if offloadable else 0
            for j in range(m):
                F, B, W = (
                    self.start[("F", s, c, j)],
                    self.start[("B", s, c, j)],
                    self.start[("W", s, c, j)],
                )
                df = self.dur[("F", s, c, j)]
                kF, kB, kW = ("F", s, c, j), ("B", s, c, j), ("W", s, c, j)
                deps[kF], deps[kB], deps[kW] = [], [(kF, 0)], [(kB, 0)]
                if g > 0:
                    ps, pc = table[g - 1]
                    md.add(self.start[("F", ps, pc, j)] + self.dur[("F", ps, pc, j)] + lag_in <= F)
                    deps[kF].append((("F", ps, pc, j), lag_in))
                md.add(F + df <= B)
                if g < G - 1:
                    ns, nc = table[g + 1]
                    md.add(self.end[("B", ns, nc, j)] + lag_back <= B)
                    deps[kB].append((("B", ns, nc, j), lag_back))
                md.add(self.end[kB] <= W)
                md.add(ms >= self.end[kW])
                if j + 1 < m:  # symmetry breaking: microbatch order per kind and group
                    for op in ("F", "B", "W"):
                        order = md.add(self.start[(op, s, c, j + 1)] >= self.end[(op, s, c, j)])
                        if op == "W" and (s, c, j) in self.fused:
                            # a fused W sits at its BW's end: only split W's keep the order
                            # (B then a later BW then the first W is a schedule of its own)
                            order.only_enforce_if(
                                ~self.fused[(s, c, j)], ~self.fused[(s, c, j + 1)]
                            )
                if limits[s] is not None:
                    for t, dlt in (
                        (F + df, pb.cost("m_f")[s, c]),
                        (self.end[kB], pb.cost("m_b")[s, c]),
                        (self.end[kW], pb.cost("m_w")[s, c]),
                    ):
                        res_times[s].append(t)
                        res_deltas[s].append(mem(float(dlt)))
                        res_active[s].append(True)
                if offloadable:
                    o = md.new_bool_var(f"o{s}.{c}.{j}")
                    self.offload[(s, c, j)] = o
                    d_off, d_rel = tm.t_off[s][c], tm.t_rel[s][c]
                    so = md.new_int_var(0, horizon, f"off{s}.{c}.{j}")
                    sr = md.new_int_var(0, horizon, f"rel{s}.{c}.{j}")
                    self.start[("OFFLOAD", s, c, j)] = so
                    self.start[("RELOAD", s, c, j)] = sr
                    self.dur[("OFFLOAD", s, c, j)] = d_off
                    self.dur[("RELOAD", s, c, j)] = d_rel
                    self.end[("OFFLOAD", s, c, j)] = so + d_off
                    self.end[("RELOAD", s, c, j)] = sr + d_rel
                    iv_o = md.new_optional_fixed_size_interval_var(so, d_off, o, f"io{s}.{c}.{j}")
                    iv_r = md.new_optional_fixed_size_interval_var(sr, d_rel, o, f"ir{s}.{c}.{j}")
                    lane_iv.setdefault(lanes[s][0], []).append(iv_o)
                    lane_iv.setdefault(lanes[s][1], []).append(iv_r)
                    md.add(so >= F + df).only_enforce_if(o)
                    md.add(sr >= so + d_off).only_enforce_if(o)
                    md.add(sr + d_rel <= B).only_enforce_if(o)
                    md.add(so == 0).only_enforce_if(~o)
                    md.add(sr == 0).only_enforce_if(~o)
                    kO, kR = ("OFFLOAD", s, c, j), ("RELOAD", s, c, j)
                    deps[kO] = [(kF, 0)]
                    deps[kR] = [(kO, 0)]
                    deps[kB].append((kR, 0))
                    b = mem(float(ob[s, c]))
                    # the bytes leave at the settle point: conservatively, the copy's end plus
                    # the stage's longest forward (``settle_delay``)
                    res_times[s] += [so + d_off + settle, sr]
                    res_deltas[s] += [-b, b]
                    res_active[s] += [o, o]
        add_resources(md, dev_iv, lane_iv, limits, sc, res_times, res_deltas, res_active)
        self.tight: list[tuple[cp_model.IntVar, OpKey, OpKey | None, int]] = []
        if tight:
            self._add_no_voluntary_idle(window)
        md.minimize(ms)

    def _add_fusable(
        self, md: cp_model.CpModel, dev: list[cp_model.IntervalVar], s: int, c: int, j: int
    ) -> None:
        """F as usual; the backward either B (t_b) then W (t_w) or one BW (t_bw, W of no length
        at its end). The ops' memory events sit at their ends, so a BW frees both at once."""
        tm = self.tm
        kF, kB, kW = ("F", s, c, j), ("B", s, c, j), ("W", s, c, j)
        db, dw, dbw = (tm.duration(op, s, c) for op in ("B", "W", "BW"))
        z = md.new_bool_var(f"z{s}.{c}.{j}")
        self.fused[(s, c, j)] = z
        B, W = self.start[kB], self.start[kW]
        hi = self.horizon
        size_b = md.new_int_var(min(db, dbw), max(db, dbw), f"dB{s}.{c}.{j}")
        md.add(size_b == db + (dbw - db) * z)
        end_b = md.new_int_var(0, hi, f"eB{s}.{c}.{j}")
        end_w = md.new_int_var(0, hi, f"eW{s}.{c}.{j}")
        md.add(end_w == W + dw - dw * z)
        self.end[kB], self.end[kW] = end_b, end_w
        dev.append(md.new_fixed_size_interval_var(self.start[kF], self.dur[kF], f"iF{s}.{c}.{j}"))
        dev.append(md.new_interval_var(B, size_b, end_b, f"iB{s}.{c}.{j}"))
        dev.append(md.new_optional_fixed_size_interval_var(W, dw, ~z, f"iW{s}.{c}.{j}"))
        md.add(end_b == W).only_enforce_if(z)

    def _active(self, key: OpKey) -> cp_model.IntVar | None:
        op, s, c, j = key
        return self.offload[(s, c, j)] if op in ("OFFLOAD", "RELOAD") else None

    def _add_no_voluntary_idle(self, window: int | None) -> None:
        """Only timings the simulator reproduces (see ``tight_options``)."""
        md = self.model
        settle = [settle_delay(self.tm, self.pb, x) for x in range(self.pb.num_stages)]
        options = tight_options(self.pb, list(self.start), self.deps, window, self.dur, settle)
        for key, opts in options.items():
            lits = []
            for a, lag in opts:
                lit = md.new_bool_var("")
                if a is None:
                    md.add(self.start[key] == 0).only_enforce_if(lit)
                else:
                    md.add(self.start[key] == self.end[a] + lag).only_enforce_if(lit)
                    act = self._active(a)
                    if act is not None:
                        md.add_implication(lit, act)
                self.tight.append((lit, key, a, lag))
                lits.append(lit)
            act = self._active(key)
            if act is None:
                md.add_bool_or(lits)
            else:
                md.add_bool_or(lits).only_enforce_if(act)

    def add_hint(self, starts: dict[OpKey, int], offloaded: set[tuple[int, int, int]]) -> None:
        """Hint a solution: tick starts of every op (a fused backward as a ``BW`` key, or as B
        and W) and the offloaded activations."""
        md = self.model
        starts, fused = self.split_fused(starts)
        ends: dict[OpKey, int] = {}
        for key, st in starts.items():
            op, s, c, j = key
            if (s, c, j) in fused and op in ("B", "W"):
                ends[key] = starts[("B", s, c, j)] + self.tm.duration("BW", s, c)
            else:
                ends[key] = st + self.tm.duration(op, s, c)
        mk = 0
        for key, var in self.start.items():
            op, s, c, j = key
            if op in ("OFFLOAD", "RELOAD"):
                val = starts.get(key, 0) if (s, c, j) in offloaded else 0
            else:
                val = starts[key]
                mk = max(mk, ends[key])
            md.add_hint(var, val)
        for sj, o in self.offload.items():
            md.add_hint(o, sj in offloaded)
        for sj, z in self.fused.items():
            md.add_hint(z, sj in fused)
        md.add_hint(self.makespan, mk)

        def on(k: OpKey) -> bool:
            return k[0] not in ("OFFLOAD", "RELOAD") or (k[1], k[2], k[3]) in offloaded

        for lit, b, a, lag in self.tight:
            if a is None:
                val = on(b) and starts.get(b, -1) == 0
            else:
                val = on(a) and on(b) and b in starts and a in ends and starts[b] == ends[a] + lag
            md.add_hint(lit, bool(val))

    def split_fused(
        self, starts: dict[OpKey, int]
    ) -> tuple[dict[OpKey, int], set[tuple[int, int, int]]]:
        """Starts with every ``BW`` key as B (its start) and W (at its end), and the fused ones
        the model can fuse (elsewhere a BW becomes B then W, and W starts after B's t_b)."""
        out: dict[OpKey, int] = {}
        fused: set[tuple[int, int, int]] = set()
        for key, st in starts.items():
            op, s, c, j = key
            if op != "BW":
                out[key] = st
                continue
            out[("B", s, c, j)] = st
            if (s, c, j) in self.fused:
                fused.add((s, c, j))
                out[("W", s, c, j)] = st + self.tm.duration("BW", s, c)
            else:
                out[("W", s, c, j)] = st + self.tm.duration("B", s, c)
        return out, fused

    def values(
        self, get: Callable[[cp_model.IntVar], int], get_bool: Callable[[cp_model.IntVar], bool]
    ) -> tuple[dict[OpKey, int], dict[OpKey, int]]:
        """Tick starts and ends of the solution's ops: chosen transfers only, and a fused
        backward as one ``BW`` op (no B or W key)."""
        starts: dict[OpKey, int] = {}
        ends: dict[OpKey, int] = {}
        fused = {sj for sj, z in self.fused.items() if get_bool(z)}
        for key, var in self.start.items():
            op, s, c, j = key
            if op in ("OFFLOAD", "RELOAD") and not get_bool(self.offload[(s, c, j)]):
                continue
            st = int(get(var))
            if (s, c, j) in fused and op in ("B", "W"):
                if op == "B":
                    starts[("BW", s, c, j)] = st
                    ends[("BW", s, c, j)] = st + self.tm.duration("BW", s, c)
                continue
            starts[key] = st
            ends[key] = st + self.dur[key]
        return starts, ends


class _Callback(cp_model.CpSolverSolutionCallback):
    def __init__(self, model: _Model, fn: SolutionFn | None) -> None:
        super().__init__()
        self._m = model
        self._fn = fn
        self.best: tuple[dict[OpKey, int], dict[OpKey, int]] | None = None

    def on_solution_callback(self) -> None:
        starts, ends = self._m.values(self.value, self.boolean_value)
        self.best = (starts, ends)
        if self._fn is not None:
            self._fn(starts, ends, int(self.objective_value), int(self.best_objective_bound))


def solve_cpsat(
    problem: Problem,
    tm: TickModel,
    *,
    horizon: int,
    lower_bound: int,
    hint: tuple[dict[OpKey, int], set[tuple[int, int, int]]] | None,
    time_limit: float,
    gap_target: float,
    seed: int,
    workers: int,
    on_solution: SolutionFn | None,
    stop: threading.Event | None,
    deterministic_time: float | None = None,
    tight: bool = True,
    window: int | None = None,
    deadline: float | None = None,
    offloads_fixed_share: float = 0.0,
    fused_fixed_share: float = 0.0,
) -> CpOutcome:
    """Build and solve the CP-SAT model; every solution goes to ``on_solution``.

    ``tight`` (exact model): only timings the simulator reproduces, so the objective is the
    simulated makespan and the bound is valid; its size grows with the square of the ops per
    device. Otherwise the relaxation (ops may idle on purpose, e.g. to wait for a copy to free
    memory): its bound is still valid, its solutions are candidates that the caller re-times
    and repairs. ``window`` limits which ops may directly precede an op in the tight model to
    microbatches within that distance (None: all); with a window the bound is not valid.
    ``deadline`` (a ``time.perf_counter()`` value) caps the search so that the model build counts
    against it: the search's own limit is set from what is left once the model is built.

    ``offloads_fixed_share``: with a hint, that share of the time first goes to the model with
    every offload decision fixed to the hint's (only the timing is searched; ends early when
    that is proven optimal), then the rest to the whole model, hinted with the best found. The
    fixed search's solutions reach ``on_solution`` with a bound of 0: its bound holds only for
    those decisions. At 4x8x1, a quarter of 1F1B's memory, copies 0.5x, it proved the
    decisions of the round-trip rule's 47 optimal at 44 (the problem's optimum) in 8 s, where
    the whole model stayed at 45 for 40 s.

    ``fused_fixed_share``: the same for the fused-or-split choices (where the model has them),
    fixed to the hint's; with both shares, both are fixed for the larger one. The choice makes the
    backward intervals variable, and the whole model searched worse from a split hint at 8x32x2
    (half the memory, copies 0.5x, BW 0.8 x (B + W): 103.2 against 101.5 split only, in 30 s).
    """
    model = _Model(problem, tm, horizon, lower_bound, tight, window)
    if hint is not None:
        model.add_hint(*hint)
    t_built = time.perf_counter()
    if deadline is not None:
        time_limit = min(time_limit, deadline - t_built)
    search = functools.partial(
        _search, model, gap_target=gap_target, seed=seed, workers=workers, stop=stop, tight=tight
    )
    fixed: CpOutcome | None = None
    fix_off = offloads_fixed_share > 0 and hint is not None and bool(model.offload)
    fix_fuse = fused_fixed_share > 0 and hint is not None and bool(model.fused)
    share = max(offloads_fixed_share if fix_off else 0.0, fused_fixed_share if fix_fuse else 0.0)
    if share > 0 and hint is not None:
        if fix_off:
            offloaded = hint[1]
            for sj, o in model.offload.items():
                o.proto.domain[0] = o.proto.domain[1] = int(sj in offloaded)
        if fix_fuse:
            fused = model.split_fused(hint[0])[1]
            for sj, z in model.fused.items():
                z.proto.domain[0] = z.proto.domain[1] = int(sj in fused)

        def no_bound(starts: dict[OpKey, int], ends: dict[OpKey, int], obj: int, _b: int) -> None:
            if on_solution is not None:
                on_solution(starts, ends, obj, 0)

        fixed = search(
            time_limit=share * time_limit,
            on_solution=no_bound,
            deterministic_time=None if deterministic_time is None else share * deterministic_time,
        )
        for o in [*model.offload.values(), *model.fused.values()]:
            o.proto.domain[0], o.proto.domain[1] = 0, 1
        # its status, like its bound, holds for the fixed decisions only
        fixed.bound = None
        fixed.status = "feasible" if fixed.starts else "unknown"
        if fixed.starts:
            model.model.clear_hints()
            model.add_hint(
                fixed.starts, {(s, c, j) for op, s, c, j in fixed.starts if op == "OFFLOAD"}
            )
        time_limit -= time.perf_counter() - t_built
        if stop is not None and stop.is_set():
            return fixed
    out = search(
        time_limit=time_limit, on_solution=on_solution, deterministic_time=deterministic_time
    )
    if fixed is not None and fixed.starts and not out.starts:
        # the whole model found nothing in its time: the fixed search's last solution stands
        out.status, out.objective = "feasible", fixed.objective
        out.starts, out.ends = fixed.starts, fixed.ends
    return out


def _search(
    model: _Model,
    *,
    time_limit: float,
    gap_target: float,
    seed: int,
    workers: int,
    on_solution: SolutionFn | None,
    stop: threading.Event | None,
    deterministic_time: float | None,
    tight: bool,
) -> CpOutcome:
    """One CP-SAT search of ``model`` for at most ``time_limit`` seconds."""
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(0.01, time_limit)
    prm.num_workers = max(1, workers)
    prm.random_seed = seed
    prm.expand_reservoir_constraints = False
    # Where every op of a device lasts one tick (two chunks of F = B = W), presolve turned the
    # device's no-overlap into an all-different and expanded it into value literals (240k at
    # 8x32x2): presolve alone then ran past a 60 s limit and ignored the stop for 2 s. Kept as
    # an all-different it presolves in about 3 s.
    prm.max_alldiff_domain_size = 1
    if tight:
        # presolve of the many tightness literals costs seconds before the hint is even seen
        prm.cp_model_presolve = False
    prm.relative_gap_limit = max(0.0, gap_target)
    if deterministic_time is not None:
        prm.max_deterministic_time = deterministic_time
    cb = _Callback(model, on_solution)
    code = solve_stoppable(solver, model.model, cb, stop)
    status = {
        cp_model.OPTIMAL: "optimal",
        cp_model.FEASIBLE: "feasible",
        cp_model.INFEASIBLE: "infeasible",
    }.get(code, "unknown")
    out = CpOutcome(status, None, None, solver.wall_time)
    if status in ("optimal", "feasible"):
        out.objective = int(solver.objective_value)
        out.bound = math.ceil(solver.best_objective_bound - 1e-9)
        out.starts, out.ends = model.values(solver.value, solver.boolean_value)
    elif status == "unknown":
        bnd = solver.best_objective_bound
        out.bound = math.ceil(bnd - 1e-9) if math.isfinite(bnd) else None
    return out


def solve_stoppable(
    solver: cp_model.CpSolver,
    model: cp_model.CpModel,
    callback: cp_model.CpSolverSolutionCallback | None,
    stop: threading.Event | None,
) -> cp_model.CpSolverStatus:
    """``solver.solve``, stopped when ``stop`` is set (also before the search has started)."""
    done = threading.Event()
    watcher = None
    if stop is not None:

        def watch() -> None:
            # OR-Tools drops a stop that arrives before the search has started: repeat it
            while not done.is_set():
                if stop.wait(0.05):
                    solver.stop_search()
                    done.wait(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
    try:
        return solver.solve(model, callback)
    finally:
        done.set()
        if watcher is not None:
            watcher.join()
