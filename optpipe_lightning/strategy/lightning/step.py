"""The strategy's step hooks: the module's steps through the pipeline, and around them.

``PipelinedSteps.train`` (``training_step``): the batch into microbatches (the count chosen on
the first batch), the module's step per microbatch (``module_steps.ModuleStep``) through the
training engine, the last stage's loss, logs and outputs on every rank. ``forward``
(``validation_step``, ``test_step``, ``predict_step``): the same over a forward-only pipeline.

Lightning calls ``training_step``, then zeroes the gradients (``optimizer.zero_grad`` runs
between the step and ``backward``), then ``backward``. The pipeline runs forward and backward
inside the step, so ``GradientHandover`` runs it on fresh ``.grad``, keeps its gradients aside,
restores what was there, and adds them in ``backward`` (accumulation over batches works as on
one device). Data-parallel replicas average gradients and loss after the step; norm clipping
takes the 2-norm over every stage's gradients (one all-reduce over the pipeline).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer

from ..planning.options import OptPipeConfigError
from ..runtime.chain_probe import probe_forward
from ..runtime.checkpoint import keep_local_optimizer_state
from ..runtime.microbatch import MicrobatchError, leading_size, shape_key, signature, split_batch
from ..runtime.process_groups import PipelineComm
from .module_steps import LogLayout, ModuleStep, StepPayload
from .step_metrics import StepMetrics

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from ..scheduling.scheduler import Scheduler

T = TypeVar("T")
Context = Callable[[], AbstractContextManager[Any]]


class PipelinedSteps:
    """The module's steps through the pipeline, as the strategy's step hooks run them."""

    def __init__(self, comm: PipelineComm, device: torch.device, guard: Callable[[bool], None]):
        self.comm = comm
        self.device = device
        self.guard = guard  # guard(True): collectives refuse while a step runs on one rank
        self.grads = GradientHandover()
        self.log_layout = LogLayout()  # what the training steps log (``share_training``)
        self.metrics = StepMetrics()  # the strategy's ``optpipe/...`` metrics, when they change
        self._input_shape: Any = None  # the training pipeline's (torch fixes it on step 1)
        # the modes (training or not) the module's forward was probed in (``chain_probe``)
        self._chain_checked: set[bool] = set()

    def check_chain(self, module: pl.LightningModule, sched: Scheduler, inputs: Any) -> None:
        """Once per mode (the sanity check's evaluation comes before the first training batch),
        before that mode's first pipeline is built: the module's forward must be the chain of
        its layers (``chain_probe``; one line on every rank when it is not)."""
        if module.training in self._chain_checked:
            return
        self._chain_checked.add(module.training)
        if sched.spec.forward_is_chain:
            return
        skipped = probe_forward(module, sched.spec.layers, tuple(inputs))
        if skipped is not None and self.comm.is_global_zero:
            warnings.warn(
                f"optpipe: the check that {type(module).__name__}.forward is the chain of its "
                f"layers did not run: {skipped}",
                stacklevel=2,
            )

    def train(
        self,
        module: pl.LightningModule,
        sched: Scheduler,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        context: Context,
        optimizers: Sequence[Optimizer],
        loss_scale: float = 1.0,
    ) -> Any:
        """One pipelined training step; the batch's loss (or ``{"loss": ..., ...}``).

        ``loss_scale``: what each loss is multiplied by before its backward besides ``1 / (M x
        accumulate)`` (a grad scaler's scale; Lightning's ``backward`` would apply it)."""
        batch, rest, kw = step_arguments(args, kwargs)
        first = sched.engine is None
        try:
            if first:
                check_same_batch(batch, self.comm)
                m = sched.training_microbatches(leading_size(batch))
            else:
                assert sched.num_microbatches is not None
                m = sched.num_microbatches
            mbs = split_batch(batch, m)
        except MicrobatchError as e:
            raise OptPipeConfigError(str(e)) from None
        step = ModuleStep(module, "training_step", rest, kw, train=True, guard=self.guard)
        # only the rank of the last stage checks the step's inputs (``ModuleStep.answer``)
        last = sched.engine is None or self.comm.pp_rank == sched.engine.last_rank
        with context():
            arg_mbs = step.inputs(mbs, fingerprint=last)
            if first:
                self.check_chain(module, sched, arg_mbs[0])
        if first:
            self._input_shape = shape_key(arg_mbs[0])
            sched.build(m, leading_size(mbs[0]), self.comm.num_stages * self.comm.data_parallel)
        elif shape_key(arg_mbs[0]) != self._input_shape:
            raise OptPipeConfigError(
                "the pipeline's input shape changed between training batches (torch's pipeline "
                "stages keep the shapes of the first step): give every batch one shape "
                "(drop_last=True, a fixed sequence length)"
            )
        engine = sched.engine
        assert engine is not None
        # the other ranks' receive of the step's hand-out, posted now: it lands while they run
        step.expect_training(self.comm, engine.last_rank, self.device, self.log_layout)
        params = engine.parameters  # once per step (a walk over the local modules)
        keep_local_optimizer_state(optimizers, params)
        accumulate = max(1, int(module.trainer.accumulate_grad_batches))

        def post() -> None:
            # the last stage, right after the last microbatch's loss: the others have taken the
            # last step's hand-out by now (they are in this step's pipeline), so no wait
            try:
                engine.finish_loss_handout()
            except Exception:  # a peer gone: the hand-out after the step reports it
                return
            step.post_training(self.comm, engine.last_rank, self.device, self.log_layout)

        def run() -> tuple[Tensor, StepPayload]:
            engine.after_last_loss = post if self.comm.pp_rank == engine.last_rank else None
            try:
                with context():
                    sched.run_step(
                        arg_mbs, list(enumerate(mbs)), loss_scale / accumulate, step.answer
                    )
            finally:
                engine.after_last_loss = None
            engine.finish_loss_handout()  # the last step's, before this one's
            payload = step.share_training(
                self.comm, engine.last_rank, self.device, engine.keep_handout, self.log_layout
            )
            loss = torch.tensor(payload.loss, dtype=torch.float32, device=self.device)
            return average_over_replicas(params, loss, self.comm), payload

        # Lightning zeroes gradients *after* training_step and before backward: run the pipeline
        # on fresh .grad, keep its gradients aside, and hand them over in ``backward``.
        loss, payload = self.grads.run(params, run)
        step.replay(payload, self.device)
        replicas = self.comm.data_parallel
        tokens = token_count(arg_mbs)
        sched.note_batch(
            # one replica: the last stage's number as sent (no device read); else the mean over
            # replicas, read when the run log writes
            payload.loss if replicas == 1 else loss.detach(),
            leading_size(batch) * replicas,
            None if tokens is None else tokens * replicas,
        )
        if isinstance(payload.output, dict) and payload.output:
            return {"loss": loss, **payload.output}
        return loss

    def forward(
        self,
        hook: str,
        module: pl.LightningModule,
        sched: Scheduler,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        context: Context,
    ) -> Any:
        """A forward-only step (``hook``: validation, test, predict); its joined outputs."""
        batch, rest, kw = step_arguments(args, kwargs)
        try:
            m = sched.eval_microbatches(leading_size(batch))
            mbs = split_batch(batch, m)
        except MicrobatchError as e:
            raise OptPipeConfigError(str(e)) from None
        step = ModuleStep(module, hook, rest, kw, guard=self.guard)
        with context():
            arg_mbs = step.inputs(mbs)
            key = shape_key(arg_mbs[0])
            if not sched.has_forward_pipeline(m, key):
                check_same_batch(batch, self.comm)
                self.check_chain(module, sched, arg_mbs[0])
            pipe = sched.forward_pipeline(m, key)
            pipe.run(arg_mbs, list(enumerate(mbs)), step.answer)
        payload = step.share(self.comm, pipe.last_rank)
        step.replay(payload, self.device)
        return payload.output


def token_count(arg_mbs: Sequence[tuple[Any, ...]]) -> int | None:
    """Tokens in a batch whose pipeline input is token ids (an integer tensor of two or more
    dimensions, batch first: its elements); None otherwise."""
    total = 0
    for args in arg_mbs:
        t = args[0] if args else None
        if (
            not isinstance(t, Tensor)
            or t.ndim < 2
            or t.is_floating_point()
            or t.is_complex()
            or t.dtype is torch.bool
        ):
            return None
        total += int(t.numel())
    return total if arg_mbs else None


def step_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(batch, the step's other positional arguments, its keyword arguments)."""
    kw = dict(kwargs)
    if args:
        return args[0], args[1:], kw
    return kw.pop("batch"), (), kw


def check_same_batch(batch: Any, comm: PipelineComm) -> None:
    """Every stage of a pipeline runs the step on the same samples (one collective)."""
    if not comm.distributed:
        return
    sigs = comm.gather(signature(batch))
    if any(x != sigs[0] for x in sigs):
        raise OptPipeConfigError(
            "the ranks of one pipeline got different batches (stage 0's inputs would meet "
            "other samples in the last stage's step); let Lightning add its distributed sampler "
            "(use_distributed_sampler=True) or give every stage of a replica the same data"
        )


class GradientHandover:
    """Gradients made inside the step, held until Lightning's ``backward`` asks for them."""

    def __init__(self) -> None:
        self._params: list[nn.Parameter] = []
        self._pending: list[Tensor | None] | None = None

    def run(self, params: Sequence[nn.Parameter], fn: Callable[[], T]) -> T:
        """``fn()`` on fresh ``.grad``; its gradients are held, the old ones put back."""
        old = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            out = fn()
            self._params = list(params)
            self._pending = [p.grad for p in params]
        finally:
            for p, g in zip(params, old, strict=True):
                p.grad = g
        return out

    def give(self) -> None:
        """Add the held gradients to ``.grad`` (Lightning's ``backward``)."""
        if self._pending is None:
            return
        for p, g in zip(self._params, self._pending, strict=True):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
        self._pending = None


def average_over_replicas(
    params: Sequence[nn.Parameter], loss: Tensor, comm: PipelineComm
) -> Tensor:
    """Gradients (in ``.grad``) and the loss averaged over the data-parallel replicas."""
    if comm.dp_group is None:
        return loss
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=comm.dp_group)
            p.grad.div_(comm.data_parallel)
    dist.all_reduce(loss, group=comm.dp_group)
    return loss / comm.data_parallel


def clip_grad_norm_over_pipeline(
    params: Sequence[nn.Parameter],
    clip_val: float,
    comm: PipelineComm | None,
    device: torch.device,
    counted_elsewhere: Sequence[nn.Parameter] = (),
) -> None:
    """``clip_grad_norm_`` with the 2-norm over every stage's gradients (one all-reduce); a
    parameter in ``counted_elsewhere`` (shared, another rank counts it) is scaled, not counted."""
    grads = [p.grad for p in params if p.grad is not None]
    skip = {id(p) for p in counted_elsewhere}
    sq = torch.zeros(1, device=device)
    for p in params:
        if p.grad is not None and id(p) not in skip:
            sq += p.grad.detach().float().pow(2).sum()
    if comm is not None and comm.distributed and comm.pp_group is not None:
        dist.all_reduce(sq, group=comm.pp_group)
    coef = torch.clamp(float(clip_val) / (sq.sqrt() + 1e-6), max=1.0)
    for g in grads:
        g.detach().mul_(coef.to(g.dtype))
