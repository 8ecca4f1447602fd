"""The runtime's decisions on injected timings (issue 26): re-partitioning never follows noise,
a background solve starts only when it pays and its steps feed no calibration, the run log keeps
every step across switches, the step prediction covers the whole optimizer step."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fit_helpers import fingerprints
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from optpipe_lightning.schedule import Problem, Schedule, simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.strategy.planning.options import PipelineOptions
from optpipe_lightning.strategy.records.run_log import RunLog, as_run
from optpipe_lightning.strategy.runtime.contract import PipelineSpec
from optpipe_lightning.strategy.runtime.process_groups import PipelineComm
from optpipe_lightning.strategy.scheduling.calibration import StepSampler, budget_interval
from optpipe_lightning.strategy.scheduling.repartition import decide_partition
from optpipe_lightning.strategy.scheduling.resolve import (
    CONTENDED_SLOWDOWN,
    OnlineResolve,
    RunContext,
    SlowdownMeter,
    plan_solve,
    spare_cores,
)
from optpipe_lightning.strategy.scheduling.scheduler import Scheduler

BLOCK = "Sequential|(1024, 1024):float32,(1024,):float32||((64, 1024):float32)->(64, 1024):float32"


def _samples(
    costs: list[float], rng: random.Random, noise: float, n: int = 16
) -> list[list[float]]:
    """Per-microbatch timings of each layer: cost x (1 +- noise)."""
    return [[c * rng.uniform(1 - noise, 1 + noise) for _ in range(n)] for c in costs]


# ---- re-partitioning ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    noise=st.lists(st.floats(-0.6, 0.6), min_size=8, max_size=8),
    slow_rank=st.floats(1.0, 2.0),
    groups=st.sampled_from([2, 4]),
    seed=st.integers(0, 1000),
)
def test_equal_layers_are_never_repartitioned(
    noise: list[float], slow_rank: float, groups: int, seed: int
) -> None:
    """8 identical blocks measured with up to 60% noise per layer and one rank's layers up to 2x
    slower (a process sharing its core): the split stays even."""
    costs = [0.01 * (1 + e) * (slow_rank if i < 8 // groups else 1.0) for i, e in enumerate(noise)]
    current = [8 // groups] * groups
    d = decide_partition(
        costs,
        groups,
        current,
        samples=_samples(costs, random.Random(seed), 0.3),
        identities=[BLOCK] * 8,
    )
    assert d.partition is None


def test_the_issue_case_stays_split_evenly() -> None:
    """[4, 4] of identical layers measured as [5, 3] would suit them (rank 0 ran at 70%)."""
    costs = [0.007] * 4 + [0.011] * 4
    d = decide_partition(costs, 2, [4, 4], identities=[BLOCK] * 8)
    assert d.partition is None and d.reason == "the current partition is balanced"
    # without knowing they are identical, the same numbers would move a layer
    assert decide_partition(costs, 2, [4, 4]).partition == [5, 3]


def test_repartition_needs_a_gain_beyond_the_measured_spread() -> None:
    # two costly layers first, then four cheap ones: [4, 2] -> [1, 5] is 34% faster
    costs = [0.010, 0.010, 0.001, 0.001, 0.001, 0.0015]
    idents = ["heavy", "heavy", "lin", "lin", "lin", "head"]
    quiet = decide_partition(
        costs,
        2,
        [4, 2],
        samples=_samples(costs, random.Random(1), 0.05),
        identities=idents,
    )
    assert quiet.partition == [1, 5] and quiet.gain > 0.3 and quiet.spread < 0.05
    # the same costs measured with +-100% noise per microbatch: the gain does not beat it
    noisy = decide_partition(
        costs,
        2,
        [4, 2],
        samples=_samples(costs, random.Random(1), 1.0),
        identities=idents,
    )
    assert noisy.partition is None and noisy.spread > noisy.gain > 0.3
    assert "measured spread" in noisy.reason
    # a gain below REPARTITION_GAIN (10%) never moves layers, however quiet
    small = decide_partition([1.0, 1.0, 1.0, 1.0, 1.0, 0.3], 2, [2, 4])  # [3, 3]: 9% faster
    assert small.partition is None and 0 < small.gain < 0.1


# ---- the background solve's gate ---------------------------------------------------------------

_PLAN = {
    "makespan": 0.25,
    "bound": 0.20,
    "pipeline_steps": 1,
    "step_seconds": 0.25,
    "time_limit": 30.0,
    "min_gain": 0.01,
}


def test_no_solve_when_the_expected_gain_is_below_the_cost() -> None:
    # no spare core (2 ranks on 2 cores): a 33 s solve slows ~130 steps by 25%: ~8 s lost
    short = plan_solve(remaining_steps=200, spare=0, **_PLAN)
    assert not short.start
    assert short.cost_seconds == pytest.approx(33.0 * CONTENDED_SLOWDOWN / 1.25)
    # 0.5 x 50 ms x (200 - 105.6 steps) = 2.4 s expected gain
    assert short.gain_seconds == pytest.approx(0.5 * 0.05 * (200 - 33.0 / (0.25 * 1.25)))
    assert "assumed slowdown" in short.reason and "1 solver thread" in short.reason
    long = plan_solve(remaining_steps=5000, spare=0, **_PLAN)
    assert long.start and long.gain_seconds > long.cost_seconds
    unknown = plan_solve(remaining_steps=math.inf, spare=0, **_PLAN)
    assert unknown.start and math.isinf(unknown.gain_seconds)
    # a solver with cores of its own costs nothing: it pays as soon as steps remain after it
    spare = plan_solve(remaining_steps=200, spare=14, **_PLAN)
    assert spare.start and spare.cost_seconds == 0.0 and spare.workers == 8
    assert not plan_solve(remaining_steps=100, spare=14, **_PLAN).start  # all overlap it
    # a measured slowdown replaces the assumed one
    measured = plan_solve(remaining_steps=1000, spare=0, slowdown=3.0, **_PLAN)
    assert not measured.start and "measured slowdown" in measured.reason
    # a running schedule within min_gain of the lower bound: nothing to win
    tight = plan_solve(remaining_steps=math.inf, spare=14, **{**_PLAN, "bound": 0.249})
    assert not tight.start and tight.reason.startswith("no room to gain")


def test_spare_cores_leave_the_training_threads_alone() -> None:
    assert spare_cores(2, 1, cores=2) == 0
    assert spare_cores(2, 1, cores=16) == 14
    assert spare_cores(8, 2, cores=16) == 0
    assert spare_cores(1, 8, cores=4) == 0


def test_slowdown_is_measured_from_a_schedules_own_steps() -> None:
    meter = SlowdownMeter()
    assert meter.estimate() is None
    for _ in range(5):
        meter.note("1f1b", 0.40, overlapping=True)
        meter.note("zbv", 0.20, overlapping=False)  # another schedule: not comparable
    assert meter.estimate() is None
    for _ in range(5):
        meter.note("1f1b", 0.25, overlapping=False)
    assert meter.estimate() == pytest.approx(0.6)


def test_a_solve_that_does_not_pay_starts_no_process() -> None:
    problem = Problem(num_stages=2, num_microbatches=8, t_f=0.01, t_b=0.01, t_w=0.01)
    current = generate("gpipe", problem)
    messages: list[str] = []
    resolve = OnlineResolve(PipelineComm(2), time_limit=30.0, on_message=messages.append)
    ctx = RunContext(step_seconds=0.5, remaining_steps=50, training_processes=64)
    assert not resolve.start(problem, current, ctx)
    assert resolve.solver is None and not resolve.active
    assert messages[0].startswith("optpipe: not solving: expected gain")
    plan = resolve.plans[0]
    assert plan["start"] is False and plan["gain_seconds"] < plan["cost_seconds"]


def test_calibration_plans_again_only_when_costs_moved_from_the_last_plan() -> None:
    problem = Problem(num_stages=2, num_microbatches=8, t_f=0.01, t_b=0.01, t_w=0.01)
    current = generate("gpipe", problem)
    resolve = OnlineResolve(PipelineComm(2), time_limit=30.0, on_message=lambda text: None)
    short = RunContext(step_seconds=0.5, remaining_steps=50, training_processes=64)
    resolve.start(problem, current, short)  # does not pay: declined
    moved = problem.with_changes(t_f=0.012)  # 20% from the plan's costs
    resolve.on_calibrated(moved, current, short)
    assert [p["why"] for p in resolve.plans] == ["solving", "solving again (costs moved > 10%)"]
    assert resolve.calibrated_resolves == 0  # declined plans do not count
    resolve.on_calibrated(moved.with_changes(t_f=0.0126), current, short)  # 5% from the last
    assert len(resolve.plans) == 2
    resolve.on_calibrated(moved.with_changes(t_f=0.016), current, short)
    assert len(resolve.plans) == 3 and not resolve.active


# ---- calibration: budget, and no steps that overlap a solve ------------------------------------


def test_calibrations_keep_to_their_budget() -> None:
    assert budget_interval(0.015, 0.25, 0.005) == 12
    assert budget_interval(0.0001, 0.25, 0.005) == 1
    sp = StepSampler(sample_every=1, min_steps=1, warmup=0)
    sp.min_interval = 5
    due = []
    for _ in range(12):
        sp.record(0.1, sp.time_ops_next(), {("F", 0): [0.01]})
        due.append(sp.due())
    assert [i + 1 for i, d in enumerate(due) if d] == [5, 10]


class _Cursor:
    def __init__(self) -> None:
        self.measure = False
        self.times: dict[tuple[str, int], list[float]] = {("F", 0): [0.01], ("BW", 0): [0.02]}

    def drop_times(self) -> None:
        pass


def _scheduler(**options: Any) -> Scheduler:
    opts = PipelineOptions(num_stages=2, num_microbatches=8, calibrate_every=1, **options)
    spec = PipelineSpec(layers=[nn.Linear(2, 2), nn.Linear(2, 2)], loss_fn=lambda o, y: o.sum())
    sch = Scheduler(opts, spec, PipelineComm(2), torch.device("cpu"), [1, 1], 8)
    problem = Problem(num_stages=2, num_microbatches=8, t_f=0.01, t_b=0.01, t_w=0.01)
    sched = generate("1f1b", problem)
    sch.engine = SimpleNamespace(  # type: ignore[assignment]
        problem=problem,
        schedule=sched,
        cursor=_Cursor(),
        run=lambda args, targets, grad_scale, loss_fn: {},
    )
    sch.phase = "run"
    sch.predicted = float(simulate(problem, sched.actions).makespan or 0.0)
    return sch


def test_steps_overlapping_a_solve_are_not_calibrated() -> None:
    sch = _scheduler()
    sampler = sch.calibrator.sampler
    sch.resolve.active = True  # a solve runs (the same on every rank)
    for _ in range(20):
        sch.run_step(None, [], 1.0, lambda o, y: o)
    assert sampler.steps == 0 and not sampler.walls and not sampler.ops
    sch.resolve.active = False
    for _ in range(3):
        sch.run_step(None, [], 1.0, lambda o, y: o)
    assert sampler.steps == 3 and len(sampler.walls) == 2  # one warm-up step left out


def test_the_prediction_covers_the_whole_optimizer_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Injected clock: a pipeline step of 0.2 s inside an optimizer step of 0.25 s."""
    sch = _scheduler()
    sch.predicted = 0.2
    clock = [100.0]
    monkeypatch.setattr(
        "optpipe_lightning.strategy.scheduling.scheduler.time.perf_counter", lambda: clock[0]
    )

    def run(args: Any, targets: Any, grad_scale: float, loss_fn: Any) -> dict[int, torch.Tensor]:
        clock[0] += 0.2
        return {}

    sch.engine.run = run  # type: ignore[union-attr]
    sch.options = PipelineOptions(num_stages=2, num_microbatches=8, calibrate=False)
    sch._solve_pending = False
    assert sch.predicted_step is None
    for _ in range(5):
        sch.run_step(None, [], 1.0, lambda o, y: o)
        clock[0] += 0.05  # optimizer update, Lightning's loop
        sch.at_boundary(nn.Linear(1, 1), [])
        # the running schedule's makespan plus the measured time outside the pipeline
        assert sch.predicted_step == pytest.approx(0.25)
    assert list(sch.times.walls) == pytest.approx([0.25] * 5)


