"""Profiling's end and the changes of layout it may lead to (every rank, same step).

``finish_profiling`` builds the profile after the profiling steps, may re-balance the layer
groups by the measured per-layer costs first (``repartition``: profiling starts again on the new
partition), and adopts the schedule chosen on the profiled problem; ``reprofile`` goes back to
profiling when a stored profile turns out not to describe this run; ``rechunk`` runs a chosen
schedule's chunking. Layers move with their parameters and optimizer state
(``move_layers_to``), so the numbers do not change. Each takes the fit's ``Scheduler`` (``Host``: what they use of it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.optim import Optimizer

from ...schedule import Problem, Schedule
from ...schedule.profile import Profile
from ..planning.partition import PartitionError, chunked_partition, stage_layers
from ..planning.planner import NoScheduleError, Placement, profiling_schedule
from ..records.step_records import StepRecords
from ..runtime.contract import PipelineSpec
from ..runtime.engine import PipelineEngine
from ..runtime.materialize import layer_owners, move_layers
from ..runtime.process_groups import PipelineComm
from .calibration import Calibrator
from .forward_pipelines import ForwardPipelines
from .pipeline_problem import chunking
from .profiler import profile_pipeline
from .repartition import move_to_partition, profiled_partition


class Host(Protocol):
    """What these functions read and change of the fit's ``Scheduler``."""

    engine: PipelineEngine | None
    spec: PipelineSpec
    comm: PipelineComm
    device: torch.device
    module: nn.Module | None
    optimizers: Callable[[], Sequence[Optimizer]]
    notify: Callable[[str, bool], None]
    partition: list[int]
    num_chunks: int
    placement: Placement
    phase: str
    optimizer_steps: int
    predicted: float | None
    switches: list[dict[str, Any]]
    profile: Profile | None
    records: StepRecords
    calibrator: Calibrator
    forward: ForwardPipelines
    sharded: bool
    _hardware: Any
    _model_fp: Any
    _profiled_steps: int
    _profile_walls: list[float]
    _may_repartition: bool

    def shape_problem(self, num_microbatches: int | None = None) -> Problem: ...
    def memory_limit(self, local_params: list[nn.Parameter]) -> list[float] | None: ...
    def problem_from_profile(self, profile: Profile) -> Problem: ...
    def new_engine(self, problem: Problem, schedule: Schedule, measure: bool) -> PipelineEngine: ...
    def adopt(self, problem: Problem, reason: str) -> None: ...
    def adopt_stored(self, profile_json: str) -> None: ...
    def _stored_profile(self) -> str | None: ...


def reprofile(s: Host, off: float, record: dict[str, Any]) -> None:
    """Every rank, same step: leave the stored profile's schedule for the profiling
    schedule; ``finish_profiling`` then stores the new profile and adopts a schedule."""
    assert s.engine is not None
    s.notify(
        f"optpipe: step {s.optimizer_steps}: the stored profile predicts "
        f"{1e3 * record['previous_seconds']:.4g} ms per step, the steps take "
        f"{1e3 * record['measured_seconds']:.4g} ms ({off:+.0%}): profiling again",
        False,
    )
    s.switches.append(
        {
            "step": s.optimizer_steps,
            "from": s.engine.schedule.generator,
            "to": "optpipe-profiling",
            "reason": f"stored profile off by {off:+.0%}",
            "predicted_seconds": None,
        }
    )
    base = s.shape_problem()
    s.engine = s.new_engine(base, profiling_schedule(base), measure=True)
    s.calibrator.sampler.reset()
    s.calibrator.overhead_in_problem = 0.0
    s.phase = "profiling"
    s.profile = None
    s.predicted = None
    s._profiled_steps = 0
    s._profile_walls = []


