"""The decode family on a real GPU: KV caches (padded with per-sequence lengths, paged with
shuffled pages, appended to), KV splits and their combine, GQA packing on and off, against the
fp32 reference, with NaN in every cache slot a sequence does not hold and in the output buffer.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from autotune.measure.kvcache_inputs import KVCase, make_kv_inputs
from autotune.measure.reference import reference_with_kvcache
from autotune.model.config import Config
from autotune.runtime.kvcache import attention_with_kvcache, decode_kernel

pytestmark = pytest.mark.gpu

TOL = {"fp16": 1e-3, "bf16": 8e-3}


def _config(
    head_dim: int, dtype: str, causal: bool, bm: int, bn: int, warps: int, stages: int, pack: bool
) -> Config:
    return Config.make(
        "decode",
        {
            "head_dim": head_dim,
            "dtype": dtype,
            "causal": causal,
            "block_m": bm,
            "block_n": bn,
            "num_warps": warps,
            "kv_stages": stages,
            "pack_gqa": pack,
            "num_splits": 1,
        },
    )


# Structural variants: packing on and off, 1 to 8 warps, block_m 16/32/64, block_n 32..256,
# 2 to 4 stages; head dims 64 and 128 as tuned, 96 and 256 as "compile and validate".
CONFIGS = [
    _config(128, "bf16", False, 16, 128, 4, 3, True),
    _config(128, "bf16", True, 16, 128, 4, 3, True),
    _config(128, "bf16", False, 16, 64, 2, 2, False),
    _config(128, "bf16", True, 32, 128, 8, 2, True),
    _config(128, "fp16", False, 32, 32, 1, 4, True),
    _config(64, "fp16", True, 64, 64, 4, 3, True),
    _config(96, "fp16", False, 16, 64, 4, 3, True),
    _config(256, "bf16", True, 16, 64, 4, 2, True),
]


def _cases(config: Config) -> list[tuple[KVCase, int]]:
    """(case, num_splits) pairs for one config's problem class."""
    d, dt, c = config["head_dim"], config["dtype"], config["causal"]
    lq = 4 if c else 1

    def case(**kw: Any) -> KVCase:
        return KVCase.make(**{"head_dim": d, "dtype": dt, "causal": c, **kw})

    return [
        (case(batch=2, heads_q=8, heads_kv=2, seqlen_q=lq, capacity=1000, lengths=None), 1),
        (case(batch=2, heads_q=8, heads_kv=2, seqlen_q=lq, capacity=1000, lengths=None), 3),
        # lengths 0, 1, a tail, the cache's end; more splits than some sequences have tiles
        (
            case(
                batch=4, heads_q=8, heads_kv=1, seqlen_q=lq, capacity=777, lengths=(0, 1, 500, 777)
            ),
            7,
        ),
        (
            case(
                batch=3,
                heads_q=4,
                heads_kv=4,
                seqlen_q=16 if c else 3,
                capacity=300,
                lengths=(300, 17, 2),
                layout="bhld",
            ),
            2,
        ),
        # paged: pages of 16 and 64 in shuffled order, lengths not a multiple of the page
        (
            case(
                batch=3,
                heads_q=16,
                heads_kv=2,
                seqlen_q=lq,
                capacity=512,
                lengths=(5, 333, 0),
                page_size=16,
            ),
            4,
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
            5,
        ),
        # Lq x group not a multiple of block_m, splits more than key tiles
        (case(batch=1, heads_q=12, heads_kv=4, seqlen_q=5, capacity=100, lengths=None), 16),
    ]


