"""The strategy's options, checked when they are given; the size checks made before any launch.

``PipelineOptions`` holds what ``OptPipeStrategy(...)`` was given (validated at once, one line per
mistake). ``check_sizes`` and ``check_layers`` are the checks the launcher makes in the launching
process, before any worker waits on another: world size against stages x replicas, microbatches
against stages, the named schedule's shape rules, and the layer count against the layer groups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ...schedule import Problem, Schedule
from ...schedule.margin import limit_with_margin, parse_memory_margin
from .partition import PartitionError, validate_partition
from .planner import (
    SCHEDULE_CHOICES,
    NoScheduleError,
    Placement,
    choose_schedule,
    chunks_for,
    initial_problem,
)

MemoryLimit = Literal["auto"] | float | int | None


class OptPipeConfigError(ValueError):
    """A wrong option or model/size combination, reported before any process waits on another."""


@dataclass(frozen=True)
class PipelineOptions:
    """What ``OptPipeStrategy`` was given (see its docstring and docs/strategy.md)."""

    num_stages: int | Literal["auto"] = "auto"
    num_microbatches: int | Literal["auto"] = "auto"
    schedule: str = "optimal"
    num_chunks: int | None = None
    placement: Placement | None = None
    memory_limit: MemoryLimit = "auto"
    memory_margin: float | str = 0.0  # headroom below each limit (schedule/margin.py)
    offload: bool = True
    solver_backend: str = "auto"
    solver_time_limit: float = 30.0
    database: str | None = None
    use_database: bool = True
    require_database: bool = False
    profile_steps: int = 2
    online_resolve: bool = True
    data_parallel: int = 1
    partition: tuple[int, ...] | None = None
    offload_min_bytes: int = 1024
    log_loss_as: str | None = "train_loss"
    schedule_source: Callable[[Problem], Schedule] | None = None
    resolve_min_gain: float = 0.01
    resolve_start_method: str = "spawn"
    repartition: bool = True
    calibrate: bool = True
    calibrate_every: int = 4
    calibrate_min_steps: int = 8
    tune_host_allocator: bool = True
    calibrate_budget: float | None = 0.005  # share of the time calibrations may take (None: any)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULE_CHOICES:
            raise OptPipeConfigError(
                f"unknown schedule {self.schedule!r}; one of {', '.join(SCHEDULE_CHOICES)}"
            )
        p, m = self.num_stages, self.num_microbatches
        if p != "auto" and (not isinstance(p, int) or p < 1):
            raise OptPipeConfigError(f"num_stages must be an integer >= 1 or 'auto', got {p!r}")
        if m != "auto" and (not isinstance(m, int) or m < 1):
            raise OptPipeConfigError(
                f"num_microbatches must be an integer >= 1 or 'auto', got {m!r}"
            )
        if isinstance(p, int) and isinstance(m, int):
            check_microbatches(m, p)
        try:
            chunks_for(self.schedule, self.num_chunks, self.placement)
        except NoScheduleError as e:
            raise OptPipeConfigError(str(e)) from None
        if self.data_parallel < 1:
            raise OptPipeConfigError(f"data_parallel must be >= 1, got {self.data_parallel}")
        lim = self.memory_limit
        if lim not in ("auto", None) and (not isinstance(lim, int | float) or lim <= 0):
            raise OptPipeConfigError(f"memory_limit must be 'auto', None or bytes > 0, got {lim!r}")
        if isinstance(self.memory_margin, bool) or not isinstance(
            self.memory_margin, int | float | str
        ):
            raise OptPipeConfigError(
                f"memory_margin must be a fraction in [0, 1) or bytes (e.g. 0.1, '2GB'), got "
                f"{self.memory_margin!r}"
            )
        try:
            parse_memory_margin(self.memory_margin)
            if isinstance(lim, int | float):
                limit_with_margin(float(lim), self.memory_margin)
        except ValueError as e:
            raise OptPipeConfigError(f"memory_margin: {e}") from None
        if self.profile_steps < 0:
            raise OptPipeConfigError("profile_steps must be >= 0")
        if not isinstance(self.calibrate_every, int) or self.calibrate_every < 1:
            raise OptPipeConfigError(
                f"calibrate_every must be an integer >= 1, got {self.calibrate_every!r} "
                "(turn calibration off with calibrate=False)"
            )
        b = self.calibrate_budget
        if b is not None and (not isinstance(b, int | float) or not 0 < b <= 1):
            raise OptPipeConfigError(
                f"calibrate_budget must be a share of the time in (0, 1] or None, got {b!r}"
            )
        if not isinstance(self.calibrate_min_steps, int) or self.calibrate_min_steps < 1:
            raise OptPipeConfigError(
                f"calibrate_min_steps must be an integer >= 1, got {self.calibrate_min_steps!r}"
            )

    @property
    def chunks(self) -> tuple[int, Placement]:
        """(chunks per device, placement) the schedule runs with."""
        return chunks_for(self.schedule, self.num_chunks, self.placement)


def check_microbatches(m: int, p: int) -> None:
    if m < p:
        raise OptPipeConfigError(
            f"num_microbatches={m} is fewer than num_stages={p}: the pipeline never fills and "
            f"every schedule here needs at least one microbatch per stage; use >= {p} "
            f"(2x stages or more is better)"
        )


def check_sizes(options: PipelineOptions, world_size: int, num_stages: int) -> None:
    """World size vs stages x replicas, microbatches vs stages, the named schedule's shape
    (with ``num_microbatches="auto"`` the count is chosen, and checked, on the first batch)."""
    p, d, m = num_stages, options.data_parallel, options.num_microbatches
    if world_size % p != 0 or world_size // p != d:
        raise OptPipeConfigError(
            f"world size {world_size} does not equal num_stages={p} x data_parallel={d}; use "
            f"{p * d} devices or change num_stages/data_parallel"
        )
    if not isinstance(m, int):
        return
    check_microbatches(m, p)
    if options.schedule != "optimal":
        # the shape rules of the named schedule (chunks, placement, microbatch count)
        v, placement = options.chunks
        shape = initial_problem(p, m, v, placement, [1.0] * (p * v))
        try:
            choose_schedule(options.schedule, shape)
        except NoScheduleError as e:
            raise OptPipeConfigError(
                f"{e}; change num_microbatches/num_stages or the schedule"
            ) from None


def check_layers(options: PipelineOptions, num_layers: int, num_stages: int) -> None:
    """The layer groups (stages x chunks) against the model's layers, or the user's partition."""
    v, _ = options.chunks
    groups = num_stages * v
    if options.partition is not None:
        validate_partition(options.partition, num_layers, groups)
    elif groups > num_layers:
        most = num_layers // num_stages
        raise PartitionError(
            f"{num_stages} stages x {v} chunks = {groups} layer groups but the model gives only "
            f"{num_layers} layers; "
            + (f"use num_chunks <= {most}, " if v > 1 and most >= 1 else "")
            + "fewer stages, or split the model into more layers"
        )
