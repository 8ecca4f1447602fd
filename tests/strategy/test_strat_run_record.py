"""What a training run records for the inspector, and the options that shape its problem.

- the run log writes, batched with the step records: each step's metrics (train loss, samples,
  tokens where the input is token ids; the validation loss after each validation run), every
  calibration with its predicted step time before and after, the memory limit per stage, each
  switch's predicted step time before and after; and the first switch of a run started from a
  stored profile (made before the first step) is in the run;
- a run from a stored profile takes the profile's runtime overhead out before calibrating;
- ``memory_margin`` lowers every stage's limit before solving;
- the strategy lets the solver choose only chunkings the executor runs, and a background solve
  only the running one.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from optpipe_lightning.schedule import Problem, simulate
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.strategy.planning.options import OptPipeConfigError, PipelineOptions
from optpipe_lightning.strategy.planning.partition import runnable_chunkings
from optpipe_lightning.strategy.records.run_log import RunLog
from optpipe_lightning.strategy.runtime.contract import PipelineSpec
from optpipe_lightning.strategy.runtime.process_groups import PipelineComm
from optpipe_lightning.strategy.scheduling.scheduler import Scheduler

# ---- memory_margin ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"memory_margin": -0.1}, ">= 0"),
        ({"memory_margin": float("nan")}, "finite number"),
        ({"memory_margin": "0.5B"}, "less than one byte"),
        ({"memory_margin": "2 parsecs"}, "neither a fraction"),
        ({"memory_margin": [0.1]}, "memory_margin must be"),
        ({"memory_limit": 1e9, "memory_margin": "2GB"}, "leaves nothing"),
    ],
)
def test_a_bad_memory_margin_is_one_line_naming_it(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(OptPipeConfigError, match=match) as err:
        PipelineOptions(**kwargs)
    assert "\n" not in str(err.value) and str(err.value).startswith("memory_margin")


def _scheduler(stages: int = 2, **options: Any) -> Scheduler:
    spec = PipelineSpec(layers=[nn.Linear(2, 2) for _ in range(4)], loss_fn=lambda o, y: o.sum())
    opts = PipelineOptions(num_stages=stages, num_microbatches=4, **options)
    return Scheduler(opts, spec, PipelineComm(stages), torch.device("cpu"), [2] * stages, 4)


@pytest.mark.parametrize(
    ("margin", "limit"), [(0.0, 1e9), (0.1, 0.9e9), ("100MB", 0.9e9), ("2e8", 0.8e9)]
)
def test_memory_margin_lowers_every_stages_limit(margin: Any, limit: float) -> None:
    sch = _scheduler(memory_limit=1e9, memory_margin=margin)
    assert sch.memory_limit([]) == pytest.approx([limit, limit])
    assert _scheduler(memory_limit=None, memory_margin=0.1).memory_limit([]) is None
    assert _scheduler(memory_margin=0.1).memory_limit([]) is None  # "auto" on CPU: unlimited


def test_the_problem_from_a_profile_has_the_limit_less_the_margin() -> None:
    sch = _scheduler(memory_limit=1e9, memory_margin="250MB")
    sch.engine = SimpleNamespace(parameters=[])  # type: ignore[assignment]
    problem = sch.problem_from_profile(_profile(sch))
    assert problem.memory_limits() == [pytest.approx(0.75e9)] * 2


# ---- chunkings the executor runs ----------------------------------------------------------------


def test_runnable_chunkings_are_the_divisors_of_every_devices_layers() -> None:
    pb = Problem(num_stages=2, num_microbatches=4, t_f=1, t_b=1, t_w=1)
    assert runnable_chunkings(pb) == [(1, "interleaved")]  # no layer counts: its own only
    four = pb.with_changes(layers_per_stage=[4, 4])
    assert runnable_chunkings(four) == [
        (1, "interleaved"),
        (2, "interleaved"),
        (2, "vshape"),
        (4, "interleaved"),
        (4, "vshape"),
    ]
    assert runnable_chunkings(pb.with_changes(layers_per_stage=[3, 2])) == [(1, "interleaved")]
    v2 = four.with_changes(num_chunks=2, placement="vshape")
    assert runnable_chunkings(v2)[0] == (2, "vshape")  # its own first


def test_the_strategy_solves_only_chunkings_the_executor_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from optpipe_lightning.strategy.planning import planner

    seen: dict[str, Any] = {}

    def fake_solve(problem: Problem, **kw: Any) -> Any:
        seen.update(kw)
        raise RuntimeError("stop here")  # the planner falls back to the best baseline

    import optpipe_lightning.solver as solver

    monkeypatch.setattr(solver, "solve", fake_solve)
    pb = Problem(num_stages=2, num_microbatches=4, t_f=1, t_b=1, t_w=1, layers_per_stage=[2, 2])
    chunkings = runnable_chunkings(pb)
    planner.choose_schedule("optimal", pb, chunkings=chunkings)
    assert seen["chunkings"] == chunkings


def test_a_solver_schedule_for_another_chunking_is_judged_on_its_own_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The solver may answer in another chunking (it embeds that problem); the planner must
    check it there, not on the profiled problem's shape, or it never runs one."""
    from optpipe_lightning.schedule.chunking import rechunk, stamped
    from optpipe_lightning.strategy.planning import planner

    pb = Problem(num_stages=4, num_microbatches=8, t_f=1, t_b=1, t_w=1, layers_per_stage=4)
    v2 = rechunk(pb, 2, "vshape")
    zbv = stamped(generate("zbv", v2), v2)  # 25.5 s against zb-h1's 27 s on one chunk
    import optpipe_lightning.solver as solver

    monkeypatch.setattr(solver, "solve", lambda *a, **kw: SimpleNamespace(schedule=zbv))
    chosen = planner.choose_schedule("optimal", pb, chunkings=runnable_chunkings(pb))
    assert chosen.generator == "zbv" and chosen.problem == v2


