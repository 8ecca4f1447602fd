"""The module's own steps, run around the pipeline: the pipeline answers the module's forward.

A step (``training_step``, ``validation_step``, ``test_step``, ``predict_step``) is called once
per microbatch, with that microbatch as its batch:

1. **Inputs** (every rank, before the pipeline runs): the step runs until it calls the module's
   forward (``self(x)`` or ``self.forward(x)``); the arguments of that call are the pipeline's
   inputs for the microbatch (stage 0 feeds them to the first layer) and the step stops there
   (``self.log`` does nothing in this pass). Every rank runs this with the same batch, so a step
   that breaks a rule fails on every rank at once, before any rank waits on another.
2. **Answer** (the last stage, inside the pipeline, as each microbatch's output arrives): the
   step runs again on the microbatch and its forward returns the pipeline's output; what it
   logs is kept, and in training the loss it returns drives the schedule's backward.
3. **Share** (every rank of the pipeline, after it ran): the last stage sends the batch's loss,
   its logged values (each metric's microbatch values averaged, or summed for a metric summed
   over steps, ``reduce_fx="sum"``) and the
   step's joined outputs to the other stages, or the one-line error its step raised; then every
   rank logs the same values (``replay``), so loggers, the progress bar, ``callback_metrics``,
   checkpoints and early stopping see one device's value whichever rank computed it.

Rules (``PipelineStepError`` names the one broken): the step calls the forward once, with
positional tensor arguments (batch first), on inputs computed from the batch alone (no
randomness in the step before the forward: it runs twice on the last stage); a training step
returns the loss (a scalar tensor computed from the forward's output) or a dict with ``"loss"``;
the step makes no collective calls itself (it runs on one rank); values are logged as numbers
or scalar tensors (not ``torchmetrics.Metric`` objects).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch import Tensor

from ..runtime.microbatch import InputFingerprint, combine_logged, merge_outputs, shape_key
from ..runtime.process_groups import PipelineComm

_LOG_SIGNATURE = inspect.signature(pl.LightningModule.log)
# the keywords ``self.log`` takes besides name and value (both positional in the common call)
_LOG_KEYWORDS = frozenset(
    k
    for k, p in _LOG_SIGNATURE.parameters.items()
    if k not in ("self", "name", "value") and p.kind is not inspect.Parameter.VAR_KEYWORD
)
_MISSING = object()


class PipelineStepError(RuntimeError):
    """A module step broke a rule of pipelined steps, or raised; the same line on every rank."""


class _ForwardCalled(BaseException):
    """Stops a step at its forward call (a BaseException: ``except Exception`` lets it pass)."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.call_args = args
        self.call_kwargs = kwargs


# ``ModuleStep.share_training``'s kinds of hand-out
_LOSS, _EMPTY, _OBJECTS = 0, 1, 2


@dataclass
class StepPayload:
    """What the last stage tells the other stages after a step."""

    loss: float | None = None
    logs: list[tuple[str, Tensor, dict[str, Any]]] = field(default_factory=list)
    output: Any = None
    error: str | None = None


