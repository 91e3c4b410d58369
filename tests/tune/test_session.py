"""A tuning session over many problems (tune/session.py) on the replay backend: pieces that
pass over what an earlier piece searched, a time limit that stops new problems, and the misses
`tune --misses` picks."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from autotune.model.problem import Problem
from autotune.store.repo import TuningStore
from autotune.tune.backends import ReplayBackend
from autotune.tune.search import SearchSettings
from autotune.tune.session import frequent_misses, run_session

REPO = Path(__file__).resolve().parents[2]
SM80_RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"
SETTINGS = SearchSettings(trials=3, sampler="grid", sdpa_finalists=False)


@pytest.fixture(scope="module")
def problems() -> list[Problem]:
    shapes = json.loads(SM80_RECORDING.read_text())["shapes"]
    return [Problem(**s["problem"]) for s in shapes[:2]]


def test_a_second_piece_passes_over_what_the_first_searched(
    problems: list[Problem], tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path}/session.db"
    ended: list[Problem] = []
    started: list[int] = []
    with_backend = ReplayBackend([SM80_RECORDING])
    try:
        first = run_session(
            problems,
            db=db,
            backend=with_backend,
            settings=SETTINGS,
            families=["sm80"],
            skip_tuned=True,
            on_start=lambda i, _: started.append(i),
            on_end=ended.append,
        )
        second = run_session(
            problems,
            db=db,
            backend=with_backend,
            settings=SETTINGS,
            families=["sm80"],
            skip_tuned=True,
            on_end=ended.append,
        )
    finally:
        with_backend.close()
    assert [o.problem for o in first.outcomes] == problems and started == [0, 1]
    assert all(o.best is not None for o in first.outcomes)
    assert first.skipped == first.done_before == []
    assert second.outcomes == [] and second.done_before == problems
    assert ended == problems + problems  # every problem ends once per piece


def test_a_piece_out_of_time_starts_nothing_more_and_says_what_is_left(
    problems: list[Problem], tmp_path: Path
) -> None:
    backend = ReplayBackend([SM80_RECORDING])
    ended: list[Problem] = []
    try:
        result = run_session(
            problems,
            db=f"sqlite:///{tmp_path}/late.db",
            backend=backend,
            settings=SETTINGS,
            families=["sm80"],
            stop_after=-1.0,
            on_end=ended.append,
        )
    finally:
        backend.close()
    assert result.outcomes == [] and result.skipped == problems and ended == problems
    assert (
        not (tmp_path / "late.db").exists()
        or TuningStore(f"sqlite:///{tmp_path}/late.db").list_best() == []
    )


def test_frequent_misses_rank_by_calls_leave_out_the_tuned_and_keep_what_is_asked(
    problems: list[Problem], tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path}/misses.db"
    backend = ReplayBackend([SM80_RECORDING])
    try:
        run_session(problems[:1], db=db, backend=backend, settings=SETTINGS, families=["sm80"])
        device = backend.device()
    finally:
        backend.close()
    store = TuningStore(db)
    tuned = problems[0]
    rare = Problem(1, 8, 8, 333, 333, 64, "fp16", False)
    often = Problem(2, 16, 4, 1, 4097, 128, "bf16", True)
    now = datetime.now(UTC)
    store.add_misses(
        [
            (device, tuned, "nearest", 50, now, now),
            (device, rare, "nearest", 2, now, now),
            (device, often, "nearest", 3, now, now),
            (device, often, "sdpa", 4, now, now),
        ]
    )
    assert frequent_misses(store, device) == [(often, 7), (rare, 2)]
    assert frequent_misses(store, device, top=1) == [(often, 7)]
    fp16 = frequent_misses(store, device, keep=lambda ps: [p for p in ps if p.dtype == "fp16"])
    assert fp16 == [(rare, 2)]
