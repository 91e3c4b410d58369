"""The tuning database's schema made, upgraded and repaired, each whole or not at all.

Every change of the schema runs inside one transaction on a connection the caller holds the
schema lock for (store.schema): a new database is made at the newest schema, an old one brought
to it, in one transaction, so a process killed at any instant leaves the database as it was
before the change or as it is after it, never between. (SQLite's DDL is transactional when the
transaction is begun by hand: store.schema's migration engine begins it with BEGIN IMMEDIATE,
with foreign keys off, which SQLite can switch only outside a transaction.)

Releases before this rule ran each migration in a transaction of its own, on SQLite under the
driver's own transaction handling, which commits each CREATE and ALTER at once: a process
killed while it made or upgraded a database left tables without a version row, or a version
with part of the next migration applied. Such a state is told apart by `SchemaState` (the
tables of ours present, their columns, whether any holds a row), and `bring_to_head` repairs
it: a database holding no row is made again from nothing; one holding rows whose tables are not
exactly those of its version is rebuilt (its rows kept aside in temporary tables, the schema
made new, the rows copied back column by column: every column a later release added is
nullable or has a default).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Connection, Engine

from .._paths import db_dir

VERSION_TABLE = "cute_autotune_schema"
# Alembic's batch mode on SQLite copies a table it changes into this name first, drops the
# original and renames the copy: a kill between the drop and the rename left the rows here.
BATCH_COPY = "_alembic_tmp_"
# The temporary tables a rebuild keeps a table's rows in meanwhile.
_KEPT = "_cute_autotune_kept_"

_log = logging.getLogger(__name__)


class RepairError(RuntimeError):
    """The database's tables are not ones this release made, so it will not change them."""


def alembic_config(connection: Any) -> Any:
    from alembic.config import Config as AlembicConfig

    config = AlembicConfig()
    config.set_main_option("script_location", str(db_dir() / "migrations"))
    config.attributes["connection"] = connection
    return config


@cache
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(None)).get_current_head()
    assert head is not None
    return head


@cache
def known_revisions() -> tuple[str, ...]:
    """Every schema revision, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(None))
    return tuple(rev.revision for rev in reversed(list(script.walk_revisions())))


def current_revision(bind: Engine | Connection) -> str | None:
    """The revision the version table names (None: no table, or no row in it)."""
    if not inspect(bind).has_table(VERSION_TABLE):
        return None
    from alembic.runtime.migration import MigrationContext

    def read(connection: Connection) -> str | None:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()

    if isinstance(bind, Connection):
        return read(bind)
    with bind.connect() as connection:
        return read(connection)


@cache
def revision_shapes() -> dict[str, tuple[dict[str, frozenset[str]], frozenset[str]]]:
    """revision -> (our table -> its columns, the indexes on our tables), as the migrations
    make them (replayed once per process on an in-memory SQLite database)."""
    from alembic import command

    engine = create_engine("sqlite://")
    shapes: dict[str, tuple[dict[str, frozenset[str]], frozenset[str]]] = {}
    try:
        with engine.connect() as connection:
            for revision in known_revisions():
                with connection.begin():
                    command.upgrade(alembic_config(connection), revision)
                    tables = inspect(connection).get_table_names()
                    shapes[revision] = (_columns(connection, tables), _indexes(connection, tables))
    finally:
        engine.dispose()
    return shapes


def revision_columns() -> dict[str, dict[str, frozenset[str]]]:
    """revision -> our table -> its columns, as the migrations make them."""
    return {revision: columns for revision, (columns, _) in revision_shapes().items()}


def _columns(connection: Connection, tables: Iterable[str]) -> dict[str, frozenset[str]]:
    inspector = inspect(connection)
    return {
        t: frozenset(c["name"] for c in inspector.get_columns(t))
        for t in tables
        if t != VERSION_TABLE
    }


def _indexes(connection: Connection, tables: Iterable[str]) -> frozenset[str]:
    """The named indexes on `tables` (a migration that dropped one and was stopped before it
    made it again leaves every column as it was: only the index tells). PostgreSQL lists a
    unique constraint's own index too, which SQLite does not: left out, to compare alike."""
    inspector = inspect(connection)
    return frozenset(
        str(i["name"])
        for t in tables
        if t != VERSION_TABLE
        for i in inspector.get_indexes(t)
        if i["name"] and "duplicates_constraint" not in i
    )


