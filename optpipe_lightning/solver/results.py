"""What a solve returns and reports: incumbents, the result, and the infeasible-limit error."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..schedule.schedule import Schedule


@dataclass(frozen=True)
class Incumbent:
    """One improved solution, as the simulator measured it.

    ``wall_time`` is seconds since ``solve`` started, ``makespan`` the simulated makespan,
    ``bound`` the best proven lower bound at that moment (None when none is known), ``source``
    who found it (``"heuristic:<name>"``, ``"baseline:<name>"``, ``"periodic:K=<k>,T=<seconds>"``,
    ``"cpsat"``, ``"gurobi"``...).
    ``schedule`` is the improved schedule itself (simulator-evaluated) in what the callback
    receives; ``SolveResult.incumbents`` keeps only the numbers.
    """

    wall_time: float
    makespan: float
    bound: float | None
    source: str
    schedule: Schedule | None = field(default=None, repr=False, compare=False)


@dataclass
class SolveResult:
    """The best schedule found, its proven lower bound and how the search went."""

    schedule: Schedule
    makespan: float
    lower_bound: float
    gap: float
    status: str  # "optimal" | "feasible" | "heuristic"
    backend: str
    solve_seconds: float
    first_solution_seconds: float
    incumbents: list[Incumbent] = field(default_factory=list)
    message: str | None = None


class InfeasibleMemoryLimit(ValueError):
    """No schedule fits the memory limit, not even one that offloads everything it can."""

    def __init__(self, message: str, smallest_feasible_limit: float) -> None:
        super().__init__(message)
        self.smallest_feasible_limit = smallest_feasible_limit
