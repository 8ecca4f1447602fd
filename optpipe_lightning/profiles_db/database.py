"""Opening the profiles database: where it lives, connection settings, schema migrations on open.

Where: ``default_database_url()`` is ``$OPTPIPE_DB_URL`` when set, else the SQLite file
``$XDG_DATA_HOME/optpipe/optpipe.db`` (``~/.local/share/optpipe/optpipe.db`` without
``XDG_DATA_HOME``); only that default location's folder is created on demand. Any SQLAlchemy URL
works otherwise (``postgresql://user@host/db`` for a team whose jobs share profiles).

SQLite settings (one writer and many readers in separate processes, no "database is locked"):
WAL journal (readers never block the writer and see only committed rows), ``busy_timeout`` 30 s,
``synchronous=NORMAL`` (a killed process loses nothing committed; a power cut may lose the last
transactions), foreign keys on, and every writable session begins with ``BEGIN IMMEDIATE`` so two
writers queue on the busy timeout instead of failing when a read transaction turns into a write;
threads of one process queue on a lock first. Read-only opens use SQLite's ``mode=ro``; such a
reader creates the ``-wal`` and ``-shm`` files beside the database when they are missing and, as a
reader, never removes them (the next writer's close does: deleting them while another process has
the database open could corrupt it, so nothing here does). WAL needs
a local file system (not NFS). PostgreSQL read-only opens use read-only, repeatable-read
transactions (one snapshot per session, as SQLite readers get). A forked child starts with an
empty connection pool.

Schema: Alembic migrations (``migrations/versions``) are applied on open, under a lock
(``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL) so concurrent first opens are
safe. A database whose revision this version does not know is newer: ``DatabaseError``, nothing
is touched. A file with other tables, a corrupted file, a read-only location or a missing folder
is a ``DatabaseError`` with one line saying what to do.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from .errors import DatabaseError, OlderSchemaError, is_environmental, translate
from .models import OPTPIPE_TABLES, VERSION_TABLE

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

log = logging.getLogger("optpipe_lightning.profiles_db")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
BUSY_TIMEOUT_SECONDS = 30.0
_PG_MIGRATION_LOCK = 0x6F707470  # "optp": advisory lock key held while migrating


def default_database_path() -> Path:
    """``$XDG_DATA_HOME/optpipe/optpipe.db``, or ``~/.local/share/optpipe/optpipe.db``."""
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "optpipe" / "optpipe.db"


def default_database_url() -> str:
    """``$OPTPIPE_DB_URL`` when set, else ``sqlite:///`` + ``default_database_path()``."""
    env = os.environ.get("OPTPIPE_DB_URL", "").strip()
    if env:
        return env
    return f"sqlite:///{default_database_path()}"


# The newest migration in ``migrations/versions`` (a test checks it against Alembic's own
# reading of the scripts). Opening a database that is already current compares its stored
# revision with this, so reading never imports Alembic (~0.5 s of the inspector's first page).
HEAD_REVISION = "0004"


@lru_cache(maxsize=1)
def _script_directory() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config())


