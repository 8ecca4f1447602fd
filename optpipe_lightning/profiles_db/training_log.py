"""What a training run records beyond step times, and how the inspector reads it back.

The strategy records (every function takes a ``Session``, like ``repository``'s):

- ``record_metrics(s, run_id, step=..., metrics={...})``: named numbers of one optimizer step.
  The inspector knows ``train_loss``, ``val_loss`` (the loss of the validation run after that
  step), ``samples`` and ``tokens`` (how many the step trained on, every data-parallel replica
  together: throughput is their count over the step's measured time); other names are stored
  and listed as they are. NaN and infinity are stored as missing values.
- ``record_calibration(...)``: a re-estimate of the costs from the running schedule's steps, with
  the schedule's predicted step time before and after it and the reason.
- ``record_memory_limit(s, run_id, limits)``: bytes per rank that the measured peak memory
  (``record_step``'s ``peak_memory``) is held against.
- ``repository.record_switch(..., predicted_before=, predicted_after=)`` records a switch's
  predicted gain.

All of these are re-exported by ``repository``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from .errors import NotFoundError
from .models import (
    HardwareRecord,
    TrainingCalibrationRecord,
    TrainingMetricRecord,
    TrainingRunRecord,
)
from .rows import CalibrationRow, MetricRow, TrainingRunDetail

KNOWN_METRICS = ("train_loss", "val_loss", "samples", "tokens")
MAX_NAME = 64


def _finite(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _run(s: Session, run_id: int) -> TrainingRunRecord:
    rec = s.get(TrainingRunRecord, run_id)
    if rec is None:
        raise NotFoundError(f"no training run with id {run_id} in the database")
    return rec


def record_metrics(
    s: Session, run_id: int, *, step: int, metrics: Mapping[str, float | None]
) -> None:
    """Store named numbers of one optimizer step (see the module doc for the names)."""
    for name, value in metrics.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise ValueError(f"metric names are 1-{MAX_NAME} characters, got {name!r}")
        s.add(TrainingMetricRecord(run_id=run_id, step=int(step), name=name, value=_finite(value)))
    s.flush()


def record_calibration(
    s: Session,
    run_id: int,
    *,
    step: int,
    schedule_id: int | None,
    predicted_before: float | None,
    predicted_after: float | None,
    measured_seconds: float | None,
    reason: str,
) -> None:
    """Store one re-calibration of the costs (times in seconds per optimizer step)."""
    s.add(
        TrainingCalibrationRecord(
            run_id=run_id,
            step=int(step),
            schedule_id=schedule_id,
            predicted_before=_finite(predicted_before),
            predicted_after=_finite(predicted_after),
            measured_seconds=_finite(measured_seconds),
            reason=reason,
        )
    )
    s.flush()


def record_memory_limit(s: Session, run_id: int, limits: Sequence[float]) -> None:
    """Bytes per rank that the run's measured peak memory is held against."""
    _run(s, run_id).memory_limit = [float(x) for x in limits]
    s.flush()


def training_metrics(s: Session, run_id: int) -> list[MetricRow]:
    """The run's metrics in step order."""
    q = (
        select(TrainingMetricRecord)
        .where(TrainingMetricRecord.run_id == run_id)
        .order_by(TrainingMetricRecord.step, TrainingMetricRecord.id)
    )
    return [MetricRow(r.step, r.name, r.value, r.recorded_at) for r in s.scalars(q)]


def training_calibrations(s: Session, run_id: int) -> list[CalibrationRow]:
    """The run's re-calibrations in step order."""
    q = (
        select(TrainingCalibrationRecord)
        .where(TrainingCalibrationRecord.run_id == run_id)
        .order_by(TrainingCalibrationRecord.step, TrainingCalibrationRecord.id)
    )
    return [
        CalibrationRow(
            step=r.step,
            schedule_id=r.schedule_id,
            predicted_before=r.predicted_before,
            predicted_after=r.predicted_after,
            measured_seconds=r.measured_seconds,
            reason=r.reason,
            recorded_at=r.recorded_at,
        )
        for r in s.scalars(q)
    ]


def training_run_detail(s: Session, run_id: int) -> TrainingRunDetail:
    """One run with its hardware's device memory and the memory limit it recorded."""
    row = s.execute(
        select(TrainingRunRecord, HardwareRecord)
        .join(HardwareRecord, HardwareRecord.id == TrainingRunRecord.hardware_id)
        .where(TrainingRunRecord.id == run_id)
    ).first()
    if row is None:
        raise NotFoundError(f"no training run with id {run_id} in the database")
    r, h = row
    return TrainingRunDetail(
        id=r.id,
        status=r.status,
        device_kind=h.device_kind,
        device_count=h.device_count,
        device_memory=int(h.device_memory),
        memory_limit=None if r.memory_limit is None else tuple(r.memory_limit),
        config=dict(r.config),
        started_at=r.started_at,
        finished_at=r.finished_at,
    )
