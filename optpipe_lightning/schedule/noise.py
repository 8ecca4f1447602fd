"""A seeded noise evaluation: how a schedule's makespan and peak hold up when ops and copies take
longer or shorter than the problem says (issue 32: robust by default).

Each draw times the schedule's own action lists, unchanged, on a copy of the problem whose
``t_f``, ``t_b``, ``t_w`` (and ``t_bw`` when given) are each multiplied by a factor drawn
uniformly from ``[1 - spread, 1 + spread]`` per (stage, chunk), and whose copy bandwidths are each
divided by one such factor per direction (the problem's costs are per stage and chunk, so the
noise is too: every microbatch of a (stage, chunk) moves together). Point-to-point times are kept.
The draws depend only on the seed and the problem's shape, so two schedules of one problem
evaluated with one seed meet the same draws (common random numbers: their difference is the
schedules', not the luck's). A draw in which the schedule does not fit the memory limit (or
cannot run) is a limit break.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .margin import peak_share
from .problem import Problem
from .ranges import MAX_BANDWIDTH, MAX_SECONDS, MIN_SECONDS
from .schedule import Action, Schedule
from .simulator import evaluate

DEFAULT_SPREAD = 0.2


@dataclass(frozen=True)
class NoiseReport:
    """The makespan and peak share of the limit in every draw (None: the draw broke the limit or
    could not run), and the number of such breaks."""

    makespans: list[float | None]
    peak_shares: list[float]
    breaks: int

    @property
    def mean(self) -> float:
        """Mean makespan over the draws that fit (inf when none did)."""
        ok = [x for x in self.makespans if x is not None]
        return statistics.fmean(ok) if ok else float("inf")

    @property
    def worst(self) -> float:
        """Largest makespan over the draws that fit (inf when none did)."""
        ok = [x for x in self.makespans if x is not None]
        return max(ok) if ok else float("inf")

    def score(self) -> tuple[int, float, float]:
        """Fewer breaks first, then the lower mean, then the lower worst case."""
        return (self.breaks, self.mean, self.worst)


def noisy_problem(problem: Problem, rng: np.random.Generator, spread: float) -> Problem:
    """One draw of ``problem`` with its op and copy times scaled (module doc)."""
    if not 0 <= spread < 1:
        raise ValueError(f"spread must be in [0, 1), got {spread}")
    shape = (problem.num_stages, problem.num_chunks)

    def scaled(name: str) -> list[list[float]]:
        factor = rng.uniform(1 - spread, 1 + spread, size=shape)
        cost = problem.cost(name)
        # a draw stays a valid problem: times within the accepted range (0 stays 0)
        noisy = np.where(cost > 0, np.clip(cost * factor, MIN_SECONDS, MAX_SECONDS), cost)
        return noisy.tolist()

    changes: dict[str, object] = {n: scaled(n) for n in ("t_f", "t_b", "t_w")}
    if problem.t_bw is not None:
        changes["t_bw"] = scaled("t_bw")
    if problem.offload is not None:
        d2h, h2d = rng.uniform(1 - spread, 1 + spread, size=2)
        changes["offload"] = {
            **problem.offload.model_dump(),
            "d2h_bandwidth": min(problem.offload.d2h_bandwidth / float(d2h), MAX_BANDWIDTH),
            "h2d_bandwidth": min(problem.offload.h2d_bandwidth / float(h2d), MAX_BANDWIDTH),
        }
    return problem.with_changes(**changes)


def noise_draws(problem: Problem, draws: int, spread: float, seed: int) -> list[Problem]:
    """The ``draws`` noisy copies of ``problem`` a seed gives (the same for every schedule)."""
    rng = np.random.default_rng(seed)
    return [noisy_problem(problem, rng, spread) for _ in range(draws)]


def noise_evaluation(
    problem: Problem,
    schedule: Schedule | Sequence[Sequence[Action]],
    *,
    draws: int = 20,
    spread: float = DEFAULT_SPREAD,
    seed: int = 0,
    problems: Sequence[Problem] | None = None,
) -> NoiseReport:
    """The schedule timed on ``draws`` noisy copies of ``problem`` (module doc); ``problems``:
    draws made already (``noise_draws``), to share them between schedules without redrawing."""
    rows = schedule.actions if isinstance(schedule, Schedule) else schedule
    todo = list(problems) if problems is not None else noise_draws(problem, draws, spread, seed)
    makespans: list[float | None] = []
    shares: list[float] = []
    breaks = 0
    for pb in todo:
        ev = evaluate(pb, rows)
        if not ev.feasible or ev.makespan is None:
            breaks += 1
            makespans.append(None)
        else:
            makespans.append(ev.makespan)
        if ev.peak_memory:
            shares.append(peak_share(ev))
    return NoiseReport(makespans, shares, breaks)
