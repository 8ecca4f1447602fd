"""The exact backend of a solve: CP-SAT (default), Gurobi or HiGHS, run within the budget.

``choose_backend`` picks the one that runs (Gurobi only with a licence that fits the model);
``run_backend`` builds its model hinted with the incumbent, stops it at the time limit less a
reserve for turning its last solution into a schedule, and offers every solution it reports,
re-timed and repaired by the simulator (``schedule_from_ticks``). Its bound raises the
incumbent's where the model is exact (``backend_bounds_hold``).
"""

from __future__ import annotations

import math
import os
import threading
import time

from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from . import fusing
from .extract import actions_from_times, repair
from .hints import tick_times
from .incumbent import Best, Budget
from .licence import RESTRICTED_MAX_CONSTRS, RESTRICTED_MAX_VARS, gurobi_license_status
from .ticks import OpKey, TickModel, fusable, tick_model

_REL = 1e-9

# largest tight CP-SAT model (estimated literals) before the relaxation is used instead
TIGHT_MODEL_MAX = 12_000
# ops above which the MILP is not even built to count it (it grows with their square)
MILP_BUILD_MAX_OPS = 600
# with a full Gurobi licence, "auto" uses Gurobi only up to this many MILP variables: on larger
# models CP-SAT was measured better (solver note); ask for backend="gurobi" to force it
AUTO_GUROBI_MAX_VARS = 20_000

# CP-SAT's exact model first searches the timing of the hint's offload decisions, fixed, for this
# share of its time (``cpsat.solve_cpsat``), then the whole model. Not the relaxation: there it
# made no difference beyond noise at 8x32 and slowed a proof at 4x8x2 (0.5p 0.5x: 42 s, not 5 s)
OFFLOADS_FIXED_SHARE = 0.25
# where CP-SAT may fuse backwards, it first searches with the hint's fused-or-split choices fixed
# for this share of its time, then with them free (``cpsat.solve_cpsat``)
FUSED_FIXED_SHARE = 0.5

# CP-SAT's model build, estimated from one hint conversion (a simulation plus a pass over the
# ops): the build took 3.7-10x that at 32x256x2 (six runs, 2 cores). The backend is not started
# with less than MIN_BACKEND_BUILDS builds' time left; it is stopped at the limit less the
# reserve for extracting its last solution, and its own time limit leaves out half a build
BUILD_PER_SIM = 10.0
MIN_BACKEND_BUILDS = 2.0
EXTRACT_SIMS = 3.0  # reserve for one extraction (actions from times, simulation, repair)
# and for the backend to wind down once stopped: CP-SAT returned 0.1-0.35 s after its stop at
# 16x64x2 (2 workers), whatever the simulation time; the reserve is this share of the time
# limit, at most STOP_RESERVE_MAX seconds
STOP_RESERVE_SHARE = 0.01
STOP_RESERVE_MAX = 0.5


def schedule_from_ticks(
    problem: Problem,
    tm: TickModel,
    starts: dict[OpKey, int],
    ends: dict[OpKey, int],
    source: str,
    max_moves: int = 200,
) -> Schedule | None:
    """Action lists from a backend's tick times, repaired (at most ``max_moves`` re-simulations)
    and evaluated by the simulator."""
    st = {k: v * tm.tick for k, v in starts.items()}
    en = {k: v * tm.tick for k, v in ends.items()}
    rows = actions_from_times(problem, st, en)
    res = repair(problem, rows, max_moves=max_moves)
    if not res.feasible:
        return None
    return Schedule.built(
        problem_hash=problem.hash,
        generator="optpipe-solver",
        params={"source": source},
        actions=rows,
        evaluation=res.evaluation,
        problem=problem,
    )


def worker_count(workers: int | None) -> int:
    return workers if workers is not None else max(1, min(os.cpu_count() or 1, 8))


def _milp_size(problem: Problem, best: Best) -> tuple[int, int, bool]:
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


