"""What a schedule command stores with ``--db``: one solver-run record for the command, the
problem given, and every schedule row it prints (baselines and the solver's), each schedule
once (``store_schedule`` finds the same problem and actions stored before).

A schedule built for a re-chunking of the given problem (``layers_per_stage``) is stored under
that re-chunking, labelled by its chunking and linked to the given problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .output import err

if TYPE_CHECKING:
    from ..schedule import Problem, Schedule


@dataclass
class CommandRecord:
    """One command's run in a profiles database (``start`` opens it, ``finish``/``end`` close
    it). ``recorder`` takes the solver's incumbents while it runs."""

    db: Any
    problem: Problem
    run_id: int
    recorder: Any = None
    schedule_ids: dict[str, int] = field(default_factory=dict)

    @classmethod
    def start(
        cls, url: str, problem: Problem, backend: str, params: dict[str, Any]
    ) -> CommandRecord:
        from ..profiles_db import open_database
        from ..profiles_db import repository as repo

        db = open_database(url)
        with db.session() as s:
            repo.store_problem(s, problem)
            run_id = repo.start_solver_run(s, problem.hash, backend, params)
        return cls(db, problem, run_id)

    def event_recorder(self) -> Any:
        """The solver's ``on_incumbent`` callback that records its progress."""
        from ..profiles_db import repository as repo

        self.recorder = repo.SolverEventRecorder(self.db, self.run_id)
        return self.recorder

    def store(self, name: str, schedule: Schedule, source: str) -> int:
        """Store one printed row's schedule (once); its id."""
        from ..profiles_db import repository as repo

        with self.db.session() as s:
            sid = int(repo.store_schedule(s, schedule, source=source, given=self.problem))
        self.schedule_ids[name] = sid
        return sid

    def finish(
        self,
        status: str,
        makespan: float | None,
        lower_bound: float | None,
        schedule_id: int | None,
    ) -> None:
        from ..profiles_db import repository as repo

        if self.recorder is not None:
            self.recorder.close()
        with self.db.session() as s:
            if self.schedule_ids:  # which stored schedule each printed row is (the same
                # schedule printed under two names is stored once, under the first)
                repo.set_solver_run_rows(s, self.run_id, self.schedule_ids)
            repo.finish_solver_run(
                s,
                self.run_id,
                status=status,
                makespan=makespan,
                lower_bound=lower_bound,
                schedule_id=schedule_id,
            )
        self.db.close()

    def end(self, status: str) -> None:
        """Close a run the command could not finish (best effort: its error is what counts)."""
        try:
            self.finish(status, None, None, None)
        except Exception as e:
            err.print(
                f"optpipe: note: could not mark solver run {self.run_id} {status}: {e}",
                markup=False,
            )


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest feasible row (the first of equals), else None."""
    feasible = [r for r in rows if r["feasible"] and r["makespan"] is not None]
    return min(feasible, key=lambda r: r["makespan"]) if feasible else None
