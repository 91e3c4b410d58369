"""A kill while a tuning database is made or upgraded (issue 37, item 1).

Two kinds of case. The kill rounds: processes killed (SIGKILL) at random instants while they
make a new database, on SQLite and PostgreSQL, each followed by the next process with no hand
step between (tests/faults/kill_during_create.py; 0 wedged). And the partial states an older
release left when it was killed (it ran each migration in a transaction of its own, on SQLite
under the driver's own transaction handling, which commits each CREATE and ALTER at once),
made here by hand: each is made again when it is opened if it holds no row of ours, and
otherwise refused with the command that repairs it, which then repairs it with every row kept.
Before store.migrate, the upgrade command failed on these ("table devices already exists", "no
such index").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from autotune.cli.main import main
from autotune.store.migrate import BATCH_COPY, head_revision, read_state
from autotune.store.repo import TuningStore
from autotune.store.schema import (
    VERSION_TABLE,
    SchemaError,
    make_engine,
    open_engine,
    upgrade,
)
from tests.conftest import PG_ENV
from tests.faults.conftest import export_doc, export_entry

REPO = Path(__file__).resolve().parents[2]
OLD_RELEASE = REPO / "tests" / "data" / "tuning-0.3.0.db"  # the release before 0.4.0's copy
KILLS = int(os.environ.get("CUTE_AUTOTUNE_CREATE_KILLS", "12"))  # per database; more on demand


def _kill_rounds(template: str, admin_url: str | None = None) -> dict[str, Any]:
    args = [sys.executable, "-m", "tests.faults.kill_during_create", template, str(KILLS)]
    done = subprocess.run(
        args + ([admin_url] if admin_url else []),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_kills_while_a_new_sqlite_database_is_made_wedge_nothing(
    tmp_path: Path, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    result = _kill_rounds(f"sqlite:///{tmp_path}/round-{{round}}.db")
    fault_summary(
        {
            "case": "sqlite: kill -9 while a new database is made, then the next process",
            "backend": "sqlite",
            **result,
        }
    )
    assert result["kills"] >= KILLS // 2, result  # most kills land inside the making
    assert result["wedged"] == 0, result["errors"]


@pytest.mark.postgres
def test_kills_while_a_new_postgres_database_is_made_wedge_nothing(
    postgres_url: str, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    result = _kill_rounds(postgres_url, os.environ[PG_ENV])
    fault_summary(
        {
            "case": "postgresql: kill -9 while a new database is made, then the next process",
            "backend": "postgresql",
            **result,
        }
    )
    assert result["kills"] >= KILLS // 2, result
    assert result["wedged"] == 0, result["errors"]


# -- the partial states an older release's kill left --------------------------------------------


def _rows(url: str) -> dict[str, int]:
    engine = make_engine(url, create=False)
    try:
        with engine.connect() as c:
            return {
                t: int(c.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one())
                for t in ("devices", "problems", "kernel_configs", "measurements", "best_configs")
            }
    finally:
        engine.dispose()


def _sql(url: str, *statements: str) -> None:
    # the driver's own transaction handling, as the older releases made their schema with
    engine = make_engine(url, migrating=True)
    try:
        with engine.connect() as c:
            for statement in statements:
                c.exec_driver_sql(statement)
            c.commit()
    finally:
        engine.dispose()


def _whole(url: str) -> bool:
    engine = make_engine(url, create=False)
    try:
        with engine.connect() as c:
            state = read_state(c)
        return state.revision == head_revision() and state.whole()
    finally:
        engine.dispose()


def _upgrade_command(url: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["db", "upgrade", "--db", url]) == 0
    return capsys.readouterr().out


def _old_release(tmp_path: Path) -> str:
    copy = tmp_path / "old.db"
    shutil.copy(OLD_RELEASE, copy)
    return f"sqlite:///{copy}"


def test_tables_without_a_version_and_no_rows_are_made_again_when_opened(tmp_path: Path) -> None:
    """Killed after the first migration's CREATEs and before its version row (SQLite)."""
    url = f"sqlite:///{tmp_path}/half.db"
    open_engine(url).dispose()
    _sql(url, f"DROP TABLE {VERSION_TABLE}", "DROP TABLE best_configs")
    store = TuningStore(url)  # no hand step
    store.import_results(export_doc([export_entry()]), overwrite=True)
    assert len(store.list_best()) == 1
    assert _whole(url)


