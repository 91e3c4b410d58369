"""cute-autotune 0.1.0: the first schema.

Revision ID: 0.1.0
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0.1.0"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("compute_capability", sa.Integer, nullable=False),
        sa.Column("sm_count", sa.Integer, nullable=False),
        sa.Column("driver_version", sa.String(32), nullable=False),
        sa.Column("cuda_version", sa.String(32), nullable=False),
        sa.UniqueConstraint(
            "name",
            "compute_capability",
            "sm_count",
            "driver_version",
            "cuda_version",
            name="uq_devices_identity",
        ),
    )
    op.create_table(
        "kernel_configs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("digest", sa.String(16), nullable=False, unique=True),
        sa.Column("config_json", sa.Text, nullable=False),
    )
    op.create_table(
        "builds",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("config_id", sa.Integer, sa.ForeignKey("kernel_configs.id"), nullable=False),
        sa.Column("artifact_key", sa.String(64), nullable=False, unique=True),
        sa.Column("arch", sa.String(16), nullable=False),
        sa.Column("nvcc_version", sa.String(32), nullable=False),
        sa.Column("cutlass_version", sa.String(32), nullable=False),
        sa.Column("kernel_source_hash", sa.String(32), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("registers", sa.Integer),
        sa.Column("spill_store_bytes", sa.Integer),
        sa.Column("spill_load_bytes", sa.Integer),
        sa.Column("stack_frame_bytes", sa.Integer),
        sa.Column("smem_bytes", sa.Integer),
        sa.Column("threads", sa.Integer),
        sa.Column("compile_seconds", sa.Float),
        sa.Column("artifact_digest", sa.String(64)),
    )
    op.create_table(
        "problems",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("batch", sa.Integer, nullable=False),
        sa.Column("heads_q", sa.Integer, nullable=False),
        sa.Column("heads_kv", sa.Integer, nullable=False),
        sa.Column("seqlen_q", sa.Integer, nullable=False),
        sa.Column("seqlen_k", sa.Integer, nullable=False),
        sa.Column("head_dim", sa.Integer, nullable=False),
        sa.Column("causal", sa.Boolean, nullable=False),
        sa.UniqueConstraint(
            "dtype",
            "batch",
            "heads_q",
            "heads_kv",
            "seqlen_q",
            "seqlen_k",
            "head_dim",
            "causal",
            name="uq_problems_shape",
        ),
        sa.CheckConstraint("heads_q % heads_kv = 0", name="ck_problems_gqa"),
    )
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("device_id", sa.Integer, sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("problem_id", sa.Integer, sa.ForeignKey("problems.id"), nullable=False),
        sa.Column("config_id", sa.Integer, sa.ForeignKey("kernel_configs.id"), nullable=False),
        sa.Column("build_id", sa.Integer, sa.ForeignKey("builds.id")),
        sa.Column("study", sa.String(200), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("median_us", sa.Float),
        sa.Column("p20_us", sa.Float),
        sa.Column("p80_us", sa.Float),
        sa.Column("rounds", sa.Integer),
        sa.Column("tflops", sa.Float),
        sa.Column("rel_err", sa.Float),
        sa.Column("max_abs_err", sa.Float),
        sa.Column("baseline_us", sa.Float),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(
        "ix_measurements_lookup", "measurements", ["device_id", "problem_id", "config_id"]
    )
    op.create_table(
        "baselines",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("device_id", sa.Integer, sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("problem_id", sa.Integer, sa.ForeignKey("problems.id"), nullable=False),
        sa.Column("study", sa.String(200), nullable=False),
        sa.Column("backend", sa.String(16), nullable=False),
        sa.Column("median_us", sa.Float, nullable=False),
        sa.Column("p20_us", sa.Float, nullable=False),
        sa.Column("p80_us", sa.Float, nullable=False),
        sa.Column("tflops", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_baselines_lookup", "baselines", ["device_id", "problem_id", "backend"])
    op.create_table(
        "best_configs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("device_id", sa.Integer, sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("problem_id", sa.Integer, sa.ForeignKey("problems.id"), nullable=False),
        sa.Column("config_id", sa.Integer, sa.ForeignKey("kernel_configs.id"), nullable=False),
        sa.Column("measurement_id", sa.Integer, sa.ForeignKey("measurements.id")),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("study", sa.String(200), nullable=False),
        sa.Column("median_us", sa.Float, nullable=False),
        sa.Column("tflops", sa.Float, nullable=False),
        sa.Column("sdpa_default_us", sa.Float),
        sa.Column("sdpa_flash_us", sa.Float),
        sa.Column("speedup_vs_default", sa.Float),
        sa.Column("speedup_vs_flash", sa.Float),
        sa.Column("trials", sa.Integer, nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("device_id", "problem_id", name="uq_best_per_problem"),
    )


def downgrade() -> None:
    for table in (
        "best_configs",
        "baselines",
        "measurements",
        "problems",
        "builds",
        "kernel_configs",
        "devices",
    ):
        op.drop_table(table)
