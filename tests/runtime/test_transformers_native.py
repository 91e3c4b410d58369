"""The native transformers attention (issue 39, item 1): small Llama, Qwen2 and Mistral models
built from configs (no download), run on the CPU with "sdpa" and with the registered name.
Plain causal attention (a prefill, decode steps and a speculative verify step against the
growing cache) calls `autotune.attention` itself, on transformers' [B, H, L, D] views, with
no mask made; a padded batch, a sliding window shorter than the keys and dropout in training go to
transformers' SDPA path; every output equals "sdpa"'s, and greedy tokens too."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import autotune
import autotune.runtime.attention as attention_module
from autotune.runtime import transformers_attention as native

transformers = pytest.importorskip("transformers")

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=101,
        max_position_embeddings=128,
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=1,
        num_hidden_layers=2,
        vocab_size=101,
        max_position_embeddings=128,
    ),
    "mistral": lambda: transformers.MistralConfig(
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=101,
        max_position_embeddings=128,
        sliding_window=None,
    ),
}
MODELS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}


def _model(kind: str, **changes: Any) -> Any:
    config = CONFIGS[kind]()
    for name, value in changes.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    return getattr(transformers, MODELS[kind])(config).eval()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Each call that reaches `autotune.attention` (which then runs as usual: on the CPU,
    torch SDPA with the kernels' bottom-right alignment)."""
    seen: list[dict[str, Any]] = []
    real = attention_module.attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> Any:
        dim = 1 if kwargs.get("layout") == "blhd" else 2
        seen.append({"lq": q.shape[dim], "lk": k.shape[dim], "layout": "bhld", **kwargs})
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(attention_module, "attention", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # attention's fallback to SDPA on the CPU says so
        yield seen


def _steps(model: Any, implementation: str, ids: torch.Tensor) -> list[torch.Tensor]:
    """Logits of a prefill of all but 5 tokens, one decode step, then a verify step of 4."""
    model.set_attn_implementation(implementation)
    cache = transformers.DynamicCache(config=model.config)
    cut = ids.shape[1] - 5
    out = []
    with torch.no_grad():
        for piece in (ids[:, :cut], ids[:, cut : cut + 1], ids[:, cut + 1 :]):
            out.append(model(piece, past_key_values=cache, use_cache=True).logits)
    return out


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_plain_causal_steps_call_attention_and_match_sdpa(
    kind: str, calls: list[dict[str, Any]]
) -> None:
    name = autotune.register_transformers()
    model = _model(kind)
    ids = torch.randint(0, 101, (2, 21))
    want = _steps(model, "sdpa", ids)
    assert not calls
    got = _steps(model, name, ids)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5)
    layers = model.config.num_hidden_layers
    assert [(c["lq"], c["lk"], c["causal"], c["layout"]) for c in calls] == (
        [(16, 16, True, "bhld")] * layers
        + [(1, 17, False, "bhld")] * layers
        + [(4, 21, True, "bhld")] * layers
    )  # one query: no mask, nothing to align
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    assert all(c["scale"] == pytest.approx(head_dim**-0.5) for c in calls)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_greedy_tokens_equal_sdpa(kind: str, calls: list[dict[str, Any]]) -> None:
    name = autotune.register_transformers()
    model = _model(kind)
    ids = torch.randint(0, 101, (1, 9))
    settings = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        want = model.generate(ids, **settings)
        model.set_attn_implementation(name)
        got = model.generate(ids, **settings)
    assert torch.equal(got, want) and calls


def test_a_left_padded_batch_goes_to_transformers_sdpa(
    calls: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    name = autotune.register_transformers()
    model = _model("llama")
    ids = torch.randint(1, 101, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0  # the first sequence is 3 tokens shorter, padded on the left
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        want = model(ids, attention_mask=mask).logits
        model.set_attn_implementation(name)
        got = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    assert not calls
    assert "explicit attention mask" in caplog.text or native._logged


def test_a_sliding_window_shorter_than_the_keys_goes_to_transformers_sdpa(
    calls: list[dict[str, Any]],
) -> None:
    name = autotune.register_transformers()
    model = _model("mistral", sliding_window=8)
    for length, served in ((6, True), (14, False)):
        calls.clear()
        ids = torch.randint(0, 101, (1, length))
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            want = model(ids).logits
            model.set_attn_implementation(name)
            got = model(ids).logits
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        assert bool(calls) is served


def test_route_names_what_the_kernels_do_not_compute() -> None:
    module = torch.nn.Module()
    q, k = torch.zeros(1, 4, 3, 8), torch.zeros(1, 2, 9, 8)
    marker = native.bottom_right_marker("cpu")
    assert native._route(module, q, k, marker, {}) == (True, "")
    assert native._route(module, q, k, None, {})[0] is None  # top-left with Lq != Lk
    assert native._route(module, q[:, :, :1], k, None, {}) == (False, "")
    assert native._route(module, q, k[:, :, :3], None, {"is_causal": False}) == (False, "")
    for kwargs, word in (
        ({"softcap": 30.0}, "softcap"),
        ({"s_aux": torch.zeros(4)}, "s_aux"),
        ({"sliding_window": 4}, "sliding_window"),
    ):
        causal, reason = native._route(module, q, k, marker, kwargs)
        assert causal is None and word in reason
    assert native._route(module, q, k, marker, {"sliding_window": 9}) == (True, "")
    module.train()
    assert native._route(module, q, k, marker, {"dropout": 0.1})[0] is None
    module.eval()
    assert native._route(module, q, k, marker, {"dropout": 0.1}) == (True, "")
    mask = torch.ones(1, 1, 3, 9, dtype=torch.bool)
    assert "explicit attention mask" in native._route(module, q, k, mask, {})[1]


def test_the_marker_becomes_a_bottom_right_mask_where_sdpa_runs() -> None:
    """A plain causal verify step of a layer with an unserved kwarg reaches transformers' SDPA
    with the bottom-right mask the marker stands for (the window itself is the mask
    function's business in transformers: its SDPA path ignores the kwarg)."""
    module = torch.nn.Module()
    module.is_causal = True
    module.num_key_value_groups = 2
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    out, _ = native.attention_forward(
        module, q, k, v, native.bottom_right_marker("cpu"), sliding_window=2
    )
    want = torch.nn.functional.scaled_dot_product_attention(
        q,
        k.repeat_interleave(2, 1),
        v.repeat_interleave(2, 1),
        attn_mask=torch.ones(3, 9, dtype=torch.bool).tril(diagonal=6),
    ).transpose(1, 2)
    torch.testing.assert_close(out, want)


def test_a_compiled_verify_step_matches_sdpa(calls: list[dict[str, Any]]) -> None:
    """Under torch.compile the verify step's mask is transformers' own (a traced graph would
    drop the marker's tag): the logits still equal "sdpa"'s."""
    name = autotune.register_transformers()
    model = _model("llama")
    ids = torch.randint(0, 101, (1, 14))
    compiled = torch.compile(model, dynamic=False)
    got, want = [], []
    for implementation, into in ((name, got), ("sdpa", want)):
        model.set_attn_implementation(implementation)
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model(ids[:, :10], past_key_values=cache, use_cache=True)
            into.append(compiled(ids[:, 10:], past_key_values=cache, use_cache=True).logits)
    torch.testing.assert_close(got[0], want[0], atol=2e-5, rtol=2e-5)
