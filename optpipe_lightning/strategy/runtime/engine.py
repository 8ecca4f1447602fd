"""The pipeline engine: this rank's stages, torch's runtime, our schedule; one step at a time.

Framework-free (no Lightning): the strategy drives it, and tests drive it under
``torch.multiprocessing.spawn``. A schedule reaches the engine only after the simulator found it
feasible (``ScheduleRejectedError`` otherwise) and torch's lowering found it can progress.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ...schedule import Problem, Schedule, simulate
from ..planning.partition import group_bounds
from ..planning.planner import forward_order, profiling_schedule
from .boundary import SendableChain
from .contract import LayerChain
from .module_state import batch_stat_layers
from .offload import OffloadManager, StageWaits, execution_waits
from .op_memory import CudaAllocator, OpMemoryWatch
from .shared_params import SharedGradients, shared_parameters
from .stage import OptPipeStage, RankCursor
from .torch_adapter import (
    check_lowering,
    load_order,
    make_forward_runtime,
    make_runtime,
    run_forward,
    run_step,
    torch_order,
)


class ScheduleRejectedError(ValueError):
    """The schedule failed the simulator's validation or torch's lowering; it is never run."""


def validate_for_execution(
    problem: Problem, schedule: Schedule, ordered_groups: Sequence[int] = ()
) -> list[StageWaits]:
    """The simulator's verdict (feasible) plus torch's lowering; raises with every reason.

    ``ordered_groups``: layer groups whose forwards must run in microbatch order (they hold
    layers with batch statistics, whose running statistics depend on the order of updates).

    Returns per stage the waits the executor honours (``offload.execution_waits``): where each
    offload leaves the device (list positions of a compute action and of the OFFLOAD whose copy
    ends before it starts) and which reloads wait for which offload's memory."""
    if schedule.num_stages != problem.num_stages:
        raise ScheduleRejectedError(
            f"schedule {schedule.generator!r} has {schedule.num_stages} stages, "
            f"the pipeline has {problem.num_stages}"
        )
    # a schedule solved with a memory margin carries its budget: the waits keep to it
    res = simulate(problem, schedule.actions, memory_budget=schedule.memory_budget)
    if not res.feasible:
        reasons = "; ".join(v.message for v in res.evaluation.violations[:3])
        raise ScheduleRejectedError(
            f"schedule {schedule.generator!r} is not feasible for this pipeline: {reasons}"
        )
    last_s, last_c = problem.group_table[problem.num_virtual_stages - 1]
    last_fs = [a.mb for a in schedule.actions[last_s] if a.op == "F" and a.chunk == last_c]
    if last_fs != sorted(last_fs):
        # torch's runtime looks a microbatch's loss up by its forward's position
        raise ScheduleRejectedError(
            f"schedule {schedule.generator!r}: the last layer group runs its forwards out of "
            "microbatch order, which torch's runtime cannot pair with their losses"
        )
    for g in ordered_groups:
        s, c = problem.group_table[g]
        fs = [a.mb for a in schedule.actions[s] if a.op == "F" and a.chunk == c]
        if fs != sorted(fs):
            raise ScheduleRejectedError(
                f"schedule {schedule.generator!r}: layer group {g} holds layers with batch "
                "statistics and runs its forwards out of microbatch order (their running "
                "statistics would differ from one device's)"
            )
    try:
        check_lowering(problem, schedule.actions)
    except ValueError as e:
        raise ScheduleRejectedError(f"schedule {schedule.generator!r}: {e}") from e
    assert res.timeline is not None
    return execution_waits(res.timeline)


