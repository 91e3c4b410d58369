"""cute-autotune 0.5.0: the work queue of tuning (`tune --enqueue`, `cute-autotune worker`). An
item is a problem to tune on one GPU model (name, compute capability, SM count) with the
families and search settings it was enqueued with; a worker holds it by a lease that it renews
while it runs, and an item whose lease ran out goes to the next worker that asks.

Revision ID: 0.5.0
Revises: 0.4.0
"""

import sqlalchemy as sa
from alembic import op

revision = "0.5.0"
down_revision = "0.4.0"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "work_items",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("device_name", sa.String(128), nullable=False),
        sa.Column("compute_capability", sa.Integer, nullable=False),
        sa.Column("sm_count", sa.Integer, nullable=False),
        sa.Column("problem_id", sa.Integer, sa.ForeignKey("problems.id"), nullable=False),
        sa.Column("families", sa.String(200), nullable=False),
        sa.Column("settings_json", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(200)),
        sa.Column("lease_until", sa.DateTime(timezone=True)),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("message", sa.Text),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint(
            "device_name",
            "compute_capability",
            "sm_count",
            "problem_id",
            "families",
            name="uq_work_items",
        ),
    )
    op.create_index(
        "ix_work_items_take",
        "work_items",
        ["device_name", "compute_capability", "sm_count", "state"],
    )


def downgrade() -> None:
    held = (
        op.get_bind()
        .execute(sa.text("SELECT COUNT(*) FROM work_items WHERE state IN ('queued', 'running')"))
        .scalar()
    )
    if held:
        raise RuntimeError(
            f"{held} work items are queued or running, which schema 0.4.0 "
            "cannot hold; let the workers drain the queue first"
        )
    op.drop_index("ix_work_items_take", table_name="work_items")
    op.drop_table("work_items")
