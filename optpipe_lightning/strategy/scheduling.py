"""Which schedule runs, from the first training step to the last (one ``Scheduler`` per fit).

The first training step builds the engine once the batch size is known: a stored profile of the
same model on the same hardware gives the problem and the schedule at once; else the first
``profile_steps + 1`` steps run the profiling schedule (the first one a warm-up), and at the
boundary after them the profile is built (``profiler.profile_pipeline``), the layer groups may
be re-balanced by the measured per-layer costs (``repartition.py``, then profiling starts again
on the new partition), and the schedule is chosen on the profiled problem. Global rank 0 picks,
every rank switches at the same optimizer-step boundary. After that, each boundary records the
step (``run_log.py``), calibrates the costs from the running schedule when due
(``calibration.Calibrator``) and switches to a better solver incumbent when one arrives
(``resolve.OnlineResolve``). Validation, test and predict run on ``ForwardPipeline``s of their
own, one per microbatch count and input shape.

Messages (switches, the chosen schedule and its predicted step time, calibrations, profiling)
go to ``notify`` (the strategy passes Lightning's rank-zero messages).

What a step costs outside the pipeline stays small: the loss hand-out does not hold up the rank
that sends it (``PipelineEngine``), the run log buffers its records, calibrations keep to a
budget, the re-solve's poll is a broadcast no rank waits for, and steps that overlap a solve do
not feed calibration. The run log compares like with like: every optimizer step's wall time
(boundary to boundary, on global rank 0) against its prediction: the running schedule's makespan
per pipeline step plus the time outside the pipeline (optimizer update, the training loop),
the median of the recent steps' measured share (``OUTSIDE_WINDOW``).
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from ..schedule import Problem, Schedule, simulate
from ..schedule.margin import limit_with_margin
from ..schedule.profile import Profile
from .calibration import Calibrator
from .contract import PipelineSpec
from .engine import ForwardPipeline, PipelineEngine, ScheduleRejectedError
from .microbatch import choose_microbatches, eval_microbatches
from .op_memory import limits_less_reserve
from .options import OptPipeConfigError, PipelineOptions
from .partition import PartitionError, chunked_partition, runnable_chunkings, stage_layers
from .planner import (
    NoScheduleError,
    Placement,
    best_baseline,
    choose_schedule,
    initial_problem,
    profiling_schedule,
)
from .process_groups import PipelineComm
from .profiler import (
    hardware_fingerprint,
    model_fingerprint,
    profile_pipeline,
)
from .repartition import move_to_partition, profiled_partition
from .resolve import OnlineResolve, RunContext
from .run_log import BatchMetrics, RunLog

log = logging.getLogger(__name__)

MAX_FORWARD_PIPELINES = 4  # forward-only pipelines kept (one per microbatch count and shape)

Notify = Callable[[str, bool], None]  # (message, detail): detail messages are debug-level


def _log_notify(text: str, detail: bool = False) -> None:
    log.log(logging.DEBUG if detail else logging.INFO, "%s", text)


def with_margin(limits: list[float], margin: float | str) -> list[float]:
    """Every stage's limit less the margin (the same on every rank: the limits are)."""
    try:
        return [limit_with_margin(x, margin) for x in limits]
    except ValueError as e:
        raise OptPipeConfigError(f"memory_margin: {e}") from None


def _chunking(problem: Problem) -> tuple[int, Placement]:
    """(chunks per device, placement); one chunk has no placement to speak of."""
    return problem.num_chunks, problem.placement if problem.num_chunks > 1 else "interleaved"


OUTSIDE_WINDOW = 16  # recent steps whose time outside the pipeline predicts the next one's
PEAKS_EVERY = 16  # GPU: every rank's peak memory per step is gathered this often (not per step)
CLOSE_WAIT_SECONDS = 60.0  # at the end, how long to wait for what is still in flight


