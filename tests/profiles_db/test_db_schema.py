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
