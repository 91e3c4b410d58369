"""Stage 6, runtime: `attention()` for users. Dispatch from the store's best configs (or torch
SDPA where it is faster), the torch custom op, and the record of untuned problems. Imports
`model`, `build`, `launch`, `store` and SDPA from `measure`: never the tuner, the worker,
the timing code or Optuna."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # resolved lazily at run time (__getattr__), typed for checkers here
    from .attention import configure, dispatcher, explain
    from .dispatch import device_info, shipped_results
    from .kvcache import attention_with_kvcache, decode_choice, decode_kernel, default_splits
    from .sdpa_dropin import explain_sdpa, scaled_dot_product_attention, sdpa_dispatch, sdpa_route

# The names scripts and other callers may import from this stage; each is loaded on first
# use from its module, so importing one module of the stage does not load the others.
__all__ = [
    "attention_with_kvcache",
    "configure",
    "decode_choice",
    "decode_kernel",
    "default_splits",
    "device_info",
    "dispatcher",
    "explain",
    "explain_sdpa",
    "scaled_dot_product_attention",
    "sdpa_dispatch",
    "sdpa_route",
    "shipped_results",
]

# `attention` itself is `autotune.attention`: here the name is the submodule `runtime.attention`.

_LAZY: dict[str, tuple[str, str]] = {
    "configure": ("attention", "configure"),
    "explain": ("attention", "explain"),
    "dispatcher": ("attention", "dispatcher"),
    "device_info": ("dispatch", "device_info"),
    "attention_with_kvcache": ("kvcache", "attention_with_kvcache"),
    "decode_choice": ("kvcache", "decode_choice"),
    "decode_kernel": ("kvcache", "decode_kernel"),
    "default_splits": ("kvcache", "default_splits"),
    "explain_sdpa": ("sdpa_dropin", "explain_sdpa"),
    "scaled_dot_product_attention": ("sdpa_dropin", "scaled_dot_product_attention"),
    "sdpa_dispatch": ("sdpa_dropin", "sdpa_dispatch"),
    "sdpa_route": ("sdpa_dropin", "sdpa_route"),
    "shipped_results": ("dispatch", "shipped_results"),
}


__getattr__ = lazy_getattr(__name__, _LAZY)
