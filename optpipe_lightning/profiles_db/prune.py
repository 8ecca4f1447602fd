"""Pruning: delete the profiles, schedules and finished runs that no lookup returns any more."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from .models import (
    ProfileRecord,
    ScheduleRecord,
    ScheduleSwitchRecord,
    SolverEventRecord,
    SolverRunRecord,
    TrainingCalibrationRecord,
    TrainingMetricRecord,
    TrainingRunRecord,
    TrainingStepRecord,
    utcnow,
)
from .rows import PruneReport

__all__ = ["prune"]


def prune(
    s: Session,
    *,
    keep_profiles: int = 1,
    keep_schedules: int | None = None,
    older_than_seconds: float | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Delete what no lookup returns any more; counts what was (or, dry, would be) deleted.

    - profiles: all but the newest ``keep_profiles`` per (hardware, model) key;
    - schedules (when ``keep_schedules`` is given): all but the best ``keep_schedules`` per
      problem, except schedules a solver run, a training step or a switch refers to;
    - runs (when ``older_than_seconds`` is given): finished solver and training runs started
      longer ago than that, with their events, steps, switches, metrics and calibrations.
    """
    if keep_profiles < 1:
        raise ValueError("keep_profiles must be >= 1 (the newest profile is what lookups reuse)")
    if keep_schedules is not None and keep_schedules < 1:
        raise ValueError("keep_schedules must be >= 1 (the best schedule is what lookups reuse)")

    drop_profiles: list[int] = []
    seen: dict[tuple[int, int], int] = {}
    for pid, hid, mid in s.execute(
        select(ProfileRecord.id, ProfileRecord.hardware_id, ProfileRecord.model_id).order_by(
            ProfileRecord.measured_at.desc(), ProfileRecord.id.desc()
        )
    ).all():
        n = seen.get((hid, mid), 0)
        seen[(hid, mid)] = n + 1
        if n >= keep_profiles:
            drop_profiles.append(pid)

    drop_runs: list[int] = []
    drop_training: list[int] = []
    if older_than_seconds is not None:
        cutoff = datetime.fromtimestamp(utcnow().timestamp() - older_than_seconds, UTC)
        drop_runs = list(
            s.scalars(
                select(SolverRunRecord.id).where(
                    SolverRunRecord.started_at < cutoff, SolverRunRecord.finished_at.is_not(None)
                )
            )
        )
        drop_training = list(
            s.scalars(
                select(TrainingRunRecord.id).where(
                    TrainingRunRecord.started_at < cutoff,
                    TrainingRunRecord.finished_at.is_not(None),
                )
            )
        )

    drop_schedules: list[int] = []
    if keep_schedules is not None:
        used: set[int] = set()
        for col, owner, gone in (
            (SolverRunRecord.schedule_id, SolverRunRecord.id, drop_runs),
            (TrainingStepRecord.schedule_id, TrainingStepRecord.run_id, drop_training),
            (ScheduleSwitchRecord.from_schedule_id, ScheduleSwitchRecord.run_id, drop_training),
            (ScheduleSwitchRecord.to_schedule_id, ScheduleSwitchRecord.run_id, drop_training),
            (
                TrainingCalibrationRecord.schedule_id,
                TrainingCalibrationRecord.run_id,
                drop_training,
            ),
        ):
            q = select(col).where(col.is_not(None))
            if gone:
                q = q.where(owner.not_in(gone))
            used.update(x for x in s.scalars(q.distinct()) if x is not None)
        count: dict[str, int] = {}
        for sid, h in s.execute(
            select(ScheduleRecord.id, ScheduleRecord.problem_hash).order_by(
                ScheduleRecord.problem_hash,
                ScheduleRecord.feasible.desc(),
                ScheduleRecord.makespan.is_(None),
                ScheduleRecord.makespan,
                ScheduleRecord.id,
            )
        ).all():
            n = count.get(h, 0)
            count[h] = n + 1
            if n >= keep_schedules and sid not in used:
                drop_schedules.append(sid)

    if not dry_run:
        _delete_in(s, SolverEventRecord, SolverEventRecord.run_id, drop_runs)
        _delete_in(s, SolverRunRecord, SolverRunRecord.id, drop_runs)
        _delete_in(s, TrainingStepRecord, TrainingStepRecord.run_id, drop_training)
        _delete_in(s, ScheduleSwitchRecord, ScheduleSwitchRecord.run_id, drop_training)
        _delete_in(s, TrainingMetricRecord, TrainingMetricRecord.run_id, drop_training)
        _delete_in(s, TrainingCalibrationRecord, TrainingCalibrationRecord.run_id, drop_training)
        _delete_in(s, TrainingRunRecord, TrainingRunRecord.id, drop_training)
        _delete_in(s, ProfileRecord, ProfileRecord.id, drop_profiles)
        _delete_in(s, ScheduleRecord, ScheduleRecord.id, drop_schedules)
        s.expire_all()
    return PruneReport(
        profiles=len(drop_profiles),
        schedules=len(drop_schedules),
        solver_runs=len(drop_runs),
        training_runs=len(drop_training),
        dry_run=dry_run,
    )


def _delete_in(s: Session, model: type[Any], col: Any, ids: list[int], chunk: int = 500) -> None:
    for i in range(0, len(ids), chunk):
        s.execute(
            delete(model)
            .where(col.in_(ids[i : i + chunk]))
            .execution_options(synchronize_session=False)
        )
