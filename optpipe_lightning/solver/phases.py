"""The search on one chunking's problem, phase after phase, each within its share of the limit.

Pipeline (``solve`` has checked the memory limit, a clear error below what any schedule can fit,
and offered the user's hint and candidates): run the offload-aware list schedulers, a local
search over their parameters from the best ones (``rule_search``), the offload repair and the
baselines (``candidates``; a baseline the caller gave as a candidate is not run again); the
search beyond the rules (``gis_search``: PipeOffload's unpublished group sizes with its copy
grid; ``final_groups``: unequal group sizes, no short last group; the unpublished sizes with the
excess-only offload; ``order_search``: its warm-up depth and W delay; ``warmup_fill``: the
warm-up's latency gaps filled with later forwards, the best and the best before the unequal
groups; then ``action_search``: a local search over the best schedule's action lists) for ``SEARCH_SHARE`` of
the time left (``SEARCH_SHARE_FAMILY`` on PipeOffload's family); where copies are as
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
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ..schedule.baselines import make_schedule
from ..schedule.chunking import Chunking, describe
from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from . import backend, periodic
from .backend import (
    STOP_RESERVE_MAX,
    STOP_RESERVE_SHARE,
    choose_backend,
    run_backend,
    schedule_from_ticks,
    worker_count,
)
from .candidates import baseline_schedules, heuristic_candidates
from .fusing import fuse_where_faster
from .incumbent import Best, Budget
from .list_rules import ListRule, default_rules
from .offload_repair import applicable as repair_applies
from .offload_repair import repaired_schedules
from .rule_search import search_rules
from .ticks import fusable, tick_model

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
# the search beyond the rules (``gis_search``, then ``action_search``) gets this share of the
# time left after the baselines; on PipeOffload's family (``gis_search.applies``) the larger
# share: there its steps are what beat the best baseline (issue 32: CP-SAT, the LNS and the rules
# improved on it by 0.002-0.03% on two of six problems)
SEARCH_SHARE = 0.4
# the rule search runs only where the best list rule is within this of the incumbent
RULE_SEARCH_REACH = 0.05
# (0.65 left the unequal final groups 1.9 s of the 5.4 s they need at 32 stages, while the LNS
# after it took 3.8 s without gain: h6144-s32k-p32-m64-25% at compare --time-limit 60)
SEARCH_SHARE_FAMILY = 0.85
# of the search's window, the order knobs (after the group sizes) end by this share: the warm-up
# fill or the unequal final groups after them are part of the best on 10 of bench_peer's 15
# problems (BENCHMARKS.md), the order knobs on none, and a first-come share let the knobs take them (compare --time-limit 60
# on h4096-s8k-p8-m32-50%: order knobs 7.7 s, final groups 0.66 s of the 3.4 s they need)
ORDER_SHARE = 0.3
# the unequal final groups (after the extra sizes' copy grids) end by this share of what is left
# of the search's window (``groups_deadline``)
GROUPS_SHARE = 0.5
# with a deterministic time (no wall clock decides), the candidates the action search may try
SEARCH_DETERMINISTIC_TRIES = 200
# with a deterministic time (no wall clock decides), the windows the search may take
LNS_DETERMINISTIC_WINDOWS = 32


@dataclass(frozen=True)
class SearchArgs:
    """The solve's options that the phases read."""

    backend: str
    gap_target: float
    seed: int
    workers: int | None
    stop: threading.Event | None
    deterministic_time: float | None
    use_baselines: bool
    lns: bool = True
    # baselines the caller computed already (given as candidates): never run again here
    given_baselines: frozenset[str] = frozenset()

    def stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()


@dataclass
class Screened:
    """What the screening of one chunking already ran (its pipeline does not run it again)."""

    starts: list[tuple[float, ListRule]] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)


