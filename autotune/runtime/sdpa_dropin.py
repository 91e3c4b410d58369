"""`scaled_dot_product_attention`: torch's function, signature and semantics, on the tuned kernels
where they compute exactly what torch would, and torch's own function everywhere else.

The tuned path (`attention`, which itself may choose torch SDPA where that is measured faster)
takes a call with no mask, no dropout, no autograd, 4-D [B, H, L, D] tensors of one head dim
that the kernels hold, and causal masking only where torch's top-left alignment and the kernels'
bottom-right one agree (Lq == Lk). Anything else goes to `torch.nn.functional.
scaled_dot_product_attention` unchanged, errors included; `explain_sdpa` says which and why.

`sdpa_dispatch()` routes every `F.scaled_dot_product_attention` call made inside it through
this function, however the caller imported it: a `TorchFunctionMode`, not a patched attribute.
torch disables a mode inside its own handler, so the fallback calls torch's function without
coming back here.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._shown import shown
from ..launch.tensors import InputError
from .attention import _eager, attention, explain, read_inputs, valid_scale
from .dispatch import Decision

if TYPE_CHECKING:
    import torch

TORCH = "torch"  # Decision.path of a call the drop-in hands to torch's own function


@dataclass(frozen=True)
class Route:
    """Whether a call runs through `attention` (the tuned path), and if not, why."""

    tuned: bool
    reason: str


def _torch_rule(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: Any,
    is_causal: Any,
    scale: Any,
    enable_gqa: Any,
) -> str | None:
    """Why these arguments are not what the kernels compute (torch's semantics), or None.
    Cheap: what `read_inputs` adds (device, dtype, head dim, alignment) is left to the call's
    own dispatch, whose memo answers it without a check on a repeated shape."""
    import torch

    if not all(isinstance(t, torch.Tensor) for t in (query, key, value)):
        return "query, key and value are not all tensors"
    if attn_mask is not None:
        return "an attention mask (the kernels take none)"
    if not isinstance(dropout_p, numbers.Real) or dropout_p != 0:
        return f"dropout_p={shown(dropout_p)} (the kernels have no dropout)"
    if is_causal is not True and is_causal is not False:
        return f"is_causal={shown(is_causal)} is not a bool"
    if scale is not None and not valid_scale(scale):
        return f"scale={shown(scale)} (the kernels take a finite scale > 0)"
    if any(t.dim() != 4 for t in (query, key, value)):
        return "inputs are not 4-D [B, H, L, D]"
    if (
        key.shape != value.shape
        or query.shape[0] != key.shape[0]
        or query.shape[3] != key.shape[3]
    ):
        return "query, key and value do not share the batch and head dim"
    heads_q, heads_kv = query.shape[1], key.shape[1]
    if heads_q != heads_kv and (enable_gqa is not True or heads_kv == 0 or heads_q % heads_kv):
        return (
            f"{heads_q} query heads against {heads_kv} key/value heads without "
            "enable_gqa=True (torch's rule)"
        )
    if is_causal and query.shape[2] != key.shape[2]:
        return "causal with Lq != Lk: torch aligns the mask top-left, the kernels bottom-right"
    return None


def sdpa_route(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: Any = 0.0,
    is_causal: Any = False,
    scale: Any = None,
    enable_gqa: Any = False,
) -> Route:
    """Where `scaled_dot_product_attention` sends these arguments (nothing runs)."""
    reason = _torch_rule(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if reason is not None:
        return Route(False, reason)
    try:
        _, reason = read_inputs(query, key, value, causal=is_causal, layout="bhld")
    except InputError as exc:
        return Route(False, str(exc))
    return Route(reason is None, reason or "")


def _tuned(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    unsupported: Callable[[str], torch.Tensor],
) -> torch.Tensor:
    """`attention`'s dispatch (its memo included); inputs no kernel runs go to `unsupported`,
    silently (a drop-in neither warns nor raises in strict mode)."""
    import torch

    if torch.compiler.is_compiling():
        out: torch.Tensor = attention(query, key, value, causal=causal, scale=scale)
        return out
    result: torch.Tensor = _eager(
        query,
        key,
        value,
        causal=causal,
        scale=scale,
        return_lse=False,
        layout="bhld",
        strict=False,
        unsupported=unsupported,
    )
    return result


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention, dispatched to the tuned kernels where
    they compute the same thing (see the module's docstring)."""
    import torch.nn.functional as F

    def torchs(_reason: str = "") -> torch.Tensor:
        return F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )

    if (
        _torch_rule(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        is not None
    ):
        return torchs()
    return _tuned(query, key, value, causal=is_causal, scale=scale, unsupported=torchs)


def explain_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Decision:
    """What `scaled_dot_product_attention` would run for these arguments, and why: torch's own
    function (path "torch"), or `attention`'s decision."""
    route = sdpa_route(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if not route.tuned:
        return Decision(TORCH, route.reason)
    return explain(query, key, value, causal=is_causal)


def _sdpa_mode() -> Any:
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class SdpaMode(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if func is F.scaled_dot_product_attention:
                return scaled_dot_product_attention(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))

    return SdpaMode()


@contextmanager
def sdpa_dispatch() -> Iterator[None]:
    """Inside the block, every `torch.nn.functional.scaled_dot_product_attention` call (a
    model's included) runs `scaled_dot_product_attention`."""
    with _sdpa_mode():
        yield
