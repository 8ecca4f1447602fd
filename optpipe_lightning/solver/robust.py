"""Robust by default (issue 32): among the schedules within ``NEAR_SHARE`` of the best makespan,
the solve returns the one that holds up best under noise (``schedule.noise``: ±20% op and copy
times, seeded), not the nominally fastest one whatever its fragility.

``incumbent.Best`` keeps up to ``NEAR_MAX`` schedules within ``NEAR_SHARE`` of its best (the best
included). At the end of a solve each is timed on ``DRAWS`` noisy copies of its problem (the same
draws for every schedule of one chunking); the best one stays unless another has fewer limit
breaks, or as many and a lower mean makespan (then a lower worst case). The evaluation stops at its
deadline (the solve keeps ``ROBUST_SHARE`` of its limit for it); the schedules not evaluated by
then are not picked.
"""

from __future__ import annotations

import time

from ..schedule.noise import DEFAULT_SPREAD, NoiseReport, noise_draws, noise_evaluation
from ..schedule.problem import Problem
from ..schedule.schedule import Schedule

NEAR_SHARE = 0.005
NEAR_MAX = 6
DRAWS = 8
ROBUST_SHARE = 0.05


def robust_pick(
    best: Schedule,
    near: list[Schedule],
    deadline: float | None,
    seed: int = 0,
    draws: int = DRAWS,
    spread: float = DEFAULT_SPREAD,
) -> tuple[Schedule, dict[str, object] | None]:
    """The schedule to return among ``best`` and ``near`` (module doc) and a summary of the
    evaluation (None when there was nothing to choose or no time to choose)."""
    others = [s for s in near if s is not best and s.problem is not None]
    if not others or best.problem is None:
        return best, None
    cache: dict[str, list[Problem]] = {}

    def report(s: Schedule) -> NoiseReport:
        pb = s.problem
        assert pb is not None
        if pb.hash not in cache:
            cache[pb.hash] = noise_draws(pb, draws, spread, seed)
        return noise_evaluation(pb, s, problems=cache[pb.hash])

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    if late():
        return best, None
    try:
        chosen, chosen_rep = best, report(best)
    except ValueError:  # no valid noisy copy of this problem: nothing to judge by
        return best, None
    best_rep = chosen_rep
    looked = 1
    for s in others:
        if late():
            break
        rep = report(s)
        looked += 1
        a, b = rep.score(), chosen_rep.score()
        if a[0] < b[0] or (a[0] == b[0] and a[1:] < b[1:] and a[1] < b[1] * (1 - 1e-9)):
            chosen, chosen_rep = s, rep
    summary: dict[str, object] = {
        "draws": draws,
        "spread": spread,
        "schedules_compared": looked,
        "chosen_mean": chosen_rep.mean,
        "chosen_worst": chosen_rep.worst,
        "chosen_breaks": chosen_rep.breaks,
        "chosen_makespan": _nominal(chosen),
        "fastest_makespan": _nominal(best),
        "fastest_mean": best_rep.mean,
        "fastest_worst": best_rep.worst,
        "fastest_breaks": best_rep.breaks,
        "switched": chosen is not best,
    }
    return chosen, summary


def _nominal(s: Schedule) -> float | None:
    """A schedule's makespan without noise (as evaluated), for the summary."""
    return None if s.evaluation is None else s.evaluation.makespan
