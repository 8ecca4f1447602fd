"""Where the search's candidate schedules come from: the list rules in order, the baselines
under a cooperative deadline, and schedules the caller gives. Each is offered to an incumbent
(``incumbent.Best``); the phases (``phases``) decide when each source runs and until when.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from ..schedule.problem import Problem
from ..schedule.schedule import Schedule
from ..schedule.simulator import evaluate
from .feasibility import minimal_memory_schedule
from .heuristics import run_rule
from .incumbent import Best, Budget
from .list_rules import default_rules


def baseline_schedules(
    problem: Problem,
    deadline: float | None = None,
    budget: Budget | None = None,
    names: list[str] | None = None,
    unfinished: list[str] | None = None,
    interrupted: list[str] | None = None,
    exclude: frozenset[str] = frozenset(),
) -> list[tuple[str, Schedule]]:
    """Every baseline that exists yet and applies (extra hints and fallbacks, never needed).

    With a ``deadline`` (``time.perf_counter()`` value) no baseline starts after it and a
    running one is stopped there (cooperatively, within about one simulation) and dropped; the
    ``budget`` then lists the ones skipped or stopped, ``unfinished`` gets their names and
    ``interrupted`` the names of those stopped while running.
    ``names`` runs only those baselines; ``exclude`` names baselines never run here (the
    caller computed them already: no baseline is computed twice in one command).
    """
    try:
        from ..schedule.baselines import BASELINE_NAMES, generate
        from ..schedule.baselines._deadline import DeadlineExceeded, deadline_at
    except (ImportError, AttributeError):
        return []
    if names is not None:
        names = [n for n in names if n in BASELINE_NAMES]
    else:
        names = baseline_order(problem)
    names = [n for n in names if n not in exclude]
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


STRONGEST_BASELINES: tuple[str, ...] = ("pipeoffload", "adaoffload")
"""The baselines that are the best answer on offload problems under a memory limit (issue 32:
every winning row of the PipeOffload family was one of them): run first, with a longer share."""


def memory_bound(problem: Problem) -> bool:
    """Whether the problem may offload under a memory limit (where the strongest baselines and
    the memory-aware ones help most)."""
    return problem.offload is not None and any(x is not None for x in problem.memory_limits())


CLOSED_FORM_BASELINES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2")
"""Baselines that are one fixed order and one simulation (0.01-0.05 s at 16 x 32 x 4)."""


def baseline_order(problem: Problem) -> list[str]:
    """Every baseline's name in the order to compute them: under a memory limit with offload,
    the closed-form orders (one simulation each), then the strongest (``STRONGEST_BASELINES``:
    seconds each at 16 stages), then the other memory-aware ones (where the list schedulers
    struggle, they help most), then the rest; on a busy machine the later ones may not finish."""
    from ..schedule.baselines import BASELINE_NAMES

    names = list(BASELINE_NAMES)
    if not memory_bound(problem):
        return names
    first = [
        n for n in (*CLOSED_FORM_BASELINES, *STRONGEST_BASELINES, "zb-auto", "v-min") if n in names
    ]
    return first + [n for n in names if n not in first]


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


def offer_candidate(problem: Problem, best: Best, cand: Schedule) -> None:
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