class LogLayout:
    """The names, options and dtypes of what the last training step handed out pickled, kept
    alike on every rank of a pipeline: a step that logs the same again sends only the values
    (``ModuleStep.share_training``)."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, torch.dtype, dict[str, Any]]] = []

    def learn(self, logs: Sequence[tuple[str, Tensor, dict[str, Any]]]) -> None:
        self.entries = [(name, value.dtype, opts) for name, value, opts in logs]

    def packs(self, logs: Sequence[tuple[str, Tensor, dict[str, Any]]], box: Tensor) -> bool:
        """Whether ``logs`` have this layout; their values then go into ``box[2:]`` (exactly:
        a value float64 cannot hold makes it False)."""
        if len(logs) != len(self.entries):
            return False
        for i, ((name, value, opts), (n, dtype, o)) in enumerate(
            zip(logs, self.entries, strict=True)
        ):
            if name != n or value.dtype != dtype or opts != o:
                return False
            box[2 + i] = value.reshape(()).to(torch.float64)
            if not value.is_floating_point() and box[2 + i].to(dtype) != value.reshape(()):
                return False
        return True

    def unpack(self, box: Tensor) -> list[tuple[str, Tensor, dict[str, Any]]]:
        return [
            (name, box[2 + i].to(dtype, copy=True), dict(opts))
            for i, (name, dtype, opts) in enumerate(self.entries)
        ]


class ModuleStep:
    """One call of a module's step hook, for the microbatches of one batch."""

    def __init__(
        self,
        module: pl.LightningModule,
        hook: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        train: bool = False,
        guard: Callable[[bool], None] | None = None,
    ) -> None:
        self.module = module
        self.hook = hook
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.train = train
        self.guard = guard  # guard(True): collectives refuse while the step runs on one rank
        self._fingerprints: list[InputFingerprint] = []
        self._logs: list[list[tuple[str, Tensor, dict[str, Any]]]] = []
        self._losses: list[Tensor] = []
        self._outputs: list[Any] = []
        self.failure: BaseException | None = None
        self.error: str | None = None
        # the hand-out the last stage started inside the pipeline (``post_training``):
        # (work, tensor, its kind)
        self._posted: tuple[Any, Tensor, int] | None = None
        # another rank's receive of that hand-out, posted before the pipeline ran
        # (``expect_training``): (work, tensor)
        self._expected: tuple[Any, Tensor] | None = None
        self._kind: Any = _MISSING  # the default step's kind, or None (``_default_kind``)

    # ---- 1. inputs ---------------------------------------------------------------------------

    def inputs(
        self, microbatches: Sequence[Any], fingerprint: bool = True
    ) -> list[tuple[Tensor, ...]]:
        """The forward's arguments for each microbatch (every rank; the step stops there).

        ``fingerprint``: keep their fingerprints (``InputFingerprint``), which the last stage's
        ``answer`` checks; a rank known not to hold the last stage skips them."""
        out: list[tuple[Tensor, ...]] = []
        for batch in microbatches:

            def forward(*a: Any, **kw: Any) -> Any:
                raise _ForwardCalled(a, kw)

            with torch.no_grad():
                try:
                    self._run(batch, forward, _ignore_log)
                except _ForwardCalled as called:
                    args, kwargs = called.call_args, called.call_kwargs
                else:
                    raise PipelineStepError(
                        f"{self.hook} did not call the module's forward (self(...) or "
                        "self.forward(...)): under OptPipeStrategy the pipeline computes the "
                        f"forward; call self(inputs) once and compute the "
                        f"{'loss' if self.train else 'results'} from what it returns"
                    )
            if kwargs:
                raise PipelineStepError(
                    f"{self.hook} called the forward with keyword arguments "
                    f"({', '.join(kwargs)}); the pipeline's first layer takes positional "
                    "tensors: call self(x, ...) with them in order"
                )
            if not args or not all(isinstance(a, Tensor) for a in args):
                kinds = ", ".join(type(a).__name__ for a in args) or "nothing"
                raise PipelineStepError(
                    f"{self.hook} called the forward with {kinds}; the pipeline's inputs are "
                    "tensors (batch first)"
                )
            if out and shape_key(args) != shape_key(out[0]):
                raise PipelineStepError(
                    f"{self.hook}: the forward's inputs differ in shape between microbatches "
                    f"({_shapes(out[0])} and {_shapes(args)}); the pipeline needs equal shapes "
                    "(pad every batch to one length)"
                )
            if fingerprint:
                self._fingerprints.append(InputFingerprint(args))
            out.append(tuple(args))
        return out

    # ---- 2. answer (last stage, inside the pipeline) ------------------------------------------

    def answer(self, output: Any, target: tuple[int, Any]) -> Tensor | None:
        """The step on microbatch ``i`` with its forward answered by ``output``; the loss (training).

        Never raises (the other stages are inside the pipeline too): a failure is kept and the
        pipeline finishes on a zero loss; ``share`` reports it on every rank.
        """
        i, batch = target
        if self.error is not None:
            return None
        calls: list[int] = []
        logs: list[tuple[str, Tensor, dict[str, Any]]] = []

        def forward(*a: Any, **kw: Any) -> Any:
            if calls:
                raise PipelineStepError(
                    f"{self.hook} called the module's forward twice for one batch; the "
                    "pipeline answers one forward per step: call self(inputs) once"
                )
            calls.append(1)
            if i < len(self._fingerprints) and not self._fingerprints[i].matches(a):
                raise PipelineStepError(
                    f"{self.hook} computed other inputs for the forward when it ran again "
                    "(randomness in the step before self(...)?): the step runs twice on the "
                    "last stage; make its inputs depend on the batch only (augment in the "
                    "DataLoader)"
                )
            return output

        def log(*a: Any, **kw: Any) -> None:
            logs.append(_logged(self.hook, a, kw))

        if self.guard is not None:
            self.guard(True)
        try:
            result = self._run(batch, forward, log)
            loss = self._loss_of(result) if self.train else None
        except Exception as e:
            self.failure = e
            self.error = (
                str(e)
                if isinstance(e, PipelineStepError)
                else f"{self.hook} raised {type(e).__name__}: {e} (on the last pipeline stage, "
                f"microbatch {i})"
            )
            return None
        finally:
            if self.guard is not None:
                self.guard(False)
        self._logs.append(logs)
        if loss is not None:
            self._losses.append(loss.detach())
            extra = (
                {k: v for k, v in result.items() if k != "loss"}
                if isinstance(result, dict)
                else None
            )
            self._outputs.append(extra)
        else:
            self._outputs.append(_detached(result))
        return loss

    def _loss_of(self, result: Any) -> Tensor:
        loss = result.get("loss") if isinstance(result, Mapping) else result
        if loss is None:
            raise PipelineStepError(
                f"{self.hook} returned {'a dict without loss' if isinstance(result, Mapping) else 'None'}"
                "; under OptPipeStrategy every microbatch needs a loss (skipping a batch is not "
                "supported): return the loss or {'loss': loss, ...}"
            )
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise PipelineStepError(
                f"{self.hook} returned {type(loss).__name__}"
                f"{'' if not isinstance(loss, Tensor) else f' of shape {tuple(loss.shape)}'}; "
                "the loss must be a scalar tensor"
            )
        if not loss.requires_grad:
            raise PipelineStepError(
                f"{self.hook}'s loss does not depend on the forward's output: compute it from "
                "what self(inputs) returns"
            )
        return loss.reshape(())

    # ---- 3. share and replay -----------------------------------------------------------------

    def payload(self) -> StepPayload:
        """The last stage's report: batch loss, joined logs and outputs, or the error."""
        if self.error is not None:
            return StepPayload(error=self.error)
        out = StepPayload()
        if self.train and self._losses:
            out.loss = float(torch.stack(self._losses).double().mean())
        out.logs = _joined_logs(self._logs)
        if self._has_output():
            out.output = _to_cpu(merge_outputs(self._outputs))
        return out

    def _has_output(self) -> bool:
        """Whether the step returned more than its loss (a dict of the loss alone does not)."""
        return any(o is not None and not (isinstance(o, dict) and not o) for o in self._outputs)

    def share(self, comm: PipelineComm, last_rank: int) -> StepPayload:
        """The last stage's payload on every rank of the pipeline (a collective)."""
        mine = self.payload() if comm.pp_rank == last_rank else None
        if comm.distributed and comm.num_stages > 1:
            box = [mine]
            dist.broadcast_object_list(box, group=comm.pp_group, group_src=last_rank)
            mine = box[0]
        assert mine is not None
        if mine.error is not None:
            raise PipelineStepError(mine.error) from self.failure
        return mine

    def post_training(
        self, comm: PipelineComm, last_rank: int, device: torch.device, layout: LogLayout
    ) -> None:
        """The last stage, inside the pipeline right after its last microbatch's step answered
        (the engine's ``after_last_loss``): start the hand-out ``share_training`` would send
        after the step, on ``comm.handout_group``, without waiting for the other ranks, so
        they can take it when their own pipeline step ends instead of after this rank's last
        backwards (the V-shape's last stage finishes last). Never raises (the other ranks are
        inside the pipeline): anything that fails here is left to ``share_training``."""
        if self._posted is not None or comm.handout_group is None or comm.pp_rank != last_rank:
            return
        try:
            box, kind = self._handout_box(layout, device)
            work = dist.broadcast(box, group=comm.handout_group, group_src=last_rank, async_op=True)
        except Exception:
            return
        self._posted = (work, box, kind)

    def expect_training(
        self, comm: PipelineComm, last_rank: int, device: torch.device, layout: LogLayout
    ) -> None:
        """Every rank but the last stage's, before the pipeline runs: post the receive of the
        hand-out ``share_training`` takes after the step (same group, same tensor).

        gloo moves a message once the receiver has posted its receive; a receive posted only
        after this rank's pipeline step ends makes the last stage's rank (busy with its own
        backwards, its optimizer update or the next step) wake to send it then, and this rank
        waits for that wake-up (~1-3 ms a step on 2 CPU processes). Posted early, the hand-out
        arrives as soon as the last stage starts it (``post_training``). Only on a gloo
        ``comm.handout_group`` (a group of its own: nothing else is ordered behind it; NCCL
        moves it without that wake-up, and a collective left pending beside the pipeline's
        traffic is not worth its risk there)."""
        if (
            self._expected is not None
            or comm.handout_group is None
            or comm.pp_rank == last_rank
            or not (comm.distributed and comm.num_stages > 1)
            or dist.get_backend(comm.handout_group) != "gloo"
        ):
            return
        box = torch.zeros(2 + len(layout.entries), dtype=torch.float64, device=device)
        work = dist.broadcast(box, group=comm.handout_group, group_src=last_rank, async_op=True)
        self._expected = (work, box)

    def _handout_box(self, layout: LogLayout, device: torch.device) -> tuple[Tensor, int]:
        """(loss, kind, the logged values...) of the last stage's step, and its kind. Built
        where the values are, reading nothing back from the device (inside the pipeline a read
        would wait for every op queued before it): the values ``payload`` gives, exactly."""
        box = torch.zeros(2 + len(layout.entries), dtype=torch.float64, device=device)
        simple = (
            self.error is None
            and not self._has_output()
            and layout.packs(_joined_logs(self._logs, on_host=False), box)
        )
        kind = (_LOSS if self.train and self._losses else _EMPTY) if simple else _OBJECTS
        box[1] = kind
        if kind == _LOSS:
            box[0] = torch.stack(self._losses).double().mean()
        return box, kind

    def share_training(
        self,
        comm: PipelineComm,
        last_rank: int,
        device: torch.device,
        keep: Callable[..., None],
        layout: LogLayout | None = None,
    ) -> StepPayload:
        """``share`` for a training step, cheaper in the common case: one small tensor from the
        last stage instead of pickled objects, and the last stage does not wait for the others
        to take it (``keep(work, tensor)`` holds the hand-out until the engine's
        ``finish_loss_handout``). The last stage can be the rank that finishes its backwards
        first (1F1B) or last (the V-shape, where it also holds the first stage), so waiting
        there would hold its optimizer update, or the others', back to a common point; the
        tensor goes out as soon as the last microbatch's step answered where the last stage
        started it then (``post_training``, on ``comm.handout_group``), else now.

        The tensor carries the loss and, when the step logged the same names with the same
        options and dtypes as at the last pickled hand-out (``layout``, kept alike on every
        rank of the pipeline), the logged values; anything else (other logs, outputs, an
        error) goes pickled, blocking, and sets ``layout`` on every rank."""
        if not (comm.distributed and comm.num_stages > 1):
            return self.share(comm, last_rank)
        layout = layout if layout is not None else LogLayout()
        group = comm.handout_group if comm.handout_group is not None else comm.pp_group
        posted, self._posted = self._posted, None
        if comm.pp_rank == last_rank:
            if posted is not None:
                work, box, kind = posted
            else:
                box, kind = self._handout_box(layout, device)
                work = dist.broadcast(box, group=group, group_src=last_rank, async_op=True)
            if kind != _OBJECTS:
                keep(work, box)  # held: the others take it at the end of their pipeline step
                return self.payload()
            work.wait()  # the pickled hand-out below waits for the others anyway
        else:
            expected, self._expected = self._expected, None
            if expected is not None:  # posted before the pipeline ran (``expect_training``)
                expected[0].wait()
                box = expected[1]
            else:
                box = torch.zeros(2 + len(layout.entries), dtype=torch.float64, device=device)
                dist.broadcast(box, group=group, group_src=last_rank)
            kind = int(box[1])
        if kind == _OBJECTS:
            shared = self.share(comm, last_rank)
            layout.learn(shared.logs)
            return shared
        return StepPayload(loss=float(box[0]) if kind == _LOSS else None, logs=layout.unpack(box))

    def replay(self, payload: StepPayload, device: torch.device) -> None:
        """Log the batch's values on this rank as the step would on one device."""
        for name, value, kwargs in payload.logs:
            self.module.log(name, value.to(device), **kwargs)

    # ---- helpers -----------------------------------------------------------------------------

    def _call(self, batch: Any) -> Any:
        return getattr(self.module, self.hook)(batch, *self.args, **self.kwargs)

    def _run(self, batch: Any, forward: Callable[..., Any], log: Callable[..., None]) -> Any:
        """The step on ``batch`` with the module's forward and ``self.log`` replaced; the
        strategy's own default step (``DEFAULT_STEPS``) calls them directly (what it computes
        is known: no module call, no patching), unless forward hooks would see the call."""
        kind = self._default_kind()
        if kind is not None:
            return _step_body(self.module, batch, kind, forward, log)
        with self._patched(forward, log):
            return self._call(batch)

    def _default_kind(self) -> str | None:
        if self._kind is _MISSING:
            self._kind = _default_kind(self.module, self.hook)
        return self._kind

    @contextmanager
    def _patched(self, forward: Callable[..., Any], log: Callable[..., None]) -> Iterator[None]:
        """The module's forward and log replaced for one step call (instance attributes)."""
        mod = self.module
        saved = {k: mod.__dict__.get(k, _MISSING) for k in ("forward", "log")}
        object.__setattr__(mod, "forward", forward)
        object.__setattr__(mod, "log", log)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is _MISSING:
                    mod.__dict__.pop(k, None)
                else:
                    object.__setattr__(mod, k, v)


