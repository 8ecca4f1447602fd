"""The scheduling problem of the pipeline being trained, from the options and what is measured.

Before profiling the problem is the pipeline's shape with unit-free costs proportional to the
layer groups' relative costs (``shape_problem``); after it, the profile's problem under the
memory limit (``memory_limit``, less the ``memory_margin``, ``schedule/margin.py``) with the
options applied (``profiled_problem``). The training microbatch count (``"auto"``: chosen here)
and the run's configuration as the run log records it are worked out here too. ``Scheduler``
(``scheduler.py``) holds the state these functions read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ...schedule import Problem
from ...schedule.margin import limit_with_margin
from ...schedule.profile import Profile
from ..planning.options import OptPipeConfigError, PipelineOptions
from ..planning.partition import stage_layers
from ..planning.planner import NoScheduleError, Placement, choose_schedule, initial_problem
from ..runtime.contract import PipelineSpec
from ..runtime.microbatch import choose_microbatches
from ..runtime.process_groups import PipelineComm


def with_margin(limits: list[float], margin: float | str) -> list[float]:
    """Every stage's limit less the margin (the same on every rank: the limits are)."""
    try:
        return [limit_with_margin(x, margin) for x in limits]
    except ValueError as e:
        raise OptPipeConfigError(f"memory_margin: {e}") from None


def chunking(problem: Problem) -> tuple[int, Placement]:
    """(chunks per device, placement); one chunk has no placement to speak of."""
    return problem.num_chunks, problem.placement if problem.num_chunks > 1 else "interleaved"


def shape_problem(
    spec: PipelineSpec,
    num_stages: int,
    partition: Sequence[int],
    num_microbatches: int,
    num_chunks: int,
    placement: Placement,
) -> Problem:
    """The pipeline's shape with costs proportional to the layer groups' relative costs."""
    costs = list(spec.layer_costs) if spec.layer_costs is not None else [1.0] * len(spec.layers)
    bounds, start = [], 0
    for size in partition:
        bounds.append(sum(costs[start : start + size]))
        start += size
    return initial_problem(num_stages, num_microbatches, num_chunks, placement, bounds)


def one_sample_layer(layers: Sequence[nn.Module], module: nn.Module | None) -> str | None:
    """The name of a layer that cannot train on one-sample microbatches (a ``BatchNorm1d`` in
    training mode: "Expected more than 1 value per channel"), or None."""
    names = {id(m): n for n, m in module.named_modules()} if module is not None else {}
    for layer in layers:
        for sub in layer.modules():
            if isinstance(sub, nn.BatchNorm1d) and sub.training:
                return f"{type(sub).__name__} {names.get(id(sub), '')!r}".replace(" ''", "")
    return None