@cache
def _our_tables() -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Each table any revision has: (the columns it was made with, every column it ever had)."""
    first: dict[str, frozenset[str]] = {}
    ever: dict[str, frozenset[str]] = {}
    for shape in revision_columns().values():
        for table, columns in shape.items():
            first.setdefault(table, columns)
            ever[table] = ever.get(table, frozenset()) | columns
    return {t: (first[t], ever[t]) for t in first}


@dataclass(frozen=True)
class SchemaState:
    """What of our schema a database holds (never Optuna's tables, which share it)."""

    revision: str | None
    tables: dict[str, frozenset[str]]  # ours and Alembic's batch copies of ours: their columns
    has_rows: bool
    indexes: frozenset[str] = frozenset()  # the named indexes on those tables

    @property
    def empty(self) -> bool:
        """Nothing of ours at all: a new database (or one of Optuna's tables only)."""
        return self.revision is None and not self.tables

    def foreign(self) -> list[str]:
        """Tables of our names whose columns no revision of ours made: not ours to change."""
        known = _our_tables()
        strange = []
        for table, columns in self.tables.items():
            name = table.removeprefix(BATCH_COPY)
            made_with, ever = known[name]
            if not columns <= ever or (name == table and not made_with <= columns):
                strange.append(table)
        return strange

    def whole(self) -> bool:
        """Its tables and indexes are exactly those of its revision."""
        shape = revision_shapes().get(self.revision or "")
        return shape is not None and (self.tables, self.indexes) == shape


def read_state(connection: Connection) -> SchemaState:
    from .models import Base

    names = inspect(connection).get_table_names()
    if VERSION_TABLE not in names and not any(
        t.removeprefix(BATCH_COPY) in Base.metadata.tables for t in names
    ):
        # a new database (every table a release made is one of the newest's): told apart
        # without replaying the migrations (revision_shapes)
        return SchemaState(None, {}, False)
    known = _our_tables()
    present = [t for t in names if t.removeprefix(BATCH_COPY) in known]
    has_rows = any(
        connection.execute(text(f"SELECT 1 FROM {_quote(connection, t)} LIMIT 1")).first()
        is not None
        for t in present
    )
    return SchemaState(
        current_revision(connection),
        _columns(connection, present),
        has_rows,
        _indexes(connection, present),
    )


def _quote(connection: Connection, name: str) -> str:
    return str(connection.dialect.identifier_preparer.quote(name))


def migrate(connection: Connection) -> None:
    """Every pending migration, inside the caller's transaction."""
    from alembic import command

    command.upgrade(alembic_config(connection), "head")


def bring_to_head(connection: Connection, state: SchemaState) -> str:
    """Make, upgrade or repair the schema to the newest revision inside the caller's
    transaction (the schema lock held); returns what was done, for the log and `db upgrade`."""
    foreign = state.foreign()
    if foreign:
        raise RepairError(
            f"tables {', '.join(sorted(foreign))} have columns no release of "
            "cute-autotune made: the database was not made by cute-autotune, or "
            "was changed by hand"
        )
    if state.empty:
        migrate(connection)
        return "made"
    if not state.has_rows:
        _drop(connection, state.tables)
        migrate(connection)
        return "made again (it held no rows)"
    if state.revision is not None and state.whole():
        migrate(connection)
        return "upgraded"
    _rebuild(connection, state)
    return "repaired (its tables did not match its version; every row was kept)"


def _drop(connection: Connection, tables: Iterable[str]) -> None:
    """Drop our tables (children first: PostgreSQL keeps foreign keys on) and the version."""
    from .models import Base

    order = [t.name for t in reversed(Base.metadata.sorted_tables)]
    tables = set(tables)
    for table in [t for t in order if t in tables] + sorted(tables - set(order)):
        connection.execute(text(f"DROP TABLE {_quote(connection, table)}"))
    if inspect(connection).has_table(VERSION_TABLE):
        connection.execute(text(f"DROP TABLE {_quote(connection, VERSION_TABLE)}"))


def _rebuild(connection: Connection, state: SchemaState) -> None:
    """Keep every row aside, make the schema new, copy the rows back."""
    from .models import Base

    kept: dict[str, frozenset[str]] = {}
    for table in Base.metadata.sorted_tables:
        source = next(
            (t for t in (table.name, BATCH_COPY + table.name) if t in state.tables), None
        )
        if source is None:
            continue
        connection.execute(
            text(
                f"CREATE TEMPORARY TABLE {_quote(connection, _KEPT + table.name)}"
                f" AS SELECT * FROM {_quote(connection, source)}"
            )
        )
        kept[table.name] = state.tables[source]
    _drop(connection, state.tables)
    migrate(connection)
    made = _columns(connection, kept)
    for table in Base.metadata.sorted_tables:
        if table.name not in kept:
            continue
        columns = ", ".join(
            _quote(connection, c) for c in sorted(kept[table.name] & made[table.name])
        )
        name, copy = _quote(connection, table.name), _quote(connection, _KEPT + table.name)
        connection.execute(text(f"INSERT INTO {name} ({columns}) SELECT {columns} FROM {copy}"))
        connection.execute(text(f"DROP TABLE {copy}"))
        if connection.dialect.name == "postgresql":
            # the ids were copied, so the id sequence starts after the largest
            connection.execute(
                text(
                    f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
                    f"COALESCE(MAX(id), 0) + 1, false) FROM {name}"
                )
            )
    _log.warning(
        "the tuning database's tables did not match its schema version %s (a process "
        "was killed while an older release made or upgraded it): rebuilt at %s with "
        "every row kept",
        state.revision or "(none)",
        head_revision(),
    )
