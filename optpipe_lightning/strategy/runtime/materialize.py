"""Models larger than one device: built on the meta device, each rank materialises its own layers.

A module may create its layers in Lightning's ``configure_model`` hook. The strategy runs that
hook under ``torch.device("meta")`` (``build_on_meta``; Lightning's own call goes through
``OptPipeStrategy.tensor_init_context``, also meta), so no rank ever allocates the model. In
``setup`` each rank then replays the construction (``materialise``): submodules in
registration order, each one's children before itself, one module at a time: its meta tensors
get storage on the rank's device and its own ``reset_parameters()`` runs -- what a torch module
runs when it is constructed -- then, for a submodule that defines ``init_weights()``, that
method (after its children: call it at the end of its ``__init__`` for one device to match). A module of another stage's layers is initialised too (the random
stream advances exactly as on one device) and dropped at once (its tensors go back to the meta
device), so a rank holds its own layers plus one layer at most, and the same seed gives the
same initial weights as one device whatever the partition or stage count.

Dropped tensors keep their ``nn.Parameter`` objects (``torch.utils.swap_tensors``): parameter
names, the optimizer's parameter list and the module's structure stay as on one device, only the
storage is gone. ``move_layers`` moves layers between ranks one layer at a time (re-partition,
re-chunking), with their optimizer state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from ...schedule import Problem
from ..planning.partition import group_bounds
from .process_groups import PipelineComm

META = torch.device("meta")


class MaterializeError(TypeError):
    """A module built on the meta device cannot be initialised; the message names the fix."""


def has_meta_tensors(module: nn.Module) -> bool:
    return any(t.is_meta for t in _tensors(module, recurse=True))


def _overrides_configure_model(module: Any) -> bool:
    """Whether the module's class overrides ``LightningModule.configure_model``; the base is
    found by name so that both namespaces (``lightning.pytorch``, ``pytorch_lightning``) work."""
    cls = type(module)
    base = next((c for c in cls.__mro__ if c.__name__ == "LightningModule"), None)
    if base is None:
        return False
    return getattr(cls, "configure_model", None) is not getattr(base, "configure_model", None)


def build_on_meta(module: Any) -> None:
    """Run the module's ``configure_model`` under the meta device when it defines one (the hook
    must be idempotent, as Lightning asks: Lightning's later call is then a no-op)."""
    if getattr(module, "_optpipe_built", False) or not _overrides_configure_model(module):
        return
    with torch.device("meta"):
        module.configure_model()
    module._optpipe_built = True


def layer_owners(
    num_layers: int, partition: Sequence[int], num_stages: int, num_chunks: int, placement: str
) -> list[int]:
    """The pipeline stage (rank in the pipeline) that runs each layer."""
    shape = Problem(
        num_stages=num_stages,
        num_microbatches=num_stages,
        num_chunks=num_chunks,
        placement=placement if num_chunks > 1 else "interleaved",
        t_f=1,
        t_b=1,
        t_w=1,
    )
    owners = [0] * num_layers
    for g, (start, end) in enumerate(group_bounds(partition)):
        for i in range(start, end):
            owners[i] = shape.group_table[g][0]
    return owners


def materialise(
    module: nn.Module, layers: Sequence[nn.Module], keep: set[int], device: torch.device
) -> None:
    """Allocate and initialise the meta tensors of ``module`` as its construction did; the
    layers outside ``keep`` (layer indices) are dropped as soon as they are initialised.

    The replay is post-order (a module's children before the module itself: they were built
    inside its ``__init__`` before its own init code ran), children in registration order:
    each module's own meta tensors get storage on ``device`` and its ``reset_parameters()``
    runs; a module that defines ``init_weights()`` runs it after its children. Real (non-meta)
    tensors of dropped layers are dropped too: afterwards the rank holds only its own layers and
    the tensors outside every layer."""
    roots = {id(layer): i for i, layer in enumerate(layers)}
    kept = _kept_tensors(layers, keep)
    check_materialisable(module, layers)
    seen: set[int] = set()

    def visit(m: nn.Module) -> None:
        seen.add(id(m))
        init = getattr(m, "init_weights", None) if m is not module else None
        init = init if callable(init) and has_meta_tensors(m) else None
        for child in m.children():
            if id(child) not in seen:
                visit(child)
        if any(t.is_meta for _, t in _named_tensors(m)):
            reset = getattr(m, "reset_parameters", None)
            allocate(m, device)
            if callable(reset):
                with torch.no_grad():
                    reset()
        if init is not None:
            for s in m.modules():
                allocate(s, device)
            with torch.no_grad():
                init()
        if id(m) in roots and roots[id(m)] not in keep:
            for s in m.modules():
                _drop(s, kept)  # a tensor a kept layer shares (tied) stays

    visit(module)


def check_materialisable(module: nn.Module, layers: Sequence[nn.Module]) -> None:
    """Every meta tensor of ``module`` has an init that ``materialise`` can run, and no
    ``init_weights()`` spans several layers; ``MaterializeError`` (one line) otherwise. Allocates
    nothing: the launching process runs it before any rank starts."""
    in_layer = {id(sub) for layer in layers for sub in layer.modules()}
    for name, m in module.named_modules():
        spans = id(m) not in in_layer and any(id(s) in in_layer for s in m.modules())
        init = getattr(m, "init_weights", None)
        if m is not module and spans and callable(init) and has_meta_tensors(m):
            raise MaterializeError(
                f"{name} ({type(m).__name__}).init_weights() initialises several pipeline "
                "layers at once, so a rank would hold them all: give each layer its own "
                "init_weights() or reset_parameters() (see docs/strategy.md)"
            )
    seen: set[int] = set()

    def visit(m: nn.Module, name: str, covered: bool) -> None:
        seen.add(id(m))
        init = getattr(m, "init_weights", None) if m is not module else None
        covered = covered or callable(init)
        for child_name, child in m.named_children():
            if id(child) not in seen:
                visit(child, f"{name}.{child_name}" if name else child_name, covered)
        meta = [n for n, t in _named_tensors(m) if t.is_meta]
        if meta and not covered and not callable(getattr(m, "reset_parameters", None)):
            raise MaterializeError(
                f"{name or type(m).__name__} ({type(m).__name__}) holds {meta} built on the "
                "meta device (configure_model) but has no reset_parameters() or "
                "init_weights() to initialise them: define one (see docs/strategy.md)"
            )

    visit(module, "", False)


