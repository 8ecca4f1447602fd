"""The one place that touches torch.distributed.pipelining's private API.

Everything private (``_PipelineScheduleRuntime``, ``_Action``, ``_ComputationType``,
``_prepare_schedule_with_comms``, ``_add_send_recv``) is imported and used here only. The probe at
import time checks the torch version range and the names we need, and raises
``UnsupportedTorchError`` with one line naming the fix when they are not there.

Tested range: torch 2.9 <= version < 2.16 (CI runs 2.13.0). Our ops map to torch's letters:
``F`` -> F (forward), ``B`` -> I (input gradient), ``W`` -> W (weight gradient), ``BW`` -> B (full
backward). Transfers (OFFLOAD/RELOAD) have no torch action; the stage subclass runs them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...schedule import Action, Problem

TORCH_MIN = (2, 9)
TORCH_MAX_EXCLUSIVE = (2, 16)


class UnsupportedTorchError(ImportError):
    """The installed torch lacks the pipelining internals this adapter was tested against."""


def _version_tuple(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):  # pragma: no cover - exotic builds
        return (0, 0)


def _probe() -> dict[str, Any]:
    ver = _version_tuple(torch.__version__)
    if not (TORCH_MIN <= ver < TORCH_MAX_EXCLUSIVE):
        raise UnsupportedTorchError(
            f"optpipe's pipeline executor supports torch >= {TORCH_MIN[0]}.{TORCH_MIN[1]} and "
            f"< {TORCH_MAX_EXCLUSIVE[0]}.{TORCH_MAX_EXCLUSIVE[1]}, found {torch.__version__}; "
            "install a torch in that range"
        )
    try:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining import schedules as sch
    except ImportError as e:  # pragma: no cover - torch without distributed
        raise UnsupportedTorchError(
            f"torch {torch.__version__} has no torch.distributed.pipelining ({e}); "
            "install a torch build with distributed support"
        ) from e
    needed = (
        "_PipelineScheduleRuntime",
        "_Action",
        "_ComputationType",
        "_add_send_recv",
        "FORWARD",
        "BACKWARD_INPUT",
        "BACKWARD_WEIGHT",
        "FULL_BACKWARD",
    )
    missing = [n for n in needed if not hasattr(sch, n)]
    runtime = getattr(sch, "_PipelineScheduleRuntime", None)
    if runtime is not None and not hasattr(runtime, "_prepare_schedule_with_comms"):
        missing.append("_PipelineScheduleRuntime._prepare_schedule_with_comms")
    for meth in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        if not hasattr(PipelineStage, meth):
            missing.append(f"PipelineStage.{meth}")
    if missing:
        raise UnsupportedTorchError(
            f"torch {torch.__version__} lacks pipelining internals {missing}; "
            f"install torch >= {TORCH_MIN[0]}.{TORCH_MIN[1]}, < "
            f"{TORCH_MAX_EXCLUSIVE[0]}.{TORCH_MAX_EXCLUSIVE[1]}"
        )
    return {"sch": sch, "PipelineStage": PipelineStage}


_T = _probe()
_sch = _T["sch"]
PipelineStage = _T["PipelineStage"]
_OP_TO_TORCH = {
    "F": _sch.FORWARD,
    "B": _sch.BACKWARD_INPUT,
    "W": _sch.BACKWARD_WEIGHT,
    "BW": _sch.FULL_BACKWARD,
}

TorchOrder = dict[int, list[Any]]


class LoweringError(ValueError):
    """torch could not lower the compute order to one with communication (it would hang)."""


def torch_order(problem: Problem, actions: Sequence[Sequence[Action]]) -> TorchOrder:
    """Our per-device action lists as torch's compute-only pipeline order (rank -> actions).

    Torch's stage index is the layer group (position in the model); its rank is our device.
    Transfers are dropped: they are not torch actions.
    """
    order: TorchOrder = {}
    for s, row in enumerate(actions):
        out = []
        for a in row:
            kind = _OP_TO_TORCH.get(a.op)
            if kind is None:
                continue
            out.append(_sch._Action(problem.group_of(s, a.chunk), kind, a.mb))
        order[s] = out
    return order


def check_lowering(problem: Problem, actions: Sequence[Sequence[Action]]) -> None:
    """Lower the order with torch's own pass, without a process group; raise if it cannot progress.

    This is the cheap deadlock check torch offers: ``_add_send_recv`` raises when cross-rank order
    cannot make progress. Run before any process group traffic, so a bad order never hangs.
    """
    order = torch_order(problem, actions)
    stage_to_rank = {
        problem.group_of(s, c): s
        for s in range(problem.num_stages)
        for c in range(problem.num_chunks)
    }
    try:
        _sch._add_send_recv(
            {r: list(row) for r, row in order.items()},
            stage_to_rank=lambda g: stage_to_rank[g],
            num_stages=problem.num_virtual_stages,
        )
    except Exception as e:
        raise LoweringError(f"torch cannot lower this schedule ({e})") from e


def make_runtime(
    stages: list[Any],
    num_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    order: TorchOrder,
) -> Any:
    """A ``_PipelineScheduleRuntime`` over the local stages, loaded with the compute-only order.

    ``scale_grads=False``: gradients are never divided behind the user's back; the loss function
    given here already carries the 1/M (and accumulation) factor.
    """
    runtime = _sch._PipelineScheduleRuntime(
        stages, num_microbatches, loss_fn=loss_fn, scale_grads=False
    )
    load_order(runtime, order)
    return runtime


def load_order(runtime: Any, order: TorchOrder) -> None:
    """Replace the runtime's schedule (used at a switch, between steps)."""
    runtime.pipeline_order = {r: list(row) for r, row in order.items()}
    runtime._prepare_schedule_with_comms(runtime.pipeline_order)


