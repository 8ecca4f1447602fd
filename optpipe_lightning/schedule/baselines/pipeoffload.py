"""PipeOffload (arXiv 2503.01328): grouped interleaved schedules with selective offload.

Base orders, interleaved placement with v chunks (v = 1 is 1F1B with split backward):

- GIS with group size g: forwards in groups of g microbatches, each group through chunk 0, 1,
  ..., v-1; backwards likewise with the chunks reversed. Rank i runs g(v-1) + p - i forwards of
  warm-up, then (B, W, F) steps. g = p is GIS (bubble (p-1)(F+B), peak p*v chunk units at unit
  costs), g = ceil(p/2) is GIS-H (peak g(v-1)+p), g = 1 the uniform repeating order.

Selective offload (PipeOffload §3-4): on every stage the same share of its activations moves to
the host, the longest-lived first (earliest chunk first, then the longest F-end to B-start
window); an activation is skipped when its window is shorter than ``WINDOW_FACTOR`` round trips
(the reference heuristic's rule). The smallest share that fits the memory limit is found by
bisection; OFFLOAD goes right after the F, RELOAD as late as still hides the copy. Over the
family, the fitting schedule with the smallest makespan wins (fewer offloads on ties).
"""

from __future__ import annotations

import math

from ..problem import Problem
from ..schedule import Action, Schedule
from ..simulator import SimResult, simulate
from . import NotApplicable, make_schedule
from ._deadline import check_deadline
from ._listsched import Key, Rows, TransferPlacer, below_one_activation, live_windows

WINDOW_FACTOR = 3.0  # PipeOffload skips an offload whose window is under 3 round trips
SHARE_STEPS = 32  # resolution of the offloaded share per stage


def gis_rows(p: int, m: int, v: int, g: int, extra: int = 0) -> Rows:
    """Grouped interleaved orders (split backward) with group size g (see module doc) and
    ``extra`` more warm-up forwards on every rank."""
    g = max(1, min(g, m))
    fwd: list[Action] = []
    bwd: list[Action] = []
    for k0 in range(0, m, g):
        group = range(k0, min(m, k0 + g))
        fwd += [Action("F", j, c) for c in range(v) for j in group]
        bwd += [Action("B", j, c) for c in reversed(range(v)) for j in group]
    rows: Rows = []
    for i in range(p):
        warm = min(len(fwd), g * (v - 1) + p - i + extra)
        row = fwd[:warm]
        nf = warm
        for b in bwd:
            row += [b, Action("W", b.mb, b.chunk)]
            if nf < len(fwd):
                row.append(fwd[nf])
                nf += 1
        rows.append(row)
    return rows


def runnable_gis(problem: Problem, g: int) -> tuple[Rows, SimResult]:
    """The GIS order of group size g with the least extra warm-up that does not deadlock (a
    group smaller than p, or a short last group, needs more forwards in flight)."""
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    extra = 0
    while True:
        check_deadline()
        rows = gis_rows(p, m, v, g, extra)
        res = simulate(problem, rows)
        if res.timeline is not None or extra >= m * v:
            return rows, res
        extra += 1


def group_sizes(p: int, m: int, v: int) -> list[int]:
    """The GIS family tried: p down to ceil(p/2), then 1 (uniform); one size when v = 1."""
    if v == 1:
        return [p]
    sizes = [*range(min(p, m), min(math.ceil(p / 2), m) - 1, -1), 1]
    return list(dict.fromkeys(sizes))


class _SharePlanner:
    """Share plans on one base order and timeline: the eligible activations of each stage,
    sorted the way the shares take them, and the transfer placement are made once."""

    def __init__(self, problem: Problem, rows: Rows, base: SimResult) -> None:
        self.problem = problem
        self.placer = TransferPlacer(problem, rows, base)
        ob = problem.cost("offload_bytes")
        self.eligible: list[list[Key]] = []
        for s in range(problem.num_stages):
            elig = []
            for (mb, c), (f_end, b_start, _issue) in live_windows(problem, base, s).items():
                rt = problem.offload_time(s, c) + problem.reload_time(s, c)
                if ob[s, c] > 0 and b_start - f_end >= WINDOW_FACTOR * rt:
                    elig.append((c, -(b_start - f_end), mb))
            elig.sort()
            self.eligible.append([(s, mb, c) for c, _w, mb in elig])

    def plan(self, shares: list[int]) -> tuple[list[Key], SimResult]:
        """Offload ``shares[s] / SHARE_STEPS`` of stage s's eligible activations, longest-lived
        first (earliest chunk, then longest window), and simulate."""
        check_deadline()
        chosen: list[Key] = []
        for s, elig in enumerate(self.eligible):
            n = math.ceil(shares[s] * len(elig) / SHARE_STEPS - 1e-9)
            chosen += elig[:n]
        return chosen, simulate(self.problem, self.placer.place(chosen))


