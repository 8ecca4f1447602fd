"""Several processes on one database: readers beside writers, a writer killed mid-write,
concurrent first opens. Run on SQLite and (when available) PostgreSQL."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from typing import Any

import db_workers
import pytest
from sqlalchemy import text

from optpipe_lightning.profiles_db import open_database
from optpipe_lightning.profiles_db import repository as repo

CTX = mp.get_context("spawn")  # separate interpreters, as a real inspector and trainer are
TIMEOUT = 90.0


def _result(conn: Any, proc: Any, timeout: float = TIMEOUT) -> tuple[Any, ...]:
    if not conn.poll(timeout):
        proc.kill()
        pytest.fail(f"{proc.name} sent nothing within {timeout} s")
    result = conn.recv()
    assert result[0] == "ok", f"{proc.name}: {result[1]}\n{result[2] if len(result) > 2 else ''}"
    return tuple(result)


@pytest.mark.slow
def test_reader_and_writers_at_once(db_url: str) -> None:
    open_database(db_url).close()  # the file exists before the read-only reader opens it
    steps, events_per_step = 80, 20
    pipes, procs = [], []
    for tag in ("w1", "w2"):
        parent, child = CTX.Pipe()
        p = CTX.Process(
            target=db_workers.writer, args=(db_url, tag, steps, events_per_step, child), name=tag
        )
        pipes.append(parent)
        procs.append(p)
    rparent, rchild = CTX.Pipe()
    reader = CTX.Process(target=db_workers.reader, args=(db_url, True, TIMEOUT, rchild), name="r")
    reader.start()
    for p in procs:
        p.start()
    results = [_result(c, p) for c, p in zip(pipes, procs, strict=True)]
    rparent.send("stop")
    _, reads, seen = _result(rparent, reader)
    for p in [*procs, reader]:
        p.join(10)
        assert p.exitcode == 0
    assert reads >= 1
    db = open_database(db_url)
    with db.session() as s:
        runs = {r.id: r for r in repo.list_training_runs(s)}
        for _, rid, srid, recorded, dropped in results:
            assert (recorded, dropped) == (steps * events_per_step, 0)
            assert runs[rid].num_steps == steps and runs[rid].status == "finished"
            assert [x.step for x in repo.training_steps(s, rid)] == list(range(steps))
            assert len(repo.solver_events(s, srid)) == steps * events_per_step
            assert seen.get(rid, 0) <= steps
        assert len(repo.list_problems(s)) == 1  # both stored the same problem: one row
    db.close()


@pytest.mark.slow
def test_killed_writer_leaves_every_committed_row(db_url: str) -> None:
    rows_per_commit = 500
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=db_workers.victim, args=(db_url, rows_per_commit, child), name="v")
    proc.start()
    assert parent.poll(TIMEOUT), "the writer never started"
    _, rid, srid = parent.recv()
    committed = -1
    deadline = time.monotonic() + TIMEOUT
    while committed < 30 and time.monotonic() < deadline:
        if parent.poll(1.0):
            committed = parent.recv()
    assert committed >= 30, "the writer committed too little"
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)  # most likely inside a transaction (each is ~500 rows)
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    while parent.poll(0):
        committed = parent.recv()

    db = open_database(db_url)
    try:
        with db.session() as s:
            steps = [x.step for x in repo.training_steps(s, rid)]
            events = repo.solver_events(s, srid)
            if db.backend == "sqlite":
                assert s.execute(text("PRAGMA integrity_check")).scalar() == "ok"
        # every reported commit is there; at most one more committed before its report
        assert steps[: committed + 1] == list(range(committed + 1))
        assert len(steps) in (committed + 1, committed + 2)
        # no half transaction: every step has all its events
        assert len(events) == rows_per_commit * len(steps)
        # and the database takes new writes
        with db.session() as s:
            repo.finish_training_run(s, rid, status="killed")
    finally:
        db.close()


@pytest.mark.slow
def test_concurrent_first_open(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/fresh.db"
    pipes, procs = [], []
    for i in range(3):
        parent, child = CTX.Pipe()
        procs.append(CTX.Process(target=db_workers.opener, args=(url, child), name=f"o{i}"))
        pipes.append(parent)
    for p in procs:
        p.start()
    for c, p in zip(pipes, procs, strict=True):
        _result(c, p)
        p.join(10)
    with open_database(url).session() as s:
        assert s.execute(text("SELECT count(*) FROM optpipe_schema_version")).scalar() == 1


def test_forked_child_gets_its_own_connections(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    with db.session() as s:  # the parent holds a pooled connection now
        repo.store_problem(s, db_workers.PROBLEM)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with db.session() as s:
                rid = repo.start_solver_run(s, db_workers.PROBLEM.hash, "child", {})
            os.write(w, str(rid).encode())
        finally:
            os._exit(0)
    os.close(w)
    child_rid = int(os.read(r, 100) or b"0")
    os.close(r)
    os.waitpid(pid, 0)
    with db.session() as s:  # the parent's pool still works and sees the child's row
        assert [x.backend for x in repo.list_solver_runs(s)] == ["child"]
        assert s.execute(text("PRAGMA integrity_check")).scalar() == "ok"
    assert child_rid == 1
    db.close()