# ``step(..., return_outputs=False)`` (torch PR #165822, in 2.10+) keeps the last stage from
# holding every microbatch's output; torch 2.9's ``step`` would hand the unknown keyword to the
# model as an input, so it is passed only where ``step`` names it.
_STEP_KW = (
    {"return_outputs": False}
    if "return_outputs" in inspect.signature(_sch._PipelineScheduleRuntime.step).parameters
    else {}
)


class _Unrecorded:
    """A context that does nothing (one instance serves every action)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_UNRECORDED = _Unrecorded()
# torch's runtime wraps every action in ``record_function(name)`` (``schedules.py`` imports it
# by name), ~9 us each even with no profiler running (~100 actions a step); its schedule
# classes with a loop of their own (``Schedule1F1B``) do not. While our runtime steps, the
# name points at ``_recorded_when_profiling``: the same annotation whenever a torch profiler
# records, nothing otherwise.
_RECORD_FUNCTION = getattr(_sch, "record_function", None)
_profiler_enabled: Callable[[], bool] | None = getattr(torch.autograd, "_profiler_enabled", None)


def _recorded_when_profiling(name: str, args: str | None = None) -> Any:
    if _profiler_enabled is None or _profiler_enabled():
        assert _RECORD_FUNCTION is not None
        return _RECORD_FUNCTION(name, args)
    return _UNRECORDED


class _ProfilerAnnotations:
    """While entered, torch's runtime annotates its actions only while a profiler records."""

    def __enter__(self) -> None:
        self._saved = getattr(_sch, "record_function", None)
        if self._saved is _RECORD_FUNCTION and _RECORD_FUNCTION is not None:
            _sch.record_function = _recorded_when_profiling

    def __exit__(self, *exc: object) -> None:
        if self._saved is _RECORD_FUNCTION and _RECORD_FUNCTION is not None:
            _sch.record_function = self._saved


def annotations_when_profiling() -> _ProfilerAnnotations:
    """``with annotations_when_profiling(): runtime.step(...)``: the step's ``PP:<action>``
    annotations only while a torch profiler records (torch's own schedule classes, driven
    outside it, keep theirs)."""
    return _ProfilerAnnotations()


def run_step(runtime: Any, args: tuple[torch.Tensor, ...] | None, num_microbatches: int) -> None:
    """One pipelined step. The first stage gives the batch's inputs (torch cuts them into
    microbatches along dimension 0); the targets are the microbatch indices (the loss hook finds
    each microbatch's own data by the output torch hands it)."""
    targets = torch.arange(num_microbatches)
    with annotations_when_profiling():
        runtime.step(*(args or ()), target=targets, **_STEP_KW)


def make_forward_runtime(
    stages: list[Any],
    num_microbatches: int,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    order: TorchOrder,
    forward_order: TorchOrder,
) -> Any:
    """A runtime that runs ``forward_order`` (forwards only) with ``eval``.

    torch validates a loaded order as a training schedule (every forward needs its backward), so
    the runtime is loaded with ``order`` (a training order of the same pipeline: it fixes which
    rank runs which stage) and then runs ``forward_order``, lowered with torch's own pass.
    """
    runtime = make_runtime(stages, num_microbatches, loss_fn, order)
    runtime.pipeline_order_with_comms = _sch._add_send_recv(
        {r: list(row) for r, row in forward_order.items()},
        stage_to_rank=lambda g: runtime.stage_index_to_group_rank[g],
        num_stages=runtime._num_stages,
    )
    return runtime


def run_forward(runtime: Any, args: tuple[torch.Tensor, ...] | None, num_microbatches: int) -> None:
    """One forward-only pass of a ``make_forward_runtime`` runtime (no gradients kept)."""
    with annotations_when_profiling():
        runtime.eval(*(args or ()), target=torch.arange(num_microbatches))


def is_view(t: torch.Tensor) -> bool:
    """Whether ``t`` is a view of another tensor (torch's split backward cannot detach one in
    place); ``Tensor._is_view`` has no public name."""
    return bool(t._is_view())
