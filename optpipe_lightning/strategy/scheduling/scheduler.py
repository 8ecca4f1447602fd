"""Which schedule runs, from the first training step to the last (one ``Scheduler`` per fit).

The first training step builds the engine once the batch size is known: a stored profile of the
same model on the same hardware gives the problem and the schedule at once; else the first
``profile_steps + 1`` steps run the profiling schedule (the first one a warm-up), and at the
boundary after them the profile is built (``profiler.profile_pipeline``), the layer groups may
be re-balanced by the measured per-layer costs (``repartition.py``, then profiling starts again
on the new partition), and the schedule is chosen on the profiled problem (those changes of
layout, and profiling again, in ``layout_changes.py``). Global rank 0 picks,
every rank switches at the same optimizer-step boundary. After that, each boundary records the
step (``step_records.StepRecords``, ``run_log.py``), calibrates the costs from the running
schedule when due (``calibration.Calibrator``) and switches to a better solver incumbent when one
arrives (``resolve.OnlineResolve``). Validation, test and predict run on ``ForwardPipeline``s of
their own, one per microbatch count and input shape (``forward_pipelines.py``).

Messages (switches, the chosen schedule and its predicted step time, calibrations, profiling)
go to ``notify`` (the strategy passes Lightning's rank-zero messages).

What a step costs outside the pipeline stays small: the loss hand-out does not hold up the rank
that sends it (``PipelineEngine``), the run log buffers its records, calibrations keep to a
budget, the re-solve's poll is a broadcast no rank waits for, and steps that overlap a solve do
not feed calibration. The run log compares like with like: every optimizer step's wall time
against its prediction (``step_times.StepTimes``). The problem the schedules are chosen on, from
the options and the profile, is built in ``pipeline_problem.py``; the schedule the options ask
for is chosen in ``schedule_choice.py``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from ...schedule import Problem, Schedule, simulate
from ...schedule.profile import Profile
from ..planning.options import PipelineOptions
from ..planning.planner import NoScheduleError, profiling_schedule
from ..records.step_records import StepRecords
from ..runtime.contract import PipelineSpec
from ..runtime.engine import ForwardPipeline, PipelineEngine, ScheduleRejectedError
from ..runtime.module_state import batch_stat_layers
from ..runtime.op_memory import limits_less_reserve
from ..runtime.process_groups import PipelineComm
from .calibration import Calibrator, stored_profile_error
from .forward_pipelines import ForwardPipelines
from .layout_changes import finish_profiling, rechunk, reprofile
from .pipeline_problem import (
    chunking,
    memory_limit,
    one_sample_layer,
    profiled_problem,
    run_config,
    shape_problem,
    training_microbatches,
)
from .profiler import (
    hardware_fingerprint,
    model_fingerprint,
)
from .resolve import OnlineResolve, RunContext
from .schedule_choice import chosen_schedule
from .step_times import StepTimes, fit_length

log = logging.getLogger(__name__)

Notify = Callable[[str, bool], None]  # (message, detail): detail messages are debug-level


def _log_notify(text: str, detail: bool = False) -> None:
    log.log(logging.DEBUG if detail else logging.INFO, "%s", text)


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
        # the activations' dtype where it is not the parameters' (mixed precision: the
        # strategy sets it; the fingerprint names it, so a profile of another dtype is not used)
        self.activation_dtype: Callable[[str], str] = str
        self.forward = ForwardPipelines(spec, comm, device)  # validation, test, predict
        self.phase = "new"  # new -> profiling -> run
        self.optimizer_steps = 0
        self.predicted: float | None = None  # the running schedule's makespan (seconds)
        self.switches: list[dict[str, Any]] = []  # every switch: step, generator, reason
        self.profile: Profile | None = None
        self.records = StepRecords(comm, device)  # the run log (global rank 0)
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
        self._check_stored = False  # the next calibration judges the stored profile
        self.sharded = False  # each rank holds only its own layers (layers move between ranks)
        self.times = StepTimes()  # optimizer steps' wall times, the next one's prediction
        self._solve_pending = False  # a solve is to be planned at the next boundary
        self._total_steps: float | None = None  # optimizer steps of the whole fit (inf: unknown)

    @property
    def calibrations(self) -> list[dict[str, Any]]:
        return self.calibrator.records

    @property
    def predicted_step(self) -> float | None:
        """The next optimizer step's predicted seconds (None: no prediction)."""
        return self.times.predicted_step

    # ---- the problem -------------------------------------------------------------------------

    def shape_problem(self, num_microbatches: int | None = None) -> Problem:
        """The pipeline's shape with costs proportional to the layer groups' relative costs."""
        m = num_microbatches or self.num_microbatches
        assert m is not None, "the microbatch count is chosen on the first training batch"
        p = self.comm.num_stages
        return shape_problem(self.spec, p, self.partition, m, self.num_chunks, self.placement)

    def training_microbatches(self, batch_size: int) -> int:
        """The training microbatch count for this batch size (``"auto"``: chosen here)."""
        p = self.comm.num_stages
        # batch statistics over one sample are undefined: two or more per microbatch
        least = 2 if batch_stat_layers(self.spec.layers) else 1
        refused = one_sample_layer(self.spec.layers, self.module)
        return training_microbatches(
            self.options, p, batch_size, self.shape_problem, least, refused
        )

    def memory_limit(self, local_params: list[nn.Parameter]) -> list[float] | None:
        """Activation bytes per stage (``pipeline_problem.memory_limit``)."""
        return memory_limit(self.options, self.comm, self.device, local_params)

    def problem_from_profile(self, profile: Profile) -> Problem:
        assert self.engine is not None
        limit = self.memory_limit(self.engine.parameters)
        if limit is not None and self.options.memory_limit == "auto":
            limit = limits_less_reserve(limit, profile)  # op transients (GPU-measured)
        if limit is not None and (log := self.records.active) is not None:
            log.record_memory_limit(limit)
        return profiled_problem(profile, limit, self.options, self.partition)

    def config(self) -> dict[str, Any]:
        p, m = self.comm.num_stages, self.num_microbatches
        return run_config(self.options, p, m, self.num_chunks, self.partition)

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
            placement=self.placement,
        )
        self._model_fp = self._model_fp.model_copy(
            update={"dtype": self.activation_dtype(self._model_fp.dtype)}
        )
        self.records.open(o)
        stored_json = self._stored_profile()
        if (log := self.records.active) is not None:
            # before the first switch (a stored profile switches right below), so the run
            # records it
            log.start_run(self._hardware, self._model_fp, self.config())
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
        self._check_stored = self.options.profile_steps > 0

    def _stored_profile(self) -> str | None:
        """Rank 0's stored profile of this model on this hardware (JSON), on every rank."""
        stored = None
        if (log := self.records.active) is not None:
            stored = log.find_profile(self._hardware, self._model_fp)
            if stored is not None and stored.placement != self.placement:
                stored = None  # another layout's costs (the fingerprint's key also says so)
        return self.comm.broadcast(None if stored is None else stored.model_dump_json())

    def eval_microbatches(self, batch_size: int) -> int:
        """The microbatch count of a forward-only batch (``ForwardPipelines.microbatches``)."""
        return self.forward.microbatches(self.options, self.num_microbatches, batch_size)

    def has_forward_pipeline(self, num_microbatches: int, shape: Any) -> bool:
        return (num_microbatches, shape) in self.forward

    def forward_pipeline(self, num_microbatches: int, shape: Any) -> ForwardPipeline:
        """The forward-only pipeline for this microbatch count and input shape (cached)."""
        if self.engine is not None:
            self.engine.finish_loss_handout()  # training's last hand-out, before other traffic
        return self.forward.get((num_microbatches, shape), self.shape_problem, self.partition)

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
        self.times.pipeline_step_starts(t0)
        losses = self.engine.run(arg_mbs, targets, grad_scale, loss_fn)
        elapsed = time.perf_counter() - t0
        self.times.pipeline_step_took(elapsed)
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
        self.records.note_batch(loss, samples, tokens)

    def note_validation(self, val_loss: float | None) -> None:
        """The loss of a validation run (after the optimizer steps so far), for the run log."""
        self.records.note_validation(self.optimizer_steps, val_loss)

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
        wall, count = self.times.end_optimizer_step(time.perf_counter())
        if self.engine is not None and self.phase == "run":
            self.times.walls.append(wall)
            # keyed by the switch that started the schedule: two solver schedules differ
            self.resolve.note_step(f"{len(self.switches)}:{self.engine.schedule.generator}", wall)
        # the step in the run log: its wall seconds against the prediction made before it
        self.records.record_step(self.optimizer_steps, wall, self.predicted_step, self.engine)
        try:
            self._at_boundary(module, optimizers, count)
        finally:
            # predictions only for schedules chosen on measured costs (not while profiling)
            self.times.predict_next(self.predicted if self.phase == "run" else None, count)

    def _at_boundary(self, module: nn.Module, optimizers: Sequence[Optimizer], count: int) -> None:
        if self.phase == "run" and self.options.calibrate and self.calibrator.sampler.due():
            self.calibrate(module, count)
        if self.phase == "profiling":
            self._profiled_steps += 1
            if self._profiled_steps >= self.options.profile_steps + 1:  # first: a warm-up
                finish_profiling(self, module, optimizers)
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

    def context(self, module: Any, count: int = 1) -> RunContext:
        """What a solve plan needs: the step now, the steps left (global rank 0's view)."""
        if self._total_steps is None:
            self._total_steps = fit_length(module)
        step = self.times.step_estimate(self.predicted, count)
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
                payload = ("ok", chosen_schedule(o, problem).to_json())
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
        if chunking(problem) != (self.num_chunks, self.placement):
            rechunk(self, problem)
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
        self.times.walls.clear()
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
        if (log := self.records.active) is not None:
            after = None if self.predicted is None else self.predicted * self.times.count
            log.record_switch(self.optimizer_steps, schedule, problem, reason, before, after)

    def _predicted_before(self, problem: Problem) -> float | None:
        """The running schedule's predicted optimizer step (pipeline part) on the costs of this
        moment: its own prediction, or (leaving the profiling schedule) its makespan on the
        profiled problem when it runs that problem's shape; None on unit costs."""
        assert self.engine is not None
        if problem.name == "unprofiled":
            return None
        span = self.predicted
        if span is None and chunking(problem) == chunking(self.engine.problem):
            try:
                span = simulate(problem, self.engine.schedule.actions).makespan
            except Exception:  # a prediction is informative: never stop a switch for it
                span = None
        return None if span is None else span * self.times.count

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
        if self._check_stored and not self.resolve.active:
            # the first calibration on a stored profile: measured far from what it predicts,
            # the profile does not describe this run (another machine, load): profile again
            self._check_stored = False
            off = stored_profile_error(record)
            if off is not None:
                reprofile(self, off, record)
                return
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
        self.records.record_calibration(self.optimizer_steps, record, count)
        self.resolve.on_calibrated(res.problem, self.engine.schedule, self.context(module, count))

    # ---- the end -----------------------------------------------------------------------------

    def close(self, status: str) -> None:
        """Stop the background solver; record how the run ended."""
        self.resolve.stop(timeout=CLOSE_WAIT_SECONDS)
        if self.engine is not None:
            self.engine.finish_loss_handout(timeout=CLOSE_WAIT_SECONDS)
        # the last peaks: a collective, all ranks are here
        gather = status == "finished" and self.device.type == "cuda" and self.engine is not None
        self.records.close(status, gather_peaks=gather)
