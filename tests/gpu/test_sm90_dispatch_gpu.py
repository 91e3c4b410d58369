"""A tuned sm90 config in the database is what `attention` runs on a Hopper GPU: the exact path
through the persistent, TMA-store kernel, plain, repeated and in a captured CUDA graph, against
the fp32 reference with tails, GQA and both layouts."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

import autotune
from autotune.measure.reference import reference_attention
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.runtime.attention import configure
from autotune.runtime.dispatch import device_info
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore

pytestmark = pytest.mark.gpu

# More work tiles (9 m-blocks x 16 heads x 2) than an H200 has SMs: the persistent CTAs loop.
PROBLEM = Problem(2, 16, 4, 1100, 1300, 128, "fp16", True)
TILE = dict(
    block_m=128,
    block_n=128,
    consumer_wgs=2,
    kv_stages=2,
    producer_regs=24,
    overlap=True,
    pingpong=True,
    persistent=True,
)


@pytest.fixture(scope="module", autouse=True)
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 family runs on compute capability 9.0 only")
    db = f"sqlite:///{tmp_path_factory.mktemp('db')}/sm90.db"
    config = load_space("sm90").config(**PROBLEM.space_values(), **TILE)
    TuningStore(db).set_best(
        device_info(0),
        PROBLEM,
        TrialResult(config, "ok", median_us=100.0),
        measurement_id=None,
        study="test",
        trials=1,
        sdpa_default_us=110.0,
        sdpa_flash_us=200.0,
    )
    configure(db=db, use_shipped=False)
    yield
    configure()


def inputs(layout: str) -> tuple[torch.Tensor, ...]:
    p = PROBLEM

    def tensor(heads: int, length: int) -> torch.Tensor:
        shape = (
            (p.batch, heads, length, p.head_dim)
            if layout == "bhld"
            else (p.batch, length, heads, p.head_dim)
        )
        return torch.randn(shape, device="cuda", dtype=torch.float16)

    return (
        tensor(p.heads_q, p.seqlen_q),
        tensor(p.heads_kv, p.seqlen_k),
        tensor(p.heads_kv, p.seqlen_k),
    )


def assert_matches(
    out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str
) -> None:
    ref, _ = reference_attention(q, k, v, causal=True, scale=1 / math.sqrt(128), layout=layout)
    got = out if layout == "bhld" else out.transpose(1, 2)
    assert bool(torch.isfinite(out).all())
    err = torch.linalg.vector_norm(got.float() - ref) / torch.linalg.vector_norm(ref)
    assert float(err) < 1e-3, float(err)


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
def test_exact_path_runs_the_tuned_sm90_kernel(layout: str) -> None:
    q, k, v = inputs(layout)
    decision = autotune.explain(q, k, v, causal=True, layout=layout)
    assert decision.path == "exact" and decision.config is not None
    assert decision.config.family == "sm90", decision.describe()
    for _ in range(2):  # the second call takes the prepared fast path
        assert_matches(
            autotune.attention(q, k, v, causal=True, layout=layout, strict=True), q, k, v, layout
        )


def test_cuda_graph_replay_of_the_sm90_kernel() -> None:
    q, k, v = inputs("bhld")
    autotune.attention(q, k, v, causal=True, strict=True)  # decide and load outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = autotune.attention(q, k, v, causal=True, strict=True)
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, q, k, v, "bhld")
