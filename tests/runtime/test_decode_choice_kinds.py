"""Which tuned problem a KV-cache call's config comes from when its own cache kind was not
tuned at its shape: the nearest of its kind, unless a problem tuned on a dense cache is nearer
by more than KIND_DISTANCE (the same kernels read both; on a GPU, a batch-8 four-token
`seqlens` winner carried to a batch-1 single-token step ran at half of SDPA's speed where the
batch-1 dense winner tied it, benchmarks/results/graph/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import target_for_arch
from autotune.runtime import dispatch as dispatch_module
from autotune.runtime import kvcache
from autotune.runtime.dispatch import Dispatcher
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")


def decode(splits: int) -> Config:
    return load_space("decode").config(
        head_dim=128,
        dtype="bf16",
        causal=True,
        block_m=16,
        block_n=32,
        num_warps=2,
        kv_stages=3,
        pack_gqa=True,
        num_splits=splits,
    )


def decode90(splits: int) -> Config:
    return load_space("decode90").config(
        head_dim=128,
        dtype="bf16",
        causal=True,
        block_m=64,
        block_n=64,
        consumer_wgs=1,
        kv_stages=4,
        overlap=True,
        num_splits=splits,
    )


def best(store: TuningStore, problem: Problem, config: Config) -> None:
    store.set_best(
        H200,
        problem,
        TrialResult(config, "ok", median_us=50.0),
        measurement_id=None,
        study="s",
        trials=3,
        sdpa_default_us=100.0,
        sdpa_flash_us=None,
    )


@pytest.fixture
def choose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [])
    monkeypatch.setattr(kvcache, "target_for_device", lambda index=None: target_for_arch(90))
    db = f"sqlite:///{tmp_path}/kv.db"
    store = TuningStore(db)

    def decide(problem: Problem) -> tuple[Config, str] | None:
        d = Dispatcher(db)
        d._identify = lambda index: (H200, target_for_arch(90))  # type: ignore[method-assign,assignment,return-value]
        monkeypatch.setattr(kvcache, "dispatcher", lambda: d)
        return kvcache.decode_choice(problem, 0)

    return store, decide


def seqlens(batch: int, lq: int, lk: int) -> Problem:
    return Problem(batch, 32, 8, lq, lk, 128, "bf16", True, "seqlens")


def dense(batch: int, lq: int, lk: int) -> Problem:
    return Problem(batch, 32, 8, lq, lk, 128, "bf16", True)


def test_a_much_nearer_dense_winner_is_taken_over_a_far_one_of_the_kind(choose: Any) -> None:
    store, decide = choose
    best(store, seqlens(8, 4, 32768), decode(8))  # 7 away from B1 Lq1 Lk8192
    best(store, dense(1, 4, 8192), decode90(16))  # 2 away, + KIND_DISTANCE
    chosen = decide(seqlens(1, 1, 8192))
    assert chosen is not None and chosen[0] == decode90(16)
    assert "tuned on a dense cache (nearer)" in chosen[1]


def test_a_near_winner_of_the_kind_is_kept(choose: Any) -> None:
    store, decide = choose
    best(store, seqlens(1, 2, 8192), decode(16))  # about 1 away
    best(store, dense(1, 1, 8192), decode90(16))  # 0 away, + KIND_DISTANCE: not nearer
    chosen = decide(seqlens(1, 1, 8192))
    assert chosen is not None and chosen[0] == decode(16)


def test_the_problem_tuned_on_its_kind_is_its_own_answer(choose: Any) -> None:
    store, decide = choose
    store.record_trial(
        H200,
        seqlens(1, 1, 8192),
        TrialResult(decode(32), "ok", median_us=40.0),
        build=None,
        study="s",
        phase="rerank",
        baseline_us=80.0,
    )
    best(store, seqlens(1, 1, 8192), decode(32))
    best(store, dense(1, 1, 8192), decode90(16))
    chosen = decide(seqlens(1, 1, 8192))
    assert chosen is not None and chosen[0] == decode(32) and "tuned for this" in chosen[1]


def test_no_tuned_kind_falls_back_to_dense_and_nothing_to_none(choose: Any) -> None:
    store, decide = choose
    assert decide(seqlens(1, 1, 8192)) is None
    best(store, dense(2, 1, 8192), decode90(8))
    chosen = decide(seqlens(1, 1, 8192))
    # the dense winner at batch 2, its splits doubled for batch 1
    assert chosen is not None and chosen[0] == decode90(16)
    assert "no seqlens cache tuned" in chosen[1]
