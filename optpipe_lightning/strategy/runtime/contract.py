"""The model contract: one hook on the LightningModule says how its layers run in order.

```python
class GPT(L.LightningModule):
    def configure_pipeline(self) -> PipelineSpec:
        return PipelineSpec(layers=[self.embed, *self.blocks, self.head])  # run one after another

    def training_step(self, batch, batch_idx):  # as on one device: the pipeline answers self(x)
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.log("train_loss", loss)
        return loss
```

Layer ``i + 1`` takes what layer ``i`` returns (a tuple is spread as positional arguments); the
first layer takes the inputs the step passes to ``self(...)``. Every trainable parameter of the
module must belong to one of the layers (one used by several layers, a tied embedding, is kept
one parameter: ``shared_params``). A module's own ``forward`` must be that chain (checked on the
first microbatch by ``chain_probe``; ``forward_is_chain=True`` skips the check). A module without its own ``training_step`` (or
``validation_step``, ``test_step``) gives ``loss_fn(last_output, targets)``, the (mean-reduced)
loss of one microbatch, and optionally ``split_batch`` (batch -> (inputs, targets)); the strategy
then runs that loss as the step and logs ``train_loss`` / ``val_loss`` / ``test_loss``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

HOOK_NAME = "configure_pipeline"


class ContractError(TypeError):
    """The LightningModule does not follow the pipeline contract; the message names the fix."""


def default_split_batch(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, list | tuple) and len(batch) == 2:
        return batch[0], batch[1]
    raise ContractError(
        "the batch is not an (inputs, targets) pair; give PipelineSpec(split_batch=...) "
        "that returns (inputs, targets)"
    )


@dataclass
class PipelineSpec:
    """What ``configure_pipeline`` returns."""

    layers: Sequence[nn.Module]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None  # for modules without own steps
    split_batch: Callable[[Any], tuple[Any, Any]] | None = None
    layer_costs: Sequence[float] | None = None  # optional relative cost per layer (partitioning)
    # the module's forward is the chain of ``layers``: skip the probe that checks it on the first
    # microbatch (``chain_probe``; one forward of one microbatch where the module is)
    forward_is_chain: bool = False

    def split(self, batch: Any) -> tuple[Any, Any]:
        return (self.split_batch or default_split_batch)(batch)


class LayerChain(nn.Module):
    """Consecutive layers run one after another (a layer group = one torch pipeline stage)."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, *args: Any) -> Any:
        out: Any = args
        for layer in self.layers:
            out = layer(*out) if isinstance(out, tuple) else layer(out)
        return out


def get_spec(module: nn.Module) -> PipelineSpec:
    """The module's pipeline spec, checked; ``ContractError`` with one line when it is wrong."""
    hook = getattr(module, HOOK_NAME, None)
    if hook is None or not callable(hook):
        raise ContractError(
            f"{type(module).__name__} has no {HOOK_NAME}() hook; define "
            f"`def {HOOK_NAME}(self) -> PipelineSpec` returning its layers in order "
            "(see docs/strategy.md)"
        )
    spec = hook()
    if not isinstance(spec, PipelineSpec):
        raise ContractError(
            f"{type(module).__name__}.{HOOK_NAME}() returned {type(spec).__name__}, "
            "expected optpipe_lightning.strategy.PipelineSpec"
        )
    layers = list(spec.layers)
    if not layers or not all(isinstance(x, nn.Module) for x in layers):
        raise ContractError(f"{HOOK_NAME}() must give a non-empty list of nn.Module layers")
    if spec.layer_costs is not None and len(spec.layer_costs) != len(layers):
        raise ContractError(
            f"layer_costs has {len(spec.layer_costs)} entries for {len(layers)} layers"
        )
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    stray = [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in in_layers]
    if stray:
        raise ContractError(
            f"parameters {stray[:3]} belong to no pipeline layer; put the modules that own them "
            f"into {HOOK_NAME}().layers (they would never be trained)"
        )
    return spec
