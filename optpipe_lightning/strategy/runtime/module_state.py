"""Forwards that must leave no trace: torch's shape inference and the forward-is-the-chain probe.

torch's pipeline stages run each stage's forward once before the first step to learn the shapes
it sends (``_prepare_forward_infra``): stage 0 on the first microbatch, the other stages on
tensors made from the received shapes, in the module's training mode. A layer that updates a
buffer in its forward (BatchNorm's running statistics and ``num_batches_tracked``, a running
count) would then count a microbatch that never trained, or take statistics of meaningless
values. ``preserved_state`` runs such a forward and puts every buffer back (values copied back
through ``.data``, so autograd's version counters, which the backward shape inference checks,
do not move) and restores the random number generators (a dropout in it draws nothing the real
steps would have drawn).

``batch_stat_layers`` names the layers whose training forward uses batch statistics: under the
pipeline each microbatch is normalised by its own statistics and updates the running ones once,
in microbatch order, exactly as one device that accumulates gradients over the same
microbatches does (docs/strategy.md, "Layers with batch statistics").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def preserved_state(
    modules: Iterable[nn.Module], device: torch.device | None = None
) -> Iterator[None]:
    """Run the body, then put the modules' buffers and the RNG state back as they were."""
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    seen: set[int] = set()
    for m in modules:
        for b in m.buffers():
            if id(b) in seen or b.is_meta:
                continue
            seen.add(id(b))
            saved.append((b, b.detach().clone()))
    devices = [device] if device is not None and device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, enabled=True):
        try:
            yield
        finally:
            with torch.no_grad():
                for b, old in saved:
                    b.data.copy_(old)


def batch_stat_layers(layers: Iterable[nn.Module]) -> list[str]:
    """Class names of the (sub)layers whose training forward normalises by batch statistics."""
    return [
        type(sub).__name__
        for layer in layers
        for sub in layer.modules()
        if isinstance(sub, nn.modules.batchnorm._BatchNorm)
    ]
