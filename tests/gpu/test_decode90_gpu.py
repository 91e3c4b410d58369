"""The decode90 family (wgmma + TMA, GQA packed into 64-128 rows) on an sm_90 GPU: full
contiguous caches in both layouts, per-sequence lengths into a padded cache (0, 1, a tail, the
end) and paged caches (pages of 16, 64 and 256 rows in shuffled order, lengths not a multiple
of the page), every unused cache slot NaN; KV splits reduced in a thread-block cluster and by
the combine entry, GQA / MQA / MHA, Lq x group not a multiple of the tile, causal rows that see
no key, against the fp32 reference with the output buffer poisoned; which split counts get a
cluster; pages too short for its TMA boxes refused; a tuned decode90 config run by `attention`,
plain and in a captured CUDA graph, and by `attention_with_kvcache` on a paged cache.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch

import autotune
from autotune.measure.kvcache_inputs import KVCase, make_kv_inputs
from autotune.measure.reference import reference_attention
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.runtime.attention import configure
from autotune.runtime.dispatch import device_info
from autotune.runtime.kvcache import decode_choice, decode_kernel
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore

from .test_decode_gpu import _check

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
        reason="decode90 runs on compute capability 9.0 only",
    ),
]


def _config(
    head_dim: int,
    dtype: str,
    causal: bool,
    bm: int,
    bn: int,
    wgs: int,
    stages: int,
    overlap: bool,
    ctas_per_sm: int = 1,
) -> Config:
    return Config.make(
        "decode90",
        {
            "head_dim": head_dim,
            "dtype": dtype,
            "causal": causal,
            "block_m": bm,
            "block_n": bn,
            "consumer_wgs": wgs,
            "kv_stages": stages,
            "overlap": overlap,
            "ctas_per_sm": ctas_per_sm,
            "num_splits": 1,
        },
    )


# Structural variants: 1 and 2 consumer warpgroups, block_m 64/128, block_n 64/128, 2 to 4
# stages, the overlapped schedule on and off, both head dims and dtypes, both masks, one and
# two CTAs per SM (the latter with one warpgroup on 64 and on 128 rows).
CONFIGS = [
    _config(128, "bf16", True, 128, 128, 2, 3, True),
    _config(128, "bf16", False, 128, 64, 1, 4, False),
    _config(128, "fp16", True, 64, 128, 1, 2, False),
    _config(128, "fp16", False, 64, 64, 1, 3, True),
    _config(64, "bf16", True, 128, 64, 2, 4, True),
    _config(64, "fp16", False, 64, 128, 1, 4, True),
    _config(128, "bf16", True, 64, 64, 1, 2, True, ctas_per_sm=2),
    _config(64, "fp16", False, 128, 64, 1, 3, False, ctas_per_sm=2),
]


def _cases(config: Config) -> list[tuple[KVCase, int]]:
    """(case, num_splits) pairs for one config's problem class."""
    d, dt, c = config["head_dim"], config["dtype"], config["causal"]

    def case(**kw: Any) -> KVCase:
        return KVCase.make(**{"head_dim": d, "dtype": dt, "causal": c, "lengths": None, **kw})

    # KV caches: slots past a sequence's length are NaN and must never reach the output.
    caches = [
        (
            case(
                batch=4, heads_q=8, heads_kv=1, seqlen_q=3, capacity=777, lengths=(0, 1, 500, 777)
            ),
            1,
        ),
        (
            case(
                batch=4,
                heads_q=16,
                heads_kv=2,
                seqlen_q=4,
                capacity=1000,
                lengths=(1000, 129, 0, 64),
                layout="bhld",
            ),
            4,
        ),
        (
            case(
                batch=3,
                heads_q=16,
                heads_kv=2,
                seqlen_q=2,
                capacity=512,
                lengths=(5, 333, 0),
                page_size=16,
            ),
            8,
        ),
        (
            case(
                batch=2,
                heads_q=32,
                heads_kv=8,
                seqlen_q=8,
                capacity=1024,
                lengths=(1000, 64),
                page_size=64,
                layout="bhld",
            ),
            2,
        ),
        (
            case(
                batch=2,
                heads_q=16,
                heads_kv=2,
                seqlen_q=16,
                capacity=1024,
                lengths=(700, 1024),
                page_size=256,
            ),
            16,
        ),
        (
            case(
                batch=2,
                heads_q=8,
                heads_kv=2,
                seqlen_q=1,
                capacity=2048,
                lengths=(2047, 3),
                page_size=16,
            ),
            1,
        ),
        # Two splits exchange rows (each CTA owns half the tile): 40 packed rows (both halves of
        # a 64-row tile, one of a 128-row tile), a sequence of no keys, one whose second split
        # has none
        (case(batch=3, heads_q=8, heads_kv=1, seqlen_q=5, capacity=600, lengths=(0, 600, 77)), 2),
    ]

    cases = [
        (case(batch=2, heads_q=8, heads_kv=2, seqlen_q=4, capacity=1000), 1),
        (case(batch=2, heads_q=8, heads_kv=2, seqlen_q=4, capacity=1000), 3),
        # 8 splits: the largest cluster the launcher asks for
        (case(batch=2, heads_q=8, heads_kv=2, seqlen_q=4, capacity=1000), 8),
        # 128 packed rows (GQA 8, Lq 16), [B, H, L, D]
        (case(batch=2, heads_q=16, heads_kv=2, seqlen_q=16, capacity=1000, layout="bhld"), 4),
        # MQA: 96 rows; MHA: 16 rows of one head
        (case(batch=1, heads_q=32, heads_kv=1, seqlen_q=3, capacity=333), 2),
        (case(batch=3, heads_q=4, heads_kv=4, seqlen_q=16, capacity=300, layout="bhld"), 2),
        # Lq x group not a multiple of block_m, splits more than key tiles
        (case(batch=1, heads_q=12, heads_kv=4, seqlen_q=5, capacity=100), 16),
        # 256 packed rows: two or four row tiles per KV head
        (case(batch=1, heads_q=8, heads_kv=2, seqlen_q=64, capacity=700), 2),
    ]
    if c:  # Lq > Lk: the first rows see no key (O = 0, LSE = -inf)
        cases.append((case(batch=1, heads_q=8, heads_kv=2, seqlen_q=64, capacity=50), 2))
    return cases + caches


