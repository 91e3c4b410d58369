"""cute-autotune 0.2.0: what each timing ran under (timing regime, driver, CUDA, torch and cuDNN
versions, SM clock and power), the spread and tie decision of each best config, and the
problems `attention()` served without an exact tuned entry.

Revision ID: 0.2.0
Revises: 0.1.0
"""

import sqlalchemy as sa
from alembic import op

revision = "0.2.0"
down_revision = "0.1.0"
branch_labels = None
depends_on = None

_ENVIRONMENT = (
    ("regime", sa.String(32)),
    ("driver_version", sa.String(32)),
    ("cuda_version", sa.String(32)),
    ("torch_version", sa.String(64)),
    ("cudnn_version", sa.String(32)),
    ("sm_clock_mhz", sa.Float()),
    ("power_w", sa.Float()),
)
_BEST = (
    ("p20_us", sa.Float()),
    ("p80_us", sa.Float()),
    ("decision", sa.Text()),
    ("runner_up_us", sa.Float()),
    ("torch_version", sa.String(64)),
    ("cudnn_version", sa.String(32)),
    ("regime", sa.String(32)),
)


def upgrade() -> None:
    for table in ("measurements", "baselines"):
        with op.batch_alter_table(table) as batch:
            for name, kind in _ENVIRONMENT:
                batch.add_column(sa.Column(name, kind))
    with op.batch_alter_table("best_configs") as batch:
        for name, kind in _BEST:
            batch.add_column(sa.Column(name, kind))
    op.create_table(
        "runtime_misses",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("device_name", sa.String(128), nullable=False),
        sa.Column("compute_capability", sa.Integer, nullable=False),
        sa.Column("sm_count", sa.Integer, nullable=False),
        sa.Column("problem_id", sa.Integer, sa.ForeignKey("problems.id"), nullable=False),
        sa.Column("path", sa.String(16), nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint(
            "device_name",
            "compute_capability",
            "sm_count",
            "problem_id",
            "path",
            name="uq_runtime_misses",
        ),
    )


def downgrade() -> None:
    op.drop_table("runtime_misses")
    with op.batch_alter_table("best_configs") as batch:
        for name, _ in reversed(_BEST):
            batch.drop_column(name)
    for table in ("baselines", "measurements"):
        with op.batch_alter_table(table) as batch:
            for name, _ in reversed(_ENVIRONMENT):
                batch.drop_column(name)
