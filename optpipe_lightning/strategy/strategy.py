"""``OptPipeStrategy``: Lightning training, pipelined over solved schedules with offload.

Lifecycle (the order Lightning calls): the launcher (checks the model contract and the sizes in
the launching process, before any worker starts) -> ``setup_environment`` (process groups: one
pipeline group per data-parallel replica, one data-parallel group per stage) -> ``setup``
(contract, partition, optimizers) -> first ``training_step`` (the engine is built once the batch
size is known: stored profile from the database, or profiling steps, then the schedule) ->
``optimizer_step`` boundaries (end of profiling, online re-solve switches, database records).

The strategy owns forward and backward: ``training_step`` runs one pipelined step and returns the
batch's mean loss, detached, on every rank; ``backward`` does nothing. Gradients are never
rescaled behind the user's back: each microbatch loss is multiplied by
``1 / (num_microbatches * accumulate_grad_batches)`` before its backward, which makes the
accumulated gradient exactly the single-device one; data-parallel replicas average theirs.
"""

from __future__ import annotations

import logging
import os
import time
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
from lightning.pytorch.strategies.launchers import (
    _MultiProcessingLauncher,
    _SubprocessScriptLauncher,
)
from lightning.pytorch.strategies.launchers.launcher import _Launcher
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import Tensor
from torch.optim import Optimizer

from ..schedule import Problem, Schedule, simulate
from .calibration import Calibration, StepSampler, calibrate, max_cost_change
from .contract import ContractError, PipelineSpec, get_spec
from .engine import PipelineEngine, ScheduleRejectedError
from .host_allocator import tune_host_allocator
from .partition import PartitionError, balanced_partition, validate_partition
from .planner import (
    SCHEDULE_CHOICES,
    NoScheduleError,
    choose_schedule,
    chunks_for,
    initial_problem,
    profiling_schedule,
)
from .profiler import (
    build_profile,
    gather,
    hardware_fingerprint,
    local_measurements,
    measure_copy_bandwidth,
    measure_p2p,
    model_fingerprint,
    runtime_overhead,
    with_overhead,
)
from .resolve import BackgroundSolver, SwitchDecision
from .run_log import RunLog

log = logging.getLogger(__name__)

REPARTITION_GAIN = 0.10
RESOLVE_DRIFT = 0.10  # calibrated costs this far from the solved ones start a new solve
MAX_CALIBRATED_RESOLVES = 2
MAX_CALIBRATION_RECORDS = 256  # strategy.calibrations keeps the latest ones

MemoryLimit = Literal["auto"] | float | int | None


