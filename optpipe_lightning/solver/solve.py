"""``solve``: heuristics first (an answer at once), then an exact backend improves and proves.

The phases and their deadlines are ``phases``; where the candidates come from, ``candidates``.
In short: heuristics, baselines and the searches that improve on them give the first incumbents,
then CP-SAT (default), Gurobi (when its licence allows) or HiGHS searches with the best as a
hint; every solution is re-evaluated by the one simulator, and ``solve`` returns within
``time_limit`` plus about one simulation of the problem (``phases`` says how).

Chunks as a decision: with ``layers_per_stage`` (or ``chunkings=``) every chunking's list rules
and baselines are screened first (``phases.SCREEN_SHARE``), then every phase runs on the best;
given ``candidates`` are incumbents from the start, so the result is never slower than any.
Among equally fast schedules the one with the lowest peak share of the limit wins
(``incumbent.Best``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..schedule.bounds import lower_bound
from ..schedule.chunking import Chunking, own_chunking, rechunk, stamped
from ..schedule.chunking import chunkings as all_chunkings
from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from ..schedule.simulator import evaluate
from .backend import backend_bounds_hold as backend_bounds_hold  # (re-exported)
from .candidates import offer_candidate
from .feasibility import check_memory_limit, infeasible_error, smallest_feasible_limit
from .incumbent import Best, Budget
from .offload_trim import TRIM_TRIES, trim_offloads
from .phases import SearchArgs, run_pipeline, screen
from .results import Incumbent, InfeasibleMemoryLimit, SolveResult
from .robust import ROBUST_SHARE, robust_pick

BACKENDS = ("auto", "cpsat", "gurobi", "highs", "heuristic")


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
    robust: bool = True,
    memory_margin: str | float | None = None,
) -> SolveResult:
    """The fastest schedule found within ``time_limit`` that fits the memory limit.

    Returns within ``time_limit`` plus about one simulation of the problem (``phases`` says
    how), except that the first schedule that fits is always found and kept. Raises
    ``InfeasibleMemoryLimit`` when no schedule fits (naming the smallest feasible limit) and
    ``ValueError`` for an unknown backend or a chunking the problem does not allow.
    ``deterministic_time`` (CP-SAT's deterministic time limit) makes runs with ``workers=1``
    reproducible in tests.

    ``candidates``: schedules (evaluated, each for the problem or a re-chunking of it) that are
    candidates of the search from the start, so the result is never slower than any of them
    (``compare`` passes its baseline rows); a baseline given so (its ``generator`` a baseline
    name, for any chunking) is not computed again. ``chunkings``: the (chunk count, placement) pairs to
    search; by default every one the problem's ``layers_per_stage`` allows (only its own without
    it). The result's schedule is for the chunking that won: it embeds that problem and records
    its ``num_chunks`` and ``placement``. ``lns``: run the large-neighbourhood search where
    CP-SAT's exact model is too large (``phases.LNS_SHARE``). ``robust``: among the schedules
    within 0.5% of the best makespan return the one that holds up best under ±20% op and copy
    time noise (``robust``: the search keeps ``robust.ROBUST_SHARE`` of the limit for it).
    ``memory_margin`` (``schedule/margin.py``): solve for the limit less the margin; the
    schedule returned is for ``problem`` itself and carries the reduced limit as its
    ``memory_budget`` (``margin.budgeted_for``), so it keeps the margin when simulated or run
    at the real limit (candidates and the hint are then for the reduced problem).
    """
    if memory_margin is not None:
        from ..schedule.margin import apply_memory_margin, budgeted_for

        reduced = apply_memory_margin(problem, memory_margin)
        result = solve(
            reduced,
            backend=backend,
            time_limit=time_limit,
            gap_target=gap_target,
            seed=seed,
            workers=workers,
            hint=hint,
            on_incumbent=on_incumbent,
            stop=stop,
            deterministic_time=deterministic_time,
            use_baselines=use_baselines,
            candidates=candidates,
            chunkings=chunkings,
            lns=lns,
            robust=robust,
        )
        return replace(result, schedule=budgeted_for(result.schedule, problem))
    if backend not in BACKENDS:
        raise ValueError(f"unknown solver backend {backend!r}; one of {', '.join(BACKENDS)}")
    if time_limit < 0:
        raise ValueError(f"time_limit must be >= 0 seconds, got {time_limit}")
    t0 = time.perf_counter()
    # the robust pick gets the last ROBUST_SHARE of the limit; the search the rest
    budget = Budget(t0, time_limit * (1 - ROBUST_SHARE) if robust else time_limit)
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
            offer_candidate(problems[ch], bests[ch], cand)
    if hint is not None:
        if hint.problem_hash not in by_hash:
            note = "the hint was made for another problem and was ignored"
            message = note if message is None else f"{message}; {note}"
        else:
            ch = by_hash[hint.problem_hash]
            with budget.phase("hint"):
                bests[ch].offer(hint.with_evaluation(evaluate(problems[ch], hint)), "hint")

    from ..schedule.baselines import BASELINE_NAMES

    # a baseline given as a candidate (compare's rows) is not computed again
    done = frozenset(c.generator for c in candidates if c.generator in BASELINE_NAMES)
    args = SearchArgs(
        backend, gap_target, seed, workers, stop, deterministic_time, use_baselines, lns, done
    )
    proven: set[Chunking] = set()
    if len(feasible) == 1:
        ch, pb = feasible[0]
        used, ok, said = run_pipeline(pb, bests[ch], budget, args, None, top)
    else:
        with budget.phase("screening"):
            screened = screen(feasible, bests, top, budget, args)
        ch, pb = min(feasible, key=lambda x: (bests[x[0]].makespan, bests[x[0]].peak))
        used, ok, said = run_pipeline(pb, bests[ch], budget.rest(), args, screened[ch], top)
    if ok:
        proven.add(ch)
    if said is not None:
        message = said if message is None else f"{message}; {said}"

    if top.schedule is None:
        raise infeasible_error(problem, smallest_feasible_limit(problem)[1])
    robustness: dict[str, object] | None = None
    if robust and not (stop is not None and stop.is_set()):
        # never slower than a candidate given (compare's rows: DESIGN's contract), noise or not
        ceiling = min(
            (
                c.evaluation.makespan
                for c in given
                if c.evaluation is not None
                and c.evaluation.feasible
                and c.evaluation.makespan is not None
            ),
            default=float("inf"),
        )
        near = [
            s
            for s in top.near
            if s.evaluation is not None
            and s.evaluation.makespan is not None
            and s.evaluation.makespan <= ceiling * (1 + 1e-9)
        ]
        with budget.phase("robust pick"):
            chosen, robustness = robust_pick(top.schedule, near, t0 + time_limit, seed)
        if chosen is not top.schedule:
            assert chosen.evaluation is not None and chosen.evaluation.makespan is not None
            top.schedule, top.makespan = chosen, chosen.evaluation.makespan
            top.source = f"robust:{top.source}"
    trimmed = 0
    if top.schedule is not None and not (stop is not None and stop.is_set()):
        with budget.phase("offload trim"):
            top.schedule, trimmed = trim_offloads(
                top.schedule, t0 + time_limit, max_tries=TRIM_TRIES
            )
        # fewer copies may also wait less: the answer is then faster than the search left it
        ev = top.schedule.evaluation
        if trimmed and ev is not None and ev.makespan is not None:
            top.makespan = ev.makespan
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
    if budget.candidates:
        params["candidates"] = budget.candidate_rates()
    if robustness is not None:
        params["robust"] = robustness
    if trimmed:
        params["trimmed_offloads"] = trimmed
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
        note = f"time limit {round(time_limit, 2):g} s: skipped " + "; ".join(
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
