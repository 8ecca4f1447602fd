"""Which schedule a fit runs on a problem, as its options ask (global rank 0 chooses it;
``Scheduler.adopt`` broadcasts it and switches every rank to it).

A schedule source the user gave decides; ``"optimal"`` with online re-solve starts on the best
baseline (the background solver catches up, ``resolve.py``); else the named schedule or the
solver over every chunking the pipeline can run (``planner.choose_schedule``).
"""

from __future__ import annotations

from ...schedule import Problem, Schedule
from ..planning.options import PipelineOptions
from ..planning.partition import runnable_chunkings
from ..planning.planner import best_baseline, choose_schedule
from .pipeline_problem import chunking


def chosen_schedule(options: PipelineOptions, problem: Problem) -> Schedule:
    """The schedule for ``problem``; it carries the problem it runs on: ``problem`` itself, or
    the schedule's own where it was made for another chunking of this pipeline."""
    o = options
    if o.schedule_source is not None:
        sched = o.schedule_source(problem)
    elif o.schedule == "optimal" and o.online_resolve:
        # with online re-solve the best baseline starts now, the solver catches up
        sched = best_baseline(problem)
    else:
        sched = choose_schedule(
            o.schedule,
            problem,
            o.solver_backend,
            o.solver_time_limit,
            chunkings=runnable_chunkings(problem),
        )
    if sched.problem is None or chunking(sched.problem) == chunking(problem):
        sched = sched.model_copy(update={"problem": problem})
    # else: a schedule for another chunking of this pipeline, on its own problem
    return sched