def _ignore_log(*args: Any, **kwargs: Any) -> None:
    """``self.log`` while the inputs are found: nothing (the answer pass logs)."""


def _log_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, Any, dict[str, Any]]:
    """(name, value, the other arguments given) of a ``self.log`` call, as binding it to
    ``LightningModule.log``'s signature gives them; the common call (name and value first,
    known keywords) without ``inspect`` (a step logs on every microbatch)."""
    if len(args) == 2 and kwargs.keys() <= _LOG_KEYWORDS:
        return args[0], args[1], dict(kwargs)
    bound = _LOG_SIGNATURE.bind(None, *args, **kwargs)
    options = {k: v for k, v in bound.arguments.items() if k not in ("self", "name", "value")}
    return bound.arguments["name"], bound.arguments["value"], options


def _logged(
    hook: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, Tensor, dict[str, Any]]:
    name, value, options = _log_arguments(args, kwargs)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise PipelineStepError(
                f"{hook}: self.log({name!r}) got a tensor of {value.numel()} elements; log one "
                "number (as on one device)"
            )
        tensor = value.detach().reshape(())
    elif isinstance(value, bool | int | float):
        tensor = torch.tensor(float(value))
    else:
        raise PipelineStepError(
            f"{hook}: self.log({name!r}) got a {type(value).__name__}; under OptPipeStrategy "
            "log numbers or scalar tensors (for a torchmetrics Metric, log the value its "
            "forward returns)"
        )
    options.pop("enable_graph", None)  # values cross processes: always detached
    return str(name), tensor, options