# ---- the run log across switches ---------------------------------------------------------------


def test_run_log_keeps_every_step_across_a_switch_to_another_problem_hash(tmp_path: Path) -> None:
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    log = RunLog(url, enabled=True, flush_seconds=1e9)  # flushes at switches and the end only
    log.start_run(*fingerprints(), {"schedule": "optimal"})
    profiled = Problem(num_stages=2, num_microbatches=8, t_f=0.01, t_b=0.01, t_w=0.01)
    calibrated = profiled.with_changes(t_f=0.012)
    baseline = generate("gpipe", profiled)
    log.record_switch(0, baseline, profiled, "profiled")
    for k in range(1, 4):
        log.record_step(k, 0.3, 0.29, [])
    assert log.pending_steps == 3  # a step appends; the database is written in batches
    # the solver's incumbent was made for the profiled costs; it runs on the calibrated ones
    incumbent = generate("1f1b", profiled)
    assert incumbent.problem_hash != calibrated.hash
    log.record_switch(4, incumbent, calibrated, "solver incumbent")
    log.record_switch(6, generate("zb-h1", calibrated), calibrated, "solver incumbent")
    for k in range(4, 9):
        log.record_step(k, 0.25, 0.26, [])
    log.finish("finished")
    assert log.active and log.failures == 0
    db = open_database(url)
    with db.session() as s:
        run = repo.list_training_runs(s)[0]
        steps = repo.training_steps(s, run.id)
        switches = repo.schedule_switches(s, run.id)
        stored = [repo.get_schedule(s, sw.to_schedule_id) for sw in switches]
    db.close()
    assert [st.step for st in steps] == list(range(1, 9)) and run.status == "finished"
    assert (
        len(switches) == 3
        and [st.schedule_id for st in steps][3:] == [switches[2].to_schedule_id] * 5
    )
    assert [sc.problem_hash for sc in stored] == [profiled.hash, calibrated.hash, calibrated.hash]
    assert stored[1].actions == incumbent.actions and stored[1].generator == incumbent.generator
    assert as_run(incumbent, profiled) is incumbent


