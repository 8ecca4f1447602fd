"""The ORM models (SQLAlchemy 2.0, typed ``Mapped[...]``): one class per table.

Schedules, problems, profiles and fingerprints are stored as their validated JSON text (``data``
columns, never pickle) next to the key columns queries need (problem hash, fingerprint key,
makespan, feasible, generator). Times are UTC (``UTCDateTime``). The Alembic migrations under
``migrations/versions`` build exactly this schema; a test compares the two.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

VERSION_TABLE = "optpipe_schema_version"
"""Alembic's version table, named so it never clashes with another application's."""


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Stores naive UTC, returns aware UTC (SQLite keeps no zone; PostgreSQL gets the same)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 (SQLAlchemy reads this class attribute)
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[float]: JSON(),
        list[float] | None: JSON(),
    }


class HardwareRecord(Base):
    """One ``HardwareFingerprint`` (by ``key``; the hostname is informative only)."""

    __tablename__ = "hardware_fingerprints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    device_kind: Mapped[str] = mapped_column(String(200))
    device_count: Mapped[int] = mapped_column(Integer)
    device_memory: Mapped[int] = mapped_column(BigInteger)
    interconnect: Mapped[str] = mapped_column(String(100))
    driver: Mapped[str] = mapped_column(String(200))
    torch_version: Mapped[str] = mapped_column(String(100))
    data: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelRecord(Base):
    """One ``ModelFingerprint`` (by ``key``; the name is informative only)."""

    __tablename__ = "model_fingerprints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    dtype: Mapped[str] = mapped_column(String(32))
    num_layers: Mapped[int] = mapped_column(Integer)
    microbatch_size: Mapped[int] = mapped_column(Integer)
    sequence_length: Mapped[int | None] = mapped_column(Integer)
    num_stages: Mapped[int] = mapped_column(Integer)
    num_chunks: Mapped[int] = mapped_column(Integer)
    data: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ProfileRecord(Base):
    """One measured ``Profile``; the newest ``measured_at`` for a (hardware, model) pair wins."""

    __tablename__ = "profiles"
    __table_args__ = (Index("ix_profiles_lookup", "hardware_id", "model_id", "measured_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hardware_id: Mapped[int] = mapped_column(
        ForeignKey("hardware_fingerprints.id", ondelete="CASCADE")
    )
    model_id: Mapped[int] = mapped_column(ForeignKey("model_fingerprints.id", ondelete="CASCADE"))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    num_microbatches: Mapped[int] = mapped_column(Integer)
    measured_at: Mapped[datetime] = mapped_column()
    stored_at: Mapped[datetime] = mapped_column(default=utcnow)
    data: Mapped[str] = mapped_column(Text)


class ProblemRecord(Base):
    """One ``Problem`` by its hash."""

    __tablename__ = "problems"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    num_stages: Mapped[int] = mapped_column(Integer)
    num_microbatches: Mapped[int] = mapped_column(Integer)
    num_chunks: Mapped[int] = mapped_column(Integer)
    placement: Mapped[str] = mapped_column(String(32))
    memory_limit: Mapped[float | None] = mapped_column(Float, doc="smallest per-stage limit")
    offload: Mapped[bool] = mapped_column(Boolean)
    data: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    given_hash: Mapped[str | None] = mapped_column(
        String(64),
        index=True,
        doc="for a re-chunking the solver or a baseline ran: the problem the user gave",
    )


class ScheduleRecord(Base):
    """One ``Schedule`` (stored without its embedded problem, which lives in ``problems``)."""

    __tablename__ = "schedules"
    __table_args__ = (Index("ix_schedules_best", "problem_hash", "feasible", "makespan"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_hash: Mapped[str] = mapped_column(ForeignKey("problems.hash", ondelete="CASCADE"))
    generator: Mapped[str] = mapped_column(String(100))
    source: Mapped[str] = mapped_column(String(32))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    makespan: Mapped[float | None] = mapped_column(Float)
    feasible: Mapped[bool] = mapped_column(Boolean)
    bubble_rate: Mapped[float | None] = mapped_column(Float)
    num_offloaded: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column()
    data: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    content_digest: Mapped[str | None] = mapped_column(
        String(64),
        index=True,
        doc="digest of what runs (problem, chunking, actions): the same schedule is stored once",
    )


class SolverRunRecord(Base):
    """One solve of one problem; ``makespan``/``lower_bound`` follow its events while it runs."""

    __tablename__ = "solver_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    problem_hash: Mapped[str] = mapped_column(
        ForeignKey("problems.hash", ondelete="CASCADE"), index=True
    )
    backend: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column()
    status: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    owner: Mapped[str | None] = mapped_column(String(200), doc="the process running it (owners)")
    finished_at: Mapped[datetime | None] = mapped_column()
    makespan: Mapped[float | None] = mapped_column(Float)
    lower_bound: Mapped[float | None] = mapped_column(Float)
    schedule_id: Mapped[int | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"))


class SolverEventRecord(Base):
    """One incumbent (or bound) report of a solver run."""

    __tablename__ = "solver_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("solver_runs.id", ondelete="CASCADE"), index=True
    )
    wall_time: Mapped[float] = mapped_column(Float)
    makespan: Mapped[float | None] = mapped_column(Float)
    bound: Mapped[float | None] = mapped_column(Float)


class TrainingRunRecord(Base):
    """One training run on one (hardware, model)."""

    __tablename__ = "training_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hardware_id: Mapped[int] = mapped_column(
        ForeignKey("hardware_fingerprints.id", ondelete="CASCADE")
    )
    model_id: Mapped[int] = mapped_column(ForeignKey("model_fingerprints.id", ondelete="CASCADE"))
    config: Mapped[dict[str, Any]] = mapped_column()
    status: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    owner: Mapped[str | None] = mapped_column(String(200), doc="the process running it (owners)")
    finished_at: Mapped[datetime | None] = mapped_column()
    memory_limit: Mapped[list[float] | None] = mapped_column(
        doc="bytes per rank that the rank's measured peak memory is held against (revision 0002)"
    )


class TrainingStepRecord(Base):
    """One optimizer step: measured and predicted time, the schedule in use, peak memory per rank."""

    __tablename__ = "training_steps"
    __table_args__ = (Index("ix_training_steps_run_step", "run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("training_runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    measured_seconds: Mapped[float] = mapped_column(Float)
    predicted_seconds: Mapped[float | None] = mapped_column(Float)
    schedule_id: Mapped[int | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"))
    peak_memory: Mapped[list[float]] = mapped_column()
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)


class ScheduleSwitchRecord(Base):
    """A change of schedule during training (always at an optimizer-step boundary)."""

    __tablename__ = "schedule_switches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("training_runs.id", ondelete="CASCADE"), index=True
    )
    step: Mapped[int] = mapped_column(Integer)
    from_schedule_id: Mapped[int | None] = mapped_column(
        ForeignKey("schedules.id", ondelete="SET NULL")
    )
    to_schedule_id: Mapped[int | None] = mapped_column(
        ForeignKey("schedules.id", ondelete="SET NULL")
    )
    reason: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)
    # revision 0002: the predicted step time of the schedule left and of the one adopted, both on
    # the costs known at the switch (their difference is the gain the switch was made for)
    predicted_before: Mapped[float | None] = mapped_column(Float)
    predicted_after: Mapped[float | None] = mapped_column(Float)


class TrainingMetricRecord(Base):
    """One named number of one optimizer step (revision 0002): ``train_loss``, ``val_loss``,
    ``samples``, ``tokens`` or any other metric the run logs."""

    __tablename__ = "training_metrics"
    __table_args__ = (Index("ix_training_metrics_run_step", "run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("training_runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float | None] = mapped_column(Float, doc="None for NaN or infinity")
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)


class TrainingCalibrationRecord(Base):
    """A re-calibration of the costs during training (revision 0002): the running schedule's
    predicted step time before and after, what the steps measured, and why."""

    __tablename__ = "training_calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(
        ForeignKey("training_runs.id", ondelete="CASCADE"), index=True
    )
    step: Mapped[int] = mapped_column(Integer)
    schedule_id: Mapped[int | None] = mapped_column(ForeignKey("schedules.id", ondelete="SET NULL"))
    predicted_before: Mapped[float | None] = mapped_column(Float)
    predicted_after: Mapped[float | None] = mapped_column(Float)
    measured_seconds: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)


OPTPIPE_TABLES: frozenset[str] = frozenset(Base.metadata.tables)
