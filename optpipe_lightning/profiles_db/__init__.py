"""The profiles database: profiles, schedules, solver progress and training runs, reused.

Where it lives: ``default_database_url()`` is ``$OPTPIPE_DB_URL`` when set, else the SQLite file
``$XDG_DATA_HOME/optpipe/optpipe.db`` (``~/.local/share/optpipe/optpipe.db`` when
``XDG_DATA_HOME`` is unset); any SQLAlchemy URL works (``postgresql://user@host/db``).

    from optpipe_lightning.profiles_db import open_database, repository as repo

    db = open_database()                      # creates or migrates the schema on open
    with db.session() as s:                   # one short transaction, committed on success
        h = repo.store_problem(s, problem)
        best = repo.best_schedule(s, h)

Failures of the surroundings (not an optpipe database, corrupted file, read-only location,
missing folder, newer schema, unreachable server) raise ``DatabaseError`` with one line for
the user; ``try_open_database`` returns None instead, for runs that carry on without it.
``profile_defect(profile)`` says why a profile cannot serve the model it claims (None when it
can): the strategy asks it before it uses a profile it was handed.
See ``database`` (connection and migration rules), ``repository`` (what is stored and read)
and ``profiles`` (the rules for reusing a profile).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .database import (
        Database,
        default_database_path,
        default_database_url,
        head_revision,
        open_database,
        try_open_database,
    )
    from .errors import DatabaseError, NotFoundError, OlderSchemaError
    from .recorder import SolverEventRecorder
    from .validation import profile_defect

# imported on first use (SQLAlchemy costs ~0.3 s): `optpipe db --help` and the modules that
# only name this package (the `db` command group) start without it
_LAZY = {
    "Database": "database",
    "default_database_path": "database",
    "default_database_url": "database",
    "head_revision": "database",
    "open_database": "database",
    "try_open_database": "database",
    "DatabaseError": "errors",
    "NotFoundError": "errors",
    "OlderSchemaError": "errors",
    "SolverEventRecorder": "recorder",
    "profile_defect": "validation",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "Database",
    "DatabaseError",
    "NotFoundError",
    "OlderSchemaError",
    "SolverEventRecorder",
    "default_database_path",
    "default_database_url",
    "head_revision",
    "open_database",
    "profile_defect",
    "try_open_database",
]
