"""Lightning's precision plugins under a pipeline: the loss scale and the scaler's agreement.

``bf16-mixed`` and ``16-mixed`` run every stage's forward under the plugin's autocast (the
strategy's step runs the pipeline inside ``train_step_context``), ``bf16-true`` converts the
module's parameters and the inputs; none of that needs the strategy. What does:

- ``16-mixed`` scales the loss before its backward (``GradScaler.scale``), which Lightning does in
  ``Strategy.backward``; under a pipeline the backward runs inside the step, so the engine
  multiplies each microbatch loss by the scale (``loss_scale``) and Lightning's
  ``unscale_`` / ``step`` / ``update`` follow as on one device.
- The scaler skips a step when a gradient is inf or nan. Each rank holds only its stages'
  gradients: ``agree_on_overflow`` makes ``unscale_`` take the maximum of the found-inf flags
  over every rank (all stages, all replicas), so every stage skips the same step and every
  rank's scale stays the same.
- The dtype the activations have (``activation_dtype``): the profile's fingerprint names it, so
  a profile measured in fp32 is not reused for a bf16 run (its activation bytes differ).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.distributed as dist


def grad_scaler(plugin: Any) -> torch.amp.GradScaler | None:
    """The plugin's enabled grad scaler (``16-mixed``), else None."""
    scaler = getattr(plugin, "scaler", None)
    if isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled():
        return scaler
    return None


def loss_scale(plugin: Any, device: torch.device) -> float:
    """The factor each loss takes before its backward: the scaler's scale (1 without one).

    ``scale`` on a one is what initialises the scaler's state on a rank whose stages compute no
    loss (``unscale_`` needs it on every rank)."""
    scaler = grad_scaler(plugin)
    if scaler is None:
        return 1.0
    return float(scaler.scale(torch.ones((), device=device)))


def agree_on_overflow(plugin: Any, device: torch.device) -> None:
    """Make the plugin's scaler skip a step on every rank when any rank found inf or nan.

    ``GradScaler.unscale_`` records per optimizer whether this rank's gradients overflowed;
    ``step`` skips on that flag and ``update`` lowers the scale on it. Wrapped: after unscaling,
    the flag is the maximum over all ranks (one all-reduce), so stages never step apart."""
    scaler = grad_scaler(plugin)
    if scaler is None or getattr(scaler, "_optpipe_agrees", False):
        return
    original = scaler.unscale_

    def unscale_(self: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        original(optimizer)
        state = self._per_optimizer_states[id(optimizer)]
        found: dict[torch.device, torch.Tensor] = state["found_inf_per_device"]
        scale = self._scale
        where = scale.device if scale is not None else device
        if not found:  # a rank whose optimizer holds no gradient still votes
            found[where] = torch.zeros((), dtype=torch.float32, device=where)
        flag = torch.stack([v.to(where, torch.float32) for v in found.values()]).amax()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        for v in found.values():
            v.copy_(flag.to(v.device))

    scaler.unscale_ = types.MethodType(unscale_, scaler)  # type: ignore[method-assign]
    scaler._optpipe_agrees = True  # type: ignore[attr-defined]


def activation_dtype(plugin: Any, params_dtype: str) -> str:
    """The dtype name a profile's fingerprint records: the parameters' dtype, with the
    autocast dtype for mixed precision (``"float32+bfloat16-autocast"``)."""
    precision = str(getattr(plugin, "precision", ""))
    if precision == "bf16-mixed":
        return f"{params_dtype}+bfloat16-autocast"
    if precision == "16-mixed":
        return f"{params_dtype}+float16-autocast"
    return params_dtype
