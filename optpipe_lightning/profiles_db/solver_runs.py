"""Solver runs and their incumbent events: start, finish, list, read.

A run is owned by the process that started it (``owners``); the events are written by
``SolverEventRecorder`` (``recorder``) while the solver runs, and read back here.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .errors import NotFoundError
from .models import ProblemRecord, SolverEventRecord, SolverRunRecord, utcnow
from .owners import current_owner, display_status, mark_interrupted
from .rows import SolverEventRow, SolverRunRow
from .storage import json_safe

__all__ = [
    "finish_solver_run",
    "get_solver_run",
    "list_solver_runs",
    "run_rows",
    "set_solver_run_rows",
    "solver_events",
    "start_solver_run",
]


def start_solver_run(s: Session, problem_hash: str, backend: str, params: dict[str, Any]) -> int:
    """A new solver run (status ``running``, owned by this process) for a stored problem.

    Runs of this host whose process is gone are marked ``interrupted`` first (``owners``)."""
    if s.get(ProblemRecord, problem_hash) is None:
        raise NotFoundError(
            f"problem {problem_hash} is not in the database: store_problem before a solver run"
        )
    mark_interrupted(s)
    rec = SolverRunRecord(
        problem_hash=problem_hash,
        backend=backend,
        params=json_safe(params, "solver params"),
        status="running",
        owner=current_owner(),
    )
    s.add(rec)
    s.flush()
    return rec.id


def finish_solver_run(
    s: Session,
    run_id: int,
    *,
    status: str,
    makespan: float | None,
    lower_bound: float | None,
    schedule_id: int | None,
) -> None:
    """Close a run. A None ``makespan``, ``lower_bound`` or ``schedule_id`` keeps what the run
    recorded while it ran (its incumbents: ``recorder``, ``incumbents``), never erases it."""
    rec = s.get(SolverRunRecord, run_id)
    if rec is None:
        raise NotFoundError(f"no solver run with id {run_id} in the database")
    rec.status = status
    if makespan is not None:
        rec.makespan = makespan
    if lower_bound is not None:
        rec.lower_bound = lower_bound
    if schedule_id is not None:
        rec.schedule_id = schedule_id
    rec.finished_at = utcnow()


def set_solver_run_rows(s: Session, run_id: int, rows: dict[str, int]) -> None:
    """Record which stored schedule each row a command printed is (``params["rows"]``:
    name -> schedule id), as ``optpipe compare --db`` does."""
    rec = s.get(SolverRunRecord, run_id)
    if rec is None:
        raise NotFoundError(f"no solver run with id {run_id} in the database")
    rec.params = {**rec.params, "rows": json_safe(dict(rows), "solver run rows")}


def run_rows(s: Session, problem_hash: str) -> dict[str, int]:
    """Every row name -> schedule id the runs of a problem recorded (the newest run's wins)."""
    q = (
        select(SolverRunRecord.params)
        .where(SolverRunRecord.problem_hash == problem_hash)
        .order_by(SolverRunRecord.id)
    )
    found: dict[str, int] = {}
    for params in s.scalars(q):
        rows = params.get("rows") if isinstance(params, dict) else None
        if isinstance(rows, dict):
            found.update({str(k): int(v) for k, v in rows.items() if isinstance(v, int)})
    return found


def _solver_run_rows(s: Session, where: Any = None) -> list[SolverRunRow]:
    counts = (
        select(SolverEventRecord.run_id.label("rid"), func.count().label("n"))
        .group_by(SolverEventRecord.run_id)
        .subquery()
    )
    q = select(SolverRunRecord, counts.c.n).outerjoin(counts, counts.c.rid == SolverRunRecord.id)
    if where is not None:
        q = q.where(where)
    q = q.order_by(SolverRunRecord.started_at.desc(), SolverRunRecord.id.desc())
    return [
        SolverRunRow(
            id=r.id,
            problem_hash=r.problem_hash,
            backend=r.backend,
            status=display_status(r.status, r.owner),
            started_at=r.started_at,
            finished_at=r.finished_at,
            makespan=r.makespan,
            lower_bound=r.lower_bound,
            schedule_id=r.schedule_id,
            num_events=n or 0,
        )
        for r, n in s.execute(q).all()
    ]


def list_solver_runs(s: Session, problem_hash: str | None = None) -> list[SolverRunRow]:
    """Solver runs, newest first."""
    where = None if problem_hash is None else SolverRunRecord.problem_hash == problem_hash
    return _solver_run_rows(s, where)


def get_solver_run(s: Session, run_id: int) -> SolverRunRow:
    rows = _solver_run_rows(s, SolverRunRecord.id == run_id)
    if not rows:
        raise NotFoundError(f"no solver run with id {run_id} in the database")
    return rows[0]


def solver_events(s: Session, run_id: int) -> list[SolverEventRow]:
    """The run's incumbent events in time order."""
    q = (
        select(SolverEventRecord.wall_time, SolverEventRecord.makespan, SolverEventRecord.bound)
        .where(SolverEventRecord.run_id == run_id)
        .order_by(SolverEventRecord.wall_time, SolverEventRecord.id)
    )
    return [SolverEventRow(w, m, b) for w, m, b in s.execute(q).all()]
