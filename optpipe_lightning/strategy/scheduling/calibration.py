"""Calibration from the running schedule: op costs and per-action overhead re-estimated from steps.

The profile prices ops from a few profiling steps. On a shared machine those can run faster or
slower than the steps that follow (load drift, warm-up, another working set), so once a schedule
runs, the strategy re-estimates the costs from what that schedule does:

- **op costs**: every ``sample_every``-th step of the running schedule times its compute actions
  (the cursor's ``measure``; ``perf_counter`` on CPU, CUDA events on GPU). An op kind the
  schedule runs (F; B and W, or the fused BW) takes the interquartile mean of its recent
  samples on that (stage, chunk); a kind it does not run (B and W under a fused schedule, BW
  under a split one) is scaled from the old cost by the ratio its sibling kinds moved by;
- **per-action overhead**: the op times measure the compute inside each action; a step also pays
  for posting and waiting on p2p operations and Python between actions. The overhead is the
  seconds that, added to every compute action, make the simulator's makespan of the running
  schedule equal the median wall time of its recent steps (``fit_overhead``; never negative).

A calibration is a collective with a fit on global rank 0 that every rank waits for, so it is
kept within a budget: after each one, the next waits at least as many steps as make its cost
``CALIBRATION_BUDGET`` of the training time (its measured seconds over the median step).
Steps that overlap a background solve are not sampled (the solver's CPU use would move the
costs; the strategy leaves them out).

The calibrated ``Problem`` (same shape, memory and offload fields; only ``t_f``, ``t_b``, ``t_w``,
``t_bw`` change) is what the background re-solve judges incumbents on and what the predicted step
time of the run log comes from. The functions are pure: numbers in, a ``Problem`` out.
``StepSampler`` collects one rank's timings; ``Calibrator`` is the strategy's side: at a boundary
where a calibration is due it gathers every stage's samples to global rank 0, which fits the
calibrated problem and broadcasts it (with a record of what moved) to every rank.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...schedule import Action, Problem, Schedule, simulate
from ..runtime.process_groups import PipelineComm

log = logging.getLogger(__name__)

COMPUTE_OPS = ("F", "B", "W", "BW")
CALIBRATION_BUDGET = 0.005  # share of the training time calibrations may take
_FIELD = {"F": "t_f", "B": "t_b", "W": "t_w", "BW": "t_bw"}
_MIN_SECONDS = 1e-7

OpKey = tuple[int, int, str]  # (stage, chunk, op)


def robust_mean(xs: Iterable[float]) -> float:
    """The interquartile mean: the mean of the middle half of the samples (all of them when
    there are fewer than 4). Spikes (a preempted op, a page fault) do not move it; unlike the
    median it still averages the typical samples."""
    v = sorted(float(x) for x in xs)
    if not v:
        raise ValueError("robust_mean of no samples")
    n = len(v)
    if n < 4:
        return statistics.fmean(v) if n < 3 else v[1]
    lo = n // 4
    return statistics.fmean(v[lo : n - lo])


def compute_actions_per_stage(actions: Sequence[Sequence[Action]]) -> list[int]:
    return [sum(1 for a in row if a.op in COMPUTE_OPS) for row in actions]


def with_action_overhead(problem: Problem, seconds: float) -> Problem:
    """``problem`` with ``seconds`` added to every compute action (F, B, W, and a fused BW once).

    ``t_bw`` is always written out: left implicit it would be ``t_b + t_w`` and so carry the
    overhead twice, though a fused backward is one action.
    """
    t = {k: np.asarray(problem.cost(f), dtype=float) for k, f in _FIELD.items()}
    return problem.with_changes(
        **{_FIELD[k]: np.maximum(t[k] + seconds, _MIN_SECONDS).tolist() for k in COMPUTE_OPS}
    )


def makespan(problem: Problem, actions: Sequence[Sequence[Action]]) -> float:
    span = simulate(problem, actions).makespan
    if span is None or not math.isfinite(span):
        raise ValueError("the simulator gives no makespan for this schedule")
    return float(span)


def fit_overhead(
    compute: Problem,
    actions: Sequence[Sequence[Action]],
    target_seconds: float,
    iterations: int = 8,
) -> float:
    """Seconds per compute action that make ``actions``' makespan on ``compute`` equal
    ``target_seconds`` (0 when the compute alone already takes that long).

    The makespan grows piecewise linearly with the overhead (by the number of actions on the
    critical path): a few Newton steps with a measured slope land on it.
    """
    base = makespan(compute, actions)
    if target_seconds <= base:
        return 0.0
    busiest = max(max(compute_actions_per_stage(actions)), 1)
    delta = (target_seconds - base) / busiest
    for _ in range(iterations):
        span = makespan(with_action_overhead(compute, delta), actions)
        err = target_seconds - span
        if abs(err) <= 1e-6 * target_seconds:
            break
        h = max(delta * 1e-3, 1e-9)
        slope = (makespan(with_action_overhead(compute, delta + h), actions) - span) / h
        slope = max(slope, 1.0)  # at least the one action that ends the makespan
        delta = max(0.0, delta + err / slope)
    return delta


def compute_costs(
    problem: Problem,
    samples: Mapping[OpKey, Sequence[float]],
    overhead_in_problem: float = 0.0,
) -> Problem:
    """The problem with each (stage, chunk)'s compute costs re-estimated from ``samples``.

    ``problem``'s costs include ``overhead_in_problem`` seconds per action (the profile's
    runtime overhead); the result holds compute only (no overhead). Kinds with samples take
    their interquartile mean; F without samples keeps its old compute cost scaled like the
    backward, and backward kinds without samples are scaled by the ratio observed backward
    kinds moved by (the fused BW for B and W, B + W for BW), else by F's ratio.
    """
    old = {
        k: np.maximum(np.asarray(problem.cost(f), dtype=float) - overhead_in_problem, _MIN_SECONDS)
        for k, f in _FIELD.items()
    }
    new = {k: v.copy() for k, v in old.items()}
    for s in range(problem.num_stages):
        for c in range(problem.num_chunks):
            seen = {
                k: robust_mean(samples[(s, c, k)]) for k in COMPUTE_OPS if samples.get((s, c, k))
            }
            if not seen:
                continue
            back = [k for k in ("B", "W", "BW") if k in seen]
            if back:
                ratio = sum(seen[k] for k in back) / sum(old[k][s, c] for k in back)
            else:
                ratio = seen["F"] / old["F"][s, c]
            f_ratio = seen["F"] / old["F"][s, c] if "F" in seen else ratio
            for k in COMPUTE_OPS:
                if k in seen:
                    new[k][s, c] = max(seen[k], _MIN_SECONDS)
                else:
                    new[k][s, c] = max(old[k][s, c] * (f_ratio if k == "F" else ratio), 1e-7)
    return problem.with_changes(**{_FIELD[k]: new[k].tolist() for k in COMPUTE_OPS})


@dataclass(frozen=True)
class Calibration:
    """One re-estimate of the costs from steps of the running schedule."""

    problem: Problem  # calibrated: compute + overhead per action (what the simulator prices)
    compute: Problem  # compute only
    overhead: float  # seconds per compute action
    measured: float  # median wall seconds of the steps it was fitted to
    predicted: float  # makespan of the running schedule on ``problem``
    previous: float  # makespan of the running schedule on the problem before calibration
    steps: int  # wall samples used
    timed_steps: int  # steps whose ops were timed

    @property
    def drift(self) -> float:
        """How far the old prediction was off: measured / previous - 1."""
        return self.measured / self.previous - 1.0 if self.previous > 0 else 0.0


def calibrate(
    problem: Problem,
    actions: Sequence[Sequence[Action]],
    samples: Mapping[OpKey, Sequence[float]],
    step_seconds: Sequence[float],
    overhead_in_problem: float = 0.0,
    timed_steps: int = 0,
) -> Calibration:
    """Re-estimate ``problem``'s compute costs from op ``samples`` of the running schedule
    ``actions`` and the per-action overhead from its step wall times ``step_seconds``."""
    if not step_seconds:
        raise ValueError("calibration needs at least one step time")
    previous = makespan(problem, actions)
    compute = compute_costs(problem, samples, overhead_in_problem)
    measured = statistics.median(step_seconds)
    overhead = fit_overhead(compute, actions, measured)
    calibrated = with_action_overhead(compute, overhead)
    return Calibration(
        problem=calibrated,
        compute=compute,
        overhead=overhead,
        measured=measured,
        predicted=makespan(calibrated, actions),
        previous=previous,
        steps=len(step_seconds),
        timed_steps=timed_steps,
    )


STORED_PROFILE_TOLERANCE = 0.20  # a stored profile this far off the measured steps: re-profile


def stored_profile_error(
    record: Mapping[str, Any], tolerance: float = STORED_PROFILE_TOLERANCE
) -> float | None:
    """How far the steps a calibration measured are off the prediction it started from
    (``previous_seconds``: the stored profile's), relative to that prediction, when beyond
    ``tolerance``; else None (also when either is unknown)."""
    measured, predicted = record.get("measured_seconds"), record.get("previous_seconds")
    if not measured or not predicted or measured <= 0 or predicted <= 0:
        return None
    off = (float(measured) - float(predicted)) / float(predicted)
    return off if abs(off) > tolerance else None


def max_cost_change(a: Problem, b: Problem) -> float:
    """The largest relative change of any compute cost between two problems of one shape."""
    worst = 0.0
    for f in _FIELD.values():
        x, y = np.asarray(a.cost(f)), np.asarray(b.cost(f))
        worst = max(worst, float(np.max(np.abs(y - x) / np.maximum(np.abs(x), _MIN_SECONDS))))
    return worst


@dataclass
class StepSampler:
    """This rank's timings of the running schedule, in rolling windows.

    After a switch the first ``warmup`` steps are ignored; then every ``sample_every``-th step
    times its ops (``time_ops_next``), every step's wall time is kept (on GPU only the steps
    whose ops were not timed: the per-op event synchronisation slows a step a little). A
    calibration is ``due`` after an op-timed step once ``min_steps`` steps have been seen and
    at least ``min_interval`` steps were recorded since the last one (the budget, set by the
    ``Calibrator``). Every decision depends on step counts only (and on ``min_interval``,
    which global rank 0 sends every rank), so it is the same on every rank.
    """

    sample_every: int = 4
    min_steps: int = 8
    warmup: int = 1
    window: int = 32
    timed_window: int = 8
    walls_of_timed_steps: bool = True
    steps: int = 0  # steps since the last reset (warm-up included)
    timed: int = 0  # op-timed steps since the last reset
    calibrations: int = 0  # times ``due`` said yes since the last reset
    min_interval: int = 0  # steps recorded between two calibrations, at least (the budget)
    since: int = 0  # steps recorded since the last calibration
    walls: deque[float] = field(default_factory=deque)
    ops: dict[tuple[str, int], deque[list[float]]] = field(default_factory=dict)
    _due: bool = False

    def __post_init__(self) -> None:
        if self.sample_every < 1:
            raise ValueError("sample_every must be >= 1")
        self.walls = deque(maxlen=self.window)

    def reset(self) -> None:
        """A new schedule runs: forget the old one's timings."""
        self.steps = self.timed = self.calibrations = self.since = 0
        self.walls.clear()
        self.ops.clear()
        self._due = False

    def time_ops_next(self) -> bool:
        """Whether the coming step times its ops."""
        k = self.steps - self.warmup
        return k >= 0 and k % self.sample_every == 0

    def record(
        self, seconds: float, timed: bool, op_times: Mapping[tuple[str, int], Sequence[float]]
    ) -> None:
        """One finished step: its wall seconds and, when ``timed``, its (op, chunk) seconds."""
        k = self.steps
        self.steps += 1
        if k < self.warmup:
            return
        self.since += 1
        if not timed or self.walls_of_timed_steps:
            self.walls.append(float(seconds))
        if timed:
            self.timed += 1
            for key, xs in op_times.items():
                if key[0] in COMPUTE_OPS and xs:
                    q = self.ops.setdefault(key, deque(maxlen=self.timed_window))
                    q.append([float(x) for x in xs])
            if self.steps - self.warmup >= self.min_steps:
                self._due = True

    def due(self) -> bool:
        """A calibration should run at this boundary (clears the flag: an op-timed step sets it
        again)."""
        due = self._due and bool(self.walls) and self.since >= self.min_interval
        self._due = False
        if due:
            self.calibrations += 1
            self.since = 0
        return due

    def op_samples(self, stage: int) -> dict[OpKey, list[float]]:
        """This rank's samples keyed (stage, chunk, op), for gathering to global rank 0."""
        return {(stage, c, op): [x for step in q for x in step] for (op, c), q in self.ops.items()}


