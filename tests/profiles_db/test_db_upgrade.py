"""Issue 38: `optpipe db upgrade` is the one way to migrate (with a backup copy first); a schedule
is stored once by what it runs; a re-chunking is labelled by its chunking and linked to the
problem the user gave; `db import` takes a schedule file."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from alembic import command
from db_builders import make_fbw, make_problem
from typer.testing import CliRunner

from optpipe_lightning.cli.db_commands import app
from optpipe_lightning.profiles_db import OlderSchemaError, open_database
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.profiles_db.database import _alembic_config, head_revision

runner = CliRunner()


def _old_database(url: str, revision: str = "0003") -> int:
    """A database with one schedule, downgraded to ``revision``; the schedule's id."""
    db = open_database(url)
    with db.session() as s:
        sid = repo.store_schedule(s, make_fbw(make_problem()))
    with db.engine.begin() as conn:
        command.downgrade(_alembic_config(conn), revision)
    db.close()
    return sid


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_opening_an_older_database_never_migrates_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    _old_database(url)
    before = _sha(path)
    for read_only in (True, False):
        with pytest.raises(OlderSchemaError, match=r"run `optpipe db upgrade --db sqlite:///"):
            open_database(url, read_only=read_only)
    assert _sha(path) == before
    result = runner.invoke(app, ["list", "--db", url])
    assert result.exit_code == 2 and "optpipe db upgrade" in result.stderr


def test_db_upgrade_copies_the_file_first_then_migrates_keeping_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    sid = _old_database(url)
    before = _sha(path)
    result = runner.invoke(app, ["upgrade", "--db", url])
    assert result.exit_code == 0, result.output
    backup = tmp_path / "old.db.0003.bak"
    assert f"from schema revision 0003 to {head_revision()}" in result.stdout
    assert str(backup) in result.stdout
    with sqlite3.connect(backup) as conn:  # the copy is the old database, as it was
        assert conn.execute("SELECT version_num FROM optpipe_schema_version").fetchone() == (
            "0003",
        )
        assert conn.execute("SELECT count(*) FROM schedules").fetchone() == (1,)
    assert _sha(path) != before
    with open_database(url, read_only=True) as db, db.session() as s:
        assert [r.id for r in repo.list_schedules(s)] == [sid]
    again = runner.invoke(app, ["upgrade", "--db", url])
    assert again.exit_code == 0 and "nothing to do" in again.stdout
    assert not (tmp_path / "old.db.0003.2.bak").exists()


def test_the_migration_gives_old_schedules_their_content_digest(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    sid = _old_database(url)
    runner.invoke(app, ["upgrade", "--db", url])
    again = make_fbw(make_problem(), generator="found-again")  # same actions, another name
    with open_database(url) as db, db.session() as s:
        assert repo.store_schedule(s, again) == sid


def test_db_upgrade_of_a_missing_file_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["upgrade", "--db", f"sqlite:///{tmp_path / 'none.db'}"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert not list(tmp_path.iterdir())


def test_the_same_schedule_is_stored_once_whatever_its_parameters(sqlite_url: str) -> None:
    p = make_problem()
    first = make_fbw(p).model_copy(update={"params": {"seed": 0, "solve_seconds": 1.0}})
    second = make_fbw(p, generator="optpipe").model_copy(update={"params": {"seed": 1}})
    with open_database(sqlite_url) as db, db.session() as s:
        a = repo.store_schedule(s, first, source="solver")
        b = repo.store_schedule(s, second, source="solver")
        assert a == b and len(repo.list_schedules(s)) == 1


def test_a_rechunking_is_labelled_by_its_chunking_and_listed_with_the_given_problem(
    sqlite_url: str,
) -> None:
    given = make_problem(v=1, name="2 chunks per stage")
    ran = make_problem(v=2, placement="vshape")
    sched = make_fbw(ran).model_copy(update={"problem": ran})
    with open_database(sqlite_url) as db, db.session() as s:
        repo.store_problem(s, ran)  # stored before on its own: linked now
        sid = repo.store_schedule(s, sched, source="solver", given=given)
        rows = {r.hash: r for r in repo.list_problems(s)}
        assert rows[ran.hash].given_hash == given.hash
        assert rows[ran.hash].name == "v=2 vshape re-chunking of 2 chunks per stage"
        assert rows[given.hash].given_hash is None
        assert rows[given.hash].num_schedules == 1  # its re-chunking's schedule counts
        assert rows[given.hash].best_makespan == rows[ran.hash].best_makespan
        assert repo.list_schedules(s, given.hash) == []
        listed = repo.list_schedules(s, given.hash, with_rechunkings=True)
        assert [r.id for r in listed] == [sid]


def test_db_import_takes_a_schedule_file(tmp_path: Path, sqlite_url: str) -> None:
    p = make_problem()
    f = tmp_path / "gpipe.json"
    f.write_text(make_fbw(p, generator="gpipe").model_copy(update={"problem": p}).to_json())
    result = runner.invoke(app, ["import", str(f), "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "imported: schedule 1 (gpipe)" in result.stderr
    again = runner.invoke(app, ["import", str(f), "--db", sqlite_url])
    assert "already stored: schedule 1" in again.stderr
    bare = tmp_path / "bare.json"
    bare.write_text(make_fbw(p).model_copy(update={"problem": None}).to_json())
    refused = runner.invoke(app, ["import", str(bare), "--db", sqlite_url])
    assert refused.exit_code == 2 and "does not embed its problem" in refused.stderr


def test_db_list_shows_bytes_in_the_one_byte_unit(sqlite_url: str) -> None:
    with open_database(sqlite_url) as db, db.session() as s:
        repo.store_problem(s, make_problem(memory_limit=7.30144e10))
    result = runner.invoke(app, ["list", "problems", "--db", sqlite_url])
    assert result.exit_code == 0, result.output
    assert "73.01 GB" in result.stdout and "e+" not in result.stdout
    as_json = runner.invoke(app, ["list", "problems", "--json", "--db", sqlite_url])
    assert json.loads(as_json.stdout)["problems"][0]["memory_limit"] == 7.30144e10  # JSON: bytes