def _joined_logs(
    per_microbatch: Sequence[Sequence[tuple[str, Tensor, dict[str, Any]]]],
    on_host: bool = True,
) -> list[tuple[str, Tensor, dict[str, Any]]]:
    """Each name's microbatch values joined into the batch's (``combine_logged``), in
    first-logged order, on the host (or where they were computed)."""
    values: dict[str, list[Tensor]] = {}
    options: dict[str, dict[str, Any]] = {}
    sizes: dict[str, int] = {}
    for logs in per_microbatch:
        for name, value, opts in logs:
            if name not in values:
                values[name], options[name] = [], dict(opts)
            values[name].append(value)
            if opts.get("batch_size") is not None:
                sizes[name] = sizes.get(name, 0) + int(opts["batch_size"])
    out = []
    for name, vals in values.items():
        opts = options[name]
        if name in sizes:  # the whole batch's size, as one device would give it
            opts["batch_size"] = sizes[name]
        value = combine_logged(vals, opts.get("reduce_fx", "mean"))
        out.append((name, value.cpu() if on_host else value, opts))
    return out


def _detached(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.detach()
    if isinstance(x, Mapping):
        return {k: _detached(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_detached(v) for v in x))
    if isinstance(x, tuple | list):
        return type(x)(_detached(v) for v in x)
    return x


def _to_cpu(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.detach().cpu()
    if isinstance(x, Mapping):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_to_cpu(v) for v in x))
    if isinstance(x, tuple | list):
        return type(x)(_to_cpu(v) for v in x)
    return x


