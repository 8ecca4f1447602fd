"""Problems, schedules, the simulator, baseline schedules and lower bounds.

Depends on numpy and pydantic only; nothing else in the package is imported from here.
"""

from .problem import PROBLEM_FORMAT, OffloadSpec, Problem
from .schedule import SCHEDULE_FORMAT, Action, Evaluation, Schedule, Violation
from .simulator import ScheduleMismatchError, SimResult, evaluate, evaluated, simulate

__all__ = [
    "PROBLEM_FORMAT",
    "SCHEDULE_FORMAT",
    "Action",
    "Evaluation",
    "OffloadSpec",
    "Problem",
    "Schedule",
    "ScheduleMismatchError",
    "SimResult",
    "Violation",
    "evaluate",
    "evaluated",
    "simulate",
]
