"""The one exception users of the database see, and the translation of driver errors into it.

Every message is one line that names the problem and what to do about it: a file that is not an
optpipe database, a corrupted file, a read-only location, a missing directory, a schema newer than
this version knows, a server that cannot be reached.
"""

from __future__ import annotations


class DatabaseError(Exception):
    """The database cannot be used as asked; ``str(e)`` is one line for the user."""


class NotFoundError(DatabaseError, LookupError):
    """A row asked for by id or hash is not in the database."""


class OlderSchemaError(DatabaseError):
    """The database has an older schema revision: ``optpipe db upgrade`` migrates it."""

    def __init__(self, message: str, *, where: str, backend: str, revision: str) -> None:
        super().__init__(message)
        self.where = where  # the SQLite file's path, or the server URL without its password
        self.backend = backend
        self.revision = revision


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (drivers add SQL and links below)."""
    orig = getattr(exc, "orig", None) or exc
    for line in str(orig).splitlines():
        if line.strip():
            return line.strip()
    return type(orig).__name__


# (substring of the driver's message, what it means, what to do); first match wins
_SQLITE_PATTERNS: tuple[tuple[str, str, str], ...] = (
    (
        "file is not a database",
        "is not an SQLite database file",
        "point --db at an optpipe database or at a new file name",
    ),
    (
        "malformed",
        "is corrupted (database disk image is malformed)",
        "restore it from a backup or move it aside to start a new one",
    ),
    (
        "readonly database",
        "is read-only (cannot write to the file or its folder)",
        "open it read-only, or copy it to a writable location",
    ),
    (
        "read-only transaction",
        "is opened read-only",
        "open it without read-only to write",
    ),
    (
        "unable to open database file",
        "cannot be opened (missing folder or no permission)",
        "check that the folder exists and is writable",
    ),
    (
        "database is locked",
        "stayed locked by another process past the busy timeout",
        "find the process holding a long write transaction, or retry",
    ),
    (
        "disk is full",
        "cannot grow: the disk is full",
        "free space or move the database",
    ),
    (
        "disk i/o error",
        "hit a disk I/O error",
        "check the file system (network file systems do not support SQLite's WAL mode)",
    ),
)


def is_environmental(exc: BaseException) -> bool:
    """Driver errors that come from the database's surroundings rather than a bug in a query.

    SQLAlchemy's wrappers and the raw DBAPI errors alike (a pool ``connect`` event raises the
    driver's own): ``OperationalError`` (locked, disk, lost server), a plain ``DatabaseError``
    (SQLite: not a database, malformed) and ``InterfaceError``; never ``IntegrityError`` or
    ``ProgrammingError``, which are bugs.
    """
    if isinstance(exc, DatabaseError):  # ours: already one line for the user
        return False
    if "read-only transaction" in str(exc):  # PostgreSQL, opened read-only
        return True
    return type(exc).__name__ in _ENVIRONMENTAL


_ENVIRONMENTAL = frozenset({"OperationalError", "DatabaseError", "InterfaceError"})


def translate(exc: BaseException, where: str) -> DatabaseError:
    """One-line ``DatabaseError`` for a driver error on database ``where`` (a path or URL)."""
    text = first_line(exc)
    low = text.lower()
    for needle, meaning, fix in _SQLITE_PATTERNS:
        if needle in low:
            return DatabaseError(f"database {where} {meaning}: {fix}")
    if "could not connect" in low or "connection refused" in low or "connection to server" in low:
        return DatabaseError(
            f"cannot connect to database {where} ({text}): is the server running and the URL right?"
        )
    if "does not exist" in low and "database" in low:
        return DatabaseError(f"database {where}: {text}; create it first (createdb)")
    if "password authentication failed" in low or "authentication" in low:
        return DatabaseError(f"database {where}: {text}; check the user and password in the URL")
    return DatabaseError(f"database {where}: {text}")
