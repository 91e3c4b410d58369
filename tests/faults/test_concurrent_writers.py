"""Several tuning processes on one new database, started together (replay backend, CPU): each
one finishes. Before the schema lock, the upserts and immediate SQLite transactions, 1 of 4
finished on a fresh SQLite file ("table devices already exists", the schema race reported as
"has cute-autotune tables but no schema version ... damaged") and the rest died on Optuna's
queued trials taken twice (UpdateFinishedTrialError) or on get-or-create IntegrityErrors.
Also: readers that open the database while it is being created wait for it, and the rows that
every process writes (device, problem, configs, the best config) exist once each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"
SHAPE = [
    "--batch",
    "4",
    "--heads-q",
    "16",
    "--seqlen-q",
    "2048",
    "--head-dim",
    "128",
    "--dtype",
    "fp16",
]


def _tune(url: str, seed: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "tune",
            *SHAPE,
            "--replay",
            str(RECORDING),
            "--trials",
            "6",
            "--without-sdpa",
            "--seed",
            str(seed),
            "--quiet",
            "--db",
            url,
            # the tuning sessions' writes are under test; the refit after each (a read, a fit of
            # seconds of CPU, one short write; its failure never fails a session) is left out so
            # that 4-8 fits at once do not starve the writers on a 2-core machine
            "--no-refit",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
    )


def _list(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", "list", "--db", url],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run_together(url: str, workers: int) -> None:
    tuners = [_tune(url, seed) for seed in range(workers)]
    for proc in tuners:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-2000:]
        assert "damaged" not in out and "Traceback" not in out, out[-2000:]
    with create_engine(url).connect() as c:
        count = lambda sql: c.execute(text(sql)).scalar_one()  # noqa: E731
        assert count("select count(*) from devices") == 1
        assert count("select count(*) from problems") == 1
        assert count("select count(*) from best_configs") == 1
        assert count("select count(*) from kernel_configs") == count(
            "select count(distinct digest) from kernel_configs"
        )
        assert count("select count(*) from builds") == count(
            "select count(distinct artifact_key) from builds"
        )
        # no trial is left RUNNING by a process that finished
        assert count("select count(*) from trials where state = 'RUNNING'") == 0


@pytest.mark.parametrize("workers", [4, 8])
def test_tuning_processes_started_together_on_a_new_sqlite_file_all_finish(
    tmp_path: Path, workers: int
) -> None:
    _run_together(f"sqlite:///{tmp_path}/new.db", workers)


@pytest.mark.postgres
def test_tuning_processes_started_together_on_a_new_postgres_database_all_finish(
    postgres_url: str,
) -> None:
    _run_together(postgres_url, 4)


def test_a_reader_of_a_database_being_created_waits_for_it(tmp_path: Path) -> None:
    """`list` started beside the processes that create the database: it either finds no
    database yet, or the whole schema (never "damaged")."""
    url = f"sqlite:///{tmp_path}/new.db"
    tuners = [_tune(url, seed) for seed in range(2)]
    readers = [_list(url) for _ in range(6)]
    for proc in readers + tuners:
        out, _ = proc.communicate(timeout=600)
        assert "damaged" not in out and "Traceback" not in out, out[-2000:]
    assert all(p.returncode == 0 for p in tuners)


def test_a_lookup_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    """While another connection holds SQLite's write lock (a tuner mid-write), dispatch's and
    `best`'s lookups answer at once: they begin deferred, only writes begin IMMEDIATE."""
    import sqlite3
    import time

    from autotune.model.problem import Problem
    from autotune.store.records import DeviceInfo
    from autotune.store.repo import TuningStore

    path = tmp_path / "t.db"
    store = TuningStore(f"sqlite:///{path}")
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        start = time.monotonic()
        device = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
        problem = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)
        assert store.best(device, problem) is None
        assert store.list_best() == []
        assert store.nearest(device, problem) is None
        assert time.monotonic() - start < 5
    finally:
        writer.execute("ROLLBACK")
        writer.close()