def test_background_solver_runs_at_low_priority_and_sends_incumbents() -> None:
    """The solver child: a fresh interpreter at nice 19 (no torch import), incumbents back as
    schedule JSON, the best one beating GPipe by min_gain becomes a switch. (The incumbents are
    checked on a child at the test's own priority: at nice 19 on a machine busy with other work
    the child may get no CPU for minutes, which is the point of nice 19.)"""
    import os
    import time

    from optpipe_lightning.strategy.scheduling.resolve import SOLVER_NICE, BackgroundSolver

    problem = Problem(num_stages=4, num_microbatches=8, t_f=0.01, t_b=0.01, t_w=0.01)
    gpipe = generate("gpipe", problem)
    span = float(simulate(problem, gpipe.actions).makespan or 0.0)
    low = BackgroundSolver(problem, span, time_limit=1.0, start_method="spawn", workers=1)
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        seen = base
        deadline = time.monotonic() + 60
        while low.proc.poll() is None and time.monotonic() < deadline:
            try:
                seen = os.getpriority(os.PRIO_PROCESS, low.proc.pid)
            except OSError:  # exited between the two calls
                break
            if seen != base:
                break
            time.sleep(0.01)
        assert seen == min(base + SOLVER_NICE, 19)
    finally:
        low.stop()
    solver = BackgroundSolver(
        problem, span, time_limit=1.0, start_method="spawn", workers=1, nice=0
    )
    try:
        assert solver.proc.wait(timeout=300) == 0
        decisions = [solver.poll() for _ in range(3)]
    finally:
        solver.stop()
    assert decisions[0].kind == "switch" and decisions[-1].kind == "done"
    best = simulate(problem, Schedule.from_json(decisions[0].schedule_json).actions).makespan
    assert best is not None and best < span * 0.99


