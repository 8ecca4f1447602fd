"""``solve``: heuristics first (an answer at once), then an exact backend improves and proves.

Pipeline: check the memory limit (clear error below what any schedule can fit); run the
offload-aware list schedulers, the user's hint and the baselines, keep the best the simulator
accepts (first incumbent, fallback, hint and horizon); then CP-SAT (default), Gurobi (when its
licence allows) or HiGHS searches with that hint. Every solution a backend reports is turned into
action lists and re-evaluated by the one simulator; only the simulator's makespan is reported.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator

from ..schedule.bounds import lower_bound
from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from ..schedule.simulator import evaluate
from .extract import actions_from_times, repair
from .feasibility import (
    check_memory_limit,
    infeasible_error,
    minimal_memory_schedule,
    smallest_feasible_limit,
)
from .heuristics import default_rules, run_rule
from .hints import tick_times
from .licence import RESTRICTED_MAX_CONSTRS, RESTRICTED_MAX_VARS, gurobi_license_status
from .results import Incumbent, SolveResult
from .ticks import OpKey, TickModel, tick_model

BACKENDS = ("auto", "cpsat", "gurobi", "highs", "heuristic")
# largest tight CP-SAT model (estimated literals) before the relaxation is used instead
TIGHT_MODEL_MAX = 12_000
# ops above which the MILP is not even built to count it (it grows with their square)
MILP_BUILD_MAX_OPS = 600
# with a full Gurobi licence, "auto" uses Gurobi only up to this many MILP variables: on larger
# models CP-SAT was measured better (solver note); ask for backend="gurobi" to force it
AUTO_GUROBI_MAX_VARS = 20_000
_REL = 1e-9


class _Best:
    """The incumbent: best simulator-checked schedule so far, and the stream of improvements."""

    def __init__(
        self, problem: Problem, t0: float, cb: Callable[[Incumbent], None] | None, lb: float
    ) -> None:
        self.pb = problem
        self.t0 = t0
        self.cb = cb
        self.lock = threading.Lock()
        self.schedule: Schedule | None = None
        self.makespan = float("inf")
        self.source = ""
        self.bound = lb
        self.incumbents: list[Incumbent] = []

    def offer(self, sched: Schedule | None, source: str) -> bool:
        if sched is None or sched.evaluation is None:
            return False
        ev = sched.evaluation
        if not ev.feasible or ev.makespan is None:
            return False
        with self.lock:
            if ev.makespan >= self.makespan * (1 - _REL) - 1e-12:
                return False
            self.schedule = sched
            self.makespan = ev.makespan
            self.source = source
            inc = Incumbent(
                wall_time=time.perf_counter() - self.t0,
                makespan=ev.makespan,
                bound=self.bound,
                source=source,
            )
            self.incumbents.append(inc)
        if self.cb is not None:
            self.cb(dataclasses.replace(inc, schedule=sched))
        return True

    def raise_bound(self, b: float) -> None:
        with self.lock:
            self.bound = max(self.bound, b)


def schedule_from_ticks(
    problem: Problem, tm: TickModel, starts: dict[OpKey, int], ends: dict[OpKey, int], source: str
) -> Schedule | None:
    """Action lists from a backend's tick times, repaired and evaluated by the simulator."""
    st = {k: v * tm.tick for k, v in starts.items()}
    en = {k: v * tm.tick for k, v in ends.items()}
    rows = actions_from_times(problem, st, en)
    res = repair(problem, rows)
    if not res.feasible:
        return None
    return Schedule(
        problem_hash=problem.hash,
        generator="optpipe-solver",
        params={"source": source},
        actions=rows,
        evaluation=res.evaluation,
        problem=problem,
    )


def _baselines(problem: Problem, deadline: float | None = None) -> list[tuple[str, Schedule]]:
    """Every baseline that exists yet and applies (extra hints and fallbacks, never needed).

    With a ``deadline`` (``time.perf_counter()`` value) no baseline starts after it.
    """
    try:
        from ..schedule.baselines import BASELINE_NAMES, generate
    except (ImportError, AttributeError):
        return []
    names = list(BASELINE_NAMES)
    if problem.offload is not None and any(x is not None for x in problem.memory_limits()):
        # the memory-aware ones first: where the list schedulers struggle, they help most
        first = [n for n in ("adaoffload", "pipeoffload", "zb-auto", "v-min") if n in names]
        names = first + [n for n in names if n not in first]
    out = []
    for name in names:
        if deadline is not None and time.perf_counter() > deadline:
            break
        try:
            sched = generate(name, problem)
        except Exception:  # NotApplicable, or a generator not written yet / broken
            continue
        if isinstance(sched, Schedule):
            out.append((name, sched))
    return out


