"""Re-chunked problems name the problem the user gave; schedules get a content digest.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28

``problems.given_hash``: a problem the solver or a baseline re-chunked (``layers_per_stage``)
points at the problem the user gave, so that problem's page lists the schedules of every
chunking. ``schedules.content_digest`` digests what runs (problem, chunking, actions) and not
how it was found, so the same schedule solved twice is stored once; rows stored before this
revision get theirs here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # in place (recreate="never"), as in 0003: a batch copy would cascade-delete referencing rows
    with op.batch_alter_table("problems", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("given_hash", sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f("ix_problems_given_hash"), ["given_hash"], unique=False)
    with op.batch_alter_table("schedules", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("content_digest", sa.String(length=64), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_schedules_content_digest"), ["content_digest"], unique=False
        )
    from optpipe_lightning.profiles_db.storage import content_digest

    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, problem_hash, data FROM schedules")).all()
    for sid, problem_hash, data in rows:
        try:
            digest = content_digest(problem_hash, json.loads(data))
        except (ValueError, TypeError, AttributeError):  # a damaged row: `db check` reports it
            continue
        conn.execute(
            sa.text("UPDATE schedules SET content_digest = :d WHERE id = :i"),
            {"d": digest, "i": sid},
        )


def downgrade() -> None:
    with op.batch_alter_table("schedules", schema=None, recreate="never") as batch_op:
        batch_op.drop_index(batch_op.f("ix_schedules_content_digest"))
        batch_op.drop_column("content_digest")
    with op.batch_alter_table("problems", schema=None, recreate="never") as batch_op:
        batch_op.drop_index(batch_op.f("ix_problems_given_hash"))
        batch_op.drop_column("given_hash")