class OptPipeConfigError(ValueError):
    """A wrong option or model/size combination, reported before any process waits on another."""


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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if schedule not in SCHEDULE_CHOICES:
            raise OptPipeConfigError(
                f"unknown schedule {schedule!r}; one of {', '.join(SCHEDULE_CHOICES)}"
            )
        if num_stages != "auto" and (not isinstance(num_stages, int) or num_stages < 1):
            raise OptPipeConfigError(
                f"num_stages must be an integer >= 1 or 'auto', got {num_stages!r}"
            )
        if num_microbatches != "auto" and (
            not isinstance(num_microbatches, int) or num_microbatches < 1
        ):
            raise OptPipeConfigError(
                f"num_microbatches must be an integer >= 1 or 'auto', got {num_microbatches!r}"
            )
        if isinstance(num_stages, int) and isinstance(num_microbatches, int):
            _check_microbatches(num_microbatches, num_stages)
        if data_parallel < 1:
            raise OptPipeConfigError(f"data_parallel must be >= 1, got {data_parallel}")
        if memory_limit not in ("auto", None) and (
            not isinstance(memory_limit, int | float) or memory_limit <= 0
        ):
            raise OptPipeConfigError(
                f"memory_limit must be 'auto', None or bytes > 0, got {memory_limit!r}"
            )
        if profile_steps < 0:
            raise OptPipeConfigError("profile_steps must be >= 0")
        if not isinstance(calibrate_every, int) or calibrate_every < 1:
            raise OptPipeConfigError(
                f"calibrate_every must be an integer >= 1, got {calibrate_every!r} "
                "(turn calibration off with calibrate=False)"
            )
        if not isinstance(calibrate_min_steps, int) or calibrate_min_steps < 1:
            raise OptPipeConfigError(
                f"calibrate_min_steps must be an integer >= 1, got {calibrate_min_steps!r}"
            )
        self._num_stages_opt = num_stages
        self._num_microbatches_opt = num_microbatches
        self.schedule_name = schedule
        self.num_chunks, self.placement = chunks_for(schedule, num_chunks)
        self.memory_limit_opt = memory_limit
        self.offload_enabled = offload
        self.solver_backend = solver_backend
        self.solver_time_limit = solver_time_limit
        self.database_url = database
        self.use_database = use_database
        self.require_database = require_database
        self.profile_steps = profile_steps
        self.online_resolve = online_resolve
        self.data_parallel = data_parallel
        self.partition_opt = partition
        self.offload_min_bytes = offload_min_bytes
        self.log_loss_as = log_loss_as
        self._start_method = start_method
        self._process_group_backend = process_group_backend
        self._timeout = timeout
        self.schedule_source = schedule_source
        self.resolve_min_gain = resolve_min_gain
        self.resolve_start_method = resolve_start_method
        self.repartition = repartition
        self.calibrate = calibrate
        self.calibrate_every = calibrate_every
        self.calibrate_min_steps = calibrate_min_steps
        self.tune_host_allocator = tune_host_allocator
        self._num_nodes = 1
        # runtime state
        self.spec: PipelineSpec | None = None
        self.partition: list[int] = []
        self.engine: PipelineEngine | None = None
        self._eval_engine: PipelineEngine | None = None
        self.pp_group: Any = None
        self.dp_group: Any = None
        self.phase = "new"  # new -> profiling -> run
        self._profiled_steps = 0
        self._optimizer_steps = 0
        self._solver: BackgroundSolver | None = None
        self._resolving = False
        self._run_log: RunLog | None = None
        self._schedule_id: int | None = None
        self._step_started: float | None = None
        self._step_seconds = 0.0
        self._step_count = 0  # pipeline steps in this optimizer step (accumulate_grad_batches)
        self._hardware: Any = None
        self._model_fp: Any = None
        self._pending_grads: list[Tensor | None] | None = None
        self._may_repartition = False
        self._predicted: float | None = None
        self._profile_walls: list[float] = []  # wall seconds of each profiling step
        self.switches: list[dict[str, Any]] = []  # every switch: step, generator, reason
        # calibration from the running schedule
        self._sampler = StepSampler(calibrate_every, calibrate_min_steps)
        self._overhead_in_problem = 0.0  # per-action overhead inside the running problem's costs
        self._solved_problem: Problem | None = None  # what the background solver last solved
        self._calibrated_resolves = 0
        self.calibrations: list[dict[str, Any]] = []  # every calibration (see _calibrate)

    # ---- registry ----------------------------------------------------------------------------

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

    def connect(self, model: pl.LightningModule) -> None:
        """The pipeline runs the step: a model need not define ``training_step`` itself."""
        for hook in ("training_step", "validation_step"):
            if not is_overridden(hook, model):
                setattr(model, hook, types.MethodType(_run_by_strategy, model))
        super().connect(model)

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
        if isinstance(self._num_stages_opt, int):
            return self._num_stages_opt
        return max(1, self.total_devices // self.data_parallel)

    @property
    def num_microbatches(self) -> int:
        if isinstance(self._num_microbatches_opt, int):
            return self._num_microbatches_opt
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
        return {"num_replicas": self.data_parallel, "rank": self.dp_rank}

    @property
    def process_group_backend(self) -> str | None:
        return self._process_group_backend

    def check_sizes(self, world_size: int) -> None:
        """World size vs stages x replicas, microbatches vs stages: the errors before any wait."""
        p = self.num_stages
        if world_size % p != 0 or world_size // p != self.data_parallel:
            raise OptPipeConfigError(
                f"world size {world_size} does not equal num_stages={p} x "
                f"data_parallel={self.data_parallel}; use {p * self.data_parallel} devices or "
                "change num_stages/data_parallel"
            )
        _check_microbatches(self.num_microbatches, p)
        if self.schedule_name != "optimal":
            # the shape rules of the named schedule (chunks, placement, microbatch count)
            shape = initial_problem(
                p,
                self.num_microbatches,
                self.num_chunks,
                self.placement,
                [1.0] * (p * self.num_chunks),
            )
            try:
                choose_schedule(self.schedule_name, shape)
            except NoScheduleError as e:
                raise OptPipeConfigError(
                    f"{e}; change num_microbatches/num_stages or the schedule"
                ) from None

    def precheck_model(self, model: Any) -> PipelineSpec:
        """The model contract and the layer count, checked in the launching process."""
        spec = get_spec(model)
        groups = self.num_stages * self.num_chunks
        n = len(spec.layers)
        if self.partition_opt is not None:
            validate_partition(self.partition_opt, n, groups)
        elif groups > n:
            raise PartitionError(
                f"{self.num_stages} stages x {self.num_chunks} chunks = {groups} layer groups but "
                f"the model gives only {n} layers; use fewer stages or split the model into more "
                "layers"
            )
        return spec

    # ---- launcher ----------------------------------------------------------------------------

    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        if self._start_method == "popen":
            inner: Any = _SubprocessScriptLauncher(
                self.cluster_environment, self.num_processes, self.num_nodes
            )
        else:
            inner = _MultiProcessingLauncher(self, start_method=self._start_method)
        self._launcher = _CheckingLauncher(self, inner)

    # ---- environment -------------------------------------------------------------------------

    def setup_environment(self) -> None:
        self.check_sizes(self.total_devices)
        if self.root_device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            # CPU stages share the cores: oversubscribed threads make every op slower than
            # profiled (torchrun sets OMP_NUM_THREADS=1 for the same reason)
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, self.num_processes)))
        if self.root_device.type == "cpu" and self.tune_host_allocator:
            # steady op times: no unmapping and re-faulting of tensor memory (host_allocator.py)
            log.info("optpipe: %s", tune_host_allocator())
        super().setup_environment()
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = self._process_group_backend or (
            _get_default_process_group_backend_for_device(self.root_device)
        )
        assert self.cluster_environment is not None
        kwargs: dict[str, Any] = {"timeout": self._timeout}
        if self.root_device.type != "cpu":
            kwargs["device_id"] = self.root_device
        _init_dist_connection(self.cluster_environment, self._process_group_backend, **kwargs)
        self._make_groups()

    def set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(
                self.node_rank * self.num_processes + self.local_rank
            )
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]

    def _make_groups(self) -> None:
        p, d = self.num_stages, self.data_parallel
        if d == 1:
            self.pp_group = dist.group.WORLD
            self.dp_group = None
            return
        for r in range(d):
            g = dist.new_group(list(range(r * p, (r + 1) * p)))
            if r == self.dp_rank:
                self.pp_group = g
        for s in range(p):
            g = dist.new_group([r * p + s for r in range(d)])
            if s == self.pp_rank:
                self.dp_group = g

    # ---- setup -------------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        assert self.lightning_module is not None
        self.spec = self.precheck_model(self.lightning_module)
        n = len(self.spec.layers)
        groups = self.num_stages * self.num_chunks
        if self.partition_opt is not None:
            self.partition = validate_partition(self.partition_opt, n, groups)
        else:
            costs = (
                list(self.spec.layer_costs)
                if self.spec.layer_costs is not None
                else [
                    1.0 + sum(p.numel() for p in layer.parameters()) for layer in self.spec.layers
                ]
            )
            self.partition = balanced_partition(costs, groups)
        if self.model is not None:
            self.model = self.precision_plugin.convert_module(self.model)
        if trainer.state.fn == "fit":
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        # norm clipping must see the norm over all stages, not this rank's share
        self.precision_plugin.clip_grad_by_norm = self._clip_grad_by_norm  # type: ignore[method-assign]
        self.barrier()

    def model_to_device(self) -> None:
        """Only the local layer groups move (the engine does it); the rest stays on the host."""

    # ---- the engine --------------------------------------------------------------------------

    def _resolve_memory_limit(self, local_params: list[torch.nn.Parameter]) -> list[float] | None:
        opt = self.memory_limit_opt
        if opt is None:
            return None
        if opt != "auto":
            return [float(opt)] * self.num_stages
        dev = self.root_device
        if dev.type != "cuda":
            return None
        total = float(torch.cuda.get_device_properties(dev).total_memory)  # pragma: no cover
        state = 4.0 * sum(p.numel() * p.element_size() for p in local_params)  # pragma: no cover
        mine = max(total * 0.9 - state - torch.cuda.memory_allocated(dev), 1.0)  # pragma: no cover
        vals = gather(mine, self.pp_group)  # pragma: no cover
        return [float(x) for x in vals]  # pragma: no cover

    def _shape_problem(self) -> Problem:
        assert self.spec is not None
        bounds = []
        start = 0
        costs = (
            list(self.spec.layer_costs)
            if self.spec.layer_costs is not None
            else [1.0] * len(self.spec.layers)
        )
        for size in self.partition:
            bounds.append(sum(costs[start : start + size]))
            start += size
        return initial_problem(
            self.num_stages, self.num_microbatches, self.num_chunks, self.placement, bounds
        )

    def _build_engine(self, batch_size: int) -> None:
        assert self.spec is not None
        m = self.num_microbatches
        if batch_size % m != 0:
            raise OptPipeConfigError(
                f"batch size {batch_size} does not divide into num_microbatches={m}; use a batch "
                f"size that is a multiple of {m} (and drop_last=True in the DataLoader)"
            )
        base = self._shape_problem()
        # on GPU a step that times its ops synchronises after each one: keep its wall time out
        self._sampler.walls_of_timed_steps = self.root_device.type != "cuda"
        self._hardware = hardware_fingerprint(
            self.root_device, self.world_size, self._process_group_backend or "gloo"
        )
        assert self.lightning_module is not None
        self._model_fp = model_fingerprint(
            type(self.lightning_module).__name__,
            self.spec.layers,
            batch_size // m,
            self.num_stages,
            self.num_chunks,
            self.partition,
        )
        if self.is_global_zero:
            self._run_log = RunLog(self.database_url, self.use_database, self.require_database)
        stored = None
        if self._run_log is not None and self._run_log.active:
            stored = self._run_log.find_profile(self._hardware, self._model_fp)
        stored_json = self.broadcast(None if stored is None else stored.model_dump_json())
        if stored_json is not None or self.profile_steps == 0:
            # no profiling: schedule from the stored profile (or unit costs)
            placeholder = profiling_schedule(base)
            self.engine = self._new_engine(base, placeholder, measure=False)
            if stored_json is not None:
                from ..schedule.profile import Profile

                profile = Profile.model_validate_json(stored_json)
                problem = self._problem_from_profile(profile)
                reason = "stored profile"
            else:
                problem = base
                reason = "no profiling (unit costs)"
            self._adopt(problem, reason)
        else:
            self.engine = self._new_engine(base, profiling_schedule(base), measure=True)
            self.phase = "profiling"
            self._may_repartition = self.partition_opt is None and self.repartition
            if self._may_repartition:
                self.engine.instrument_layers(True)
        if self._run_log is not None and self._run_log.active:
            self._run_log.start_run(self._hardware, self._model_fp, self._config())

    def _new_engine(self, problem: Problem, schedule: Schedule, measure: bool) -> PipelineEngine:
        assert self.spec is not None
        return PipelineEngine(
            list(self.spec.layers),
            self.spec.loss_fn,
            problem,
            schedule,
            self.partition,
            self.pp_rank,
            self.pp_group,
            self.root_device,
            offload_min_bytes=self.offload_min_bytes,
            measure=measure,
        )

    def _config(self) -> dict[str, Any]:
        return {
            "num_stages": self.num_stages,
            "num_microbatches": self.num_microbatches,
            "num_chunks": self.num_chunks,
            "schedule": self.schedule_name,
            "memory_limit": self.memory_limit_opt if self.memory_limit_opt != "auto" else "auto",
            "offload": self.offload_enabled,
            "data_parallel": self.data_parallel,
            "partition": self.partition,
            "profile_steps": self.profile_steps,
            "online_resolve": self.online_resolve,
            "calibrate": self.calibrate,
            "calibrate_every": self.calibrate_every,
            "calibrate_min_steps": self.calibrate_min_steps,
        }

    def _problem_from_profile(self, profile: Any) -> Problem:
        assert self.engine is not None
        limit = self._resolve_memory_limit(self.engine.parameters)
        problem: Problem = profile.to_problem(memory_limit=limit)
        if not self.offload_enabled and problem.offload is not None:
            problem = problem.with_changes(offload=None)
        return problem

    def _adopt(self, problem: Problem, reason: str) -> None:
        """Choose the schedule on global rank 0, broadcast it, switch every rank to it."""
        payload: tuple[str, str]
        if self.is_global_zero:
            try:
                if self.schedule_source is not None:
                    sched = self.schedule_source(problem)
                else:
                    name = self.schedule_name
                    use_bg = name == "optimal" and self.online_resolve
                    # with online re-solve the best baseline starts now and the solver catches up
                    if use_bg:
                        sched = _best_baseline(problem)
                    else:
                        sched = choose_schedule(
                            name, problem, self.solver_backend, self.solver_time_limit
                        )
                payload = ("ok", sched.model_copy(update={"problem": problem}).to_json())
            except (NoScheduleError, ScheduleRejectedError, ValueError) as e:
                payload = ("error", str(e))
        else:
            payload = ("", "")
        payload = self.broadcast(payload)
        if payload[0] == "error":
            raise NoScheduleError(payload[1])
        sched = Schedule.from_json(payload[1])
        # rank 0's problem for everyone (memory limits may differ a little between replicas)
        problem = sched.problem or problem
        self._switch(sched, problem, reason)
        self.phase = "run"
        if self.online_resolve and self.schedule_source is None and self.schedule_name == "optimal":
            self._start_resolve(problem, sched)

    def _switch(self, schedule: Schedule, problem: Problem, reason: str) -> None:
        assert self.engine is not None
        old = self.engine.schedule.generator
        self.engine.switch(schedule, problem)
        self.engine.cursor.set_measure(False)
        self._sampler.reset()  # calibration data belongs to the schedule that produced it
        pred = simulate(problem, schedule.actions).makespan
        self._predicted = pred
        entry = {
            "step": self._optimizer_steps,
            "from": old,
            "to": schedule.generator,
            "reason": reason,
            "predicted_seconds": pred,
        }
        self.switches.append(entry)
        log.info(
            "optpipe: step %d: schedule %s -> %s (%s), predicted %.6gs",
            self._optimizer_steps,
            old,
            schedule.generator,
            reason,
            pred or float("nan"),
        )
        if self._run_log is not None and self._run_log.active:
            prev = self._schedule_id
            self._schedule_id = self._run_log.store_schedule(schedule, problem, source=reason)
            self._run_log.record_switch(self._optimizer_steps, prev, self._schedule_id, reason)

    def _calibrate(self) -> None:
        """Re-estimate the costs from the running schedule's steps (every rank, same boundary).

        Every rank's op samples go to global rank 0, which fits the calibrated problem
        (``calibration.calibrate``) and broadcasts it; the engine, the predicted step time and
        the background solver use it from now on. When the solver has finished and the costs
        moved by more than ``RESOLVE_DRIFT`` from the ones it solved, a new solve starts on the
        calibrated problem (at most ``MAX_CALIBRATED_RESOLVES`` times per run).
        """
        assert self.engine is not None
        parts = gather(self._sampler.op_samples(self.pp_rank), self.pp_group)
        payload: tuple[str, dict[str, Any]] | None = None
        if self.is_global_zero:
            samples: dict[tuple[int, int, str], list[float]] = {}
            for part in parts:
                samples.update(part)
            try:
                cal = calibrate(
                    self.engine.problem,
                    self.engine.schedule.actions,
                    samples,
                    list(self._sampler.walls),
                    self._overhead_in_problem,
                    self._sampler.timed,
                )
                payload = (cal.problem.model_dump_json(), _calibration_record(cal))
            except Exception as e:  # calibration must never stop training
                log.warning("optpipe: calibration skipped (%s)", e)
        payload = self.broadcast(payload)
        if payload is None:
            return
        problem = Problem.model_validate_json(payload[0])
        record: dict[str, Any] = {
            "step": self._optimizer_steps,
            "schedule": self.engine.schedule.generator,
        }
        record.update(payload[1])
        self.calibrations.append(record)
        del self.calibrations[:-MAX_CALIBRATION_RECORDS]
        first = self._sampler.calibrations <= 1
        old_pred = self._predicted or 0.0
        self.engine.problem = problem
        self._overhead_in_problem = float(record["overhead_seconds"])
        self._predicted = float(record["predicted_seconds"])
        # the first calibration of a schedule, and any that moves the prediction by > 5%, at INFO
        moved = abs(self._predicted - old_pred) > 0.05 * max(old_pred, 1e-12)
        log.log(
            logging.INFO if first or moved else logging.DEBUG,
            "optpipe: step %d: calibrated %s from %d steps (%d op-timed): measured %.6gs, "
            "predicted %.6gs -> %.6gs, overhead %.3g ms per action",
            self._optimizer_steps,
            record["schedule"],
            record["steps"],
            record["timed_steps"],
            record["measured_seconds"],
            record["previous_seconds"],
            record["predicted_seconds"],
            1e3 * record["overhead_seconds"],
        )
        if self._solver is not None:
            self._solver.update_problem(problem, self.engine.schedule.actions)
        if (
            not self._resolving
            and self._solved_problem is not None
            and self._calibrated_resolves < MAX_CALIBRATED_RESOLVES
            and max_cost_change(self._solved_problem, problem) > RESOLVE_DRIFT
        ):
            self._calibrated_resolves += 1
            if self._solver is not None:
                self._solver.stop()
                self._solver = None
            log.info("optpipe: costs moved > %d%%: solving again", round(100 * RESOLVE_DRIFT))
            self._start_resolve(problem, self.engine.schedule)

    def _start_resolve(self, problem: Problem, current: Schedule) -> None:
        self._solved_problem = problem
        ok = False
        if self.is_global_zero:
            try:
                import optpipe_lightning.solver as solver_mod

                if hasattr(solver_mod, "solve"):
                    span = simulate(problem, current.actions).makespan or float("inf")
                    self._solver = BackgroundSolver(
                        problem,
                        span,
                        self.solver_backend,
                        self.solver_time_limit,
                        min_gain=self.resolve_min_gain,
                        start_method=self.resolve_start_method,
                    )
                    ok = True
            except Exception as e:
                log.warning("optpipe: online re-solve unavailable (%s)", e)
        self._resolving = bool(self.broadcast(ok))

    def _maybe_repartition(self) -> bool:
        """Re-balance the layer groups by the profiled per-layer costs (once, when it pays).

        The new partition is taken when it lowers the largest group's estimated cost by at least
        ``REPARTITION_GAIN``. Parameters and optimizer state move to their new ranks (the same
        collection a checkpoint does), so the numbers do not change; profiling then restarts.
        """
        assert self.engine is not None and self.spec is not None
        self._may_repartition = False
        mine = self.engine.layer_costs()
        merged: dict[int, tuple[float, float]] = {}
        for part in gather(mine, self.pp_group):
            merged.update(part)
        n = len(self.spec.layers)
        groups = self.num_stages * self.num_chunks
        decision: list[int] | None = None
        limits = self._resolve_memory_limit(self.engine.parameters)
        if self.is_global_zero and len(merged) == n and all(c > 0 for c, _ in merged.values()):
            costs = [merged[i][0] for i in range(n)]
            # memory: a group holds up to num_stages microbatches' activations (1F1B-like peak)
            memory = [merged[i][1] * self.num_stages for i in range(n)]
            try:
                new = balanced_partition(
                    costs, groups, memory=memory, memory_limit=min(limits) if limits else None
                )
            except PartitionError:
                new = self.partition  # nothing fits better; the schedule may still offload

            def worst(sizes: list[int]) -> float:
                out, start = 0.0, 0
                for size in sizes:
                    out = max(out, sum(costs[start : start + size]))
                    start += size
                return out

            if new != self.partition and worst(new) < worst(self.partition) * (
                1 - REPARTITION_GAIN
            ):
                decision = new
        decision = self.broadcast(decision)
        if decision is None:
            return False
        old = self.partition
        state = self.lightning_module_state_dict()
        opt_states = [self.optimizer_state(o) for o in self.optimizers]
        for chain in self.engine.local_modules:
            chain.to("cpu")
        assert self.lightning_module is not None
        self.lightning_module.load_state_dict(state)
        for opt, st in zip(self.optimizers, opt_states, strict=True):
            opt.load_state_dict(st)
            _optimizer_state_to(opt, self.root_device)
        self.partition = list(decision)
        assert self._model_fp is not None
        self._model_fp = self._model_fp.model_copy(update={"partition": self.partition})
        base = self._shape_problem()
        self.engine.instrument_layers(False)
        self.engine = self._new_engine(base, profiling_schedule(base), measure=True)
        self._eval_engine = None
        self.switches.append(
            {
                "step": self._optimizer_steps,
                "from": "optpipe-profiling",
                "to": "optpipe-profiling",
                "reason": f"repartitioned {old} -> {self.partition}",
                "predicted_seconds": None,
            }
        )
        log.info(
            "optpipe: step %d: layer groups %s -> %s (profiled per-layer costs)",
            self._optimizer_steps,
            old,
            self.partition,
        )
        return True

    def _finish_profiling(self) -> None:
        assert self.engine is not None
        if self._may_repartition and self._maybe_repartition():
            self._profiled_steps = 0
            self._profile_walls = []
            stored = None
            if self._run_log is not None and self._run_log.active:
                stored = self._run_log.find_profile(self._hardware, self._model_fp)
            stored_json = self.broadcast(None if stored is None else stored.model_dump_json())
            if stored_json is None:
                return  # profile again, on the new partition
            self.profile = _profile_from_json(stored_json)
            self._adopt(self._problem_from_profile(self.profile), "stored profile")
            return
        self.engine.instrument_layers(False)
        m = self.num_microbatches
        # the warm-up step's op times were dropped after it ran (training_step)
        rows = local_measurements(self.engine.cursor, self.pp_rank, self.num_chunks)
        gathered = gather(rows, self.pp_group)
        out_bytes = max(gather(max(self.engine.cursor.out_bytes or [4]), self.pp_group))
        p2p = measure_p2p(
            int(out_bytes), self.pp_rank, self.num_stages, self.pp_group, self.root_device
        )
        d2h, h2d = measure_copy_bandwidth(self.root_device)
        bws = gather((d2h, h2d), self.pp_group)
        profile = build_profile(
            gathered,
            self._hardware,
            self._model_fp,
            m,
            self.placement,
            p2p,
            min(b[0] for b in bws),
            min(b[1] for b in bws),
        )
        if self.is_global_zero:
            # the runtime's per-action overhead (p2p posting, waits, Python), so the simulator
            # predicts wall time, not compute time; the warm-up step is left out
            walls = self._profile_walls[1:]
            delta = runtime_overhead(profile, self.engine.schedule.actions, walls)
            profile = with_overhead(profile, delta)
            self._overhead_in_problem = delta
            log.info("optpipe: runtime overhead %.3g ms per action", 1e3 * delta)
        profile = _profile_from_json(self.broadcast(profile.model_dump_json()))
        if self._run_log is not None and self._run_log.active:
            self._run_log.store_profile(profile)
        self.profile = profile
        self._adopt(self._problem_from_profile(profile), "profiled")

    # ---- steps -------------------------------------------------------------------------------

    def training_step(self, *args: Any, **kwargs: Any) -> Tensor:
        assert self.spec is not None and self.lightning_module is not None
        batch = args[0] if args else kwargs["batch"]
        inputs, targets = self.spec.split(batch)
        if self.engine is None:
            self._check_same_batch(inputs, targets)
            self._build_engine(_batch_size(inputs))
        assert self.engine is not None
        trainer = self.lightning_module.trainer
        accumulate = max(1, int(trainer.accumulate_grad_batches))
        if self._step_started is None:
            self._step_started = time.perf_counter()
        # Lightning zeroes gradients *after* training_step and before backward: run the pipeline
        # on fresh .grad, keep its gradients aside, and hand them over in ``backward``.
        params = self.engine.parameters
        old = [p.grad for p in params]
        for p in params:
            p.grad = None
        cursor = self.engine.cursor
        sampling = self.phase == "run" and self.calibrate
        if sampling:
            cursor.measure = self._sampler.time_ops_next()
        t0 = time.perf_counter()
        with self.precision_plugin.train_step_context():
            loss = self.engine.step(inputs, targets, grad_scale=1.0 / accumulate)
        elapsed = time.perf_counter() - t0
        self._step_seconds += elapsed
        self._step_count += 1
        if self.phase == "profiling":
            self._profile_walls.append(elapsed)
            if len(self._profile_walls) == 1:
                cursor.drop_times()  # the warm-up step's op times; its byte counts stay
            cursor.count_bytes = False  # bytes: warm-up step only
        elif sampling:
            self._sampler.record(elapsed, cursor.measure, cursor.times)
            cursor.drop_times()
            cursor.measure = False
        if self.dp_group is not None:
            for p in params:
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.dp_group)
                    p.grad.div_(self.data_parallel)
            dist.all_reduce(loss, group=self.dp_group)
            loss = loss / self.data_parallel
        self._pending_grads = [p.grad for p in params]
        for p, g in zip(params, old, strict=True):
            p.grad = g
        if self.log_loss_as:
            self.lightning_module.log(self.log_loss_as, loss, prog_bar=True, logger=True)
        return loss

    def _check_same_batch(self, inputs: Any, targets: Any) -> None:
        """Stage 0 takes the inputs, the last stage the targets: they must be the same samples."""
        if not _distributed_is_initialized():
            return
        sig = _batch_signature(inputs) + _batch_signature(targets)
        sigs = gather(sig, self.pp_group)
        if any(x != sigs[0] for x in sigs):
            raise OptPipeConfigError(
                "the ranks of one pipeline got different batches (stage 0's inputs would meet "
                "other samples' targets); let Lightning add its distributed sampler "
                "(use_distributed_sampler=True) or give every stage of a replica the same data"
            )

    def backward(
        self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> Tensor:
        """The pipeline step already ran every backward: add its gradients to ``.grad`` now."""
        if self.engine is not None and self._pending_grads is not None:
            for p, g in zip(self.engine.parameters, self._pending_grads, strict=True):
                if g is None:
                    continue
                p.grad = g if p.grad is None else p.grad + g
            self._pending_grads = None
        return closure_loss

    def _clip_grad_by_norm(self, optimizer: Optimizer, clip_val: float) -> None:
        """``clip_grad_norm_`` with the 2-norm over every stage's gradients (one all-reduce)."""
        params = [p for p in (self.engine.parameters if self.engine else []) if p.grad is not None]
        sq = torch.zeros(1, device=self.root_device)
        for p in params:
            assert p.grad is not None
            sq += p.grad.detach().float().pow(2).sum()
        if _distributed_is_initialized() and self.pp_group is not None:
            dist.all_reduce(sq, group=self.pp_group)
        coef = torch.clamp(float(clip_val) / (sq.sqrt() + 1e-6), max=1.0)
        for p in params:
            assert p.grad is not None
            p.grad.detach().mul_(coef.to(p.grad.dtype))

    def optimizer_step(
        self, optimizer: Optimizer, closure: Callable[[], Any], model: Any = None, **kwargs: Any
    ) -> Any:
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        self._optimizer_steps += 1
        self._at_boundary()
        return out

    def _at_boundary(self) -> None:
        """Every rank, same optimizer step: record, end profiling, apply solver switches."""
        seconds, self._step_seconds = self._step_seconds, 0.0
        count, self._step_count = max(self._step_count, 1), 0
        peaks: list[float] = []
        if self.root_device.type == "cuda":  # pragma: no cover - GPU only
            peaks = [
                float(x)
                for x in gather(torch.cuda.max_memory_allocated(self.root_device), self.pp_group)
            ]
            torch.cuda.reset_peak_memory_stats(self.root_device)
        if self._run_log is not None and self._run_log.active and self.engine is not None:
            # predictions only for schedules chosen on measured costs (not while profiling)
            # (one pipeline step per accumulated batch: the optimizer step takes ``count`` of them)
            pred = self._predicted * count if self.phase == "run" and self._predicted else None
            self._run_log.record_step(
                self._optimizer_steps, seconds, pred, self._schedule_id, peaks
            )
        if self.phase == "run" and self.calibrate and self._sampler.due():
            self._calibrate()
        if self.phase == "profiling":
            self._profiled_steps += 1
            if self._profiled_steps >= self.profile_steps + 1:  # first step is a warm-up
                self._finish_profiling()
            return
        if not self._resolving:
            return
        decision = self._solver.poll() if self._solver is not None else SwitchDecision("none")
        decision = self.broadcast(decision)
        if decision.kind == "switch":
            assert self.engine is not None
            sched = Schedule.from_json(decision.schedule_json)
            self._switch(sched, self.engine.problem, decision.reason)
        elif decision.kind == "done":
            self._resolving = False

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        assert self.spec is not None and self.lightning_module is not None
        batch = args[0] if args else kwargs["batch"]
        inputs, targets = self.spec.split(batch)
        if self._eval_engine is None:
            m = self.num_microbatches
            if _batch_size(inputs) % m != 0:
                raise OptPipeConfigError(
                    f"validation batch size {_batch_size(inputs)} does not divide into "
                    f"num_microbatches={m}; use a multiple of {m} and drop_last=True"
                )
            base = self._shape_problem()
            self._eval_engine = self._new_engine(base, profiling_schedule(base), measure=False)
        with self.precision_plugin.val_step_context():
            loss = self._eval_engine.evaluate(inputs, targets)
        self.lightning_module.log(
            "val_loss", loss, prog_bar=True, sync_dist=self.dp_group is not None
        )
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

    def _local_keys(self) -> set[str]:
        assert self.lightning_module is not None and self.spec is not None
        names = {id(m): n for n, m in self.lightning_module.named_modules()}
        mine: set[str] = set()
        engine = self.engine
        if engine is None:
            return mine
        local_layers = {id(layer) for chain in engine.local_modules for layer in chain.layers}
        state = self.lightning_module.state_dict()
        prefixes = [names[i] + "." for i in local_layers if i in names]
        for k in state:
            if any(k.startswith(p) for p in prefixes):
                mine.add(k)
        return mine

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The full model, every layer from the rank that trains it (collected on every rank)."""
        assert self.lightning_module is not None
        state = self.lightning_module.state_dict()
        if self.engine is None or not _distributed_is_initialized():
            return state
        mine = {k: v.detach().cpu() for k, v in state.items() if k in self._local_keys()}
        merged = dict(state)
        for part in gather(mine, self.pp_group):
            merged.update(part)
        return {k: v.detach().cpu() if isinstance(v, Tensor) else v for k, v in merged.items()}

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer state of all stages merged (parameter indices agree on every rank)."""
        opt = getattr(optimizer, "_optimizer", optimizer)
        sd = opt.state_dict()
        if self.engine is None or not _distributed_is_initialized():
            return sd
        local = {k: _to_cpu(v) for k, v in sd["state"].items()}
        merged: dict[Any, Any] = {}
        for part in gather(local, self.pp_group):
            merged.update(part)
        return {"state": merged, "param_groups": sd["param_groups"]}

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        opt_states = checkpoint["optimizer_states"]
        for optimizer, opt_state in zip(self.optimizers, opt_states, strict=False):
            optimizer.load_state_dict(opt_state)
            _optimizer_state_to(optimizer, self.root_device)

    # ---- teardown ----------------------------------------------------------------------------

    def teardown(self) -> None:
        if self._solver is not None:
            self._solver.stop()
            self._solver = None
        if self._run_log is not None:
            status = "finished"
            trainer = getattr(self.lightning_module, "_trainer", None)
            if trainer is not None and str(trainer.state.status.value) != "finished":
                status = str(trainer.state.status.value)  # "interrupted" (or still "running")
            self._run_log.finish(status)
            self._run_log.close()
        super().teardown()


class _CheckingLauncher(_Launcher):
    """Checks the model contract and sizes in the launching process, then launches."""

    def __init__(self, strategy: OptPipeStrategy, inner: Any) -> None:
        self.strategy = strategy
        self.inner = inner

    @property
    def is_interactive_compatible(self) -> bool:
        return bool(self.inner.is_interactive_compatible)

    def launch(
        self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any
    ) -> Any:
        self.strategy.check_sizes(self.strategy.total_devices)
        model = args[0] if args else None
        if isinstance(model, pl.LightningModule):
            self.strategy.precheck_model(model)
        return self.inner.launch(function, *args, trainer=trainer, **kwargs)

    def kill(self, signum: Any) -> None:  # pragma: no cover - signal path
        kill = getattr(self.inner, "kill", None)
        if kill is not None:
            kill(signum)


def _run_by_strategy(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(
        "this step runs inside OptPipeStrategy (the pipeline); it is not called directly"
    )


def _check_microbatches(m: int, p: int) -> None:
    if m < p:
        raise OptPipeConfigError(
            f"num_microbatches={m} is fewer than num_stages={p}: the pipeline never fills and "
            f"every schedule here needs at least one microbatch per stage; use >= {p} "
            f"(2x stages or more is better)"
        )


def _best_baseline(problem: Problem) -> Schedule:
    """The fastest feasible baseline (what runs while the background solver works)."""
    from ..schedule.baselines import BASELINE_NAMES, NotApplicable, generate

    best: Schedule | None = None
    span = float("inf")
    for name in BASELINE_NAMES:
        try:
            sched = generate(name, problem)
        except (NotApplicable, ImportError, KeyError):
            continue
        except Exception:  # a broken generator must not stop training
            continue
        res = simulate(problem, sched.actions)
        if res.feasible and (res.makespan or float("inf")) < span:
            best, span = sched, float(res.makespan or float("inf"))
    if best is None:
        raise NoScheduleError(
            f"no schedule fits the memory limit {problem.memory_limits()} bytes per stage; "
            "raise memory_limit, enable offload, or use more stages"
        )
    return best


def _calibration_record(cal: Calibration) -> dict[str, Any]:
    return {
        "measured_seconds": cal.measured,
        "previous_seconds": cal.previous,
        "predicted_seconds": cal.predicted,
        "overhead_seconds": cal.overhead,
        "steps": cal.steps,
        "timed_steps": cal.timed_steps,
        "t_f": cal.compute.cost("t_f").tolist(),
        "t_b": cal.compute.cost("t_b").tolist(),
        "t_w": cal.compute.cost("t_w").tolist(),
        "t_bw": cal.compute.cost("t_bw").tolist(),
    }


def _profile_from_json(text: str) -> Any:
    from ..schedule.profile import Profile

    return Profile.model_validate_json(text)


def _batch_size(x: Any) -> int:
    if isinstance(x, Tensor):
        return int(x.shape[0])
    if isinstance(x, tuple | list) and x:
        return _batch_size(x[0])
    raise ContractError("pipeline inputs must be a tensor or a tuple of tensors (batch first)")


def _batch_signature(x: Any) -> list[float]:
    if isinstance(x, Tensor):
        t = x.detach().double()
        return [float(t.sum()), float((t * t).sum()), float(t.numel())]
    if isinstance(x, tuple | list):
        return [v for item in x for v in _batch_signature(item)]
    return []


def _to_cpu(v: Any) -> Any:
    if isinstance(v, Tensor):
        return v.detach().cpu()
    if isinstance(v, dict):
        return {k: _to_cpu(x) for k, x in v.items()}
    return v


def _optimizer_state_to(optimizer: Any, device: torch.device) -> None:
    opt = getattr(optimizer, "_optimizer", optimizer)
    for st in opt.state.values():
        for k, v in st.items():
            if isinstance(v, Tensor) and k != "step":
                st[k] = v.to(device)


def _register_on_import() -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    OptPipeStrategy.register_strategies(StrategyRegistry)


_register_on_import()