def heuristic_candidates(
    problem: Problem, stop: threading.Event | None = None
) -> Iterator[tuple[str, Schedule]]:
    """The list schedulers' schedules (source name, schedule), in rule order, as made."""
    for rule in default_rules(problem):
        if stop is not None and stop.is_set():
            return
        sched = run_rule(problem, rule)
        if sched is not None:
            yield f"heuristic:{rule.name}", sched
    yield "heuristic:minimal-memory", minimal_memory_schedule(problem)


def solve(
    problem: Problem,
    *,
    backend: str = "auto",
    time_limit: float = 60.0,
    gap_target: float = 0.0,
    seed: int = 0,
    workers: int | None = None,
    hint: Schedule | None = None,
    on_incumbent: Callable[[Incumbent], None] | None = None,
    stop: threading.Event | None = None,
    deterministic_time: float | None = None,
    use_baselines: bool = True,
) -> SolveResult:
    """The fastest schedule found within ``time_limit`` that fits the memory limit.

    Raises ``InfeasibleMemoryLimit`` when no schedule fits (naming the smallest feasible
    limit) and ``ValueError`` for an unknown backend. ``deterministic_time`` (CP-SAT's
    deterministic time limit) makes runs with ``workers=1`` reproducible in tests.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown solver backend {backend!r}; one of {', '.join(BACKENDS)}")
    if time_limit < 0:
        raise ValueError(f"time_limit must be >= 0 seconds, got {time_limit}")
    t0 = time.perf_counter()
    check_memory_limit(problem)
    lb = lower_bound(problem)
    best = _Best(problem, t0, on_incumbent, lb)
    message: str | None = None

    for source, sched in heuristic_candidates(problem, stop):
        best.offer(sched, source)
    if hint is not None:
        if hint.problem_hash != problem.hash:
            message = "the hint was made for another problem and was ignored"
        else:
            best.offer(hint.with_evaluation(evaluate(problem, hint)), "hint")
    if use_baselines and not (stop is not None and stop.is_set()):
        # baselines are hints only: none starts after half the time limit
        for name, sched in _baselines(problem, t0 + 0.5 * time_limit):
            best.offer(sched, f"baseline:{name}")

    used, message = _choose_backend(problem, backend, best, message)

    remaining = time_limit - (time.perf_counter() - t0)
    proven_optimal = False
    if (
        used != "heuristic"
        and best.schedule is not None
        and remaining > 0
        and not (stop is not None and stop.is_set())
        and best.makespan > best.bound * (1 + 1e-9)
    ) or (used != "heuristic" and best.schedule is None and remaining > 0):
        proven_optimal = _run_backend(
            used, problem, best, remaining, gap_target, seed, workers, stop, deterministic_time
        )

    if best.schedule is None:
        raise infeasible_error(problem, smallest_feasible_limit(problem)[1])
    makespan = best.makespan
    bound = min(best.bound, makespan)
    if proven_optimal:
        bound = makespan
    gap = (makespan - bound) / makespan if makespan > 0 else 0.0
    if gap <= 1e-9:
        status = "optimal"
        gap = 0.0
    else:
        status = "heuristic" if used == "heuristic" else "feasible"
    sched = best.schedule
    final = Schedule(
        problem_hash=problem.hash,
        generator="optpipe",
        params={
            "backend": used,
            "time_limit": time_limit,
            "seed": seed,
            "gap": gap,
            "gap_target": gap_target,
            "lower_bound": bound,
            "status": status,
            "source": best.source,
        },
        actions=list(sched.actions),
        evaluation=evaluate(problem, sched),
        problem=problem,
    )
    first = best.incumbents[0].wall_time if best.incumbents else 0.0
    return SolveResult(
        schedule=final,
        makespan=makespan,
        lower_bound=bound,
        gap=gap,
        status=status,
        backend=used,
        solve_seconds=time.perf_counter() - t0,
        first_solution_seconds=first,
        incumbents=list(best.incumbents),
        message=message,
    )


def _milp_size(problem: Problem, best: _Best) -> tuple[int, int, bool]:
    """(variables, constraints, exact?) of the MILP; a lower estimate for large problems."""
    p, v, m = problem.num_stages, problem.num_chunks, problem.num_microbatches
    ops = 3 * p * v * m
    if ops > MILP_BUILD_MAX_OPS:
        # at least one start and one tightness literal per op, two rows per precedence
        return 2 * ops, 3 * ops, False
    from .milp import build_milp

    lm = build_milp(
        problem, tick_model(problem, _horizon_guess(problem, best)), horizon=1, lower_bound=0
    )
    n, r = lm.size()
    return n, r, True


def _choose_backend(
    problem: Problem, backend: str, best: _Best, message: str | None
) -> tuple[str, str | None]:
    """The backend that runs, and the plain reason when it is not the one asked for."""
    if backend in ("cpsat", "highs", "heuristic"):
        return backend, message
    status = gurobi_license_status()
    if backend == "auto":
        if status != "full":
            return "cpsat", message
        n, _r, _exact = _milp_size(problem, best)
        if n > AUTO_GUROBI_MAX_VARS:
            return "cpsat", message
        return "gurobi", message
    # backend == "gurobi"
    if status == "missing" or status.startswith("unusable"):
        from .licence import gurobi_license_detail

        return "cpsat", (
            f"Gurobi was asked for but its licence is {status} "
            f"({gurobi_license_detail()}); CP-SAT ran instead"
        )
    if status == "restricted":
        n, r, exact = _milp_size(problem, best)
        if n > RESTRICTED_MAX_VARS or r > RESTRICTED_MAX_CONSTRS:
            need = (
                f"{n} variables and {r} constraints"
                if exact
                else (f"at least {n} variables and {r} constraints")
            )
            return "cpsat", (
                "Gurobi was asked for, but this gurobipy has the size-limited pip licence "
                f"({RESTRICTED_MAX_VARS} variables and {RESTRICTED_MAX_CONSTRS} constraints, "
                f"non-production evaluation only) and this model needs {need}; CP-SAT ran "
                "instead (install a full Gurobi licence to use Gurobi on models this size)"
            )
    return "gurobi", message


def _horizon_guess(problem: Problem, best: _Best) -> float:
    if best.schedule is not None:
        return best.makespan
    pb = problem
    total = (
        float((pb.cost("t_f") + pb.cost("t_b") + pb.cost("t_w") + 2 * pb.cost("t_comm")).sum())
        * pb.num_microbatches
    )
    if pb.offload is not None:
        total += (
            sum(
                pb.offload_time(s, c) + pb.reload_time(s, c)
                for s in range(pb.num_stages)
                for c in range(pb.num_chunks)
            )
            * pb.num_microbatches
        )
    return total


def _run_backend(
    used: str,
    problem: Problem,
    best: _Best,
    time_limit: float,
    gap_target: float,
    seed: int,
    workers: int | None,
    stop: threading.Event | None,
    deterministic_time: float | None,
) -> bool:
    """Run one exact backend; returns whether it proved the incumbent optimal."""
    tm = tick_model(problem, _horizon_guess(problem, best))
    hint = None
    if best.schedule is not None:
        h = tick_times(problem, best.schedule, tm)
        if h is not None:
            hint = (h[0], h[1])
            horizon = h[2] if tm.exact else int(h[2] * 1.1) + 10
        else:
            horizon = int(_horizon_guess(problem, best) / tm.tick) + 10
    else:
        horizon = int(_horizon_guess(problem, best) / tm.tick) + 10
    lb_ticks = int(best.bound / tm.tick * (1 - 1e-9)) if best.bound > 0 else 0
    lb_ticks = min(lb_ticks, horizon)
    nworkers = workers if workers is not None else max(1, min(os.cpu_count() or 1, 8))

    def on_solution(starts: dict[OpKey, int], ends: dict[OpKey, int], obj: int, bnd: int) -> None:
        if tm.exact:
            best.raise_bound(bnd * tm.tick)
            # a relaxed solution may still time better in the simulator than its objective
            # says only if it is infeasible there; an exact one never does
            if obj * tm.tick >= best.makespan * (1 - _REL):
                return
        sched = schedule_from_ticks(problem, tm, starts, ends, used)
        best.offer(sched, used)

    if used == "cpsat":
        from .cpsat import solve_cpsat, tight_model_size

        tight = tight_model_size(problem) <= TIGHT_MODEL_MAX
        out = solve_cpsat(
            problem,
            tm,
            horizon=horizon,
            lower_bound=lb_ticks,
            hint=hint,
            time_limit=time_limit,
            gap_target=gap_target,
            seed=seed,
            workers=nworkers,
            on_solution=on_solution,
            stop=stop,
            deterministic_time=deterministic_time,
            tight=tight,
        )
        status, obj, bnd = out.status, out.objective, out.bound
        if out.starts:
            best.offer(schedule_from_ticks(problem, tm, out.starts, out.ends, used), used)
    else:
        from .milp import build_milp, solve_milp

        model = build_milp(problem, tm, horizon=horizon, lower_bound=lb_ticks)
        res = solve_milp(
            model,
            used,
            hint=hint,
            time_limit=time_limit,
            gap_target=gap_target,
            seed=seed,
            workers=nworkers,
            on_solution=on_solution,
            stop=stop,
        )
        status, obj, bnd = res.status, res.objective, res.bound
        if res.starts:
            best.offer(schedule_from_ticks(problem, tm, res.starts, res.ends, used), used)
    if not tm.exact:
        return False
    if bnd is not None:
        best.raise_bound(bnd * tm.tick)
    if status == "optimal" and obj is not None:
        best.raise_bound(obj * tm.tick)
        return best.makespan <= obj * tm.tick * (1 + 1e-9) + 1e-12
    if status == "infeasible" and best.schedule is not None:
        # the horizon was the incumbent's makespan: nothing better exists
        best.raise_bound(best.makespan)
        return True
    return False
