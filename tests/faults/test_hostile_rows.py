"""A hostile or corrupt row in a table that is read back is refused with the row named, and the
rest of the table is served. (Problems and configs: test_work_queue, tests/store; imports:
test_import.)

Each hostile value is one SQLite stores without a word where the column's type allows it
(text in an integer column) and one PostgreSQL's type allows otherwise."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from autotune.build.compiler import BuildResult
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.status import Status
from autotune.store.queue import WorkQueue
from autotune.store.records import BaselineTiming, DeviceInfo, TrialResult
from autotune.store.repo import BrokenRow, TuningStore

from .conftest import sm80_config

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
H100 = DeviceInfo("NVIDIA H100", 90, 132, "580.159.04", "13.0")
PROBLEMS = [
    Problem(4, 16, 16, 2048, 2048, 128, "fp16", False),
    Problem(4, 16, 16, 1024, 1024, 128, "fp16", False),
]
SHORT_Q = Problem(4, 16, 16, 64, 2048, 128, "fp16", False)  # the Lq 17-128 region


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/t.db"
    return str(request.getfixturevalue("postgres_url"))


def _hostile(url: str, sql: str) -> None:
    with create_engine(url).begin() as c:
        c.execute(text(sql))


def _backend(url: str) -> str:
    return create_engine(url).dialect.name


def _typed(url: str, sqlite: str, postgresql: str) -> str:
    """The hostile value of a column for this database: SQLite keeps text in a number column,
    PostgreSQL refuses it, so there the value is one its type allows."""
    return sqlite if _backend(url) == "sqlite" else postgresql


def _set_best(
    store: TuningStore,
    device: DeviceInfo,
    problem: Problem,
    median: float,
    sdpa: float | None = None,
) -> None:
    result = TrialResult(Config.from_dict(sm80_config()), Status.OK, median_us=median)
    store.set_best(
        device,
        problem,
        result,
        measurement_id=None,
        study="s",
        trials=24,
        sdpa_default_us=sdpa,
        sdpa_flash_us=None,
    )


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_work_item_with_hostile_settings_is_failed_by_name_and_the_rest_served(
    url: str, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    queue = WorkQueue(TuningStore(url))
    queue.enqueue(H200, PROBLEMS, [], {"trials": 3})
    _hostile(
        url,
        "update work_items set settings_json = '{\"trials\": 3' "
        "where problem_id = (select id from problems where seqlen_q = 2048)",
    )
    taken = queue.take(H200, "w", lease_s=60)
    items = queue.items()
    refused = [i for i in items if i.state == "failed"]
    fault_summary(
        {
            "case": "hostile row: work_items.settings_json not JSON",
            "backend": create_engine(url).dialect.name,
            "refused": [i.message for i in refused],
            "served": taken.problem.describe() if taken else None,
        }
    )
    assert taken is not None and taken.problem == PROBLEMS[1]
    assert len(refused) == 1 and f"work item {refused[0].id}" in (refused[0].message or "")
    assert "settings" in (refused[0].message or "")


def test_a_measurement_with_a_hostile_time_is_refused_by_name_and_the_rest_served(
    url: str, fault_summary: Callable[[dict[str, Any]], None], caplog: pytest.LogCaptureFixture
) -> None:
    store = TuningStore(url)
    for block_n, median in ((64, 400.0), (128, 380.0)):
        result = TrialResult(
            Config.from_dict(sm80_config(block_n=block_n)), Status.OK, median_us=median
        )
        store.record_trial(
            H200, PROBLEMS[0], result, build=None, study="s", phase="search", baseline_us=None
        )
    with create_engine(url).connect() as c:
        hostile_id = c.execute(
            text("select id from measurements where median_us = 380.0")
        ).scalar_one()
    # the fastest time there ever was: dispatch would pick it over every real one
    _hostile(url, f"update measurements set median_us = -1 where id = {hostile_id}")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        served = store.timings(H200, PROBLEMS[0])
    refused = [r.getMessage() for r in caplog.records]
    fault_summary(
        {
            "case": "hostile row: measurements.median_us negative",
            "backend": create_engine(url).dialect.name,
            "refused": refused,
            "served": [t.median_us for t in served],
        }
    )
    assert [t.median_us for t in served] == [400.0]
    assert len(refused) == 1 and f"measurement #{hostile_id}" in refused[0]
    assert "median_us" in refused[0]


def test_a_resumed_search_never_reuses_a_hostile_measurement(
    url: str, fault_summary: Callable[[dict[str, Any]], None], caplog: pytest.LogCaptureFixture
) -> None:
    """The tuner's resume path (find_trial) takes the latest valid measurement of a config: a
    newer one with a hostile time is refused by name, the older valid one reused."""
    store = TuningStore(url)
    config = Config.from_dict(sm80_config())
    for median in (400.0, 390.0):
        store.record_trial(
            H200,
            PROBLEMS[0],
            TrialResult(config, Status.OK, median_us=median),
            build=None,
            study="s",
            phase="search",
            baseline_us=None,
        )
    with create_engine(url).connect() as c:
        hostile_id = c.execute(
            text("select id from measurements where median_us = 390.0")
        ).scalar_one()
    _hostile(url, f"update measurements set median_us = -1 where id = {hostile_id}")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        reused = store.find_trial(H200, PROBLEMS[0], config, None)
    refused = _warnings(caplog)
    fault_summary(
        {
            "case": "hostile row: measurements.median_us negative, resumed search",
            "backend": create_engine(url).dialect.name,
            "refused": refused,
            "served": None if reused is None else reused.median_us,
        }
    )
    assert reused is not None and reused.median_us == 400.0 and reused.reused
    assert len(refused) == 1 and f"measurement #{hostile_id}" in refused[0]


def test_a_device_with_a_hostile_identity_is_refused_by_name_and_the_rest_served(
    url: str, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    store = TuningStore(url)
    _set_best(store, H200, PROBLEMS[0], 400.0)
    _set_best(store, H100, PROBLEMS[0], 500.0)
    with create_engine(url).connect() as c:
        hostile_id = c.execute(
            text("select id from devices where name = 'NVIDIA H100'")
        ).scalar_one()
    # a compute capability is made into an sm_XX target, and from it nvcc's flags
    _hostile(
        url,
        "update devices set compute_capability = "
        f"{_typed(url, repr('90 -Xcompiler ../x'), '-90')} where id = {hostile_id}",
    )
    served = store.list_best()
    refused = store.broken_rows()
    exported = [e["device"]["name"] for e in store.export()["results"]]
    fault_summary(
        {
            "case": "hostile row: devices.compute_capability not one",
            "backend": _backend(url),
            "refused": refused,
            "served": [r.device.name for r in served],
        }
    )
    assert [r.device.name for r in served] == exported == ["NVIDIA H200"]
    assert len(refused) == 1 and f"device #{hostile_id}" in refused[0]
    assert "compute_capability" in refused[0]


def test_best_configs_with_hostile_numbers_are_refused_by_name_and_the_rest_served(
    url: str, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    store = TuningStore(url)
    _set_best(store, H200, PROBLEMS[0], 400.0, sdpa=230.0)
    _set_best(store, H200, PROBLEMS[1], 110.0, sdpa=60.0)
    _set_best(store, H200, SHORT_Q, 30.0, sdpa=20.0)  # SDPA is faster here
    bad_time = _typed(url, "'fast'", "'-Infinity'")
    hostile = {  # problem (by Lq and Lk) -> column
        (2048, 2048): f"median_us = {bad_time}",
        (1024, 1024): f"trials = {_typed(url, repr('24; rm -rf /'), '-3')}",
        # a family "faster than SDPA" in a region where it never was: dispatch would run it
        (64, 2048): "speedup_vs_default = 1e9",
    }
    for (lq, lk), assignment in hostile.items():
        _hostile(
            url,
            f"update best_configs set {assignment} where problem_id = (select id "
            f"from problems where seqlen_q = {lq} and seqlen_k = {lk})",
        )
    _set_best(store, H200, Problem(4, 16, 16, 512, 512, 128, "fp16", False), 40.0)
    served = store.list_best()
    refused = store.broken_rows()
    faster = store.families_faster_than_sdpa(
        H200, (128, "fp16", False, "17-128"), lambda lq: "17-128" if 17 <= lq <= 128 else ">128"
    )
    fault_summary(
        {
            "case": "hostile row: best_configs numbers (median_us, trials, speed-up)",
            "backend": _backend(url),
            "refused": refused,
            "served": [r.problem.describe() for r in served],
            "families_faster_than_sdpa_at_lq_64": sorted(faster),
        }
    )
    assert [r.problem.seqlen_q for r in served] == [512]
    assert len(refused) == 3 and all("best config #" in r for r in refused)
    assert [
        c
        for c in ("median_us", "trials", "speedup_vs_default")
        if not any(c in r for r in refused)
    ] == []
    assert faster == set()
    with pytest.raises(BrokenRow, match="median_us"):
        store.best(H200, PROBLEMS[0])


def test_a_baseline_with_a_hostile_time_is_refused_by_name_and_the_rest_served(
    url: str, fault_summary: Callable[[dict[str, Any]], None], caplog: pytest.LogCaptureFixture
) -> None:
    store = TuningStore(url)
    for median in (230.0, 231.0):
        store.record_baselines(
            H200, PROBLEMS[0], "s", [BaselineTiming("default", median, median - 5, median + 5)]
        )
    with create_engine(url).connect() as c:
        hostile_id = c.execute(
            text("select id from baselines where median_us = 231.0")
        ).scalar_one()
    # the newest SDPA time, and a negative one: every kernel would be "slower than SDPA"
    _hostile(
        url,
        f"update baselines set median_us = {_typed(url, repr('231us'), '-231')} "
        f"where id = {hostile_id}",
    )
    with caplog.at_level(logging.WARNING, logger="autotune"):
        latest = store.latest_baseline(H200, PROBLEMS[0])
        every = store.latest_baselines(H200, PROBLEMS[0])
    refused = _warnings(caplog)
    fault_summary(
        {
            "case": "hostile row: baselines.median_us not a time",
            "backend": _backend(url),
            "refused": refused,
            "served": latest.median_us if latest else None,
        }
    )
    assert latest is not None and latest.median_us == 230.0
    assert every["default"].median_us == 230.0
    assert refused and all(f"baseline #{hostile_id}" in r for r in refused)


def test_runtime_misses_with_hostile_counts_or_paths_are_refused_by_name_and_the_rest_served(
    url: str, fault_summary: Callable[[dict[str, Any]], None], caplog: pytest.LogCaptureFixture
) -> None:
    store = TuningStore(url)
    now = datetime.now(UTC)
    store.add_misses(
        [
            (H200, PROBLEMS[0], "nearest", 5, now, now),
            (H200, PROBLEMS[1], "nearest", 3, now, now),
            (H200, SHORT_Q, "heuristic", 2, now, now),
        ]
    )
    with create_engine(url).connect() as c:
        ids = dict(c.execute(text("select count, id from runtime_misses")).all())
    # a count that ranks first in `tune --misses`, and a path that is a file system path
    _hostile(
        url,
        f"update runtime_misses set count = {_typed(url, repr('lots'), '-5')} where id = {ids[5]}",
    )
    _hostile(url, f"update runtime_misses set path = '../../x' where id = {ids[3]}")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        served = store.list_misses(H200, limit=10)
    refused = _warnings(caplog)
    fault_summary(
        {
            "case": "hostile row: runtime_misses.count and .path not ones",
            "backend": _backend(url),
            "refused": refused,
            "served": [(m.problem.describe(), m.path, m.count) for m in served],
        }
    )
    assert [(m.problem, m.count) for m in served] == [(SHORT_Q, 2)]
    assert len(refused) == 2
    assert any(f"runtime miss #{ids[5]} has no valid count" in r for r in refused)
    assert any(f"runtime miss #{ids[3]} has no valid path" in r for r in refused)


def test_a_build_with_a_hostile_artifact_key_is_refused_by_name_and_the_rest_served(
    url: str, fault_summary: Callable[[dict[str, Any]], None], caplog: pytest.LogCaptureFixture
) -> None:
    store = TuningStore(url)
    for problem, key in ((PROBLEMS[0], "a" * 32), (PROBLEMS[1], "b" * 32)):
        config = Config.from_dict(sm80_config())
        build = BuildResult(config, "sm_90a", Status.OK, key=key)
        result = TrialResult(config, Status.OK, median_us=400.0)
        trial = store.record_trial(
            H200, problem, result, build=build, study="s", phase="search", baseline_us=None
        )
        store.set_best(
            H200,
            problem,
            result,
            measurement_id=trial,
            study="s",
            trials=1,
            sdpa_default_us=None,
            sdpa_flash_us=None,
        )
    with create_engine(url).connect() as c:
        hostile_id = c.execute(
            text(f"select id from builds where artifact_key = '{'a' * 32}'")
        ).scalar_one()
    _hostile(url, f"update builds set artifact_key = '../../cubins/x' where id = {hostile_id}")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        timed = store.timed_build_keys(H200)
        timings = store.timings(H200, PROBLEMS[0])
    refused = _warnings(caplog)
    fault_summary(
        {
            "case": "hostile row: builds.artifact_key not a key",
            "backend": _backend(url),
            "refused": refused,
            "served": sorted(timed.values()),
        }
    )
    assert timed == {("NVIDIA H200", PROBLEMS[1]): "b" * 32}
    assert [(t.median_us, t.build_key) for t in timings] == [(400.0, None)]
    assert refused and all(f"build #{hostile_id}" in r for r in refused)


def test_a_refused_best_leaves_dispatch_the_nearest_problem(
    url: str, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    """A refused best of the exact problem is one row: dispatch still takes the nearest tuned
    problem (and nearest() passes over a refused row to the next nearest) rather than falling
    to the built-in defaults."""
    from autotune.model.target import target_for_capability
    from autotune.runtime.dispatch import Dispatcher

    store = TuningStore(url)
    wanted = Problem(4, 16, 16, 3000, 3000, 128, "fp16", False)
    near = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)
    far = Problem(4, 16, 16, 1024, 1024, 128, "fp16", False)
    for problem, median in ((wanted, 700.0), (near, 400.0), (far, 110.0)):
        _set_best(store, H200, problem, median, sdpa=2 * median)
    _hostile(
        url,
        f"update best_configs set median_us = {_typed(url, repr('x'), '-1')} "
        "where problem_id in (select id from problems where seqlen_q in (3000, 2048))",
    )
    nearest = store.nearest(H200, wanted)
    decision = Dispatcher(url, use_shipped=False).would_run(
        wanted, H200, target_for_capability(90)
    )
    fault_summary(
        {
            "case": "hostile rows: best_configs of the exact and the nearest problem",
            "backend": _backend(url),
            "refused": list(decision.skipped),
            "served": decision.describe(),
        }
    )
    assert nearest is not None and nearest[0].problem == far
    assert decision.path == "nearest" and decision.tuned_problem == far, decision.describe()
    assert any("best config #" in note for note in decision.skipped), decision.skipped


def test_text_in_a_date_column_fails_no_read(
    tmp_path: Path,
    fault_summary: Callable[[dict[str, Any]], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SQLite keeps any text in a date column (PostgreSQL's timestamptz refuses it on write):
    such a date reads as none, with a warning, instead of failing every read of its table
    (the bests, the queue)."""
    url = f"sqlite:///{tmp_path}/t.db"
    store = TuningStore(url)
    for problem, median in zip(PROBLEMS, (400.0, 110.0), strict=True):
        _set_best(store, H200, problem, median)
    queue = WorkQueue(store)
    queue.enqueue(H200, PROBLEMS, [], {"trials": 3})
    _hostile(
        url,
        "update best_configs set updated_at = 'yesterday; drop table x' "
        "where id = (select min(id) from best_configs)",
    )
    _hostile(
        url,
        "update work_items set enqueued_at = 'soon' where id = (select min(id) from work_items)",
    )
    with caplog.at_level(logging.WARNING, logger="autotune"):
        served = store.list_best()
        items = queue.items()
        taken = queue.take(H200, "w", lease_s=60)
    warned = _warnings(caplog)
    fault_summary(
        {
            "case": "hostile row: text in a date column (SQLite)",
            "backend": "sqlite",
            "refused": warned,
            "served": [r.problem.describe() for r in served],
        }
    )
    assert sorted(r.median_us for r in served) == [110.0, 400.0]
    assert len(items) == 2 and taken is not None
    assert any("'yesterday; drop table x'" in w for w in warned), warned
    assert any("'soon'" in w for w in warned), warned
