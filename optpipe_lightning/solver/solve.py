"""``solve``: heuristics first (an answer at once), then an exact backend improves and proves.

Pipeline: check the memory limit (clear error below what any schedule can fit); run the
offload-aware list schedulers, a local search over their parameters from the best ones
(``rule_search``), the offload repair, the user's hint and the baselines; where copies are as
slow as compute or slower, search periodic patterns (``periodic``: K microbatches every T, the steady
state that the list rules' waves miss) until ``PERIODIC_SHARE`` of the limit; where a fused
backward is cheaper than B + W, fuse adjacent B, W pairs of the best where faster (``fusing``, at
most ``FUSING_SHARE`` of the limit); where CP-SAT's exact model is too large, the
large-neighbourhood search (``lns``, ``LNS_SHARE`` of the time left); keep the best the simulator
accepts (first incumbent, fallback, hint and horizon); then CP-SAT (default), Gurobi (when its
licence allows) or HiGHS searches with that hint (``backend``: CP-SAT's exact model first for
``OFFLOADS_FIXED_SHARE`` of its time with the hint's offload decisions fixed, and where it may
fuse, ``FUSED_FIXED_SHARE`` with the hint's fused-or-split choices fixed). Every solution a
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
out half the estimated build (``backend.BUILD_PER_SIM``). What was skipped is listed in the
schedule's ``params["skipped"]`` and in ``message``; the seconds each phase took in
``params["phase_seconds"]``.

Chunks as a decision: with ``layers_per_stage`` (or ``chunkings=``) every chunking's list rules
and baselines are screened first (``SCREEN_SHARE``), then the pipeline above runs on the best;
given ``candidates`` are incumbents from the start, so the result is never slower than any.
Among equally fast schedules the one with the lowest peak share of the limit wins
(``incumbent.Best``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..schedule.bounds import lower_bound
from ..schedule.chunking import Chunking, describe, own_chunking, rechunk, stamped
from ..schedule.chunking import chunkings as all_chunkings
from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from ..schedule.simulator import evaluate
from . import backend, periodic
from .backend import (
    STOP_RESERVE_MAX,
    STOP_RESERVE_SHARE,
    choose_backend,
    run_backend,
    schedule_from_ticks,
    worker_count,
)
from .backend import backend_bounds_hold as backend_bounds_hold  # (re-exported)
from .feasibility import (
    check_memory_limit,
    infeasible_error,
    minimal_memory_schedule,
    smallest_feasible_limit,
)
from .fusing import fuse_where_faster
from .heuristics import ListRule, default_rules, run_rule
from .incumbent import Best, Budget
from .offload_repair import applicable as repair_applies
from .offload_repair import repaired_schedules
from .results import Incumbent, InfeasibleMemoryLimit, SolveResult
from .rule_search import search_rules
from .ticks import fusable, tick_model

BACKENDS = ("auto", "cpsat", "gurobi", "highs", "heuristic")
_REL = 1e-9
# phase deadlines as shares of the time limit (see the module doc)
HEURISTIC_SHARE = 0.25
BASELINE_SHARE = 0.5
# a baseline stopped while running may run once more, from the start, until this share
SECOND_CHANCE_SHARE = 0.75
# periodic patterns (where copies are as slow as compute or slower) run until this share; the
# backend, hinted with the best, gets the rest
PERIODIC_SHARE = 0.75
# at most this share of the time limit goes to fusing B, W pairs of the best schedule before the
# backend (``fusing``: one simulation per stage)
FUSING_SHARE = 0.05
# with several chunkings (``layers_per_stage``), every chunking's list rules and baselines run
# first, in equal slots of this share of the limit (the list rules in the first
# SCREEN_RULES_SHARE of each slot); the whole search then runs on the best chunking
SCREEN_SHARE = 0.4
SCREEN_RULES_SHARE = 0.5
# where CP-SAT's exact model is too large (``TIGHT_MODEL_MAX``), the large-neighbourhood search
# (``lns``: CP-SAT on one time window of the incumbent at a time) gets this share of the time
# left before the backend (the relaxation) gets the rest
LNS_SHARE = 0.5
# with a deterministic time (no wall clock decides), the windows the search may take
LNS_DETERMINISTIC_WINDOWS = 32


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


@dataclass
class _Screened:
    """What the screening of one chunking already ran (its pipeline does not run it again)."""

    starts: list[tuple[float, ListRule]] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)


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
    candidates: Sequence[Schedule] = (),
    chunkings: Sequence[tuple[int, str]] | None = None,
    lns: bool = True,
) -> SolveResult:
    """The fastest schedule found within ``time_limit`` that fits the memory limit.

    Returns within ``time_limit`` plus about one simulation of the problem (the module doc says
    how), except that the first schedule that fits is always found and kept. Raises
    ``InfeasibleMemoryLimit`` when no schedule fits (naming the smallest feasible limit) and
    ``ValueError`` for an unknown backend or a chunking the problem does not allow.
    ``deterministic_time`` (CP-SAT's deterministic time limit) makes runs with ``workers=1``
    reproducible in tests.

    ``candidates``: schedules (evaluated, each for the problem or a re-chunking of it) that are
    candidates of the search from the start, so the result is never slower than any of them
    (``compare`` passes its baseline rows). ``chunkings``: the (chunk count, placement) pairs to
    search; by default every one the problem's ``layers_per_stage`` allows (only its own without
    it). The result's schedule is for the chunking that won: it embeds that problem and records
    its ``num_chunks`` and ``placement``. ``lns``: run the large-neighbourhood search where
    CP-SAT's exact model is too large (``LNS_SHARE``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown solver backend {backend!r}; one of {', '.join(BACKENDS)}")
    if time_limit < 0:
        raise ValueError(f"time_limit must be >= 0 seconds, got {time_limit}")
    t0 = time.perf_counter()
    budget = Budget(t0, time_limit)
    options = _options(problem, chunkings)
    with budget.phase("checks"):
        feasible: list[tuple[Chunking, Problem]] = []
        error: InfeasibleMemoryLimit | None = None
        for ch, pb in options:
            try:
                check_memory_limit(pb)
            except InfeasibleMemoryLimit as e:
                error = error or e
                continue
            feasible.append((ch, pb))
        if not feasible:
            assert error is not None
            raise error
        bounds = {ch: lower_bound(pb) for ch, pb in feasible}
    top = Best(problem, t0, on_incumbent, min(bounds.values()))
    bests = {ch: Best(pb, t0, None, bounds[ch], parent=top) for ch, pb in feasible}
    by_hash = {pb.hash: ch for ch, pb in feasible}
    problems = dict(feasible)
    message: str | None = None

    given = [c for c in candidates if c.problem_hash in by_hash]
    if len(given) < len(candidates):
        message = (
            f"{len(candidates) - len(given)} candidate schedule(s) were made for another problem "
            "(or a chunking not searched) and were ignored"
        )
    with budget.phase("candidates"):
        for cand in given:
            ch = by_hash[cand.problem_hash]
            _offer_candidate(problems[ch], bests[ch], cand)
    if hint is not None:
        if hint.problem_hash not in by_hash:
            note = "the hint was made for another problem and was ignored"
            message = note if message is None else f"{message}; {note}"
        else:
            ch = by_hash[hint.problem_hash]
            with budget.phase("hint"):
                bests[ch].offer(hint.with_evaluation(evaluate(problems[ch], hint)), "hint")

    args = _Args(backend, gap_target, seed, workers, stop, deterministic_time, use_baselines, lns)
    proven: set[Chunking] = set()
    if len(feasible) == 1:
        ch, pb = feasible[0]
        used, ok, said = _pipeline(pb, bests[ch], budget, args, None, top)
    else:
        with budget.phase("screening"):
            screened = _screen(feasible, bests, top, budget, args)
        ch, pb = min(feasible, key=lambda x: (bests[x[0]].makespan, bests[x[0]].peak))
        used, ok, said = _pipeline(pb, bests[ch], budget.rest(), args, screened[ch], top)
    if ok:
        proven.add(ch)
    if said is not None:
        message = said if message is None else f"{message}; {said}"

    if top.schedule is None:
        raise infeasible_error(problem, smallest_feasible_limit(problem)[1])
    makespan = top.makespan
    # a chunking's bound holds for its schedules only: the solve's is the least of them
    per_bound = {c: max(b.bound, b.makespan) if c in proven else b.bound for c, b in bests.items()}
    bound = min(min(per_bound.values()), makespan)
    gap = (makespan - bound) / makespan if makespan > 0 else 0.0
    if gap <= 1e-9:
        status = "optimal"
        gap = 0.0
        bound = makespan
    else:
        status = "heuristic" if used == "heuristic" else "feasible"
    sched = top.schedule
    params: dict[str, object] = {
        "backend": used,
        "time_limit": time_limit,
        "seed": seed,
        "gap": gap,
        "gap_target": gap_target,
        "lower_bound": bound,
        "status": status,
        "source": top.source,
        "phase_seconds": {k: round(v, 3) for k, v in budget.phase_seconds.items()},
    }
    if len(bests) > 1:
        params["chunkings"] = [
            {
                "num_chunks": c[0],
                "placement": c[1],
                "makespan": b.makespan if b.schedule is not None else None,
                "lower_bound": per_bound[c],
            }
            for c, b in bests.items()
        ]
    if budget.skipped:
        params["skipped"] = list(budget.skipped)
        note = f"time limit {time_limit:g} s: skipped " + "; ".join(
            x if len(x) <= 90 else x[:87] + "..." for x in budget.skipped
        )
        message = note if message is None else f"{message}; {note}"
    # every offered schedule carries the simulator's evaluation of exactly its actions on its
    # problem (``Best.offer`` takes no other), so it is not simulated a second time here
    own = sched.problem if sched.problem is not None else problem
    final = stamped(
        Schedule.built(
            problem_hash=own.hash,
            generator="optpipe",
            params=params,
            actions=list(sched.actions),
            evaluation=sched.evaluation,
            problem=own,
        ),
        own,
    )
    first = top.incumbents[0].wall_time if top.incumbents else 0.0
    return SolveResult(
        schedule=final,
        makespan=makespan,
        lower_bound=bound,
        gap=gap,
        status=status,
        backend=used,
        solve_seconds=time.perf_counter() - t0,
        first_solution_seconds=first,
        incumbents=list(top.incumbents),
        message=message,
    )