def training_microbatches(
    options: PipelineOptions,
    num_stages: int,
    batch_size: int,
    shape: Callable[[int], Problem],
    min_samples: int = 1,
    one_sample_refused: str | None = None,
) -> int:
    """The training microbatch count for this batch size (``"auto"``: chosen here, the
    smallest count a named schedule runs with on the pipeline's ``shape``; among the counts
    that leave ``min_samples`` samples per microbatch when there are such: layers with batch
    statistics need two). ``one_sample_refused`` names a layer that cannot run on one sample
    (``one_sample_layer``): a count that leaves one is refused with one line naming the fix,
    before any rank runs the pipeline (it would fail inside one rank while the others wait)."""
    p, requested = num_stages, options.num_microbatches
    if isinstance(requested, int):
        if batch_size % requested != 0:
            fits = [m for m in range(p, batch_size + 1) if batch_size % m == 0]
            raise OptPipeConfigError(
                f"batch size {batch_size} does not divide into num_microbatches={requested}; "
                f"use a batch size that is a multiple of {requested} (and drop_last=True in "
                "the DataLoader)" + (f", or num_microbatches in {fits}" if fits else "")
            )
        if one_sample_refused and batch_size // requested < 2:
            fits = [m for m in range(p, batch_size // 2 + 1) if batch_size % m == 0]
            raise OptPipeConfigError(
                f"{one_sample_refused} cannot train on one-sample microbatches (batch size "
                f"{batch_size} in num_microbatches={requested}); use "
                + (f"num_microbatches in {fits}, " if fits else "")
                + f"a batch size of {2 * requested} or more, or LayerNorm/GroupNorm"
            )
        return requested
    if one_sample_refused and batch_size < 2 * p:
        raise OptPipeConfigError(
            f"{one_sample_refused} cannot train on one-sample microbatches, and batch size "
            f"{batch_size} on {p} stages leaves one sample per microbatch; use a batch size of "
            f"{2 * p} or more, fewer stages, or LayerNorm/GroupNorm"
        )

    def runs_with(m: int) -> bool:
        if options.schedule == "optimal":
            return True
        try:
            choose_schedule(options.schedule, shape(m))
        except NoScheduleError:
            return False
        return True

    if min_samples > 1:
        try:
            return choose_microbatches(
                batch_size, p, lambda m: batch_size // m >= min_samples and runs_with(m)
            )
        except ValueError:
            pass  # none leaves enough: the usual choice (the forward probe names the size)
    try:
        return choose_microbatches(batch_size, p, runs_with)
    except ValueError as e:
        raise OptPipeConfigError(str(e)) from None


def memory_limit(
    options: PipelineOptions,
    comm: PipelineComm,
    device: torch.device,
    local_params: list[nn.Parameter],
) -> list[float] | None:
    """Activation bytes per stage (``"auto"``: 90% of the device memory less parameters,
    gradients, optimizer state and what is allocated; unlimited on CPU), less the
    ``memory_margin`` (``schedule/margin.py``)."""
    opt = options.memory_limit
    if opt is None:
        return None
    if opt != "auto":
        limits = [float(opt)] * comm.num_stages
    elif device.type != "cuda":
        return None
    else:  # pragma: no cover - GPU only
        total = float(torch.cuda.get_device_properties(device).total_memory)
        # what stays allocated between steps: parameters, gradients and two Adam moments (4x
        # the parameters), or what is allocated now where that is more (it already holds
        # them after the first optimizer step: subtracting both counted the parameters twice)
        state = 4.0 * sum(p.numel() * p.element_size() for p in local_params)
        static = max(state, float(torch.cuda.memory_allocated(device)))
        mine = max(total * 0.9 - static, 1.0)
        limits = [float(x) for x in comm.gather(mine)]
    return with_margin(limits, options.memory_margin)


def profiled_problem(
    profile: Profile,
    limit: list[float] | None,
    options: PipelineOptions,
    partition: Sequence[int],
) -> Problem:
    """The profile's problem under ``limit`` with the options applied: no offload unless asked
    for; the layers per stage when the user set no chunking or partition."""
    problem: Problem = profile.to_problem(memory_limit=limit)
    if not options.offload and problem.offload is not None:
        problem = problem.with_changes(offload=None)
    o = options
    if o.num_chunks is None and o.placement is None and o.partition is None:
        # DESIGN's layers_per_stage: lets the solver choose the chunk count (re-chunk below);
        # a chunking or a partition the user set stays. Only where every device's layers
        # divide into the problem's own chunk count: uneven layer groups (6 layers in 2 x 2
        # groups: [2, 2, 1, 1], 3 per device) keep the chunking and the partition they run in
        per_stage = stage_layers(list(partition), problem)
        if all(n % problem.num_chunks == 0 for n in per_stage):
            problem = problem.with_changes(layers_per_stage=per_stage)
    return problem


def run_config(
    options: PipelineOptions,
    num_stages: int,
    num_microbatches: int | None,
    num_chunks: int,
    partition: list[int],
) -> dict[str, Any]:
    """The run's configuration, as the run log records it."""
    o = options
    return {
        "num_stages": num_stages,
        "num_microbatches": num_microbatches,
        "num_chunks": num_chunks,
        "schedule": o.schedule,
        "memory_limit": o.memory_limit if o.memory_limit != "auto" else "auto",
        "memory_margin": o.memory_margin,
        "offload": o.offload,
        "data_parallel": o.data_parallel,
        "partition": partition,
        "profile_steps": o.profile_steps,
        "online_resolve": o.online_resolve,
        "calibrate": o.calibrate,
        "calibrate_every": o.calibrate_every,
        "calibrate_min_steps": o.calibrate_min_steps,
    }
