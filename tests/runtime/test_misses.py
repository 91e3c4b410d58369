"""Runtime misses: the per-process recorder (counts on the hot path, deltas off it), the store's
upsert and listing on SQLite and PostgreSQL, and the `misses` and `tune --misses` commands."""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import event

from autotune.cli.main import main
from autotune.model.problem import Problem
from autotune.runtime.misses import ENV, MissRecorder
from autotune.store.misses_records import MissRecord
from autotune.store.records import DeviceInfo
from autotune.store.repo import TuningStore
from autotune.store.schema import StoreError

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
OTHER_DRIVER = DeviceInfo("NVIDIA H200", 90, 132, "590.1", "13.1")
A100 = DeviceInfo("NVIDIA A100-SXM4-80GB", 80, 108, "580.1", "13.0")
P = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)
Q = Problem(1, 32, 8, 4096, 4096, 64, "bf16", True)
T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)

Entry = tuple[DeviceInfo, Problem, str, int, datetime, datetime]


class CountingStore:
    """A store whose `add_misses` calls are counted (and can be made to fail)."""

    def __init__(self, store: TuningStore) -> None:
        self.store = store
        self.writes: list[list[Entry]] = []
        self.fail = False

    def add_misses(self, entries: Sequence[Entry]) -> int:
        if self.fail:
            raise StoreError("the tuning database x cannot be used: disk I/O error")
        self.writes.append(list(entries))
        return self.store.add_misses(entries)


def opener(store: TuningStore | CountingStore) -> Callable[[], TuningStore]:
    """What MissRecorder takes: a function that returns the store."""
    return lambda: cast(TuningStore, store)


@pytest.fixture
def store(tmp_path: Path) -> TuningStore:
    return TuningStore(f"sqlite:///{tmp_path}/t.db")


@pytest.fixture
def counting(store: TuningStore) -> CountingStore:
    return CountingStore(store)


@pytest.fixture
def recorder(counting: CountingStore) -> Iterator[MissRecorder]:
    # An hour: no periodic flush during a test unless it asks for one.
    made = MissRecorder(opener(counting), interval_s=3600)
    yield made
    made.close()


@pytest.fixture(autouse=True)
def recording_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)


def counts(store: TuningStore) -> dict[tuple[str, Problem, str], int]:
    return {(m.device_name, m.problem, m.path): m.count for m in store.list_misses()}


# -- the recorder -------------------------------------------------------------------------------


def test_flush_writes_the_delta_once(
    recorder: MissRecorder, counting: CountingStore, store: TuningStore
) -> None:
    miss = recorder.miss(H200, P, "nearest")
    assert miss is not None and miss.calls == 0  # miss() counts nothing itself
    assert recorder.miss(OTHER_DRIVER, P, "nearest") is miss  # the same GPU model
    assert recorder.miss(H200, P, "sdpa") is not miss
    for _ in range(1000):
        miss.calls += 1
    assert recorder.flush() == 1  # the "sdpa" miss has no calls: nothing to write for it
    assert len(counting.writes) == 1 and [e[3] for e in counting.writes[0]] == [1000]
    assert recorder.flush() == 0
    assert len(counting.writes) == 1  # no new calls: no store call at all
    miss.calls += 5
    assert recorder.flush() == 1
    assert [e[3] for e in counting.writes[1]] == [5]  # the delta, not the total
    assert counts(store) == {("NVIDIA H200", P, "nearest"): 1005}


def test_one_flush_is_one_store_call(
    recorder: MissRecorder, counting: CountingStore, store: TuningStore
) -> None:
    keys = [(H200, P, "nearest"), (H200, Q, "heuristic"), (A100, P, "sdpa")]
    for n, key in enumerate(keys, start=1):
        miss = recorder.miss(*key)
        assert miss is not None
        for _ in range(n * 100):
            miss.calls += 1
    assert recorder.flush() == 3
    assert len(counting.writes) == 1 and len(counting.writes[0]) == 3
    assert counts(store) == {
        ("NVIDIA H200", P, "nearest"): 100,
        ("NVIDIA H200", Q, "heuristic"): 200,
        ("NVIDIA A100-SXM4-80GB", P, "sdpa"): 300,
    }


