"""torch's scaled_dot_product_attention as the baseline, per backend, on our problem contract.

Every stored result carries its speed-up over SDPA measured on the same inputs in the same run:
the default choice (cuDNN's Hopper kernel on an H200) and each backend that accepts the problem
(FLASH = FlashAttention-2's sm80 path, EFFICIENT, CUDNN). Causal is bottom-right aligned as in
our kernels: `is_causal=True` when Lq == Lk, else torch's lower-right causal bias.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .tensors import logical_bhld

if TYPE_CHECKING:
    import torch

BACKENDS = ("default", "flash", "efficient", "cudnn")


def _backend_enum(name: str) -> Any:
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}[name]


def sdpa_call(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
              scale: float | None = None, layout: str = "bhld") -> Callable[[], torch.Tensor]:
    """A closure computing attention with one SDPA backend (output in [B, H, L, D])."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    qb, kb, vb = (logical_bhld(t, layout) for t in (q, k, v))
    lq, lk = qb.shape[2], kb.shape[2]
    kwargs: dict[str, Any] = {"scale": scale}
    if qb.shape[1] != kb.shape[1]:
        kwargs["enable_gqa"] = True
    if causal and lq == lk:
        kwargs["is_causal"] = True
    elif causal:
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(lq, lk)

    if backend == "default":
        return lambda: F.scaled_dot_product_attention(qb, kb, vb, **kwargs)
    chosen = _backend_enum(backend)

    def call() -> torch.Tensor:
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(qb, kb, vb, **kwargs)

    return call


def accepted_backends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                      scale: float | None = None, layout: str = "bhld"
                      ) -> dict[str, Callable[[], torch.Tensor]]:
    """The backends that run this problem (tried once; a backend that refuses is left out)."""
    accepted = {}
    for name in BACKENDS:
        call = sdpa_call(name, q, k, v, causal=causal, scale=scale, layout=layout)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a refusing backend explains itself at length
            try:
                call()
            except RuntimeError:
                continue
        accepted[name] = call
    return accepted