def test_tables_with_rows_but_no_version_are_refused_then_repaired_with_every_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _old_release(tmp_path)
    before = _rows(url)
    _sql(url, f"DELETE FROM {VERSION_TABLE}")
    with pytest.raises(SchemaError, match=r"no schema version.*cute-autotune db upgrade --db"):
        open_engine(url)
    assert "repaired" in _upgrade_command(url, capsys)
    assert _rows(url) == before and _whole(url)
    assert TuningStore(url).list_best()


def test_a_version_with_part_of_the_next_migration_applied_is_repaired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.4.0's first step (an index dropped) landed, the version still says 0.3.0: the upgrade
    failed with 'no such index' before."""
    url = _old_release(tmp_path)
    before = _rows(url)
    _sql(url, "DROP INDEX ix_problems_class")
    assert "repaired" in _upgrade_command(url, capsys)
    assert _rows(url) == before and _whole(url)


def test_a_table_left_as_alembics_half_copy_is_repaired_with_every_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed inside 0.4.0's copy of `problems`, between dropping it and renaming the copy:
    its rows are only in the copy, which the measurements' references now point through."""
    url = _old_release(tmp_path)
    before = _rows(url)
    copy = BATCH_COPY + "problems"
    _sql(
        url,
        "DROP INDEX ix_problems_class",
        f"CREATE TABLE {copy} AS SELECT *, 'dense' AS kv_cache FROM problems",
        "DROP TABLE problems",
    )
    with pytest.raises(SchemaError, match="cute-autotune db upgrade --db"):
        open_engine(url)
    assert "repaired" in _upgrade_command(url, capsys)
    assert _rows(url) == before and _whole(url)
    engine = make_engine(url)
    with engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
    engine.dispose()
    store = TuningStore(url)
    assert len(store.list_best()) == before["best_configs"]
    store.import_results(export_doc([export_entry(seqlen=4096)]), overwrite=True)  # writable


def test_an_upgrade_killed_midway_leaves_the_database_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule itself: an upgrade stopped half way (0.4.0's copy of `problems` done, then an
    exception where a kill would stop it) changes nothing, SQLite's DDL included."""
    from alembic import command

    from autotune.store import migrate

    url = _old_release(tmp_path)
    before = _rows(url)

    def stopped(connection: Any) -> None:
        command.upgrade(migrate.alembic_config(connection), "0.4.0")
        raise KeyboardInterrupt

    monkeypatch.setattr(migrate, "migrate", stopped)
    with pytest.raises(KeyboardInterrupt):
        upgrade(make_engine(url))
    engine = make_engine(url, create=False)
    with engine.connect() as c:
        state = read_state(c)
    engine.dispose()
    assert state.revision == "0.3.0" and state.whole() and _rows(url) == before


@pytest.mark.postgres
def test_postgres_tables_with_rows_but_no_version_are_repaired(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = TuningStore(postgres_url)
    store.import_results(export_doc([export_entry()]), overwrite=True)
    store.engine.dispose()
    _sql(postgres_url, f"DROP TABLE {VERSION_TABLE}")
    with pytest.raises(SchemaError, match="cute-autotune db upgrade --db"):
        open_engine(postgres_url)
    assert "repaired" in _upgrade_command(postgres_url, capsys)
    store = TuningStore(postgres_url)
    assert len(store.list_best()) == 1
    # the id sequences start past the copied ids: a new row is written
    store.import_results(export_doc([export_entry(seqlen=4096)]), overwrite=True)
    assert len(store.list_best()) == 2
    assert make_url(postgres_url).get_backend_name() == "postgresql"
