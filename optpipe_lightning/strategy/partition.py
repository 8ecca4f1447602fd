"""Stage partitioning: contiguous layer groups balanced by per-layer cost and memory.

``balanced_partition(costs, num_groups, memory=..., memory_limit=...)`` splits layers (in model
order) into ``num_groups`` contiguous groups minimising the largest group cost (exact dynamic
programme, O(groups * layers^2)); with per-layer memory and a limit, groups over the limit are not
allowed. ``validate_partition`` checks a user-given partition (number of layers per group).
"""

from __future__ import annotations

from collections.abc import Sequence


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
