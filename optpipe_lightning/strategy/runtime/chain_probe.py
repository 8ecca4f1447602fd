"""Is the module's ``forward`` the chain of its declared layers? A probe on the first microbatch.

The pipeline never runs the module's ``forward``: it runs ``configure_pipeline()``'s layers one
after another (``LayerChain``). A ``forward`` that does anything else between, before or after
them (an activation, a residual around two layers, a scale, a layer skipped or run twice) would
train a different function without a word. Before the first pipeline is built, every rank runs
the module's ``forward`` once on the first microbatch's inputs, without gradients, with hooks on
the layers, and checks that

- the layers are called in their declared order, each once, with positional arguments only;
- the first layer gets exactly the forward's inputs, layer ``i + 1`` exactly what layer ``i``
  returned (values compared at the moment layer ``i + 1`` is called, so an in-place change in
  between counts), and the forward returns exactly what the last layer returned.

This is the pipeline chain's output for the probe compared with ``forward``'s at every boundary,
and it costs one forward of one microbatch with one layer output held at a time. The probe
leaves no trace (``module_state.preserved_state``: buffers and random state put back). It runs
where the module is (the host before the pipeline moves its layers); a model whose forward is
slow there, or one the user knows is the chain, skips it with
``PipelineSpec(forward_is_chain=True)``. Every rank sees the same batch and weights, so every
rank reaches the same verdict at once: ``ContractError`` with one line, before any rank waits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .contract import ContractError
from .module_state import preserved_state

_FIX = (
    "the pipeline runs only the layers: move that computation into a layer, or pass "
    "PipelineSpec(forward_is_chain=True) if the chain is meant to be the forward"
)


def _flat(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def _same(a: Any, b: Any) -> bool:
    """Equal values (tensors: same shape, dtype and elements, NaN equal to NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a is b:
            return True
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if a.is_meta:
            return False  # no values to compare: only the same tensor passes
        return bool(torch.equal(a, b)) or bool(
            a.is_floating_point() and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
        )
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a is b or a == b)


def _snapshot(x: Any) -> Any:
    """A copy of what a layer returned, as it is now (an in-place change later must show)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone() if not x.is_meta else x
    if isinstance(x, tuple | list):
        return type(x)(_snapshot(v) for v in x)
    return x


def _name(i: int, layer: nn.Module) -> str:
    return f"layer {i} ({type(layer).__name__})"


class _Probe:
    def __init__(self, layers: Sequence[nn.Module], inputs: tuple[Any, ...]) -> None:
        self.layers = list(layers)
        self.next = 0
        self.expected: Any = _snapshot(inputs)  # what the next layer must get
        self.last_out: Any = None
        self.problem: str | None = None

    def pre(self, i: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.problem is not None:
            return
        layer = self.layers[i]
        if i != self.next:
            if self.next >= len(self.layers):
                self.problem = f"forward calls {_name(i, layer)} again after the last layer"
            else:
                self.problem = (
                    f"forward calls {_name(i, layer)} where the chain runs "
                    f"{_name(self.next, self.layers[self.next])}"
                )
            return
        if kwargs:
            self.problem = f"forward passes keyword arguments {sorted(kwargs)} to {_name(i, layer)}"
            return
        if not _same(args, _flat(self.expected)):
            before = (
                "the forward's inputs"
                if i == 0
                else f"what {_name(i - 1, self.layers[i - 1])} returned"
            )
            self.problem = f"the input of {_name(i, layer)} differs from {before}"

    def post(self, out: Any) -> None:
        if self.problem is None:
            self.next += 1
            self.last_out = out
            self.expected = _snapshot(out)


def module_device(module: nn.Module) -> torch.device | None:
    """The one device holding all the module's parameters and buffers (None: several)."""
    devices = {t.device for t in (*module.parameters(), *module.buffers())}
    if len(devices) > 1:
        return None
    return next(iter(devices), torch.device("cpu"))


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, tuple | list):
        return type(x)(_to(v, device) for v in x)
    return x


def has_own_forward(module: nn.Module) -> bool:
    """The module (or a base class of the user's) defines ``forward``: not torch's or
    Lightning's placeholder."""
    owner = next(c for c in type(module).__mro__ if "forward" in vars(c))
    return not owner.__module__.startswith(("torch.", "lightning.", "pytorch_lightning."))


def probe_forward(
    module: nn.Module, layers: Sequence[nn.Module], inputs: tuple[Any, ...]
) -> str | None:
    """``check_forward_is_chain`` where the module is (its one device; the meta device checks
    the structure only). Returns why the probe did not run, or None when it ran and passed."""
    if not has_own_forward(module):
        return None  # the chain is the only forward there is
    device = module_device(module)
    if device is None:
        return "the module's layers are on several devices (a pipeline already moved them)"
    if device.type == "meta":
        try:
            check_forward_is_chain(module, layers, _to(inputs, device))
        except ContractError as e:
            if "forward failed" in str(e):
                return "the module is on the meta device and its forward cannot run there"
            raise
        return None
    check_forward_is_chain(module, layers, _to(inputs, device))
    return None


def check_forward_is_chain(
    module: nn.Module, layers: Sequence[nn.Module], inputs: tuple[Any, ...]
) -> None:
    """Raise ``ContractError`` (one line) when ``module.forward(*inputs)`` is not the layers'
    chain on these inputs; leaves the module's buffers and the random state as they were."""
    layers = list(layers)
    positions: dict[int, list[int]] = {}
    for i, layer in enumerate(layers):
        positions.setdefault(id(layer), []).append(i)
    probe = _Probe(layers, tuple(inputs))

    def where(layer: nn.Module) -> int:
        """The chain position of this call: the one due next when the layer is due there."""
        at = positions[id(layer)]
        return probe.next if probe.next in at else at[0]

    hooks = []
    for layer in {id(x): x for x in layers}.values():
        hooks.append(
            layer.register_forward_pre_hook(
                lambda m, a, kw: probe.pre(where(m), a, kw), with_kwargs=True
            )
        )
        hooks.append(layer.register_forward_hook(lambda m, _a, o: probe.post(o)))
    cls = type(module).__name__
    try:
        with torch.no_grad(), preserved_state([module]):
            try:
                out = module(*inputs)
            except Exception as e:
                size = next(
                    (int(t.shape[0]) for t in inputs if isinstance(t, torch.Tensor) and t.ndim),
                    None,
                )
                raise ContractError(
                    f"{cls}.forward failed on the first microbatch"
                    + (f" ({size} samples)" if size is not None else "")
                    + f" while checking it is the layer chain: {type(e).__name__}: "
                    + f"{str(e).splitlines()[0] if str(e) else ''}; fix the forward or the "
                    "microbatch size (num_microbatches), or skip the check with "
                    "PipelineSpec(forward_is_chain=True)"
                ) from None
    finally:
        for h in hooks:
            h.remove()
    problem = probe.problem
    if problem is None and probe.next < len(layers):
        problem = f"forward never calls {_name(probe.next, layers[probe.next])}"
    if problem is None and not _same(_flat(out), _flat(probe.expected)):
        problem = (
            f"forward returns something else than {_name(len(layers) - 1, layers[-1])} returned"
        )
    if problem is not None:
        raise ContractError(
            f"{cls}.forward is not the chain of configure_pipeline()'s layers: {problem}; {_FIX}"
        )
