"""Process bodies for the reliability tests (a module of their own so spawned children import
only this, not pytest's test module). Each reports through a multiprocessing connection."""

from __future__ import annotations

import time
import traceback
from multiprocessing.connection import Connection
from types import SimpleNamespace

from sqlalchemy import insert

from optpipe_lightning.profiles_db import SolverEventRecorder, open_database
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.profiles_db.models import SolverEventRecord
from optpipe_lightning.schedule import Problem
from optpipe_lightning.schedule.profile import HardwareFingerprint, ModelFingerprint

PROBLEM = Problem(num_stages=2, num_microbatches=4, t_f=1.0, t_b=1.0, t_w=0.5)


def fingerprints(tag: str) -> tuple[HardwareFingerprint, ModelFingerprint]:
    hw = HardwareFingerprint(device_kind="cpu", device_count=2, device_memory=0)
    mf = ModelFingerprint(name=tag, layer_structure=["Linear"] * 4, microbatch_size=1, num_stages=2)
    return hw, mf


def writer(url: str, tag: str, steps: int, events_per_step: int, out: Connection) -> None:
    """Training steps, each in its own short transaction, plus solver events from a recorder."""
    try:
        db = open_database(url)
        hw, mf = fingerprints(tag)
        with db.session() as s:
            h = repo.store_problem(s, PROBLEM)  # both writers store the same problem
            rid = repo.start_training_run(s, hardware=hw, model=mf, config={"tag": tag})
            srid = repo.start_solver_run(s, h, tag, {})
        with SolverEventRecorder(db, srid, flush_every=0.01, batch=32) as rec:
            for i in range(steps):
                with db.session() as s:
                    repo.record_step(
                        s,
                        rid,
                        step=i,
                        measured_seconds=0.1,
                        predicted_seconds=0.1,
                        schedule_id=None,
                        peak_memory=[1.0, 2.0],
                    )
                for j in range(events_per_step):
                    rec(SimpleNamespace(wall_time=i + j * 1e-3, makespan=1e6 - i, bound=float(i)))
        with db.session() as s:
            repo.finish_training_run(s, rid, status="finished")
        db.close()
        out.send(("ok", rid, srid, rec.recorded, rec.dropped))
    except BaseException as e:
        out.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))


def reader(url: str, read_only: bool, stop_after: float, out: Connection) -> None:
    """Poll what the writers wrote (the inspector's reads): counts only ever grow."""
    try:
        db = open_database(url, read_only=read_only)
        seen: dict[int, int] = {}
        reads = 0
        deadline = time.monotonic() + stop_after
        while time.monotonic() < deadline:
            with db.session() as s:
                for run in repo.list_training_runs(s):
                    n = len(repo.training_steps(s, run.id))
                    if n < seen.get(run.id, 0) or n != run.num_steps:
                        raise AssertionError(f"run {run.id}: {n} steps after {seen.get(run.id)}")
                    seen[run.id] = n
                for srun in repo.list_solver_runs(s):
                    repo.solver_events(s, srun.id)
            reads += 1
            if out.poll():  # the parent says: writers are done
                out.recv()
                break
        db.close()
        out.send(("ok", reads, seen))
    except BaseException as e:
        out.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))


def victim(url: str, rows_per_commit: int, out: Connection) -> None:
    """Write forever, one step plus ``rows_per_commit`` events per transaction; report commits."""
    db = open_database(url)
    hw, mf = fingerprints("victim")
    with db.session() as s:
        h = repo.store_problem(s, PROBLEM)
        rid = repo.start_training_run(s, hardware=hw, model=mf, config={})
        srid = repo.start_solver_run(s, h, "victim", {})
    out.send(("ready", rid, srid))
    i = 0
    while True:
        with db.session() as s:
            repo.record_step(
                s,
                rid,
                step=i,
                measured_seconds=0.1,
                predicted_seconds=None,
                schedule_id=None,
                peak_memory=[float(i)],
            )
            s.execute(
                insert(SolverEventRecord),
                [
                    {"run_id": srid, "wall_time": float(i), "makespan": 1.0, "bound": 0.0}
                    for _ in range(rows_per_commit)
                ],
            )
        out.send(i)  # only after the commit
        i += 1


def opener(url: str, out: Connection) -> None:
    """Open (creating and migrating) at the same moment as others."""
    try:
        open_database(url).close()
        out.send(("ok",))
    except BaseException as e:
        out.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
