"""`autotune.attention` on the GPU: the tuned, nearest and heuristic paths against the fp32
reference, through the plain call, the custom op, torch.compile and a captured CUDA graph, in
both layouts, with tails and GQA."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import autotune
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.runtime.attention import Unsupported, configure
from autotune.runtime.dispatch import device_info
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore

from .attention_inputs import check, make

pytestmark = pytest.mark.gpu

TUNED = Problem(2, 8, 2, 300, 300, 128, "fp16", True)  # GQA 4:1, tails
NEAR = Problem(1, 8, 2, 700, 700, 128, "fp16", True)  # same class, other shape
UNTUNED = Problem(1, 6, 6, 77, 1025, 64, "bf16", False)  # nothing of this class in the db


@pytest.fixture(scope="module", autouse=True)
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = f"sqlite:///{tmp_path_factory.mktemp('db')}/dispatch.db"
    config = load_space("sm80").config(
        **TUNED.space_values(),
        block_m=64,
        block_n=64,
        num_warps=4,
        kv_stages=2,
        swizzle=3,
        q_in_regs=True,
    )
    TuningStore(db).set_best(
        device_info(0),
        TUNED,
        TrialResult(config, "ok", median_us=50.0),
        measurement_id=None,
        study="test",
        trials=1,
        sdpa_default_us=40.0,
        sdpa_flash_us=60.0,
    )
    configure(db=db, use_shipped=False, untuned="kernel")  # the kernels' default, untuned
    yield db
    configure()


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
@pytest.mark.parametrize(
    "problem, path", [(TUNED, "exact"), (NEAR, "nearest"), (UNTUNED, "heuristic")]
)
def test_plain_call_on_each_path(problem: Problem, path: str, layout: str) -> None:
    q, k, v = make(problem, layout)
    decision = autotune.explain(q, k, v, causal=problem.causal, layout=layout)
    assert decision.path == path, decision.describe()
    out, lse = autotune.attention(
        q, k, v, causal=problem.causal, layout=layout, return_lse=True, strict=True
    )
    check(out, q, k, v, problem, layout, lse)
    again = autotune.attention(q, k, v, causal=problem.causal, layout=layout, strict=True)
    check(again, q, k, v, problem, layout)


def test_custom_op_and_torch_compile() -> None:
    q, k, v = make(TUNED, "bhld")
    out, lse = torch.ops.cute_autotune.attention(q, k, v, True, None, True, "bhld", True)
    check(out, q, k, v, TUNED, "bhld", lse)

    def block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return autotune.attention(q * 1.0, k, v, causal=True, strict=True) + 0.0

    compiled = torch.compile(block, fullgraph=True)
    check(compiled(q, k, v), q, k, v, TUNED, "bhld")


def test_cuda_graph_capture() -> None:
    q, k, v = make(NEAR, "blhd")
    autotune.attention(q, k, v, causal=True, layout="blhd", strict=True)  # decide outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = autotune.attention(q, k, v, causal=True, layout="blhd", strict=True)
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        check(out, q, k, v, NEAR, "blhd")


def test_strided_views_and_misaligned_inputs() -> None:
    b, length, h, d = 2, 190, 4, 64
    qkv = torch.randn(b, length, 3, h, d, device="cuda", dtype=torch.float16)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out = autotune.attention(q, k, v, layout="blhd", strict=True)
    check(out, q, k, v, Problem(b, h, h, length, length, d, "fp16", False), "blhd")
    odd = torch.randn(b, h, length, d + 4, device="cuda", dtype=torch.float16)[..., 2 : d + 2]
    with pytest.raises(Unsupported, match="aligned"):
        autotune.attention(odd, odd, odd, strict=True)


def test_a_growing_dense_cache_is_decided_per_length_class() -> None:
    """Decode steps against K and V that grow by a token each (a cache held as tensors): a
    decision per length class, not per step, correct at every step, the memos bounded."""
    from autotune.model.buckets import length_class
    from autotune.runtime import attention as attention_module
    from autotune.runtime.attention import dispatcher

    from ..runtime.test_length_classes import _counting

    d = dispatcher()
    decide = d._decide
    decided = _counting(d)
    try:
        lengths = range(900, 1300)
        for length in lengths:
            problem = Problem(1, 8, 2, 1, length, 128, "bf16", True)
            q, k, v = make(problem, "bhld")
            out = autotune.attention(q, k, v, causal=True)
            if length % 50 == 0:
                check(out, q, k, v, problem, "bhld")
    finally:
        d._decide = decide  # type: ignore[method-assign]
    assert len(decided) == len({length_class(n) for n in lengths})
    assert len(attention_module._prepared) <= attention_module.MEMO_SIZE
