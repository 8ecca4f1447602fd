"""Run owners: which process runs a solver or training run, so a killed one reads ``interrupted``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-28

``owner`` is ``host|boot id|pid|process start`` (``profiles_db.owners``); rows written before
this revision have none and keep the status they have.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # in place (recreate="never"): a batch copy drops and recreates the table, and with foreign
    # keys on that deletes every row that references it (steps, switches, metrics)
    for table in ("solver_runs", "training_runs"):
        with op.batch_alter_table(table, schema=None, recreate="never") as batch_op:
            batch_op.add_column(sa.Column("owner", sa.String(length=200), nullable=True))


def downgrade() -> None:
    for table in ("training_runs", "solver_runs"):  # SQLite >= 3.35 drops a column in place
        with op.batch_alter_table(table, schema=None, recreate="never") as batch_op:
            batch_op.drop_column("owner")
