"""``OptPipeStrategy``: Lightning training, pipelined over solved schedules with offload.

This file holds the Lightning lifecycle, in the order Lightning calls it; each concern lives in a
module named for it:

- ``options.py``: the options and the size checks; ``launcher.py``: the checks in the launching
  process, then Lightning's own launcher;
- ``process_groups.py``: one pipeline group per data-parallel replica, one data-parallel group
  per stage, and the collectives over them;
- ``scheduling.py``: the engine and the schedule it runs (profiling, ``profiler.py``;
  re-balancing, ``repartition.py``; calibration, ``calibration.py``; online re-solve,
  ``resolve.py``; the database, ``run_log.py``);
- ``step.py``: the training step around the pipeline (gradients handed to Lightning, replicas,
  clipping); ``checkpoint.py``: the whole model and optimizer state, collected.

The strategy owns forward and backward: ``training_step`` runs one pipelined step and returns the
batch's mean loss, detached, on every rank; ``backward`` hands the step's gradients over.
Gradients are never rescaled behind the user's back: each microbatch loss is multiplied by
``1 / (num_microbatches * accumulate_grad_batches)`` before its backward, which makes the
accumulated gradient exactly the single-device one; data-parallel replicas average theirs.
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.utilities.distributed import (
    _distributed_is_initialized,
    _get_default_process_group_backend_for_device,
    _init_dist_connection,
    _sync_ddp_if_available,
)
from lightning.fabric.utilities.distributed import group as _group
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import Tensor
from torch.optim import Optimizer

from ..schedule import Problem, Schedule
from .checkpoint import full_state_dict, load_optimizer_states, merged_optimizer_state
from .contract import PipelineSpec, get_spec
from .host_allocator import tune_host_allocator
from .launcher import CheckingLauncher
from .options import (
    MemoryLimit,
    OptPipeConfigError,
    PipelineOptions,
    check_layers,
    check_sizes,
)
from .partition import balanced_partition, validate_partition
from .process_groups import PipelineComm, make_groups
from .run_log import prefetch_database
from .scheduling import Scheduler
from .step import (
    GradientHandover,
    average_over_replicas,
    batch_size,
    check_same_batch,
    clip_grad_norm_over_pipeline,
)

__all__ = ["OptPipeConfigError", "OptPipeStrategy"]

log = logging.getLogger(__name__)


class OptPipeStrategy(ParallelStrategy):
    """Pipeline-parallel training over optpipe schedules (see docs/strategy.md).

    Args:
        num_stages: pipeline stages (devices per pipeline); ``"auto"``: all devices divided by
            ``data_parallel``.
        num_microbatches: microbatches per batch (the batch size must divide by it); ``"auto"``:
            twice the number of stages.
        schedule: ``"optimal"`` (the solver, falling back to the best baseline) or a baseline
            name (``"1f1b"``, ``"zb-h1"``, ``"zb-h2"``, ``"zbv"``, ``"interleaved-1f1b"``, ...).
        num_chunks: chunks per device for ``"optimal"``/interleaved; V schedules use 2.
        memory_limit: activation bytes per device: ``"auto"`` (device memory minus parameters,
            gradients and optimizer state; unlimited on CPU), a number, or None (unlimited).
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
        log_loss_as: name the training loss is logged under (None: not logged).
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
    """

    strategy_name = "optpipe"

    def __init__(
        self,
        num_stages: int | Literal["auto"] = "auto",
        num_microbatches: int | Literal["auto"] = "auto",
        schedule: str = "optimal",
        num_chunks: int | None = None,
        memory_limit: MemoryLimit = "auto",
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.options = PipelineOptions(
            num_stages=num_stages,
            num_microbatches=num_microbatches,
            schedule=schedule,
            num_chunks=num_chunks,
            memory_limit=memory_limit,
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
        self._start_method = start_method
        self._process_group_backend = process_group_backend
        self._timeout = timeout
        self._num_nodes = 1
        self.spec: PipelineSpec | None = None
        self.comm: PipelineComm | None = None
        self.scheduler: Scheduler | None = None  # one per trainer call, made in ``setup``
        self._grads = GradientHandover()

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
    def num_microbatches(self) -> int:
        if isinstance(self.options.num_microbatches, int):
            return self.options.num_microbatches
        return 2 * self.num_stages

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
        check_sizes(self.options, world_size, self.num_stages, self.num_microbatches)

    def precheck_model(self, model: Any) -> PipelineSpec:
        """The model contract and the layer count, checked in the launching process."""
        spec = get_spec(model)
        check_layers(self.options, len(spec.layers), self.num_stages)
        return spec

    # ---- launch ------------------------------------------------------------------------------

    def _configure_launcher(self) -> None:
        self._launcher = CheckingLauncher(self, self._start_method)

    # ---- Lightning's calls, in order ---------------------------------------------------------

    def connect(self, model: pl.LightningModule) -> None:
        """The pipeline runs the step: a model need not define ``training_step`` itself."""
        for hook in ("training_step", "validation_step"):
            if not is_overridden(hook, model):
                setattr(model, hook, types.MethodType(_run_by_strategy, model))
        super().connect(model)

    def setup_environment(self) -> None:
        self.check_sizes(self.total_devices)
        if self.root_device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # CPU stages share the cores: oversubscribed threads make every op slower than
            # profiled (torchrun sets OMP_NUM_THREADS=1 for the same reason)
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, self.num_processes)))
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
        self.spec = self.precheck_model(self.lightning_module)
        self.scheduler = Scheduler(
            self.options,
            self.spec,
            self.comm,
            self.root_device,
            self._partition(self.spec),
            self.num_microbatches,
            model_name=type(self.lightning_module).__name__,
            backend=self._process_group_backend or "gloo",
        )
        if self.model is not None:
            self.model = self.precision_plugin.convert_module(self.model)
        if trainer.state.fn == "fit":
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
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

    def training_step(self, *args: Any, **kwargs: Any) -> Tensor:
        assert self.spec is not None and self.lightning_module is not None
        sched, comm = self.scheduler, self.comm
        assert sched is not None and comm is not None
        batch = args[0] if args else kwargs["batch"]
        inputs, targets = self.spec.split(batch)
        if sched.engine is None:
            check_same_batch(inputs, targets, comm, OptPipeConfigError)
            sched.build(batch_size(inputs), self.world_size)
        engine = sched.engine
        assert engine is not None
        accumulate = max(1, int(self.lightning_module.trainer.accumulate_grad_batches))

        def step() -> Tensor:
            with self.precision_plugin.train_step_context():
                loss = sched.run_step(inputs, targets, grad_scale=1.0 / accumulate)
            return average_over_replicas(engine.parameters, loss, comm)

        # Lightning zeroes gradients *after* training_step and before backward: run the pipeline
        # on fresh .grad, keep its gradients aside, and hand them over in ``backward``.
        loss = self._grads.run(engine.parameters, step)
        if self.options.log_loss_as:
            self.lightning_module.log(self.options.log_loss_as, loss, prog_bar=True, logger=True)
        return loss

    def backward(
        self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> Tensor:
        """The pipeline step already ran every backward: add its gradients to ``.grad`` now."""
        self._grads.give()
        return closure_loss

    def _clip_grad_by_norm(self, optimizer: Optimizer, clip_val: float) -> None:
        engine = self.scheduler.engine if self.scheduler is not None else None
        params = engine.parameters if engine is not None else []
        clip_grad_norm_over_pipeline(params, clip_val, self.comm, self.root_device)

    def optimizer_step(
        self, optimizer: Optimizer, closure: Callable[[], Any], model: Any = None, **kwargs: Any
    ) -> Any:
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        assert self.scheduler is not None and self.lightning_module is not None
        self.scheduler.at_boundary(self.lightning_module, self.optimizers)
        return out

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self.spec is not None and self.lightning_module is not None
        assert self.scheduler is not None
        batch = args[0] if args else kwargs["batch"]
        inputs, targets = self.spec.split(batch)
        engine = self.scheduler.evaluation_engine(batch_size(inputs))
        with self.precision_plugin.val_step_context():
            loss = engine.evaluate(inputs, targets)
        dp = self.comm is not None and self.comm.dp_group is not None
        self.lightning_module.log("val_loss", loss, prog_bar=True, sync_dist=dp)
        return loss

    # ---- collectives -------------------------------------------------------------------------

    def barrier(self, name: str | None = None) -> None:
        if _distributed_is_initialized():
            if dist.get_backend() == "nccl":  # pragma: no cover - GPU only
                dist.barrier(device_ids=[self.root_device.index])
            else:
                dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not _distributed_is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src, group=_group.WORLD)
        return box[0]

    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any | None = "mean") -> Any:
        if isinstance(tensor, Tensor):
            return _sync_ddp_if_available(tensor, group, reduce_op=reduce_op)
        return tensor

    # ---- checkpoints -------------------------------------------------------------------------

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The full model, every layer from the rank that trains it (collected on every rank)."""
        assert self.lightning_module is not None
        engine = self.scheduler.engine if self.scheduler is not None else None
        return full_state_dict(self.lightning_module, engine, self.comm)

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer state of all stages merged (parameter indices agree on every rank)."""
        engine = self.scheduler.engine if self.scheduler is not None else None
        return merged_optimizer_state(optimizer, engine, self.comm)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        load_optimizer_states(self.optimizers, checkpoint["optimizer_states"], self.root_device)

    # ---- teardown ----------------------------------------------------------------------------

    def teardown(self) -> None:
        if self.scheduler is not None:
            status = "finished"
            trainer = getattr(self.lightning_module, "_trainer", None)
            if trainer is not None and str(trainer.state.status.value) != "finished":
                status = str(trainer.state.status.value)  # "interrupted" (or still "running")
            self.scheduler.close(status)
        super().teardown()


def _run_by_strategy(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(
        "this step runs inside OptPipeStrategy (the pipeline); it is not called directly"
    )


def _register_on_import() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    OptPipeStrategy.register_strategies(StrategyRegistry)


_register_on_import()