def test_a_background_solve_searches_only_the_running_chunking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A switch keeps the chunking: a solve over every chunking ``layers_per_stage`` allows could
    return a schedule the executor must refuse. The solver process is asked for the running one
    (the request's ``chunkings``), and an incumbent the executor would refuse is never picked."""
    import json
    import subprocess

    from optpipe_lightning.strategy.scheduling import resolve

    sent: list[dict[str, Any]] = []

    class FakePopen:
        def __init__(self, *a: Any, **kw: Any) -> None:
            self.stdin = self
            self.stdout: list[str] = []

        def write(self, text: str) -> None:
            sent.append(json.loads(text))

        def flush(self) -> None:
            pass

        def poll(self) -> int:
            return 0

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    pb = Problem(
        num_stages=2,
        num_microbatches=4,
        num_chunks=2,
        placement="vshape",
        t_f=1,
        t_b=1,
        t_w=1,
        layers_per_stage=[4, 4],
    )
    current = generate("1f1b", pb.with_changes(num_chunks=1, placement="interleaved"))
    solver = resolve.BackgroundSolver(pb, 100.0)
    assert sent[0]["chunkings"] == [[2, "vshape"]]
    from optpipe_lightning.solver.background import _chunkings

    assert _chunkings(sent[0]["chunkings"]) == [(2, "vshape")]
    # an incumbent for another chunking (1 chunk per device) is rejected, not switched to
    solver.queue.put(("incumbent", current.to_json()))
    solver.queue.put(("done", ""))
    assert solver.poll().kind == "done"
    # one the simulator accepts but the executor refuses (the last stage's forwards out of
    # microbatch order: torch pairs losses with forwards by position) is rejected too
    one = Problem(num_stages=2, num_microbatches=2, t_f=1, t_b=1, t_w=1)
    gpipe = generate("gpipe", one)
    rows = [list(r) for r in gpipe.actions]
    fs = [a for a in rows[1] if a.op == "F"]
    rows[1] = [fs[1], fs[0], *(a for a in rows[1] if a.op != "F")]
    swapped = gpipe.model_copy(update={"actions": rows, "evaluation": None})
    assert simulate(one, swapped.actions).feasible
    bg = resolve.BackgroundSolver(one, 100.0)
    bg.queue.put(("incumbent", swapped.to_json()))
    assert bg.poll().kind != "switch"
    bg.queue.put(("incumbent", gpipe.to_json()))
    assert bg.poll().kind == "switch"  # the same schedule in order is taken


# ---- token counts -------------------------------------------------------------------------------


def test_tokens_are_counted_where_the_input_is_token_ids() -> None:
    # Lightning first: importing strategy.step before it trips the package's registration hook
    # over a half-imported module_steps (a warning, not this test's concern)
    import lightning.pytorch  # noqa: F401

    from optpipe_lightning.strategy.lightning.step import token_count

    ids = [(torch.zeros(2, 16, dtype=torch.long),), (torch.zeros(2, 16, dtype=torch.long),)]
    assert token_count(ids) == 64
    assert token_count([(torch.zeros(2, 16),)]) is None  # features, not tokens
    assert token_count([(torch.zeros(4, dtype=torch.long),)]) is None  # no sequence dimension


# ---- the run log --------------------------------------------------------------------------------


def _profile(sch: Scheduler, overhead: float = 0.0) -> Any:
    from optpipe_lightning.schedule.profile import OpStats, Profile, StageProfile
    from optpipe_lightning.strategy.scheduling.profiler import (
        hardware_fingerprint,
        model_fingerprint,
    )

    ms = OpStats(mean=1e-3)
    p = sch.comm.num_stages
    return Profile(
        hardware=hardware_fingerprint(torch.device("cpu"), p, "gloo"),
        model=model_fingerprint(
            "M", sch.spec.layers, 1, p, 1, sch.partition, placement="interleaved"
        ),
        num_microbatches=4,
        stages=[StageProfile(stage=s, f=ms, b=ms, w=ms, activation_bytes=100.0) for s in range(p)],
        runtime_overhead=overhead,
    )


def _read(url: str) -> dict[str, Any]:
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo

    db = open_database(url)
    with db.session() as s:
        runs = repo.list_training_runs(s)
        rid = runs[0].id if runs else None
        out = {
            "runs": runs,
            "metrics": [] if rid is None else repo.training_metrics(s, rid),
            "calibrations": [] if rid is None else repo.training_calibrations(s, rid),
            "switches": [] if rid is None else repo.schedule_switches(s, rid),
            "detail": None if rid is None else repo.training_run_detail(s, rid),
            "steps": [] if rid is None else repo.training_steps(s, rid),
        }
    db.close()
    return out


def test_run_log_batches_metrics_calibrations_limits_and_predicted_switches(
    tmp_path: Path,
) -> None:
    from optpipe_lightning.strategy.scheduling.profiler import (
        hardware_fingerprint,
        model_fingerprint,
    )

    url = f"sqlite:///{tmp_path / 'run.db'}"
    log = RunLog(url, True, flush_seconds=1e9)  # written only when flushed
    sch = _scheduler()
    log.start_run(
        hardware_fingerprint(torch.device("cpu"), 2, "gloo"),
        model_fingerprint("M", sch.spec.layers, 1, 2, 1, [2, 2]),
        {},
    )
    pb = Problem(num_stages=2, num_microbatches=4, t_f=1e-3, t_b=1e-3, t_w=1e-3)
    sched = generate("1f1b", pb)
    log.record_switch(0, sched, pb, "stored profile", predicted_before=0.02, predicted_after=0.01)
    log.record_memory_limit([3e9, 4e9])
    log.record_step(1, 0.011, 0.010, [])
    log.record_metrics(1, {"train_loss": torch.tensor(2.5), "samples": 8.0, "tokens": 256.0})
    log.record_calibration(1, 0.010, 0.012, 0.0125, "calibrated 1f1b from 8 steps")
    log.record_metrics(1, {"val_loss": 2.75})
    before = _read(url)
    assert not before["metrics"] and not before["calibrations"] and not before["steps"]
    assert before["detail"].memory_limit is None
    assert [(w.predicted_before, w.predicted_after) for w in before["switches"]] == [(0.02, 0.01)]
    log.flush()
    got = _read(url)
    assert {(m.step, m.name): m.value for m in got["metrics"]} == {
        (1, "train_loss"): 2.5,
        (1, "samples"): 8.0,
        (1, "tokens"): 256.0,
        (1, "val_loss"): 2.75,
    }
    (cal,) = got["calibrations"]
    assert (cal.predicted_before, cal.predicted_after, cal.measured_seconds) == (
        0.010,
        0.012,
        0.0125,
    )
    assert cal.schedule_id == got["switches"][0].to_schedule_id
    assert got["detail"].memory_limit == (3e9, 4e9)
    log.finish("finished")
    log.close()


def test_a_stored_profile_starts_the_run_before_its_first_switch_and_keeps_its_overhead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started from a stored profile, the first switch happens in ``build`` (before any step):
    the run is in the database by then, so the switch is recorded; calibration knows the
    overhead the profile's costs hold."""
    from optpipe_lightning.profiles_db import open_database
    from optpipe_lightning.profiles_db import repository as repo

    url = f"sqlite:///{tmp_path / 'run.db'}"
    sch = _scheduler(
        schedule="1f1b", database=url, memory_limit=1e6, memory_margin=0.25, online_resolve=False
    )
    sch.model_name = "M"
    profile = _profile(sch, overhead=4e-4)
    db = open_database(url)
    with db.session() as s:
        repo.store_profile(s, profile)
    db.close()

    class FakeEngine:
        def __init__(self, problem: Problem, schedule: Any) -> None:
            self.problem, self.schedule = problem, schedule
            self.parameters: list[nn.Parameter] = []
            self.cursor = SimpleNamespace(set_measure=lambda on: None)

        def switch(self, schedule: Any, problem: Problem) -> None:
            self.problem, self.schedule = problem, schedule

        def finish_loss_handout(self, timeout: float | None = None) -> None:
            pass

    monkeypatch.setattr(sch, "new_engine", lambda pb, sched, measure: FakeEngine(pb, sched))
    monkeypatch.setattr(
        "optpipe_lightning.strategy.scheduling.scheduler.model_fingerprint",
        lambda *a, **kw: profile.model,
    )
    sch.build(4, 1, 2)
    assert sch.calibrator.overhead_in_problem == pytest.approx(4e-4)
    # the profiler's overhead goes into the stored profile with the costs it was added to
    from optpipe_lightning.strategy.scheduling.profiler import with_overhead

    bumped = with_overhead(profile, 1e-4)
    assert bumped.runtime_overhead == pytest.approx(5e-4)
    assert bumped.stages[0].f.mean == pytest.approx(profile.stages[0].f.mean + 1e-4)
    assert [s["reason"] for s in sch.switches] == ["stored profile"]
    sch.note_batch(torch.tensor(1.5), 4, None)
    sch.at_boundary(nn.Linear(1, 1), [])
    sch.note_validation(1.25)
    sch.close("finished")
    got = _read(url)
    (run,) = got["runs"]
    assert run.status == "finished"
    (switch,) = got["switches"]
    assert switch.reason == "stored profile" and switch.step == 0
    assert sch.engine is not None
    predicted = simulate(sch.engine.problem, sch.engine.schedule.actions).makespan
    assert switch.predicted_after == pytest.approx(predicted)
    assert switch.predicted_before is not None and switch.predicted_before > 0  # profiling's
    assert got["detail"].memory_limit == (0.75e6, 0.75e6)
    assert {(m.step, m.name): m.value for m in got["metrics"]} == {
        (1, "train_loss"): 1.5,
        (1, "samples"): 4.0,
        (1, "val_loss"): 1.25,
    }
    assert [st.step for st in got["steps"]] == [1]


def test_batch_metrics_average_the_loss_over_accumulated_batches() -> None:
    from optpipe_lightning.strategy.records.run_log import BatchMetrics

    b = BatchMetrics()
    b.add(torch.tensor(1.0), 4, 64)
    b.add(torch.tensor(2.0), 4, 64)
    got = b.take()
    assert float(got["train_loss"]) == pytest.approx(1.5)
    assert (got["samples"], got["tokens"]) == (8.0, 128.0)
    assert b.take() == {}  # the next optimizer step starts from nothing
    b.add(None, 2, None)  # a step whose loss is not known: samples only
    assert b.take() == {"samples": 2.0}