@pytest.mark.parametrize(
    "accelerator",
    [
        "cpu",
        pytest.param(
            "gpu",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
            ],
        ),
    ],
)
def test_run_log_of_a_fit_has_every_step_and_its_prediction(
    tmp_path: Path, accelerator: str
) -> None:
    """One stage on one device through Lightning: every step in the run log, against the whole
    step's prediction; on a GPU with every step's peak memory (gathered every 16 steps)."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo
    from optpipe_lightning.strategy.lightning.strategy import OptPipeStrategy

    class Small(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

        def configure_pipeline(self) -> PipelineSpec:
            return PipelineSpec(layers=list(self.blocks), loss_fn=nn.functional.mse_loss)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> DataLoader:
            x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
            return DataLoader(TensorDataset(x, x), batch_size=8)

        def val_dataloader(self) -> DataLoader:
            x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
            return DataLoader(TensorDataset(x, x), batch_size=8)

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    strategy = OptPipeStrategy(
        num_stages=1,
        num_microbatches=2,
        schedule="1f1b",
        profile_steps=1,
        database=url,
        online_resolve=False,
        repartition=False,
    )
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        strategy=strategy,
        max_steps=20,
        check_val_every_n_epoch=10,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(Small())
    finally:  # the fit ran in this process: leave no process group to the next tests
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        # (no gc.collect: what the group leaves in reference cycles, with its rendezvous store
        # still listening, is what a notebook leaves too; later forked runs must cope with it)
    db = open_database(url)
    with db.session() as s:
        run = repo.list_training_runs(s)[0]
        steps = repo.training_steps(s, run.id)
        metrics = repo.training_metrics(s, run.id)
    db.close()
    assert [st.step for st in steps] == list(range(1, 21))  # (run.status: issue 23)
    # the inspector's metrics: every step's loss and samples, the loss of each validation run
    by_name: dict[str, list[tuple[int, float | None]]] = {}
    for m in metrics:
        by_name.setdefault(m.name, []).append((m.step, m.value))
    assert [st for st, _ in by_name["train_loss"]] == list(range(1, 21))
    assert all(v is not None and v > 0 for _, v in by_name["train_loss"])
    assert by_name["samples"] == [(st, 8.0) for st in range(1, 21)]
    assert [st for st, _ in by_name["val_loss"]] == [10, 20]  # after epochs 10 and 20
    assert "tokens" not in by_name  # features, not token ids
    assert all(st.predicted_seconds is None for st in steps[:2])  # profiling
    assert all(st.predicted_seconds and st.measured_seconds > 0 for st in steps[2:])
    if accelerator == "gpu":
        assert all(len(st.peak_memory) == 1 and st.peak_memory[0] > 0 for st in steps)
    else:
        assert all(st.peak_memory == () for st in steps)