def test_recording_off(
    monkeypatch: pytest.MonkeyPatch,
    recorder: MissRecorder,
    counting: CountingStore,
    store: TuningStore,
) -> None:
    monkeypatch.setenv(ENV, "0")
    assert recorder.miss(H200, P, "nearest") is None
    assert recorder.flush() == 0 and counting.writes == [] and store.list_misses() == []
    assert recorder._thread is None  # nothing started either


def test_a_path_longer_than_its_column_is_refused(recorder: MissRecorder) -> None:
    with pytest.raises(ValueError, match="1 to 16 characters"):
        recorder.miss(H200, P, "nearest-but-much-longer")


def test_the_thread_flushes_within_the_interval(store: TuningStore) -> None:
    counting = CountingStore(store)
    recorder = MissRecorder(opener(counting), interval_s=0.05)
    try:
        miss = recorder.miss(H200, P, "nearest")
        assert miss is not None
        time.sleep(0.2)
        assert counting.writes == []  # no calls yet: the thread writes nothing
        miss.calls += 3
        deadline = time.monotonic() + 10
        while not store.list_misses() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert counts(store) == {("NVIDIA H200", P, "nearest"): 3}
        assert recorder._thread is not None and recorder._thread.daemon
    finally:
        recorder.close()
    assert recorder._thread is None


def test_one_thread_and_one_atexit_hook(
    monkeypatch: pytest.MonkeyPatch, counting: CountingStore
) -> None:
    registered: list[Callable[[], None]] = []
    unregistered: list[Callable[[], None]] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", unregistered.append)
    recorder = MissRecorder(opener(counting), interval_s=3600)
    for problem in (P, Q):
        for path in ("nearest", "sdpa"):
            recorder.miss(H200, problem, path)
            recorder.miss(H200, problem, path)
    thread = recorder._thread
    assert len(registered) == 1 and thread is not None and thread.is_alive()
    miss = recorder.miss(H200, P, "nearest")
    assert miss is not None
    miss.calls += 7
    registered[0]()  # what the interpreter runs at exit: a flush of what is left
    assert [e[3] for e in counting.writes[0]] == [7]
    assert unregistered == registered and not thread.is_alive()


