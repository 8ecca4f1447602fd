"""Initial schema: fingerprints, profiles, problems, schedules, solver and training runs.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-21

Times are naive UTC ``DateTime`` columns (the models wrap them in ``UTCDateTime``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "hardware_fingerprints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("device_kind", sa.String(length=200), nullable=False),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("device_memory", sa.BigInteger(), nullable=False),
        sa.Column("interconnect", sa.String(length=100), nullable=False),
        sa.Column("driver", sa.String(length=200), nullable=False),
        sa.Column("torch_version", sa.String(length=100), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hardware_fingerprints")),
        sa.UniqueConstraint("key", name=op.f("uq_hardware_fingerprints_key")),
    )
    op.create_table(
        "model_fingerprints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("dtype", sa.String(length=32), nullable=False),
        sa.Column("num_layers", sa.Integer(), nullable=False),
        sa.Column("microbatch_size", sa.Integer(), nullable=False),
        sa.Column("sequence_length", sa.Integer(), nullable=True),
        sa.Column("num_stages", sa.Integer(), nullable=False),
        sa.Column("num_chunks", sa.Integer(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_fingerprints")),
        sa.UniqueConstraint("key", name=op.f("uq_model_fingerprints_key")),
    )
    op.create_table(
        "problems",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("num_stages", sa.Integer(), nullable=False),
        sa.Column("num_microbatches", sa.Integer(), nullable=False),
        sa.Column("num_chunks", sa.Integer(), nullable=False),
        sa.Column("placement", sa.String(length=32), nullable=False),
        sa.Column("memory_limit", sa.Float(), nullable=True),
        sa.Column("offload", sa.Boolean(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_problems")),
    )
    op.create_table(
        "profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hardware_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("num_microbatches", sa.Integer(), nullable=False),
        sa.Column("measured_at", sa.DateTime(), nullable=False),
        sa.Column("stored_at", sa.DateTime(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["hardware_id"],
            ["hardware_fingerprints.id"],
            name=op.f("fk_profiles_hardware_id_hardware_fingerprints"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["model_fingerprints.id"],
            name=op.f("fk_profiles_model_id_model_fingerprints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_profiles")),
        sa.UniqueConstraint("digest", name=op.f("uq_profiles_digest")),
    )
    with op.batch_alter_table("profiles", schema=None) as batch_op:
        batch_op.create_index(
            "ix_profiles_lookup", ["hardware_id", "model_id", "measured_at"], unique=False
        )

    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("problem_hash", sa.String(length=64), nullable=False),
        sa.Column("generator", sa.String(length=100), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("makespan", sa.Float(), nullable=True),
        sa.Column("feasible", sa.Boolean(), nullable=False),
        sa.Column("bubble_rate", sa.Float(), nullable=True),
        sa.Column("num_offloaded", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["problem_hash"],
            ["problems.hash"],
            name=op.f("fk_schedules_problem_hash_problems"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("digest", name=op.f("uq_schedules_digest")),
    )
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.create_index(
            "ix_schedules_best", ["problem_hash", "feasible", "makespan"], unique=False
        )

    op.create_table(
        "training_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hardware_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["hardware_id"],
            ["hardware_fingerprints.id"],
            name=op.f("fk_training_runs_hardware_id_hardware_fingerprints"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["model_fingerprints.id"],
            name=op.f("fk_training_runs_model_id_model_fingerprints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_training_runs")),
    )
    op.create_table(
        "schedule_switches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("from_schedule_id", sa.Integer(), nullable=True),
        sa.Column("to_schedule_id", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["from_schedule_id"],
            ["schedules.id"],
            name=op.f("fk_schedule_switches_from_schedule_id_schedules"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["training_runs.id"],
            name=op.f("fk_schedule_switches_run_id_training_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["to_schedule_id"],
            ["schedules.id"],
            name=op.f("fk_schedule_switches_to_schedule_id_schedules"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedule_switches")),
    )
    with op.batch_alter_table("schedule_switches", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_schedule_switches_run_id"), ["run_id"], unique=False)

    op.create_table(
        "solver_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("problem_hash", sa.String(length=64), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("makespan", sa.Float(), nullable=True),
        sa.Column("lower_bound", sa.Float(), nullable=True),
        sa.Column("schedule_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["problem_hash"],
            ["problems.hash"],
            name=op.f("fk_solver_runs_problem_hash_problems"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
            name=op.f("fk_solver_runs_schedule_id_schedules"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_solver_runs")),
    )
    with op.batch_alter_table("solver_runs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_solver_runs_problem_hash"), ["problem_hash"], unique=False
        )

    op.create_table(
        "training_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("measured_seconds", sa.Float(), nullable=False),
        sa.Column("predicted_seconds", sa.Float(), nullable=True),
        sa.Column("schedule_id", sa.Integer(), nullable=True),
        sa.Column("peak_memory", sa.JSON(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["training_runs.id"],
            name=op.f("fk_training_steps_run_id_training_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
            name=op.f("fk_training_steps_schedule_id_schedules"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_training_steps")),
    )
    with op.batch_alter_table("training_steps", schema=None) as batch_op:
        batch_op.create_index("ix_training_steps_run_step", ["run_id", "step"], unique=False)

    op.create_table(
        "solver_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("wall_time", sa.Float(), nullable=False),
        sa.Column("makespan", sa.Float(), nullable=True),
        sa.Column("bound", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["solver_runs.id"],
            name=op.f("fk_solver_events_run_id_solver_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_solver_events")),
    )
    with op.batch_alter_table("solver_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_solver_events_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("solver_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_solver_events_run_id"))

    op.drop_table("solver_events")
    with op.batch_alter_table("training_steps", schema=None) as batch_op:
        batch_op.drop_index("ix_training_steps_run_step")

    op.drop_table("training_steps")
    with op.batch_alter_table("solver_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_solver_runs_problem_hash"))

    op.drop_table("solver_runs")
    with op.batch_alter_table("schedule_switches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_schedule_switches_run_id"))

    op.drop_table("schedule_switches")
    op.drop_table("training_runs")
    with op.batch_alter_table("schedules", schema=None) as batch_op:
        batch_op.drop_index("ix_schedules_best")

    op.drop_table("schedules")
    with op.batch_alter_table("profiles", schema=None) as batch_op:
        batch_op.drop_index("ix_profiles_lookup")

    op.drop_table("profiles")
    op.drop_table("problems")
    op.drop_table("model_fingerprints")
    op.drop_table("hardware_fingerprints")
