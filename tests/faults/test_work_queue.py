"""The work queue of tuning (CPU, replay backend, real worker processes): `tune --enqueue` adds
items for a GPU model, `worker` processes take each item exactly once, a worker killed mid-item
(SIGKILL) leaves it to the next worker once its lease runs out, a worker of another GPU model
takes nothing, and a worker that lost its lease cannot renew or end the item."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from autotune.cli.main import main
from autotune.measure.records import DeviceInfo
from autotune.model.problem import Problem
from autotune.store.queue import WorkQueue
from autotune.store.repo import TuningStore

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "data" / "sweep_sm80_llm_prefill_h200.json.gz"
SET = ["--shapes", "llm-prefill", "--head-dim", "128", "--dtype", "fp16", "--causal", "false"]
H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")


def _worker(url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "worker",
            "--replay",
            str(RECORDING),
            "--db",
            url,
            *extra,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _enqueue(url: str, *extra: str) -> None:
    assert (
        main(
            [
                "tune",
                "--enqueue",
                "--replay",
                str(RECORDING),
                *SET,
                "--without-sdpa",
                "--db",
                url,
                *extra,
            ]
        )
        == 0
    )


def _count(url: str, sql: str) -> int:
    with create_engine(url).connect() as c:
        return int(c.execute(text(sql)).scalar_one())


def test_two_workers_take_each_item_once(tmp_path: Path) -> None:
    _two_workers(f"sqlite:///{tmp_path}/q.db")


@pytest.mark.postgres
def test_two_workers_take_each_item_once_on_postgres(postgres_url: str) -> None:
    _two_workers(postgres_url)


def _two_workers(url: str) -> None:
    _enqueue(url, "--trials", "3")
    _enqueue(url, "--trials", "3")  # enqueueing again adds nothing
    assert _count(url, "select count(*) from work_items") == 8
    workers = [_worker(url) for _ in range(2)]
    for w in workers:
        out, _ = w.communicate(timeout=600)
        assert w.returncode == 0, out[-2000:]
    items = WorkQueue(TuningStore(url)).items()
    assert [i.state for i in items] == ["done"] * 8
    assert all(i.attempts == 1 for i in items)
    assert _count(url, "select count(*) from best_configs") == 8
    assert _count(url, "select count(*) from trials where state = 'RUNNING'") == 0


def test_a_killed_workers_item_is_finished_by_the_next_worker(tmp_path: Path) -> None:
    _killed_worker(f"sqlite:///{tmp_path}/q.db")


@pytest.mark.postgres
def test_a_killed_workers_item_is_finished_by_the_next_worker_on_postgres(
    postgres_url: str,
) -> None:
    _killed_worker(postgres_url)


def _killed_worker(url: str) -> None:
    _enqueue(url, "--trials", "60", "--sampler", "grid")
    victim = _worker(url, "--lease", "2")
    deadline = time.monotonic() + 120
    while _count(url, "select count(*) from work_items where state = 'running'") == 0:
        assert time.monotonic() < deadline and victim.poll() is None
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    rescuer = _worker(url, "--lease", "2", "--wait")
    out, _ = rescuer.communicate(timeout=600)
    assert rescuer.returncode == 0, out[-2000:]
    items = WorkQueue(TuningStore(url)).items()
    assert [i.state for i in items] == ["done"] * 8
    retaken = [i for i in items if i.attempts == 2]
    assert len(retaken) == 1 and "lease" in (retaken[0].message or "")
    assert _count(url, "select count(*) from best_configs") == 8
    # the killed worker's running trials were settled by the study, not left RUNNING
    assert _count(url, "select count(*) from trials where state = 'RUNNING'") == 0


def test_a_worker_takes_only_its_gpu_models_items(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    _enqueue(url, "--trials", "3", "--for-gpu", "NVIDIA A100-SXM4-80GB:80:108")
    out, _ = _worker(url).communicate(timeout=600)
    assert "0 done, 0 failed" in out
    items = WorkQueue(TuningStore(url)).items()
    assert len(items) == 8 and {i.state for i in items} == {"queued"}
    assert {i.gpu_model for i in items} == {"NVIDIA A100-SXM4-80GB (sm_80, 108 SMs)"}


def test_a_worker_that_lost_its_lease_changes_nothing(tmp_path: Path) -> None:
    queue = WorkQueue(TuningStore(f"sqlite:///{tmp_path}/q.db"))
    problem = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)
    assert queue.enqueue(H200, [problem], [], {"trials": 3}) == (1, 0)
    first = queue.take(H200, "first", lease_s=0.01)
    assert first is not None and first.attempts == 1
    time.sleep(0.05)
    second = queue.take(H200, "second", lease_s=60)
    assert second is not None and second.id == first.id and second.attempts == 2
    assert "first" in (second.message or "")
    assert not queue.renew(first.id, "first", 60)
    assert not queue.finish(first.id, "first", ok=True)
    assert queue.take(H200, "third", lease_s=60) is None  # held, and within its lease
    assert queue.finish(second.id, "second", ok=True)
    assert [i.state for i in queue.items()] == ["done"]


def test_an_item_whose_problem_row_is_broken_is_failed_not_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    queue = WorkQueue(TuningStore(url))
    problems = [
        Problem(4, 16, 16, 2048, 2048, 128, "fp16", False),
        Problem(4, 16, 16, 1024, 1024, 128, "fp16", False),
    ]
    queue.enqueue(H200, problems, [], {"trials": 3})
    with create_engine(url).begin() as c:  # a hostile row: heads_q 0
        c.execute(text("update problems set heads_q = 0 where seqlen_q = 2048"))
    taken = queue.take(H200, "w", lease_s=60)
    assert taken is not None and taken.problem == problems[1]
    with create_engine(url).connect() as c:
        state, message = c.execute(
            text(
                "select w.state, w.message from work_items w join problems p "
                "on p.id = w.problem_id where p.seqlen_q = 2048"
            )
        ).one()
    assert state == "failed" and "not a valid problem" in message


def test_a_worker_completes_an_items_budget_rather_than_adding_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An item taken again runs with `resume`: the trials its killed worker ran count towards
    its budget (a plain `tune` would add the budget again and measure more configs)."""
    from autotune.tune import worker as worker_module
    from autotune.tune.backends import ReplayBackend

    url = f"sqlite:///{tmp_path}/q.db"
    _enqueue(url, "--trials", "3")
    seen = []
    monkeypatch.setattr(
        worker_module, "tune", lambda problem, **kwargs: seen.append(kwargs["settings"]) or []
    )
    report = worker_module.run_worker(url, ReplayBackend([RECORDING]))
    assert len(seen) == 8 and all(s.resume and s.trials == 3 for s in seen)
    assert len(report.done) == 8


