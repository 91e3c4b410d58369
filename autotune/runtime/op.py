"""torch.ops.cute_autotune.attention: the custom op behind `autotune.attention` under
torch.compile, with a fake implementation that gives output shapes without running anything.

(No `from __future__ import annotations` here: torch.library reads the annotations at runtime.)
"""

import torch

from ..launch.tensors import logical_bhld


@torch.library.custom_op("cute_autotune::attention", mutates_args=())
def attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float | None,
    return_lse: bool,
    layout: str,
    strict: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    from .attention import _eager

    if return_lse:
        out, lse = _eager(
            q, k, v, causal=causal, scale=scale, return_lse=True, layout=layout, strict=strict
        )
        return out, lse
    out = _eager(
        q, k, v, causal=causal, scale=scale, return_lse=False, layout=layout, strict=strict
    )
    return out, q.new_empty(0, dtype=torch.float32)


@attention_op.register_fake
def _(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float | None,
    return_lse: bool,
    layout: str,
    strict: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    qb = logical_bhld(q, layout)
    lse_shape = (qb.shape[0], qb.shape[1], qb.shape[2]) if return_lse else (0,)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op(
    "cute_autotune::attention_with_kvcache", mutates_args=("k_cache", "v_cache")
)
def attention_with_kvcache_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    block_table: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    return_lse: bool,
    layout: str,
    num_splits: int | None,
    config: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.ops.cute_autotune.attention_with_kvcache: `autotune.attention_with_kvcache` under
    torch.compile (the config travels as its JSON). The caches are written when k_new is given."""
    from ..model.config import Config
    from .kvcache import _eager_with_kvcache

    out, lse = _eager_with_kvcache(
        q,
        k_cache,
        v_cache,
        k_new=k_new,
        v_new=v_new,
        cache_seqlens=cache_seqlens,
        block_table=block_table,
        causal=causal,
        scale=scale,
        return_lse=return_lse,
        layout=layout,
        num_splits=num_splits,
        config=None if config is None else Config.from_json(config),
    )
    return out, lse if lse is not None else q.new_empty(0, dtype=torch.float32)


@attention_with_kvcache_op.register_fake
def _(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    block_table: torch.Tensor | None,
    causal: bool,
    scale: float | None,
    return_lse: bool,
    layout: str,
    num_splits: int | None,
    config: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    qb = logical_bhld(q, layout)
    lse_shape = (qb.shape[0], qb.shape[1], qb.shape[2]) if return_lse else (0,)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)
