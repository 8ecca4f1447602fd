"""The Alembic migrations build exactly the ORM models' schema, and run down and up again."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from optpipe_lightning.profiles_db import Database, head_revision, open_database
from optpipe_lightning.profiles_db.database import _alembic_config
from optpipe_lightning.profiles_db.models import OPTPIPE_TABLES, VERSION_TABLE, Base


def test_migrations_match_models(db: Database) -> None:
    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
        )
        assert ctx.get_current_revision() == head_revision()
        assert compare_metadata(ctx, Base.metadata) == []
        assert set(inspect(conn).get_table_names()) >= OPTPIPE_TABLES


def test_downgrade_and_upgrade_again(sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    with db.engine.begin() as conn:
        command.downgrade(_alembic_config(conn), "base")
        assert set(inspect(conn).get_table_names()) == {VERSION_TABLE}
    db.close()
    db = open_database(sqlite_url)  # migrates up again on open
    with db.engine.connect() as conn:
        assert set(inspect(conn).get_table_names()) == OPTPIPE_TABLES | {VERSION_TABLE}
    db.close()


def test_the_head_revision_constant_is_the_newest_migration() -> None:
    """``HEAD_REVISION`` (read without importing Alembic) is what Alembic reads from the
    scripts: a new migration must update it."""
    from optpipe_lightning.profiles_db.database import _script_directory

    assert _script_directory().get_current_head() == head_revision()


def test_reading_a_current_database_never_imports_alembic(sqlite_url: str) -> None:
    import subprocess
    import sys

    open_database(sqlite_url).close()
    code = (
        "import sys\n"
        "from optpipe_lightning.profiles_db import open_database, repository\n"
        f"with open_database({sqlite_url!r}, read_only=True, create=False) as db:\n"
        "    with db.session() as s: repository.list_problems(s)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
