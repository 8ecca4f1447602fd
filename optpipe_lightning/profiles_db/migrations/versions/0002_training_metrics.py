"""What the inspector's Training page shows: per-step metrics, re-calibrations, predicted gains.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26

- ``training_metrics``: one named number per optimizer step (``train_loss``, ``val_loss``,
  ``samples``, ``tokens``, or any other metric the run logs).
- ``training_calibrations``: each re-calibration of the costs while training, with the running
  schedule's predicted step time before and after and the reason.
- ``schedule_switches.predicted_before`` / ``predicted_after``: the predicted step time of the
  schedule left and of the one adopted (the gain the switch was made for).
- ``training_runs.memory_limit``: bytes per rank that the measured peak memory is held against.

Every new column is nullable, so rows written before this revision stay valid.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "training_metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["training_runs.id"],
            name=op.f("fk_training_metrics_run_id_training_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_training_metrics")),
    )
    with op.batch_alter_table("training_metrics", schema=None) as batch_op:
        batch_op.create_index("ix_training_metrics_run_step", ["run_id", "step"], unique=False)

    op.create_table(
        "training_calibrations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=True),
        sa.Column("predicted_before", sa.Float(), nullable=True),
        sa.Column("predicted_after", sa.Float(), nullable=True),
        sa.Column("measured_seconds", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["training_runs.id"],
            name=op.f("fk_training_calibrations_run_id_training_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
            name=op.f("fk_training_calibrations_schedule_id_schedules"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_training_calibrations")),
    )
    with op.batch_alter_table("training_calibrations", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_training_calibrations_run_id"), ["run_id"], unique=False
        )

    # ALTER TABLE ... ADD COLUMN in place (never a copy of the table: see downgrade)
    with op.batch_alter_table("schedule_switches", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("predicted_before", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("predicted_after", sa.Float(), nullable=True))
    with op.batch_alter_table("training_runs", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("memory_limit", sa.JSON(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN in place (SQLite >= 3.35): a batch copy would drop and
    # recreate ``training_runs``, and with foreign keys on that deletes every step and switch
    with op.batch_alter_table("training_runs", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("memory_limit")
    with op.batch_alter_table("schedule_switches", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("predicted_after")
        batch_op.drop_column("predicted_before")
    with op.batch_alter_table("training_calibrations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_training_calibrations_run_id"))
    op.drop_table("training_calibrations")
    with op.batch_alter_table("training_metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_training_metrics_run_step")
    op.drop_table("training_metrics")
