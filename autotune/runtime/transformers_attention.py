"""cute-autotune as an attention implementation of Hugging Face transformers.

`register_transformers()` registers the name "cute_autotune" in transformers' attention and
attention-mask registries, so that `from_pretrained(..., attn_implementation="cute_autotune")`
or `model.set_attn_implementation("cute_autotune")` runs it. transformers is not a dependency
of cute-autotune; this module imports it when called.

The attention function calls `autotune.attention` itself (no SDPA in between) wherever the
attention is what the kernels compute: plain causal attention aligned bottom-right (a prefill,
a decode step or a speculative verify step against transformers' growing cache) or full
attention, with the module's scaling. Queries arrive as [B, H, L, D] views of [B, L, H, D]
memory and the output is wanted as [B, L, H, D]: the call is made on those views, and a
kernel's output is allocated in q's memory order, so the kernel writes it where transformers
wants it, with no transposing copy.

The mask function answers without materialising a mask, and without reading a device value,
where the attention is plain: no padding mask, no sliding window or other pattern, and a cache
whose queries are its last tokens (`kv_length == q_offset + q_length` with Python integers:
transformers' dynamic cache). There it returns None when the alignment does not matter (one
query, or as many queries as keys), and otherwise, in eager mode, a marker (an empty tensor
tagged as bottom-right causal) that only this attention function reads (a traced graph would
drop the tag: under torch.compile that step gets transformers' mask). Everywhere else it is
transformers' SDPA mask function, and the attention function hands what the kernels do not
compute to transformers' own SDPA path, the reason logged once: an explicit mask (padding, a
static cache, a sliding window pattern), causal attention aligned top-left with Lq != Lk,
dropout in training, and the kwargs `sliding_window`, `softcap` and `s_aux` (attention sinks).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

NAME = "cute_autotune"
_BOTTOM_RIGHT = "_cute_autotune_bottom_right"  # the marker's tag
_log = logging.getLogger(__name__)
_logged: set[str] = set()
_markers: dict[Any, Any] = {}  # device -> the bottom-right causal marker (one per device)
# Features of transformers' attention kwargs the kernels do not compute yet, by name.
_UNSERVED = ("sliding_window", "softcap", "s_aux")


def bottom_right_marker(device: Any) -> torch.Tensor:
    """The empty bool tensor on `device` that stands for causal attention aligned bottom-right
    (made once per device; never read)."""
    marker = _markers.get(device)
    if marker is None:
        import torch

        marker = torch.empty(0, dtype=torch.bool, device=device)
        setattr(marker, _BOTTOM_RIGHT, True)
        _markers[device] = marker
    return marker


def is_bottom_right(mask: Any) -> bool:
    return getattr(mask, _BOTTOM_RIGHT, False) is True


def _plain_causal(kwargs: dict[str, Any]) -> bool:
    """Whether transformers asks for causal attention of the last `q_length` of `kv_length`
    keys and nothing else, read from Python values only."""
    from transformers.masking_utils import causal_mask_function

    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    q_offset, kv_offset = kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)
    return (
        kwargs.get("mask_function") is causal_mask_function
        and kwargs.get("attention_mask") is None
        and kwargs.get("local_size") is None
        and all(type(x) is int for x in (q_length, kv_length, q_offset, kv_offset))
        and kv_offset == 0
        and kv_length == q_offset + q_length
    )


def mask_function(*args: Any, **kwargs: Any) -> Any:
    """transformers' mask-interface signature: None or the marker where the attention is plain
    causal (see the module's docstring), transformers' SDPA mask otherwise."""
    from transformers.masking_utils import sdpa_mask

    if not args and _plain_causal(kwargs):
        q_length, kv_length = kwargs["q_length"], kwargs["kv_length"]
        if q_length == 1 or q_length == kv_length:
            return None  # transformers' own reading of None agrees with bottom-right here
        import torch

        # A traced graph keeps a tensor, not the tag set on it: compiled, the mask is made.
        if not torch.compiler.is_compiling():
            return bottom_right_marker(kwargs.get("device", "cpu"))
    return sdpa_mask(*args, **kwargs)


def _route(
    module: Any, query: Any, key: Any, attention_mask: Any, kwargs: dict[str, Any]
) -> tuple[bool | None, str]:
    """(causal, "") for a call `attention` computes, (None, why not) for one it does not."""
    for name in _UNSERVED:
        value = kwargs.get(name)
        if value is None:
            continue
        if name == "sliding_window" and isinstance(value, int) and value >= key.shape[2]:
            continue  # a window no shorter than the keys: every query sees them all anyway
        return None, f"{name} (not served by the kernels yet)"
    dropout = kwargs.get("dropout", 0.0)
    if dropout and getattr(module, "training", False):
        return None, "dropout in training (the kernels have none)"
    if is_bottom_right(attention_mask):
        return True, ""
    if attention_mask is not None:
        return None, (
            "an explicit attention mask (padding, a static cache or a pattern); "
            "the kernels take none yet"
        )
    # No mask: transformers' SDPA reading, torch's is_causal (aligned top-left) when Lq > 1.
    lq, lk = query.shape[2], key.shape[2]
    flag = kwargs.get("is_causal")
    causal = lq > 1 and bool(getattr(module, "is_causal", True) if flag is None else flag)
    if causal and lq != lk:
        return None, (
            "causal attention aligned top-left with Lq != Lk (the kernels' is bottom-right)"
        )
    return causal, ""


def attention_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function signature: query [B, Hq, Lq, D], key and value
    [B, Hkv, Lk, D]; returns (attn_output [B, Lq, Hq, D], None)."""
    causal, reason = _route(module, query, key, attention_mask, kwargs)
    if causal is None:
        return _transformers_sdpa(module, query, key, value, attention_mask, reason, kwargs)
    # transformers' [B, H, L, D] views as they are: a kernel's output takes q's memory order
    # ([B, L, H, D], the projections'), torch SDPA's takes its own, and the [B, L, H, D] view
    # of either is what transformers returns; no transposes there and back on the host.
    out = _attention()(query, key, value, causal=causal, scale=kwargs.get("scaling"))
    return out.transpose(1, 2), None


def _attention() -> Any:
    from .attention import attention

    return attention


def _transformers_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    reason: str,
    kwargs: dict[str, Any],
) -> tuple[Any, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if reason not in _logged:
        _logged.add(reason)
        _log.warning("cute-autotune: transformers' SDPA path runs attention with %s", reason)
    if is_bottom_right(attention_mask):  # only with an unserved kwarg: a mask SDPA can read
        import torch

        lq, lk = query.shape[2], key.shape[2]
        attention_mask = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril(
            diagonal=lk - lq
        )
    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return out, weights


def register_transformers(name: str = NAME) -> str:
    """Register the attention function and its mask function with transformers; returns the
    name to pass as attn_implementation."""
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_function)
    return name
