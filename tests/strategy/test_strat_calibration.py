"""Calibration from the running schedule: synthetic timings in, re-estimated costs out."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.strategy.scheduling.calibration import (
    StepSampler,
    calibrate,
    compute_costs,
    fit_overhead,
    max_cost_change,
    robust_mean,
    with_action_overhead,
)
from optpipe_lightning.strategy.scheduling.profiler import _stats

P, M = 2, 8
# "true" compute costs of a 2-stage pipeline (stage 0 has almost no input gradient)
TRUE_F = [0.0065, 0.0070]
TRUE_B = [0.0002, 0.0072]
TRUE_W = [0.0110, 0.0105]
TRUE_BW = [0.0105, 0.0160]  # a fused backward is cheaper than B + W
TRUE_OVERHEAD = 0.0004


def _problem(f: list[float], b: list[float], w: list[float], bw: list[float]) -> Problem:
    return Problem(
        num_stages=P,
        num_microbatches=M,
        t_f=f,
        t_b=b,
        t_w=w,
        t_bw=bw,
        t_comm=0.0002,
        m_f=1.0,
        m_b=-0.5,
        m_w=-0.5,
    )


TRUE = _problem(TRUE_F, TRUE_B, TRUE_W, TRUE_BW)


def _samples(
    actions: Any, rng: random.Random, steps: int = 3, spike: float = 0.0
) -> dict[tuple[int, int, str], list[float]]:
    """What the cursor would time over ``steps`` steps: true compute x (1 +- 2%), one spike."""
    out: dict[tuple[int, int, str], list[float]] = {}
    field = {"F": "t_f", "B": "t_b", "W": "t_w", "BW": "t_bw"}
    for s, row in enumerate(actions):
        for a in row:
            if a.op in field:
                t = float(TRUE.cost(field[a.op])[s, a.chunk])
                for _ in range(steps):
                    out.setdefault((s, a.chunk, a.op), []).append(t * rng.uniform(0.98, 1.02))
    if spike:
        for xs in out.values():
            xs[0] *= spike  # a preempted op: must not move the estimate
    return out


def test_robust_mean_ignores_spikes_but_averages_the_middle() -> None:
    assert robust_mean([1.0] * 7 + [50.0]) == pytest.approx(1.0)
    assert robust_mean([1.0, 2.0, 3.0, 4.0]) == pytest.approx(2.5)
    assert robust_mean([1.0, 2.0, 30.0]) == 2.0  # three samples: the median
    assert robust_mean([1.0, 3.0]) == 2.0
    with pytest.raises(ValueError):
        robust_mean([])
    # the profiler's per-op cost uses it: a spiky sample does not inflate the profile
    st = _stats([0.0065] * 9 + [0.030])
    assert st.mean == pytest.approx(0.0065) and st.max == pytest.approx(0.030)
    assert st.samples == 10


def test_fit_overhead_recovers_a_known_overhead_on_every_schedule() -> None:
    for name in ("gpipe", "1f1b", "zb-h1", "zb-h2"):
        actions = generate(name, TRUE).actions
        target = simulate(with_action_overhead(TRUE, TRUE_OVERHEAD), actions).makespan
        assert target is not None
        got = fit_overhead(TRUE, actions, float(target))
        assert got == pytest.approx(TRUE_OVERHEAD, rel=1e-3), name
    base = simulate(TRUE, generate("1f1b", TRUE).actions).makespan
    assert base is not None
    assert fit_overhead(TRUE, generate("1f1b", TRUE).actions, 0.9 * base) == 0.0


def test_action_overhead_counts_a_fused_backward_once() -> None:
    pb = _problem(TRUE_F, TRUE_B, TRUE_W, TRUE_BW).with_changes(t_bw=None)
    out = with_action_overhead(pb, 0.001)
    np.testing.assert_allclose(out.cost("t_f")[:, 0], np.array(TRUE_F) + 0.001)
    np.testing.assert_allclose(out.cost("t_bw")[:, 0], np.array(TRUE_B) + np.array(TRUE_W) + 0.001)


def test_fused_schedule_samples_rescale_the_unseen_split_backward() -> None:
    # the problem's costs hold 0.1 s of overhead per action; compute is F=1, B=W=1, BW=1.6
    old = _problem([1.1, 1.1], [1.1, 1.1], [1.1, 1.1], [1.7, 1.7])
    samples = {(0, 0, "F"): [2.0, 2.0, 2.0], (0, 0, "BW"): [3.1, 3.2, 3.2, 3.3, 9.0]}
    out = compute_costs(old, samples, overhead_in_problem=0.1)
    # stage 0: F and BW measured (the 9.0 spike left out), B and W scaled by BW's ratio
    assert out.cost("t_f")[0, 0] == pytest.approx(2.0)
    assert out.cost("t_bw")[0, 0] == pytest.approx(3.2333, rel=1e-4)  # mean of the middle 3
    assert out.cost("t_b")[0, 0] == pytest.approx(3.2333 / 1.6, rel=1e-4)
    assert out.cost("t_w")[0, 0] == pytest.approx(3.2333 / 1.6, rel=1e-4)
    # stage 1 had no samples: its compute costs stay (overhead taken out)
    assert out.cost("t_f")[1, 0] == pytest.approx(1.0)
    assert out.cost("t_bw")[1, 0] == pytest.approx(1.6)
    # split samples: BW scaled by (B + W)'s ratio, F by its own
    split = {(1, 0, "F"): [0.5], (1, 0, "B"): [1.5], (1, 0, "W"): [1.5]}
    out = compute_costs(old, split, overhead_in_problem=0.1)
    assert out.cost("t_f")[1, 0] == pytest.approx(0.5)
    assert out.cost("t_bw")[1, 0] == pytest.approx(1.6 * 1.5)


@pytest.mark.parametrize("running", ["1f1b", "zb-h1"])
def test_calibration_from_a_running_schedule_recovers_costs_and_overhead(running: str) -> None:
    rng = random.Random(3)
    truth = with_action_overhead(TRUE, TRUE_OVERHEAD)
    # the profile was taken on a noisy machine: every op 40% slow, with 1 ms of overhead baked in
    slow = [1.4 * x for x in TRUE_F], [1.4 * x for x in TRUE_B], [1.4 * x for x in TRUE_W]
    profiled = with_action_overhead(_problem(*slow, [1.4 * x for x in TRUE_BW]), 0.001)
    actions = generate(running, profiled).actions
    real = float(simulate(truth, actions).makespan or 0.0)
    walls = [real * rng.uniform(0.99, 1.01) for _ in range(9)] + [3 * real]  # one slow step
    samples = _samples(actions, rng, spike=5.0)
    cal = calibrate(profiled, actions, samples, walls, overhead_in_problem=0.001, timed_steps=3)
    assert cal.previous > 1.25 * real  # the profile's prediction was far off
    assert cal.measured == pytest.approx(real, rel=0.02)
    assert cal.predicted == pytest.approx(real, rel=0.02)
    assert cal.overhead == pytest.approx(TRUE_OVERHEAD, rel=0.25)
    for field in ("t_f", "t_b", "t_w", "t_bw"):  # seen kinds measured, unseen ones rescaled
        np.testing.assert_allclose(cal.compute.cost(field), TRUE.cost(field), rtol=0.03)
    assert cal.drift == pytest.approx(cal.measured / cal.previous - 1)
    # the calibrated problem also predicts the other schedules (what the re-solve compares)
    for other in ("gpipe", "1f1b", "zb-h1", "zb-h2"):
        acts = generate(other, profiled).actions
        want = float(simulate(truth, acts).makespan or 0.0)
        assert float(simulate(cal.problem, acts).makespan or 0.0) == pytest.approx(want, rel=0.03)
    # memory, shape and p2p are untouched
    assert cal.problem.memory_limits() == profiled.memory_limits()
    assert cal.problem.t_comm == profiled.t_comm and cal.problem.m_f == profiled.m_f
    assert max_cost_change(profiled, cal.problem) > 0.2
    assert max_cost_change(cal.problem, cal.problem) == 0.0


def test_calibration_needs_a_step_time() -> None:
    with pytest.raises(ValueError, match="step time"):
        calibrate(TRUE, generate("1f1b", TRUE).actions, {}, [])


def test_step_sampler_times_every_nth_step_after_warm_up() -> None:
    sp = StepSampler(sample_every=2, min_steps=4, warmup=1)
    timed, due = [], []
    for i in range(9):
        t = sp.time_ops_next()
        timed.append(t)
        sp.record(1.0 + i, t, {("F", 0): [0.1, 0.2], ("BW", 0): [0.3]} if t else {})
        due.append(sp.due())
    assert timed == [False, True, False, True, False, True, False, True, False]
    # due after an op-timed step once 4 steps ran after the warm-up
    assert due == [False, False, False, False, False, True, False, True, False]
    assert list(sp.walls) == [2.0 + i for i in range(8)]  # warm-up step left out
    assert sp.timed == 4 and sp.calibrations == 2
    assert sp.op_samples(1) == {(1, 0, "F"): [0.1, 0.2] * 4, (1, 0, "BW"): [0.3] * 4}
    sp.reset()
    assert (
        sp.steps == 0
        and sp.calibrations == 0
        and not sp.walls
        and not sp.ops
        and not sp.time_ops_next()
    )


def test_step_sampler_on_gpu_keeps_timed_steps_out_of_the_walls() -> None:
    sp = StepSampler(sample_every=2, min_steps=2, warmup=0, walls_of_timed_steps=False)
    for i in range(4):
        t = sp.time_ops_next()
        sp.record(float(i), t, {("F", 0): [0.1]} if t else {})
    assert list(sp.walls) == [1.0, 3.0]
    with pytest.raises(ValueError):
        StepSampler(sample_every=0)


def test_background_solver_judges_incumbents_on_the_calibrated_problem() -> None:
    from optpipe_lightning.strategy.scheduling.resolve import BackgroundSolver

    solver = BackgroundSolver.__new__(BackgroundSolver)  # no process: only the bookkeeping
    solver.problem, solver.best = TRUE, 1.0
    actions = generate("1f1b", TRUE).actions
    slower = with_action_overhead(TRUE, 0.002)
    solver.update_problem(slower, actions)
    assert solver.problem is slower
    assert solver.best == pytest.approx(float(simulate(slower, actions).makespan or 0.0))


class _FakeSolver:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def update_problem(self, problem: Problem, actions: Any) -> None:
        self.problems.append(problem)

    def stop(self) -> None:
        pass


def test_scheduler_calibrates_its_problem_prediction_and_solver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wiring without processes: sampler -> Calibrator -> engine, run log prediction,
    background solver, and a new solve once the solver is done."""
    import torch
    from torch import nn

    from optpipe_lightning.strategy.planning.options import OptPipeConfigError, PipelineOptions
    from optpipe_lightning.strategy.runtime.contract import PipelineSpec
    from optpipe_lightning.strategy.runtime.process_groups import PipelineComm
    from optpipe_lightning.strategy.scheduling.scheduler import Scheduler

    with pytest.raises(OptPipeConfigError, match="calibrate_every"):
        PipelineOptions(calibrate_every=0)
    options = PipelineOptions(num_stages=P, num_microbatches=M, calibrate_every=1)
    spec = PipelineSpec(layers=[nn.Linear(2, 2), nn.Linear(2, 2)], loss_fn=lambda o, y: o.sum())
    sch = Scheduler(options, spec, PipelineComm(P), torch.device("cpu"), [1, 1], M)
    profiled = with_action_overhead(_problem(*(3 * [[0.02, 0.02]]), [0.03, 0.03]), 0.001)
    sched = generate("1f1b", profiled)
    engine = SimpleNamespace(problem=profiled, schedule=sched)
    sch.engine = engine  # type: ignore[assignment]
    sch.calibrator.overhead_in_problem = 0.001
    sch.predicted = float(simulate(profiled, sched.actions).makespan or 0.0)
    solver = _FakeSolver()
    sch.resolve.solver = solver  # type: ignore[assignment]
    sch.resolve.solved_problem = profiled
    restarts: list[Problem] = []
    monkeypatch.setattr(sch.resolve, "start", lambda pb, cur, ctx, why="": restarts.append(pb))
    real = float(simulate(with_action_overhead(TRUE, TRUE_OVERHEAD), sched.actions).makespan or 0)
    rng = random.Random(5)
    # one process plays both ranks: its sampler's samples are every stage's (gather is [mine])
    every_stage: dict[tuple[int, int, str], list[float]] = {}
    sampler = sch.calibrator.sampler
    monkeypatch.setattr(sampler, "op_samples", lambda stage: every_stage)
    steps = 0
    while not sampler.due():
        timed = sampler.time_ops_next()
        sampler.record(real, timed, {})
        if timed:
            for k, xs in _samples(sched.actions, rng, steps=1).items():
                every_stage.setdefault(k, []).extend(xs)
        steps += 1
    assert steps == 9  # one warm-up step, then calibrate_min_steps = 8
    sampler._due = True
    sch.resolve.active = True  # the solver still runs: it gets the new problem, no restart
    sch.calibrate()
    assert len(sch.calibrations) == 1
    rec = sch.calibrations[0]
    assert rec["predicted_seconds"] == pytest.approx(real, rel=0.02)
    assert rec["previous_seconds"] > 1.5 * real
    assert sch.predicted == pytest.approx(rec["predicted_seconds"])
    assert engine.problem is not profiled
    assert engine.problem.cost("t_f")[0, 0] == pytest.approx(
        TRUE_F[0] + rec["overhead_seconds"], rel=0.03
    )
    assert solver.problems == [engine.problem] and not restarts
    # the solver finished: costs moved > 10% from what it solved -> a new solve, on the new costs
    sch.resolve.active = False
    sch.calibrate()
    assert len(restarts) == 1 and restarts[0] == engine.problem


def test_host_allocator_is_tuned_unless_the_user_chose() -> None:
    from optpipe_lightning.strategy.runtime.host_allocator import why_not_tune

    assert why_not_tune({}, "linux") is None
    assert why_not_tune({"MALLOC_TRIM_THRESHOLD_": "0"}, "linux") == "MALLOC_TRIM_THRESHOLD_ is set"
    assert why_not_tune({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "linux") == (
        "jemalloc is preloaded"
    )
    assert why_not_tune({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "linux")
    assert why_not_tune({}, "darwin") == "not on Linux (darwin)"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_host_allocator_mallopt_takes_effect_in_a_fresh_process() -> None:
    from optpipe_lightning.strategy.runtime import host_allocator

    # the module alone (no torch import): a fresh interpreter starts in a fraction of a second
    code = (
        "import importlib.util as u;"
        f"s = u.spec_from_file_location('h', {host_allocator.__file__!r});"
        "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.tune_host_allocator())"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("LD_PRELOAD", None)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "mmap threshold 32 MiB, trim threshold 1024 MiB" in out, out
    env["MALLOC_TRIM_THRESHOLD_"] = "131072"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.strip() == "allocator left as it is: MALLOC_TRIM_THRESHOLD_ is set"
