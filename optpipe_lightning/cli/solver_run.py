"""One solver run from the command line: the live progress display on a terminal, and the run
and its schedule recorded in a profiles database (``CommandRecord`` of ``--db``), closed as
failed or interrupted when the solve does not finish. SIGINT and SIGTERM stop the search and
keep the best schedule found (``cli.interrupt``); with ``--db`` the newest incumbent schedule is
stored as the search goes (``profiles_db.incumbents``), so even kill -9 leaves it behind.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from .command_errors import one_line
from .interrupt import LatestIncumbent, Outcome, best_found, run_stoppable, signals_stop
from .output import err, out

if TYPE_CHECKING:
    from ..schedule import Problem, Schedule
    from .records import CommandRecord


def run_solver(
    problem: Problem,
    backend: str,
    time_limit: float,
    seed: int,
    *,
    quiet: bool,
    record: CommandRecord | None,
    gap: float = 0.0,
    candidates: list[Schedule] | None = None,
    finish: bool = True,
    retarget: Callable[[Schedule], Schedule] | None = None,
) -> Any:
    """Solve; with ``record``, its incumbents are recorded and its schedule stored (as row
    ``optpipe``), and the run is closed with the result unless ``finish=False`` (the caller
    closes it). On SIGINT/SIGTERM: the best schedule found so far, simulator checked, with
    status ``interrupted`` (the caller exits with 130 then); ``KeyboardInterrupt`` (the run
    closed as interrupted) when nothing that fits was found before the signal. ``retarget``:
    applied to the result's schedule before it is stored or returned (``--memory-margin``:
    the schedule for the real limit with its ``memory_budget``, ``margin.budgeted_for``)."""
    from ..solver import solve

    started = time.perf_counter()
    latest = LatestIncumbent()
    callbacks: list[Callable[[Any], None]] = [latest]
    keeper = None
    if record is not None:
        from ..profiles_db.incumbents import IncumbentKeeper

        keeper = IncumbentKeeper(record.db, record.run_id)  # kill -9 leaves the best behind
        callbacks += [record.event_recorder(), keeper]

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
        if keeper is not None:
            keeper.close()
        if record is not None:
            record.end("interrupted" if isinstance(e, KeyboardInterrupt) else "failed")
        raise
    if keeper is not None:
        keeper.close(store_last=False)
    if retarget is not None:
        result = dataclasses.replace(result, schedule=retarget(result.schedule))
    if result.message and not quiet:
        err.print(f"optpipe: note: {one_line(result.message)}", markup=False, soft_wrap=True)
    if record is not None:
        # the schedule embeds the problem it was built for (a re-chunking of this one)
        sid = record.store("optpipe", result.schedule, "solver")
        if finish:
            record.finish(result.status, result.makespan, result.lower_bound, sid)
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
