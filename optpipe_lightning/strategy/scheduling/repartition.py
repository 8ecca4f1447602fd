"""Re-balancing the layer groups by the profiled per-layer costs (once per run, when it pays).

During the first profiling steps the engine times every layer's forward and attributes saved
bytes to it (``PipelineEngine.instrument_layers``). ``profiled_partition`` gathers those costs to
global rank 0, which decides (``decide_partition``) and tells every rank. The decision never
follows noise:

- **identical layers cost the same**: layers with the same identity (class, parameter and buffer
  shapes, input and output shapes) are priced at the mean of their measured costs, so a
  stack of equal blocks stays split evenly whatever the timing noise;
- **the gain must beat the spread**: the new partition must lower the largest group's cost by
  more than ``REPARTITION_GAIN`` *and* by more than the measured spread: half the interquartile
  range of each group's per-microbatch cost relative to its median (every group of the old and
  the new partition), and how far identical layers' measured costs lie apart, weighted by their share
  of the cost (a difference between equal layers is noise by definition, e.g. one rank sharing
  its core with another process).

With a memory limit a group must hold ``num_stages`` microbatches of its layers' saved bytes
(a 1F1B-like peak). ``move_to_partition`` then collects the whole model and optimizer state on
every rank (what a checkpoint does), so the numbers do not change when the layers move.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.optim import Optimizer

from ..planning.partition import PartitionError, balanced_partition
from ..runtime.checkpoint import full_state_dict, load_optimizer_states, merged_optimizer_state
from ..runtime.process_groups import PipelineComm

if TYPE_CHECKING:
    from ..runtime.engine import PipelineEngine

log = logging.getLogger(__name__)

REPARTITION_GAIN = 0.10


@dataclass(frozen=True)
class PartitionDecision:
    """What rank 0 decided from the profiled layer costs (the same on every rank)."""

    partition: list[int] | None  # the new layer counts per group; None: keep the current one
    gain: float  # predicted relative drop of the largest group's cost (0 when nothing better)
    spread: float  # the measured relative spread the gain had to beat
    reason: str


def pooled_costs(costs: Sequence[float], identities: Sequence[str | None]) -> list[float]:
    """Each layer's cost, identical layers (same identity) at the mean of their costs."""
    groups: dict[str, list[int]] = {}
    for i, ident in enumerate(identities):
        if ident is not None:
            groups.setdefault(ident, []).append(i)
    out = [float(c) for c in costs]
    for idx in groups.values():
        if len(idx) > 1:
            mean = statistics.fmean(costs[i] for i in idx)
            for i in idx:
                out[i] = mean
    return out


def identical_spread(costs: Sequence[float], identities: Sequence[str | None]) -> float:
    """How far identical layers' measured costs lie apart: for each set of identical layers
    (max - min) / mean, weighted by the set's share of the total cost (noise on layers that
    cost little moves no group); the largest over the sets (0 without any)."""
    groups: dict[str, list[float]] = {}
    for c, ident in zip(costs, identities, strict=True):
        if ident is not None:
            groups.setdefault(ident, []).append(float(c))
    total = sum(float(c) for c in costs)
    worst = 0.0
    for cs in groups.values():
        mean = statistics.fmean(cs)
        if len(cs) > 1 and mean > 0 and total > 0:
            worst = max(worst, (max(cs) - min(cs)) / mean * sum(cs) / total)
    return worst


def group_spread(samples: Sequence[Sequence[float]], sizes: Sequence[int]) -> float:
    """The largest half interquartile range of a group's per-microbatch cost (the sum of its
    layers' k-th samples) relative to its median, over the groups of ``sizes`` (the +- band
    around the median half the samples fall in); 0 with fewer than 4 samples."""
    n = min((len(s) for s in samples), default=0)
    if n < 4:
        return 0.0
    worst, start = 0.0, 0
    for size in sizes:
        per_mb = [sum(samples[i][k] for i in range(start, start + size)) for k in range(n)]
        start += size
        q1, med, q3 = statistics.quantiles(per_mb, n=4)
        if med > 0:
            worst = max(worst, (q3 - q1) / (2 * med))
    return worst


def decide_partition(
    costs: Sequence[float],
    num_groups: int,
    current: Sequence[int],
    *,
    samples: Sequence[Sequence[float]] | None = None,
    identities: Sequence[str | None] | None = None,
    memory: Sequence[float] | None = None,
    memory_limit: float | None = None,
    min_gain: float = REPARTITION_GAIN,
) -> PartitionDecision:
    """The partition to move to, or None: identical layers priced alike, and a gain larger than
    both ``min_gain`` and the measured spread (see the module doc). Pure: numbers in."""
    n = len(costs)
    idents = list(identities) if identities is not None else [None] * n
    pooled = pooled_costs(costs, idents)
    try:
        new = balanced_partition(pooled, num_groups, memory=memory, memory_limit=memory_limit)
    except PartitionError:
        return PartitionDecision(None, 0.0, 0.0, "no better split fits the memory limit")
    old_worst, new_worst = _worst(pooled, current), _worst(pooled, new)
    gain = 1.0 - new_worst / old_worst if old_worst > 0 else 0.0
    spread = identical_spread(costs, idents)
    if samples is not None:
        spread = max(spread, group_spread(samples, current), group_spread(samples, new))
    if new == list(current) or gain <= 0:
        return PartitionDecision(None, 0.0, spread, "the current partition is balanced")
    if gain <= min_gain or gain <= spread:
        return PartitionDecision(
            None,
            gain,
            spread,
            f"{new} would be {100 * gain:.1f}% faster, not more than the "
            f"{100 * max(min_gain, spread):.1f}% it needs (the measured spread is "
            f"{100 * spread:.1f}%)",
        )
    return PartitionDecision(
        list(new), gain, spread, f"{100 * gain:.1f}% faster (measured spread {100 * spread:.1f}%)"
    )


def profiled_partition(
    engine: PipelineEngine,
    comm: PipelineComm,
    num_layers: int,
    num_groups: int,
    current: Sequence[int],
    memory_limit: float | None,
) -> PartitionDecision:
    """Rank 0's decision from every stage's profiled layer costs (a collective: every rank)."""
    merged: dict[int, tuple[float, float, list[float], str]] = {}
    for part in comm.gather(engine.layer_costs()):
        merged.update(part)
    decision = PartitionDecision(None, 0.0, 0.0, "not every layer was timed")
    if comm.is_global_zero and len(merged) == num_layers and all(v[0] > 0 for v in merged.values()):
        rows = [merged[i] for i in range(num_layers)]
        decision = decide_partition(
            [r[0] for r in rows],
            num_groups,
            current,
            samples=[r[2] for r in rows],
            identities=[r[3] for r in rows],
            # memory: a group holds up to num_stages microbatches' activations (1F1B-like peak)
            memory=[r[1] * comm.num_stages for r in rows],
            memory_limit=memory_limit,
        )
        if decision.partition is None:
            log.info("optpipe: layer groups %s kept: %s", list(current), decision.reason)
    out: PartitionDecision = comm.broadcast(decision)
    return out


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
