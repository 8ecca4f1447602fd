"""One solver run from the command line: the live progress display on a terminal, and the run
and its schedule recorded in a profiles database (``--db``), closed as failed or interrupted
when the solve does not finish.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from ..schedule import Problem, Schedule
from .output import err, out


def run_solver(
    problem: Problem,
    backend: str,
    time_limit: float,
    seed: int,
    *,
    quiet: bool,
    db_url: str | None,
    gap: float = 0.0,
    candidates: list[Schedule] | None = None,
) -> Any:
    from ..solver import solve

    callbacks: list[Callable[[Any], None]] = []
    recorder = None
    run_id = None
    db = None
    if db_url is not None:
        from ..profiles_db import open_database
        from ..profiles_db import repository as repo

        db = open_database(db_url)
        with db.session() as s:
            repo.store_problem(s, problem)
            run_id = repo.start_solver_run(
                s, problem.hash, backend, {"time_limit": time_limit, "seed": seed, "gap": gap}
            )
        recorder = repo.SolverEventRecorder(db, run_id)
        callbacks.append(recorder)

    def on_incumbent(inc: Any) -> None:
        for cb in callbacks:
            cb(inc)

    progress: AbstractContextManager[Any] = nullcontext()
    if not quiet and out.is_terminal:
        from ..solver.progress import RichSolveProgress

        progress = RichSolveProgress(problem, time_limit)
    try:
        with progress as display:
            if display is not None:
                callbacks.append(display)
            result = solve(
                problem,
                backend=backend,
                time_limit=time_limit,
                seed=seed,
                gap_target=gap,
                on_incumbent=on_incumbent,
                # compare's baselines (every chunking) are candidates: they need not run again
                candidates=candidates or (),
                use_baselines=candidates is None,
            )
    except BaseException as e:  # the run ends here: never leave it "running"
        if db is not None and recorder is not None and run_id is not None:
            end_run(
                db,
                recorder,
                run_id,
                "interrupted" if isinstance(e, KeyboardInterrupt) else "failed",
            )
        raise
    if result.message and not quiet:
        err.print(f"optpipe: note: {result.message}", markup=False)
    if db is not None and recorder is not None and run_id is not None:
        from ..profiles_db import repository as repo

        recorder.close()
        with db.session() as s:
            # the schedule embeds the problem it was built for (a re-chunking of this one)
            sid = repo.store_schedule(s, result.schedule, source="solver")
            repo.finish_solver_run(
                s,
                run_id,
                status=result.status,
                makespan=result.makespan,
                lower_bound=result.lower_bound,
                schedule_id=sid,
            )
    return result


def end_run(db: Any, recorder: Any, run_id: int, status: str) -> None:
    """Close a run the solve could not finish (best effort: the solve's error is what counts)."""
    from ..profiles_db import repository as repo

    recorder.close()
    try:
        with db.session() as s:
            repo.finish_solver_run(
                s, run_id, status=status, makespan=None, lower_bound=None, schedule_id=None
            )
    except Exception as e:
        err.print(f"optpipe: note: could not mark solver run {run_id} {status}: {e}", markup=False)