@dataclass(frozen=True)
class _Args:
    backend: str
    gap_target: float
    seed: int
    workers: int | None
    stop: threading.Event | None
    deterministic_time: float | None
    use_baselines: bool
    lns: bool = True

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()


def _options(
    problem: Problem, chunkings: Sequence[tuple[int, str]] | None
) -> list[tuple[Chunking, Problem]]:
    """The chunkings to search and the problem of each (the problem's own first)."""
    todo = all_chunkings(problem) if chunkings is None else list(chunkings)
    if not todo:
        raise ValueError("chunkings must name at least one (num_chunks, placement)")
    out: dict[Chunking, Problem] = {}
    for v, pl in todo:
        pb = rechunk(problem, v, pl)
        ch = own_chunking(pb)
        out.setdefault(ch, pb)
    return list(out.items())


def _offer_candidate(problem: Problem, best: Best, cand: Schedule) -> None:
    """Offer a given schedule, simulated again only when its evaluation says it is better (so a
    stale evaluation never wins, and many candidates cost no simulation each)."""
    from ..schedule.baselines import BASELINE_NAMES

    ev = cand.evaluation
    if ev is not None and (not ev.feasible or ev.makespan is None or not best.better(ev)):
        return
    source = (
        f"baseline:{cand.generator}"
        if cand.generator in BASELINE_NAMES
        else f"candidate:{cand.generator}"
    )
    best.offer(cand.with_evaluation(evaluate(problem, cand)), source)


