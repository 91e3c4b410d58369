"""The SDPA arguments of our problem contract (causal aligned bottom-right): a single-query
causal call is handed no mask, since its one row sees every key, and torch's lower-right bias
would route it through Python dispatch code that costs the host more than a decode step costs
the GPU; a call with more queries keeps the bias. Same results either way."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autotune.measure.sdpa import sdpa_call, sdpa_kwargs, sdpa_path


def test_single_query_causal_gets_no_mask() -> None:
    kwargs = sdpa_kwargs(1, 513, 32, 8, causal=True, scale=None)
    assert "attn_mask" not in kwargs and "is_causal" not in kwargs
    assert kwargs["enable_gqa"] is True
    assert sdpa_path(1, 513, 32, 8, causal=True) == sdpa_path(1, 513, 32, 8, causal=False)


@pytest.mark.parametrize(
    "lq, lk, mask",
    [
        (2, 513, "lower-right"),
        (7, 7, "is_causal"),
        (9, 4, "lower-right, Lq > Lk"),
        (1, 1, "is_causal"),
    ],
)
def test_other_causal_problems_keep_their_mask(lq: int, lk: int, mask: str) -> None:
    kwargs = sdpa_kwargs(lq, lk, 4, 4, causal=True, scale=None)
    assert "attn_mask" in kwargs or kwargs.get("is_causal") is True
    assert sdpa_path(lq, lk, 4, 4, causal=True)[0] == mask


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
def test_single_query_causal_matches_the_lower_right_bias(layout: str) -> None:
    from torch.nn.attention.bias import causal_lower_right

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 8, 1, 64, generator=gen)
    k, v = (torch.randn(2, 2, 37, 64, generator=gen) for _ in range(2))
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=causal_lower_right(1, 37), enable_gqa=True
    )
    args = (q, k, v) if layout == "bhld" else tuple(t.transpose(1, 2) for t in (q, k, v))
    got = sdpa_call("default", *args, causal=True, layout=layout)()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
