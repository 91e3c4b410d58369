from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa

from autotune.store import schema
from autotune.store.models import Base
from autotune.store.repo import TuningStore
from autotune.store.schema import (
    VERSION_TABLE,
    SchemaError,
    SchemaOutdated,
    current_revision,
    head_revision,
    make_engine,
    open_engine,
    upgrade,
)

DATA = Path(__file__).resolve().parent.parent / "data"


def test_empty_database_is_created_at_the_newest_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    engine = open_engine(url)
    assert current_revision(engine) == head_revision()
    tables = set(sa.inspect(engine).get_table_names())
    assert {
        "devices",
        "kernel_configs",
        "builds",
        "problems",
        "measurements",
        "baselines",
        "best_configs",
        VERSION_TABLE,
    } <= tables
    assert "alembic_version" not in tables  # that name belongs to Optuna's storage
    with engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_the_models_match_the_migrations(tmp_path: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = open_engine(f"sqlite:///{tmp_path}/m.db")
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        diff = [
            d
            for d in compare_metadata(context, Base.metadata)
            if not (isinstance(d, tuple) and d[0] == "remove_table")
        ]
    assert diff == []


def test_optuna_tables_share_the_database(tmp_path: Path) -> None:
    import optuna

    url = f"sqlite:///{tmp_path}/shared.db"
    optuna.storages.RDBStorage(url)  # Optuna first: our migration must still apply
    engine = open_engine(url)
    tables = set(sa.inspect(engine).get_table_names())
    assert {"studies", "trials", "alembic_version", "best_configs", VERSION_TABLE} <= tables
    optuna.create_study(storage=url, study_name="s")  # and Optuna still works after ours
    assert current_revision(open_engine(url)) == head_revision()


def test_fixture_database_of_each_release_upgrades(tmp_path: Path) -> None:
    """tests/data/tuning-<release>.db were written by that release; upgrading keeps the data."""
    fixtures = sorted(DATA.glob("tuning-*.db"))
    assert fixtures, "no fixture databases"
    for fixture in fixtures:
        copy = tmp_path / fixture.name
        shutil.copy(fixture, copy)
        url = f"sqlite:///{copy}"
        engine = make_engine(url)
        before = current_revision(engine)
        assert before == fixture.stem.removeprefix("tuning-")
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert TuningStore(url).list_best(), "the upgrade lost the stored results"


def test_an_older_schema_is_refused_with_the_upgrade_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    engine = open_engine(url)
    with engine.begin() as c:
        c.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '0.0.9'")
        # an old database holding nothing of ours would be made again, not refused
        c.exec_driver_sql(
            "INSERT INTO devices (name, compute_capability, sm_count, "
            "driver_version, cuda_version) VALUES ('gpu', 90, 132, '1', '13.0')"
        )
    monkeypatch.setattr(schema, "known_revisions", lambda: ("0.0.9", head_revision()))
    with pytest.raises(SchemaOutdated, match=r"cute-autotune db upgrade --db"):
        open_engine(url)


def test_a_newer_or_foreign_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/newer.db"
    engine = open_engine(url)
    with engine.begin() as c:
        c.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '9.9.9'")
    with pytest.raises(SchemaError, match="newer release"):
        open_engine(url)
    foreign = f"sqlite:///{tmp_path}/foreign.db"
    with make_engine(foreign).begin() as c:
        c.exec_driver_sql("CREATE TABLE best_configs (id INTEGER PRIMARY KEY)")
    with pytest.raises(SchemaError, match="no schema version"):
        open_engine(foreign)


def test_a_plain_path_is_a_sqlite_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--db tuning.db` and $CUTE_AUTOTUNE_DB=~/x.db name SQLite files, as a URL would (issue
    40 item 4); a URL stays as it is."""
    from autotune.store.schema import database_url, default_url, describe

    monkeypatch.chdir(tmp_path)
    assert database_url("tuning.db") == f"sqlite:///{tmp_path / 'tuning.db'}"
    assert database_url("postgresql+psycopg://u@h/d") == "postgresql+psycopg://u@h/d"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert database_url("~/x.db") == f"sqlite:///{tmp_path / 'x.db'}"
    monkeypatch.setenv("CUTE_AUTOTUNE_DB", "env.db")
    assert default_url() == f"sqlite:///{tmp_path / 'env.db'}"
    assert describe("sub/plain.db") == str(tmp_path / "sub" / "plain.db")
    store = TuningStore("plain.db")
    assert store.url == f"sqlite:///{tmp_path / 'plain.db'}" and (tmp_path / "plain.db").is_file()
    assert TuningStore("plain.db", create=False).url == store.url
