"""Revision 0002: per-step metrics, re-calibrations, switch gains and a run's memory limit."""

from __future__ import annotations

import math

import pytest
from alembic import command
from db_builders import hardware, make_fbw, make_problem, model_fp
from sqlalchemy import inspect

from optpipe_lightning.profiles_db import Database, NotFoundError, open_database
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.profiles_db.database import _alembic_config


def _run(db: Database) -> tuple[int, int, int]:
    pb = make_problem()
    with db.session() as s:
        a = repo.store_schedule(s, make_fbw(pb, "a"), source="test")
        b = repo.store_schedule(s, make_fbw(pb.with_changes(t_f=1.5), "b"), source="test")
        run = repo.start_training_run(s, hardware=hardware(), model=model_fp(), config={})
    return run, a, b


def test_metrics_calibrations_switch_gain_and_limit(db: Database) -> None:
    run, a, b = _run(db)
    with db.session() as s:
        repo.record_metrics(s, run, step=1, metrics={"train_loss": 2.5, "samples": 64})
        repo.record_metrics(s, run, step=2, metrics={"train_loss": math.nan, "val_loss": 2.1})
        repo.record_calibration(
            s,
            run,
            step=2,
            schedule_id=a,
            predicted_before=0.50,
            predicted_after=0.56,
            measured_seconds=0.57,
            reason="calibrated from 4 steps",
        )
        repo.record_switch(
            s,
            run,
            step=3,
            from_schedule_id=a,
            to_schedule_id=b,
            reason="solver incumbent",
            predicted_before=0.56,
            predicted_after=0.48,
        )
        repo.record_memory_limit(s, run, [70e9, 72e9])
    with db.session() as s:
        metrics = repo.training_metrics(s, run)
        cal = repo.training_calibrations(s, run)
        (sw,) = repo.schedule_switches(s, run)
        detail = repo.training_run_detail(s, run)
    assert [(m.step, m.name, m.value) for m in metrics] == [
        (1, "train_loss", 2.5),
        (1, "samples", 64.0),
        (2, "train_loss", None),  # NaN is a missing value
        (2, "val_loss", 2.1),
    ]
    assert [(c.step, c.schedule_id, c.predicted_before, c.predicted_after) for c in cal] == [
        (2, a, 0.50, 0.56)
    ]
    assert cal[0].measured_seconds == 0.57 and cal[0].reason == "calibrated from 4 steps"
    assert (sw.predicted_before, sw.predicted_after) == (0.56, 0.48)
    assert detail.memory_limit == (70e9, 72e9)
    assert detail.device_memory == hardware().device_memory and detail.status == "running"


def test_switch_without_prediction_and_missing_run(db: Database) -> None:
    run, a, _ = _run(db)
    with db.session() as s:
        repo.record_switch(s, run, step=0, from_schedule_id=None, to_schedule_id=a, reason="x")
        (sw,) = repo.schedule_switches(s, run)
        assert sw.predicted_before is None and sw.predicted_after is None
        assert repo.training_run_detail(s, run).memory_limit is None
        with pytest.raises(NotFoundError):
            repo.training_run_detail(s, run + 99)
        with pytest.raises(NotFoundError):
            repo.record_memory_limit(s, run + 99, [1.0])
        with pytest.raises(ValueError, match="metric names"):
            repo.record_metrics(s, run, step=0, metrics={"": 1.0})


def test_prune_drops_metrics_and_calibrations(db: Database) -> None:
    run, a, _ = _run(db)
    with db.session() as s:
        repo.record_metrics(s, run, step=0, metrics={"train_loss": 1.0})
        repo.record_calibration(
            s,
            run,
            step=0,
            schedule_id=a,
            predicted_before=None,
            predicted_after=1.0,
            measured_seconds=None,
            reason="r",
        )
        repo.finish_training_run(s, run, status="finished")
    with db.session() as s:
        report = repo.prune(s, older_than_seconds=-1.0)
        assert report.training_runs == 1
        assert repo.training_metrics(s, run) == [] and repo.training_calibrations(s, run) == []


def test_upgrade_from_0001_keeps_rows(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    run, a, b = _run(db)
    with db.session() as s:
        repo.record_switch(s, run, step=0, from_schedule_id=a, to_schedule_id=b, reason="old")
    with db.engine.begin() as conn:
        command.downgrade(_alembic_config(conn), "0001")
        assert "training_metrics" not in inspect(conn).get_table_names()
    db.close()
    from optpipe_lightning.profiles_db.upgrade import upgrade_database

    assert upgrade_database(sqlite_url).migrated  # `optpipe db upgrade`: the one way
    db = open_database(sqlite_url)
    with db.session() as s:
        (sw,) = repo.schedule_switches(s, run)
        assert sw.reason == "old" and sw.predicted_after is None
        repo.record_metrics(s, run, step=1, metrics={"val_loss": 3.0})
        assert [m.value for m in repo.training_metrics(s, run)] == [3.0]
    db.close()
