"""Fixtures for the profiles database tests: SQLite files and, when available, a throwaway
PostgreSQL cluster (Debian's binaries under /usr/lib/postgresql/*/bin, started on 127.0.0.1 and a
free port; as root through ``runuser -u postgres``). Set ``OPTPIPE_TEST_PG_URL`` to a server URL
(an admin connection, e.g. ``postgresql://postgres@127.0.0.1:5432/postgres``) to use an existing
server instead.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from optpipe_lightning.profiles_db import Database, open_database
from optpipe_lightning.profiles_db.models import OPTPIPE_TABLES

# ---- PostgreSQL ------------------------------------------------------------------------------


@dataclass
class PgServer:
    admin_url: str  # connects to the "postgres" database as a superuser
    _counter: itertools.count  # type: ignore[type-arg]

    def new_database(self) -> str:
        name = f"optpipe_t{os.getpid()}_{next(self._counter)}"
        eng = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.exec_driver_sql(f'CREATE DATABASE "{name}"')
        eng.dispose()
        return make_url(self.admin_url).set(database=name).render_as_string(hide_password=False)

    def drop_database(self, url: str) -> None:
        name = make_url(url).database
        eng = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        with eng.connect() as c, contextlib.suppress(Exception):
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        eng.dispose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_cluster() -> tuple[PgServer | None, str, Callable[[], None] | None]:
    """Start a throwaway cluster; returns (server, skip reason, stopper)."""
    bins = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2].split(".")[0])
    )
    if not bins or not os.path.exists(os.path.join(bins[-1], "initdb")):
        return None, "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin", None
    bindir = bins[-1]
    prefix: list[str] = []
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            return None, "running as root and there is no 'postgres' user to run initdb", None
        if shutil.which("runuser") is None:
            return None, "running as root without runuser to drop to the postgres user", None
        prefix = ["runuser", "-u", "postgres", "--"]
    data = tempfile.mkdtemp(prefix="optpipe-pg-")
    if prefix:
        os.chown(data, pw.pw_uid, pw.pw_gid)
    port = _free_port()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*prefix, *args], capture_output=True, text=True, timeout=120, check=False
        )

    r = run(f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
            "--locale=C", "--no-sync")  # fmt: skip
    if r.returncode != 0:
        shutil.rmtree(data, ignore_errors=True)
        return None, f"initdb failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}", None
    opts = f"-h 127.0.0.1 -p {port} -k {data} -F -c max_connections=60"
    r = run(f"{bindir}/pg_ctl", "-D", data, "-o", opts, "-l", f"{data}/server.log", "-w",
            "-t", "60", "start")  # fmt: skip
    if r.returncode != 0:
        log = ""
        with contextlib.suppress(OSError, IndexError), open(f"{data}/server.log") as f:
            log = f.read().strip().splitlines()[-1]
        shutil.rmtree(data, ignore_errors=True)
        return None, f"pg_ctl start failed: {log or r.stderr.strip()}", None

    def stop() -> None:
        run(f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(data, ignore_errors=True)

    url = f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    deadline = time.monotonic() + 30
    while True:  # -w waited for the socket; make sure TCP answers too
        try:
            eng = create_engine(url)
            with eng.connect() as c:
                c.execute(text("SELECT 1"))
            eng.dispose()
            break
        except Exception as e:
            if time.monotonic() > deadline:
                stop()
                return None, f"PostgreSQL started but does not answer: {e}", None
            time.sleep(0.2)
    return PgServer(url, itertools.count()), "", stop


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    env = os.environ.get("OPTPIPE_TEST_PG_URL", "").strip()
    if env:
        yield PgServer(env, itertools.count())
        return
    server, reason, stopper = _start_cluster()
    if server is None:
        pytest.skip(f"no PostgreSQL for the database tests: {reason}")
    assert stopper is not None
    try:
        yield server
    finally:
        stopper()


# ---- one fresh database per test, on each backend ----------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/optpipe.db"
        return
    url: str = request.getfixturevalue("pg_shared_url")
    eng = create_engine(url)
    with eng.begin() as c:  # emptied before each test: much faster than a new database
        c.exec_driver_sql(f"TRUNCATE {', '.join(sorted(OPTPIPE_TABLES))} RESTART IDENTITY CASCADE")
    eng.dispose()
    yield url


@pytest.fixture(scope="session")
def pg_shared_url(pg_server: PgServer) -> Iterator[str]:
    """One migrated database for the tests that only need an empty optpipe schema."""
    url = pg_server.new_database()
    open_database(url).close()
    try:
        yield url
    finally:
        pg_server.drop_database(url)


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = open_database(db_url)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def sqlite_url(tmp_path: os.PathLike[str]) -> str:
    return f"sqlite:///{tmp_path}/optpipe.db"
