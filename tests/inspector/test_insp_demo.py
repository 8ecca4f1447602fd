"""The demo database holds only what the product makes: real baselines, real solver runs (with
their incumbents), a training run recorded through the recorder functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from optpipe_lightning.cli import demo
from optpipe_lightning.cli.demo import DemoDatabase
from optpipe_lightning.profiles_db import open_database
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.schedule import simulate
from optpipe_lightning.schedule.baselines import BASELINE_NAMES, NotApplicable, generate


def test_baselines_are_the_generators_own(demo_db: DemoDatabase) -> None:
    with open_database(demo_db.url, read_only=True) as db, db.session() as s:
        for key, h in demo_db.problems.items():
            pb = repo.get_problem(s, h)
            assert pb is not None
            for name in BASELINE_NAMES:
                try:
                    expected = generate(name, pb)
                except NotApplicable:
                    assert (key, name) not in demo_db.schedules
                    continue
                stored = repo.get_schedule(s, demo_db.schedules[(key, name)])
                assert stored.generator == name and stored.actions == expected.actions
    assert demo_db.problems.keys() == {"gpt-4x8", "gpt-4x8x2", "unit-4x8"}


def test_solver_runs_are_recorded_solves(demo_db: DemoDatabase) -> None:
    assert set(demo_db.solver_runs) == {
        ("gpt-4x8", "heuristic"),
        ("gpt-4x8", "cpsat"),
        ("gpt-4x8x2", "auto"),
        ("unit-4x8", "auto"),
    }
    with open_database(demo_db.url, read_only=True) as db, db.session() as s:
        for (key, _backend), run_id in demo_db.solver_runs.items():
            run = repo.get_solver_run(s, run_id)
            assert run.status != "running" and run.finished_at is not None
            assert run.num_events >= 1 and run.problem_hash == demo_db.problems[key]
            sc = repo.get_schedule(s, run.schedule_id)
            assert sc.evaluation is not None
            # a schedule found again (a stored baseline's, another run's) is stored once,
            # under what found it first (issue 38): its parameters may be another run's
            if sc.generator == "optpipe":
                assert sc.params["time_limit"] == 1.0
            assert sc.evaluation.makespan == pytest.approx(run.makespan)
            events = repo.solver_events(s, run_id)
            assert min(e.makespan for e in events if e.makespan) == pytest.approx(run.makespan)
            assert simulate(sc.problem, sc).makespan == pytest.approx(run.makespan)


def test_training_run_as_the_strategy_records_it(demo_db: DemoDatabase) -> None:
    assert demo_db.training_run is not None
    with open_database(demo_db.url, read_only=True) as db, db.session() as s:
        run_id = demo_db.training_run
        steps = repo.training_steps(s, run_id)
        switches = repo.schedule_switches(s, run_id)
        (cal,) = repo.training_calibrations(s, run_id)
        metrics = repo.training_metrics(s, run_id)
        detail = repo.training_run_detail(s, run_id)
    assert [r.step for r in steps] == list(range(40))
    assert detail.status == "finished" and detail.memory_limit is not None
    assert [w.step for w in switches] == [4, 20]
    first, second = switches
    assert first.from_schedule_id is None and first.predicted_after is not None
    assert second.predicted_after < second.predicted_before  # the switch was for a gain
    assert cal.step == 12 and cal.predicted_after > cal.predicted_before
    assert all(r.predicted_seconds is None for r in steps[:4])
    assert {r.schedule_id for r in steps[20:]} == {second.to_schedule_id}
    names = [m.name for m in metrics]
    assert names.count("train_loss") == 40 and names.count("val_loss") == 4
    assert names.count("samples") == 40


def test_ensure_demo_database_builds_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def fake_build(url: str, **kw: object) -> DemoDatabase:
        built.append(url)
        Path(url.removeprefix("sqlite:///")).write_text("db")
        return DemoDatabase(url)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(demo, "build_demo_database", fake_build)
    logs: list[str] = []
    url = demo.ensure_demo_database(None, log=logs.append)
    path = tmp_path / "cache" / "optpipe" / "demo.db"
    assert url == f"sqlite:///{path}" and path.read_text() == "db"
    assert len(built) == 1 and built[0] != url  # built beside it, then moved into place
    assert demo.ensure_demo_database(None, log=logs.append) == url and len(built) == 1
    assert "delete it to build it again" in logs[-1]
    other = f"sqlite:///{tmp_path / 'mine.db'}"
    assert demo.ensure_demo_database(other, log=logs.append) == other and built[-1] == other
    assert sorted(p.name for p in path.parent.iterdir()) == ["demo.db"]  # no leftovers