def finish_profiling(s: Host, module: nn.Module, optimizers: Sequence[Optimizer]) -> None:
    assert s.engine is not None
    if s._may_repartition and repartition(s, module, optimizers):
        s._profiled_steps = 0
        s._profile_walls = []
        stored_json = s._stored_profile()
        if stored_json is None:
            return  # profile again, on the new partition
        s.adopt_stored(stored_json)
        return
    s.engine.instrument_layers(False)
    profile, overhead = profile_pipeline(
        s.engine, s.comm, s._hardware, s._model_fp, s._profile_walls
    )
    s.calibrator.overhead_in_problem = overhead
    s.notify(f"optpipe: runtime overhead {1e3 * overhead:.3g} ms per action", True)
    if (log := s.records.active) is not None:
        log.store_profile(profile)
    s.profile = profile
    s.adopt(s.problem_from_profile(profile), "profiled")


def repartition(s: Host, module: nn.Module, optimizers: Sequence[Optimizer]) -> bool:
    """Re-balance the layer groups by the profiled per-layer costs (once, when it pays)."""
    assert s.engine is not None
    s._may_repartition = False
    limits = s.memory_limit(s.engine.parameters)
    decision = profiled_partition(
        s.engine,
        s.comm,
        len(s.spec.layers),
        s.comm.num_stages * s.num_chunks,
        s.partition,
        min(limits) if limits else None,
    )
    if decision.partition is None:
        return False
    old = s.partition
    assert s._model_fp is not None
    new = list(decision.partition)
    move_layers_to(s, module, optimizers, new, s.num_chunks, s.placement, measure=True)
    s.switches.append(
        {
            "step": s.optimizer_steps,
            "from": "optpipe-profiling",
            "to": "optpipe-profiling",
            "reason": f"repartitioned {old} -> {s.partition}",
            "predicted_seconds": None,
        }
    )
    s.notify(
        f"optpipe: step {s.optimizer_steps}: layer groups {old} -> {s.partition} "
        f"(profiled per-layer costs: {decision.reason})",
        False,
    )
    return True


def rechunk(s: Host, problem: Problem) -> None:
    """Run ``problem``'s chunking: each device keeps its layers, split into its chunks
    (``partition.chunked_partition``); parameters and optimizer state move to their new
    ranks as in a re-partition, so the numbers do not change."""
    assert s.engine is not None and s.module is not None
    v, placement = chunking(problem)
    old = list(s.partition)
    shape = s.engine.problem
    layers = stage_layers(s.partition, shape)
    try:
        new = chunked_partition(layers, v, placement)
    except PartitionError as e:
        raise NoScheduleError(f"the chosen schedule runs {v} chunks per device: {e}") from None
    move_layers_to(s, s.module, s.optimizers(), new, v, placement, measure=False)
    s.notify(
        f"optpipe: step {s.optimizer_steps}: layer groups {old} -> {new} ({v} chunks per "
        f"device, {placement} placement)",
        False,
    )


def move_layers_to(
    s: Host,
    module: nn.Module,
    optimizers: Sequence[Optimizer],
    partition: list[int],
    num_chunks: int,
    placement: Placement,
    measure: bool,
) -> None:
    """Move the layers to ``partition`` in ``num_chunks`` chunks per device (parameters and
    optimizer state go to their new ranks: the numbers do not change); a new engine runs
    the profiling schedule on the new layout until the next schedule is adopted."""
    assert s.engine is not None
    s.engine.finish_loss_handout()
    if s.sharded:
        p, n = s.comm.num_stages, len(s.spec.layers)
        old = layer_owners(n, s.partition, p, s.num_chunks, s.placement)
        new = layer_owners(n, partition, p, num_chunks, placement)
        move_layers(module, s.spec.layers, optimizers, old, new, s.comm, s.device)
    else:
        move_to_partition(module, optimizers, s.engine, s.comm, s.device)
    s.partition, s.num_chunks, s.placement = partition, num_chunks, placement
    if s._model_fp is not None:
        update = {"num_chunks": num_chunks, "partition": partition, "placement": placement}
        s._model_fp = s._model_fp.model_copy(update=update)
    s.engine.instrument_layers(False)
    base = s.shape_problem()
    s.engine = s.new_engine(base, profiling_schedule(base), measure=measure)
    s.forward.clear()
