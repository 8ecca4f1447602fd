"""Parameters shared by layers on different pipeline ranks (tied embeddings), trained as one.

A parameter that several layers use (the input embedding and the LM head sharing one weight)
is one tensor on one device. In the pipeline, when those layers sit in layer groups of different
ranks, every such rank holds its own copy and computes only its layers' part of the gradient.
As torchtitan and Megatron-LM do for tied embeddings, after each pipeline step the holders sum
their parts (an all-reduce over the pipeline group; ranks that do not hold it add zeros), so
every copy gets the whole gradient one device computes; the optimizer then makes the same update
on every copy, and the copies stay equal (they start equal: the first holder's values are
broadcast when the engine is built). Layer groups of one rank (the V placement's first and last
group) share the tensor itself: autograd sums there already. Norm clipping counts a shared
parameter once (on its first holder).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    """This rank's part in keeping the shared parameters one parameter."""

    def __init__(self, shared: Sequence[SharedParameter], pp_rank: int, pp_group: object) -> None:
        self.shared = list(shared)
        self.pp_rank = pp_rank
        self.pp_group = pp_group

    @property
    def active(self) -> bool:
        return bool(self.shared) and dist.is_available() and dist.is_initialized()

    def not_counted(self) -> list[nn.Parameter]:
        """Shared parameters whose norm another rank counts (norm clipping)."""
        return [s.param for s in self.shared if self.pp_rank in s.holders[1:]]

    def broadcast_weights(self, device: torch.device) -> None:
        """Every holder takes the first holder's values (a collective over the pipeline)."""
        if not self.active:
            return
        for s in self.shared:
            p = s.param
            mine = self.pp_rank in s.holders
            buf = p.data if mine else torch.empty(p.shape, dtype=p.dtype, device=device)
            dist.broadcast(buf, group=self.pp_group, group_src=s.holders[0])  # type: ignore[arg-type]

    def grads_before(self) -> list[torch.Tensor | None]:
        """The shared parameters' ``.grad`` before a step (what earlier steps accumulated)."""
        return [
            s.param.grad.detach().clone() if s.param.grad is not None else None for s in self.shared
        ]

    def sum_gradients(self, device: torch.device, before: Sequence[torch.Tensor | None]) -> None:
        """What this step added to each holder's ``.grad`` becomes the sum of what it added on
        all holders (a collective; ``before``: ``grads_before()``, so gradients accumulated over
        earlier steps are not summed again)."""
        if not self.active:
            return
        for s, old in zip(self.shared, before, strict=True):
            p = s.param
            mine = self.pp_rank in s.holders
            if mine and p.grad is not None:
                delta = p.grad.detach() - old if old is not None else p.grad.detach().clone()
            else:
                delta = torch.zeros(p.shape, dtype=p.dtype, device=p.device if mine else device)
            dist.all_reduce(delta, group=self.pp_group)
            if mine:
                p.grad = delta if old is None else old + delta
