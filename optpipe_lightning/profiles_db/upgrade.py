"""``optpipe db upgrade``: the one way to migrate a database to this version's schema.

Opening a database never migrates it (``open_database`` raises ``OlderSchemaError`` naming
this command), so a reader such as ``optpipe inspect`` never changes a file. An SQLite file is
copied first (SQLite's online backup, consistent even while another process writes) to
``<file>.<revision>.bak`` beside it; a server database needs the user's own backup
(``pg_dump``), confirmed with ``backup_done=True``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from .database import head_revision, open_database
from .errors import DatabaseError, OlderSchemaError


@dataclass(frozen=True)
class UpgradeResult:
    where: str
    from_revision: str | None
    to_revision: str
    backup: Path | None  # the copy made first; None when nothing was migrated or on a server

    @property
    def migrated(self) -> bool:
        return self.from_revision != self.to_revision


def backup_path(path: Path, revision: str | None) -> Path:
    """``optpipe.db.0003.bak``, or ``optpipe.db.0003.2.bak`` when that exists already."""
    stem = f"{path.name}.{revision or 'none'}"
    candidate = path.with_name(f"{stem}.bak")
    n = 2
    while candidate.exists():
        candidate = path.with_name(f"{stem}.{n}.bak")
        n += 1
    return candidate


def _sqlite_backup(source: Path, target: Path) -> None:
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    except sqlite3.Error as e:
        target.unlink(missing_ok=True)
        raise DatabaseError(
            f"could not copy {source} to {target} before upgrading ({e}): nothing was changed; "
            "free some space or make the folder writable"
        ) from None
    finally:
        src.close()


def upgrade_database(url: str, *, backup_done: bool = False) -> UpgradeResult:
    """Migrate the database at ``url`` to the head revision, after a backup copy.

    Nothing happens (and no copy is made) when it is current. Raises ``DatabaseError`` for a
    missing, foreign or newer database, and for a server database without ``backup_done``."""
    head = head_revision()
    try:  # the read-only open checks the file (missing, foreign, newer) and says what is wrong
        db = open_database(url, read_only=True, create=False)
    except OlderSchemaError as e:
        old = e
    else:
        where = db.where
        db.close()
        return UpgradeResult(where, head, head, None)  # current: nothing to do
    backup = None
    if old.backend == "sqlite":
        backup = backup_path(Path(old.where), old.revision)
        _sqlite_backup(Path(old.where), backup)
    elif not backup_done:
        raise DatabaseError(
            f"{old.where} is a {old.backend} database: back it up first (pg_dump), then run "
            "`optpipe db upgrade --backup-done`"
        )
    open_database(url, create=False, upgrade=True).close()
    return UpgradeResult(old.where, old.revision, head, backup)
