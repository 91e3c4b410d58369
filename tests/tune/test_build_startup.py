"""TPE's random start is counted in builds: the launch values a build sweeps (each a complete
trial) must not end it (tune/strategies.py, BuildStartupSampler)."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune.model.config import Config
from autotune.model.space import load_space
from autotune.model.target import Target
from autotune.tune.settings import SearchSettings
from autotune.tune.strategies import sampler_for

H200 = Target(90, 232448, "NVIDIA H200")
FIXED = {"head_dim": 128, "dtype": "bf16", "causal": False}
SPACE = load_space("decode90")
PARAMS = {
    p.name: optuna.distributions.CategoricalDistribution(p.values)
    for p in SPACE.params.values()
    if p.role in ("tunable", "launch")
}


def time_us(params: dict[str, Any]) -> float:
    """A landscape like the H200's at B1 H32/8 Lq1 Lk8k: 64-row tiles (the group's 4 rows in
    one wgmma tile) fastest, 8 splits best, the rest small."""
    splits = {1: 100.0, 2: 60.0, 4: 36.0, 8: 20.0, 16: 24.0, 32: 30.0, 64: 40.0}
    return (
        splits[params["num_splits"]] * (1.0 if params["block_m"] == 64 else 1.2)
        + params["kv_stages"] * 0.1
        + params["block_n"] * 0.001
    )


def builds_tried(sampler: Any, builds: int) -> list[dict[str, Any]]:
    """The first `builds` valid configs a decode90 study asks for, asked as the tuning loop
    asks: each told its time with every other split count timed on the same build (a
    complete trial each), invalid proposals pruned."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=sampler)
    tried: list[dict[str, Any]] = []
    for _ in range(200):
        if len(tried) == builds:
            break
        trial = study.ask(PARAMS)
        if SPACE.violations(Config.make("decode90", {**FIXED, **trial.params}), H200):
            study.tell(trial, state=TrialState.PRUNED)
            continue
        tried.append(trial.params)
        study.tell(trial, time_us(trial.params))
        for splits in PARAMS["num_splits"].choices:
            if splits != trial.params["num_splits"]:
                params = {**trial.params, "num_splits": splits}
                study.add_trial(
                    create_trial(params=params, distributions=PARAMS, value=time_us(params))
                )
    return tried


def test_swept_builds_count_once_toward_the_random_start() -> None:
    sampler = sampler_for(SearchSettings(sampler="tpe", tpe_startup=5), ["num_splits"])
    study = optuna.create_study(sampler=sampler)
    for splits in PARAMS["num_splits"].choices:  # one build, seven launch values
        params = {
            "block_m": 128,
            "block_n": 64,
            "consumer_wgs": 2,
            "kv_stages": 4,
            "overlap": True,
            "ctas_per_sm": 1,
            "num_splits": splits,
        }
        study.add_trial(create_trial(params=params, distributions=PARAMS, value=time_us(params)))
    assert len(sampler.measured_builds(study)) == 1


@pytest.mark.parametrize("seed", range(8))
def test_eight_builds_reach_both_tile_heights(seed: int) -> None:
    """8 builds (the decode tuning's budget) must try a 64-row tile and a 128-row one. With
    Optuna's trial-counted start, the first build's sweep ended it and TPE, fitted on one
    build, kept proposing its neighbours (every search of 7 problems on the H200)."""
    tried = builds_tried(
        sampler_for(SearchSettings(sampler="tpe", tpe_startup=5, seed=seed), ["num_splits"]), 8
    )
    assert {p["block_m"] for p in tried} == {64, 128}, tried