def test_a_database_error_keeps_the_counts(
    recorder: MissRecorder,
    counting: CountingStore,
    store: TuningStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    miss = recorder.miss(H200, P, "nearest")
    assert miss is not None
    miss.calls += 10
    counting.fail = True
    with caplog.at_level(logging.WARNING, logger="autotune.runtime.misses"):
        assert recorder.flush() == 0
        miss.calls += 5
        assert recorder.flush() == 0
    warnings = [r for r in caplog.records if "not recorded" in r.getMessage()]
    assert len(warnings) == 1 and "disk I/O error" in warnings[0].getMessage()
    counting.fail = False
    assert recorder.flush() == 1
    assert counts(store) == {("NVIDIA H200", P, "nearest"): 15}


def test_a_read_only_database_loses_nothing(tmp_path: Path, store: TuningStore) -> None:
    """A real database error (SQLite refuses the write), then a store that can write."""
    read_only = TuningStore(store.url, create=False)
    current = [read_only]
    recorder = MissRecorder(lambda: current[0], interval_s=3600)
    miss = recorder.miss(H200, Q, "fallback")
    assert miss is not None
    miss.calls += 4
    assert recorder.flush() == 0
    current[0] = store
    recorder.close()  # the last flush
    assert counts(store) == {("NVIDIA H200", Q, "fallback"): 4}


def test_a_forked_child_does_not_write_the_parents_counts(recorder: MissRecorder) -> None:
    miss = recorder.miss(H200, P, "nearest")
    assert miss is not None
    miss.calls += 9
    recorder._forked()  # what os.register_at_fork runs in a child
    assert not recorder.pending()
    miss.calls += 1
    assert recorder.pending()


# -- the store ----------------------------------------------------------------------------------


def test_two_processes_add_up(tmp_path: Path) -> None:
    """Two recorders, each with its own store (its own engine) on one SQLite file."""
    url = f"sqlite:///{tmp_path}/shared.db"
    first, second = TuningStore(url), TuningStore(url)
    recorders = [MissRecorder(opener(s), interval_s=3600) for s in (first, second)]
    for n, recorder in enumerate(recorders, start=1):
        miss = recorder.miss(H200, P, "nearest")
        assert miss is not None
        miss.calls += 10 * n
        recorder.flush()
        miss.calls += n
        recorder.close()
    [record] = TuningStore(url, create=False).list_misses()
    assert record.count == 33 and record.problem == P and record.path == "nearest"


def test_upsert_keeps_the_earliest_and_latest_times(store: TuningStore) -> None:
    assert (
        store.add_misses(
            [
                (H200, P, "nearest", 2, T0, T0 + timedelta(hours=1)),
                (OTHER_DRIVER, P, "nearest", 3, T0, T0),
            ]
        )
        == 1
    )  # merged
    naive = (T0 - timedelta(days=1)).replace(tzinfo=None)  # naive is UTC
    assert store.add_misses([(H200, P, "nearest", 5, naive, T0 + timedelta(minutes=1))]) == 1
    [record] = store.list_misses()
    assert record.count == 10
    assert record.first_seen == "2024-12-31T12:00:00+00:00"
    assert record.last_seen == "2025-01-01T13:00:00+00:00"
    assert store.add_misses([(H200, P, "nearest", 0, T0, T0)]) == 0
    with pytest.raises(ValueError, match="negative"):
        store.add_misses([(H200, P, "nearest", -1, T0, T0)])


def test_list_misses_most_frequent_first(store: TuningStore) -> None:
    store.add_misses(
        [
            (H200, P, "nearest", 5, T0, T0),
            (H200, Q, "heuristic", 50, T0, T0),
            (H200, P, "sdpa", 7, T0, T0),
            (A100, Q, "fallback", 20, T0, T0),
        ]
    )
    assert [(m.count, m.path) for m in store.list_misses()] == [
        (50, "heuristic"),
        (20, "fallback"),
        (7, "sdpa"),
        (5, "nearest"),
    ]
    assert [m.count for m in store.list_misses(H200)] == [50, 7, 5]
    assert [m.count for m in store.list_misses("NVIDIA A100-SXM4-80GB")] == [20]
    assert [m.count for m in store.list_misses(limit=2)] == [50, 20]
    assert store.list_misses(H200, limit=1)[0] == MissRecord(
        "NVIDIA H200", 90, 132, Q, "heuristic", 50, T0.isoformat(), T0.isoformat()
    )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/race.db"
    return str(request.getfixturevalue("postgres_url"))


def test_an_insert_that_loses_a_race_is_retried(url: str) -> None:
    """Another process inserts the same row between this one's look-up and its insert. On
    PostgreSQL (the race is on the miss row itself: its problem exists already) the
    IntegrityError is retried once; on SQLite a writable transaction holds the file's write
    lock from its start (BEGIN IMMEDIATE), so the other writer waits for this one's commit.
    Either way both counts are kept."""
    mine, theirs = TuningStore(url), TuningStore(url)
    postgres = mine.engine.dialect.name == "postgresql"
    if postgres:
        theirs.add_misses([(A100, Q, "sdpa", 1, T0, T0)])  # the problem row, not the miss
    table = "runtime_misses" if postgres else "problems"
    raced: list[str] = []
    waiting: list[threading.Thread] = []

    def their_insert() -> None:
        theirs.add_misses([(H200, Q, "nearest", 100, T0, T0)])

    @event.listens_for(mine.engine, "before_cursor_execute")
    def interleave(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not raced and statement.startswith(f"INSERT INTO {table}"):
            raced.append(statement)
            if postgres:
                their_insert()
            else:  # it blocks on the write lock until this transaction commits
                waiting.append(threading.Thread(target=their_insert))
                waiting[0].start()

    assert (
        mine.add_misses(
            [(H200, Q, "nearest", 1, T0 + timedelta(hours=1), T0 + timedelta(hours=1))]
        )
        == 1
    )
    for thread in waiting:
        thread.join(timeout=60)
    assert raced
    records = {(m.device_name, m.path): m for m in theirs.list_misses()}
    mine_too = records["NVIDIA H200", "nearest"]
    assert mine_too.count == 101 and mine_too.last_seen == "2025-01-01T13:00:00+00:00"
    assert len(theirs.list_misses(H200)) == 1


def test_upsert_accumulates(url: str) -> None:
    store = TuningStore(url)
    for n in (3, 4):
        store.add_misses([(H200, P, "nearest", n, T0, T0), (H200, P, "sdpa", 1, T0, T0)])
    assert counts(store) == {("NVIDIA H200", P, "nearest"): 7, ("NVIDIA H200", P, "sdpa"): 2}


# -- the commands -------------------------------------------------------------------------------


def test_cli_misses_table_and_json(store: TuningStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["misses", "--db", store.url]) == 0
    assert capsys.readouterr().out.startswith("no runtime misses recorded in ")
    store.add_misses(
        [
            (H200, P, "nearest", 5, T0, T0),
            (H200, Q, "heuristic", 50, T0, T0),
            (A100, Q, "fallback", 20, T0, T0),
        ]
    )
    assert main(["misses", "--db", store.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["count", "path", "problem", "device", "last", "seen", "(UTC)"]
    assert lines[2].startswith("50") and Q.describe() in lines[2] and "NVIDIA H200" in lines[2]
    assert "2025-01-01 12:00:00" in lines[2]
    assert lines[3].startswith("20") and lines[4].startswith("5 ") and P.describe() in lines[4]
    assert "3 misses (75 calls)" in lines[-1]
    assert (
        main(["misses", "--db", store.url, "--device", "NVIDIA H200", "--top", "1", "--json"]) == 0
    )
    [only] = json.loads(capsys.readouterr().out)
    assert only["count"] == 50 and only["path"] == "heuristic"
    assert Problem(**only["problem"]) == Q and only["sm_count"] == 132


def test_cli_misses_needs_an_existing_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["misses", "--db", f"sqlite:///{tmp_path}/none.db"]) == 2
    assert "no tuning database" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


@pytest.fixture(scope="module")
def recorded() -> tuple[DeviceInfo, list[Problem]]:
    data = json.loads(RECORDING.read_text())
    dev = data["device"]
    device = DeviceInfo(
        dev["name"],
        dev["compute_capability"],
        dev["sm_count"],
        dev["driver_version"],
        dev["cuda_version"],
    )
    return device, [Problem(**shape["problem"]) for shape in data["shapes"]]


def tuned_in(table: str, candidates: Sequence[Problem]) -> list[Problem]:
    """The problems (of `candidates`) a `tune` table names in its first column, in order."""
    described = {p.describe(): p for p in candidates}
    firsts = [line.split("  ")[0] for line in table.splitlines()[2:]]
    return [described[cell] for cell in firsts if cell in described]


def tune_misses(db: str, *extra: str) -> int:
    return main(
        [
            "tune",
            "--misses",
            *extra,
            "--trials",
            "3",
            "--replay",
            str(RECORDING),
            "--db",
            db,
            "--quiet",
        ]
    )


def test_cli_tune_misses_tunes_the_most_frequent(
    store: TuningStore,
    recorded: tuple[DeviceInfo, list[Problem]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    device, problems = recorded
    first, second, third = problems[:3]
    other_gpu = Problem(8, 8, 8, 1024, 1024, 64, "fp16", False)  # not in the recording
    store.add_misses(
        [
            (device, first, "sdpa", 50, T0, T0),
            (device, first, "nearest", 3, T0, T0),  # 53
            (device, second, "heuristic", 52, T0, T0),
            (device, third, "nearest", 10, T0, T0),
            (A100, other_gpu, "nearest", 10_000, T0, T0),  # another GPU's miss: not this one's
        ]
    )
    assert tune_misses(store.url, "--top", "1") == 0
    assert tuned_in(capsys.readouterr().out, problems) == [first]
    assert [p for p in problems if store.best(device, p)] == [first]
    # Tuned since it was recorded: the next run takes the next most frequent ones.
    assert tune_misses(store.url) == 0
    assert tuned_in(capsys.readouterr().out, problems) == [second, third]
    assert tune_misses(store.url) == 0
    assert "no untuned runtime misses of NVIDIA H200" in capsys.readouterr().out


def test_cli_tune_misses_is_one_way_of_naming_problems(
    store: TuningStore, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tune_misses(store.url, "--shapes", "llm") == 2
    assert "drop --shapes" in capsys.readouterr().err
    assert tune_misses(store.url, "--heads-q", "16", "--seqlen-q", "512") == 2
    assert "drop --heads-q, --seqlen-q" in capsys.readouterr().err
    assert (
        main(
            [
                "tune",
                "--top",
                "3",
                "--heads-q",
                "16",
                "--seqlen-q",
                "512",
                "--head-dim",
                "64",
                "--db",
                store.url,
            ]
        )
        == 2
    )
    assert "--top goes with --misses" in capsys.readouterr().err
    assert tune_misses(store.url) == 0  # nothing recorded: nothing to do
    assert "nothing to tune" in capsys.readouterr().out
