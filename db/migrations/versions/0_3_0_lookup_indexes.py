"""cute-autotune 0.3.0: indexes for the store's lookups, which filter in SQL (exact best,
nearest tuned problem, the region rule of dispatch): the problem class (dtype, head dim,
causality, then the sizes, so that a class is read from the index alone) and a best config's
problem.

Revision ID: 0.3.0
Revises: 0.2.0
"""

from alembic import op

revision = "0.3.0"
down_revision = "0.2.0"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_problems_class",
        "problems",
        ["dtype", "head_dim", "causal", "seqlen_q", "seqlen_k", "batch", "heads_q", "heads_kv"],
    )
    op.create_index("ix_best_configs_problem", "best_configs", ["problem_id"])


def downgrade() -> None:
    op.drop_index("ix_best_configs_problem", table_name="best_configs")
    op.drop_index("ix_problems_class", table_name="problems")
