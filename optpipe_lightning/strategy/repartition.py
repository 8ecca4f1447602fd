"""Re-balancing the layer groups by the profiled per-layer costs (once per run, when it pays).

During the first profiling steps the engine times every layer's forward and attributes saved
bytes to it (``PipelineEngine.instrument_layers``). ``profiled_partition`` gathers those costs to
global rank 0, which splits the layers again (``partition.balanced_partition``; with a memory
limit a group must hold ``num_stages`` microbatches of its layers' saved bytes, a 1F1B-like
peak) and keeps the new partition when it lowers the largest group's cost by at least
``REPARTITION_GAIN``; every rank gets the decision. ``move_to_partition`` then collects the whole
model and optimizer state on every rank (what a checkpoint does), so the numbers do not change
when the layers move to their new ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.optim import Optimizer

from .checkpoint import full_state_dict, load_optimizer_states, merged_optimizer_state
from .partition import PartitionError, balanced_partition
from .process_groups import PipelineComm

if TYPE_CHECKING:
    from .engine import PipelineEngine

REPARTITION_GAIN = 0.10


def profiled_partition(
    engine: PipelineEngine,
    comm: PipelineComm,
    num_layers: int,
    num_groups: int,
    current: Sequence[int],
    memory_limit: float | None,
) -> list[int] | None:
    """The better partition by profiled per-layer costs, or None (a collective: every rank)."""
    merged: dict[int, tuple[float, float]] = {}
    for part in comm.gather(engine.layer_costs()):
        merged.update(part)
    decision: list[int] | None = None
    if comm.is_global_zero and len(merged) == num_layers and all(c > 0 for c, _ in merged.values()):
        costs = [merged[i][0] for i in range(num_layers)]
        # memory: a group holds up to num_stages microbatches' activations (1F1B-like peak)
        memory = [merged[i][1] * comm.num_stages for i in range(num_layers)]
        try:
            new = balanced_partition(costs, num_groups, memory=memory, memory_limit=memory_limit)
        except PartitionError:
            new = list(current)  # nothing fits better; the schedule may still offload
        if new != list(current) and _worst(costs, new) < _worst(costs, current) * (
            1 - REPARTITION_GAIN
        ):
            decision = new
    return comm.broadcast(decision)


def move_to_partition(
    module: nn.Module,
    optimizers: Sequence[Optimizer],
    engine: PipelineEngine,
    comm: PipelineComm,
    device: torch.device,
) -> None:
    """Every rank's module and optimizers take the whole trained state (before the layers move)."""
    state = full_state_dict(module, engine, comm)
    opt_states = [merged_optimizer_state(o, engine, comm) for o in optimizers]
    for chain in engine.local_modules:
        chain.to("cpu")
    module.load_state_dict(state)
    load_optimizer_states(optimizers, opt_states, device)


def _worst(costs: Sequence[float], sizes: Sequence[int]) -> float:
    out, start = 0.0, 0
    for size in sizes:
        out = max(out, sum(costs[start : start + size]))
        start += size
    return out
