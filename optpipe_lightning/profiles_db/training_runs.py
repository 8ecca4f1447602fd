"""Training runs: start, the step times and schedule switches they record, finish, list, read.

What a run records beyond step times (metrics, calibrations, memory limits) is in
``training_log``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from optpipe_lightning.schedule.profile import HardwareFingerprint, ModelFingerprint

from .errors import NotFoundError
from .fingerprints import upsert_hardware, upsert_model
from .models import (
    HardwareRecord,
    ModelRecord,
    ScheduleSwitchRecord,
    TrainingRunRecord,
    TrainingStepRecord,
    utcnow,
)
from .owners import current_owner, display_status, mark_interrupted
from .rows import StepRow, SwitchRow, TrainingRunRow
from .storage import json_safe

__all__ = [
    "finish_training_run",
    "list_training_runs",
    "record_step",
    "record_switch",
    "schedule_switches",
    "start_training_run",
    "training_steps",
]


def start_training_run(
    s: Session,
    *,
    hardware: HardwareFingerprint,
    model: ModelFingerprint,
    config: dict[str, Any],
) -> int:
    """A new training run (status ``running``, owned by this process) on (hardware, model).

    Runs of this host whose process is gone are marked ``interrupted`` first (``owners``)."""
    hw = upsert_hardware(s, hardware)
    mod = upsert_model(s, model)
    mark_interrupted(s)
    rec = TrainingRunRecord(
        hardware_id=hw.id,
        model_id=mod.id,
        config=json_safe(config, "training config"),
        status="running",
        owner=current_owner(),
    )
    s.add(rec)
    s.flush()
    return rec.id


def record_step(
    s: Session,
    run_id: int,
    *,
    step: int,
    measured_seconds: float,
    predicted_seconds: float | None,
    schedule_id: int | None,
    peak_memory: list[float],
) -> None:
    s.add(
        TrainingStepRecord(
            run_id=run_id,
            step=step,
            measured_seconds=float(measured_seconds),
            predicted_seconds=None if predicted_seconds is None else float(predicted_seconds),
            schedule_id=schedule_id,
            peak_memory=[float(x) for x in peak_memory],
        )
    )
    s.flush()


def record_switch(
    s: Session,
    run_id: int,
    *,
    step: int,
    from_schedule_id: int | None,
    to_schedule_id: int,
    reason: str,
    predicted_before: float | None = None,
    predicted_after: float | None = None,
) -> None:
    """A schedule switch; ``predicted_before`` / ``predicted_after`` are the predicted step
    times (seconds) of the schedule left and of the one adopted, on the costs of that moment."""
    s.add(
        ScheduleSwitchRecord(
            run_id=run_id,
            step=step,
            from_schedule_id=from_schedule_id,
            to_schedule_id=to_schedule_id,
            reason=reason,
            predicted_before=predicted_before,
            predicted_after=predicted_after,
        )
    )
    s.flush()


def finish_training_run(s: Session, run_id: int, *, status: str) -> None:
    rec = s.get(TrainingRunRecord, run_id)
    if rec is None:
        raise NotFoundError(f"no training run with id {run_id} in the database")
    rec.status = status
    rec.finished_at = utcnow()


def list_training_runs(s: Session) -> list[TrainingRunRow]:
    """Training runs, newest first."""
    counts = (
        select(TrainingStepRecord.run_id.label("rid"), func.count().label("n"))
        .group_by(TrainingStepRecord.run_id)
        .subquery()
    )
    q = (
        select(TrainingRunRecord, HardwareRecord, ModelRecord, counts.c.n)
        .join(HardwareRecord, HardwareRecord.id == TrainingRunRecord.hardware_id)
        .join(ModelRecord, ModelRecord.id == TrainingRunRecord.model_id)
        .outerjoin(counts, counts.c.rid == TrainingRunRecord.id)
        .order_by(TrainingRunRecord.started_at.desc(), TrainingRunRecord.id.desc())
    )
    return [
        TrainingRunRow(
            id=r.id,
            hardware_key=h.key,
            model_key=m.key,
            device_kind=h.device_kind,
            model_name=m.name,
            status=display_status(r.status, r.owner),
            started_at=r.started_at,
            finished_at=r.finished_at,
            num_steps=n or 0,
            config=dict(r.config),
        )
        for r, h, m, n in s.execute(q).all()
    ]


def training_steps(s: Session, run_id: int) -> list[StepRow]:
    q = (
        select(TrainingStepRecord)
        .where(TrainingStepRecord.run_id == run_id)
        .order_by(TrainingStepRecord.step, TrainingStepRecord.id)
    )
    return [
        StepRow(
            step=r.step,
            measured_seconds=r.measured_seconds,
            predicted_seconds=r.predicted_seconds,
            schedule_id=r.schedule_id,
            peak_memory=tuple(r.peak_memory),
            recorded_at=r.recorded_at,
        )
        for r in s.scalars(q)
    ]


def schedule_switches(s: Session, run_id: int) -> list[SwitchRow]:
    q = (
        select(ScheduleSwitchRecord)
        .where(ScheduleSwitchRecord.run_id == run_id)
        .order_by(ScheduleSwitchRecord.step, ScheduleSwitchRecord.id)
    )
    return [
        SwitchRow(
            step=r.step,
            from_schedule_id=r.from_schedule_id,
            to_schedule_id=r.to_schedule_id,
            reason=r.reason,
            recorded_at=r.recorded_at,
            predicted_before=r.predicted_before,
            predicted_after=r.predicted_after,
        )
        for r in s.scalars(q)
    ]
