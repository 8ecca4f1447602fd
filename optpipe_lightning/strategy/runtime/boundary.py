"""What crosses a stage boundary is sendable: contiguous tensors that are not views.

A layer group's output goes to the next rank (``isend`` needs a contiguous tensor: "input tensor
has to be contiguous") and torch's split backward detaches it in place (a view cannot be:
"Can't detach views in-place"; ``nn.Linear`` on a 3-D input returns one). The gradient of a
group's input goes back the same way: a layer that starts with a transpose makes it
non-contiguous, which gloo refuses. ``SendableChain`` is the layer chain the engine runs as one
torch stage with both made sendable: an output that is non-contiguous or a view is copied
(``contiguous``/``clone``: the values and the gradient are unchanged), and an input gradient is
made contiguous in the backward. Nothing is copied when the tensors are sendable already, and
the last layer group's output (not sent: the loss takes it) is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .contract import LayerChain
from .torch_adapter import is_view


class _ContiguousGrad(torch.autograd.Function):
    """Identity; the gradient it passes back is contiguous."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def sendable(x: Any) -> Any:
    """``x`` (a tensor, or a tuple/list of them) as tensors a send and an in-place detach take."""
    if isinstance(x, torch.Tensor):
        if not x.is_contiguous():
            return x.contiguous()
        if is_view(x):
            return x.clone()
        return x
    if isinstance(x, tuple | list):
        return type(x)(sendable(v) for v in x)
    return x


def _grad_sendable(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point():
        return _ContiguousGrad.apply(x)
    return x


class SendableChain(LayerChain):
    """A ``LayerChain`` whose output and input gradients cross a boundary as they are sent."""

    def __init__(self, layers: Sequence[nn.Module], send_output: bool = True) -> None:
        super().__init__(layers)
        self.send_output = send_output

    def forward(self, *args: Any) -> Any:
        out = super().forward(*(_grad_sendable(a) for a in args))
        return sendable(out) if self.send_output else out
