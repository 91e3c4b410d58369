"""cute-autotune as an attention implementation of Hugging Face transformers.

`register_transformers()` registers the name "cute_autotune" in transformers' attention and
attention-mask registries, so that `from_pretrained(..., attn_implementation="cute_autotune")`
or `model.set_attn_implementation("cute_autotune")` runs it. The implementation is transformers'
own SDPA integration, whose masks, GQA handling and causal cropping it keeps, with its
`F.scaled_dot_product_attention` call routed through `autotune.scaled_dot_product_attention`
(`sdpa_dispatch`): the tuned kernels where they compute the same thing, torch SDPA elsewhere.
transformers is not a dependency of cute-autotune; this module imports it when called.
"""

from __future__ import annotations

from typing import Any

from .sdpa_dropin import sdpa_dispatch

NAME = "cute_autotune"


def attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                      **kwargs: Any) -> tuple[Any, Any]:
    """transformers' attention-function signature: (attn_output [B, L, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with sdpa_dispatch():
        out: tuple[Any, Any] = sdpa_attention_forward(module, query, key, value,
                                                      attention_mask, **kwargs)
    return out


def register_transformers(name: str = NAME) -> str:
    """Register the implementation (and SDPA's mask builder under the same name) with
    transformers; returns the name to pass as attn_implementation."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
