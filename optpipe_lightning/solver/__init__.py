"""The schedule optimiser: offload-aware heuristics, CP-SAT (default), Gurobi and HiGHS MILPs.

``solve(problem)`` answers at once with the best heuristic schedule and improves it while it
runs; every improvement goes to ``on_incumbent``. Results are always re-evaluated by the one
simulator (``optpipe_lightning.schedule.simulator``).
"""

from ..schedule.bounds import lower_bound
from .bounds import memory_need_lower_bound
from .heuristics import heuristic_schedules
from .licence import gurobi_license_status
from .results import Incumbent, InfeasibleMemoryLimit, SolveResult
from .solve import BACKENDS, solve

__all__ = [
    "BACKENDS",
    "Incumbent",
    "InfeasibleMemoryLimit",
    "SolveResult",
    "gurobi_license_status",
    "heuristic_schedules",
    "lower_bound",
    "memory_need_lower_bound",
    "solve",
]
