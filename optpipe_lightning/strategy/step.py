"""The training step around the pipeline: gradients handed to Lightning, replicas, clipping.

Lightning calls ``training_step``, then zeroes the gradients (``optimizer.zero_grad`` runs
between the step and ``backward``), then ``backward``. The pipeline runs forward and backward
inside the step, so ``GradientHandover`` runs it on fresh ``.grad``, keeps its gradients aside,
restores what was there, and adds them in ``backward`` (accumulation over batches works as on
one device). Data-parallel replicas average gradients and loss after the step; norm clipping
takes the 2-norm over every stage's gradients (one all-reduce over the pipeline).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .process_groups import PipelineComm

T = TypeVar("T")


class GradientHandover:
    """Gradients made inside the step, held until Lightning's ``backward`` asks for them."""

    def __init__(self) -> None:
        self._params: list[nn.Parameter] = []
        self._pending: list[Tensor | None] | None = None

    def run(self, params: Sequence[nn.Parameter], fn: Callable[[], T]) -> T:
        """``fn()`` on fresh ``.grad``; its gradients are held, the old ones put back."""
        old = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            out = fn()
            self._params = list(params)
            self._pending = [p.grad for p in params]
        finally:
            for p, g in zip(params, old, strict=True):
                p.grad = g
        return out

    def give(self) -> None:
        """Add the held gradients to ``.grad`` (Lightning's ``backward``)."""
        if self._pending is None:
            return
        for p, g in zip(self._params, self._pending, strict=True):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
        self._pending = None


def average_over_replicas(
    params: Sequence[nn.Parameter], loss: Tensor, comm: PipelineComm
) -> Tensor:
    """Gradients (in ``.grad``) and the loss averaged over the data-parallel replicas."""
    if comm.dp_group is None:
        return loss
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=comm.dp_group)
            p.grad.div_(comm.data_parallel)
    dist.all_reduce(loss, group=comm.dp_group)
    return loss / comm.data_parallel


def clip_grad_norm_over_pipeline(
    params: Sequence[nn.Parameter], clip_val: float, comm: PipelineComm | None, device: torch.device
) -> None:
    """``clip_grad_norm_`` with the 2-norm over every stage's gradients (one all-reduce)."""
    grads = [p.grad for p in params if p.grad is not None]
    sq = torch.zeros(1, device=device)
    for g in grads:
        sq += g.detach().float().pow(2).sum()
    if comm is not None and comm.distributed and comm.pp_group is not None:
        dist.all_reduce(sq, group=comm.pp_group)
    coef = torch.clamp(float(clip_val) / (sq.sqrt() + 1e-6), max=1.0)
    for g in grads:
        g.detach().mul_(coef.to(g.dtype))
