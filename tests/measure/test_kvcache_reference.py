"""The KV-cache reference on the CPU: a paged cache with shuffled pages, a padded cache with
per-sequence lengths and the plain reference on the sliced tensors all give one answer, and
the NaN in slots no sequence holds never reaches it."""

from __future__ import annotations

import math

import pytest
import torch

from autotune.measure.kvcache_inputs import KVCase, make_kv_inputs
from autotune.measure.reference import reference_attention, reference_with_kvcache


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize("causal", [False, True])
def test_paged_padded_and_sliced_agree(layout: str, causal: bool) -> None:
    base = dict(
        batch=3,
        heads_q=8,
        heads_kv=2,
        seqlen_q=4,
        capacity=64,
        lengths=(0, 13, 64),
        head_dim=32,
        dtype="fp16",
        causal=causal,
        layout=layout,
    )
    padded = make_kv_inputs(KVCase.make(**base), "cpu", 5)  # type: ignore[arg-type]
    paged = make_kv_inputs(KVCase.make(**base, page_size=16), "cpu", 5)  # type: ignore[arg-type]
    scale = 1 / math.sqrt(32)
    out_a, lse_a = reference_with_kvcache(
        padded.q,
        padded.k_cache,
        padded.v_cache,
        cache_seqlens=padded.cache_seqlens,
        block_table=None,
        causal=causal,
        scale=scale,
        layout=layout,
    )
    out_b, lse_b = reference_with_kvcache(
        paged.q,
        paged.k_cache,
        paged.v_cache,
        cache_seqlens=paged.cache_seqlens,
        block_table=paged.block_table,
        causal=causal,
        scale=scale,
        layout=layout,
    )
    assert paged.block_table is not None
    assert sorted(paged.block_table.flatten().tolist()) != paged.block_table.flatten().tolist()
    assert torch.isfinite(out_a).all() and torch.equal(out_a, out_b)
    assert torch.equal(lse_a, lse_b)
    assert (out_a[0] == 0).all() and torch.isneginf(lse_a[0]).all()  # length 0
    qb = padded.q if layout == "bhld" else padded.q.transpose(1, 2)
    kb = padded.k_cache if layout == "bhld" else padded.k_cache.transpose(1, 2)
    vb = padded.v_cache if layout == "bhld" else padded.v_cache.transpose(1, 2)
    ref, ref_lse = reference_attention(
        qb[1:2], kb[1:2, :, :13], vb[1:2, :, :13], causal=causal, scale=scale
    )
    assert torch.equal(out_a[1:2], ref) and torch.equal(lse_a[1:2], ref_lse)


@pytest.mark.parametrize("seed", range(6))
def test_random_caches_agree_paged_and_padded(seed: int) -> None:
    """Random batch, group, query rows, lengths (0 and full included), page sizes and layouts:
    the paged reference equals the padded one, and no NaN from an unheld slot reaches it."""
    import random

    rng = random.Random(seed)
    page = rng.choice([1, 2, 8, 16])
    capacity = page * rng.randint(1, 12)
    batch = rng.randint(1, 4)
    heads_kv = rng.choice([1, 2])
    lengths = tuple(rng.choice([0, capacity, rng.randint(0, capacity)]) for _ in range(batch))
    base = dict(
        batch=batch,
        heads_q=heads_kv * rng.choice([1, 3, 4]),
        heads_kv=heads_kv,
        seqlen_q=rng.randint(1, 5),
        capacity=capacity,
        lengths=lengths,
        head_dim=16,
        dtype="fp16",
        causal=rng.random() < 0.5,
        layout=rng.choice(["blhd", "bhld"]),
    )
    padded = make_kv_inputs(KVCase.make(**base), "cpu", seed)  # type: ignore[arg-type]
    paged = make_kv_inputs(KVCase.make(**base, page_size=page), "cpu", seed)  # type: ignore[arg-type]
    scale = 0.25
    a = reference_with_kvcache(
        padded.q,
        padded.k_cache,
        padded.v_cache,
        cache_seqlens=padded.cache_seqlens,
        block_table=None,
        causal=bool(base["causal"]),
        scale=scale,
        layout=str(base["layout"]),
    )
    b = reference_with_kvcache(
        paged.q,
        paged.k_cache,
        paged.v_cache,
        cache_seqlens=paged.cache_seqlens,
        block_table=paged.block_table,
        causal=bool(base["causal"]),
        scale=scale,
        layout=str(base["layout"]),
    )
    assert torch.isfinite(a[0]).all() and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for i, n in enumerate(lengths):
        if n == 0:
            assert (a[0][i] == 0).all() and torch.isneginf(a[1][i]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_the_sdpa_baseline_mask_computes_the_padded_cache(causal: bool) -> None:
    """A "seqlens" problem's SDPA baseline reads the padded cache whole with `length_mask`:
    it must compute what the kernels compute (the reference, one sequence at a time)."""
    from autotune.measure.inputs import length_mask
    from autotune.model.problem import Problem

    problem = Problem(5, 8, 2, 4, 96, 32, "fp16", causal, "seqlens")
    lengths = problem.cache_lengths
    assert lengths is not None
    case = KVCase.make(
        5, 8, 2, 4, 96, lengths, head_dim=32, dtype="fp16", causal=causal, layout="bhld"
    )
    inputs = make_kv_inputs(case, "cpu", 3)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    k, v = (t.nan_to_num(0.0).float() for t in (inputs.k_cache, inputs.v_cache))
    out = torch.nn.functional.scaled_dot_product_attention(
        inputs.q.float(),
        k,
        v,
        attn_mask=length_mask(problem, seqlens),
        scale=1 / math.sqrt(32),
        enable_gqa=True,
    )
    ref, _ = reference_with_kvcache(
        inputs.q,
        inputs.k_cache,
        inputs.v_cache,
        cache_seqlens=seqlens,
        block_table=None,
        causal=causal,
        scale=1 / math.sqrt(32),
        layout="bhld",
    )
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
