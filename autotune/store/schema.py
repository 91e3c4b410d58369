"""Open the tuning database: resolve its URL, configure SQLite, apply or demand migrations.

The default is a SQLite file in the user's cache directory, in WAL mode so that a reader (a
`best` query, runtime dispatch) never blocks a tuning session that is writing. Any SQLAlchemy
URL works (`--db URL` or $CUTE_AUTOTUNE_DB), PostgreSQL included.

A fresh or empty database is created at the newest schema. An older one is never changed
behind the user's back: opening it raises SchemaOutdated, whose message names the command that
upgrades it.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine

from .._paths import cache_dir, db_dir

VERSION_TABLE = "cute_autotune_schema"
DB_ENV = "CUTE_AUTOTUNE_DB"


class SchemaError(RuntimeError):
    pass


class SchemaOutdated(SchemaError):
    pass


def default_url() -> str:
    env = os.environ.get(DB_ENV)
    if env:
        return env
    return f"sqlite:///{cache_dir() / 'tuning.db'}"


def _alembic_config(connection: Any) -> Any:
    from alembic.config import Config as AlembicConfig

    config = AlembicConfig()
    config.set_main_option("script_location", str(db_dir() / "migrations"))
    config.attributes["connection"] = connection
    return config


@cache
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_alembic_config(None))
    head = script.get_current_head()
    assert head is not None
    return head


def known_revisions() -> list[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_alembic_config(None))
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        path = url[len("sqlite:///"):]
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    engine = create_engine(url, future=True)
    if engine.dialect.name == "sqlite":
        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()
    return engine


def current_revision(engine: Engine) -> str | None:
    if VERSION_TABLE not in inspect(engine).get_table_names():
        return None
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        context = MigrationContext.configure(connection,
                                             opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Migrate to the newest schema; returns (from, to)."""
    from alembic import command

    before = current_revision(engine)
    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), "head")
    return before, head_revision()


def check_schema(engine: Engine, url: str) -> None:
    revision = current_revision(engine)
    head = head_revision()
    if revision is None:
        ours = {"devices", "kernel_configs", "measurements", "best_configs"}
        if ours & set(inspect(engine).get_table_names()):
            raise SchemaError(f"{url} has cute-autotune tables but no schema version; it was not "
                              "made by cute-autotune or is damaged")
        upgrade(engine)  # a new database (or one holding only Optuna's tables)
        return
    if revision == head:
        return
    if revision in known_revisions():
        raise SchemaOutdated(
            f"the tuning database {url} has schema {revision}; this cute-autotune needs {head}. "
            f"Back it up, then upgrade it in place with:  cute-autotune db upgrade --db '{url}'")
    raise SchemaError(f"the tuning database {url} has schema {revision}, which this "
                      f"cute-autotune (schema {head}) does not know: it was written by a newer "
                      "release; upgrade cute-autotune")


def open_engine(url: str | None = None) -> Engine:
    """An engine on a database at the newest schema (created if new; refused if old)."""
    url = url or default_url()
    engine = make_engine(url)
    check_schema(engine, url)
    return engine
