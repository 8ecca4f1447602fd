"""``solve``: heuristics first (an answer at once), then an exact backend improves and proves.

Pipeline: check the memory limit (clear error below what any schedule can fit); run the
offload-aware list schedulers, a local search over their parameters from the best ones
(``rule_search``), the offload repair, the user's hint and the baselines; where copies are as
slow as compute or slower, search periodic patterns (``periodic``: K microbatches every T, the steady
state that the list rules' waves miss) until ``PERIODIC_SHARE`` of the limit; where a fused
backward is cheaper than B + W, fuse adjacent B, W pairs of the best where faster (``fusing``, at
most ``FUSING_SHARE`` of the limit); keep the best the simulator accepts (first incumbent,
fallback, hint and horizon); then CP-SAT (default), Gurobi (when its licence allows) or HiGHS
searches with that hint (CP-SAT's exact model first for ``OFFLOADS_FIXED_SHARE`` of its time with
the hint's offload decisions fixed, and where it may fuse, ``FUSED_FIXED_SHARE`` with the hint's
fused-or-split choices fixed). Every solution a
backend reports is turned into action lists and re-evaluated by the one simulator; only the
simulator's makespan is reported.

Time limit (the guarantee): ``solve`` returns within ``time_limit`` plus about one simulation of
the problem (``Budget``; measured 59.4-60.0 s against 60 s at 32 x 256 x 1 and x 2 and 16 x 64 x 2,
2 cores; BENCHMARKS.md). Every phase has a deadline: heuristic rules (and the rule search) start
only in the first ``HEURISTIC_SHARE`` of the limit, baselines run cooperatively until
``BASELINE_SHARE`` and are abandoned there (``schedule.baselines._deadline``; one stopped while
running runs once more, from the start, until ``SECOND_CHANCE_SHARE``, and those still
unfinished or not started run in whatever time the backend leaves), the backend is stopped at the
limit less a reserve for winding down and turning its last solution into a schedule, and an
extraction that no longer fits is skipped. Two exceptions: the first schedule that fits is always
found, however small the limit (the heuristics run until one fits; the minimal-memory order, which
fits whenever any order does, comes right after the first rule that does not), and a CP-SAT stop
that arrives while its model is still being built is lost, so the backend's own limit also leaves
out half the estimated build (``BUILD_PER_SIM``). What was skipped is listed in the schedule's
``params["skipped"]`` and in ``message``; the seconds each phase took in
``params["phase_seconds"]``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..schedule.bounds import lower_bound
from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from ..schedule.simulator import evaluate
from . import fusing, periodic
from .extract import actions_from_times, repair
from .feasibility import (
    check_memory_limit,
    infeasible_error,
    minimal_memory_schedule,
    smallest_feasible_limit,
)
from .fusing import fuse_where_faster
from .heuristics import ListRule, default_rules, run_rule
from .hints import tick_times
from .licence import RESTRICTED_MAX_CONSTRS, RESTRICTED_MAX_VARS, gurobi_license_status
from .offload_repair import applicable as repair_applies
from .offload_repair import repaired_schedules
from .results import Incumbent, SolveResult
from .rule_search import search_rules
from .ticks import OpKey, TickModel, fusable, tick_model

BACKENDS = ("auto", "cpsat", "gurobi", "highs", "heuristic")
# largest tight CP-SAT model (estimated literals) before the relaxation is used instead
TIGHT_MODEL_MAX = 12_000
# ops above which the MILP is not even built to count it (it grows with their square)
MILP_BUILD_MAX_OPS = 600
# with a full Gurobi licence, "auto" uses Gurobi only up to this many MILP variables: on larger
# models CP-SAT was measured better (solver note); ask for backend="gurobi" to force it
AUTO_GUROBI_MAX_VARS = 20_000
_REL = 1e-9
# phase deadlines as shares of the time limit (see the module doc)
HEURISTIC_SHARE = 0.25
BASELINE_SHARE = 0.5
# a baseline stopped while running may run once more, from the start, until this share
SECOND_CHANCE_SHARE = 0.75
# periodic patterns (where copies are as slow as compute or slower) run until this share; the
# backend, hinted with the best, gets the rest
PERIODIC_SHARE = 0.75
# CP-SAT's exact model first searches the timing of the hint's offload decisions, fixed, for this
# share of its time (``cpsat.solve_cpsat``), then the whole model. Not the relaxation: there it
# made no difference beyond noise at 8x32 and slowed a proof at 4x8x2 (0.5p 0.5x: 42 s, not 5 s)
OFFLOADS_FIXED_SHARE = 0.25
# where CP-SAT may fuse backwards, it first searches with the hint's fused-or-split choices fixed
# for this share of its time, then with them free (``cpsat.solve_cpsat``)
FUSED_FIXED_SHARE = 0.5
# at most this share of the time limit goes to fusing B, W pairs of the best schedule before the
# backend (``fusing``: one simulation per stage)
FUSING_SHARE = 0.05
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


class Budget:
    """The deadline of one solve, how long one simulation takes, and where the time went."""

    def __init__(self, t0: float, time_limit: float) -> None:
        self.t0 = t0
        self.limit = time_limit
        self.end = t0 + time_limit
        self.sim_seconds = 0.0  # the longest simulation (or hint conversion) measured
        # seconds of each heuristic rule that made a schedule (a list scheduling and one
        # simulation: an upper bound of one simulation before one is measured)
        self.rule_seconds: list[float] = []
        self.phase_seconds: dict[str, float] = {}
        self.skipped: list[str] = []

    def now(self) -> float:
        return time.perf_counter()

    def at(self, share: float) -> float:
        """The moment ``share`` of the time limit has passed."""
        return self.t0 + share * self.limit

    def left(self, until: float | None = None) -> float:
        return (self.end if until is None else until) - time.perf_counter()

    def saw_simulation(self, seconds: float) -> None:
        self.sim_seconds = max(self.sim_seconds, seconds)

    def skip(self, what: str) -> None:
        self.skipped.append(what)

    def add(self, name: str, seconds: float) -> None:
        self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)


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

    def meets(self, gap_target: float) -> bool:
        """Whether the best schedule is within the gap target of the bound (or meets it)."""
        slack = max(gap_target * self.makespan, self.bound * 1e-9)
        return self.schedule is not None and self.makespan - self.bound <= slack


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


def _baselines(
    problem: Problem,
    deadline: float | None = None,
    budget: Budget | None = None,
    names: list[str] | None = None,
    unfinished: list[str] | None = None,
    interrupted: list[str] | None = None,
) -> list[tuple[str, Schedule]]:
    """Every baseline that exists yet and applies (extra hints and fallbacks, never needed).

    With a ``deadline`` (``time.perf_counter()`` value) no baseline starts after it and a
    running one is stopped there (cooperatively, within about one simulation) and dropped; the
    ``budget`` then lists the ones skipped or stopped, ``unfinished`` gets their names and
    ``interrupted`` the names of those stopped while running.
    ``names`` runs only those baselines.
    """
    try:
        from ..schedule.baselines import BASELINE_NAMES, generate
        from ..schedule.baselines._deadline import DeadlineExceeded, deadline_at
    except (ImportError, AttributeError):
        return []
    if names is not None:
        names = [n for n in names if n in BASELINE_NAMES]
    elif problem.offload is not None and any(x is not None for x in problem.memory_limits()):
        # the memory-aware ones first: where the list schedulers struggle, they help most
        names = list(BASELINE_NAMES)
        first = [n for n in ("adaoffload", "pipeoffload", "zb-auto", "v-min") if n in names]
        names = first + [n for n in names if n not in first]
    else:
        names = list(BASELINE_NAMES)
    out = []
    for i, name in enumerate(names):
        if deadline is not None and time.perf_counter() > deadline:
            if budget is not None:
                budget.skip("baselines not started: " + ", ".join(names[i:]))
            if unfinished is not None:
                unfinished.extend(names[i:])
            break
        t = time.perf_counter()
        try:
            with deadline_at(deadline):
                sched = generate(name, problem)
        except DeadlineExceeded:
            if budget is not None:
                budget.skip(f"baseline {name} stopped after {time.perf_counter() - t:.1f} s")
            if unfinished is not None:
                unfinished.append(name)
            if interrupted is not None:
                interrupted.append(name)
            continue
        except Exception:  # NotApplicable, or a generator not written yet / broken
            continue
        finally:
            if budget is not None:
                budget.add(f"baseline:{name}", time.perf_counter() - t)
        if isinstance(sched, Schedule):
            out.append((name, sched))
    return out


def heuristic_candidates(
    problem: Problem,
    stop: threading.Event | None = None,
    keep_going: Callable[[], bool] | None = None,
    skipped: list[str] | None = None,
    timings: list[float] | None = None,
    have_one: Callable[[], bool] | None = None,
) -> Iterator[tuple[str, Schedule]]:
    """The list schedulers' schedules (source name, schedule), in rule order, as made; the
    minimal-memory order (it always fits when any schedule does) comes last.

    Before each rule ``keep_going()`` is asked, and ``stop`` looked at; when either says no the
    rest is skipped (named in ``skipped``). The seconds each rule that made a schedule took go
    to ``timings``. With ``have_one`` (whether a schedule that fits was found), the
    minimal-memory order is moved right after the first rule when that one did not fit, so a
    first answer comes early even where the rules that fit come late and are slow (32x256x2
    with slow copies: the first rules get stuck, the first waiting rule takes about 1 s).
    """
    rules = default_rules(problem)
    todo = [(f"heuristic:{r.name}", r) for r in rules] + [("heuristic:minimal-memory", None)]
    n_rules = len(rules)
    while todo:
        if (stop is not None and stop.is_set()) or (keep_going is not None and not keep_going()):
            if skipped is not None:
                skipped.append("heuristics not started: " + ", ".join(n for n, _ in todo))
            return
        k = 0
        if have_one is not None and todo[-1][1] is None and len(todo) <= n_rules and not have_one():
            k = len(todo) - 1  # a rule ran and nothing fits yet: the sure one first
        name, rule = todo.pop(k)
        t = time.perf_counter()
        sched = run_rule(problem, rule) if rule is not None else minimal_memory_schedule(problem)
        if sched is not None:
            if timings is not None:
                timings.append(time.perf_counter() - t)
            yield name, sched


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

    Returns within ``time_limit`` plus about one simulation of the problem (the module doc says
    how), except that the first schedule that fits is always found and kept. Raises
    ``InfeasibleMemoryLimit`` when no schedule fits (naming the smallest feasible limit) and
    ``ValueError`` for an unknown backend. ``deterministic_time`` (CP-SAT's deterministic time
    limit) makes runs with ``workers=1`` reproducible in tests.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown solver backend {backend!r}; one of {', '.join(BACKENDS)}")
    if time_limit < 0:
        raise ValueError(f"time_limit must be >= 0 seconds, got {time_limit}")
    t0 = time.perf_counter()
    budget = Budget(t0, time_limit)
    with budget.phase("checks"):
        check_memory_limit(problem)
        lb = lower_bound(problem)
    best = _Best(problem, t0, on_incumbent, lb)
    message: str | None = None

    def stopped() -> bool:
        return stop is not None and stop.is_set()

    heur_until = budget.at(HEURISTIC_SHARE)

    def keep_going() -> bool:
        # the first schedule that fits is always found; after it, only within the share
        return best.schedule is None or (time.perf_counter() < heur_until and not stopped())

    rules = {f"heuristic:{r.name}": r for r in default_rules(problem)}
    starts: list[tuple[float, ListRule]] = []  # (makespan, rule) of the rules whose schedule fits
    with budget.phase("heuristics"):
        for source, sched in heuristic_candidates(
            problem,
            None,
            keep_going,
            budget.skipped,
            budget.rule_seconds,
            have_one=lambda: best.schedule is not None,
        ):
            best.offer(sched, source)
            ev = sched.evaluation
            if source in rules and ev is not None and ev.feasible and ev.makespan is not None:
                starts.append((ev.makespan, rules[source]))

    def gap_open() -> bool:
        return not best.meets(gap_target)

    if starts and not stopped() and time.perf_counter() < heur_until and gap_open():
        # the rules' parameters tuned to this problem, before the offload repair (which can
        # take the rest of the share at 32x256x1); not once the bound proves the best optimal
        with budget.phase("rule search"):
            for rule, sched in search_rules(
                problem, starts, lambda: keep_going() and gap_open(), tried=rules.values()
            ):
                best.offer(sched, f"heuristic:{rule.name}")
    if (
        best.schedule is not None
        and not stopped()
        and time.perf_counter() < heur_until
        and repair_applies(problem)
    ):
        with budget.phase("offload repair"):
            for sched in repaired_schedules(problem, deadline=heur_until):
                best.offer(sched, f"heuristic:{sched.params['rule']}")
    if hint is not None:
        if hint.problem_hash != problem.hash:
            message = "the hint was made for another problem and was ignored"
        else:
            with budget.phase("hint"):
                best.offer(hint.with_evaluation(evaluate(problem, hint)), "hint")
    unfinished: list[str] = []
    if use_baselines and not stopped() and gap_open():
        # baselines are hints only: they run (and are stopped) within the first half, and not
        # once the bound proves the best schedule optimal (v-half alone took 11 s at 32x256x2)
        interrupted: list[str] = []
        with budget.phase("baselines"):
            for name, sched in _baselines(
                problem,
                budget.at(BASELINE_SHARE),
                budget,
                unfinished=unfinished,
                interrupted=interrupted,
            ):
                best.offer(sched, f"baseline:{name}")
        if interrupted and not stopped():
            # one stopped while running gets another try first: on a machine slower than the
            # shares assume, AdaOffload (the best answer where copies are slow, 2.6x better than
            # the list schedules at 32x256x2, 0.25p, 2x) can need more than its half
            unfinished = [n for n in unfinished if n not in interrupted]
            with budget.phase("baselines (second chance)"):
                for name, sched in _baselines(
                    problem,
                    budget.at(SECOND_CHANCE_SHARE),
                    budget,
                    names=interrupted,
                    unfinished=unfinished,
                ):
                    best.offer(sched, f"baseline:{name}")

    if (
        backend != "heuristic"
        and best.schedule is not None
        and not stopped()
        and gap_open()
        and periodic.applies(problem)
        and time.perf_counter() < budget.at(PERIODIC_SHARE)
    ):
        with budget.phase("periodic"):
            _run_periodic(problem, best, budget, seed, workers, stop)

    if best.schedule is not None and fusable(problem) and not stopped() and gap_open():
        # the rules and patterns run every backward split: fuse B, W pairs where that is faster
        with budget.phase("fusing"):
            until = min(budget.end, time.perf_counter() + FUSING_SHARE * budget.limit)
            source = best.source
            best.offer(fuse_where_faster(problem, best.schedule, until), f"fused:{source}")

    used, message = _choose_backend(problem, backend, best, message)

    proven_optimal = False
    if (
        used != "heuristic"
        and budget.left() > 0
        and not stopped()
        and (best.schedule is None or best.makespan > best.bound * (1 + 1e-9))
    ):
        proven_optimal = _run_backend(
            used, problem, best, budget, gap_target, seed, workers, stop, deterministic_time
        )
    elif used != "heuristic" and best.schedule is not None and budget.left() <= 0:
        budget.skip(f"{used} search (no time left)")
    # time the backend left (it was skipped, or ended early without a proof): the baselines
    # stopped at the first half run again until the limit (on a slow machine AdaOffload may need
    # more than its share, and it is the best answer where copies are slow)
    until = budget.end - min(STOP_RESERVE_MAX, STOP_RESERVE_SHARE * budget.limit)
    if unfinished and not proven_optimal and not stopped() and time.perf_counter() < until:
        with budget.phase("baselines (in the time left)"):
            for name, sched in _baselines(problem, until, budget, names=unfinished):
                best.offer(sched, f"baseline:{name}")

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
    params: dict[str, object] = {
        "backend": used,
        "time_limit": time_limit,
        "seed": seed,
        "gap": gap,
        "gap_target": gap_target,
        "lower_bound": bound,
        "status": status,
        "source": best.source,
        "phase_seconds": {k: round(v, 3) for k, v in budget.phase_seconds.items()},
    }
    if budget.skipped:
        params["skipped"] = list(budget.skipped)
        note = f"time limit {time_limit:g} s: skipped " + "; ".join(
            x if len(x) <= 90 else x[:87] + "..." for x in budget.skipped
        )
        message = note if message is None else f"{message}; {note}"
    # every offered schedule carries the simulator's evaluation of exactly its actions on this
    # problem (``_Best.offer`` takes no other), so it is not simulated a second time here
    final = Schedule.built(
        problem_hash=problem.hash,
        generator="optpipe",
        params=params,
        actions=list(sched.actions),
        evaluation=sched.evaluation,
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


def _run_periodic(
    problem: Problem,
    best: _Best,
    budget: Budget,
    seed: int,
    workers: int | None,
    stop: threading.Event | None,
) -> None:
    """Periodic patterns (``periodic``) until ``PERIODIC_SHARE`` of the limit; each one that
    beats the incumbent in the simulator is offered (and so hints the backend)."""
    tm = tick_model(problem, best.makespan)
    deadline = budget.at(PERIODIC_SHARE)
    for pat in periodic.search(
        problem,
        tm,
        incumbent=best.makespan,
        lower_bound=best.bound,
        deadline=deadline,
        workers=_workers(workers),
        seed=seed,
        stop=stop,
    ):
        starts, ends = periodic.unrolled(problem, tm, pat)
        source = f"periodic:K={pat.size},T={pat.period * tm.tick:g}"
        with budget.phase("extraction"):
            best.offer(schedule_from_ticks(problem, tm, starts, ends, source), source)
        if best.meets(0.0):
            return


def _workers(workers: int | None) -> int:
    return workers if workers is not None else max(1, min(os.cpu_count() or 1, 8))


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


def _run_backend(
    used: str,
    problem: Problem,
    best: _Best,
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
    nworkers = _workers(workers)

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
                stop=fire,
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