MAX_CALIBRATION_RECORDS = 256  # Calibrator.records keeps the latest ones


def budget_interval(
    cost_seconds: float, step_seconds: float, budget: float = CALIBRATION_BUDGET
) -> int:
    """Steps between two calibrations that keep one costing ``cost_seconds`` within ``budget``
    of the training time at ``step_seconds`` per step."""
    if step_seconds <= 0 or not math.isfinite(cost_seconds):
        return 0
    return max(0, math.ceil(cost_seconds / (budget * step_seconds)))


@dataclass(frozen=True)
class CalibrationResult:
    """What every rank learns from one calibration."""

    problem: Problem  # the running schedule's problem with calibrated costs
    record: dict[str, Any]  # step, schedule, seconds measured / predicted before and after, costs
    first: bool  # the first calibration of this schedule


class Calibrator:
    """The running schedule's sampler, and the calibrations made from it (every rank holds one)."""

    def __init__(
        self,
        comm: PipelineComm,
        every: int = 4,
        min_steps: int = 8,
        budget: float | None = CALIBRATION_BUDGET,
    ) -> None:
        self.comm = comm
        self.budget = budget
        self.sampler = StepSampler(every, min_steps)
        self.overhead_in_problem = 0.0  # per-action overhead inside the running problem's costs
        self.records: list[dict[str, Any]] = []  # every calibration (the latest ones)

    def calibrate(
        self, problem: Problem, schedule: Schedule, step: int
    ) -> CalibrationResult | None:
        """Fit the running schedule's costs to its recent steps (a collective: every rank).

        Every rank's op samples go to global rank 0, which fits the calibrated problem
        (``calibrate``) and broadcasts it. ``None`` when rank 0 could not fit one (never raised:
        calibration must not stop training).
        """
        t0 = time.perf_counter()
        parts = self.comm.gather(self.sampler.op_samples(self.comm.pp_rank))
        payload: tuple[str, dict[str, Any]] | None = None
        if self.comm.is_global_zero:
            samples: dict[OpKey, list[float]] = {}
            for part in parts:
                samples.update(part)
            try:
                cal = calibrate(
                    problem,
                    schedule.actions,
                    samples,
                    list(self.sampler.walls),
                    self.overhead_in_problem,
                    self.sampler.timed,
                )
                record = _record(cal)
                cost = time.perf_counter() - t0
                record["calibration_seconds"] = cost
                record["next_after_steps"] = (
                    budget_interval(cost, cal.measured, self.budget) if self.budget else 0
                )
                payload = (cal.problem.model_dump_json(), record)
            except Exception as e:  # calibration must never stop training
                log.warning("optpipe: calibration skipped (%s)", e)
        payload = self.comm.broadcast(payload)
        if payload is None:
            return None
        record = {"step": step, "schedule": schedule.generator}
        record.update(payload[1])
        self.sampler.min_interval = int(record["next_after_steps"])
        self.records.append(record)
        del self.records[:-MAX_CALIBRATION_RECORDS]
        self.overhead_in_problem = float(record["overhead_seconds"])
        return CalibrationResult(
            Problem.model_validate_json(payload[0]), record, self.sampler.calibrations <= 1
        )


def _record(cal: Calibration) -> dict[str, Any]:
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
