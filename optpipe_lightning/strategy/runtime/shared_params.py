"""Parameters shared by layers on different pipeline ranks (tied embeddings), trained as one.

A parameter that several layers use (the input embedding and the LM head sharing one weight)
is one tensor on one device. In the pipeline, when those layers sit in layer groups of different
ranks, every such rank holds its own copy and computes only its layers' part of the gradient.
As torchtitan and Megatron-LM do for tied embeddings, after each pipeline step the holders sum
their parts (an all-reduce among the holders only, in a process group of their own), so
every copy gets the whole gradient one device computes; the optimizer then makes the same update
on every copy, and the copies stay equal (they start equal: the first holder's values are
broadcast when the engine is built; a holder whose copy a sharded model dropped gets storage
for them). Layer groups of one rank (the V placement's first and last
group) share the tensor itself: autograd sums there already. Norm clipping counts a shared
parameter once (on its first holder).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ...schedule import Problem
from ..planning.partition import group_bounds


@dataclass(frozen=True)
class SharedParameter:
    name: str  # the first layer's (layer index and parameter name), for messages
    param: nn.Parameter
    holders: tuple[int, ...]  # pipeline ranks whose layer groups use it, ascending


def shared_parameters(
    layers: Sequence[nn.Module], partition: Sequence[int], problem: Problem
) -> list[SharedParameter]:
    """Parameters used by layers on two or more pipeline ranks, in the layers' order (every rank
    computes the same list)."""
    bounds = group_bounds(partition)
    rank_of_layer: list[int] = []
    for g, (a, b) in enumerate(bounds):
        rank_of_layer += [problem.group_table[g][0]] * (b - a)
    found: dict[int, tuple[str, nn.Parameter, set[int]]] = {}
    for i, layer in enumerate(layers):
        for n, p in layer.named_parameters():
            if not p.requires_grad:
                continue
            entry = found.setdefault(id(p), (f"layer {i} ({type(layer).__name__}).{n}", p, set()))
            entry[2].add(rank_of_layer[i])
    return [
        SharedParameter(name, p, tuple(sorted(ranks)))
        for name, p, ranks in found.values()
        if len(ranks) > 1
    ]


class SharedGradients:
    """This rank's part in keeping the shared parameters one parameter.

    The holders of a shared parameter talk in a process group of their own (one per holder set
    and pipeline replica, made when the engine is built, by every rank of the world in one
    order, as ``process_groups.make_groups`` makes the pipelines: world rank ``r * p + s`` is
    stage ``s`` of replica ``r``), so a tied embedding's gradient crosses only the ranks that
    hold it.
    """

    def __init__(self, shared: Sequence[SharedParameter], pp_rank: int, num_stages: int) -> None:
        self.shared = list(shared)
        self.pp_rank = pp_rank
        self.groups: dict[tuple[int, ...], Any] = {}
        if not self.active:
            return
        p = num_stages
        replicas = dist.get_world_size() // p
        mine = dist.get_rank() // p
        for holders in dict.fromkeys(s.holders for s in self.shared):
            for r in range(replicas):
                group = dist.new_group([r * p + h for h in holders])
                if r == mine and pp_rank in holders:
                    self.groups[holders] = group

    @property
    def active(self) -> bool:
        return bool(self.shared) and dist.is_available() and dist.is_initialized()

    def not_counted(self) -> list[nn.Parameter]:
        """Shared parameters whose norm another rank counts (norm clipping)."""
        return [s.param for s in self.shared if self.pp_rank in s.holders[1:]]

    def _held(self) -> list[tuple[SharedParameter, Any]]:
        return [(s, self.groups[s.holders]) for s in self.shared if s.holders in self.groups]

    def allocate_dropped(self, device: torch.device) -> None:
        """A holder whose copy is on the meta device (a sharded model drops the layer that
        registers the weight on the ranks that do not run it) gets storage on ``device``;
        ``broadcast_weights`` then fills it. Call before the layers move to the device."""
        self._had_values = {}
        for s, _group in self._held():
            p = s.param
            self._had_values[id(p)] = not p.is_meta
            if p.is_meta:
                new = nn.Parameter(torch.empty_like(p, device=device), p.requires_grad)
                torch.utils.swap_tensors(p, new)

    def broadcast_weights(self) -> None:
        """Every holder takes the values of the first holder that has them (a collective of
        the holders)."""
        had = getattr(self, "_had_values", {})
        for s, group in self._held():
            n = len(s.holders)
            mine = s.holders.index(self.pp_rank) if had.get(id(s.param), True) else n
            src = torch.tensor([mine], dtype=torch.long, device=s.param.device)
            dist.all_reduce(src, op=dist.ReduceOp.MIN, group=group)
            if int(src) == n:
                raise RuntimeError(f"no rank holds the values of shared parameter {s.name}")
            dist.broadcast(s.param.data, group=group, group_src=int(src))

    def grads_before(self) -> list[torch.Tensor | None]:
        """The shared parameters' ``.grad`` before a step (what earlier steps accumulated)."""
        return [
            s.param.grad.detach().clone() if s.param.grad is not None else None for s in self.shared
        ]

    def sum_gradients(self, before: Sequence[torch.Tensor | None]) -> None:
        """What this step added to each holder's ``.grad`` becomes the sum of what it added on
        all holders (a collective of the holders; ``before``: ``grads_before()``, so gradients
        accumulated over earlier steps are not summed again)."""
        olds = {id(s.param): old for s, old in zip(self.shared, before, strict=True)}
        for s, group in self._held():
            p, old = s.param, olds[id(s.param)]
            if p.grad is None:
                delta = torch.zeros_like(p)
            else:
                delta = p.grad.detach() - old if old is not None else p.grad.detach().clone()
            dist.all_reduce(delta, group=group)
            p.grad = delta if old is None else old + delta
