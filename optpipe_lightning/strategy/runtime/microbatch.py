"""Batches into microbatches and back: the split of a step's batch, the count, the joined results.

- ``split_batch(batch, m)``: every tensor of the batch (in tuples, lists, dicts, named tuples,
  dataclasses) cut into ``m`` equal parts along its first dimension; anything else goes whole to
  every microbatch.
- ``choose_microbatches``: ``num_microbatches="auto"`` picks the smallest count that divides the
  batch and gives at least two microbatches per stage, else the largest that gives at least one;
  ``MicrobatchError`` names the counts that would work when none does.
- ``combine_logged``: the values a step logged for one name in each microbatch, joined into the
  batch's value: their mean (over equal microbatches the whole batch's mean, which is what one
  device logs for a loss or an accuracy), their sum for metrics summed over steps.
- ``InputFingerprint``: a step's forward inputs, to check that the step run again computes the
  same ones (by where they live when they are the same memory, else by ``signature``).
- ``merge_outputs``: the step's outputs of each microbatch joined into the batch's: tensors with a
  batch dimension concatenated, scalars averaged, containers joined element by element.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor


class MicrobatchError(ValueError):
    """A batch cannot be cut into the microbatches asked for; the message names the fix."""


def tensors_of(batch: Any) -> list[Tensor]:
    """The batch's tensors, in the order ``apply_to_collection`` visits them."""
    found: list[Tensor] = []
    apply_to_collection(batch, Tensor, found.append)
    return found


def leading_size(batch: Any) -> int:
    """The batch size: the first dimension of the batch's first tensor with one."""
    for t in tensors_of(batch):
        if t.ndim >= 1:
            return int(t.shape[0])
    raise MicrobatchError(
        "the batch holds no tensor with a batch dimension; the pipeline splits a batch of "
        "tensors (batch first) into microbatches"
    )


def split_batch(batch: Any, m: int) -> list[Any]:
    """``m`` microbatches of ``batch`` (tensors cut along dimension 0, views, no copies)."""
    for t in tensors_of(batch):
        if t.ndim >= 1 and t.shape[0] % m != 0:
            raise MicrobatchError(
                f"a batch tensor of shape {tuple(t.shape)} does not divide into {m} microbatches "
                f"along its first dimension; use a batch size that is a multiple of {m} "
                "(drop_last=True in the DataLoader) or another num_microbatches"
            )

    pieces: dict[int, tuple[Tensor, ...]] = {}  # each tensor cut once, not once per microbatch

    def part(i: int) -> Callable[[Tensor], Tensor]:
        def cut(t: Tensor) -> Tensor:
            if t.ndim < 1:
                return t
            if id(t) not in pieces:
                pieces[id(t)] = t.tensor_split(m)
            return pieces[id(t)][i]

        return cut

    return [apply_to_collection(batch, Tensor, part(i)) for i in range(m)]


def divisors_from(n: int, least: int) -> list[int]:
    return [d for d in range(max(1, least), n + 1) if n % d == 0]