def _check(
    out: torch.Tensor,
    lse: torch.Tensor | None,
    inputs: object,
    case: KVCase,
    lengths: torch.Tensor | None,
) -> None:
    ref, ref_lse = reference_with_kvcache(
        inputs.q,
        inputs.k_cache,
        inputs.v_cache,  # type: ignore[attr-defined]
        cache_seqlens=lengths,
        block_table=inputs.block_table,  # type: ignore[attr-defined]
        causal=case.causal,
        scale=1 / math.sqrt(case.head_dim),
        layout=case.layout,
    )
    got = out if case.layout == "bhld" else out.transpose(1, 2)
    assert bool(torch.isfinite(out).all()), f"{case.describe()}: non-finite output"
    denom = max(float(torch.linalg.vector_norm(ref)), 1e-6)
    err = float(torch.linalg.vector_norm(got.float() - ref)) / denom
    assert err < TOL[case.dtype], f"{case.describe()}: relative error {err:.3e}"
    if lse is not None:
        dead = torch.isinf(ref_lse)
        assert bool(torch.isneginf(lse[dead]).all()), f"{case.describe()}: LSE of empty rows"
        torch.testing.assert_close(lse[~dead], ref_lse[~dead], atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.to_json())
def test_kv_caches_and_splits_match_the_reference(config: Config) -> None:
    kernel = decode_kernel(
        config,
        head_dim=int(config["head_dim"]),
        dtype=str(config["dtype"]),
        causal=bool(config["causal"]),
        device=0,
    )
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
        )
        _check(out, lse, inputs, case, inputs.cache_seqlens)


def test_the_split_count_travels_with_the_config() -> None:
    """A stored config's num_splits is the launch's (one build for every count)."""
    case = KVCase.make(
        batch=2,
        heads_q=16,
        heads_kv=2,
        seqlen_q=2,
        capacity=2048,
        lengths=(2048, 700),
        causal=True,
    )
    inputs = make_kv_inputs(case, "cuda", 5)
    builds = set()
    for splits in (1, 4, 16):
        config = _config(128, "bf16", True, 16, 128, 4, 3, True).replace(num_splits=splits)
        kernel = decode_kernel(config, head_dim=128, dtype="bf16", causal=True, device=0)
        assert kernel.num_splits == splits
        builds.add(kernel.build.cubin)
        out, lse = kernel.with_kvcache(
            inputs.q,
            inputs.k_cache,
            inputs.v_cache,
            cache_seqlens=inputs.cache_seqlens,
            return_lse=True,
        )
        _check(out, lse, inputs, case, inputs.cache_seqlens)
        out = attention_with_kvcache(
            inputs.q,
            inputs.k_cache,
            inputs.v_cache,
            cache_seqlens=inputs.cache_seqlens,
            causal=True,
            config=config,
        )
        _check(out, None, inputs, case, inputs.cache_seqlens)
    assert len(builds) == 1


@pytest.mark.parametrize("page_size", [0, 16])
def test_append_then_attend(page_size: int) -> None:
    case = KVCase.make(
        batch=3,
        heads_q=16,
        heads_kv=4,
        seqlen_q=3,
        capacity=256,
        lengths=(3, 100, 256),
        causal=True,
        page_size=page_size,
        new=3,
    )
    inputs = make_kv_inputs(case, "cuda", 7)
    out, lse = attention_with_kvcache(
        inputs.q,
        inputs.k_cache,
        inputs.v_cache,
        k_new=inputs.k_new,
        v_new=inputs.v_new,
        cache_seqlens=inputs.cache_seqlens,
        block_table=inputs.block_table,
        causal=True,
        return_lse=True,
    )
    assert inputs.cache_seqlens is not None
    _check(out, lse, inputs, case, inputs.cache_seqlens + case.new)


def test_cuda_graph_capture_on_the_callers_stream() -> None:
    case = KVCase.make(
        batch=4,
        heads_q=32,
        heads_kv=8,
        seqlen_q=1,
        capacity=4096,
        lengths=(4096, 1, 2000, 3333),
        page_size=64,
    )
    inputs = make_kv_inputs(case, "cuda", 3)

    def call() -> Any:
        return attention_with_kvcache(
            inputs.q,
            inputs.k_cache,
            inputs.v_cache,
            cache_seqlens=inputs.cache_seqlens,
            block_table=inputs.block_table,
            num_splits=8,
        )

    eager = call()  # loads the kernel outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        call()
        with torch.cuda.graph(graph, stream=stream):
            captured = call()
    torch.cuda.current_stream().wait_stream(stream)
    inputs.q.normal_()
    graph.replay()
    torch.cuda.synchronize()
    _check(captured, None, inputs, case, inputs.cache_seqlens)
    assert not torch.equal(captured, eager)