def _least_shares(planner: _SharePlanner) -> tuple[list[int], list[Key], SimResult] | None:
    """The same share on every stage, bisected to the least that fits; None if even all the
    eligible activations do not make it fit."""
    p = planner.problem.num_stages
    chosen, res = planner.plan([SHARE_STEPS] * p)
    if not res.feasible:
        return None
    lo, hi = 0, SHARE_STEPS  # fits at hi, not at lo (the base does not fit)
    found = (chosen, res)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = planner.plan([mid] * p)
        if trial[1].feasible:
            hi, found = mid, trial
        else:
            lo = mid
    return [hi] * p, found[0], found[1]


def _refine_per_stage(
    planner: _SharePlanner, shares: list[int], res: SimResult
) -> tuple[list[Key], SimResult] | None:
    """Lower each stage's share on its own (bisection) while the schedule fits and is no slower
    (stages differ: rank 0 holds the most, the last rank the least)."""
    assert res.makespan is not None
    limit_ms = res.makespan * (1 + 1e-9)
    best: tuple[list[Key], SimResult] | None = None
    for s in range(planner.problem.num_stages):
        lo, hi = -1, shares[s]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            trial_shares = [*shares[:s], mid, *shares[s + 1 :]]
            trial = planner.plan(trial_shares)
            ms = trial[1].makespan
            if trial[1].feasible and ms is not None and ms <= limit_ms:
                hi, best = mid, trial
            else:
                lo = mid
        shares[s] = hi
    return best


def pipeoffload(problem: Problem) -> Schedule:
    """PipeOffload's GIS family with the least selective offload that fits the memory limit."""
    if problem.offload is None:
        raise NotApplicable("pipeoffload needs offload settings (the problem has offload: null)")
    p, m, v = problem.num_stages, problem.num_microbatches, problem.num_chunks
    if v > 1 and problem.placement != "interleaved":
        raise NotApplicable(
            "pipeoffload's schedules use interleaved placement "
            f"(problem has placement={problem.placement!r})"
        )
    why_not = below_one_activation(problem)
    if why_not:
        raise NotApplicable(f"pipeoffload: {why_not}")
    # (makespan, offloads, group size, compute rows, base timeline, shares, plan)
    best: tuple[float, int, int, Rows, SimResult, list[int], tuple[list[Key], SimResult]] | None
    best = None
    reasons: list[str] = []
    # offload only delays ops: a base no faster than the best fitted plan cannot win
    cands = sorted(
        ((runnable_gis(problem, g), g) for g in group_sizes(p, m, v)),
        key=lambda x: (x[0][1].makespan or float("inf"), not x[0][1].feasible),
    )
    for (rows, base), g in cands:
        assert base.timeline is not None and base.makespan is not None
        if best is not None and (
            base.makespan > best[0] * (1 + 1e-9)
            or (base.makespan >= best[0] * (1 - 1e-9) and (best[1] == 0 or not base.feasible))
        ):
            continue
        found: tuple[list[Key], SimResult]
        if base.feasible:
            shares, found = [0] * p, ([], base)
        else:
            least = _least_shares(_SharePlanner(problem, rows, base))
            if least is None:
                reasons.append(f"group size {g}")
                continue
            shares, found = least[0], (least[1], least[2])
        ms = found[1].makespan
        assert ms is not None
        if best is None or (ms, len(found[0])) < (best[0] * (1 - 1e-12), best[1]):
            best = (ms, len(found[0]), g, rows, base, shares, found)
    if best is None:
        lim = min(x for x in problem.memory_limits() if x is not None)
        raise NotApplicable(
            f"no PipeOffload schedule fits the memory limit {lim:.4g} even offloading every "
            f"activation whose window is at least {WINDOW_FACTOR:g} round trips "
            f"(tried {', '.join(reasons)})"
        )
    _ms, _n, g, rows, base, shares, (chosen, res) = best
    if chosen:
        refined = _refine_per_stage(_SharePlanner(problem, rows, base), shares, res)
        if refined is not None:
            chosen, res = refined
    assert res.timeline is not None
    params: dict[str, object] = {
        "group_size": g,
        "chunks": v,
        "num_offloaded": len(chosen),
        "window_factor": WINDOW_FACTOR,
    }
    return make_schedule(problem, "pipeoffload", res.timeline.actions, params)
