"""A hostile or corrupt row in a table that is read back is refused with the row named, and the
rest of the table is served. (Problems and configs: test_work_queue, tests/store; imports:
test_import.)"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.status import Status
from autotune.store.queue import WorkQueue
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore

from .conftest import sm80_config

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
PROBLEMS = [Problem(4, 16, 16, 2048, 2048, 128, "fp16", False),
            Problem(4, 16, 16, 1024, 1024, 128, "fp16", False)]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/t.db"
    return str(request.getfixturevalue("postgres_url"))


def _hostile(url: str, sql: str) -> None:
    with create_engine(url).begin() as c:
        c.execute(text(sql))


def test_a_work_item_with_hostile_settings_is_failed_by_name_and_the_rest_served(
        url: str, fault_summary: Callable[[dict[str, Any]], None]) -> None:
    queue = WorkQueue(TuningStore(url))
    queue.enqueue(H200, PROBLEMS, [], {"trials": 3})
    _hostile(url, "update work_items set settings_json = '{\"trials\": 3' "
                  "where problem_id = (select id from problems where seqlen_q = 2048)")
    taken = queue.take(H200, "w", lease_s=60)
    items = queue.items()
    refused = [i for i in items if i.state == "failed"]
    fault_summary({"case": "hostile row: work_items.settings_json not JSON",
                   "backend": create_engine(url).dialect.name,
                   "refused": [i.message for i in refused],
                   "served": taken.problem.describe() if taken else None})
    assert taken is not None and taken.problem == PROBLEMS[1]
    assert len(refused) == 1 and f"work item {refused[0].id}" in (refused[0].message or "")
    assert "settings" in (refused[0].message or "")


def test_a_measurement_with_a_hostile_time_is_refused_by_name_and_the_rest_served(
        url: str, fault_summary: Callable[[dict[str, Any]], None],
        caplog: pytest.LogCaptureFixture) -> None:
    store = TuningStore(url)
    for block_n, median in ((64, 400.0), (128, 380.0)):
        result = TrialResult(Config.from_dict(sm80_config(block_n=block_n)), Status.OK,
                             median_us=median)
        store.record_trial(H200, PROBLEMS[0], result, build=None, study="s", phase="search",
                           baseline_us=None)
    with create_engine(url).connect() as c:
        hostile_id = c.execute(text(
            "select id from measurements where median_us = 380.0")).scalar_one()
    # the fastest time there ever was: dispatch would pick it over every real one
    _hostile(url, f"update measurements set median_us = -1 where id = {hostile_id}")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        served = store.timings(H200, PROBLEMS[0])
    refused = [r.getMessage() for r in caplog.records]
    fault_summary({"case": "hostile row: measurements.median_us negative",
                   "backend": create_engine(url).dialect.name, "refused": refused,
                   "served": [t.median_us for t in served]})
    assert [t.median_us for t in served] == [400.0]
    assert len(refused) == 1 and f"measurement #{hostile_id}" in refused[0]
    assert "median_us" in refused[0]
