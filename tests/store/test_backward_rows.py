"""Backward problems in the tuning database (schema 0.7.0): a problem's backward is a row of
its own, so its best config, its measurements and its nearest neighbours never mix with the
forward's (a forward dispatch never reads a backward timing, nor the reverse); export and
import keep the pass; a row whose config is of the other pass is refused, never run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import BrokenRow, TuningStore

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
SHAPE = (2, 32, 8, 4096, 4096, 128, "bf16", True)
FORWARD = Problem(*SHAPE)
BACKWARD = Problem(*SHAPE, backward=True)
DETERMINISTIC = Problem(*SHAPE, backward=True, deterministic=True)


@pytest.fixture
def store(tmp_path: Path) -> TuningStore:
    return TuningStore(f"sqlite:///{tmp_path}/t.db")


def config_for(problem: Problem) -> Config:
    if problem.backward:
        space = load_space("bwd")
        config = space.heuristic(space.problem_values(problem))
    else:
        config = load_space("sm90").heuristic(problem.space_values())
    assert config is not None
    return config


def put_best(
    store: TuningStore, problem: Problem, us: float, sdpa_us: float, config: Config | None = None
) -> None:
    config = config or config_for(problem)
    result = TrialResult(config, "ok", median_us=us, p20_us=us, p80_us=us, rounds=9)
    mid = store.record_trial(
        H200, problem, result, build=None, study="s", phase="rerank", baseline_us=sdpa_us
    )
    store.set_best(
        H200,
        problem,
        result,
        measurement_id=mid,
        study="s",
        trials=4,
        sdpa_default_us=sdpa_us,
        sdpa_flash_us=None,
    )


def test_each_pass_keeps_its_own_best_and_neighbours(store: TuningStore) -> None:
    put_best(store, FORWARD, 400.0, 420.0)
    assert store.best(H200, BACKWARD) is None
    assert store.nearest(H200, BACKWARD) is None  # a forward problem is no neighbour
    put_best(store, BACKWARD, 1500.0, 1200.0)
    put_best(store, DETERMINISTIC, 1800.0, 1200.0)
    forward, backward = store.best(H200, FORWARD), store.best(H200, BACKWARD)
    assert forward is not None and forward.config.family == "sm90"
    assert forward.median_us == 400.0
    assert backward is not None and backward.config.family == "bwd"
    assert backward.median_us == 1500.0
    deterministic = store.best(H200, DETERMINISTIC)
    assert deterministic is not None and deterministic.config["deterministic"] is True
    near = store.nearest(H200, Problem(4, 32, 8, 4096, 4096, 128, "bf16", True, backward=True))
    assert near is not None and near[0].problem == BACKWARD
    near = store.nearest(H200, Problem(4, 32, 8, 4096, 4096, 128, "bf16", True))
    assert near is not None and near[0].problem == FORWARD
    assert {r.problem for r in store.list_best()} == {FORWARD, BACKWARD, DETERMINISTIC}
    # the forward dispatch's region rule reads forward rows only: the backward's kernel lost
    # to SDPA there, and the forward's family won
    region = (128, "bf16", True, "all")
    faster, timed = store.families_against_sdpa(H200, region, lambda lq: "all")
    assert faster == timed == {"sm90"}


def test_export_and_import_keep_the_pass(store: TuningStore, tmp_path: Path) -> None:
    for problem in (FORWARD, BACKWARD, DETERMINISTIC):
        put_best(store, problem, 500.0, 600.0)
    path = tmp_path / "out.json"
    path.write_text(json.dumps(store.export()))
    other = TuningStore(f"sqlite:///{tmp_path}/other.db")
    other.import_results(json.loads(path.read_text()))
    assert {r.problem for r in other.list_best()} == {FORWARD, BACKWARD, DETERMINISTIC}
    best = other.best(H200, DETERMINISTIC)
    assert best is not None and best.config == config_for(DETERMINISTIC)


@pytest.mark.parametrize(
    "problem, config_of",
    [(BACKWARD, FORWARD), (FORWARD, BACKWARD), (DETERMINISTIC, BACKWARD)],
)
def test_an_entry_whose_config_is_of_the_other_pass_is_refused(
    store: TuningStore, tmp_path: Path, problem: Problem, config_of: Problem
) -> None:
    put_best(store, config_of, 500.0, 600.0)
    data = store.export()
    data["results"][0]["problem"] = problem.as_dict()
    other = TuningStore(f"sqlite:///{tmp_path}/other.db")
    with pytest.raises(BrokenRow, match="another problem class"):
        other.import_results(data)
    assert other.list_best() == []


def test_a_row_turned_into_the_other_pass_by_hand_is_refused_not_run(store: TuningStore) -> None:
    put_best(store, BACKWARD, 1500.0, 1200.0)
    other = Problem(1, 32, 8, 1024, 1024, 128, "bf16", True)
    put_best(store, other, 300.0, 320.0)
    with store.engine.begin() as c:  # someone edits the database by hand
        c.exec_driver_sql("UPDATE problems SET backward = 0 WHERE seqlen_q = 4096")
    with pytest.raises(BrokenRow, match="another problem class"):
        store.best(H200, FORWARD)  # the bwd config is never served as a forward's
    assert [r.problem for r in store.list_best()] == [other]  # the rest is served
    assert any("another problem class" in reason for reason in store.broken_rows())
