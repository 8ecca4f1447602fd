"""Stage partitioning: contiguous layer groups balanced by per-layer cost and memory.

``balanced_partition(costs, num_groups, memory=..., memory_limit=...)`` splits layers (in model
order) into ``num_groups`` contiguous groups minimising the largest group cost (exact dynamic
programme, O(groups * layers^2)); with per-layer memory and a limit, groups over the limit are not
allowed. ``validate_partition`` checks a user-given partition (number of layers per group).

``chunked_partition`` is the partition a chunk count implies: every device keeps its layers,
split into ``v`` chunks of equal layer counts, placed by the problem's placement (what a problem
re-chunked from ``layers_per_stage`` describes: per chunk, a v-th of the stage's costs);
``chunk_counts`` lists the counts a stage partition allows, and ``runnable_chunkings`` the
(chunk count, placement) pairs the executor can run for a problem's layers: what the strategy
lets the solver choose from (``solve(chunkings=...)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from ...schedule import Problem


class PartitionError(ValueError):
    """The layers cannot be split as asked; the message names the fix."""


def validate_partition(sizes: Sequence[int], num_layers: int, num_groups: int) -> list[int]:
    sizes = [int(x) for x in sizes]
    if len(sizes) != num_groups:
        raise PartitionError(
            f"partition has {len(sizes)} groups, the schedule needs {num_groups} "
            "(stages x chunks); give one layer count per group"
        )
    if any(x < 1 for x in sizes):
        raise PartitionError(f"partition {sizes} has an empty group; every group needs >= 1 layer")
    if sum(sizes) != num_layers:
        raise PartitionError(
            f"partition {sizes} covers {sum(sizes)} layers, the model has {num_layers}"
        )
    return sizes


def balanced_partition(
    costs: Sequence[float],
    num_groups: int,
    memory: Sequence[float] | None = None,
    memory_limit: float | None = None,
) -> list[int]:
    """Layer counts per group minimising the max group cost (memory limit respected if given)."""
    n = len(costs)
    if num_groups > n:
        raise PartitionError(
            f"{num_groups} pipeline groups (stages x chunks) but the model has only {n} layers; "
            "use fewer stages or chunks, or split the model into more layers"
        )
    if num_groups < 1:
        raise PartitionError("num_groups must be >= 1")
    pre = [0.0]
    for c in costs:
        pre.append(pre[-1] + float(c))
    mpre = [0.0]
    for m in memory or [0.0] * n:
        mpre.append(mpre[-1] + float(m))
    inf = float("inf")

    def ok(i: int, j: int) -> bool:
        return memory_limit is None or mpre[j] - mpre[i] <= memory_limit

    # best[g][j]: min over splits of layers[:j] into g groups of the max group cost
    best = [[inf] * (n + 1) for _ in range(num_groups + 1)]
    cut = [[0] * (n + 1) for _ in range(num_groups + 1)]
    best[0][0] = 0.0
    for g in range(1, num_groups + 1):
        for j in range(g, n - (num_groups - g) + 1):
            for i in range(g - 1, j):
                if best[g - 1][i] == inf or not ok(i, j):
                    continue
                val = max(best[g - 1][i], pre[j] - pre[i])
                # tie-break towards earlier cuts being larger is irrelevant; keep first found
                if val < best[g][j] - 1e-15:
                    best[g][j] = val
                    cut[g][j] = i
    if best[num_groups][n] == inf:
        raise PartitionError(
            f"no split of {n} layers into {num_groups} groups fits the memory limit "
            f"{memory_limit:g} bytes per group; raise the limit or add stages"
        )
    sizes = []
    j = n
    for g in range(num_groups, 0, -1):
        i = cut[g][j]
        sizes.append(j - i)
        j = i
    return sizes[::-1]


def group_bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) layer indices of each group."""
    out = []
    start = 0
    for s in sizes:
        out.append((start, start + s))
        start += s
    return out


def stage_layers(partition: Sequence[int], problem: Problem) -> list[int]:
    """Layers per device of a partition laid out as ``problem`` places its layer groups."""
    out = [0] * problem.num_stages
    for g, (s, _) in enumerate(problem.group_table):
        out[s] += partition[g]
    return out


def chunk_counts(layers_per_stage: Sequence[int]) -> list[int]:
    """The chunk counts every stage's layers divide into."""
    g = math.gcd(*layers_per_stage)
    return [v for v in range(1, g + 1) if g % v == 0]


def chunked_partition(
    layers_per_stage: Sequence[int],
    num_chunks: int,
    placement: Literal["interleaved", "vshape"] = "interleaved",
) -> list[int]:
    """Layers per layer group (model order) when each stage's layers split into ``v`` chunks."""
    p, v = len(layers_per_stage), num_chunks
    if v < 1 or any(n % v for n in layers_per_stage):
        raise PartitionError(
            f"{v} chunks per device need every stage's layer count {list(layers_per_stage)} to "
            f"divide by {v}; these layers allow {chunk_counts(layers_per_stage)} chunks"
        )
    shape = Problem(
        num_stages=p, num_microbatches=p, num_chunks=v, placement=placement, t_f=1, t_b=1, t_w=1
    )
    sizes = [0] * (p * v)
    for g, (s, _) in enumerate(shape.group_table):
        sizes[g] = layers_per_stage[s] // v
    return sizes


def runnable_chunkings(problem: Problem) -> list[tuple[int, Literal["interleaved", "vshape"]]]:
    """The (chunk count, placement) pairs the executor can run ``problem``'s pipeline in, its
    own first: every count dividing each device's layers (``problem.layers()``: the strategy
    re-chunks by ``chunked_partition``), in both placements from two chunks on; only the
    problem's own chunking when it gives no layer counts."""
    own = (problem.num_chunks, problem.placement if problem.num_chunks > 1 else "interleaved")
    out: list[tuple[int, Literal["interleaved", "vshape"]]] = [own]
    layers = problem.layers()
    if layers is None:
        return out
    for v in chunk_counts(layers):
        placements: tuple[Literal["interleaved", "vshape"], ...] = (
            ("interleaved", "vshape") if v > 1 else ("interleaved",)
        )
        for pl in placements:
            if (v, pl) not in out:
                chunked_partition(layers, v, pl)  # the partition it runs with exists
                out.append((v, pl))
    return out
