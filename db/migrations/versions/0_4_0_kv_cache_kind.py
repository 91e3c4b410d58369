"""cute-autotune 0.4.0: a problem says how its keys and values are held (`kv_cache`: "dense",
"seqlens" or "paged<N>", the decode family's KV caches), part of its identity and of its class
(nearest-problem lookup stays within one kind). Rows before it are "dense".

Revision ID: 0.4.0
Revises: 0.3.0
"""

import sqlalchemy as sa
from alembic import op

revision = "0.4.0"
down_revision = "0.3.0"
branch_labels = None
depends_on = None

_SHAPE = ["dtype", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "causal"]
_CLASS = ["dtype", "head_dim", "causal", "seqlen_q", "seqlen_k", "batch", "heads_q", "heads_kv"]


# SQLite changes a constraint by copying the table and dropping the old one, which the rows
# referring to it (measurements, best configs) would refuse: store.migrate runs every SQLite
# migration inside one transaction with foreign keys off (the pragma cannot change inside one).
# The copy keeps every id, so the references hold again once it is renamed (checked before the
# end of the migration).


def _check_foreign_keys() -> None:
    if op.get_bind().dialect.name == "sqlite":
        broken = op.get_bind().exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"the problems table copy broke {len(broken)} references")


def upgrade() -> None:
    op.drop_index("ix_problems_class", table_name="problems")
    with op.batch_alter_table("problems") as batch:
        batch.add_column(
            sa.Column("kv_cache", sa.String(16), nullable=False, server_default="dense")
        )
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", [*_SHAPE, "kv_cache"])
    op.create_index("ix_problems_class", "problems", [*_CLASS[:3], "kv_cache", *_CLASS[3:]])
    _check_foreign_keys()


def downgrade() -> None:
    # A KV-cache problem has no form in 0.3.0; dropping its rows would drop measurements.
    held = (
        op.get_bind()
        .execute(sa.text("SELECT COUNT(*) FROM problems WHERE kv_cache <> 'dense'"))
        .scalar()
    )
    if held:
        raise RuntimeError(
            f"{held} problems are KV-cache problems (kv_cache other than dense), "
            "which schema 0.3.0 cannot hold; export them and delete them first"
        )
    op.drop_index("ix_problems_class", table_name="problems")
    with op.batch_alter_table("problems") as batch:
        batch.drop_constraint("uq_problems_shape", type_="unique")
        batch.create_unique_constraint("uq_problems_shape", _SHAPE)
        batch.drop_column("kv_cache")
    op.create_index("ix_problems_class", "problems", _CLASS)
    _check_foreign_keys()
