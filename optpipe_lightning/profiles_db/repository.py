"""Repository functions: what the solver, the strategy, the inspector and the CLI store and read.

Every function takes a ``Session`` (from ``Database.session()``, which commits on success), so a
caller groups calls into one short transaction. Problems, schedules and profiles are stored as
their validated JSON (never pickle) and validated again when read.

This module is the one place callers import (``from optpipe_lightning.profiles_db import
repository as repo``); it re-exports the functions of the modules that hold them:

- ``schedules``: problems and their schedules (``store_schedule``, ``best_schedule``, ...);
- ``profiles``: measured profiles and the rules for reusing one (``find_profile``);
- ``solver_runs``: solver runs and their incumbent events;
- ``training_runs``: training runs, their steps and schedule switches;
- ``training_log``: what a training run records beyond step times (metrics, calibrations);
- ``prune``: deleting what no lookup returns any more.
"""

from __future__ import annotations

from .profiles import find_profile, get_profile, list_profiles, store_profile
from .prune import prune
from .recorder import SolverEventRecorder
from .schedules import (
    best_schedule,
    get_problem,
    get_schedule,
    list_problems,
    list_schedules,
    store_problem,
    store_schedule,
)
from .solver_runs import (
    finish_solver_run,
    get_solver_run,
    list_solver_runs,
    run_rows,
    set_solver_run_rows,
    solver_events,
    start_solver_run,
)
from .training_log import (
    record_calibration,
    record_memory_limit,
    record_metrics,
    training_calibrations,
    training_metrics,
    training_run_detail,
)
from .training_runs import (
    finish_training_run,
    list_training_runs,
    record_step,
    record_switch,
    schedule_switches,
    start_training_run,
    training_steps,
)

__all__ = [
    "SolverEventRecorder",
    "best_schedule",
    "find_profile",
    "finish_solver_run",
    "finish_training_run",
    "get_problem",
    "get_profile",
    "get_schedule",
    "get_solver_run",
    "list_problems",
    "list_profiles",
    "list_schedules",
    "list_solver_runs",
    "list_training_runs",
    "prune",
    "record_calibration",
    "record_memory_limit",
    "record_metrics",
    "record_step",
    "record_switch",
    "run_rows",
    "schedule_switches",
    "set_solver_run_rows",
    "solver_events",
    "start_solver_run",
    "start_training_run",
    "store_problem",
    "store_profile",
    "store_schedule",
    "training_calibrations",
    "training_metrics",
    "training_run_detail",
    "training_steps",
]
