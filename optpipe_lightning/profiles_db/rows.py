"""Small frozen rows for display (the inspector, ``optpipe db list``): key columns only.

The full objects (``Problem``, ``Schedule``, ``Profile``) come from the ``get_*``/``find_*``
functions of ``repository``; these rows never parse stored JSON, so listing stays fast.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class _Row:
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO-8601 strings."""
        return {
            k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(self).items()
        }


@dataclass(frozen=True, slots=True)
class ProblemRow(_Row):
    hash: str
    name: str | None
    num_stages: int
    num_microbatches: int
    num_chunks: int
    placement: str
    memory_limit: float | None  # the smallest per-stage limit; None = unlimited
    offload: bool
    created_at: datetime
    num_schedules: int  # a problem the user gave: its re-chunkings' schedules included
    best_makespan: float | None  # best feasible stored schedule (of those)
    given_hash: str | None = None  # a re-chunking: the problem the user gave


@dataclass(frozen=True, slots=True)
class ScheduleRow(_Row):
    id: int
    problem_hash: str
    generator: str
    source: str  # "baseline", "solver", "import", ... (free text, set by the caller)
    makespan: float | None
    feasible: bool
    bubble_rate: float | None
    num_offloaded: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ProfileRow(_Row):
    id: int
    hardware_key: str
    model_key: str
    device_kind: str
    device_count: int
    torch_version: str
    model_name: str
    num_stages: int
    num_chunks: int
    microbatch_size: int
    num_microbatches: int
    measured_at: datetime
    stored_at: datetime


@dataclass(frozen=True, slots=True)
class SolverRunRow(_Row):
    id: int
    problem_hash: str
    backend: str
    status: str
    started_at: datetime
    finished_at: datetime | None
    makespan: float | None  # best so far while running, final when finished
    lower_bound: float | None
    schedule_id: int | None
    num_events: int


@dataclass(frozen=True, slots=True)
class SolverEventRow(_Row):
    wall_time: float  # seconds since the solve started
    makespan: float | None
    bound: float | None


@dataclass(frozen=True, slots=True)
class TrainingRunRow(_Row):
    id: int
    hardware_key: str
    model_key: str
    device_kind: str
    model_name: str
    status: str
    started_at: datetime
    finished_at: datetime | None
    num_steps: int
    config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StepRow(_Row):
    step: int
    measured_seconds: float
    predicted_seconds: float | None
    schedule_id: int | None
    peak_memory: tuple[float, ...]  # bytes per rank
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class SwitchRow(_Row):
    step: int
    from_schedule_id: int | None
    to_schedule_id: int | None
    reason: str
    recorded_at: datetime
    predicted_before: float | None = None  # seconds per step of the schedule left
    predicted_after: float | None = None  # ... and of the one adopted


@dataclass(frozen=True, slots=True)
class PruneReport(_Row):
    profiles: int
    schedules: int
    solver_runs: int
    training_runs: int
    dry_run: bool


@dataclass(frozen=True, slots=True)
class MetricRow(_Row):
    step: int
    name: str  # "train_loss", "val_loss", "samples", "tokens", or any other logged name
    value: float | None  # None when the run logged NaN or infinity
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class CalibrationRow(_Row):
    step: int
    schedule_id: int | None  # the schedule running when the costs were re-estimated
    predicted_before: float | None  # its predicted step time on the old costs, seconds
    predicted_after: float | None  # ... and on the re-calibrated costs
    measured_seconds: float | None  # what its steps measured
    reason: str
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class TrainingRunDetail(_Row):
    id: int
    status: str
    device_kind: str
    device_count: int
    device_memory: int  # bytes of one device (the hardware fingerprint)
    memory_limit: tuple[float, ...] | None  # bytes per rank the run's peaks are held against
    config: dict[str, Any]
    started_at: datetime
    finished_at: datetime | None
