"""Open the tuning database: resolve its URL, configure SQLite, make or demand its schema.

The default is a SQLite file in the user's cache directory, in WAL mode so that a reader (a
`best` query, runtime dispatch's lookups) never blocks a tuning session that is writing. Any
SQLAlchemy URL works (`--db URL` or $CUTE_AUTOTUNE_DB), PostgreSQL included.

Several processes may open one database at once (tuning workers, dispatch): making or changing
the schema happens under a lock (a lock file beside a SQLite database, an advisory lock on
PostgreSQL), so one process makes it and the others wait and find it made; and a writable
SQLite connection starts every transaction with BEGIN IMMEDIATE, so a transaction that reads
and then writes (get-or-create) holds the write lock from its first read, waiting up to the
busy timeout for another writer instead of failing on a snapshot it can no longer write.

A change of the schema is one transaction (store.migrate): a process killed at any instant
leaves the database as it was or as it was to be. A new database, or one holding no row of
ours (one a killed process of an older release left half made, say), is made at the newest
schema when it is opened. An older one holding rows is never changed behind the user's back:
opening it raises SchemaOutdated (or SchemaError, for one left between versions), whose message
names the command that upgrades or repairs it. A read-only open (`create=False`: `list`,
`best`, `export`) creates nothing: no folder, no file, no tables, and SQLite files are opened
read-only.

Every way a database can be unusable (a URL that is not one, a driver that is not installed, a
file that is not a database or is damaged, a folder that cannot be written) is a StoreError
whose one-line message names the database and what to do.
"""

from __future__ import annotations

import fcntl
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from weakref import WeakSet

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError

from .._paths import cache_dir
from .._shown import shown
from .migrate import VERSION_TABLE as VERSION_TABLE
from .migrate import RepairError, SchemaState, bring_to_head, read_state
from .migrate import current_revision as current_revision
from .migrate import head_revision as head_revision
from .migrate import known_revisions as known_revisions

# The schema's facts (its version table, revisions) are store.migrate's, named here too: the
# rest of the store reads them from this module.

DB_ENV = "CUTE_AUTOTUNE_DB"
# What to install for the DB-API modules SQLAlchemy's dialects import.
_DRIVER_PACKAGES = {
    "psycopg2": "psycopg2-binary",
    "psycopg": "'psycopg[binary]'",
    "MySQLdb": "mysqlclient",
    "pymysql": "pymysql",
    "asyncpg": "asyncpg",
}


class StoreError(RuntimeError):
    """The tuning database cannot be used; the message (one line) names it and says why."""


class SchemaError(StoreError):
    pass


class SchemaOutdated(SchemaError):
    pass


class ConnectionLost(StoreError):
    """The connection to the database broke (the server ended it, or the network dropped)
    inside a transaction, which was rolled back, or while it was being opened: the same work
    may be done again on a new connection (the pool makes one)."""


# SQLSTATEs of a server that ended the session or cannot take one now: connection_exception
# (class 08), admin_shutdown (pg_terminate_backend), crash_shutdown, cannot_connect_now.
_BROKEN_SQLSTATES = ("08", "57P01", "57P02", "57P03")


def _broken(exc: DBAPIError) -> bool:
    """Whether a SQLAlchemy-wrapped DB-API error is a connection that broke.

    SQLAlchemy marks it `connection_invalidated` when it broke under a Connection. One that
    breaks while the pool opens it (the connect, or the dialect's first queries on a new
    engine's first connection) is judged without a connection, and psycopg's dialect then
    answers "not a disconnect" (sqlalchemy/dialects/postgresql/psycopg.py, is_disconnect):
    a worker's step that opened a store as the server ended every connection failed its item
    (tests/faults/test_fault_rounds.py, the dropped-connections case). Those are told by the
    driver's SQLSTATE (psycopg 3: sqlstate, psycopg2: pgcode; other drivers have neither):
    one of a broken session, or none at all (the client's own "server closed the connection
    unexpectedly", "connection refused")."""
    if exc.connection_invalidated:
        return True
    if not isinstance(exc, OperationalError):
        return False
    for name in ("sqlstate", "pgcode"):
        if hasattr(exc.orig, name):
            state = getattr(exc.orig, name)
            return state is None or str(state).startswith(_BROKEN_SQLSTATES)
    return False


