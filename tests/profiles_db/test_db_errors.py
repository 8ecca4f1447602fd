"""Each way a database can be unusable gives one clear ``DatabaseError`` line, never damage."""

from __future__ import annotations

import logging
import os
import random
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from db_builders import make_fbw, make_problem
from sqlalchemy import create_engine, text

from optpipe_lightning.profiles_db import (
    Database,
    DatabaseError,
    default_database_path,
    default_database_url,
    head_revision,
    open_database,
    try_open_database,
)
from optpipe_lightning.profiles_db import repository as repo
from optpipe_lightning.profiles_db.models import VERSION_TABLE


def _error(fn: Callable[[], object]) -> str:
    with pytest.raises(DatabaseError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    return message


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


def _filled(path: Path) -> None:
    """An optpipe database with a few schedules and many solver events, closed cleanly."""
    db = open_database(_url(path))
    p = make_problem(p=8, m=32)
    with db.session() as s:
        repo.store_schedule(s, make_fbw(p))
        rid = repo.start_solver_run(s, p.hash, "test", {})
    with db.connection() as c:
        c.execute(
            text(
                "INSERT INTO solver_events (run_id, wall_time, makespan, bound) VALUES (:r, :w, 1, 0)"
            ),
            [{"r": rid, "w": float(i)} for i in range(5000)],
        )
    db.close()  # the last connection checkpoints the WAL into the file


def test_missing_folder(tmp_path: Path) -> None:
    msg = _error(lambda: open_database(_url(tmp_path / "nope" / "optpipe.db")))
    assert "folder" in msg and "does not exist" in msg and str(tmp_path / "nope") in msg
    assert not (tmp_path / "nope").exists()  # nothing created for an explicit URL


def test_default_location_is_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTPIPE_DB_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_database_path() == tmp_path / "xdg" / "optpipe" / "optpipe.db"
    assert default_database_url() == f"sqlite:///{tmp_path}/xdg/optpipe/optpipe.db"
    open_database().close()
    assert (tmp_path / "xdg" / "optpipe" / "optpipe.db").is_file()
    monkeypatch.setenv("OPTPIPE_DB_URL", _url(tmp_path / "env.db"))
    assert default_database_url() == _url(tmp_path / "env.db")
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.delenv("OPTPIPE_DB_URL")
    assert default_database_path() == Path.home() / ".local/share/optpipe/optpipe.db"


def test_not_an_optpipe_database(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        c.execute("INSERT INTO users VALUES (1, 'ada')")
    before = path.read_bytes()
    msg = _error(lambda: open_database(_url(path)))
    assert "not an optpipe database" in msg and "users" in msg
    with sqlite3.connect(path) as c:  # untouched
        assert c.execute("SELECT name FROM sqlite_master").fetchall() == [("users",)]
    assert path.read_bytes() == before


def test_not_an_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 200)
    msg = _error(lambda: open_database(_url(path)))
    assert "is not an SQLite database file" in msg
    assert path.read_text().startswith("these are my notes")


def test_corrupted_file_at_open(tmp_path: Path) -> None:
    path = tmp_path / "optpipe.db"
    _filled(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:  # keep page 1's header, garbage everything after it
        f.seek(100)
        f.write(random.Random(0).randbytes(size - 100))
    assert "is corrupted" in _error(lambda: open_database(_url(path)))
    assert "is corrupted" in _error(lambda: open_database(_url(path), read_only=True))


def test_corrupted_table_found_when_read(tmp_path: Path) -> None:
    path = tmp_path / "optpipe.db"
    _filled(path)
    with sqlite3.connect(path) as c:
        page = c.execute("PRAGMA page_size").fetchone()[0]
        root = c.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'solver_events'"
        ).fetchone()[0]
    with open(path, "r+b") as f:
        f.seek((root - 1) * page)
        f.write(random.Random(1).randbytes(page))
    db = open_database(_url(path))  # the schema is intact
    try:
        with db.session() as s:
            assert len(repo.list_schedules(s)) == 1
        msg = _error(lambda: _events(db))
        assert "is corrupted" in msg
    finally:
        db.close()


def _events(db: Database) -> object:
    with db.session() as s:
        return repo.solver_events(s, 1)


def _as_other_user(fn: Callable[[], str]) -> str:
    """Run ``fn`` in a forked child without root's override of file permissions."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            out = fn()
        except BaseException as e:
            out = f"unexpected {type(e).__name__}: {e}"
        os.write(w, out.encode()[:4000])
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 4096):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


def _open_message(url: str, **kw: bool) -> Callable[[], str]:
    def run() -> str:
        try:
            open_database(url, **kw).close()
        except DatabaseError as e:
            return f"DatabaseError: {e}"
        return "opened"

    return run


def test_read_only_location() -> None:
    # in /tmp rather than pytest's tmp_path: an unprivileged child must be able to reach it
    base = Path(tempfile.mkdtemp(prefix="optpipe-ro-"))
    folder = base / "ro"
    try:
        folder.mkdir()
        _filled(folder / "optpipe.db")
        os.chmod(base, 0o755)
        os.chmod(folder / "optpipe.db", 0o444)
        os.chmod(folder, 0o555)
        if os.geteuid() == 0:  # the child drops to nobody, who must reach the folder
            for parent in base.parents:
                if not parent.stat().st_mode & stat.S_IXOTH:
                    pytest.skip(f"{parent} is not searchable by an unprivileged user")
        new = _as_other_user(_open_message(_url(folder / "new.db")))
        assert new.startswith("DatabaseError: cannot create database") and "read-only" in new, new
        existing = _as_other_user(_open_message(_url(folder / "optpipe.db")))
        assert existing.startswith("DatabaseError: database") and "is read-only" in existing
        assert "open it read-only" in existing
        assert len(existing.splitlines()) == 1
    finally:
        os.chmod(folder, 0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_writes_through_a_read_only_open_fail_clearly(tmp_path: Path) -> None:
    path = tmp_path / "optpipe.db"
    _filled(path)
    db = open_database(_url(path), read_only=True)
    try:
        with db.session() as s:
            assert len(repo.list_schedules(s)) == 1
        msg = _error(lambda: _store(db))
        assert "is read-only" in msg
    finally:
        db.close()


def _store(db: Database) -> None:
    with db.session() as s:
        repo.store_problem(s, make_problem(t_f=3.0))


def test_newer_schema_is_refused_untouched(db_url: str) -> None:
    open_database(db_url).close()
    eng = create_engine(db_url.replace("postgresql://", "postgresql+psycopg2://"))
    with eng.begin() as c:
        c.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999_from_the_future'"))
    try:
        msg = _error(lambda: open_database(db_url))
        assert (
            "9999_from_the_future" in msg and "newer" in msg and "upgrade optpipe-lightning" in msg
        )
        assert "newer" in _error(lambda: open_database(db_url, read_only=True))
        with eng.connect() as c:
            assert c.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == (
                "9999_from_the_future"
            )
    finally:
        with eng.begin() as c:
            c.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = :h"), {"h": head_revision()})
        eng.dispose()


def test_other_errors(tmp_path: Path) -> None:
    assert "is a folder" in _error(lambda: open_database(_url(tmp_path)))
    assert "no database at" in _error(lambda: open_database(_url(tmp_path / "x.db"), create=False))
    assert "to read" in _error(lambda: open_database(_url(tmp_path / "x.db"), read_only=True))
    assert not (tmp_path / "x.db").exists()
    assert "not a database URL" in _error(lambda: open_database("no such thing"))
    msg = _error(lambda: open_database("postgresql://u:secret@127.0.0.1:1/optpipe"))
    assert "cannot connect" in msg and "secret" not in msg


def test_run_carries_on_without_the_database(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="optpipe_lightning.profiles_db"):
        assert try_open_database(_url(tmp_path / "missing" / "x.db")) is None
    assert "carrying on without the optpipe database" in caplog.text
    assert "does not exist" in caplog.text


def test_writes_through_read_only_open_on_any_backend(db_url: str) -> None:
    open_database(db_url).close()
    db = open_database(db_url, read_only=True)
    try:
        msg = _error(lambda: _store(db))
        assert "read-only" in msg
    finally:
        db.close()
