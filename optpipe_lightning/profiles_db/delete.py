"""Deleting one row by id with its dependants (``optpipe db delete``), damaged rows included.

Only ids are read (never a row's JSON), so a row that no longer reads can still be deleted.

- ``problem HASH``: the problem, its schedules, its solver runs and their events;
- ``schedule ID``: the schedule (runs, steps, switches and calibrations that name it keep their
  rows, with the reference cleared);
- ``solver-run ID``: the run and its events;
- ``training-run ID``: the run, its steps, switches, metrics and calibrations;
- ``profile ID``: the profile.

``delete_plan`` counts what ``delete_rows`` deletes (``NotFoundError`` when there is no such
row).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from .errors import NotFoundError
from .models import (
    ProblemRecord,
    ProfileRecord,
    ScheduleRecord,
    ScheduleSwitchRecord,
    SolverEventRecord,
    SolverRunRecord,
    TrainingCalibrationRecord,
    TrainingMetricRecord,
    TrainingRunRecord,
    TrainingStepRecord,
)

__all__ = ["DELETABLE", "delete_plan", "delete_rows"]

DELETABLE = ("problem", "schedule", "solver-run", "training-run", "profile")

# every column that refers to a schedule (cleared, never deleted with it)
_SCHEDULE_REFS: tuple[Any, ...] = (
    SolverRunRecord.schedule_id,
    TrainingStepRecord.schedule_id,
    ScheduleSwitchRecord.from_schedule_id,
    ScheduleSwitchRecord.to_schedule_id,
    TrainingCalibrationRecord.schedule_id,
)
_TRAINING_PARTS: tuple[tuple[str, type[Any]], ...] = (
    ("training steps", TrainingStepRecord),
    ("schedule switches", ScheduleSwitchRecord),
    ("training metrics", TrainingMetricRecord),
    ("training calibrations", TrainingCalibrationRecord),
)


def _ids(s: Session, col: Any, where: Any) -> list[Any]:
    return list(s.scalars(select(col).where(where)))


def _count(s: Session, model: type[Any], where: Any) -> int:
    return int(s.scalar(select(func.count()).select_from(model).where(where)) or 0)


def _exists(s: Session, kind: str, ident: str | int) -> None:
    model, col = {
        "problem": (ProblemRecord, ProblemRecord.hash),
        "schedule": (ScheduleRecord, ScheduleRecord.id),
        "solver-run": (SolverRunRecord, SolverRunRecord.id),
        "training-run": (TrainingRunRecord, TrainingRunRecord.id),
        "profile": (ProfileRecord, ProfileRecord.id),
    }[kind]
    if _count(s, model, col == ident) == 0:
        what = f"problem with hash {ident!r}" if kind == "problem" else f"{kind} with id {ident}"
        raise NotFoundError(f"no {what} in the database (see `optpipe db list`)")


def delete_plan(s: Session, kind: str, ident: str | int) -> dict[str, int]:
    """How many rows of each kind deleting ``kind ident`` removes (the row itself first)."""
    if kind not in DELETABLE:
        raise ValueError(f"cannot delete a {kind!r}; one of {', '.join(DELETABLE)}")
    _exists(s, kind, ident)
    if kind == "problem":
        runs = _ids(s, SolverRunRecord.id, SolverRunRecord.problem_hash == ident)
        return {
            "problems": 1,
            "schedules": _count(s, ScheduleRecord, ScheduleRecord.problem_hash == ident),
            "solver runs": len(runs),
            "solver events": _count(s, SolverEventRecord, SolverEventRecord.run_id.in_(runs)),
        }
    if kind == "solver-run":
        return {
            "solver runs": 1,
            "solver events": _count(s, SolverEventRecord, SolverEventRecord.run_id == ident),
        }
    if kind == "training-run":
        plan = {"training runs": 1}
        for name, model in _TRAINING_PARTS:
            plan[name] = _count(s, model, model.run_id == ident)
        return plan
    return {"schedules" if kind == "schedule" else "profiles": 1}


def delete_rows(s: Session, kind: str, ident: str | int) -> dict[str, int]:
    """Delete ``kind ident`` with its dependants; returns ``delete_plan``'s counts."""
    plan = delete_plan(s, kind, ident)
    if kind == "problem":
        runs = _ids(s, SolverRunRecord.id, SolverRunRecord.problem_hash == ident)
        schedules = _ids(s, ScheduleRecord.id, ScheduleRecord.problem_hash == ident)
        _clear_schedule_refs(s, schedules)
        _delete(s, SolverEventRecord, SolverEventRecord.run_id.in_(runs))
        _delete(s, SolverRunRecord, SolverRunRecord.id.in_(runs))
        _delete(s, ScheduleRecord, ScheduleRecord.id.in_(schedules))
        _delete(s, ProblemRecord, ProblemRecord.hash == ident)
    elif kind == "schedule":
        _clear_schedule_refs(s, [ident])
        _delete(s, ScheduleRecord, ScheduleRecord.id == ident)
    elif kind == "solver-run":
        _delete(s, SolverEventRecord, SolverEventRecord.run_id == ident)
        _delete(s, SolverRunRecord, SolverRunRecord.id == ident)
    elif kind == "training-run":
        for _, model in _TRAINING_PARTS:
            _delete(s, model, model.run_id == ident)
        _delete(s, TrainingRunRecord, TrainingRunRecord.id == ident)
    else:
        _delete(s, ProfileRecord, ProfileRecord.id == ident)
    s.expire_all()
    return plan


def _clear_schedule_refs(s: Session, schedule_ids: list[Any]) -> None:
    if not schedule_ids:
        return
    for col in _SCHEDULE_REFS:
        s.execute(
            update(col.class_)
            .where(col.in_(schedule_ids))
            .values({col.key: None})
            .execution_options(synchronize_session=False)
        )


def _delete(s: Session, model: type[Any], where: Any) -> None:
    s.execute(delete(model).where(where).execution_options(synchronize_session=False))