class _LossHook:
    """The loss function torch calls on the last layer group, per microbatch.

    torch calls it with a microbatch's output right after that forward, and once more on the
    first step with a stand-in output (its shape inference). The stage remembers the output it
    produced and for which microbatch, so the hook knows which call is which: the stand-in gets
    a zero loss, a real output the caller's ``loss_fn(output, targets[mb])``. A ``loss_fn``
    that raises does not stop the pipeline (the other ranks are inside it too): the failure is
    kept and the rest of the step runs on zero losses; the caller reports it on every rank.
    """

    stages: list[OptPipeStage]
    problem: Problem
    loss_scale = 1.0
    # called once per step on the last group's rank, right after the last microbatch's loss
    # (every microbatch's step has answered by then): the strategy starts the loss hand-out
    # there, so the other ranks need not wait for this rank's last backwards. It must not raise
    # or wait for another rank (the other ranks are inside the pipeline).
    after_last_loss: Callable[[], None] | None = None

    def _begin(self, targets: Sequence[Any], loss_fn: Callable[[Any, Any], Any] | None) -> None:
        self._targets = targets
        self._loss_fn = loss_fn
        self.losses: dict[int, torch.Tensor] = {}
        self.failure: BaseException | None = None

    def _loss(self, output: Any, _target: Any) -> torch.Tensor:
        stage = next((st for st in self.stages if st.is_last), None)
        fn = getattr(self, "_loss_fn", None)
        if stage is None or fn is None or output is not stage.last_output:
            return _zero_loss(output)
        try:
            return self._real_loss(fn, output, stage.last_output_mb)
        finally:
            if stage.last_output_mb == self.problem.num_microbatches - 1 and self.after_last_loss:
                self.after_last_loss()

    def _real_loss(self, fn: Callable[[Any, Any], Any], output: Any, mb: int) -> torch.Tensor:
        if self.failure:
            return _zero_loss(output)
        try:
            loss = fn(output, self._targets[mb])
        except Exception as e:
            self.failure = e
            return _zero_loss(output)
        if loss is None:
            return _zero_loss(output)
        self.losses[mb] = loss.detach()
        return loss * self.loss_scale


def _local_chains(
    layers: Sequence[nn.Module],
    partition: Sequence[int],
    problem: Problem,
    pp_rank: int,
    device: torch.device,
) -> tuple[list[int], list[LayerChain]]:
    """This rank's layer groups (one per chunk) and their layers, moved to ``device``."""
    bounds = group_bounds(partition)
    groups = [problem.group_of(pp_rank, c) for c in range(problem.num_chunks)]
    last = problem.num_virtual_stages - 1
    # what crosses a boundary is made sendable (boundary.py); the last group's output is not sent
    chains: list[LayerChain] = [
        SendableChain(list(layers[bounds[g][0] : bounds[g][1]]), send_output=g != last).to(device)
        for g in groups
    ]
    return groups, chains


def _stages(
    groups: Sequence[int],
    chains: Sequence[LayerChain],
    problem: Problem,
    device: torch.device,
    pp_group: Any,
    cursor: RankCursor,
) -> list[OptPipeStage]:
    n = problem.num_virtual_stages
    return [
        OptPipeStage(m, g, n, device, pp_group, chunk=c, cursor=cursor)
        for c, (g, m) in enumerate(zip(groups, chains, strict=True))
    ]


