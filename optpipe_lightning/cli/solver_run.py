"""One solver run from the command line: the live progress display on a terminal, and the run
and its schedule recorded in a profiles database (``--db``), closed as failed or interrupted
when the solve does not finish.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from ..schedule import Problem, Schedule
from .command_errors import one_line
from .interrupt import LatestIncumbent, Outcome, best_found, run_stoppable, signals_stop
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
    """The solve of ``problem``; on SIGINT/SIGTERM the best schedule found so far, simulator
    checked, with status ``interrupted`` (``cli.interrupt``); the caller exits with 130 then.
    ``KeyboardInterrupt`` when nothing that fits was found before the signal."""
    from ..solver import solve

    started = time.perf_counter()
    callbacks: list[Callable[[Any], None]] = []
    latest = LatestIncumbent()
    callbacks.append(latest)
    recorder = None
    keeper = None
    run_id = None
    db = None
    if db_url is not None:
        from ..profiles_db import open_database
        from ..profiles_db import repository as repo
        from ..profiles_db.incumbents import IncumbentKeeper

        db = open_database(db_url)
        with db.session() as s:
            repo.store_problem(s, problem)
            run_id = repo.start_solver_run(
                s, problem.hash, backend, {"time_limit": time_limit, "seed": seed, "gap": gap}
            )
        recorder = repo.SolverEventRecorder(db, run_id)
        keeper = IncumbentKeeper(db, run_id)  # a kill -9 leaves the best schedule behind
        callbacks += [recorder, keeper]

    def on_incumbent(inc: Any) -> None:
        for cb in callbacks:
            cb(inc)

    stop = threading.Event()
    progress: AbstractContextManager[Any] = nullcontext()
    if not quiet and out.is_terminal:
        from ..solver.progress import RichSolveProgress

        progress = RichSolveProgress(problem, time_limit)
    try:
        with signals_stop(stop) as caught, progress as display:
            if display is not None:
                callbacks.append(display)
            outcome = run_stoppable(
                lambda: solve(
                    problem,
                    backend=backend,
                    time_limit=time_limit,
                    seed=seed,
                    gap_target=gap,
                    on_incumbent=on_incumbent,
                    # compare's baselines (every chunking) are candidates: no need to run again
                    candidates=candidates or (),
                    use_baselines=candidates is None,
                    stop=stop,
                ),
                caught,
            )
        if outcome.error is not None and caught.signum is None:
            raise outcome.error
        if caught.signum is None:
            result = outcome.value
            assert result is not None  # (the search returned: it raises or gives a result)
        else:
            result = _interrupted_result(problem, outcome, latest, backend, started, time_limit)
    except BaseException as e:  # the run ends here: never leave it "running"
        if db is not None and recorder is not None and keeper is not None and run_id is not None:
            keeper.close()
            end_run(
                db,
                recorder,
                run_id,
                "interrupted" if isinstance(e, KeyboardInterrupt) else "failed",
            )
        raise
    if result.message and not quiet:
        err.print(f"optpipe: note: {one_line(result.message)}", markup=False, soft_wrap=True)
    if db is not None and recorder is not None and keeper is not None and run_id is not None:
        from ..profiles_db import repository as repo

        keeper.close(store_last=False)
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


def _interrupted_result(
    problem: Problem,
    outcome: Outcome[Any],
    latest: LatestIncumbent,
    backend: str,
    started: float,
    time_limit: float,
) -> Any:
    """The result after a signal: the search's own when it returned in time, else the best
    incumbent it sent; ``KeyboardInterrupt`` when it had found nothing that fits."""
    if outcome.done and outcome.error is None and outcome.value is not None:
        result = outcome.value
        return dataclasses.replace(
            result,
            status="interrupted",
            message="interrupted: the best schedule found so far"
            + (f"; {result.message}" if result.message else ""),
        )
    found = best_found(problem, latest, backend, started, time_limit)
    if found is None:
        raise KeyboardInterrupt
    return found


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
