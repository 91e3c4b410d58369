"""`autotune.scaled_dot_product_attention` on the GPU over a generated matrix of torch's
arguments: within the validator's tolerance of torch SDPA, and on the kernels exactly where they
compute the same thing (untuned problems run the kernels' defaults here, so that the path is
the kernels' and not the no-regret choice of torch SDPA)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import autotune
from autotune.runtime.sdpa_dropin import TORCH

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kernels_on_untuned_problems")]

CASES = [
    c
    for c in itertools.product(
        [(128, 128), (96, 160), (1, 512)],  # (Lq, Lk)
        [(8, 8), (8, 2)],  # (Hq, Hkv)
        [64, 128],  # head dim
        [False, True],  # is_causal
        [None, 0.2],  # scale
        [False, True],  # enable_gqa
        [None, "bool"],  # attn_mask
        [torch.float16, torch.bfloat16],
    )
    if not (c[3] and c[6])
]


@pytest.mark.parametrize("lengths, heads, dim, is_causal, scale, enable_gqa, mask, dtype", CASES)
def test_the_drop_in_answers_as_torch_and_runs_the_kernels_where_it_should(
    lengths: tuple[int, int],
    heads: tuple[int, int],
    dim: int,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    mask: str | None,
    dtype: torch.dtype,
) -> None:
    (lq, lk), (hq, hkv) = lengths, heads
    q = torch.randn(2, hq, lq, dim, device="cuda", dtype=dtype)
    k = torch.randn(2, hkv, lk, dim, device="cuda", dtype=dtype)
    v = torch.randn(2, hkv, lk, dim, device="cuda", dtype=dtype)
    attn_mask = torch.rand(lq, lk, device="cuda") > 0.3 if mask else None
    kwargs = dict(attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    try:
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs)  # type: ignore[arg-type]
    except RuntimeError:
        with pytest.raises(RuntimeError):
            autotune.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
        return
    decision = autotune.explain_sdpa(q, k, v, **kwargs)  # type: ignore[arg-type]
    got = autotune.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
    assert bool(torch.isfinite(got).all())
    err = torch.linalg.vector_norm(got.float() - want) / torch.linalg.vector_norm(want)
    assert float(err) < 1e-2, (float(err), decision.describe())
    tuned = mask is None and (not is_causal or lq == lk) and (hq == hkv or enable_gqa)
    assert (decision.path != TORCH) == tuned, decision.reason
    if tuned:
        assert decision.config is not None and decision.config.family != "sdpa", decision