def _kernel(config: Config) -> Any:
    return decode_kernel(
        config,
        head_dim=int(config["head_dim"]),
        dtype=str(config["dtype"]),
        causal=bool(config["causal"]),
        device=0,
    )


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.to_json())
@pytest.mark.parametrize("cluster_combine", [True, False], ids=["cluster", "combine_entry"])
def test_full_caches_and_splits_match_the_reference(config: Config, cluster_combine: bool) -> None:
    kernel = _kernel(config)
    for seed, (case, splits) in enumerate(_cases(config)):
        inputs = make_kv_inputs(case, "cuda", seed)
        out = torch.full_like(inputs.q, float("nan"))  # poisoned: every row must be written
        out, lse = kernel.with_kvcache(
            inputs.q,
            inputs.k_cache,
            inputs.v_cache,
            cache_seqlens=inputs.cache_seqlens,
            block_table=inputs.block_table,
            layout=case.layout,
            out=out,
            return_lse=True,
            num_splits=splits,
            cluster_combine=cluster_combine,
        )
        _check(out, lse, inputs, case, inputs.cache_seqlens)  # the decode tests' check


def test_splits_reduce_in_a_cluster_where_one_fits() -> None:
    """2-8 splits get a cluster (Hopper's portable size fits an H200's GPC); more, or
    cluster_combine off: the combine entry."""
    kernel = _kernel(CONFIGS[1])
    problem = Problem(1, 32, 8, 1, 8192, 128, "bf16", False)
    strides = [
        (32 * 128, 128, 32 * 128),
        (8192 * 8 * 128, 128, 8 * 128),
        (8192 * 8 * 128, 128, 8 * 128),
        (32 * 128, 128, 32 * 128),
    ]

    def cluster(splits: int, **kw: Any) -> int:
        plan = kernel.plan(problem, strides, 0.088, num_splits=splits, **kw)
        return int(plan.cluster)

    assert [cluster(s) for s in (1, 2, 3, 4, 8, 16, 32)] == [0, 2, 3, 4, 8, 0, 0]
    assert cluster(8, cluster_combine=False) == 0


def test_a_grid_of_more_clusters_than_fit_at_once_uses_the_combine_entry() -> None:
    """A cluster must fit in one GPC: an H200 holds 15 clusters of 8 one-per-SM CTAs at once.
    A grid of 16 such clusters (128 CTAs, one wave without clusters) ran in two waves: 97 us
    against 40 for the same work under Nsight Compute (B1 H64/8 Lq16 Lk32k). Its splits go to
    the combine entry; clusters of 4 or 2 of the same tiles all fit at once and stay."""
    if torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("15 clusters of 8 at once is what a 132-SM H200 holds")
    kernel = _kernel(CONFIGS[1])  # 128 rows, one CTA per SM
    problem = Problem(1, 128, 8, 16, 8192, 128, "bf16", False)  # 2 row tiles x 8 KV heads
    q_strides = (16 * 128 * 128, 128, 128 * 128)
    kv_strides = (8192 * 8 * 128, 128, 8 * 128)

    def cluster(splits: int) -> int:
        plan = kernel.plan(
            problem, [q_strides, kv_strides, kv_strides, q_strides], 0.088, num_splits=splits
        )
        return int(plan.cluster)

    assert [cluster(s) for s in (2, 4, 8)] == [2, 4, 0]


