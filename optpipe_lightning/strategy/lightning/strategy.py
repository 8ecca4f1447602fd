"""``OptPipeStrategy``: Lightning training, pipelined over solved schedules with offload.

This file holds the Lightning lifecycle, in the order Lightning calls it; each concern lives in a
module named for it:

- ``options.py``: the options and the size checks; ``launcher.py``: the checks in the launching
  process, then Lightning's own launcher;
- ``process_groups.py``: one pipeline group per data-parallel replica, one data-parallel group
  per stage, and the collectives over them;
- ``scheduling/scheduler.py``: the engine and the schedule it runs (its problem, ``pipeline_problem.py``;
  the choice, ``schedule_choice.py``; profiling, ``profiler.py``; re-balancing,
  ``repartition.py``; calibration, ``calibration.py``; online re-solve, ``resolve.py``; step
  times, ``step_times.py``; the database, ``step_records.py`` and ``run_log.py``; validation's
  pipelines, ``forward_pipelines.py``);
- ``module_steps.py``: the module's own steps around the pipeline (the pipeline answers its
  forward; logs and outputs shared by the last stage); ``microbatch.py``: batches into
  microbatches and back;
- ``step.py``: the training step around the pipeline (gradients handed to Lightning, replicas,
  clipping); ``checkpoint.py``: the whole model and optimizer state, collected;
- ``collectives.py`` (this class's base): the collectives, refused inside a module step;
- ``model_state.py`` (its base): what each rank holds of the model -- built on the
  meta device by ``configure_model``, each rank materialising only its own layers
  (``runtime/materialize.py``) -- and the checkpoints, sharded (``runtime/sharded_checkpoint.py``)
  or one file.

The strategy owns forward and backward: ``training_step`` runs one pipelined step (the module's
own ``training_step`` per microbatch on the last stage) and returns the batch's mean loss,
detached, on every rank; ``backward`` hands the step's gradients over. Gradients are never
rescaled behind the user's back: each microbatch loss is multiplied by
``1 / (num_microbatches * accumulate_grad_batches)`` before its backward, which makes the
accumulated gradient exactly the single-device one; data-parallel replicas average theirs.
"""

from __future__ import annotations

import logging
import types
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_debug, rank_zero_info, rank_zero_only
from torch import Tensor
from torch.optim import Optimizer

from ...schedule import Problem, Schedule
from ..planning.options import (
    MemoryLimit,
    OptPipeConfigError,
    PipelineOptions,
    check_layers,
    check_sizes,
)
from ..planning.partition import balanced_partition, validate_partition
from ..records.run_log import prefetch_database
from ..runtime.checkpoint import full_state_dict
from ..runtime.contract import ContractError, PipelineSpec, get_spec
from ..runtime.fork_safety import set_cpu_threads
from ..runtime.host_allocator import tune_host_allocator
from ..runtime.materialize import (
    allocate,
    build_on_meta,
    check_materialisable,
    has_meta_tensors,
)
from ..runtime.peer_errors import PeerWatch, end_for_peer
from ..runtime.process_groups import PipelineComm, make_groups, release_step_groups
from ..scheduling.scheduler import Scheduler
from .collectives import StepCollectives
from .launcher import CheckingLauncher
from .model_state import CheckpointFormat
from .module_steps import DEFAULT_STEPS, PipelineStepError
from .precision import activation_dtype, agree_on_overflow, loss_scale
from .private_api import (
    _get_default_process_group_backend_for_device,
    _init_dist_connection,
)
from .sigterm_check import SigtermCheck, install, uninstall
from .step import PipelinedSteps, clip_grad_norm_over_pipeline

__all__ = ["OptPipeConfigError", "OptPipeStrategy", "PipelineStepError"]

log = logging.getLogger(__name__)


