"""A causal call with 1 < Lq != Lk that dispatch hands to torch SDPA runs the aten op torch's
lower-right bias would pick, resolved once per geometry (the bias picks it in Python code on
every call, which costs the host more than a small call costs the GPU), and goes back to torch's
own choice when the caller has changed torch's SDPA switches since. The GPU side (the same
kernel, the same bits) is tests/gpu/test_lower_right_direct_gpu.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import autotune.measure.sdpa as sdpa_module
from autotune.model.problem import Problem
from autotune.runtime.attention import _SdpaRun


def _inputs(problem: Problem, layout: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(
        problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim, generator=gen
    )
    k, v = (
        torch.randn(
            problem.batch, problem.heads_kv, problem.seqlen_k, problem.head_dim, generator=gen
        )
        for _ in range(2)
    )
    return (q, k, v) if layout == "bhld" else tuple(t.transpose(1, 2) for t in (q, k, v))


PROBLEM = Problem(2, 4, 2, 5, 23, 64, "fp16", True)


def test_cpu_inputs_take_no_direct_op() -> None:
    q, k, v = _inputs(PROBLEM, "bhld")
    assert sdpa_module.lower_right_call("default", q, k, v, scale=None, enable_gqa=True) is None


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
def test_direct_op_runs_while_the_switches_hold(
    monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    seen: list[tuple[int, ...]] = []

    def direct(q: Any, k: Any, v: Any) -> Any:  # stands for the aten op (a CUDA one)
        seen.append(tuple(q.shape))
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]), enable_gqa=True
        )

    def resolve(backend: str, q: Any, k: Any, v: Any, *, scale: Any, enable_gqa: bool) -> Any:
        assert q.shape[1:3] == (PROBLEM.heads_q, PROBLEM.seqlen_q)  # resolved on [B, H, L, D]
        assert enable_gqa is True
        return direct, sdpa_module.sdpa_switches()

    monkeypatch.setattr(sdpa_module, "lower_right_call", resolve)
    q, k, v = _inputs(PROBLEM, layout)
    run = _SdpaRun("default", PROBLEM, True, None, layout, 0, (q, k, v))
    expected = sdpa_module.sdpa_call("default", q, k, v, causal=True, layout=layout)()
    if layout == "blhd":
        expected = expected.transpose(1, 2)
    out = run(q, k, v, False)
    assert seen == [(2, 4, 5, 64)]
    torch.testing.assert_close(out, expected, rtol=0, atol=0)

    flash = torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(not flash)  # the caller changes torch's switches
    try:
        again = run(q, k, v, False)
    finally:
        torch.backends.cuda.enable_flash_sdp(flash)
    assert len(seen) == 1  # torch's own path, not the op picked under other switches
    torch.testing.assert_close(again, expected, rtol=0, atol=1e-5)  # another CPU kernel
    run(q, k, v, False)
    assert len(seen) == 2


@pytest.mark.parametrize("lq, lk, causal", [(1, 40, True), (16, 16, True), (5, 23, False)])
def test_other_calls_never_resolve_a_direct_op(
    monkeypatch: pytest.MonkeyPatch, lq: int, lk: int, causal: bool
) -> None:
    def resolve(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("only causal 1 < Lq != Lk calls carry the lower-right bias")

    monkeypatch.setattr(sdpa_module, "lower_right_call", resolve)
    problem = Problem(1, 4, 4, lq, lk, 64, "fp16", causal)
    q, k, v = _inputs(problem, "bhld")
    run = _SdpaRun("default", problem, causal, None, "bhld", 0, (q, k, v))
    expected = sdpa_module.sdpa_call("default", q, k, v, causal=causal)()
    torch.testing.assert_close(run(q, k, v, False), expected, rtol=0, atol=0)


def test_a_growing_cache_resolves_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice reads no length: a cache one key longer asks torch's checks nothing again,
    another head count or dtype does."""
    import torch.backends.cuda as cuda_backends

    asked: list[int] = []

    def counting(params: Any, debug: bool = False) -> bool:
        asked.append(1)
        return False

    monkeypatch.setattr(cuda_backends, "can_use_flash_attention", counting)
    monkeypatch.setattr(cuda_backends, "can_use_efficient_attention", counting)
    sdpa_module._RESOLVED.clear()
    q = torch.randn(2, 8, 4, 64)
    for length in (100, 101, 102, 640):
        k = torch.randn(2, 2, length, 64)
        assert (
            sdpa_module.lower_right_call("default", q, k, k, scale=None, enable_gqa=True) is None
        )
    assert len(asked) == 2  # flash, then efficient, once
    sdpa_module.lower_right_call(
        "default",
        q,
        torch.randn(2, 4, 100, 64),
        torch.randn(2, 4, 100, 64),
        scale=None,
        enable_gqa=True,
    )
    sdpa_module.lower_right_call(
        "default", q.half(), k.half(), k.half(), scale=None, enable_gqa=True
    )
    assert len(asked) == 6