def _run_heuristics(
    problem: Problem,
    best: Best,
    budget: Budget,
    until: float,
    args: _Args,
    top: Best,
    skipped: list[str],
) -> list[tuple[float, ListRule]]:
    """The list rules (``heuristic_candidates``) until ``until``; the first schedule that fits
    (anywhere in the solve: ``top``) is always found. Returns (makespan, rule) of those that fit."""

    def keep_going() -> bool:
        return top.schedule is None or (time.perf_counter() < until and not args.stopped())

    rules = {f"heuristic:{r.name}": r for r in default_rules(problem)}
    starts: list[tuple[float, ListRule]] = []
    for source, sched in heuristic_candidates(
        problem,
        None,
        keep_going,
        skipped,
        budget.rule_seconds,
        have_one=lambda: top.schedule is not None,
    ):
        best.offer(sched, source)
        ev = sched.evaluation
        if source in rules and ev is not None and ev.feasible and ev.makespan is not None:
            starts.append((ev.makespan, rules[source]))
    return starts


def _screen(
    options: list[tuple[Chunking, Problem]],
    bests: dict[Chunking, Best],
    top: Best,
    budget: Budget,
    args: _Args,
) -> dict[Chunking, _Screened]:
    """Every chunking's list rules, then its baselines, in equal slots of ``SCREEN_SHARE`` of
    the limit (a slot's unused time goes to the next); the problem's own chunking first, so the
    first answer comes as fast as with one chunking."""
    out: dict[Chunking, _Screened] = {}
    start = time.perf_counter()
    until = budget.at(SCREEN_SHARE)
    k = len(options)
    for i, (ch, pb) in enumerate(options):
        scr = _Screened()
        out[ch] = scr
        now = time.perf_counter()
        slot_end = max(now, start + (until - start) * (i + 1) / k)
        rules_end = now + SCREEN_RULES_SHARE * (slot_end - now)
        skipped: list[str] = []
        scr.starts = _run_heuristics(pb, bests[ch], budget, rules_end, args, top, skipped)
        n_skips = len(budget.skipped)
        if args.use_baselines and not args.stopped():
            for name, sched in _baselines(
                pb,
                slot_end,
                budget,
                unfinished=scr.unfinished,
                interrupted=scr.interrupted,
            ):
                bests[ch].offer(sched, f"baseline:{name}")
        # one line per chunking (its pipeline, if it is the best, runs what is left)
        del budget.skipped[n_skips:]
        n_rules = sum(x.count(",") + 1 for x in skipped if x.startswith("heuristics not"))
        parts = ([f"{n_rules} list rule(s)"] if n_rules else []) + (
            [f"baseline(s) {', '.join(scr.unfinished)}"] if scr.unfinished else []
        )
        if parts:
            budget.skip(f"screening {describe(ch)}: " + " and ".join(parts))
    return out


