"""No device synchronisation on the attention path (issue 39, item 2): `attention()` (its first
call of a geometry, which decides and plans, and its repeated calls), the SDPA drop-in and the
native transformers attention in decode steps against a growing cache, all under
`torch.cuda.set_sync_debug_mode("error")` (a synchronising CUDA call raises), and a repeated
call captured in a CUDA graph (a capture fails on a synchronisation, the launcher's C++
included)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

import autotune

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kernels_on_untuned_problems")]


@contextmanager
def no_sync() -> Iterator[None]:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _qkv(
    b: int, hq: int, hkv: int, lq: int, lk: int, d: int = 128
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randn(b, hq, lq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, lk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize(
    "lq, lk, causal", [(513, 513, True), (1, 700, False), (8, 900, True), (300, 300, False)]
)
def test_attention_first_and_repeated_calls_do_not_sync(lq: int, lk: int, causal: bool) -> None:
    q, k, v = _qkv(2, 8, 2, lq, lk)
    with no_sync():
        for _ in range(3):
            out = autotune.attention(q, k, v, causal=causal)
        autotune.scaled_dot_product_attention(
            q, k, v, is_causal=causal and lq == lk, enable_gqa=True
        )
    assert bool(torch.isfinite(out).all())


def test_a_growing_cache_does_not_sync() -> None:
    q, k, v = _qkv(1, 8, 2, 1, 1200)
    with no_sync():
        for length in range(1000, 1040):  # a decode step per length, as a cache grows
            out = autotune.attention(q, k[:, :, :length], v[:, :, :length], causal=True)
    assert bool(torch.isfinite(out).all())


def test_a_repeated_call_is_captured_in_a_cuda_graph() -> None:
    q, k, v = _qkv(1, 8, 2, 1, 2048)
    want = autotune.attention(q, k, v, causal=True)  # the decision, outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        autotune.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = autotune.attention(q, k, v, causal=True)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, want)


def test_native_transformers_decode_steps_do_not_sync() -> None:
    transformers = pytest.importorskip("transformers")
    name = autotune.register_transformers()
    config = transformers.LlamaConfig(
        hidden_size=1024,
        intermediate_size=2048,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=512,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    model.set_attn_implementation(name)
    cache = transformers.DynamicCache(config=config)
    ids = torch.randint(0, 512, (1, 300), device="cuda")
    with torch.no_grad():
        model(ids, past_key_values=cache, use_cache=True)
        token = ids[:, -1:]
        with no_sync():
            for _ in range(8):  # decode steps, then a verify step of 4 tokens
                model(token, past_key_values=cache, use_cache=True)
            model(ids[:, :4], past_key_values=cache, use_cache=True)