def test_pages_shorter_than_a_swizzle_atom_pair_are_refused() -> None:
    """A TMA kernel loads a page as boxes of whole 128-byte swizzle atoms: pages of 8 rows are
    refused with a clear error (the decode family reads them), never launched."""
    kernel = _kernel(CONFIGS[0])
    paged = KVCase.make(
        batch=2,
        heads_q=16,
        heads_kv=2,
        seqlen_q=4,
        capacity=512,
        lengths=(512, 100),
        causal=True,
        page_size=8,
    )
    inputs = make_kv_inputs(paged, "cuda", 2)
    with pytest.raises(ValueError, match="at least 16 rows"):
        kernel.with_kvcache(
            inputs.q,
            inputs.k_cache,
            inputs.v_cache,
            cache_seqlens=inputs.cache_seqlens,
            block_table=inputs.block_table,
        )
    assert not load_space("decode90").reads("paged8") and load_space("decode").reads("paged8")


PROBLEM = Problem(2, 64, 8, 16, 3000, 128, "bf16", True)


@pytest.fixture()
def tuned_decode90(tmp_path: Any) -> Iterator[None]:
    db = f"sqlite:///{tmp_path}/decode90.db"
    config = CONFIGS[0].replace(num_splits=4)
    TuningStore(db).set_best(
        device_info(0),
        PROBLEM,
        TrialResult(config, "ok", median_us=50.0),
        measurement_id=None,
        study="test",
        trials=1,
        sdpa_default_us=80.0,
        sdpa_flash_us=90.0,
    )
    configure(db=db, use_shipped=False)
    yield
    configure()


def test_attention_runs_a_tuned_decode90_config(tuned_decode90: None) -> None:
    p = PROBLEM
    q = torch.randn(p.batch, p.heads_q, p.seqlen_q, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(p.batch, p.heads_kv, p.seqlen_k, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    decision = autotune.explain(q, k, v, causal=True)
    assert decision.config is not None and decision.config.family == "decode90"
    assert decision.config["num_splits"] == 4

    def check(out: torch.Tensor, lse: torch.Tensor | None) -> None:
        ref, ref_lse = reference_attention(q, k, v, causal=True, scale=1 / math.sqrt(128))
        err = torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)
        assert bool(torch.isfinite(out).all()) and float(err) < 8e-3, float(err)
        if lse is not None:
            torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=1e-4)

    for _ in range(2):
        out, lse = autotune.attention(q, k, v, causal=True, return_lse=True, strict=True)
        check(out, lse)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = autotune.attention(q, k, v, causal=True, strict=True)
    torch.cuda.current_stream().wait_stream(stream)
    q.normal_()
    graph.replay()
    torch.cuda.synchronize()
    check(captured, None)
    assert all(load_space("decode90").reads(k) for k in ("dense", "seqlens", "paged16"))


def test_attention_with_kvcache_runs_a_tuned_decode90_config_on_pages(tmp_path: Any) -> None:
    """A paged problem tuned to decode90 is run by attention_with_kvcache with that config (the
    split-KV families that read the cache kind are all looked up), matching the reference."""
    case = KVCase.make(
        batch=3,
        heads_q=32,
        heads_kv=4,
        seqlen_q=2,
        capacity=1024,
        lengths=(1024, 1, 555),
        page_size=64,
    )
    problem = replace(case.problem, kv_cache="paged64")
    config = CONFIGS[1].replace(num_splits=2)
    db = f"sqlite:///{tmp_path}/paged.db"
    TuningStore(db).set_best(
        device_info(0),
        problem,
        TrialResult(config, "ok", median_us=20.0),
        measurement_id=None,
        study="test",
        trials=1,
        sdpa_default_us=None,
        sdpa_flash_us=None,
    )
    configure(db=db, use_shipped=False)
    try:
        chosen = decode_choice(problem, 0)
        assert chosen is not None and chosen[0] == config, chosen
        inputs = make_kv_inputs(case, "cuda", 5)
        out, lse = autotune.attention_with_kvcache(
            inputs.q,
            inputs.k_cache,
            inputs.v_cache,
            cache_seqlens=inputs.cache_seqlens,
            block_table=inputs.block_table,
            return_lse=True,
        )
        _check(out, lse, inputs, case, inputs.cache_seqlens)
    finally:
        configure()
