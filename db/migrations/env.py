"""Alembic environment for cute-autotune's own tables (run programmatically by
autotune.store.schema; there is no alembic.ini). The revision is kept in
`cute_autotune_schema`, not `alembic_version`, which Optuna's storage owns in the same database.
"""

from alembic import context

from autotune.store.migrate import VERSION_TABLE
from autotune.store.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
