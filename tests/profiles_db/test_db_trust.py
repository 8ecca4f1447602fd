"""The database trusts nothing it is given: forged evaluations, out-of-range numbers, profiles
that cannot serve their model, tampered rows, dead owners, a FIFO in place of the file."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from db_builders import hardware, make_fbw, make_problem, make_profile, model_fp
from sqlalchemy import text
from typer.testing import CliRunner

from optpipe_lightning.cli.db_commands import app
from optpipe_lightning.profiles_db import Database, DatabaseError, open_database
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.profiles_db.owners import current_owner, owner_alive
from optpipe_lightning.profiles_db.transfer import export_document
from optpipe_lightning.profiles_db.validation import profile_defect
from optpipe_lightning.schedule import Action, Schedule
from optpipe_lightning.schedule.profile import Profile

runner = CliRunner()


def _export_with_schedule(db: Database) -> dict[str, object]:
    p = make_problem()
    with db.session() as s:
        repo.store_schedule(s, make_fbw(p))
        repo.store_profile(s, make_profile())
    with db.session() as s:
        return json.loads(export_document(s).model_dump_json())


def _import(path: Path, url: str) -> tuple[int, str]:
    res = runner.invoke(app, ["import", str(path), "--db", url])
    return res.exit_code, res.stderr


def _counts(url: str) -> tuple[int, int, int]:
    db = open_database(url)
    with db.session() as s:
        got = (len(repo.list_problems(s)), len(repo.list_schedules(s)), len(repo.list_profiles(s)))
    db.close()
    return got


def _deadlocked(doc: dict[str, object]) -> None:
    """Stage 0 runs its backwards before its forwards: a deadlock, claimed fast and feasible."""
    sched = doc["schedules"][0]["schedule"]  # type: ignore[index]
    row = sched["actions"][0]
    sched["actions"][0] = row[len(row) // 3 :] + row[: len(row) // 3]
    sched["evaluation"].update(feasible=True, makespan=1e-9, violations=[])


def _huge_mb(doc: dict[str, object]) -> None:
    doc["schedules"][0]["schedule"]["actions"][0][0]["mb"] = 2**64  # type: ignore[index]


def _one_stage_profile(doc: dict[str, object]) -> None:
    doc["profiles"][0]["stages"] = doc["profiles"][0]["stages"][:1]  # type: ignore[index]


def _string_times(doc: dict[str, object]) -> None:
    doc["problems"][0]["t_f"] = "1.5"  # type: ignore[index]


LIES = {
    "deadlocked schedule claiming feasible in 1e-9 s": (_deadlocked, "deadlock"),
    "action mb 2**64": (_huge_mb, "action mb must be an integer from 0"),
    "a profile of one stage for a four-stage model": (_one_stage_profile, "(stage 1, chunk 0)"),
    "a time given as a string": (_string_times, "t_f"),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_import_refuses_each_lie_with_one_line_and_stores_nothing(
    lie: str, tmp_path: Path, sqlite_url: str
) -> None:
    source = open_database(f"sqlite:///{tmp_path}/source.db")
    doc = _export_with_schedule(source)
    source.close()
    mutate, needle = LIES[lie]
    mutate(doc)
    path = tmp_path / "lie.json"
    path.write_text(json.dumps(doc))
    code, err = _import(path, sqlite_url)
    assert code == 2, err
    assert err.startswith("optpipe: error: ") and err.count("\n") == 1, err
    assert needle in err, err
    assert _counts(sqlite_url) == (0, 0, 0)  # all or nothing


def test_import_refuses_nan_limit_written_as_a_literal(tmp_path: Path, sqlite_url: str) -> None:
    source = open_database(f"sqlite:///{tmp_path}/source.db")
    doc = _export_with_schedule(source)
    source.close()
    doc["problems"][0]["memory_limit"] = 123456789.0  # type: ignore[index]
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(doc).replace("123456789.0", "NaN"))
    code, err = _import(path, sqlite_url)
    assert code == 2 and "NaN is not a JSON number" in err and err.count("\n") == 1, err
    assert _counts(sqlite_url) == (0, 0, 0)


def test_store_schedule_never_trusts_a_claimed_evaluation(db: Database) -> None:
    p = make_problem()
    good = make_fbw(p)
    assert good.evaluation is not None
    forged = good.with_evaluation(good.evaluation.model_copy(update={"makespan": 1.0}))
    claim = "claims makespan 1, but the simulator times it at"
    with pytest.raises(ValueError, match=claim), db.session() as s:
        repo.store_schedule(s, forged, problem=p)
    bare = good.model_copy(update={"evaluation": None})
    with db.session() as s:
        sid = repo.store_schedule(s, bare, problem=p)
        assert repo.get_schedule(s, sid).evaluation == good.evaluation


def test_profile_defects_are_named() -> None:
    good = make_profile()
    assert profile_defect(good) is None
    cases = {
        "no measurements for (stage 3, chunk 0)": {"stages": good.stages[:3]},
        "measures (stage 0, chunk 0) twice": {"stages": [*good.stages, good.stages[0]]},
        "measures (stage 7, chunk 0)": {
            "stages": [*good.stages[:3], good.stages[3].model_copy(update={"stage": 7})]
        },
        "partition has 3 layer groups": {"model": model_fp(partition=[3, 3, 4])},
        "holds 11 layers": {"model": model_fp(partition=[3, 3, 2, 3])},
        "measures the 'interleaved' placement, but its model fingerprint says 'vshape'": {
            "model": model_fp(placement="vshape")
        },
        "device_kind is 300 characters long": {"hardware": hardware(device_kind="x" * 300)},
        "does not fit in a BIGINT": {"hardware": hardware(device_memory=2**64)},
        "not an ISO-8601 time": {"measured_at": "yesterday"},
        "make no valid problem: t_comm": {"p2p_seconds": 1e9},  # beyond 1e6 s
    }
    for needle, change in cases.items():
        got = profile_defect(good.model_copy(update=change))
        assert got is not None and needle in got, (needle, got)


def test_find_profile_skips_what_cannot_serve_the_model_with_a_warning(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    older = make_profile(measured_at="2025-01-01T00:00:00+00:00")
    with db.session() as s:
        repo.store_profile(s, older)
        with pytest.raises(ValueError, match="no measurements for"):
            repo.store_profile(s, older.model_copy(update={"stages": older.stages[:1]}))
    # a damaged newer row written behind the repository's back (another tool, an old version)
    newer = make_profile(measured_at="2025-06-01T00:00:00+00:00")
    broken = newer.model_copy(update={"stages": newer.stages[:1]})
    with db.session() as s:
        pid = repo.store_profile(s, newer)
        s.execute(
            text("UPDATE profiles SET data = :d WHERE id = :i"),
            {"d": broken.model_dump_json(), "i": pid},
        )
    with caplog.at_level(logging.WARNING, "optpipe_lightning.profiles_db"), db.session() as s:
        got = repo.find_profile(s, hardware(), model_fp())
    assert got == older
    assert f"skipping stored profile {pid}" in caplog.text and "(stage 1, chunk 0)" in caplog.text


def _check(url: str) -> tuple[int, str, str]:
    res = runner.invoke(app, ["check", "--db", url])
    return res.exit_code, res.stdout, res.stderr


def test_check_verifies_the_schema_and_every_table(tmp_path: Path) -> None:
    path = tmp_path / "optpipe.db"
    url = f"sqlite:///{path}"
    db = open_database(url)
    p = make_problem()
    with db.session() as s:
        sid = repo.store_schedule(s, make_fbw(p))
        repo.store_profile(s, make_profile())
        rid = repo.start_solver_run(s, p.hash, "cp-sat", {})
        repo.finish_solver_run(
            s, rid, status="feasible", makespan=1.0, lower_bound=1.0, schedule_id=sid
        )
    db.close()
    code, out, err = _check(url)
    assert code == 0 and out.startswith("ok: "), err

    def tampered(sql: str, needle: str) -> None:
        copy = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}.db"  # a fresh WAL each time
        copy.write_bytes(path.read_bytes())
        with sqlite3.connect(copy) as c:
            c.executescript(sql)
        code, _, err = _check(f"sqlite:///{copy}")
        assert code == 2 and err.count("\n") == 1 and needle in err, (sql, err)

    tampered("DROP TABLE solver_events", "table solver_events is missing")
    tampered("DROP INDEX ix_schedules_best", "index ix_schedules_best is missing")
    tampered("UPDATE schedules SET makespan = 1e-9, feasible = 1", "key columns")
    tampered(
        "UPDATE schedules SET data = replace(data, '\"makespan\":', '\"makespan\":0.5e-9+')",
        f"schedules row {sid}",
    )
    tampered("UPDATE problems SET data = replace(data, '\"t_f\":1.0', '\"t_f\":2.0')", "hashes to")
    tampered(
        "UPDATE hardware_fingerprints SET data = replace(data, 'nvlink', 'pcie')", "its JSON's key"
    )


def test_a_run_whose_process_is_gone_reads_interrupted(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    p = make_problem()
    with db.session() as s:
        repo.store_problem(s, p)
    db.close()
    # a solve that another process started and never finished (killed, crashed)
    child = (
        "import sys; from optpipe_lightning.profiles_db import open_database, repository as r\n"
        "db = open_database(sys.argv[1])\n"
        "with db.session() as s: print(r.start_solver_run(s, sys.argv[2], 'cp-sat', {}))\n"
        "import os; os._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", child, sqlite_url, p.hash],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    dead = int(out.stdout.strip())
    db = open_database(sqlite_url)
    with db.session() as s:
        assert repo.get_solver_run(s, dead).status == "interrupted"  # seen, not yet stored
        live = repo.start_solver_run(s, p.hash, "cp-sat", {})  # a writer stores it
        assert repo.get_solver_run(s, live).status == "running"
    with db.session() as s:
        status, finished = s.execute(
            text("SELECT status, finished_at FROM solver_runs WHERE id = :i"), {"i": dead}
        ).one()
    db.close()
    assert status == "interrupted" and finished is not None
    assert owner_alive(current_owner()) is True
    host = current_owner().split("|")[0]
    assert owner_alive(f"{host}||{2**22 + 12345}|") is False  # no such pid
    assert owner_alive("elsewhere|x|1|2") is None and owner_alive(None) is None


def test_a_fifo_as_the_database_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "optpipe.db"
    os.mkfifo(fifo)
    got: list[str] = []

    def open_it() -> None:
        with pytest.raises(DatabaseError) as e:
            open_database(f"sqlite:///{fifo}")
        got.append(str(e.value))

    t = threading.Thread(target=open_it, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "open_database hung on a FIFO"
    assert "not a regular file" in got[0]
    res = runner.invoke(app, ["list", "--db", f"sqlite:///{fifo}"])
    assert res.exit_code == 2 and "not a regular file" in res.stderr


def test_export_then_import_still_round_trips(tmp_path: Path, sqlite_url: str) -> None:
    source = open_database(f"sqlite:///{tmp_path}/source.db")
    doc = _export_with_schedule(source)
    source.close()
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    code, err = _import(path, sqlite_url)
    assert code == 0, err
    assert _counts(sqlite_url) == (1, 1, 1)
    db = open_database(sqlite_url)
    with db.session() as s:
        best = repo.best_schedule(s, make_problem().hash)
        assert best is not None
        got, prof = best[1], repo.list_profiles(s)[0]
        assert isinstance(got, Schedule) and got.actions[0][0] == Action("F", 0)
        assert isinstance(repo.get_profile(s, prof.id), Profile)
    db.close()


def test_a_solve_that_fails_never_leaves_its_run_running(tmp_path: Path, sqlite_url: str) -> None:
    from optpipe_lightning.cli import app as optpipe

    pb = make_problem(memory_limit=0.25)  # below one activation: nothing fits
    path = tmp_path / "p.json"
    path.write_text(pb.model_dump_json())
    res = runner.invoke(optpipe, ["solve", str(path), "--db", sqlite_url, "--time-limit", "2"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    db = open_database(sqlite_url)
    with db.session() as s:
        runs = repo.list_solver_runs(s)
    db.close()
    assert [(r.status, r.finished_at is not None) for r in runs] == [("failed", True)]
