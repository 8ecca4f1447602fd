"""No database fault stops training (issue 33.2): every call goes through the database process
(``profiles_db.writer``); a database that vanishes, whose ``-shm`` file is truncated (SIGBUS in
the process that maps it), or that cannot be opened gives one warning naming the fallback file,
and every record of the run ends up there."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from fit_helpers import fingerprints

from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.baselines import generate
from optpipe_lightning.strategy.records.run_log import RunLog


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[RunLog, Path]:
    monkeypatch.setenv("OPTPIPE_RECORDS_DIR", str(tmp_path))
    db = tmp_path / "runs.db"
    log = RunLog(f"sqlite:///{db}", enabled=True, flush_seconds=1e9)
    log.start_run(*fingerprints(), {})
    pb = Problem(num_stages=2, num_microbatches=4, t_f=1e-3, t_b=1e-3, t_w=1e-3)
    log.record_switch(0, generate("1f1b", pb), pb, "profiled")
    log.record_step(1, 0.3, 0.29, [])
    log.flush()
    assert log.pending_steps == 0 and log.fallback is None  # written to the database
    return log, db


def _goes_on(log: RunLog, caplog: pytest.LogCaptureFixture, cause: str) -> None:
    pb = Problem(num_stages=2, num_microbatches=4, t_f=1e-3, t_b=1e-3, t_w=1e-3)
    with caplog.at_level(logging.WARNING):
        for k in range(2, 5):
            log.record_step(k, 0.3, 0.29, [])
            log.record_metrics(k, {"train_loss": torch.tensor(2.0)})
            log.flush()
        log.record_switch(5, generate("zb-h1", pb), pb, "solver incumbent")
        log.record_step(5, 0.25, 0.26, [])
        log.finish("finished")
    (line,) = _warnings(caplog)  # one warning, naming the cause and the file
    assert cause in line and str(log.fallback) in line
    assert log.fallback is not None
    got = _records(log.fallback)
    assert [r["step"] for r in got if r["kind"] == "step"] == [2, 3, 4, 5]
    assert [r["metrics"]["train_loss"] for r in got if r["kind"] == "metrics"] == [2.0] * 3
    (switch,) = [r for r in got if r["kind"] == "switch"]
    assert switch["reason"] == "solver incumbent" and switch["schedule"]["generator"] == "zb-h1"
    assert got[-1]["kind"] == "finish" and got[-1]["status"] == "finished"


def test_a_deleted_database_is_noticed_and_the_records_go_to_the_fallback_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log, db = _started(tmp_path, monkeypatch)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    _goes_on(log, caplog, "was deleted or replaced")


def test_a_truncated_shm_file_kills_only_the_database_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log, db = _started(tmp_path, monkeypatch)
    shm = Path(f"{db}-shm")
    assert shm.exists()
    os.truncate(shm, 0)  # the writer's mapping now points past the end of the file: SIGBUS
    _goes_on(log, caplog, "killed by SIGBUS")
    assert not log.active or log.db is None


def test_a_locked_database_stalls_no_step_for_long_and_loses_no_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import sqlite3

    from optpipe_lightning.strategy.records import run_log

    monkeypatch.setattr(run_log, "BUSY_SECONDS", 0.2)  # (the default waits 5 s per call)
    log, db = _started(tmp_path, monkeypatch)
    holder = sqlite3.connect(db, timeout=0.1)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    try:
        _goes_on(log, caplog, "locked")
    finally:
        holder.rollback()
        holder.close()


def test_a_database_that_cannot_be_opened_keeps_the_records_in_the_fallback_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OPTPIPE_RECORDS_DIR", str(tmp_path))
    fifo = tmp_path / "not-a-file.db"
    os.mkfifo(fifo)
    with caplog.at_level(logging.WARNING):
        log = RunLog(f"sqlite:///{fifo}", enabled=True, flush_seconds=1e9)
    assert log.active and log.db is None and log.fallback is not None
    log.start_run(*fingerprints(), {"schedule": "1f1b"})
    _goes_on(log, caplog, "cannot open the database")
    assert _records(log.fallback)[0]["kind"] == "run"


def test_a_required_database_that_cannot_be_opened_fails_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "not-a-file.db"
    os.mkfifo(fifo)
    with pytest.raises(RuntimeError, match="cannot open the database"):
        RunLog(f"sqlite:///{fifo}", enabled=True, required=True)


class _DeleteDatabase:
    """A callback that deletes the database files on global rank 0 after ``at`` steps."""

    def __init__(self, path: Path, at: int) -> None:
        self.path, self.at = path, at

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_rank == 0 and trainer.global_step == self.at:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)


@pytest.mark.dist
def test_training_goes_on_when_its_database_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning.pytorch as pl
    from test_strat_lightning import fit as lightning_fit
    from test_strat_lightning import reference

    monkeypatch.setenv("OPTPIPE_RECORDS_DIR", str(tmp_path))
    db = tmp_path / "optpipe.db"
    callback = type("DeleteDatabase", (_DeleteDatabase, pl.Callback), {})(db, 2)
    monkeypatch.setattr(
        pl, "Trainer", _with_callback(pl.Trainer, callback)
    )  # the helper builds its own Trainer: add ours to it
    ref_losses, _ = reference(5)
    ranks = lightning_fit(
        tmp_path / "a", 5, schedule="1f1b", use_database=True, database=f"sqlite:///{db}"
    )
    assert ranks[0]["losses"] == pytest.approx(ref_losses, abs=1e-5)  # trained to the end
    (fallback,) = tmp_path.glob("optpipe-records-*.jsonl")
    got = _records(fallback)
    assert [r["step"] for r in got if r["kind"] == "step"] == [1, 2, 3, 4, 5]
    assert got[-1] == {"kind": "finish", "run_id": 1, "status": "finished"}


def _with_callback(cls: Any, callback: Any) -> Any:
    def make(*args: Any, **kwargs: Any) -> Any:
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), callback]
        return cls(*args, **kwargs)

    return make
