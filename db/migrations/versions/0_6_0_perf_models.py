"""cute-autotune 0.6.0: the performance model of each GPU model, fitted over the database's own
measurements (`tune`, `import`, `model fit --store`): the model document as JSON text (the
format `autotune.model.perf_model` reads, never a pickle), its own digest, the digest of the
timings it was fitted on and how many, who fitted it and when. One row per GPU model's name.

Revision ID: 0.6.0
Revises: 0.5.0
"""

import sqlalchemy as sa
from alembic import op

revision = "0.6.0"
down_revision = "0.5.0"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "perf_models",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("device_name", sa.String(128), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("data_digest", sa.String(64), nullable=False),
        sa.Column("timings", sa.Integer, nullable=False),
        sa.Column("fitted_by", sa.String(32), nullable=False),
        sa.Column("fitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("doc_json", sa.Text, nullable=False),
        sa.UniqueConstraint("device_name", name="uq_perf_models_device"),
    )


def downgrade() -> None:
    # A model is derived data: refitted from the measurements whenever it is wanted again.
    op.drop_table("perf_models")