class PipelineEngine(_LossHook):
    """Runs pipelined training steps of one pipeline replica on this rank."""

    def __init__(
        self,
        layers: Sequence[nn.Module],
        loss_fn: Callable[[Any, Any], torch.Tensor] | None,
        problem: Problem,
        schedule: Schedule,
        partition: Sequence[int],
        pp_rank: int,
        pp_group: Any,
        device: torch.device,
        offload_min_bytes: int = 0,
        measure: bool = False,
    ) -> None:
        bounds = group_bounds(partition)
        self.ordered_groups = [
            g for g, (a, b) in enumerate(bounds) if batch_stat_layers(list(layers)[a:b])
        ]
        waits = validate_for_execution(schedule.problem or problem, schedule, self.ordered_groups)
        self.problem = problem
        self.schedule = schedule
        self.pp_rank = pp_rank
        self.pp_group = pp_group
        self.device = device
        self.user_loss = loss_fn
        self.bounds = group_bounds(partition)
        self._layer_hooks: list[Any] = []
        # hand the loss out without waiting (the owner calls ``finish_loss_handout`` before the
        # process group goes away; the strategy does)
        self.async_loss = False
        self._loss_handout: tuple[Any, torch.Tensor] | None = None  # (work, tensor) in flight
        self.layers = list(layers)
        # parameters shared by layers of several ranks (tied embeddings): one parameter
        self.shared = SharedGradients(
            shared_parameters(self.layers, partition, problem), pp_rank, problem.num_stages
        )
        self.shared.allocate_dropped(device)
        self.local_groups, self.local_modules = _local_chains(
            self.layers, partition, problem, pp_rank, device
        )
        self.shared.broadcast_weights()
        params = [p for m in self.local_modules for p in m.parameters()]
        # one copy stream per direction unless the problem's channel is half duplex
        duplex = bool(getattr(problem.offload, "duplex", True)) if problem.offload else True
        self.offload = OffloadManager(device, params, offload_min_bytes, duplex=duplex)
        # GPU profiling also watches the allocator per action (what each op leaves allocated)
        watch = OpMemoryWatch(CudaAllocator(device)) if measure and device.type == "cuda" else None
        self.cursor = RankCursor(
            schedule.actions[pp_rank],
            self.offload,
            device,
            measure=measure,
            waits=waits[pp_rank].settle,
            reload_waits=waits[pp_rank].reloads,
            memory=watch,
        )
        self.stages = _stages(
            self.local_groups, self.local_modules, problem, device, pp_group, self.cursor
        )
        self.first_rank = problem.group_table[0][0]
        self.last_rank = problem.group_table[problem.num_virtual_stages - 1][0]
        self._begin((), loss_fn)
        self.runtime = make_runtime(
            self.stages,
            problem.num_microbatches,
            self._loss,
            torch_order(problem, schedule.actions),
        )

    # -- per-layer profiling ----------------------------------------------------------------------

    def instrument_layers(self, on: bool) -> None:
        """Time each local layer's forward and attribute saved bytes to it (profiling only)."""
        for h in self._layer_hooks:
            h.remove()
        self._layer_hooks = []
        if not on:
            return
        cursor = self.cursor
        sync = self.device.type == "cuda"
        starts: dict[int, float] = {}
        for g, chain in zip(self.local_groups, self.local_modules, strict=True):
            first = self.bounds[g][0]
            for i, layer in enumerate(chain.layers):
                idx = first + i

                def pre(_m: nn.Module, _a: Any, idx: int = idx) -> None:
                    if sync:  # pragma: no cover - GPU only
                        torch.cuda.synchronize(self.device)
                    cursor.current_layer = idx
                    starts[idx] = time.perf_counter()

                def post(_m: nn.Module, _a: Any, _o: Any, idx: int = idx) -> None:
                    if sync:  # pragma: no cover - GPU only
                        torch.cuda.synchronize(self.device)
                    if torch.is_grad_enabled():
                        cursor.layer_fwd[idx].append(time.perf_counter() - starts[idx])
                        if cursor.count_bytes:
                            cursor.layer_byte_samples[idx] += 1
                        if idx not in cursor.layer_io:  # what it takes and gives (identity)
                            cursor.layer_io[idx] = f"{_shapes(_a)}->{_shapes(_o)}"
                    cursor.current_layer = None

                self._layer_hooks.append(layer.register_forward_pre_hook(pre))
                self._layer_hooks.append(layer.register_forward_hook(post))

    def layer_costs(self) -> dict[int, tuple[float, float, list[float], str]]:
        """Per local layer: (forward + share of its chunk's backward) seconds, saved bytes per
        microbatch, every timed forward scaled the same way (its spread), and its identity
        (class, parameter and buffer shapes, input and output shapes: equal identities are
        identical layers).

        A layer's backward is estimated as its chunk's measured B + W scaled by the layer's
        share of the chunk's forward time.
        """
        cur = self.cursor
        out: dict[int, tuple[float, float, list[float], str]] = {}
        for c, g in enumerate(self.local_groups):
            f = cur.times.get(("F", c), [])
            bw = cur.times.get(("B", c), []) + cur.times.get(("W", c), [])
            ratio = (sum(bw) / max(sum(f), 1e-12)) if f else 2.0
            a, b = self.bounds[g]
            for idx in range(a, b):
                ts = cur.layer_fwd.get(idx, [])
                fwd = statistics.median(ts) if ts else 0.0
                n_saved = cur.layer_byte_samples.get(idx, 0)
                saved = cur.layer_bytes.get(idx, 0) / n_saved if n_saved else 0.0
                layer = self.layers[idx]
                ident = "|".join(
                    (
                        type(layer).__qualname__,
                        _shapes(list(layer.parameters())),
                        _shapes(list(layer.buffers())),
                        cur.layer_io.get(idx, "?"),
                    )
                )
                scaled = [t * (1.0 + ratio) for t in ts]
                out[idx] = (fwd * (1.0 + ratio), saved, scaled, ident)
        return out

    @property
    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters, each once (a tied weight may sit in two local chunks)."""
        unique = {id(p): p for m in self.local_modules for p in m.parameters()}
        return list(unique.values())

    # -- stepping ------------------------------------------------------------------------------

    def run(
        self,
        arg_mbs: Sequence[tuple[Any, ...]] | None,
        targets: Sequence[Any],
        grad_scale: float = 1.0,
        loss_fn: Callable[[Any, Any], Any] | None = None,
    ) -> dict[int, torch.Tensor]:
        """Forward and backward of one batch; gradients accumulate into ``.grad``.

        ``arg_mbs``: each microbatch's inputs (used on the rank of the first layer group);
        ``targets[mb]`` goes to ``loss_fn(output, targets[mb])`` (default: the engine's) on the
        last group's rank, whose loss is multiplied by ``grad_scale / M`` before its backward
        (``grad_scale = 1/accumulate_grad_batches`` reproduces Lightning's accumulation). Returns
        the microbatch losses (unscaled, detached) on the last group's rank, else nothing;
        ``self.failure`` holds what a ``loss_fn`` raised. A parameter shared by layers of
        several ranks gets the sum of their gradients on each of them (``shared_params``).
        """
        m = self.problem.num_microbatches
        self.loss_scale = grad_scale / m
        self._begin(targets, loss_fn or self.user_loss)
        self.cursor.reset()
        args = _joined(arg_mbs, self.device) if self.pp_rank == self.first_rank else None
        before = self.shared.grads_before()
        run_step(self.runtime, args, m)
        self.shared.sum_gradients(before)
        self.cursor.step_done()
        if not self.cursor.finished():
            raise RuntimeError(
                f"rank {self.pp_rank} ran only {self.cursor.pos} of "
                f"{len(self.cursor.actions)} actions of the schedule"
            )
        leaked = [k for k, st in self.offload.stores.items() if st.saved]
        if leaked:
            raise RuntimeError(f"activation stores {leaked} were not released by their W/BW")
        return self.losses

    def step(self, inputs: Any, targets: Any, grad_scale: float = 1.0) -> torch.Tensor:
        """``run`` on a whole batch: inputs (a tensor or a tuple of tensors) and targets cut
        into M microbatches along dimension 0; the batch's mean loss on every rank."""
        m = self.problem.num_microbatches
        args = inputs if isinstance(inputs, tuple | list) else (inputs,)
        arg_mbs = [tuple(a.tensor_split(m)[i] for a in args) for i in range(m)]
        target_mbs = [_to_device(t, self.device) for t in targets.tensor_split(m)]
        losses = self.run(arg_mbs, target_mbs, grad_scale)
        return self._broadcast_loss(losses)

    def _broadcast_loss(self, losses: dict[int, torch.Tensor]) -> torch.Tensor:
        """The batch's mean loss on every rank of the pipeline from the last group's rank, or
        its loss function's failure.

        With ``async_loss`` the sending rank does not wait for the others to take it: they may
        still be running their last backwards, and waiting would push its optimizer update to
        after theirs (two updates at once on shared cores and memory bandwidth, and no overlap
        with the tail of the step). The hand-out completes in the background;
        ``finish_loss_handout`` (at the next step, or at the end) waits for it. The receiving
        ranks need the value (and the failure flag) now.
        """
        self.finish_loss_handout()
        m = self.problem.num_microbatches
        box = torch.zeros(2, device=self.device)
        if self.pp_rank == self.last_rank:
            if self.failure is not None:
                box[1] = 1.0
            else:
                box[0] = torch.stack([losses[i].detach().float() for i in range(m)]).mean()
        if dist.is_initialized() and dist.get_world_size(self.pp_group) > 1:
            if self.pp_rank == self.last_rank and self.async_loss:
                sent = box.clone()  # the caller may change the result in place (replicas)
                work = dist.broadcast(
                    sent, group=self.pp_group, group_src=self.last_rank, async_op=True
                )
                self._loss_handout = (work, sent)
            else:
                dist.broadcast(box, group=self.pp_group, group_src=self.last_rank)
        if box[1] > 0:
            raise RuntimeError(
                f"the loss function failed on the last pipeline stage: {self.failure!r}"
            ) from self.failure
        return box[0]

    def keep_handout(self, work: Any, sent: torch.Tensor) -> None:
        """Hold a hand-out this rank started elsewhere (the strategy's training step) like its
        own: waited for at the next hand-out, a switch or the end; waited for now without
        ``async_loss``."""
        self.finish_loss_handout()
        if self.async_loss:
            self._loss_handout = (work, sent)
        else:
            work.wait()

    def finish_loss_handout(self, timeout: float | None = None) -> None:
        """Wait until the other ranks took the last loss this rank sent (see above); with a
        ``timeout`` (seconds, at the end of a run) give up after it and raise nothing."""
        pending, self._loss_handout = self._loss_handout, None
        if pending is None:
            return
        if timeout is None:
            pending[0].wait()
            return
        with contextlib.suppress(Exception):  # a rank that died must not hang the others' end
            pending[0].wait(timedelta(seconds=timeout))

    def switch(self, schedule: Schedule, problem: Problem | None = None) -> None:
        """Run ``schedule`` from the next step on (call on every rank at the same step boundary).

        The schedule is validated against its own problem (``problem``, else the one embedded in
        it, else the current one), which must have the same shape: stages, microbatches, chunks
        and placement (the partition of layers does not change).
        """
        target = problem or schedule.problem or self.problem
        shape = ("num_stages", "num_microbatches", "num_chunks", "placement")
        if any(getattr(target, k) != getattr(self.problem, k) for k in shape):
            raise ScheduleRejectedError(
                f"schedule {schedule.generator!r} is for a pipeline of another shape "
                f"({', '.join(f'{k}={getattr(target, k)}' for k in shape)}); a switch keeps "
                "stages, microbatches, chunks and placement"
            )
        waits = validate_for_execution(target, schedule, self.ordered_groups)
        load_order(self.runtime, torch_order(target, schedule.actions))
        mine = waits[self.pp_rank]
        self.cursor.set_actions(schedule.actions[self.pp_rank], mine.settle, mine.reloads)
        self.schedule = schedule
        self.problem = target


class ForwardPipeline(_LossHook):
    """Forward-only passes (validation, test, predict) over this rank's layer groups.

    Its own torch stages and runtime (separate from training's, so neither re-infers shapes
    when the other runs), fixed to one microbatch count and input shape. Each microbatch's
    output goes to ``loss_fn(output, targets[mb])`` on the last group's rank.
    """

    def __init__(
        self,
        layers: Sequence[nn.Module],
        problem: Problem,
        partition: Sequence[int],
        pp_rank: int,
        pp_group: Any,
        device: torch.device,
    ) -> None:
        self.problem = problem
        self.pp_rank = pp_rank
        self.device = device
        order = forward_order(problem)
        self.cursor = RankCursor(order[pp_rank], None, device)
        self.local_groups, self.local_modules = _local_chains(
            layers, partition, problem, pp_rank, device
        )
        self.stages = _stages(
            self.local_groups, self.local_modules, problem, device, pp_group, self.cursor
        )
        self.first_rank = problem.group_table[0][0]
        self.last_rank = problem.group_table[problem.num_virtual_stages - 1][0]
        self._begin((), None)
        training_order = profiling_schedule(problem).actions
        self.runtime = make_forward_runtime(
            self.stages,
            problem.num_microbatches,
            self._loss,
            torch_order(problem, training_order),
            torch_order(problem, order),
        )

    def run(
        self,
        arg_mbs: Sequence[tuple[Any, ...]] | None,
        targets: Sequence[Any],
        loss_fn: Callable[[Any, Any], Any],
    ) -> None:
        """One forward-only pass; ``self.failure`` holds what ``loss_fn`` raised."""
        self._begin(targets, loss_fn)
        self.cursor.reset()
        args = _joined(arg_mbs, self.device) if self.pp_rank == self.first_rank else None
        run_forward(self.runtime, args, self.problem.num_microbatches)
        if not self.cursor.finished():
            raise RuntimeError(
                f"rank {self.pp_rank} ran only {self.cursor.pos} of "
                f"{len(self.cursor.actions)} forwards"
            )


def _joined(arg_mbs: Sequence[tuple[Any, ...]] | None, device: torch.device) -> tuple[Any, ...]:
    """The microbatches' inputs as whole-batch tensors (torch cuts them again, equally).

    Inputs that are the batch's own pieces in order (the default step's: ``split_batch``
    cuts the batch into views) give the batch back without a copy (``_whole``)."""
    if not arg_mbs:
        raise ValueError("the first layer group's rank needs the microbatches' inputs")
    out = []
    for i in range(len(arg_mbs[0])):
        parts = [mb[i] for mb in arg_mbs]
        whole = _whole(parts)
        out.append((whole if whole is not None else torch.cat(parts)).to(device))
    return tuple(out)


def _whole(parts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The tensor ``parts`` are consecutive pieces of along dimension 0, covering it in order
    (what ``torch.cat(parts)`` would copy), or None."""
    base = parts[0]._base
    if base is None or not base.is_contiguous() or base.ndim == 0:
        return None
    row = base[0].numel() * base.element_size() if base.shape[0] else 0
    at = base.data_ptr()
    for p in parts:
        if p._base is not base or p.shape[1:] != base.shape[1:] or not p.is_contiguous():
            return None
        if p.data_ptr() != at:
            return None
        at += p.shape[0] * row
    if at != base.data_ptr() + base.shape[0] * row:
        return None
    return base


def _zero_loss(output: Any) -> torch.Tensor:
    """A zero that depends on the output where it can (so a backward from it runs)."""
    parts = [
        t.float().sum() * 0.0
        for t in (output if isinstance(output, tuple | list) else (output,))
        if isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    return torch.stack(parts).sum() if parts else torch.zeros(())


def _shapes(x: Any) -> str:
    """The shapes and dtypes of the tensors in ``x`` (nested tuples, lists, dicts)."""
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)}:{str(x.dtype).removeprefix('torch.')}"
    if isinstance(x, tuple | list):
        return "(" + ",".join(_shapes(v) for v in x) + ")"
    if isinstance(x, dict):
        return "{" + ",".join(f"{k}={_shapes(v)}" for k, v in sorted(x.items())) + "}"
    return type(x).__name__


def _to_device(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, tuple | list):
        return type(x)(_to_device(v, device) for v in x)
    return x