def drop_layers(layers: Sequence[nn.Module], keep: set[int]) -> None:
    """Free the tensors of the layers outside ``keep`` (they go to the meta device), except
    the tensors a kept layer shares (a tied embedding: a shared module, or one weight assigned
    to two modules)."""
    kept = _kept_tensors(layers, keep)
    for i, layer in enumerate(layers):
        if i not in keep:
            for m in layer.modules():
                _drop(m, kept)


def _kept_tensors(layers: Sequence[nn.Module], keep: set[int]) -> set[int]:
    """Ids of the parameters and buffers the layers in ``keep`` hold (``swap_tensors`` keeps
    a tensor's identity, so they stay valid while tensors move)."""
    return {id(t) for i in keep for t in _tensors(layers[i], recurse=True)}


def move_held(module: nn.Module, device: torch.device) -> None:
    """The tensors the module holds (not the dropped ones) move to ``device``, in place."""
    for m in module.modules():
        for _, t in _named_tensors(m):
            if not t.is_meta and t.device != device:
                new = t.detach().to(device)
                if isinstance(t, nn.Parameter):
                    new = nn.Parameter(new, requires_grad=t.requires_grad)
                torch.utils.swap_tensors(t, new)


def held_bytes(module: nn.Module) -> int:
    """Bytes of the module's parameters and buffers that hold storage (not on the meta device)."""
    seen: set[int] = set()
    total = 0
    for t in _tensors(module, recurse=True):
        if not t.is_meta and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def optimizer_state_bytes(optimizers: Iterable[Optimizer]) -> int:
    total = 0
    for optimizer in optimizers:
        opt = getattr(optimizer, "_optimizer", optimizer)
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, Tensor) and not v.is_meta:
                    total += v.numel() * v.element_size()
    return total


def move_layers(
    module: nn.Module,
    layers: Sequence[nn.Module],
    optimizers: Sequence[Optimizer],
    old: Sequence[int],
    new: Sequence[int],
    comm: PipelineComm,
    device: torch.device,
) -> None:
    """Move each layer whose owner changes from ``old[i]`` to ``new[i]`` (pipeline ranks) with
    its optimizer state, one layer at a time (an all-gather over the pipeline per layer)."""
    names = {id(p): n for n, p in module.named_parameters()}
    opts = [getattr(o, "_optimizer", o) for o in optimizers]
    me = comm.pp_rank
    for i, layer in enumerate(layers):
        if old[i] == new[i]:
            continue
        payload = None
        if me == old[i]:
            payload = (
                {n: t.detach().cpu() for n, t in layer.state_dict().items()},
                [
                    {names[id(p)]: _cpu(o.state[p]) for p in layer.parameters() if p in o.state}
                    for o in opts
                ],
            )
        parts = comm.gather(payload)
        state, opt_states = parts[old[i]]
        if me == new[i]:
            for m in layer.modules():
                allocate(m, device)
            layer.load_state_dict(state)
            for o, st in zip(opts, opt_states, strict=True):
                for p in layer.parameters():
                    if names[id(p)] in st:
                        o.state[p] = {
                            k: v.to(device) if isinstance(v, Tensor) and k != "step" else v
                            for k, v in st[names[id(p)]].items()
                        }
        elif me == old[i]:
            # a tensor one of this rank's layers still holds (tied) stays, with its state
            kept = _kept_tensors(layers, {j for j, o in enumerate(new) if o == me})
            for o in opts:
                for p in layer.parameters():
                    if id(p) not in kept:
                        o.state.pop(p, None)
            for m in layer.modules():
                _drop(m, kept)
        del parts, state, opt_states


def _cpu(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v.detach().cpu() if isinstance(v, Tensor) else v for k, v in state.items()}


def _named_tensors(m: nn.Module) -> list[tuple[str, Tensor]]:
    return [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]


def _tensors(m: nn.Module, recurse: bool) -> Iterable[Tensor]:
    yield from m.parameters(recurse=recurse)
    yield from m.buffers(recurse=recurse)


def _swap(t: Tensor, device: torch.device) -> None:
    new = torch.empty_like(t, device=device)
    if isinstance(t, nn.Parameter):
        new = nn.Parameter(new, requires_grad=t.requires_grad)
    torch.utils.swap_tensors(t, new)


def allocate(m: nn.Module, device: torch.device) -> None:
    """The module's own meta tensors get (uninitialised) storage on ``device``."""
    for _, t in _named_tensors(m):
        if t.is_meta:
            _swap(t, device)


def _drop(m: nn.Module, kept: set[int]) -> None:
    """The module's own tensors give their storage up (they go to the meta device), except
    those in ``kept`` (tensor ids: a kept layer shares them)."""
    for _, t in _named_tensors(m):
        if not t.is_meta and id(t) not in kept:
            t.grad = None
            _swap(t, META)