def choose_microbatches(
    batch_size: int, num_stages: int, runs_with: Callable[[int], bool] = lambda m: True
) -> int:
    """The automatic microbatch count for ``batch_size`` on ``num_stages`` stages.

    The smallest divisor of the batch size that gives every stage at least two microbatches
    (``>= 2p``: the pipeline fills and its bubble is small, while microbatches stay as large as
    that allows); else the largest divisor ``>= p``. ``runs_with(m)`` says whether the schedule
    runs with ``m`` microbatches (some need ``m`` divisible by ``p``).
    """
    p = num_stages
    counts = [m for m in divisors_from(batch_size, p) if runs_with(m)]
    full = [m for m in counts if m >= 2 * p]
    if full:
        return full[0]
    if counts:
        return counts[-1]
    divisors = divisors_from(batch_size, p)
    if divisors:
        raise MicrobatchError(
            f"num_microbatches='auto': batch size {batch_size} divides into "
            f"{', '.join(map(str, divisors))} microbatches but the schedule runs with none of "
            f"these on {p} stages; choose num_microbatches or another schedule"
        )
    near = -(-batch_size // (2 * p)) * 2 * p
    raise MicrobatchError(
        f"num_microbatches='auto': batch size {batch_size} does not divide into {p} or more "
        f"microbatches (at least one per stage); use a batch size that is a multiple of {2 * p} "
        f"or {p} (e.g. {near}), or fewer stages"
    )


def eval_microbatches(batch_size: int, num_stages: int, requested: int | None) -> int:
    """The microbatch count of a forward-only batch: the requested count when it divides the
    batch, else the automatic one, else (a batch smaller than the stages) the largest divisor."""
    if requested is not None and batch_size % requested == 0:
        return requested
    try:
        return choose_microbatches(batch_size, num_stages)
    except MicrobatchError:
        return max(divisors_from(batch_size, 1))


def shape_key(x: Any) -> tuple[Any, ...]:
    """The structure, shapes and dtypes of ``x`` (what torch's stages fix at their first step)."""
    if isinstance(x, Tensor):
        return ("T", tuple(x.shape), str(x.dtype))
    if isinstance(x, tuple | list):
        return ("S", tuple(shape_key(v) for v in x))
    if isinstance(x, Mapping):
        return ("M", tuple((k, shape_key(v)) for k, v in x.items()))
    return ("O", type(x).__name__)


def signature(x: Any) -> list[float]:
    """A cheap fingerprint of a batch's values (sums, sums of squares, sizes)."""
    out: list[float] = []
    for t in tensors_of(x):
        d = t.detach().double()
        out += [float(d.sum()), float((d * d).sum()), float(d.numel())]
    return out


class InputFingerprint:
    """A microbatch's forward inputs as a step's first run computed them, to check that a rerun
    computes the same values (``ModuleStep.answer``).

    Where the inputs live is recorded (storage, offset, shape, strides, dtype, and the version
    counter that every in-place write bumps) and the inputs are kept: a rerun whose inputs are
    the same untouched memory has the same values, with no reduction over them (the common
    step, ``x, y = batch``). Otherwise both sides' ``signature`` is compared, the first run's
    taken from the kept tensors, so only if they were not written since (else the values the
    first run gave the pipeline are gone: not the same). Without version counters (inference
    tensors) or storages the signature is taken at once."""

    def __init__(self, args: Sequence[Tensor]) -> None:
        self.args = tuple(args)
        self.where = _memory_keys(self.args)
        self._signature = signature(self.args) if self.where is None else None

    def matches(self, args: Sequence[Tensor]) -> bool:
        if self.where is not None:
            if _memory_keys(tuple(args)) == self.where:
                return True
            if _memory_keys(self.args) != self.where:  # written in place since the first run
                return False
            if self._signature is None:
                self._signature = signature(self.args)
        return signature(args) == self._signature


def _memory_keys(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    try:
        return tuple(
            (
                t.untyped_storage().data_ptr(),
                t.storage_offset(),
                tuple(t.shape),
                t.stride(),
                t.dtype,
                t.device,
                t._version,
            )
            for t in (args if all(isinstance(a, Tensor) for a in args) else tensors_of(args))
        )
    except (RuntimeError, NotImplementedError):  # no storage or no version counter
        return None


def combine_logged(values: Sequence[Tensor], reduce_fx: Any = "mean") -> Tensor:
    """The batch's value of a logged metric from its microbatches' values.

    ``reduce_fx`` tells Lightning how to join steps into an epoch value; within one batch the
    microbatches are parts of the step, so their values are averaged (a mean over samples, a
    loss or an accuracy, is then the whole batch's, as on one device), or summed when the metric
    is summed over steps (``reduce_fx="sum"``: counts and totals).
    """
    stacked = torch.stack([v.detach().reshape(()) for v in values])
    dtype = stacked.dtype
    wide = stacked.double()
    total = reduce_fx is torch.sum or (isinstance(reduce_fx, str) and reduce_fx.lower() == "sum")
    return (wide.sum() if total else wide.mean()).to(dtype)


def merge_outputs(outputs: Sequence[Any]) -> Any:
    """The batch's output from each microbatch's (same structure in every microbatch)."""
    first = outputs[0]
    if first is None:
        return None
    if isinstance(first, Tensor):
        if first.ndim == 0:
            return torch.stack([o.detach() for o in outputs]).double().mean().to(first.dtype)
        return torch.cat([o.detach() for o in outputs])
    if isinstance(first, Mapping):
        return {k: merge_outputs([o[k] for o in outputs]) for k in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # named tuple
        return type(first)(*(merge_outputs([o[i] for o in outputs]) for i in range(len(first))))
    if isinstance(first, tuple | list):
        return type(first)(merge_outputs([o[i] for o in outputs]) for i in range(len(first)))
    return list(outputs)