def test_default_config_and_splits_through_the_public_entry() -> None:
    case = KVCase.make(batch=2, heads_q=64, heads_kv=8, seqlen_q=1, capacity=8192, lengths=None)
    inputs = make_kv_inputs(case, "cuda", 11)
    out = attention_with_kvcache(inputs.q, inputs.k_cache, inputs.v_cache)
    _check(out, None, inputs, case, None)


def test_torch_compile_with_the_append() -> None:
    case = KVCase.make(
        batch=2,
        heads_q=8,
        heads_kv=2,
        seqlen_q=1,
        capacity=512,
        lengths=(7, 300),
        page_size=16,
        new=1,
    )
    inputs = make_kv_inputs(case, "cuda", 13)
    assert inputs.cache_seqlens is not None
    assert inputs.k_new is not None and inputs.v_new is not None

    @torch.compile(fullgraph=True)
    def step(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> Any:
        return attention_with_kvcache(
            q * 1.0,
            inputs.k_cache,
            inputs.v_cache,
            k_new=k_new,
            v_new=v_new,
            cache_seqlens=inputs.cache_seqlens,
            block_table=inputs.block_table,
            return_lse=True,
        )

    out, lse = step(inputs.q, inputs.k_new, inputs.v_new)
    _check(out, lse, inputs, case, inputs.cache_seqlens + 1)


def test_a_repeated_geometry_launches_on_each_calls_own_tensors() -> None:
    """The second call of a geometry takes the launch prepared by the first (no checks, no
    plan): it must read that call's tensors (new data, new lengths, a new block table), give
    the LSE only when asked, and still refuse what the key does not pin."""
    from autotune.launch.tensors import InputError
    from autotune.runtime import kvcache

    config = _config(128, "bf16", False, 16, 64, 4, 3, True).replace(num_splits=4)
    first = KVCase.make(
        batch=3,
        heads_q=16,
        heads_kv=2,
        seqlen_q=1,
        capacity=512,
        lengths=(5, 333, 0),
        page_size=16,
    )
    second = KVCase.make(
        batch=3,
        heads_q=16,
        heads_kv=2,
        seqlen_q=1,
        capacity=512,
        lengths=(512, 17, 200),
        page_size=16,
    )

    def call(inputs: Any, **kw: Any) -> Any:
        return attention_with_kvcache(
            inputs.q,
            inputs.k_cache,
            inputs.v_cache,
            cache_seqlens=inputs.cache_seqlens,
            block_table=inputs.block_table,
            config=config,
            **kw,
        )

    a = make_kv_inputs(first, "cuda", 21)
    out, lse = call(a, return_lse=True)
    _check(out, lse, a, first, a.cache_seqlens)
    prepared = len(kvcache._prepared)
    b = make_kv_inputs(second, "cuda", 22)
    out, lse = call(b, return_lse=True)
    _check(out, lse, b, second, b.cache_seqlens)
    out = call(b)
    assert isinstance(out, torch.Tensor)
    _check(out, None, b, second, b.cache_seqlens)
    assert len(kvcache._prepared) == prepared  # both were hits
    with pytest.raises(InputError, match="causal"):
        call(b, causal=1)
    with pytest.raises(InputError, match="aligned"):  # q one element into its buffer
        q = torch.empty(b.q.numel() + 1, dtype=b.q.dtype, device="cuda")[1:].view(b.q.shape)
        attention_with_kvcache(
            q.copy_(b.q),
            b.k_cache,
            b.v_cache,
            cache_seqlens=b.cache_seqlens,
            block_table=b.block_table,
            config=config,
        )