class Scheduler:
    """The engine and the schedule it runs; every method is called on every rank together."""

    def __init__(
        self,
        options: PipelineOptions,
        spec: PipelineSpec,
        comm: PipelineComm,
        device: torch.device,
        partition: Sequence[int],
        num_microbatches: int | None = None,
        model_name: str = "model",
        backend: str = "gloo",
        notify: Notify = _log_notify,
        module: nn.Module | None = None,
        optimizers: Callable[[], Sequence[Optimizer]] = tuple,
    ) -> None:
        self.options = options
        self.module = module  # whose state moves when layers change ranks (re-chunking)
        self.optimizers = optimizers
        self.spec = spec
        self.comm = comm
        self.device = device
        self.partition = list(partition)
        self.num_microbatches = num_microbatches  # training's; None: chosen on the first batch
        self.model_name = model_name
        self.backend = backend
        self.notify = notify
        self.num_chunks, self.placement = options.chunks
        self.engine: PipelineEngine | None = None
        self.forward_pipelines: OrderedDict[Any, ForwardPipeline] = OrderedDict()
        self.phase = "new"  # new -> profiling -> run
        self.optimizer_steps = 0
        self.predicted: float | None = None  # the running schedule's makespan (seconds)
        self.switches: list[dict[str, Any]] = []  # every switch: step, generator, reason
        self.profile: Profile | None = None
        self.run_log: RunLog | None = None
        self.calibrator = Calibrator(
            comm, options.calibrate_every, options.calibrate_min_steps, options.calibrate_budget
        )
        self.resolve = OnlineResolve(
            comm,
            options.solver_backend,
            options.solver_time_limit,
            options.resolve_min_gain,
            options.resolve_start_method,
            on_message=lambda text: notify(text, False),
            device=device,
        )
        self._hardware: Any = None
        self._model_fp: Any = None
        self._profiled_steps = 0
        self._profile_walls: list[float] = []  # wall seconds of each profiling step
        self._may_repartition = False
        self._step_seconds = 0.0
        self._step_count = 0  # pipeline steps in this optimizer step (accumulate_grad_batches)
        self._boundary: float | None = None  # when the last optimizer step ended (perf_counter)
        self._outside: deque[float] = deque(maxlen=OUTSIDE_WINDOW)  # seconds outside the pipeline
        self._walls: deque[float] = deque(maxlen=OUTSIDE_WINDOW)  # the running schedule's steps
        self._peaks: dict[int, float] = {}  # GPU: this rank's peak memory per step, not gathered
        self._solve_pending = False  # a solve is to be planned at the next boundary
        self._total_steps: float | None = None  # optimizer steps of the whole fit (inf: unknown)
        self.predicted_step: float | None = None  # the whole optimizer step's prediction
        self._batches = BatchMetrics()  # this optimizer step's batches, for the run log
        self._count = 1  # pipeline steps in the last optimizer step

    @property
    def calibrations(self) -> list[dict[str, Any]]:
        return self.calibrator.records

    # ---- the problem -------------------------------------------------------------------------

    def shape_problem(self, num_microbatches: int | None = None) -> Problem:
        """The pipeline's shape with costs proportional to the layer groups' relative costs."""
        costs = (
            list(self.spec.layer_costs)
            if self.spec.layer_costs is not None
            else [1.0] * len(self.spec.layers)
        )
        bounds, start = [], 0
        for size in self.partition:
            bounds.append(sum(costs[start : start + size]))
            start += size
        m = num_microbatches or self.num_microbatches
        assert m is not None, "the microbatch count is chosen on the first training batch"
        return initial_problem(self.comm.num_stages, m, self.num_chunks, self.placement, bounds)

    def training_microbatches(self, batch_size: int) -> int:
        """The training microbatch count for this batch size (``"auto"``: chosen here)."""
        p, requested = self.comm.num_stages, self.options.num_microbatches
        if isinstance(requested, int):
            if batch_size % requested != 0:
                fits = [m for m in range(p, batch_size + 1) if batch_size % m == 0]
                raise OptPipeConfigError(
                    f"batch size {batch_size} does not divide into num_microbatches={requested}; "
                    f"use a batch size that is a multiple of {requested} (and drop_last=True in "
                    "the DataLoader)" + (f", or num_microbatches in {fits}" if fits else "")
                )
            return requested

        def runs_with(m: int) -> bool:
            if self.options.schedule == "optimal":
                return True
            try:
                choose_schedule(self.options.schedule, self.shape_problem(m))
            except NoScheduleError:
                return False
            return True

        try:
            return choose_microbatches(batch_size, p, runs_with)
        except ValueError as e:
            raise OptPipeConfigError(str(e)) from None

    def memory_limit(self, local_params: list[nn.Parameter]) -> list[float] | None:
        """Activation bytes per stage (``"auto"``: 90% of the device memory less parameters,
        gradients, optimizer state and what is allocated; unlimited on CPU), less the
        ``memory_margin`` (``schedule/margin.py``)."""
        opt = self.options.memory_limit
        if opt is None:
            return None
        if opt != "auto":
            limits = [float(opt)] * self.comm.num_stages
        elif self.device.type != "cuda":
            return None
        else:  # pragma: no cover - GPU only
            dev = self.device
            total = float(torch.cuda.get_device_properties(dev).total_memory)
            # what stays allocated between steps: parameters, gradients and two Adam moments (4x
            # the parameters), or what is allocated now where that is more (it already holds
            # them after the first optimizer step: subtracting both counted the parameters twice)
            state = 4.0 * sum(p.numel() * p.element_size() for p in local_params)
            static = max(state, float(torch.cuda.memory_allocated(dev)))
            mine = max(total * 0.9 - static, 1.0)
            limits = [float(x) for x in self.comm.gather(mine)]
        return with_margin(limits, self.options.memory_margin)

    def problem_from_profile(self, profile: Profile) -> Problem:
        assert self.engine is not None
        limit = self.memory_limit(self.engine.parameters)
        if limit is not None and self.options.memory_limit == "auto":
            limit = limits_less_reserve(limit, profile)  # op transients (GPU-measured)
        if limit is not None and self.run_log is not None and self.run_log.active:
            self.run_log.record_memory_limit(limit)
        problem: Problem = profile.to_problem(memory_limit=limit)
        if not self.options.offload and problem.offload is not None:
            problem = problem.with_changes(offload=None)
        o = self.options
        if o.num_chunks is None and o.placement is None and o.partition is None:
            # DESIGN's layers_per_stage: lets the solver choose the chunk count (re-chunk below);
            # a chunking or a partition the user set stays
            problem = problem.with_changes(layers_per_stage=stage_layers(self.partition, problem))
        return problem

    def config(self) -> dict[str, Any]:
        o = self.options
        return {
            "num_stages": self.comm.num_stages,
            "num_microbatches": self.num_microbatches,
            "num_chunks": self.num_chunks,
            "schedule": o.schedule,
            "memory_limit": o.memory_limit if o.memory_limit != "auto" else "auto",
            "memory_margin": o.memory_margin,
            "offload": o.offload,
            "data_parallel": o.data_parallel,
            "partition": self.partition,
            "profile_steps": o.profile_steps,
            "online_resolve": o.online_resolve,
            "calibrate": o.calibrate,
            "calibrate_every": o.calibrate_every,
            "calibrate_min_steps": o.calibrate_min_steps,
        }

    # ---- the engine --------------------------------------------------------------------------

    def new_engine(self, problem: Problem, schedule: Schedule, measure: bool) -> PipelineEngine:
        if self.engine is not None:
            self.engine.finish_loss_handout()  # the old engine's last hand-out
        engine = PipelineEngine(
            list(self.spec.layers),
            None,
            problem,
            schedule,
            self.partition,
            self.comm.pp_rank,
            self.comm.pp_group,
            self.device,
            offload_min_bytes=self.options.offload_min_bytes,
            measure=measure,
        )
        engine.async_loss = True  # ``close`` (and a new engine) waits for the last hand-out
        return engine

    def build(self, num_microbatches: int, microbatch_size: int, world_size: int) -> None:
        """The training engine, on the first step: stored profile, or the profiling phase."""
        self.num_microbatches = num_microbatches
        o = self.options
        base = self.shape_problem()
        # on GPU a step that times its ops synchronises after each one: keep its wall time out
        self.calibrator.sampler.walls_of_timed_steps = self.device.type != "cuda"
        self._hardware = hardware_fingerprint(self.device, world_size, self.backend)
        self._model_fp = model_fingerprint(
            self.model_name,
            self.spec.layers,
            microbatch_size,
            self.comm.num_stages,
            self.num_chunks,
            self.partition,
        )
        if self.comm.is_global_zero:
            self.run_log = RunLog(o.database, o.use_database, o.require_database)
        stored_json = self._stored_profile()
        if self.run_log is not None and self.run_log.active:
            # before the first switch (a stored profile switches right below), so the run
            # records it
            self.run_log.start_run(self._hardware, self._model_fp, self.config())
        if stored_json is not None or o.profile_steps == 0:
            # no profiling: schedule from the stored profile (or unit costs)
            self.engine = self.new_engine(base, profiling_schedule(base), measure=False)
            if stored_json is not None:
                self.adopt_stored(stored_json)
            else:
                self.adopt(base, "no profiling (unit costs)")
        else:
            self.engine = self.new_engine(base, profiling_schedule(base), measure=True)
            self.phase = "profiling"
            self._may_repartition = o.partition is None and o.repartition
            if self._may_repartition:
                self.engine.instrument_layers(True)

    def adopt_stored(self, profile_json: str) -> None:
        """Run the schedule chosen on a stored profile. Its op costs hold the runtime overhead
        per action fitted when it was measured (``Profile.runtime_overhead``): calibration takes
        that out again before it re-fits the overhead on this run's steps."""
        self.profile = Profile.model_validate_json(profile_json)
        self.calibrator.overhead_in_problem = self.profile.runtime_overhead
        self.adopt(self.problem_from_profile(self.profile), "stored profile")

    def _stored_profile(self) -> str | None:
        """Rank 0's stored profile of this model on this hardware (JSON), on every rank."""
        stored = None
        if self.run_log is not None and self.run_log.active:
            stored = self.run_log.find_profile(self._hardware, self._model_fp)
        return self.comm.broadcast(None if stored is None else stored.model_dump_json())

    def eval_microbatches(self, batch_size: int) -> int:
        """The microbatch count of a forward-only batch (training's or the one asked for when it
        divides the batch, else chosen as ``"auto"`` would; a batch smaller than the pipeline
        runs as that many microbatches)."""
        requested = self.options.num_microbatches
        m = requested if isinstance(requested, int) else self.num_microbatches
        return eval_microbatches(batch_size, self.comm.num_stages, m)

    def has_forward_pipeline(self, num_microbatches: int, shape: Any) -> bool:
        return (num_microbatches, shape) in self.forward_pipelines

    def forward_pipeline(self, num_microbatches: int, shape: Any) -> ForwardPipeline:
        """The forward-only pipeline for this microbatch count and input shape (cached)."""
        key = (num_microbatches, shape)
        if self.engine is not None:
            self.engine.finish_loss_handout()  # training's last hand-out, before other traffic
        pipe = self.forward_pipelines.get(key)
        if pipe is None:
            pipe = ForwardPipeline(
                list(self.spec.layers),
                self.shape_problem(num_microbatches),
                self.partition,
                self.comm.pp_rank,
                self.comm.pp_group,
                self.device,
            )
            self.forward_pipelines[key] = pipe
            while len(self.forward_pipelines) > MAX_FORWARD_PIPELINES:
                self.forward_pipelines.popitem(last=False)
        self.forward_pipelines.move_to_end(key)
        return pipe

    # ---- a step ------------------------------------------------------------------------------

    def run_step(
        self,
        arg_mbs: Sequence[tuple[Any, ...]] | None,
        targets: Sequence[Any],
        grad_scale: float,
        loss_fn: Callable[[Any, Any], Any],
    ) -> dict[int, Tensor]:
        """One pipelined step, timed (profiling steps, calibration samples, the run log)."""
        assert self.engine is not None
        cursor = self.engine.cursor
        sampler = self.calibrator.sampler
        # a background solve moves op times (its CPU use): its steps do not feed calibration
        sampling = self.phase == "run" and self.options.calibrate and not self.resolve.active
        if sampling:
            cursor.measure = sampler.time_ops_next()
        t0 = time.perf_counter()
        if self._boundary is None:
            self._boundary = t0
        losses = self.engine.run(arg_mbs, targets, grad_scale, loss_fn)
        elapsed = time.perf_counter() - t0
        self._step_seconds += elapsed
        self._step_count += 1
        if self.phase == "profiling":
            self._profile_walls.append(elapsed)
            if len(self._profile_walls) == 1:
                cursor.drop_times()  # the warm-up step's op times; its byte counts stay
            cursor.count_bytes = False  # bytes: warm-up step only
        elif sampling:
            sampler.record(elapsed, cursor.measure, cursor.times)
            cursor.drop_times()
            cursor.measure = False
        return losses

    def note_batch(self, loss: float | Tensor | None, samples: int, tokens: int | None) -> None:
        """A training batch of this optimizer step, for the run log (``BatchMetrics.add``)."""
        self._batches.add(loss, samples, tokens)

    def note_validation(self, val_loss: float | None) -> None:
        """The loss of a validation run (after the optimizer steps so far), for the run log."""
        if val_loss is not None and self.run_log is not None and self.run_log.active:
            self.run_log.record_metrics(self.optimizer_steps, {"val_loss": val_loss})

    def metrics(self) -> dict[str, float]:
        """What a training step logs about the schedule: the switches so far, the running
        schedule's predicted step time (on measured costs) and the schedule itself."""
        out = {"optpipe/schedule_switches": float(len(self.switches))}
        if self.predicted is not None:
            out["optpipe/predicted_step_s"] = float(self.predicted)
        if self.engine is not None:
            out[f"optpipe/schedule/{self.engine.schedule.generator}"] = 1.0
        return out

    # ---- the optimizer-step boundary ---------------------------------------------------------

    def at_boundary(self, module: nn.Module, optimizers: Sequence[Optimizer]) -> None:
        """Every rank, same optimizer step: record, end profiling, calibrate, switch."""
        self.optimizer_steps += 1
        now = time.perf_counter()
        wall = now - (self._boundary if self._boundary is not None else now)
        self._boundary = now
        seconds, self._step_seconds = self._step_seconds, 0.0
        count, self._step_count = max(self._step_count, 1), 0
        self._count = count
        self._outside.append(max(0.0, wall - seconds))
        if self.engine is not None and self.phase == "run":
            self._walls.append(wall)
            # keyed by the switch that started the schedule: two solver schedules differ
            self.resolve.note_step(f"{len(self.switches)}:{self.engine.schedule.generator}", wall)
        self._record_step(wall)
        try:
            self._at_boundary(module, optimizers, count)
        finally:
            self._predict_next(count)

    def _at_boundary(self, module: nn.Module, optimizers: Sequence[Optimizer], count: int) -> None:
        if self.phase == "run" and self.options.calibrate and self.calibrator.sampler.due():
            self.calibrate(module, count)
        if self.phase == "profiling":
            self._profiled_steps += 1
            if self._profiled_steps >= self.options.profile_steps + 1:  # first: a warm-up
                self.finish_profiling(module, optimizers)
            return
        decision = self.resolve.poll()
        if decision.kind == "switch":
            assert self.engine is not None
            sched = Schedule.from_json(decision.schedule_json)
            self.switch(sched, self.engine.problem, decision.reason)
        if self._solve_pending and self.phase == "run":
            self._solve_pending = False
            assert self.engine is not None
            self.resolve.start(
                self.engine.problem, self.engine.schedule, self.context(module, count)
            )

    def _record_step(self, wall: float) -> None:
        """The step in the run log (global rank 0): its wall seconds against the prediction made
        before it (``predicted_step``)."""
        cuda = self.device.type == "cuda"
        metrics = self._batches.take()
        if self.run_log is not None and self.run_log.active and self.engine is not None:
            # GPU: every rank's peaks come later (``_gather_peaks``); CPU: none
            self.run_log.record_step(
                self.optimizer_steps, wall, self.predicted_step, None if cuda else []
            )
            self.run_log.record_metrics(self.optimizer_steps, metrics)
        if cuda:  # pragma: no cover - GPU only
            peak = torch.cuda.max_memory_allocated(self.device)
            watch = self.engine.cursor.memory if self.engine is not None else None
            if watch is not None:  # profiling resets the allocator's peak at every action
                peak = max(peak, watch.take_peak())
            self._peaks[self.optimizer_steps] = float(peak)
            torch.cuda.reset_peak_memory_stats(self.device)
            if self.optimizer_steps % PEAKS_EVERY == 0:
                self._gather_peaks()

    def _predict_next(self, count: int) -> None:
        """The next optimizer step's prediction: predictions only for schedules chosen on
        measured costs (not while profiling); one pipeline step per accumulated batch (the
        optimizer step takes ``count`` of them) plus the recent time outside the pipeline."""
        if self.phase == "run" and self.predicted:
            outside = statistics.median(self._outside) if self._outside else 0.0
            self.predicted_step = self.predicted * count + outside
        else:
            self.predicted_step = None

    def _gather_peaks(self) -> None:  # pragma: no cover - GPU only
        """Every rank's peak memory of the steps since the last gather, to the run log."""
        mine, self._peaks = self._peaks, {}
        parts = self.comm.gather(mine)
        if self.run_log is not None and self.run_log.active:
            steps = sorted(set().union(*(p.keys() for p in parts)))
            self.run_log.fill_peaks({k: [float(p.get(k, 0.0)) for p in parts] for k in steps})

    def context(self, module: Any, count: int = 1) -> RunContext:
        """What a solve plan needs: the step now, the steps left (global rank 0's view)."""
        if self._total_steps is None:
            total = math.inf
            trainer = getattr(module, "_trainer", None)
            try:
                if trainer is not None:
                    total = float(trainer.estimated_stepping_batches)
            except Exception:  # unknown length: count on many steps
                total = math.inf
            self._total_steps = total if total > 0 else math.inf
        if len(self._walls) >= 3:  # measured (the first after a switch carries the switch)
            step = statistics.median(self._walls)
        else:
            outside = statistics.median(self._outside) if self._outside else 0.0
            step = (self.predicted or 0.0) * count + outside
        local = os.environ.get("LOCAL_WORLD_SIZE")
        world = self.comm.num_stages * self.comm.data_parallel
        return RunContext(
            step_seconds=step,
            remaining_steps=max(0.0, self._total_steps - self.optimizer_steps),
            pipeline_steps=count,
            training_processes=int(local) if local and local.isdigit() else world,
            threads_per_process=torch.get_num_threads() if self.device.type == "cpu" else 1,
        )

    def adopt(self, problem: Problem, reason: str) -> None:
        """Choose the schedule on global rank 0, broadcast it, switch every rank to it."""
        o = self.options
        payload: tuple[str, str]
        if self.comm.is_global_zero:
            try:
                if o.schedule_source is not None:
                    sched = o.schedule_source(problem)
                elif o.schedule == "optimal" and o.online_resolve:
                    # with online re-solve the best baseline starts now, the solver catches up
                    sched = best_baseline(problem)
                else:
                    sched = choose_schedule(
                        o.schedule,
                        problem,
                        o.solver_backend,
                        o.solver_time_limit,
                        chunkings=runnable_chunkings(problem),
                    )
                if sched.problem is None or _chunking(sched.problem) == _chunking(problem):
                    sched = sched.model_copy(update={"problem": problem})
                # else: a schedule for another chunking of this pipeline, on its own problem
                payload = ("ok", sched.to_json())
            except (NoScheduleError, ScheduleRejectedError, ValueError) as e:
                payload = ("error", str(e))
        else:
            payload = ("", "")
        payload = self.comm.broadcast(payload)
        if payload[0] == "error":
            raise NoScheduleError(payload[1])
        sched = Schedule.from_json(payload[1])
        # rank 0's problem for everyone (memory limits may differ a little between replicas)
        problem = sched.problem or problem
        if _chunking(problem) != (self.num_chunks, self.placement):
            self.rechunk(problem)
        self.switch(sched, problem, reason)
        self.phase = "run"
        # planned at the next boundary, when the steps left and a step's time are known
        self._solve_pending = (
            o.online_resolve and o.schedule_source is None and o.schedule == "optimal"
        )

    def switch(self, schedule: Schedule, problem: Problem, reason: str) -> None:
        assert self.engine is not None
        old = self.engine.schedule.generator
        before = self._predicted_before(problem)
        self.engine.switch(schedule, problem)
        self.engine.cursor.set_measure(False)
        self.calibrator.sampler.reset()  # calibration data belongs to the schedule that made it
        self._walls.clear()
        pred = simulate(problem, schedule.actions).makespan
        # a prediction in seconds needs measured costs (unit costs predict nothing)
        self.predicted = None if problem.name == "unprofiled" else pred
        self.switches.append(
            {
                "step": self.optimizer_steps,
                "from": old,
                "to": schedule.generator,
                "reason": reason,
                "predicted_seconds": self.predicted,
            }
        )
        when = f"predicted {1e3 * self.predicted:.4g} ms per step" if self.predicted else ""
        self.notify(
            f"optpipe: step {self.optimizer_steps}: schedule {old} -> {schedule.generator} "
            f"({reason}){', ' + when if when else ''}",
            False,
        )
        if self.run_log is not None and self.run_log.active:
            after = None if self.predicted is None else self.predicted * self._count
            self.run_log.record_switch(
                self.optimizer_steps, schedule, problem, reason, before, after
            )

    def _predicted_before(self, problem: Problem) -> float | None:
        """The running schedule's predicted optimizer step (pipeline part) on the costs of this
        moment: its own prediction, or (leaving the profiling schedule) its makespan on the
        profiled problem when it runs that problem's shape; None on unit costs."""
        assert self.engine is not None
        if problem.name == "unprofiled":
            return None
        span = self.predicted
        if span is None and _chunking(problem) == _chunking(self.engine.problem):
            try:
                span = simulate(problem, self.engine.schedule.actions).makespan
            except Exception:  # a prediction is informative: never stop a switch for it
                span = None
        return None if span is None else span * self._count

    def calibrate(self, module: Any = None, count: int = 1) -> None:
        """Re-estimate the costs from the running schedule's steps (see ``Calibrator``); the
        engine, the predicted step time and the background solver use them from now on."""
        assert self.engine is not None
        res = self.calibrator.calibrate(
            self.engine.problem, self.engine.schedule, self.optimizer_steps
        )
        if res is None:
            return
        record = res.record
        old_pred = self.predicted or 0.0
        self.engine.problem = res.problem
        self.predicted = float(record["predicted_seconds"])
        # the first calibration of a schedule, and any that moves the prediction by > 5%, shown
        moved = abs(self.predicted - old_pred) > 0.05 * max(old_pred, 1e-12)
        self.notify(
            f"optpipe: step {self.optimizer_steps}: calibrated {record['schedule']} from "
            f"{record['steps']} steps ({record['timed_steps']} op-timed): measured "
            f"{1e3 * record['measured_seconds']:.4g} ms, predicted "
            f"{1e3 * record['previous_seconds']:.4g} -> {1e3 * record['predicted_seconds']:.4g} "
            f"ms, overhead {1e3 * record['overhead_seconds']:.3g} ms per action",
            not (res.first or moved),
        )
        if self.run_log is not None and self.run_log.active:
            self.run_log.record_calibration(
                self.optimizer_steps,
                float(record["previous_seconds"]) * count,
                float(record["predicted_seconds"]) * count,
                float(record["measured_seconds"]) * count,
                f"calibrated {record['schedule']} from {record['steps']} steps "
                f"({record['timed_steps']} op-timed), overhead "
                f"{1e3 * record['overhead_seconds']:.3g} ms per action",
            )
        self.resolve.on_calibrated(res.problem, self.engine.schedule, self.context(module, count))

    # ---- profiling ---------------------------------------------------------------------------

    def finish_profiling(self, module: nn.Module, optimizers: Sequence[Optimizer]) -> None:
        assert self.engine is not None
        if self._may_repartition and self.repartition(module, optimizers):
            self._profiled_steps = 0
            self._profile_walls = []
            stored_json = self._stored_profile()
            if stored_json is None:
                return  # profile again, on the new partition
            self.adopt_stored(stored_json)
            return
        self.engine.instrument_layers(False)
        profile, overhead = profile_pipeline(
            self.engine, self.comm, self._hardware, self._model_fp, self._profile_walls
        )
        self.calibrator.overhead_in_problem = overhead
        self.notify(f"optpipe: runtime overhead {1e3 * overhead:.3g} ms per action", True)
        if self.run_log is not None and self.run_log.active:
            self.run_log.store_profile(profile)
        self.profile = profile
        self.adopt(self.problem_from_profile(profile), "profiled")

    def repartition(self, module: nn.Module, optimizers: Sequence[Optimizer]) -> bool:
        """Re-balance the layer groups by the profiled per-layer costs (once, when it pays)."""
        assert self.engine is not None
        self._may_repartition = False
        limits = self.memory_limit(self.engine.parameters)
        decision = profiled_partition(
            self.engine,
            self.comm,
            len(self.spec.layers),
            self.comm.num_stages * self.num_chunks,
            self.partition,
            min(limits) if limits else None,
        )
        if decision.partition is None:
            return False
        old = self.partition
        self.engine.finish_loss_handout()
        move_to_partition(module, optimizers, self.engine, self.comm, self.device)
        self.partition = list(decision.partition)
        assert self._model_fp is not None
        self._model_fp = self._model_fp.model_copy(update={"partition": self.partition})
        base = self.shape_problem()
        self.engine.instrument_layers(False)
        self.engine = self.new_engine(base, profiling_schedule(base), measure=True)
        self.forward_pipelines.clear()
        self.switches.append(
            {
                "step": self.optimizer_steps,
                "from": "optpipe-profiling",
                "to": "optpipe-profiling",
                "reason": f"repartitioned {old} -> {self.partition}",
                "predicted_seconds": None,
            }
        )
        self.notify(
            f"optpipe: step {self.optimizer_steps}: layer groups {old} -> {self.partition} "
            f"(profiled per-layer costs: {decision.reason})",
            False,
        )
        return True

    def rechunk(self, problem: Problem) -> None:
        """Run ``problem``'s chunking: each device keeps its layers, split into its chunks
        (``partition.chunked_partition``); parameters and optimizer state move to their new
        ranks as in a re-partition, so the numbers do not change."""
        assert self.engine is not None and self.module is not None
        v, placement = _chunking(problem)
        old = list(self.partition)
        shape = self.engine.problem
        layers = stage_layers(self.partition, shape)
        try:
            new = chunked_partition(layers, v, placement)
        except PartitionError as e:
            raise NoScheduleError(f"the chosen schedule runs {v} chunks per device: {e}") from None
        self.engine.finish_loss_handout()
        move_to_partition(self.module, self.optimizers(), self.engine, self.comm, self.device)
        self.partition, self.num_chunks, self.placement = new, v, placement
        if self._model_fp is not None:
            update = {"num_chunks": v, "partition": new}
            self._model_fp = self._model_fp.model_copy(update=update)
        self.engine.instrument_layers(False)
        base = self.shape_problem()
        self.engine = self.new_engine(base, profiling_schedule(base), measure=False)
        self.forward_pipelines.clear()
        self.notify(
            f"optpipe: step {self.optimizer_steps}: layer groups {old} -> {new} ({v} chunks per "
            f"device, {placement} placement)",
            False,
        )

    # ---- the end -----------------------------------------------------------------------------

    def close(self, status: str) -> None:
        """Stop the background solver; record how the run ended."""
        self.resolve.stop(timeout=CLOSE_WAIT_SECONDS)
        if self.engine is not None:
            self.engine.finish_loss_handout(timeout=CLOSE_WAIT_SECONDS)
        if status == "finished" and self.device.type == "cuda" and self.engine is not None:
            self._gather_peaks()  # pragma: no cover - GPU only (a collective: all ranks are here)
        if self.run_log is not None:
            self.run_log.finish(status)
            self.run_log.close()
            self.run_log = None
