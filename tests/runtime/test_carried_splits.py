"""A split-KV config carried from the nearest tuned problem keeps the waves of CTAs it was
tuned for, not its split count: the count is a launch parameter chosen for the tuned
problem's grid (batch x KV heads x query blocks), so at another batch it is scaled by the
ratio of the grids, at most one split per key tile, to one of the family's allowed values.
(On a GPU: 8 splits tuned at batch 8, carried as they were to batch 1, ran a 24-layer decode
step at half of SDPA's speed, benchmarks/results/graph/.)"""

from __future__ import annotations

from typing import Any

import pytest

from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.runtime.dispatch import carried_splits, split_grid


def decode(splits: int, *, block_m: int = 16, block_n: int = 32, pack: bool = True) -> Config:
    return load_space("decode").config(
        head_dim=128,
        dtype="bf16",
        causal=True,
        block_m=block_m,
        block_n=block_n,
        num_warps=2,
        kv_stages=3,
        pack_gqa=pack,
        num_splits=splits,
    )


def problem(batch: int, lq: int, lk: int, heads_q: int = 32, heads_kv: int = 8) -> Problem:
    return Problem(batch, heads_q, heads_kv, lq, lk, 128, "bf16", True, "seqlens")


@pytest.mark.parametrize(
    "source, target, splits, expected",
    [
        # batch 8 -> 1, Lq 4 -> 1: one packed block per KV head either way; 8x the splits
        (problem(8, 4, 32768), problem(1, 1, 32768), 8, 64),
        (problem(8, 4, 32768), problem(1, 1, 8192), 8, 64),
        # the same grid: the same count (and the same config object)
        (problem(8, 4, 32768), problem(8, 1, 8192), 8, 8),
        # a larger batch: fewer splits, never below one
        (problem(8, 4, 32768), problem(64, 1, 512), 8, 1),
        (problem(2, 1, 32768), problem(4, 1, 32768), 16, 8),
        # never more splits than key tiles (8 keys, one tile of 32)
        (problem(8, 4, 32768), problem(1, 1, 8), 8, 1),
        # a ratio between allowed values goes to the nearest in log scale
        (problem(3, 1, 32768), problem(1, 1, 32768), 8, 32),
    ],
)
def test_a_carried_split_count_keeps_the_tuned_grid(
    source: Problem, target: Problem, splits: int, expected: int
) -> None:
    config = decode(splits)
    carried = carried_splits(config, source, target)
    assert carried["num_splits"] == expected
    assert carried.replace(num_splits=splits) == config  # nothing else changes
    if expected == splits:
        assert carried is config


def test_the_grid_counts_packed_rows_per_kv_head_or_rows_per_query_head() -> None:
    p = problem(2, 16, 4096)  # 16 queries x group 4 = 64 packed rows per KV head
    assert split_grid(decode(1, block_m=16), p) == 2 * 8 * 4
    assert split_grid(decode(1, block_m=64), p) == 2 * 8 * 1
    assert split_grid(decode(1, block_m=16, pack=False), p) == 2 * 32 * 1
    decode90: Any = load_space("decode90").config(
        head_dim=128,
        dtype="bf16",
        causal=True,
        block_m=64,
        block_n=128,
        consumer_wgs=1,
        kv_stages=3,
        overlap=True,
        num_splits=2,
    )
    assert split_grid(decode90, p) == 2 * 8  # decode90 always packs GQA
    assert (
        carried_splits(decode90, problem(8, 16, 32768), problem(1, 16, 32768))["num_splits"] == 16
    )


def test_a_config_without_splits_is_carried_as_it_is() -> None:
    sm90 = load_space("sm90").heuristic({"head_dim": 128, "dtype": "bf16", "causal": True})
    assert sm90 is not None
    assert carried_splits(sm90, problem(8, 4, 4096), problem(1, 1, 4096)) is sm90