def _pipeline(
    problem: Problem,
    best: Best,
    budget: Budget,
    args: _Args,
    screened: _Screened | None,
    top: Best,
) -> tuple[str, bool, str | None]:
    """The whole search on one chunking's problem: (backend used, proven optimal, message).

    Without ``screened``: heuristics, rule search, offload repair, baselines, bounds, periodic
    patterns, fusing, the backend (module doc). With it, its rules' results start the rule
    search and only its unfinished baselines run again."""
    stop = args.stop
    stopped = args.stopped
    gap_target = args.gap_target
    heur_until = budget.at(HEURISTIC_SHARE)

    def keep_going() -> bool:
        # the first schedule that fits is always found; after it, only within the share
        return top.schedule is None or (time.perf_counter() < heur_until and not stopped())

    if screened is None:
        with budget.phase("heuristics"):
            starts = _run_heuristics(problem, best, budget, heur_until, args, top, budget.skipped)
    else:
        starts = screened.starts

    def gap_open() -> bool:
        return not best.meets(gap_target)

    if starts and not stopped() and time.perf_counter() < heur_until and gap_open():
        # the rules' parameters tuned to this problem, before the offload repair (which can
        # take the rest of the share at 32x256x1); not once the bound proves the best optimal
        tried = default_rules(problem)
        with budget.phase("rule search"):
            for rule, sched in search_rules(
                problem, starts, lambda: keep_going() and gap_open(), tried=tried
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
    unfinished: list[str] = [] if screened is None else list(screened.unfinished)
    interrupted: list[str] = [] if screened is None else list(screened.interrupted)
    if screened is None and args.use_baselines and not stopped() and gap_open():
        # baselines are hints only: they run (and are stopped) within the first half, and not
        # once the bound proves the best schedule optimal (v-half alone took 11 s at 32x256x2)
        with budget.phase("baselines"):
            for name, sched in _baselines(
                problem,
                budget.at(BASELINE_SHARE),
                budget,
                unfinished=unfinished,
                interrupted=interrupted,
            ):
                best.offer(sched, f"baseline:{name}")
    if interrupted and not stopped() and gap_open():
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
        args.backend != "heuristic"
        and best.schedule is not None
        and not stopped()
        and gap_open()
        and periodic.applies(problem)
        and time.perf_counter() < budget.at(PERIODIC_SHARE)
    ):
        with budget.phase("periodic"):
            _run_periodic(problem, best, budget, args.seed, args.workers, stop)

    if best.schedule is not None and fusable(problem) and not stopped() and gap_open():
        # the rules and patterns run every backward split: fuse B, W pairs where that is faster
        with budget.phase("fusing"):
            until = min(budget.end, time.perf_counter() + FUSING_SHARE * budget.limit)
            source = best.source
            best.offer(fuse_where_faster(problem, best.schedule, until), f"fused:{source}")

    if args.lns and args.backend != "heuristic" and best.schedule is not None and gap_open():
        _run_lns(problem, best, budget, args)

    used, message = choose_backend(problem, args.backend, best, None)

    proven_optimal = False
    if (
        used != "heuristic"
        and budget.left() > 0
        and not stopped()
        and (best.schedule is None or best.makespan > best.bound * (1 + 1e-9))
    ):
        proven_optimal = run_backend(
            used,
            problem,
            best,
            budget,
            gap_target,
            args.seed,
            args.workers,
            stop,
            args.deterministic_time,
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
    return used, proven_optimal, message


def _run_lns(problem: Problem, best: Best, budget: Budget, args: _Args) -> None:
    """The large-neighbourhood search (``lns``) for ``LNS_SHARE`` of the time left, where CP-SAT's
    exact model is too large; each improvement is offered."""
    from . import lns
    from .cpsat import tight_model_size

    if (
        args.stopped()
        or best.schedule is None
        or tight_model_size(problem) <= backend.TIGHT_MODEL_MAX
    ):
        return
    with budget.phase("lns"):
        until = time.perf_counter() + LNS_SHARE * max(0.0, budget.left())
        source = best.source
        lns.improve(
            problem,
            best.schedule,
            deadline=until,
            on_better=lambda s: best.offer(s, f"lns:{source}"),
            seed=args.seed,
            workers=worker_count(args.workers),
            deterministic_time=args.deterministic_time,
            max_windows=None if args.deterministic_time is None else LNS_DETERMINISTIC_WINDOWS,
            stop=args.stop,
            lower_bound=best.bound,
        )


def _run_periodic(
    problem: Problem,
    best: Best,
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
        workers=worker_count(workers),
        seed=seed,
        stop=stop,
    ):
        starts, ends = periodic.unrolled(problem, tm, pat)
        source = f"periodic:K={pat.size},T={pat.period * tm.tick:g}"
        with budget.phase("extraction"):
            best.offer(schedule_from_ticks(problem, tm, starts, ends, source), source)
        if best.meets(0.0):
            return
