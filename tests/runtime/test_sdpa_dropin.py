"""`autotune.scaled_dot_product_attention`, torch's signature and semantics: which path a call
takes (the tuned `attention`, or torch's own function) and why, torch's answers over a generated
matrix of arguments, and `sdpa_dispatch()` routing a model's own SDPA calls without recursing
(CPU: the tuned path is stood in for by a recorder; tests/gpu runs the kernels)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import autotune
from autotune.runtime import sdpa_dropin
from autotune.runtime.sdpa_dropin import TORCH, sdpa_route


def qkv(
    lq: int = 8,
    lk: int = 8,
    hq: int = 4,
    hkv: int = 4,
    d: int = 64,
    *,
    dtype: torch.dtype = torch.float32,
    grad: bool = False,
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(lq * 131 + lk * 7 + hq + hkv)
    q = torch.randn(2, hq, lq, d, generator=gen, dtype=dtype)
    k = torch.randn(2, hkv, lk, d, generator=gen, dtype=dtype)
    v = torch.randn(2, hkv, lk, d, generator=gen, dtype=dtype)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


@pytest.fixture
def tuned_path(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Calls that reach the tuned path, answered by torch with the kernels' bottom-right
    causal alignment (what `attention` computes) so that a wrongly routed call shows."""
    calls: list[dict[str, Any]] = []

    def fake_tuned(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        scale: float | None,
        unsupported: Any,
    ) -> torch.Tensor:
        calls.append({"causal": causal, "scale": scale})
        mask = None
        if causal:
            lq, lk = q.shape[2], k.shape[2]
            mask = torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)
        group = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    monkeypatch.setattr(sdpa_dropin, "_tuned", fake_tuned)
    return calls


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"attn_mask": torch.ones(8, 8, dtype=torch.bool)}, "attention mask"),
        ({"dropout_p": 0.1}, "dropout_p=0.1"),
        ({"is_causal": 1}, "is not a bool"),
        ({"scale": float("nan")}, "finite scale"),
        ({"scale": -1.0}, "finite scale"),
        ({"scale": True}, "finite scale"),
    ],
)
def test_what_the_kernels_do_not_compute_goes_to_torch(
    kwargs: dict[str, Any], reason: str
) -> None:
    route = sdpa_route(*qkv(), **kwargs)
    assert not route.tuned and reason in route.reason


def test_torch_rules_route_to_torch() -> None:
    assert "without enable_gqa" in sdpa_route(*qkv(hq=8, hkv=2)).reason
    assert "without enable_gqa" in sdpa_route(*qkv(hq=8, hkv=3), enable_gqa=True).reason
    assert "top-left" in sdpa_route(*qkv(lq=4, lk=8), is_causal=True).reason
    # inputs that require grad: read_inputs decides (a backward config serves the problem or
    # torch runs it: tests/runtime/test_training.py); on the CPU torch runs it
    assert not sdpa_route(*qkv(grad=True)).tuned
    q, k, v = qkv()
    assert "4-D" in sdpa_route(q[0], k[0], v[0]).reason
    assert "not all tensors" in sdpa_route(q.tolist(), k, v).reason
    assert "on cpu" in sdpa_route(q, k, v).reason  # read_inputs: the kernels run on CUDA
    assert isinstance(autotune.explain_sdpa(q, k, v, dropout_p=0.5).reason, str)
    assert autotune.explain_sdpa(q, k, v, dropout_p=0.5).path == TORCH


# torch refuses a mask together with is_causal: those combinations are left out.
ARGUMENTS = [
    a
    for a in itertools.product(
        [(8, 8), (5, 9), (9, 5)],  # (Lq, Lk)
        [(4, 4), (8, 2), (8, 1)],  # (Hq, Hkv)
        [False, True],  # is_causal
        [None, 0.3],  # scale
        [False, True],  # enable_gqa
        [None, "bool", "float"],  # attn_mask
    )
    if not (a[2] and a[5])
]


@pytest.mark.parametrize("lengths, heads, is_causal, scale, enable_gqa, mask", ARGUMENTS)
def test_every_argument_combination_answers_as_torch(
    tuned_path: list[dict[str, Any]],
    lengths: tuple[int, int],
    heads: tuple[int, int],
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    mask: str | None,
) -> None:
    q, k, v = qkv(*lengths, *heads)
    attn_mask = None
    if mask is not None:
        attn_mask = torch.rand(lengths) > 0.3 if mask == "bool" else torch.randn(lengths)
    kwargs = dict(attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    try:
        want = F.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
    except RuntimeError as exc:  # torch refuses it: so must the drop-in, with torch's error
        with pytest.raises(RuntimeError, match=re_escape(str(exc).splitlines()[0])):
            autotune.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
        assert not tuned_path
        return
    got = autotune.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    tuned = (
        attn_mask is None
        and (not is_causal or lengths[0] == lengths[1])
        and (heads[0] == heads[1] or enable_gqa)
    )
    assert bool(tuned_path) == tuned
    if tuned:
        assert tuned_path[0] == {"causal": is_causal, "scale": scale}


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


class TinyAttention(torch.nn.Module):
    """A model's attention as models write it: the function imported by name."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        return sdpa(q, k, v, is_causal=True) + F.scaled_dot_product_attention(q, k, v)


def test_sdpa_dispatch_routes_a_models_calls_and_never_recurses(
    tuned_path: list[dict[str, Any]],
) -> None:
    model = TinyAttention()
    q, k, v = qkv()
    want = model(q, k, v)
    assert not tuned_path
    with autotune.sdpa_dispatch():
        got = model(q, k, v)
        # a call the drop-in hands to torch runs torch's function, not the drop-in again
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8) * 0.5)
    assert len(tuned_path) == 2 and [c["causal"] for c in tuned_path] == [True, False]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(
        masked, F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8) * 0.5)
    )
    tuned_path.clear()
    model(q, k, v)  # outside the block: torch's own
    assert not tuned_path


def test_scale_default_is_torchs(tuned_path: list[dict[str, Any]]) -> None:
    q, k, v = qkv(d=32)
    got = autotune.scaled_dot_product_attention(q, k, v)
    want = F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(32))
    torch.testing.assert_close(got, want)


def test_a_transformers_model_runs_through_the_drop_in(tuned_path: list[dict[str, Any]]) -> None:
    """A small decoder built from a config (no download), run with transformers' "sdpa"
    inside `sdpa_dispatch()`: its output unchanged, its attention sent through the drop-in."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=101,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    ids = torch.randint(0, 101, (2, 16))
    with torch.no_grad():
        want = model(ids).logits
        assert not tuned_path
        with autotune.sdpa_dispatch():
            got = model(ids).logits
    assert len(tuned_path) == 2 and all(c["causal"] for c in tuned_path)  # one per layer
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_inputs_no_kernel_runs_go_to_torch_silently() -> None:
    """The real dispatch (no stand-in): CPU tensors reach `attention`'s dispatch, which hands
    them to torch's own function with the caller's arguments, without a fallback warning."""
    import warnings

    q, k, v = qkv(lq=6, lk=6, hq=4, hkv=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = autotune.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, want)