def _alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The newest schema revision this version of optpipe-lightning knows."""
    return HEAD_REVISION


def _package_version() -> str:
    try:
        return importlib.metadata.version("optpipe-lightning")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


def known_revisions() -> set[str]:
    return {rev.revision for rev in _script_directory().walk_revisions()}


class Database:
    """An open profiles database: an engine plus sessions that commit on success."""

    def __init__(self, url: str, engine: Engine, *, read_only: bool, where: str) -> None:
        self.url = url
        self.engine = engine
        self.read_only = read_only
        self.where = where  # the path or the URL without its password, for messages
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        # SQLite has one writer at a time: threads of this process queue here, in order,
        # instead of polling the file lock through SQLite's busy handler
        serialize = engine.dialect.name == "sqlite" and not read_only
        self._write_lock: threading.RLock | None = threading.RLock() if serialize else None
        _forget_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: new pool (the parent's connections are never touched) and lock."""
        self.engine.dispose(close=False)
        if self._write_lock is not None:
            self._write_lock = threading.RLock()

    @property
    def backend(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one short transaction: committed on success, rolled back on error.

        Driver errors from the surroundings (locked past the busy timeout, corrupted file,
        read-only file, lost server) come out as ``DatabaseError``; bugs pass through.
        """
        with self._writing():
            s = self._sessions()
            try:
                yield s
                s.commit()
            except BaseException as e:
                with suppress(sa_exc.SQLAlchemyError):
                    s.rollback()
                if is_environmental(e):
                    raise translate(e, self.where) from e
                raise
            finally:
                with suppress(sa_exc.SQLAlchemyError):
                    s.close()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        if self._write_lock is None:
            yield
            return
        with self._write_lock:
            yield

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A Core connection in one transaction (bulk inserts), with the same error translation."""
        try:
            with self._writing(), self.engine.begin() as conn:
                yield conn
        except Exception as e:
            if is_environmental(e):
                raise translate(e, self.where) from e
            raise

    def check(self) -> list[str]:
        """Problems a full check finds, one line each; empty when healthy.

        The file (SQLite: ``PRAGMA integrity_check``, which reads every page, and
        ``foreign_key_check``; a server checks its own pages), then the schema against this
        version's models, then every row of every table (``integrity``).
        """
        from .integrity import row_findings, schema_findings

        try:
            with self.engine.connect() as conn:
                found: list[str] = []
                if self.backend == "sqlite":
                    found = [
                        str(r)
                        for r in conn.exec_driver_sql("PRAGMA integrity_check").scalars()
                        if r != "ok"
                    ]
                    found += [
                        f"row {rowid} of {table} refers to a missing row of {parent}"
                        for table, rowid, parent, _ in conn.exec_driver_sql(
                            "PRAGMA foreign_key_check"
                        )
                    ]
                if found:
                    return found
                found = schema_findings(conn, head_revision())
            if found:
                return found
            with self.session() as s:
                return row_findings(s)
        except DatabaseError as e:
            return [str(e)]
        except Exception as e:
            if is_environmental(e):
                return [str(translate(e, self.where))]
            raise

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"Database({self.where!r}, {mode})"


def _forget_after_fork(db: Database) -> None:
    """Connections must not cross ``fork`` (SQLite's locks and a server's sockets would be
    shared with the parent): a forked child starts with an empty pool."""
    ref = weakref.ref(db)

    def child() -> None:
        alive = ref()
        if alive is not None:
            alive._after_fork()

    os.register_at_fork(after_in_child=child)


def open_database(
    url: str | None = None,
    *,
    read_only: bool = False,
    create: bool = True,
    busy_timeout: float = BUSY_TIMEOUT_SECONDS,
    upgrade: bool = False,
) -> Database:
    """Open (and create when allowed) the profiles database at ``url``.

    ``url=None`` means ``default_database_url()``. ``read_only`` opens without ever writing
    (the inspector); ``create=False`` refuses to create a new database. A database of an older
    schema revision raises ``OlderSchemaError`` naming ``optpipe db upgrade``, the one way to
    migrate (``upgrade.upgrade_database``, which passes ``upgrade=True`` after a backup).
    Raises ``DatabaseError``.
    """
    make_dir = url is None and not os.environ.get("OPTPIPE_DB_URL", "").strip()
    url_str = url if url is not None else default_database_url()
    try:
        parsed = make_url(url_str)
    except (sa_exc.ArgumentError, ValueError):
        raise DatabaseError(
            f"{url_str!r} is not a database URL: use sqlite:///path/to/optpipe.db "
            "or postgresql://user@host/dbname"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        engine, where = _sqlite_engine(parsed, read_only, create, make_dir, busy_timeout)
    else:
        engine, where = _server_engine(parsed, read_only)
    db = Database(url_str, engine, read_only=read_only, where=where)
    try:
        _prepare_schema(db, create=create, upgrade=upgrade and not read_only)
    except BaseException:
        engine.dispose()
        raise
    return db


def try_open_database(url: str | None = None, **kwargs: Any) -> Database | None:
    """``open_database``, or None with a logged warning: for runs that carry on without it."""
    try:
        return open_database(url, **kwargs)
    except DatabaseError as e:
        log.warning("carrying on without the optpipe database: %s", e)
        return None


# ---- engines ---------------------------------------------------------------------------------


def _sqlite_engine(
    parsed: URL, read_only: bool, create: bool, make_dir: bool, busy_timeout: float
) -> tuple[Engine, str]:
    database = parsed.database or ""
    memory = database in ("", ":memory:") or "mode=memory" in database
    if memory:
        engine = create_engine(
            "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
        )
        _sqlite_events(engine, read_only=False, busy_timeout=busy_timeout)
        return engine, ":memory:"
    if database.startswith("file:"):  # an SQLite URI: taken as given
        engine = create_engine(parsed, connect_args={"timeout": busy_timeout})
        _sqlite_events(engine, read_only=read_only, busy_timeout=busy_timeout)
        return engine, database
    path = Path(database).expanduser().absolute()
    where = str(path)
    _check_sqlite_path(path, read_only=read_only, create=create, make_dir=make_dir)
    if read_only:
        target: str | URL = f"sqlite:///file:{quote(str(path))}?mode=ro&uri=true"
    else:
        target = parsed.set(database=str(path))
    engine = create_engine(target, connect_args={"timeout": busy_timeout})
    _sqlite_events(engine, read_only=read_only, busy_timeout=busy_timeout)
    return engine, where


def _check_sqlite_path(path: Path, *, read_only: bool, create: bool, make_dir: bool) -> None:
    folder = path.parent
    if not folder.exists():
        if make_dir and not read_only:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise DatabaseError(
                    f"cannot create folder {folder} for the database ({e.strerror}): "
                    "set OPTPIPE_DB_URL or pass --db"
                ) from None
        else:
            raise DatabaseError(
                f"folder {folder} does not exist: create it, or choose another --db location"
            )
    if not folder.is_dir():
        raise DatabaseError(f"{folder} is not a folder: choose another --db location")
    if path.is_dir():
        raise DatabaseError(f"database {path} is a folder: give the path of a file in it")
    if path.exists() and not path.is_file():  # a FIFO would hang the driver's open
        raise DatabaseError(
            f"database {path} is not a regular file (a FIFO, socket or device): "
            "point --db at an SQLite file or a new file name"
        )
    if not path.exists():
        if read_only:
            raise DatabaseError(
                f"no database at {path} to read: check --db, or create it with a run that writes"
            )
        if not create:
            raise DatabaseError(f"no database at {path} (and creating one was not allowed)")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise DatabaseError(
                f"cannot create database {path}: folder {folder} is read-only; "
                "choose a writable location"
            )
        return
    if read_only:
        if not os.access(path, os.R_OK):
            raise DatabaseError(f"database {path} is not readable: check its permissions")
        return
    if not os.access(path, os.W_OK) or not os.access(folder, os.W_OK | os.X_OK):
        raise DatabaseError(
            f"database {path} is read-only (cannot write to the file or its folder): "
            "open it read-only, or copy it to a writable location"
        )


def _sqlite_events(engine: Engine, *, read_only: bool, busy_timeout: float) -> None:
    begin = "BEGIN" if read_only else "BEGIN IMMEDIATE"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see _on_begin)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        cur.execute("PRAGMA foreign_keys = ON")
        if not read_only:
            cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql(begin)


def _server_engine(parsed: URL, read_only: bool) -> tuple[Engine, str]:
    where = parsed.render_as_string(hide_password=True)
    connect_args: dict[str, Any] = {}
    if parsed.drivername == "postgresql":  # no driver named: take the one that is installed
        for module, driver in (
            ("psycopg2", "postgresql+psycopg2"),
            ("psycopg", "postgresql+psycopg"),
        ):
            if importlib.util.find_spec(module) is not None:
                parsed = parsed.set(drivername=driver)
                break
    if parsed.get_backend_name() == "postgresql":
        connect_args["connect_timeout"] = 10
        if read_only:  # and one snapshot per session, as SQLite readers get
            connect_args["options"] = (
                "-c default_transaction_read_only=on "
                "-c default_transaction_isolation=repeatable\\ read"
            )
    try:
        engine = create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
    except (sa_exc.NoSuchModuleError, ModuleNotFoundError, ImportError) as e:
        raise DatabaseError(
            f"no database driver for {where} ({e}): install it, e.g. "
            "pip install 'optpipe-lightning[postgres]'"
        ) from None
    return engine, where


# ---- schema ----------------------------------------------------------------------------------


def _state(conn: Connection) -> tuple[str | None, set[str]]:
    tables = set(inspect(conn).get_table_names())
    revision = None
    if VERSION_TABLE in tables:
        revs = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
        revision = revs[0] if len(revs) == 1 else (",".join(sorted(revs)) or None)
    return revision, tables


def _needs_upgrade(
    db: Database, revision: str | None, tables: set[str], create: bool, upgrade: bool = False
) -> bool:
    """Whether migrations must run; raises for databases that must not be touched, and for an
    older revision unless ``upgrade`` (``optpipe db upgrade`` is the one way to migrate)."""
    head = head_revision()
    if revision == head:
        return False
    if revision is None:
        foreign = tables - OPTPIPE_TABLES - {"sqlite_sequence", VERSION_TABLE}
        ours = tables & OPTPIPE_TABLES
        if ours or (foreign and db.backend == "sqlite"):
            shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
            raise DatabaseError(
                f"{db.where} is not an optpipe database (it holds tables {shown} and no "
                "optpipe schema version): point --db at an optpipe database or a new file"
            )
        if db.read_only:
            raise DatabaseError(
                f"{db.where} holds no optpipe database yet: nothing to read (check --db)"
            )
        if not create:
            raise DatabaseError(
                f"{db.where} holds no optpipe database (and creating one was not allowed)"
            )
        return True
    if revision not in known_revisions():
        raise DatabaseError(
            f"database {db.where} has schema revision {revision}, newer than this "
            f"optpipe-lightning {_package_version()} knows (newest {head}): upgrade optpipe-lightning "
            "or use another --db"
        )
    if not upgrade:
        url = db.url if db.backend == "sqlite" else db.where  # (never a password)
        raise OlderSchemaError(
            f"database {db.where} has the older schema revision {revision} (current {head}): "
            f"run `optpipe db upgrade --db {url}` to migrate it (it keeps a backup copy)",
            where=db.where,
            backend=db.backend,
            revision=revision,
        )
    return True


def _prepare_schema(db: Database, *, create: bool, upgrade: bool = False) -> None:
    try:
        with db.engine.connect() as conn:
            revision, tables = _state(conn)
        # raises for a foreign file, and for an older revision unless upgrading
        migrate = _needs_upgrade(db, revision, tables, create, upgrade)
        if db.backend == "sqlite" and not db.read_only and db.where != ":memory:":
            _use_wal(db.engine)  # only now that the file is known to be ours (or empty)
        if not migrate:
            return
        with db.engine.begin() as conn:  # BEGIN IMMEDIATE on SQLite: one migrator at a time
            if db.backend == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
            revision, tables = _state(conn)  # again, under the lock
            if _needs_upgrade(db, revision, tables, create, upgrade):
                log.info("migrating %s from %s to %s", db.where, revision, head_revision())
                from alembic import command

                command.upgrade(_alembic_config(conn), "head")
    except DatabaseError:
        raise
    except Exception as e:
        if is_environmental(e):
            raise translate(e, db.where) from e
        raise


def _use_wal(engine: Engine) -> None:
    """Switch the file to WAL (persistent; a no-op when it already is)."""
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("PRAGMA journal_mode = WAL")
        cur.close()
    finally:
        raw.close()
