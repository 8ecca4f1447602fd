"""One solver run from the command line: the live progress display on a terminal, and the run
and its schedule recorded in a profiles database (``CommandRecord`` of ``--db``), closed as
failed or interrupted when the solve does not finish.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

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
) -> Any:
    """Solve; with ``record``, its incumbents are recorded and its schedule stored (as row
    ``optpipe``), and the run is closed with the result unless ``finish=False`` (the caller
    closes it)."""
    from ..solver import solve

    callbacks: list[Callable[[Any], None]] = []
    if record is not None:
        callbacks.append(record.event_recorder())

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
        if record is not None:
            record.end("interrupted" if isinstance(e, KeyboardInterrupt) else "failed")
        raise
    if result.message and not quiet:
        err.print(f"optpipe: note: {result.message}", markup=False)
    if record is not None:
        # the schedule embeds the problem it was built for (a re-chunking of this one)
        sid = record.store("optpipe", result.schedule, "solver")
        if finish:
            record.finish(result.status, result.makespan, result.lower_bound, sid)
    return result
