"""Repository functions on SQLite and (when available) PostgreSQL: round trips, reuse rules."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from db_builders import fused_rows, hardware, make_fbw, make_problem, make_profile, model_fp
from sqlalchemy import PickleType, select, text, update

from optpipe_lightning.profiles_db import (
    Database,
    DatabaseError,
    NotFoundError,
    SolverEventRecorder,
    open_database,
)
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.profiles_db.models import (
    Base,
    ProfileRecord,
    ScheduleRecord,
    SolverRunRecord,
)
from optpipe_lightning.profiles_db.transfer import ExportDocument, export_document, import_document
from optpipe_lightning.schedule import evaluate
from optpipe_lightning.schedule.baselines import make_schedule


def _iso(dt: datetime) -> str:
    return dt.isoformat()


# ---- problems and schedules ------------------------------------------------------------------


def test_problem_round_trip_and_idempotent(db: Database) -> None:
    p = make_problem(name="first")
    with db.session() as s:
        assert repo.store_problem(s, p) == p.hash
        assert repo.store_problem(s, p.with_changes(name="renamed")) == p.hash
    with db.session() as s:
        got = repo.get_problem(s, p.hash)
        assert got == p  # the first stored spelling stays
        assert repo.get_problem(s, "0" * 16) is None
        rows = repo.list_problems(s)
    assert [(r.hash, r.num_schedules, r.best_makespan) for r in rows] == [(p.hash, 0, None)]


def test_schedule_round_trip_dedup_and_evaluation(db: Database) -> None:
    p = make_problem(p=3, m=5, v=2)
    sched = make_fbw(p)
    with db.session() as s:
        sid = repo.store_schedule(s, sched)
        assert repo.store_schedule(s, sched, source="solver") == sid  # same schedule: same id
    with db.session() as s:
        got = repo.get_schedule(s, sid)
    assert got == sched  # actions, evaluation and embedded problem
    assert got.evaluation is not None and got.evaluation.makespan == sched.evaluation.makespan  # type: ignore[union-attr]

    # no evaluation given: the simulator's is stored
    bare = sched.model_copy(update={"evaluation": None, "problem": None, "generator": "bare"})
    with db.session() as s:
        sid2 = repo.store_schedule(s, bare)  # the problem comes from the database
        row = next(r for r in repo.list_schedules(s, p.hash) if r.id == sid2)
        got2 = repo.get_schedule(s, sid2)
    expected = evaluate(p, sched)
    assert row.makespan == pytest.approx(expected.makespan)
    assert row.feasible is True and got2.evaluation == expected


def test_schedule_needs_its_problem(db: Database) -> None:
    p, other = make_problem(), make_problem(t_f=2.0)
    sched = make_fbw(p)
    with db.session() as s, pytest.raises(ValueError, match=r"not .*pass the problem"):
        repo.store_schedule(s, sched, problem=other)
    with db.session() as s, pytest.raises(ValueError, match="not in the database"):
        repo.store_schedule(s, sched.model_copy(update={"problem": None}))
    with db.session() as s, pytest.raises(NotFoundError, match="no schedule with id 999"):
        repo.get_schedule(s, 999)


def test_best_schedule_and_listing_order(db: Database) -> None:
    p = make_problem(p=4, m=8, memory_limit=5.0)  # m_f=1: the fbw order needs 8, fused 8 too
    roomy = p.with_changes(memory_limit=None)
    fbw = make_fbw(p, "fbw")  # infeasible under the limit: all F first
    with db.session() as s:
        assert repo.best_schedule(s, p.hash) is None
        infeasible_id = repo.store_schedule(s, fbw)
        assert repo.best_schedule(s, p.hash) is None  # only infeasible
        any_id, _ = repo.best_schedule(s, p.hash, feasible_only=False)  # type: ignore[misc]
        assert any_id == infeasible_id
        # two feasible ones for the roomy problem: the shorter wins
        slow = make_schedule(roomy, "gpipe-fused", fused_rows(4, 8))
        fast = make_fbw(roomy, "fbw")
        slow_id = repo.store_schedule(s, slow)
        fast_id = repo.store_schedule(s, fast)
    assert not fbw.evaluation.feasible  # type: ignore[union-attr]
    assert fast.evaluation.makespan < slow.evaluation.makespan  # type: ignore[union-attr,operator]
    with db.session() as s:
        best = repo.best_schedule(s, roomy.hash)
        assert best is not None and best[0] == fast_id and best[1] == fast
        assert [r.id for r in repo.list_schedules(s, roomy.hash)] == [fast_id, slow_id]
        stats = {r.hash: r for r in repo.list_problems(s)}
    assert stats[roomy.hash].num_schedules == 2
    assert stats[roomy.hash].best_makespan == pytest.approx(fast.evaluation.makespan)  # type: ignore[union-attr]
    assert stats[p.hash].num_schedules == 1 and stats[p.hash].best_makespan is None


# ---- profiles: the reuse rules -----------------------------------------------------------------


def test_exact_fingerprint_match_reuses(db: Database) -> None:
    prof = make_profile()
    with db.session() as s:
        pid = repo.store_profile(s, prof)
        assert repo.store_profile(s, prof) == pid  # idempotent
    with db.session() as s:
        # another host with identical hardware, and a renamed model: same keys, reused
        got = repo.find_profile(s, hardware(hostname="node-b"), model_fp(name="renamed"))
        assert got == prof
        assert len(repo.list_profiles(s)) == 1


@pytest.mark.parametrize(
    "hw_change,mf_change",
    [
        ({"torch_version": "2.12.0"}, {}),
        ({"device_kind": "NVIDIA A100-SXM4-80GB"}, {}),
        ({"device_count": 8}, {}),
        ({}, {"dtype": "float32"}),
        ({}, {"microbatch_size": 4}),
    ],
    ids=["torch-version", "device-kind", "device-count", "dtype", "microbatch"],
)
def test_different_fingerprint_does_not_reuse(
    db: Database, hw_change: dict[str, object], mf_change: dict[str, object]
) -> None:
    with db.session() as s:
        repo.store_profile(s, make_profile())
    with db.session() as s:
        assert repo.find_profile(s, hardware(**hw_change), model_fp(**mf_change)) is None
        assert repo.find_profile(s, hardware(), model_fp()) is not None


def test_stale_profile_is_not_returned_and_newer_refreshes(db: Database) -> None:
    now = datetime.now(UTC)
    old = make_profile(t_f=0.01, measured_at=_iso(now - timedelta(days=10)))
    with db.session() as s:
        repo.store_profile(s, old)
    with db.session() as s:
        hw, mf = hardware(), model_fp()
        assert repo.find_profile(s, hw, mf) == old  # no age limit: reused
        assert repo.find_profile(s, hw, mf, max_age_seconds=86400) is None  # stale
    fresh = make_profile(t_f=0.02, measured_at=_iso(now - timedelta(minutes=1)))
    with db.session() as s:
        repo.store_profile(s, fresh)
    with db.session() as s:
        assert repo.find_profile(s, hw, mf, max_age_seconds=86400) == fresh
        # storing an even older profile afterwards does not override the newer one
        repo.store_profile(s, make_profile(t_f=0.03, measured_at=_iso(now - timedelta(days=20))))
    with db.session() as s:
        assert repo.find_profile(s, hw, mf) == fresh
        # a profile without measured_at counts as measured when stored: newest
        undated = make_profile(t_f=0.04)
        repo.store_profile(s, undated)
    with db.session() as s:
        assert repo.find_profile(s, hw, mf, max_age_seconds=60) == undated
        assert len(repo.list_profiles(s)) == 4


def test_bad_measured_at_is_a_clear_error(db: Database) -> None:
    with db.session() as s, pytest.raises(ValueError, match="not an ISO-8601 time"):
        repo.store_profile(s, make_profile(measured_at="yesterday"))


# ---- solver runs -------------------------------------------------------------------------------


def test_solver_run_and_recorder(db: Database) -> None:
    p = make_problem()
    with db.session() as s:
        repo.store_problem(s, p)
        rid = repo.start_solver_run(s, p.hash, "cp-sat", {"time_limit": 10, "workers": 2})
        with pytest.raises(NotFoundError, match="store_problem"):
            repo.start_solver_run(s, "f" * 16, "cp-sat", {})
    n_threads, per_thread = 4, 500
    with SolverEventRecorder(db, rid, flush_every=0.05, batch=64) as rec:

        def feed(k: int) -> None:
            for i in range(per_thread):
                t = k * per_thread + i
                rec(SimpleNamespace(wall_time=t * 1e-3, makespan=1000.0 - t, bound=10.0 + t))

        threads = [threading.Thread(target=feed, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rec(SimpleNamespace(wall_time=99.0, makespan=None, bound=None))  # bound-less report
    total = n_threads * per_thread
    assert rec.recorded == total + 1 and rec.dropped == 0
    with db.session() as s:
        events = repo.solver_events(s, rid)
        run = repo.list_solver_runs(s, p.hash)[0]
    assert len(events) == total + 1
    assert [e.wall_time for e in events[:total]] == pytest.approx([t * 1e-3 for t in range(total)])
    assert events[-1].makespan is None
    # progress followed the events while running: best makespan and highest bound
    assert run.num_events == total + 1 and run.status == "running"
    assert run.makespan == 1000.0 - (total - 1) and run.lower_bound == 10.0 + (total - 1)
    sched = make_fbw(p)
    with db.session() as s:
        sid = repo.store_schedule(s, sched, source="solver")
        repo.finish_solver_run(
            s, rid, status="optimal", makespan=12.5, lower_bound=12.0, schedule_id=sid
        )
    with db.session() as s:
        row = repo.get_solver_run(s, rid)
    assert (row.status, row.makespan, row.lower_bound, row.schedule_id) == (
        "optimal",
        12.5,
        12.0,
        sid,
    )
    assert row.finished_at is not None and row.finished_at >= row.started_at


def test_recorder_survives_a_missing_run(db: Database) -> None:
    rec = SolverEventRecorder(db, 4242, flush_every=0.05)  # no such run: FK violation
    rec(SimpleNamespace(wall_time=0.1, makespan=5.0, bound=1.0))
    rec.close()  # background path: logged, counted, not raised
    assert rec.recorded == 0 and rec.dropped == 1
    rec(SimpleNamespace(wall_time=0.2, makespan=5.0, bound=1.0))  # after close: dropped
    assert rec.dropped == 2


# ---- training runs -----------------------------------------------------------------------------


def test_training_run_steps_and_switches(db: Database) -> None:
    p = make_problem()
    with db.session() as s:
        a = repo.store_schedule(s, make_fbw(p, "a"))
        b = repo.store_schedule(s, make_schedule(p, "b", fused_rows(4, 8)))
        rid = repo.start_training_run(
            s, hardware=hardware(), model=model_fp(), config={"lr": 1e-3, "steps": 3}
        )
    for step in range(3):
        with db.session() as s:
            repo.record_step(
                s,
                rid,
                step=step,
                measured_seconds=0.5 + step,
                predicted_seconds=None if step == 0 else 0.4,
                schedule_id=a if step < 2 else b,
                peak_memory=[1e9, 2e9, 3e9, 4e9],
            )
    with db.session() as s:
        repo.record_switch(s, rid, step=2, from_schedule_id=a, to_schedule_id=b, reason="better")
        repo.finish_training_run(s, rid, status="finished")
    with db.session() as s:
        runs = repo.list_training_runs(s)
        steps = repo.training_steps(s, rid)
        switches = repo.schedule_switches(s, rid)
    assert [(r.id, r.status, r.num_steps) for r in runs] == [(rid, "finished", 3)]
    assert runs[0].config == {"lr": 1e-3, "steps": 3} and runs[0].model_name == "gpt-small"
    assert [(x.step, x.measured_seconds, x.predicted_seconds, x.schedule_id) for x in steps] == [
        (0, 0.5, None, a),
        (1, 1.5, 0.4, a),
        (2, 2.5, 0.4, b),
    ]
    assert steps[0].peak_memory == (1e9, 2e9, 3e9, 4e9)
    assert [(x.step, x.from_schedule_id, x.to_schedule_id, x.reason) for x in switches] == [
        (2, a, b, "better")
    ]
    with db.session() as s, pytest.raises(ValueError, match="JSON-serialisable"):
        repo.start_training_run(s, hardware=hardware(), model=model_fp(), config={"f": object()})


# ---- storage format ----------------------------------------------------------------------------


def test_stored_as_json_never_pickle(db: Database) -> None:
    p = make_problem()
    sched, prof = make_fbw(p), make_profile()
    assert not any(
        isinstance(c.type, PickleType) for t in Base.metadata.tables.values() for c in t.columns
    )
    with db.session() as s:
        sid = repo.store_schedule(s, sched)
        pid = repo.store_profile(s, prof)
        data = s.scalar(select(ScheduleRecord.data).where(ScheduleRecord.id == sid))
        pdata = s.scalar(select(ProfileRecord.data).where(ProfileRecord.id == pid))
    assert json.loads(data)["actions"][0][0] == {"op": "F", "mb": 0, "chunk": 0}  # type: ignore[arg-type]
    assert json.loads(pdata)["hardware"]["torch_version"] == "2.13.0"  # type: ignore[arg-type]
    # validated on the way out: a damaged row is a DatabaseError naming the field
    with db.session() as s:
        bad = json.loads(data)  # type: ignore[arg-type]
        bad["actions"][0][0]["op"] = "X"
        s.execute(
            update(ScheduleRecord).where(ScheduleRecord.id == sid).values(data=json.dumps(bad))
        )
    with (
        db.session() as s,
        pytest.raises(DatabaseError, match=r"stored schedule .* fails validation"),
    ):
        repo.get_schedule(s, sid)


def test_session_rolls_back_on_error(db: Database) -> None:
    p = make_problem()
    with pytest.raises(RuntimeError), db.session() as s:
        repo.store_problem(s, p)
        raise RuntimeError("boom")
    with db.session() as s:
        assert repo.get_problem(s, p.hash) is None
        assert s.execute(text("SELECT 1")).scalar() == 1


# ---- prune and transfer ------------------------------------------------------------------------


def test_prune_rules(db: Database) -> None:
    p = make_problem()
    roomy = [p.with_changes(t_f=1.0 + k / 10) for k in range(3)]
    with db.session() as s:
        ids = [repo.store_schedule(s, make_fbw(q)) for q in roomy]  # 3 problems, 1 each
        worse = [repo.store_schedule(s, make_schedule(roomy[0], f"g{k}", fused_rows(4, 8)))
                 for k in range(1)]  # fmt: skip
        extra = repo.store_schedule(s, make_schedule(roomy[1], "used", fused_rows(4, 8)))
        old_run = repo.start_solver_run(s, roomy[0].hash, "x", {})
        repo.finish_solver_run(s, old_run, status="done", makespan=1.0, lower_bound=1.0,
                               schedule_id=None)  # fmt: skip
        live_run = repo.start_solver_run(s, roomy[1].hash, "x", {})
        repo.finish_solver_run(s, live_run, status="done", makespan=1.0, lower_bound=1.0,
                               schedule_id=extra)  # fmt: skip
        s.execute(
            update(SolverRunRecord)
            .where(SolverRunRecord.id == old_run)
            .values(started_at=datetime.now(UTC) - timedelta(days=40))
        )
    with db.session() as s:
        dry = repo.prune(s, keep_schedules=1, older_than_seconds=30 * 86400, dry_run=True)
    assert (dry.schedules, dry.solver_runs, dry.profiles) == (1, 1, 0)
    with db.session() as s:
        assert len(repo.list_schedules(s)) == 5  # dry run deleted nothing
        report = repo.prune(s, keep_schedules=1, older_than_seconds=30 * 86400)
    assert (report.schedules, report.solver_runs) == (1, 1)
    with db.session() as s:
        left = {r.id for r in repo.list_schedules(s)}
        runs = [r.id for r in repo.list_solver_runs(s)]
    assert left == {*ids, extra} and worse[0] not in left  # "used" is referenced: kept
    assert runs == [live_run]


def test_export_import_to_sqlite(db: Database, tmp_path: object) -> None:
    p = make_problem()
    with db.session() as s:
        repo.store_schedule(s, make_fbw(p))
        repo.store_profile(s, make_profile())
    with db.session() as s:
        doc = export_document(s)
    target = open_database(f"sqlite:///{tmp_path}/copy.db")
    with target.session() as s:
        counts = import_document(s, ExportDocument.model_validate_json(doc.model_dump_json()))
    with target.session() as s:
        again = import_document(s, doc)
        assert repo.find_profile(s, hardware(), model_fp()) == make_profile()
        best = repo.best_schedule(s, p.hash)
    target.close()
    assert (counts.problems, counts.schedules, counts.profiles) == (1, 1, 1)
    assert (again.problems, again.schedules, again.profiles) == (0, 0, 0)
    assert best is not None and best[1] == make_fbw(p)
