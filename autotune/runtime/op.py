"""torch.ops.cute_autotune.attention: the custom op behind `autotune.attention` under
torch.compile, with a fake implementation that gives output shapes without running anything.

(No `from __future__ import annotations` here: torch.library reads the annotations at runtime.)
"""

import torch

from ..launch.tensors import logical_bhld


@torch.library.custom_op("cute_autotune::attention", mutates_args=())
def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                 scale: float | None, return_lse: bool, layout: str,
                 strict: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from .attention import _eager

    if return_lse:
        out, lse = _eager(q, k, v, causal=causal, scale=scale, return_lse=True, layout=layout,
                          strict=strict)
        return out, lse
    out = _eager(q, k, v, causal=causal, scale=scale, return_lse=False, layout=layout,
                 strict=strict)
    return out, q.new_empty(0, dtype=torch.float32)


@attention_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
      return_lse: bool, layout: str, strict: bool) -> tuple[torch.Tensor, torch.Tensor]:
    qb = logical_bhld(q, layout)
    lse_shape = (qb.shape[0], qb.shape[1], qb.shape[2]) if return_lse else (0,)
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)