def _run_heuristics(
    problem: Problem,
    best: Best,
    budget: Budget,
    until: float,
    args: SearchArgs,
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


def screen(
    options: list[tuple[Chunking, Problem]],
    bests: dict[Chunking, Best],
    top: Best,
    budget: Budget,
    args: SearchArgs,
) -> dict[Chunking, Screened]:
    """Every chunking's list rules, then its baselines, in equal slots of ``SCREEN_SHARE`` of
    the limit (a slot's unused time goes to the next); the problem's own chunking first, so the
    first answer comes as fast as with one chunking."""
    out: dict[Chunking, Screened] = {}
    start = time.perf_counter()
    until = budget.at(SCREEN_SHARE)
    k = len(options)
    for i, (ch, pb) in enumerate(options):
        scr = Screened()
        out[ch] = scr
        now = time.perf_counter()
        slot_end = max(now, start + (until - start) * (i + 1) / k)
        rules_end = now + SCREEN_RULES_SHARE * (slot_end - now)
        skipped: list[str] = []
        scr.starts = _run_heuristics(pb, bests[ch], budget, rules_end, args, top, skipped)
        n_skips = len(budget.skipped)
        if args.use_baselines and not args.stopped():
            for name, sched in baseline_schedules(
                pb,
                slot_end,
                budget,
                unfinished=scr.unfinished,
                interrupted=scr.interrupted,
                exclude=args.given_baselines,
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


def rules_far_behind(starts: list[tuple[float, ListRule]], incumbent: float) -> str | None:
    """Why the rule search is not worth its time (None where it is): the best list rule is more
    than ``RULE_SEARCH_REACH`` slower than the incumbent (a baseline given or made), so tuning
    the rules' parameters (their search gains 1-3%) cannot reach it, and the search beyond the
    rules gets the time instead (issue 32: 5.3-5.8 s of a 60 s compare at 32 stages)."""
    if not starts or incumbent <= 0 or incumbent == float("inf"):
        return None
    rule = min(m for m, _ in starts)
    if rule <= incumbent * (1 + RULE_SEARCH_REACH):
        return None
    return (
        f"rule search (the best list rule, {rule:.4g} s, is {rule / incumbent - 1:.0%} "
        f"slower than the best schedule, {incumbent:.4g} s)"
    )


def run_pipeline(
    problem: Problem,
    best: Best,
    budget: Budget,
    args: SearchArgs,
    screened: Screened | None,
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

    far = rules_far_behind(starts, best.makespan)
    if far is not None:
        budget.skip(far)
    if starts and far is None and not stopped() and time.perf_counter() < heur_until and gap_open():
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
            for name, sched in baseline_schedules(
                problem,
                budget.at(BASELINE_SHARE),
                budget,
                unfinished=unfinished,
                interrupted=interrupted,
                exclude=args.given_baselines,
            ):
                best.offer(sched, f"baseline:{name}")
    if interrupted and not stopped() and gap_open():
        # one stopped while running gets another try first: on a machine slower than the
        # shares assume, AdaOffload (the best answer where copies are slow, 2.6x better than
        # the list schedules at 32x256x2, 0.25p, 2x) can need more than its half
        unfinished = [n for n in unfinished if n not in interrupted]
        with budget.phase("baselines (second chance)"):
            for name, sched in baseline_schedules(
                problem,
                budget.at(SECOND_CHANCE_SHARE),
                budget,
                names=interrupted,
                unfinished=unfinished,
                exclude=args.given_baselines,
            ):
                best.offer(sched, f"baseline:{name}")

    if best.schedule is not None and not stopped() and gap_open():
        _run_search(problem, best, budget, args)

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
            for name, sched in baseline_schedules(
                problem, until, budget, names=unfinished, exclude=args.given_baselines
            ):
                best.offer(sched, f"baseline:{name}")
    return used, proven_optimal, message


def search_deadlines(now: float, left: float, family: bool) -> tuple[float, float]:
    """(end of the order knobs, end of the whole search) for a search starting
    at ``now`` with ``left`` seconds of the solve left; ``family``: PipeOffload's family
    (``SEARCH_SHARE_FAMILY``, else ``SEARCH_SHARE``)."""
    window = (SEARCH_SHARE_FAMILY if family else SEARCH_SHARE) * max(0.0, left)
    return now + ORDER_SHARE * window, now + window


def groups_deadline(now: float, until: float) -> float:
    """The end of the unequal final groups for a step starting at ``now`` in a search ending at
    ``until``: ``GROUPS_SHARE`` of what is left, the rest for the excess-only offload, the warm-up
    fill and the action search (at 32 stages every order fitted takes 0.7 s, and where none fits,
    h8192-s8k-p32-m64-25%, the 28 faster than the incumbent would take 20 s)."""
    return now + GROUPS_SHARE * max(0.0, until - now)


def _run_search(problem: Problem, best: Best, budget: Budget, args: SearchArgs) -> None:
    """PipeOffload's family beyond its published group sizes (``gis_search``: the copy grid of
    each extra size), then unequal group sizes (``final_groups``: no short last group, within
    ``GROUPS_SHARE`` of what is left: ``groups_deadline``), then the extra sizes with the
    excess-only offload and the other order knobs (``order_search``: warm-up depth, W delay,
    within ``ORDER_SHARE`` of the window), then the warm-up's latency gaps filled with later
    forwards (``warmup_fill``: the best, then the unequal groups' best if that is another), then
    the local search over the best schedule's action lists (``action_search``), for
    ``SEARCH_SHARE`` of the time left (``SEARCH_SHARE_FAMILY`` on PipeOffload's family:
    ``search_deadlines``); each improvement is offered. The unequal groups come before the
    steps that seldom pay (bench_peer's h6144-s32k-p32-m64-25%: 163.005 against 169.59 for
    pipeoffload, where the excess-only offload gave 169.411 and the knobs nothing)."""
    from . import action_search, final_groups, gis_search, order_search, warmup_fill

    family = gis_search.applies(problem)
    orders_until, until = search_deadlines(time.perf_counter(), budget.left(), family)
    det = args.deterministic_time is not None
    grouped: Schedule | None = None
    plain: tuple[Schedule, str] | None = None  # the best before the unequal groups
    if family:
        with budget.phase("search: group sizes"):
            found = gis_search.bases(problem, until) or []
            for sched in gis_search.grid_members(problem, found, best.makespan, until):
                best.offer(sched, f"search:g={sched.params['group_size']}")
        if not args.stopped() and time.perf_counter() < until:
            with budget.phase("search: final groups"):
                if best.schedule is not None:
                    plain = (best.schedule, best.source)
                groups_until = groups_deadline(time.perf_counter(), until)
                for sched in final_groups.members(
                    problem,
                    best.makespan,
                    None if det else groups_until,
                    max_tries=SEARCH_DETERMINISTIC_TRIES if det else None,
                ):
                    grouped = sched
                if grouped is not None:
                    best.offer(grouped, "search:groups")
        with budget.phase("search: group sizes"):
            for sched in gis_search.excess_members(problem, found, best.makespan, until):
                best.offer(sched, f"search:g={sched.params['group_size']}")
        with budget.phase("search: order knobs"):
            # deterministic: a count of simulations, not the clock, ends it
            for sched in order_search.members(
                problem,
                best.makespan,
                None if det else orders_until,
                max_tries=SEARCH_DETERMINISTIC_TRIES if det else None,
            ):
                best.offer(sched, "search:order")
    if args.stopped() or best.schedule is None or time.perf_counter() >= until:
        return

    def fill(sched: Schedule, source: str) -> None:
        found = warmup_fill.best_fill(
            problem,
            sched.actions,
            deadline=None if det else until,
            max_tries=SEARCH_DETERMINISTIC_TRIES if det else None,
        )
        if found is not None:
            rows, _res, label = found
            best.offer(
                make_schedule(problem, "optpipe", rows, {"from": source, "fill": label}),
                f"search:fill:{source}",
            )

    with budget.phase("search: warm-up fill"):
        # the best filled, then the other of the unequal groups' best and the best before them
        # (either may fill better: h6144-s16k-p16-m32-50%, groups 28.62 filled 28.478, the
        # pipeoffload baseline 28.68 filled 28.462)
        other: tuple[Schedule, str] | None = None
        if grouped is not None and best.source != "search:groups":
            other = (grouped, "search:groups")
        elif grouped is not None and plain is not None:
            other = plain
        fill(best.schedule, best.source)
        if other is not None and time.perf_counter() < until:
            fill(*other)
    if args.stopped() or best.schedule is None or time.perf_counter() >= until:
        return
    source = best.source
    with budget.phase("search: actions"):
        _rows, _res, tried = action_search.improve(
            problem,
            best.schedule,
            deadline=until,
            on_better=lambda rows, res: best.offer(
                make_schedule(problem, "optpipe", rows, {"from": source}), f"search:{source}"
            ),
            seed=args.seed,
            stop=args.stop,
            max_tries=None if args.deterministic_time is None else SEARCH_DETERMINISTIC_TRIES,
        )
    budget.count("search: actions", tried)


def _run_lns(problem: Problem, best: Best, budget: Budget, args: SearchArgs) -> None:
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