def _shapes(args: Sequence[Tensor]) -> str:
    return ", ".join(str(tuple(a.shape)) for a in args)


# ---- the steps a module without its own gets (PipelineSpec.loss_fn) ------------------------------


def _default_step(module: Any, batch: Any, kind: str) -> Tensor:
    """``x, y = split_batch(batch)``; ``loss = loss_fn(self(x), y)``, logged as one device would."""
    return _step_body(module, batch, kind, module, module.log)


def _step_body(
    module: Any, batch: Any, kind: str, forward: Callable[..., Any], log: Callable[..., None]
) -> Tensor:
    """The default step with its forward call and ``self.log`` given."""
    strategy = module.trainer.strategy
    spec = strategy.spec
    x, y = spec.split(batch)
    out = forward(*x) if isinstance(x, tuple | list) else forward(x)
    loss: Tensor = spec.loss_fn(out, y)
    name = {"train": strategy.options.log_loss_as, "val": "val_loss", "test": "test_loss"}[kind]
    if name:
        log(name, loss, prog_bar=True, sync_dist=strategy.options.data_parallel > 1)
    return loss


def _default_kind(module: Any, hook: str) -> str | None:
    """ "train", "val" or "test" when ``module.<hook>`` is the default step the strategy put
    there and no forward hook (the module's or global) would see ``self(x)``; else None."""
    kinds = {"training_step": "train", "validation_step": "val", "test_step": "test"}
    fn = DEFAULT_STEPS.get(hook)
    bound = module.__dict__.get(hook)
    if fn is None or getattr(bound, "__func__", None) is not fn:
        return None
    from torch.nn.modules import module as torch_module

    hooks = (
        module._forward_hooks,
        module._forward_pre_hooks,
        getattr(torch_module, "_global_forward_hooks", None),
        getattr(torch_module, "_global_forward_pre_hooks", None),
    )
    if getattr(module, "_compiled_call_impl", None) is not None:  # module.compile()
        return None
    return None if any(h is None or len(h) for h in hooks) else kinds[hook]


def _default_training_step(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Tensor:
    return _default_step(self, batch, "train")


def _default_validation_step(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Tensor:
    return _default_step(self, batch, "val")


def _default_test_step(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Tensor:
    return _default_step(self, batch, "test")


DEFAULT_STEPS: dict[str, Callable[..., Tensor]] = {
    "training_step": _default_training_step,
    "validation_step": _default_validation_step,
    "test_step": _default_test_step,
}
