"""Checkpoints of a pipelined model: the whole model and every stage's optimizer state, collected.

Each rank trains only its own layer groups; the other layers of its module copy keep the values
they had when it last loaded a full state. ``full_state_dict`` takes every layer from the rank
that trains it (an all-gather over the pipeline), so a checkpoint, a re-partition and the module
left after ``fit`` hold the trained model. The optimizer is built on every rank over all the
module's parameters, so its parameter indices agree everywhere: ``merged_optimizer_state`` takes
each parameter's state from the rank that trains it. Loading puts the whole state on every rank,
which is what lets a run resume on another schedule, partition or stage count;
``keep_local_optimizer_state`` then drops, on each rank, the state of the parameters it does not
train (device memory, and no stale copy can ever win a merge).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from .process_groups import PipelineComm

if TYPE_CHECKING:
    from .engine import PipelineEngine


def local_state_keys(module: nn.Module, engine: PipelineEngine) -> set[str]:
    """The keys of ``module.state_dict()`` that belong to this rank's layer groups: under a
    layer that is a submodule of ``module``, or a parameter or buffer of a local layer (a
    layer may wrap the module's own submodules without being one: ``strategy/runtime/hf.py``)."""
    names = {id(m): n for n, m in module.named_modules()}
    local_layers = {id(layer) for chain in engine.local_modules for layer in chain.layers}
    prefixes = [names[i] + "." for i in local_layers if i in names]
    tensors = {
        id(t) for chain in engine.local_modules for t in (*chain.parameters(), *chain.buffers())
    }
    owned = {
        n
        for n, t in (
            *module.named_parameters(remove_duplicate=False),
            *module.named_buffers(remove_duplicate=False),
        )
        if id(t) in tensors
    }
    return {k for k in module.state_dict() if k in owned or any(k.startswith(p) for p in prefixes)}


def full_state_dict(
    module: nn.Module, engine: PipelineEngine | None, comm: PipelineComm | None
) -> dict[str, Any]:
    """The whole model, every layer from the rank that trains it (a collective: every rank)."""
    state = module.state_dict()
    if engine is None or comm is None or not comm.distributed:
        return state
    mine = local_state_keys(module, engine)
    merged = dict(state)
    for part in comm.gather({k: v.detach().cpu() for k, v in state.items() if k in mine}):
        merged.update(part)
    return {k: v.detach().cpu() if isinstance(v, Tensor) else v for k, v in merged.items()}


def merged_optimizer_state(
    optimizer: Optimizer, engine: PipelineEngine | None, comm: PipelineComm | None
) -> dict[str, Any]:
    """The optimizer state of all stages (a collective: every rank)."""
    opt = getattr(optimizer, "_optimizer", optimizer)
    sd = opt.state_dict()
    if engine is None or comm is None or not comm.distributed:
        return sd
    mine = _local_indices(opt, engine.parameters)
    local = {k: to_cpu(v) for k, v in sd["state"].items() if k in mine}
    merged: dict[Any, Any] = {}
    for part in comm.gather(local):
        merged.update(part)
    return {"state": merged, "param_groups": sd["param_groups"]}


def keep_local_optimizer_state(
    optimizers: Sequence[Optimizer], params: Sequence[nn.Parameter]
) -> None:
    """Drop the optimizer state of parameters this rank does not train."""
    mine = {id(p) for p in params}
    for optimizer in optimizers:
        opt = getattr(optimizer, "_optimizer", optimizer)
        for p in [p for p in opt.state if id(p) not in mine]:
            del opt.state[p]


def _local_indices(opt: Optimizer, params: Sequence[nn.Parameter]) -> set[int]:
    """The state-dict indices (enumeration over the param groups) of ``params``."""
    mine = {id(p) for p in params}
    flat = [p for group in opt.param_groups for p in group["params"]]
    return {i for i, p in enumerate(flat) if id(p) in mine}


def load_optimizer_states(
    optimizers: Sequence[Optimizer], states: Sequence[dict[str, Any]], device: torch.device
) -> None:
    for optimizer, state in zip(optimizers, states, strict=False):
        optimizer.load_state_dict(state)
        opt = getattr(optimizer, "_optimizer", optimizer)
        for p in [p for p in opt.state if p.is_meta]:  # another rank's layer (sharded model)
            del opt.state[p]
        optimizer_state_to(optimizer, device)


def optimizer_state_to(optimizer: Any, device: torch.device) -> None:
    opt = getattr(optimizer, "_optimizer", optimizer)
    for st in opt.state.values():
        for k, v in st.items():
            if isinstance(v, Tensor) and k != "step":
                st[k] = v.to(device)


def to_cpu(v: Any) -> Any:
    if isinstance(v, Tensor):
        return v.detach().cpu()
    if isinstance(v, dict):
        return {k: to_cpu(x) for k, x in v.items()}
    return v