def test_the_queue_command_lists_items_by_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    queue = WorkQueue(TuningStore(url))
    problems = [
        Problem(4, 16, 16, 2048, 2048, 128, "fp16", False),
        Problem(4, 16, 16, 1024, 1024, 128, "fp16", False),
    ]
    queue.enqueue(H200, problems, ["sm80"], {"trials": 3})
    taken = queue.take(H200, "pid 7 on host-a", lease_s=60)
    assert taken is not None
    capsys.readouterr()
    assert main(["queue", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "pid 7 on host-a" in out and "running" in out and "queued" in out
    assert out.rstrip().endswith(f"1 queued, 1 running in {tmp_path}/q.db")
    assert main(["queue", "--state", "queued", "--db", url]) == 0
    listed = capsys.readouterr().out
    assert "pid 7 on host-a" not in listed and problems[1].describe() in listed


def test_a_worker_that_lost_its_lease_stops_its_item_at_the_next_trial() -> None:
    from autotune.tune import worker as worker_module

    keeper = object.__new__(worker_module._LeaseKeeper)
    keeper.lost, keeper.trials = False, 0
    keeper.check()  # still its own: the search goes on
    keeper.lost = True
    with pytest.raises(worker_module.LeaseLost):
        keeper.check()


def test_a_worker_runs_a_step_again_when_its_connection_broke_and_only_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.store.schema import ConnectionLost, StoreError
    from autotune.tune import worker as worker_module

    monkeypatch.setattr(worker_module, "FIRST_RECONNECT_WAIT_S", 0.0)
    calls: list[int] = []

    def flaky(error: Exception, failures: int) -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return "done"

    broke = ConnectionLost("the tuning database x cannot be used: server closed the connection")
    assert worker_module._reconnecting(flaky, broke, 2) == "done" and len(calls) == 3
    calls.clear()
    with pytest.raises(ConnectionLost):  # a server that stays away: bounded
        worker_module._reconnecting(flaky, broke, 99)
    assert len(calls) == worker_module.CONNECTION_ATTEMPTS
    calls.clear()
    with pytest.raises(StoreError):  # any other database error is not retried
        worker_module._reconnecting(flaky, StoreError("the file is not a database"), 1)
    assert len(calls) == 1


def test_a_connection_the_server_ends_as_it_opens_is_a_lost_connection() -> None:
    """SQLAlchemy judges an error raised while the pool opens a connection without one, and
    psycopg's dialect then says "not a disconnect" (connection_invalidated False): the
    driver's SQLSTATE tells it. Other database errors, SQLite's among them, are not retried."""
    import sqlite3

    from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError

    from autotune.store.schema import lost_connection

    psycopg = pytest.importorskip("psycopg")
    errors = psycopg.errors

    def raised(orig: Exception, wrapper: type[DBAPIError] = OperationalError) -> Exception:
        return wrapper("SELECT 1", {}, orig, connection_invalidated=False)

    assert lost_connection(
        raised(errors.AdminShutdown("terminating connection due to administrator command"))
    )
    assert lost_connection(
        raised(
            psycopg.OperationalError(
                "consuming input failed: server closed the connection unexpectedly"
            )
        )
    )
    assert lost_connection(raised(errors.CannotConnectNow("the database system is starting up")))
    assert not lost_connection(raised(errors.InvalidPassword("password authentication failed")))
    assert not lost_connection(raised(errors.SyntaxError("syntax error"), ProgrammingError))
    assert not lost_connection(raised(sqlite3.OperationalError("database is locked")))


@pytest.mark.postgres
def test_a_store_whose_connection_is_ended_as_it_opens_is_opened_again_on_postgres(
    postgres_url: str,
) -> None:
    """The server ends a new engine's first connection while the pool opens it (what
    pg_terminate_backend does to a worker that is opening its store as every connection is
    ended): a ConnectionLost, which the worker runs again, not a StoreError that failed the
    item (the dropped-connections fault case, once in CI)."""
    from sqlalchemy import event

    from autotune.store.schema import ConnectionLost, lost_connection, make_engine
    from autotune.tune import worker as worker_module

    TuningStore(postgres_url)  # the schema, made
    engine = make_engine(postgres_url)

    @event.listens_for(engine, "connect")
    def ended_as_it_opens(dbapi_connection: object, _record: object) -> None:
        event.remove(engine, "connect", ended_as_it_opens)
        dbapi_connection.execute("SELECT pg_terminate_backend(pg_backend_pid())")  # type: ignore[attr-defined]

    with pytest.raises(ConnectionLost) as lost:
        TuningStore(engine=engine)
    assert lost_connection(lost.value)
    event.listen(engine, "connect", ended_as_it_opens)
    store = worker_module._reconnecting(TuningStore, engine=engine)
    assert store.engine is engine
    engine.dispose()


@pytest.mark.postgres
def test_optunas_pooled_connection_ended_while_idle_is_replaced_on_postgres(
    postgres_url: str,
) -> None:
    """The server ends the connection Optuna's storage keeps idle in its pool (a restart, a
    network drop, pg_terminate_backend): the next use opens a new one instead of failing, as
    the tuning store's engine does. Without it one drop cost a worker a reconnect attempt of
    the few it has per item, on top of the store's."""
    from sqlalchemy import create_engine, text

    from autotune.tune.study import optuna_storage

    storage = optuna_storage(postgres_url)
    storage.get_all_studies()  # its connection, now idle in the pool
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        ended = c.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar()
    admin.dispose()
    assert ended and ended >= 1
    assert storage.get_all_studies() == []


def test_a_long_tune_whose_connection_breaks_between_trials_keeps_its_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step is run again up to CONNECTION_ATTEMPTS times in a row when its connection broke.
    A tune that told trials since its last break has made progress: its count starts again, so
    an item whose long tune meets more drops than that in all (each after some trials) is done,
    not failed."""
    from autotune.store.schema import ConnectionLost
    from autotune.tune import worker as worker_module
    from autotune.tune.backends import ReplayBackend

    url = f"sqlite:///{tmp_path}/q.db"
    _enqueue(url, "--trials", "3")
    monkeypatch.setattr(worker_module, "FIRST_RECONNECT_WAIT_S", 0.0)
    drops: dict[str, int] = {}

    def tune(problem: Problem, *, on_progress: Any, **_kwargs: Any) -> list[Any]:
        on_progress(None)  # a trial told, then the server ends the connection
        key = problem.describe()
        drops[key] = drops.get(key, 0) + 1
        if drops[key] <= worker_module.CONNECTION_ATTEMPTS + 1:
            raise ConnectionLost(
                "the tuning database x cannot be used: server closed the connection"
            )
        return []

    monkeypatch.setattr(worker_module, "tune", tune)
    report = worker_module.run_worker(url, ReplayBackend([RECORDING]))
    assert not report.failed, report.failed[0][1]
    assert len(report.done) == 8


def test_a_tune_whose_connection_keeps_breaking_without_progress_fails_its_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.store.schema import ConnectionLost
    from autotune.tune import worker as worker_module
    from autotune.tune.backends import ReplayBackend

    url = f"sqlite:///{tmp_path}/q.db"
    _enqueue(url, "--trials", "3")
    monkeypatch.setattr(worker_module, "FIRST_RECONNECT_WAIT_S", 0.0)
    calls: list[int] = []

    def tune(problem: Problem, **_kwargs: Any) -> list[Any]:
        calls.append(1)
        raise ConnectionLost("the tuning database x cannot be used: server closed the connection")

    monkeypatch.setattr(worker_module, "tune", tune)
    report = worker_module.run_worker(url, ReplayBackend([RECORDING]))
    assert len(report.failed) == 8 and "ConnectionLost" in report.failed[0][1]
    assert len(calls) == 8 * worker_module.CONNECTION_ATTEMPTS
