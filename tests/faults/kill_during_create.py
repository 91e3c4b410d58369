"""Processes killed (SIGKILL) while they make a new tuning database, run as a process of its own:

    python -m tests.faults.kill_during_create URL_TEMPLATE KILLS [ADMIN_URL]

Each round starts from nothing (URL_TEMPLATE's `{round}` names a new SQLite file; with
ADMIN_URL, a PostgreSQL database whose schema is emptied), forks a child that does what the
first process on a new database does (opens the tuning store, Optuna's storage, makes a study)
and kills it at an instant drawn uniformly over how long that takes; then a fresh child does
what the next process does (opens both, imports a result, reads it back, runs a trial) with no
hand step between. A round whose next process fails is wedged. The children are forked from
this process, with everything imported, so that the kill instants fall in the database work
and not in Python's imports. Prints one JSON object: kills that landed mid-way, rounds,
wedged rounds and their errors.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable

import optuna
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from autotune.store.migrate import head_revision, read_state, revision_shapes
from autotune.store.repo import TuningStore
from autotune.tune.study import optuna_storage
from tests.faults.conftest import export_doc, export_entry

ROUNDS_PER_KILL = 4  # at most this many rounds per kill asked for (a kill may land too late)


def first_use(url: str) -> None:
    """What the first process on a new database does."""
    TuningStore(url)
    optuna.create_study(storage=optuna_storage(url), study_name="first", load_if_exists=True)


def next_use(url: str) -> None:
    """What the next process does: every table of ours and Optuna's read and written."""
    store = TuningStore(url)
    store.import_results(export_doc([export_entry()]), overwrite=True)
    if len(store.list_best()) != 1:
        raise AssertionError(f"imported 1 result, read back {len(store.list_best())}")
    study = optuna.create_study(
        storage=optuna_storage(url), study_name="next", load_if_exists=True
    )
    study.tell(study.ask(), 1.0)
    with store.engine.connect() as connection:
        state = read_state(connection)
    if state.revision != head_revision() or not state.whole():
        raise AssertionError(f"left at schema {state.revision}, tables {sorted(state.tables)}")


def in_child(
    work: Callable[[str], None], url: str, kill_after: float | None = None
) -> tuple[bool, str, float]:
    """Run `work(url)` in a forked child, killed after `kill_after` seconds if given: (killed
    before it finished, its error or "", seconds it ran)."""
    read_end, write_end = os.pipe()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        warnings.simplefilter("ignore")
        try:
            work(url)
            message = b""
        except BaseException:  # noqa: BLE001 - reported to the parent, whatever it is
            message = traceback.format_exc()[-1500:].encode()
        os.write(write_end, b"done" + message)
        os._exit(0)
    os.close(write_end)
    if kill_after is not None:
        time.sleep(kill_after)
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    seconds = time.perf_counter() - start
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read()
    killed = os.WIFSIGNALED(status) and not report.startswith(b"done")
    return killed, report.removeprefix(b"done").decode(errors="replace"), seconds


def empty_postgres(admin_url: str, name: str) -> None:
    """The database `name` as new: every other session ended, its schema emptied."""
    admin = create_engine(
        make_url(admin_url).set(database=name), poolclass=NullPool, isolation_level="AUTOCOMMIT"
    )
    try:
        with admin.connect() as c:
            c.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
            c.execute(text("DROP SCHEMA public CASCADE"))
            c.execute(text("CREATE SCHEMA public"))
    finally:
        admin.dispose()


def run(template: str, kills: int, admin_url: str | None) -> dict[str, object]:
    rng = random.Random(int(os.environ.get("KILL_SEED", "0")))
    revision_shapes()  # read once here: what a child's first open of a half-made one reads

    def fresh(n: int) -> str:
        url = template.format(round=n)
        if admin_url is not None:
            empty_postgres(admin_url, str(make_url(url).database))
        return url

    # how long the first process takes, unkilled (its children are timed from the fork)
    durations = []
    for n in range(3):
        killed, error, seconds = in_child(first_use, fresh(-1 - n))
        if error:
            raise SystemExit(f"the first use of a new database failed unkilled:\n{error}")
        durations.append(seconds)
    span = statistics.median(durations)
    landed = rounds = 0
    wedged: list[str] = []
    while landed < kills and rounds < ROUNDS_PER_KILL * kills:
        url = fresh(rounds)
        rounds += 1
        killed, error, _ = in_child(first_use, url, kill_after=rng.uniform(0.0, span))
        landed += killed
        _, error, _ = in_child(next_use, url)
        if error:
            wedged.append(f"round {rounds} (killed mid-way: {killed}): {error.strip()}")
    return {
        "kills": landed,
        "rounds": rounds,
        "wedged": len(wedged),
        "errors": wedged[:5],
        "first_use_s": round(span, 3),
    }


if __name__ == "__main__":
    print(
        json.dumps(run(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None))
    )