def choose_backend(
    problem: Problem, backend: str, best: Best, message: str | None
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


def _horizon_guess(problem: Problem, best: Best) -> float:
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


def _stop_at(at: float, stop: threading.Event | None) -> tuple[threading.Event, threading.Event]:
    """An event set at ``at`` (``time.perf_counter()``) or when ``stop`` is set, whichever comes
    first, and the event that ends its watcher thread."""
    fire = threading.Event()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if (stop is not None and stop.is_set()) or time.perf_counter() >= at:
                fire.set()
                return
            done.wait(max(0.0, min(0.02, at - time.perf_counter())))

    threading.Thread(target=watch, name="optpipe-solve-deadline", daemon=True).start()
    return fire, done


def backend_bounds_hold(problem: Problem, tm: TickModel, backend: str = "cpsat") -> bool:
    """Whether a backend's bounds and proofs hold for every schedule of the problem.

    They need exact ticks (``TickModel.exact``). CP-SAT's model chooses fused or split for every
    backward where fusing can pay (``ticks.fusable``). The MILPs run every backward as B then W:
    where a fused BW is cheaper than B + W somewhere, a schedule with fused backwards can beat
    their optimum, so their bound proves nothing there (their solutions stay valid schedules).
    """
    if not tm.exact:
        return False
    if backend == "cpsat" and fusing.FUSE_BACKWARDS:
        return True
    return not fusable(problem)


def run_backend(
    used: str,
    problem: Problem,
    best: Best,
    budget: Budget,
    gap_target: float,
    seed: int,
    workers: int | None,
    stop: threading.Event | None,
    deterministic_time: float | None,
) -> bool:
    """Run one exact backend within the budget; returns whether it proved the incumbent optimal.

    The backend is stopped at the time limit less ``EXTRACT_SIMS`` simulations (for turning its
    last solution into a schedule); its own time limit also leaves out half the estimated model
    build (``BUILD_PER_SIM`` simulations), the backstop should the stop come before its search.
    """
    if budget.rule_seconds and budget.left() < 2 * max(budget.rule_seconds):
        # not even the hint's conversion (one simulation) fits
        budget.skip(f"{used} search ({max(0.0, budget.left()):.2f} s left)")
        return False
    t_conv = time.perf_counter()
    tm = tick_model(problem, _horizon_guess(problem, best))
    hint = None
    if best.schedule is not None:
        h = tick_times(problem, best.schedule, tm, keep_fused=used == "cpsat")
        if h is not None:
            hint = (h[0], h[1])
            horizon = h[2] if tm.exact else int(h[2] * 1.1) + 10
        else:
            horizon = int(_horizon_guess(problem, best) / tm.tick) + 10
        budget.saw_simulation(time.perf_counter() - t_conv)  # one simulation and a conversion
    else:
        horizon = int(_horizon_guess(problem, best) / tm.tick) + 10
    budget.add("hint conversion", time.perf_counter() - t_conv)
    if best.bound <= 0:
        lb_ticks = 0
    elif tm.exact:
        # every simulated time is a whole number of ticks: the makespan is at least the bound
        # rounded up (rounding down let CP-SAT search on below a bound the incumbent had met)
        lb_ticks = math.ceil(best.bound / tm.tick - 1e-6)
    else:
        lb_ticks = int(best.bound / tm.tick * (1 - 1e-9))
    lb_ticks = min(lb_ticks, horizon)
    nworkers = worker_count(workers)

    sim = budget.sim_seconds
    wind_down = min(STOP_RESERVE_MAX, STOP_RESERVE_SHARE * budget.limit)
    t_stop = budget.end - (EXTRACT_SIMS * sim + wind_down)
    build_est = BUILD_PER_SIM * sim
    avail = t_stop - time.perf_counter()
    if avail < MIN_BACKEND_BUILDS * build_est or avail <= 0:
        budget.skip(
            f"{used} search ({max(0.0, avail):.1f} s left; building its model takes about "
            f"{build_est:.1f} s)"
        )
        return False
    # the stop at t_stop is what ends a search that started; the backend's own limit is the
    # backstop for a stop that came while the model was still being built (then it is lost)
    time_limit = max(0.01, avail - 0.5 * build_est)
    # (objective, starts, ends) of the backend's last solution when it was not extracted
    pending: list[tuple[int, dict[OpKey, int], dict[OpKey, int]]] = []
    seen: set[int] = set()  # objectives the callback was given

    def extract(starts: dict[OpKey, int], ends: dict[OpKey, int]) -> None:
        moves = 200
        if sim > 0:
            moves = max(0, min(200, int(budget.left() / sim) - 2))
        with budget.phase("extraction"):
            best.offer(schedule_from_ticks(problem, tm, starts, ends, used, moves), used)

    proves = backend_bounds_hold(problem, tm, used)

    def on_solution(starts: dict[OpKey, int], ends: dict[OpKey, int], obj: int, bnd: int) -> None:
        pending.clear()
        seen.add(obj)
        if tm.exact:
            if proves:
                best.raise_bound(bnd * tm.tick)
            # a relaxed solution may still time better in the simulator than its objective
            # says only if it is infeasible there; an exact one never does
            if obj * tm.tick >= best.makespan * (1 - _REL):
                return
        if time.perf_counter() >= t_stop:
            pending.append((obj, starts, ends))  # the search is being stopped
            return
        extract(starts, ends)
        if best.meets(gap_target):
            fire.set()  # the incumbent meets the bound (or the gap target): nothing left to find

    fire, done = _stop_at(t_stop, stop)
    t_search = time.perf_counter()
    try:
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
                stop=fire,
                deterministic_time=deterministic_time,
                tight=tight,
                deadline=t_stop,
                offloads_fixed_share=OFFLOADS_FIXED_SHARE if tight else 0.0,
                fused_fixed_share=FUSED_FIXED_SHARE,
            )
            status, obj, bnd = out.status, out.objective, out.bound
            starts, ends = out.starts, out.ends
        else:
            from . import milp
            from .milp import ModelNotBuilt, build_milp
            from .milp_solvers import solve_milp

            try:
                # (a Python build: it stops at the backend's stop, and is not started at all
                # where the model would be larger than the memory it may take, ``milp``)
                model = build_milp(
                    problem,
                    tm,
                    horizon=horizon,
                    lower_bound=lb_ticks,
                    max_variables=milp.MILP_MAX_VARIABLES,
                    deadline=t_stop,
                    stop=fire,
                )
            except ModelNotBuilt as e:
                budget.skip(f"{used} search ({e})")
                return False
            # the search gets what the build left, never more (its own limit was set before)
            res = solve_milp(
                model,
                used,
                hint=hint,
                time_limit=time_limit,
                gap_target=gap_target,
                seed=seed,
                workers=nworkers,
                on_solution=on_solution,
                stop=fire,
                deadline=t_stop,
            )
            status, obj, bnd = res.status, res.objective, res.bound
            starts, ends = res.starts, res.ends
    finally:
        done.set()
        budget.add(f"{used} (build and search)", time.perf_counter() - t_search)
    if starts and obj is not None and obj not in seen:
        pending[:] = [(obj, starts, ends)]  # a final solution the callback never saw
    if pending:
        # the last solution came as the search was being stopped: take it if it still fits
        p_obj, p_starts, p_ends = pending[0]
        if budget.left() >= 1.5 * sim:  # over by at most about one simulation
            extract(p_starts, p_ends)
        else:
            budget.skip(f"{used}'s last solution (objective {p_obj} ticks) not extracted")
    if not proves:
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
