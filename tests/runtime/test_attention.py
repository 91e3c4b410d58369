"""`autotune.attention` on the CPU: input errors, the fallback and strict modes, `explain`, and
the custom op's fake implementation under torch.compile on meta tensors."""

from __future__ import annotations

import warnings

import pytest
import torch

from autotune.launch.tensors import InputError
from autotune.measure.reference import reference_attention
from autotune.runtime import attention as attention_module
from autotune.runtime.attention import Unsupported, attention, explain, read_inputs


def qkv(
    b: int = 2,
    hq: int = 4,
    hkv: int = 2,
    lq: int = 16,
    lk: int = 20,
    d: int = 64,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
):  # type: ignore[no-untyped-def]
    make = lambda h, length: torch.randn(b, h, length, d, dtype=dtype, device=device)  # noqa: E731
    return make(hq, lq), make(hkv, lk), make(hkv, lk)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda q, k, v: (q[0], k, v), "q must be 4-D"),
        (lambda q, k, v: (q, k[:, :, :5], v), "k and v must have the same shape"),
        (lambda q, k, v: (q, k[:1], v[:1]), "batch and head dim must match"),
        (lambda q, k, v: (q[:, :3], k, v), "multiple of key/value heads"),
        (lambda q, k, v: (q, k.double(), v), "share a dtype"),
        (lambda q, k, v: (q, k, v[..., :0]), "same shape"),
    ],
)
def test_misuse_raises_clear_errors(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    q, k, v = mutate(*qkv())
    with pytest.raises(InputError, match=message):
        attention(q, k, v)


def test_unknown_layout_is_an_error() -> None:
    with pytest.raises(InputError, match="layout must be one of"):
        attention(*qkv(), layout="lbhd")


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({}, "tensors are on cpu"),
        ({"device": "meta", "dtype": torch.float32}, "tensors are on meta"),
    ],
)
def test_what_the_kernels_cannot_run_is_named(kwargs: dict[str, object], reason: str) -> None:
    problem, why = read_inputs(*qkv(**kwargs), causal=False, layout="bhld")  # type: ignore[arg-type]
    assert why is not None and reason in why


def test_fallback_warns_once_per_reason_and_matches_the_reference() -> None:
    attention_module._warned.clear()
    q, k, v = qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out1 = attention(q, k, v, causal=True)
        out2, lse = attention(q, k, v, causal=True, return_lse=True)
    messages = [str(w.message) for w in caught if "cute-autotune" in str(w.message)]
    assert len(messages) == 1 and "falling back to torch SDPA" in messages[0]
    ref, ref_lse = reference_attention(q, k, v, causal=True, scale=64**-0.5)
    torch.testing.assert_close(out1, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out2, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse)


def test_fallback_keeps_the_blhd_layout() -> None:
    q, k, v = (t.transpose(1, 2).contiguous() for t in qkv())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = attention(q, k, v, causal=True, layout="blhd")
    assert out.shape == q.shape
    ref, _ = reference_attention(q, k, v, causal=True, scale=64**-0.5, layout="blhd")
    torch.testing.assert_close(out.transpose(1, 2), ref, atol=1e-5, rtol=1e-5)


def test_strict_mode_raises_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Unsupported, match="tensors are on cpu"):
        attention(*qkv(), strict=True)
    monkeypatch.setenv("CUTE_AUTOTUNE_STRICT", "1")
    with pytest.raises(Unsupported):
        attention(*qkv())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attention(*qkv(), strict=False)  # an explicit argument beats the environment


def test_requires_grad_never_builds_a_silent_wrong_graph() -> None:
    q, k, v = qkv()
    q.requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = attention(q, k, v)
    out.sum().backward()  # the fallback is SDPA, whose graph is right
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_explain_says_what_would_run() -> None:
    decision = explain(*qkv())
    assert decision.path == "fallback" and "cpu" in decision.reason
    assert decision.describe().startswith("fallback to torch SDPA")


def test_custom_op_fake_traces_under_torch_compile_on_meta_tensors() -> None:
    q, k, v = qkv(dtype=torch.float16, device="meta", lq=33, lk=65)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):  # type: ignore[no-untyped-def]
        out, lse = attention(q, k, v, causal=True, return_lse=True)
        return out * 2, lse

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, v)
    assert out.shape == q.shape and out.device.type == "meta" and out.dtype == torch.float16
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32
    blhd = torch.compile(
        lambda q, k, v: attention(q, k, v, layout="blhd"), fullgraph=True, backend="aot_eager"
    )
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
    assert blhd(qb, kb, vb).shape == qb.shape


def test_custom_op_schema_is_registered() -> None:
    op = torch.ops.cute_autotune.attention.default
    assert "bool causal" in str(op._schema) and "str layout" in str(op._schema)
