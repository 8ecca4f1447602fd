"""Alembic environment for the profiles database.

``open_database`` runs migrations programmatically and passes its own connection in
``config.attributes["connection"]`` (inside the transaction that holds the migration lock).
Developers can also run the ``alembic`` command with ``-c`` pointing at ``alembic.ini`` beside
this file; the URL then comes from ``$OPTPIPE_DB_URL`` or the default path.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from optpipe_lightning.profiles_db.models import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table
        compare_type=True,
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from optpipe_lightning.profiles_db.database import default_database_url

    url = config.get_main_option("sqlalchemy.url") or default_database_url()
    engine = create_engine(url)
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("optpipe migrations run online only (open_database applies them)")
run_migrations_online()