def lost_connection(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from (Optuna wraps SQLAlchemy's), is a
    connection to the database that broke: what a worker retries rather than fails on."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionLost) or (isinstance(seen, DBAPIError) and _broken(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def default_url() -> str:
    env = os.environ.get(DB_ENV)
    if env:
        return database_url(env)
    return f"sqlite:///{cache_dir() / 'tuning.db'}"


def database_url(text: str) -> str:
    """`text` as a SQLAlchemy URL: a URL (it has a scheme) as it is, anything else as the path
    of a SQLite file (`--db tuning.db`, `--db ~/dbs/h200.db`), made absolute."""
    if "://" in text:
        return text
    return f"sqlite:///{Path(text).expanduser().absolute()}"


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL (None for another database or an in-memory one)."""
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database).expanduser()


def describe(url: str | URL) -> str:
    """How messages name a database: a SQLite file by its path, others by URL (no password)."""
    try:
        parsed = make_url(database_url(url)) if isinstance(url, str) else url
    except ArgumentError:
        return repr(url)
    path = sqlite_path(parsed)
    return str(path) if path is not None else parsed.render_as_string(hide_password=True)


def database_error(url: str | URL, exc: DBAPIError) -> StoreError:
    """The one-line StoreError for a database error (the driver's own first line, and what
    usually causes it)."""
    reason = (str(exc.orig) if exc.orig is not None else str(exc)).strip().splitlines()
    text = reason[0] if reason else type(exc).__name__
    hints = {
        "unable to open database file": "the file or its folder cannot be opened; a SQLite "
        "database in WAL mode needs its folder writable, even to be read",
        "readonly database": "the file or its folder is read-only",
        "is not a database": "the file is not a SQLite database",
        "malformed": "the file is damaged: restore it from a backup, or point --db elsewhere",
        "locked": "another process holds a write lock for longer than the busy timeout",
    }
    hint = next((h for key, h in hints.items() if key in text), "")
    error = ConnectionLost if _broken(exc) else StoreError
    return error(
        f"the tuning database {describe(url)} cannot be used: {text}"
        + (f" ({hint})" if hint else "")
    )


def make_engine(url: str, *, create: bool = True, migrating: bool = False) -> Engine:
    """An engine on `url` (StoreError if the URL is not one or its driver is missing). With
    `create=False` a SQLite file must exist and is opened read-only. A writable SQLite engine
    begins every transaction with BEGIN IMMEDIATE; with `migrating`, its connections keep
    foreign keys off (the schema's changes, store.migrate)."""
    try:
        parsed = make_url(database_url(url))
    except ArgumentError:
        raise StoreError(
            f"{url!r} is not a database URL (e.g. sqlite:////path/tuning.db or "
            "postgresql+psycopg://user@host/dbname)"
        ) from None
    path = sqlite_path(parsed)
    if path is not None and path.is_dir():
        raise StoreError(
            f"{path} is a folder, not a database file: name a file, e.g. --db {path / 'tuning.db'}"
        )
    if path is not None and not create and not path.is_file():
        raise StoreError(
            f"no tuning database at {path}: nothing has been tuned or imported "
            "there (check --db; `cute-autotune tune` or `import` creates one)"
        )
    if path is not None and create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the folder of the tuning database {path}: {exc.strerror}"
            ) from None
    target: str | URL = parsed
    if path is not None and not create:
        # read-only at the file level: SQLite then creates no database, and writes nothing
        target = parsed.set(database=f"file:{path}?mode=ro", query={"uri": "true"})
    try:
        # A server's connection idle in the pool may have been ended meanwhile (a restart, a
        # network drop, pg_terminate_backend): checked at checkout, and replaced, rather than
        # failing the next transaction. (A SQLite file has no connection to lose.)
        engine = create_engine(
            target, pool_pre_ping=path is None and parsed.get_backend_name() != "sqlite"
        )
    except NoSuchModuleError:
        raise StoreError(
            f"{parsed.render_as_string()!r} is not a database URL: SQLAlchemy has "
            f"no dialect {parsed.drivername!r}"
        ) from None
    except ImportError as exc:
        module = exc.name or str(exc)
        package = _DRIVER_PACKAGES.get(module, module)
        raise StoreError(
            f"the database URL {parsed.render_as_string()} needs the Python module "
            f"{module!r}, which is not installed: pip install {package}"
            + (
                " (or use a postgresql+psycopg:// URL with pip install 'psycopg[binary]')"
                if parsed.get_backend_name() == "postgresql"
                else ""
            )
        ) from None
    event.listen(engine, "before_cursor_execute", _refuse_nul)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            if create:  # a read-only connection reads a WAL database as it is
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA foreign_keys={'OFF' if migrating else 'ON'}")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
            cursor.close()
            # SQLite keeps any bytes in a text column; the driver's strict decoding would fail
            # the whole query on one row that is not UTF-8. Read so, such text fails the check
            # of its row (a config's digest, a name's characters) and the rest are served.
            dbapi_connection.text_factory = _text_of

        if create:
            _begin_writes_immediately(engine)
    return engine


def _refuse_nul(
    _connection: Any,
    _cursor: Any,
    _statement: str,
    parameters: Any,
    _context: Any,
    _executemany: bool,
) -> None:
    """Refuse a NUL in any text a statement sends, before it is sent: PostgreSQL's text cannot
    hold one (its driver refuses the statement), SQLite would store it, and every database
    must take or refuse the same strings. (Writes through the ORM are refused earlier, with
    their table and column named: models.check_column_bounds.)"""
    # one row or many, as a tuple, list or dict of values, whichever `executemany` says
    # (a batched insert sends its rows flattened into one tuple): every value is looked at
    pending = [parameters]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if "\x00" in value:
                raise ValueError(f"text cannot hold the NUL character, got {shown(value)}")
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)


def _text_of(stored: bytes) -> str:
    return stored.decode("utf-8", "replace")


# An execution option of an engine (`engine.execution_options(**READ_ONLY)`) whose transactions
# only read: on SQLite they begin deferred, taking no write lock.
READ_ONLY_OPTION = "cute_autotune_reads_only"
READ_ONLY = {READ_ONLY_OPTION: True}


# How long a SQLite connection waits for another process's write lock before it fails.
SQLITE_BUSY_MS = 30000


def _begin_writes_immediately(engine: Engine) -> None:
    """Transactions on this SQLite engine are begun here, not by the driver: BEGIN IMMEDIATE,
    or a plain BEGIN for one run with READ_ONLY."""

    @event.listens_for(engine, "connect")
    def _driver_begins_nothing(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        reads_only = connection.get_execution_options().get(READ_ONLY_OPTION)
        connection.exec_driver_sql("BEGIN" if reads_only else "BEGIN IMMEDIATE")


def sqlite_immediate_writes(engine: Engine) -> None:
    """Make an engine that another library created on a SQLite database (Optuna's storage)
    behave like ours: the busy timeout, and every transaction begun with BEGIN IMMEDIATE."""
    if engine.dialect.name != "sqlite":
        return

    @event.listens_for(engine, "connect")
    def _busy_timeout(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        cursor.close()

    _begin_writes_immediately(engine)
    engine.dispose()  # connections made before the hooks: gone


@contextmanager
def schema_lock(url: str | URL, *, create: bool = True) -> Iterator[None]:
    """Held by the one process that creates or migrates a database's schema (and by a reader
    that finds it half made, until the creator is done): an exclusive lock on the file
    `<database>.lock` beside a SQLite database, a session-level advisory lock on PostgreSQL;
    other databases get none. A read-only SQLite open (`create=False`) takes the lock only if
    a creator has made its file."""
    parsed = make_url(url) if isinstance(url, str) else url
    path = sqlite_path(parsed)
    if path is not None:
        lock_path = path.with_name(path.name + ".lock")
        if not create and not lock_path.exists():
            yield
            return
        with open(lock_path, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return
    if parsed.get_backend_name() == "postgresql":
        key = zlib.crc32(f"cute-autotune schema {parsed.database}".encode()) - 2**31
        engine = create_engine(parsed, poolclass=_null_pool())
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
                connection.commit()
                try:
                    yield
                finally:
                    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
                    connection.commit()
        finally:
            engine.dispose()
        return
    yield


def _null_pool() -> Any:
    from sqlalchemy.pool import NullPool

    return NullPool


@dataclass(frozen=True)
class Upgrade:
    """What `upgrade` did: the revision it found (None: none), the one it left, and how."""

    before: str | None
    after: str
    done: str  # "made", "upgraded", "repaired (...)", "already at the newest schema"


def upgrade(engine: Engine) -> Upgrade:
    """Bring the database to the newest schema, under the schema lock, in one transaction:
    made if new, upgraded if old, and repaired if a process killed while an older release
    made or upgraded it left it between versions (store.migrate). A database whose tables
    were not made by cute-autotune, or that a newer release wrote, is refused (SchemaError)."""
    with schema_lock(engine.url), _schema_transaction(engine) as connection:
        state = read_state(connection)
        _refuse_newer(state, describe(engine.url))
        if state.revision == head_revision() and state.whole():
            return Upgrade(state.revision, state.revision, "already at the newest schema")
        try:
            done = bring_to_head(connection, state)
        except RepairError as exc:
            raise SchemaError(f"{describe(engine.url)} cannot be upgraded: {exc}") from None
        return Upgrade(state.revision, head_revision(), done)


@contextmanager
def _schema_transaction(engine: Engine) -> Iterator[Connection]:
    """The one transaction a change of the schema runs in. A SQLite file is changed through an
    engine of its own: transactions begun by hand (the driver's own handling commits each
    CREATE and ALTER at once, so a kill would leave half a change), foreign keys off (a
    migration that copies a table drops the original, which the rows referring to it would
    refuse; the copy keeps every id)."""
    if sqlite_path(engine.url) is None:
        with engine.begin() as connection:
            yield connection
        return
    own = make_engine(engine.url.render_as_string(hide_password=False), migrating=True)
    try:
        with own.begin() as connection:
            yield connection
    finally:
        own.dispose()
        # A SQLite connection opened before the change may answer PRAGMAs (the inspector's
        # index and column lists) from the schema it read then: none outlives the change.
        engine.dispose()


def _refuse_newer(state: SchemaState, name: str) -> None:
    if state.revision is not None and state.revision not in known_revisions():
        raise SchemaError(
            f"the tuning database {name} has schema {state.revision}, which this "
            f"cute-autotune (schema {head_revision()}) does not know: it was "
            "written by a newer release; upgrade cute-autotune"
        )


def _refuse_unless_automatic(state: SchemaState, url: str, *, create: bool) -> None:
    """Raise unless opening may bring this database to the newest schema by itself: it is
    new, or holds no row of ours (made again: nothing in it to back up), and `create`. An
    older database holding rows is never changed behind the user's back."""
    _refuse_newer(state, url)
    foreign = state.foreign()
    if foreign:
        raise SchemaError(
            f"{describe(url)} has tables named as cute-autotune's "
            f"({', '.join(sorted(foreign))}) but no schema version of ours "
            "matches them: it was not made by cute-autotune or is damaged"
        )
    if not state.has_rows:
        if not create:
            raise SchemaError(
                f"{describe(url)} holds no cute-autotune results (tune or import into it first)"
            )
        return
    if state.revision is None:
        raise SchemaError(
            f"the tuning database {url} holds cute-autotune's tables and rows but no schema "
            "version (a process was killed while an older release made or upgraded it). "
            f"Back it up, then repair it in place with:  cute-autotune db upgrade --db '{url}'"
        )
    raise SchemaOutdated(
        f"the tuning database {url} has schema {state.revision}; this cute-autotune needs "
        f"{head_revision()}. Back it up, then upgrade it in place with:  "
        f"cute-autotune db upgrade --db '{url}'"
    )


def check_schema(engine: Engine, url: str, *, create: bool = True) -> None:
    """Return once the database is at the newest schema: made here if it is new or holds no
    row of ours (and `create`), else refused with what to do."""
    if current_revision(engine) == head_revision():
        return
    # Made by no one yet, being made or repaired by another process right now, or old: decided
    # under the schema lock, which a process changing the schema holds until it is done.
    with schema_lock(url, create=create):
        if not create:
            with engine.connect() as connection:
                state = read_state(connection)
            if state.revision != head_revision():
                _refuse_unless_automatic(state, url, create=False)
            return
        with _schema_transaction(engine) as connection:
            state = read_state(connection)
            if state.revision == head_revision():
                return
            _refuse_unless_automatic(state, url, create=True)
            bring_to_head(connection, state)


# Engines whose schema has been checked: the check (a few queries) runs once per engine, when
# the store opens it, never again on the lookups and writes made through it.
_checked: WeakSet[Engine] = WeakSet()


def ensure_schema(engine: Engine, url: str, *, create: bool = True) -> None:
    """`check_schema`, once per engine (a DBAPIError becomes a StoreError)."""
    if engine in _checked:
        return
    try:
        check_schema(engine, url, create=create)
    except DBAPIError as exc:
        raise database_error(url, exc) from None
    _checked.add(engine)


def open_engine(url: str | None = None, *, create: bool = True) -> Engine:
    """An engine on a database at the newest schema (created if new and `create`; refused if
    old). Every failure is a StoreError."""
    url = url or default_url()
    engine = make_engine(url, create=create)
    try:
        ensure_schema(engine, url, create=create)
    except StoreError:
        engine.dispose()
        raise
    return engine