class OptPipeStrategy(StepCollectives):
    """Pipeline-parallel training over optpipe schedules (see docs/strategy.md).

    Args:
        num_stages: pipeline stages (devices per pipeline); ``"auto"``: all devices divided by
            ``data_parallel``.
        num_microbatches: microbatches per batch (the batch size must divide by it); ``"auto"``:
            the smallest count that divides the batch with two or more per stage, else the
            largest with one or more (chosen on the first training batch).
        schedule: ``"optimal"`` (the solver, falling back to the best baseline) or a baseline
            name (``"1f1b"``, ``"zb-h1"``, ``"zb-h2"``, ``"zbv"``, ``"interleaved-1f1b"``, ...).
        num_chunks: chunks per device (any count the layers allow: stages x chunks <= layers);
            V schedules run 2, interleaved 1F1B 2 or more (default 2), others 1 by default.
        placement: how a device's chunks sit in the model (``"interleaved"``: chunk c of device
            d runs layer group c*p+d; ``"vshape"``: zig-zag); default by schedule.
        memory_limit: activation bytes per device: ``"auto"`` (device memory minus parameters,
            gradients and optimizer state; unlimited on CPU), a number, or None (unlimited).
        memory_margin: headroom kept free below every stage's limit before a schedule is
            chosen: a fraction in [0, 1) (``0.1``: plan for 90% of it) or bytes (``"2GB"``,
            ``2e9``, ``"512MiB"``); the meaning of the command line's ``--memory-margin``.
        offload: allow activation offload (the schedule decides which activations move).
        solver_backend, solver_time_limit: passed to ``optpipe_lightning.solver.solve``.
        database: SQLAlchemy URL of the profiles database (None: the default location);
            ``use_database=False`` turns it off; ``require_database=True`` fails without it.
        profile_steps: measured steps before the schedule is chosen (0: no profiling, unit costs).
        online_resolve: keep solving in a background process and switch to better schedules.
        data_parallel: pipeline replicas (world size = data_parallel x num_stages).
        partition: layers per layer group (stages x chunks, in model order); default balanced by
            ``PipelineSpec.layer_costs`` or parameter counts.
        offload_min_bytes: saved tensors smaller than this stay on the device.
        log_loss_as: for a module without its own ``training_step`` (``PipelineSpec.loss_fn``):
            the name its loss is logged under (None: not logged).
        start_method: ``"popen"`` (script re-launch, like DDP), ``"spawn"``, ``"fork"``.
        schedule_source: for tests and tools: a callable ``(problem) -> Schedule`` used instead of
            ``schedule`` after profiling.
        resolve_min_gain: relative makespan gain a solver schedule needs to be switched in.
        resolve_start_method: how the background solver process starts (``"spawn"`` is safe
            with CUDA; ``"fork"`` starts faster on CPU).
        repartition: after profiling, re-balance the layer groups by the measured per-layer
            costs when that lowers the largest group's cost by 10% (then profile again).
        calibrate: re-estimate op costs and the per-action runtime overhead from the steps of
            the running schedule (see ``calibration.py``): the predicted step time and the
            problem the background re-solve judges incumbents on follow the measured steps.
        calibrate_every: every this many steps of the running schedule time their ops (the
            other steps only their wall time); a calibration follows each such step.
        calibrate_min_steps: steps of a schedule (after one warm-up step) before its first
            calibration.
        tune_host_allocator: on CPU, keep glibc's allocator from returning tensor memory to
            the kernel and faulting it in again (steadier, faster op times; see
            ``host_allocator.py``); nothing is changed when ``MALLOC_*`` variables are set or
            another allocator is preloaded.
        calibrate_budget: share of the training time calibrations may take (a calibration
            waits until its cost is that share of the steps since the last); None: no limit.
        shard_model: each rank holds only its own layers (the others' tensors are dropped
            after setup); ``"auto"``: when the module builds its layers in ``configure_model``
            (on the meta device, then materialised per rank; see ``materialize.py``).
        checkpoint_format: ``"sharded"`` (a directory, one DCP shard per rank, resumable on
            another partition or stage count), ``"full"`` (one file, the whole model collected:
            for small models) or ``"auto"`` (sharded when the model is).
        full_model_after_fit: after ``fit``, every rank's module takes the whole trained model
            (collected from all stages); ``None``: only when the model is not sharded.
    """

    strategy_name = "optpipe"

    def __init__(
        self,
        num_stages: int | Literal["auto"] = "auto",
        num_microbatches: int | Literal["auto"] = "auto",
        schedule: str = "optimal",
        num_chunks: int | None = None,
        placement: Literal["interleaved", "vshape"] | None = None,
        memory_limit: MemoryLimit = "auto",
        memory_margin: float | str = 0.0,
        offload: bool = True,
        solver_backend: str = "auto",
        solver_time_limit: float = 30.0,
        database: str | None = None,
        use_database: bool = True,
        require_database: bool = False,
        profile_steps: int = 2,
        online_resolve: bool = True,
        data_parallel: int = 1,
        partition: list[int] | None = None,
        offload_min_bytes: int = 1024,
        log_loss_as: str | None = "train_loss",
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        schedule_source: Callable[[Problem], Schedule] | None = None,
        resolve_min_gain: float = 0.01,
        resolve_start_method: str = "spawn",
        repartition: bool = True,
        calibrate: bool = True,
        calibrate_every: int = 4,
        calibrate_min_steps: int = 8,
        tune_host_allocator: bool = True,
        calibrate_budget: float | None = 0.005,
        shard_model: bool | Literal["auto"] = "auto",
        checkpoint_format: CheckpointFormat = "auto",
        full_model_after_fit: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.options = PipelineOptions(
            num_stages=num_stages,
            num_microbatches=num_microbatches,
            schedule=schedule,
            num_chunks=num_chunks,
            placement=placement,
            memory_limit=memory_limit,
            memory_margin=memory_margin,
            offload=offload,
            solver_backend=solver_backend,
            solver_time_limit=solver_time_limit,
            database=database,
            use_database=use_database,
            require_database=require_database,
            profile_steps=profile_steps,
            online_resolve=online_resolve,
            data_parallel=data_parallel,
            partition=None if partition is None else tuple(partition),
            offload_min_bytes=offload_min_bytes,
            log_loss_as=log_loss_as,
            schedule_source=schedule_source,
            resolve_min_gain=resolve_min_gain,
            resolve_start_method=resolve_start_method,
            repartition=repartition,
            calibrate=calibrate,
            calibrate_every=calibrate_every,
            calibrate_min_steps=calibrate_min_steps,
            tune_host_allocator=tune_host_allocator,
            calibrate_budget=calibrate_budget,
        )
        self.init_model_state(shard_model, checkpoint_format, full_model_after_fit)
        self._start_method = start_method
        self._process_group_backend = process_group_backend
        self._timeout = timeout
        self._num_nodes = 1
        self.spec: PipelineSpec | None = None
        self.comm: PipelineComm | None = None
        self.scheduler: Scheduler | None = None  # one per trainer call, made in ``setup``
        self._steps: PipelinedSteps | None = None  # the step hooks' work, made in ``setup``
        self._installed: list[str] = []  # default steps put on the module (removed at teardown)
        self._sigterm: SigtermCheck | None = None  # Lightning's per-step check, unblocked
        self._status: str | None = None  # how the trainer call ended, when not "finished"
        self._peers: PeerWatch | None = None  # the other ranks' errors (``peer_errors``)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        entries = (("optpipe", "popen"), ("optpipe_spawn", "spawn"), ("optpipe_fork", "fork"))
        for name, method in entries:
            if name in strategy_registry:
                continue
            strategy_registry.register(
                name,
                cls,
                description=f"optpipe pipeline-parallel strategy (start_method={method!r})",
                start_method=method,
            )

    # ---- sizes -------------------------------------------------------------------------------

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def total_devices(self) -> int:
        return self.num_nodes * self.num_processes

    @property
    def num_stages(self) -> int:
        if isinstance(self.options.num_stages, int):
            return self.options.num_stages
        return max(1, self.total_devices // self.options.data_parallel)

    @property
    def num_microbatches(self) -> int | None:
        """Training's microbatch count (``"auto"``: known after the first training batch)."""
        if isinstance(self.options.num_microbatches, int):
            return self.options.num_microbatches
        return self.scheduler.num_microbatches if self.scheduler is not None else None

    @property
    def pp_rank(self) -> int:
        return self.global_rank % self.num_stages

    @property
    def dp_rank(self) -> int:
        return self.global_rank // self.num_stages

    @property
    def is_distributed(self) -> bool:
        """Lightning then gives each data-parallel replica its own samples (same on its stages)."""
        return True

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.options.data_parallel, "rank": self.dp_rank}

    @property
    def process_group_backend(self) -> str | None:
        return self._process_group_backend

    @property
    def switches(self) -> list[dict[str, Any]]:
        """Every schedule switch of this run: step, from, to, reason, predicted seconds."""
        return self.scheduler.switches if self.scheduler is not None else []

    @property
    def calibrations(self) -> list[dict[str, Any]]:
        """Every calibration of this run (the latest ones; see docs/strategy.md)."""
        return self.scheduler.calibrations if self.scheduler is not None else []

    def check_sizes(self, world_size: int) -> None:
        check_sizes(self.options, world_size, self.num_stages)

    def precheck_model(self, model: Any, fitting: bool = False) -> PipelineSpec:
        """The model contract and the layer count, checked in the launching process."""
        build_on_meta(model)  # layers made in configure_model exist (on the meta device)
        spec = get_spec(model)
        check_layers(self.options, len(spec.layers), self.num_stages)
        if has_meta_tensors(model):
            check_materialisable(model, spec.layers)
        name = type(model).__name__
        if not getattr(model, "automatic_optimization", True):
            raise OptPipeConfigError(
                f"{name} uses manual optimization (automatic_optimization=False); "
                "OptPipeStrategy runs the backward inside the pipeline: use automatic optimization"
            )
        if fitting and spec.loss_fn is None and not is_overridden("training_step", model):
            raise ContractError(
                f"{name} has no training_step and its PipelineSpec no loss_fn: define "
                "training_step(batch, batch_idx) as on one device (the pipeline answers "
                "self(x)), or give PipelineSpec(loss_fn=...)"
            )
        return spec

    # ---- launch ------------------------------------------------------------------------------

    def _configure_launcher(self) -> None:
        self._launcher = CheckingLauncher(self, self._start_method)

    # ---- Lightning's calls, in order ---------------------------------------------------------

    def connect(self, model: pl.LightningModule) -> None:
        """A module without its own steps gets the ones its ``PipelineSpec.loss_fn`` makes."""
        build_on_meta(model)
        spec = get_spec(model)
        self._installed = []
        if spec.loss_fn is not None:
            for hook, fn in DEFAULT_STEPS.items():
                if not is_overridden(hook, model):
                    setattr(model, hook, types.MethodType(fn, model))
                    self._installed.append(hook)
        super().connect(model)

    def setup_environment(self) -> None:
        self.check_sizes(self.total_devices)
        if self.root_device.type == "cpu":
            set_cpu_threads(self.num_processes, forked=self._start_method == "fork")
        if self.root_device.type == "cpu" and self.options.tune_host_allocator:
            # steady op times: no unmapping and re-faulting of tensor memory (host_allocator.py)
            log.info("optpipe: %s", tune_host_allocator())
        super().setup_environment()
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._process_group_backend or (
            _get_default_process_group_backend_for_device(self.root_device)
        )
        assert self.cluster_environment is not None
        if self.global_rank == 0 and self.options.use_database:
            prefetch_database(self.options.database)  # while the other ranks start (run_log.py)
        kwargs: dict[str, Any] = {"timeout": self._timeout}
        if self.root_device.type != "cpu":
            kwargs["device_id"] = self.root_device
        _init_dist_connection(self.cluster_environment, self._process_group_backend, **kwargs)
        self.comm = make_groups(self.num_stages, self.options.data_parallel, self.global_rank)
        if self._peers is not None:
            self._peers.close()
        self._peers = PeerWatch(self.global_rank, self.world_size)

    def set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(
                self.node_rank * self.num_processes + self.local_rank
            )
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]

    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.comm is not None
        self.accelerator.setup(trainer)
        assert self.lightning_module is not None
        self.spec = self.precheck_model(self.lightning_module, trainer.state.fn == "fit")
        self._status = None
        self._steps = PipelinedSteps(self.comm, self.root_device, self._guard)
        if trainer.state.fn == "fit" and self._sigterm is None:
            self._sigterm = install(trainer, self.comm.control_group, self.root_device)
        requested = self.options.num_microbatches
        partition = self._partition(self.spec)
        self.own_layers(self.lightning_module, self.spec, partition)
        self.scheduler = Scheduler(
            self.options,
            self.spec,
            self.comm,
            self.root_device,
            partition,
            requested if isinstance(requested, int) else None,
            model_name=type(self.lightning_module).__name__,
            backend=self._process_group_backend or "gloo",
            notify=_notify,
            module=self.lightning_module,
            optimizers=lambda: self.optimizers,
        )
        self.scheduler.sharded = self.sharded
        if self.options.data_parallel == 1:
            # every rank logs the last stage's values: one replica needs no sync_dist
            warnings.filterwarnings(
                "ignore", message=r"It is recommended to use `self.log\(.*sync_dist=True\)`"
            )
        plugin = self.precision_plugin
        self.scheduler.activation_dtype = lambda dtype: activation_dtype(plugin, dtype)
        if self.model is not None:
            self.model = self.precision_plugin.convert_module(self.model)
        if trainer.state.fn == "fit":
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        # 16-mixed: every stage skips the same steps (the found-inf flag over all ranks)
        agree_on_overflow(self.precision_plugin, self.root_device)
        # norm clipping must see the norm over all stages, not this rank's share
        self.precision_plugin.clip_grad_by_norm = self._clip_grad_by_norm  # type: ignore[method-assign]
        self.barrier()

    def _partition(self, spec: PipelineSpec) -> list[int]:
        """The user's partition, or layer groups balanced by layer costs / parameter counts."""
        n = len(spec.layers)
        groups = self.num_stages * self.options.chunks[0]
        if self.options.partition is not None:
            return validate_partition(self.options.partition, n, groups)
        costs = (
            list(spec.layer_costs)
            if spec.layer_costs is not None
            else [1.0 + sum(p.numel() for p in layer.parameters()) for layer in spec.layers]
        )
        return balanced_partition(costs, groups)

    def model_to_device(self) -> None:
        """Only the local layer groups move (the engine does it); the rest stays on the host."""

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """One pipelined step: the module's ``training_step`` per microbatch on the last stage."""
        module, sched, steps = self._parts()
        plugin = self.precision_plugin
        out = steps.train(
            module,
            sched,
            args,
            kwargs,
            plugin.train_step_context,
            self.optimizers,
            loss_scale(plugin, self.root_device),  # 16-mixed: the grad scaler's scale
        )
        steps.metrics.log(module, sched.metrics())  # the schedule that ran, for loggers
        return out

    def backward(
        self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> Tensor:
        """The pipeline step already ran every backward: add its gradients to ``.grad`` now."""
        if self._steps is not None:
            self._steps.grads.give()
        return closure_loss

    def _clip_grad_by_norm(self, optimizer: Optimizer, clip_val: float) -> None:
        engine = self.scheduler.engine if self.scheduler is not None else None
        params = engine.parameters if engine is not None else []
        shared = engine.shared.not_counted() if engine is not None else []
        clip_grad_norm_over_pipeline(params, clip_val, self.comm, self.root_device, shared)

    def optimizer_step(
        self, optimizer: Optimizer, closure: Callable[[], Any], model: Any = None, **kwargs: Any
    ) -> Any:
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        assert self.scheduler is not None and self.lightning_module is not None
        self.scheduler.at_boundary(self.lightning_module, self.optimizers)
        return out

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_step(
            "validation_step", self.precision_plugin.val_step_context, args, kwargs
        )

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_step(
            "test_step", self.precision_plugin.test_step_context, args, kwargs
        )

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's ``predict_step`` on the pipeline's output; the whole batch's predictions
        on every rank of the pipeline (rank 0 returns them, as under DDP)."""
        return self._forward_step(
            "predict_step", self.precision_plugin.predict_step_context, args, kwargs
        )

    def _forward_step(self, hook: str, context: Any, args: Any, kwargs: Any) -> Any:
        module, sched, steps = self._parts()
        return steps.forward(hook, module, sched, args, kwargs, context)

    def _parts(self) -> tuple[pl.LightningModule, Scheduler, PipelinedSteps]:
        assert self.lightning_module is not None
        assert self.scheduler is not None and self._steps is not None
        return self.lightning_module, self.scheduler, self._steps

    def on_train_end(self) -> None:
        """Every rank's module takes the whole trained model (each layer from its stage): the
        module left in the user's process after ``fit`` is the trained one, for every launcher.
        A sharded model keeps each rank's own layers only, unless ``full_model_after_fit``."""
        module, sched, _ = self._parts()
        if sched.engine is not None and self.whole_model_after_fit:
            if self.sharded:
                for m in module.modules():  # room for the layers collected from other ranks
                    allocate(m, self.root_device)
            module.load_state_dict(full_state_dict(module, sched.engine, self.comm))

    def on_validation_end(self) -> None:
        """A validation run within ``fit`` (not the sanity check): its ``val_loss`` to the run
        log (global rank 0's database; a number every rank holds, so no collective)."""
        super().on_validation_end()
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if self.scheduler is None or trainer is None or trainer.sanity_checking:
            return
        if trainer.state.fn != "fit" or not self.is_global_zero:
            return
        value = trainer.callback_metrics.get("val_loss")
        self.scheduler.note_validation(None if value is None else float(value))

    # ---- the end ----------------------------------------------------------------------------

    def on_exception(self, exception: BaseException) -> None:
        interrupted = isinstance(exception, KeyboardInterrupt | SIGTERMException)
        self._status = "interrupted" if interrupted else "failed"
        peers, self._peers = self._peers, None
        # a peer's error or a lost peer: one line naming that rank, and this rank ends
        if peers is not None and not interrupted and peers.on_error(exception) is not None:
            sched, self.scheduler = self.scheduler, None
            end_for_peer(sched, self.teardown)

    def teardown(self) -> None:
        """Stop the background solver, record how the run ended, take the default steps off."""
        if self._peers is not None:
            self._peers.close()
            self._peers = None
        if self.scheduler is not None:
            self.scheduler.close(self._status or "finished")
        clean = self._status in (None, "finished")
        sigterm, self._sigterm = self._sigterm, None
        if sigterm is not None:
            uninstall(sigterm.trainer, sigterm, clean)
        if clean and self.comm is not None:
            release_step_groups(self.comm)  # a failed run's may still wait on a lost peer
        module = self.lightning_module
        for hook in self._installed:
            if module is not None:
                module.__dict__.pop(hook, None)
        self._installed = []
        with self.sharded_teardown(module):
            super().teardown()


def _notify(text: str, detail: bool) -> None:
    """The strategy's messages, through Lightning's rank-zero logging."""
    (rank_zero_debug if detail else rank_zero_info)(text)


def _register_on_import() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    OptPipeStrategy.register_strategies(StrategyRegistry)


_register_on_import()
