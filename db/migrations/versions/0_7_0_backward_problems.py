"""cute-autotune 0.7.0: a problem says which pass is timed (`backward`: the gradients of q, k
and v; `deterministic`: bit-identical ones), part of its identity and of its class (a
backward problem's best config, baselines and nearest neighbours are never a forward's).
Rows before it are forward problems.

Revision ID: 0.7.0
Revises: 0.6.0
"""

import sqlalchemy as sa
from alembic import op

revision = "0.7.0"
down_revision = "0.6.0"
branch_labels = None
depends_on = None

_SHAPE = [
    "dtype",
    "batch",
    "heads_q",
    "heads_kv",
    "seqlen_q",
    "seqlen_k",
    "head_dim",
    "causal",
    "kv_cache",
]
_CLASS = ["dtype", "head_dim", "causal", "kv_cache"]
_SIZES = ["seqlen_q", "seqlen_k", "batch", "heads_q", "heads_kv"]
_PASS = ["backward", "deterministic"]


# As in 0.4.0: SQLite changes a constraint by copying the table, which store.migrate runs
# inside one transaction with foreign keys off; the copy keeps every id, checked here.
def _check_foreign_keys() -> None:
    if op.get_bind().dialect.name == "sqlite":
        broken = op.get_bind().exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"the problems table copy broke {len(broken)} references")


def upgrade() -> None:
    op.drop_index("ix_problems_class", table_name="problems")
    with op.batch_alter_table("problems") as batch:
        for name in _PASS:
            batch.add_column(
                sa.Column(name, sa.Boolean, nullable=False, server_default=sa.false())
            )
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", [*_SHAPE, *_PASS])
    op.create_index("ix_problems_class", "problems", [*_CLASS, *_PASS, *_SIZES])
    _check_foreign_keys()


def downgrade() -> None:
    # A backward problem has no form in 0.6.0; dropping its rows would drop measurements.
    held = (
        op.get_bind()
        .execute(sa.text("SELECT COUNT(*) FROM problems WHERE backward OR deterministic"))
        .scalar()
    )
    if held:
        raise RuntimeError(
            f"{held} problems are backward problems, which schema 0.6.0 cannot hold; "
            "export them and delete them first"
        )
    op.drop_index("ix_problems_class", table_name="problems")
    with op.batch_alter_table("problems") as batch:
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", _SHAPE)
        for name in reversed(_PASS):
            batch.drop_column(name)
    op.create_index("ix_problems_class", "problems", [*_CLASS, *_SIZES])
    _check_foreign_keys()
