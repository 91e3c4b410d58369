"""A tuned decode config in the database is what `attention` runs: the stored KV split count
is the launch's (split workspaces on the caller's stream), plain, with LSE and in a captured
CUDA graph, against the fp32 reference."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

import autotune
from autotune.measure.reference import reference_attention
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.runtime.attention import configure, dispatcher
from autotune.runtime.dispatch import device_info
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore

pytestmark = pytest.mark.gpu

PROBLEM = Problem(3, 32, 8, 4, 5000, 128, "bf16", True)
TILE = dict(block_m=16, block_n=64, num_warps=4, kv_stages=3, pack_gqa=True, num_splits=8)


@pytest.fixture(scope="module", autouse=True)
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    db = f"sqlite:///{tmp_path_factory.mktemp('db')}/decode.db"
    config = load_space("decode").config(**PROBLEM.space_values(), **TILE)
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


def inputs() -> tuple[torch.Tensor, ...]:
    p = PROBLEM
    return (
        torch.randn(p.batch, p.heads_q, p.seqlen_q, 128, device="cuda", dtype=torch.bfloat16),
        torch.randn(p.batch, p.heads_kv, p.seqlen_k, 128, device="cuda", dtype=torch.bfloat16),
        torch.randn(p.batch, p.heads_kv, p.seqlen_k, 128, device="cuda", dtype=torch.bfloat16),
    )


def assert_matches(
    out: torch.Tensor, lse: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    ref, ref_lse = reference_attention(q, k, v, causal=True, scale=1 / math.sqrt(128))
    assert bool(torch.isfinite(out).all())
    err = torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)
    assert float(err) < 8e-3, float(err)
    if lse is not None:
        torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=1e-4)


def test_exact_path_runs_the_tuned_decode_kernel_with_its_splits() -> None:
    q, k, v = inputs()
    decision = autotune.explain(q, k, v, causal=True)
    assert decision.path == "exact" and decision.config is not None
    assert decision.config.family == "decode" and decision.config["num_splits"] == 8
    for _ in range(2):  # the second call takes the prepared fast path
        out, lse = autotune.attention(q, k, v, causal=True, return_lse=True, strict=True)
        assert_matches(out, lse, q, k, v)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = autotune.attention(q, k, v, causal=True, strict=True)
    q.normal_()
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(captured, None, q, k, v)


PAGED = Problem(3, 32, 8, 4, 4096, 128, "bf16", True, "paged16")


def test_a_cache_problem_is_timed_on_its_cache_and_dispatched_by_kind() -> None:
    """A trial of a KV-cache problem reads the cache as engines hold it (pages through a
    shuffled table, or per-sequence lengths) beside SDPA on the same keys; the tuned config of
    a kind is what `attention_with_kvcache` resolves for a call of that kind, and a kind nobody
    tuned borrows the dense cache's tuning."""
    from dataclasses import replace

    from autotune.build.compiler import compile_config
    from autotune.measure import trial
    from autotune.runtime import decode_choice

    config = load_space("decode").config(**PAGED.space_values(), **{**TILE, "num_splits": 4})
    build = compile_config(config)
    for problem in (PAGED, replace(PAGED, kv_cache="seqlens"), replace(PAGED, kv_cache="dense")):
        result = trial.evaluate(problem, build, rounds=3, round_ms=5.0)
        assert result.ok and result.baseline_us is not None, (problem, result)
        assert 0 < (result.median_us or 0) < 10 * result.baseline_us
    db_config = config.replace(num_splits=2)
    store = dispatcher().store()
    store.set_best(
        device_info(0),
        PAGED,
        TrialResult(db_config, "ok", median_us=20.0),
        measurement_id=None,
        study="test",
        trials=1,
        sdpa_default_us=30.0,
        sdpa_flash_us=40.0,
    )
    configure(db=store.url, use_shipped=False)  # a fresh dispatcher sees the new row
    chosen = decode_choice(PAGED, 0)
    assert chosen is not None and chosen[0] == db_config
    borrowed = decode_choice(replace(PROBLEM, kv_cache="seqlens"), 0)
    assert borrowed is not None and "dense" in borrowed[1]
    assert borrowed[0]["num_splits"] == 8
