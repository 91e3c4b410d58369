"""The native transformers attention on the GPU (issue 39, item 1): a small Llama-shaped model
(random weights, bf16, head dim 128, GQA 4) with "sdpa" and with the registered name. The
kernels run (untuned problems run their defaults here, not the no-regret choice of SDPA),
logits stay within bf16 noise of "sdpa"'s, greedy tokens over 64 steps are equal, and a
left-padded batch (transformers' SDPA path) answers as "sdpa" does."""

from __future__ import annotations

import pytest
import torch

import autotune

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kernels_on_untuned_problems")]
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model() -> object:
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
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()


def _logits(model: object, name: str, ids: torch.Tensor, **kwargs: object) -> torch.Tensor:
    model.set_attn_implementation(name)  # type: ignore[attr-defined]
    with torch.no_grad():
        return model(ids, **kwargs).logits.float()  # type: ignore[operator,no-any-return]


def test_prefill_logits_within_bf16_noise(model: object) -> None:
    name = autotune.register_transformers()
    ids = torch.randint(0, 512, (2, 777), device="cuda")
    want, got = _logits(model, "sdpa", ids), _logits(model, name, ids)
    assert bool(torch.isfinite(got).all())
    assert (got - want).abs().max().item() <= 0.05 * want.abs().max().item()


def test_greedy_tokens_equal_over_64_steps(model: object) -> None:
    name = autotune.register_transformers()
    ids = torch.randint(0, 512, (1, 301), device="cuda")
    settings = {"max_new_tokens": 64, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        model.set_attn_implementation("sdpa")  # type: ignore[attr-defined]
        want = model.generate(ids, **settings)  # type: ignore[attr-defined]
        model.set_attn_implementation(name)  # type: ignore[attr-defined]
        got = model.generate(ids, **settings)  # type: ignore[attr-defined]
    assert torch.equal(got, want)


def test_a_left_padded_batch_answers_as_sdpa(model: object) -> None:
    name = autotune.register_transformers()
    ids = torch.randint(1, 512, (2, 64), device="cuda")
    mask = torch.ones(2, 64, dtype=torch.long, device="cuda")
    mask[1, :17] = 0
    want = _logits(model, "sdpa", ids, attention_mask=mask)
    got = _logits(model, name, ids, attention_mask=mask)
    keep = mask.bool()
    assert torch.allclose(got[keep], want[keep], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("lq, lk", [(777, 777), (1, 300), (5, 300)])
def test_kernel_output_lands_in_the_projections_memory_order(lq: int, lk: int) -> None:
    """Called on transformers' [B, H, L, D] views of [B, L, H, D] memory, a kernel writes its
    output in that memory order: the [B, L, H, D] view returned is contiguous (no copy
    later) and matches the fp32 reference."""
    from autotune.measure.reference import reference_attention
    from autotune.runtime.transformers_attention import attention_forward, bottom_right_marker

    class Layer(torch.nn.Module):
        is_causal = True
        num_key_value_groups = 4

    query = torch.randn(2, lq, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    key, value = (
        torch.randn(2, 2, lk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)
    )
    mask = bottom_right_marker(query.device) if 1 < lq != lk else None
    assert autotune.explain(query, key, value, causal=lq > 1).kernel is not None
    out, _ = attention_forward(Layer(), query, key, value, mask, scaling=128**-0.5)
    assert out.shape == (2, lq, 8, 128) and out.is_contiguous()
    ref, _ = reference_attention(query, key, value, causal=lq > 1, scale=128**-0.5, layout="bhld")
    got = out.transpose(1, 2).float()
    assert float(torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)) < 1e-2
