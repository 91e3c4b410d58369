"""The fp32 reference every kernel is validated against (TF32 off, explicit softmax)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..launch.tensors import logical_bhld

if TYPE_CHECKING:
    import torch

_CHUNK_BYTES = 256 << 20  # bound on one chunk of the score matrix


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """Turn TF32 off for matmuls inside the block (it would make the reference ~1e-3 wrong)."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                        scale: float, layout: str = "bhld") -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) in fp32, out as [B, H, Lq, D] whatever the input layout.

    Causal is aligned bottom-right (query i sees keys j <= i + Lk - Lq); a query that sees no
    key gets out = 0 and lse = -inf, the kernels' contract.
    """
    import torch

    qf, kf, vf = (logical_bhld(t, layout).float() for t in (q, k, v))
    groups = qf.shape[1] // kf.shape[1]
    if groups > 1:
        kf = kf.repeat_interleave(groups, dim=1)
        vf = vf.repeat_interleave(groups, dim=1)
    batch, heads, seqlen_q, _ = qf.shape
    seqlen_k = kf.shape[2]
    rows_per_chunk = max(1, _CHUNK_BYTES // (4 * batch * heads * seqlen_k))
    outs, lses = [], []
    with exact_fp32():
        for start in range(0, seqlen_q, rows_per_chunk):
            stop = min(seqlen_q, start + rows_per_chunk)
            scores = torch.matmul(qf[:, :, start:stop], kf.transpose(-1, -2)) * scale
            if causal:
                rows = torch.arange(start, stop, device=q.device)[:, None]
                cols = torch.arange(seqlen_k, device=q.device)[None, :]
                scores.masked_fill_(cols > rows + (seqlen_k - seqlen_q), float("-inf"))
            lse = torch.logsumexp(scores, dim=-1)
            weights = torch.exp(scores - lse[..., None])
            weights = torch.nan_to_num(weights, nan=0.0)  # rows with no visible key
            outs.append(torch.matmul(weights, vf))
            lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def gather_kv_cache(cache: torch.Tensor, batch_index: int, length: int, *,
                    block_table: torch.Tensor | None, layout: str) -> torch.Tensor:
    """The first `length` rows of one sequence of a KV cache, as [1, Hkv, length, D]:
    contiguous ([B, Lk_max, Hkv, D] in "blhd"), or paged through `block_table`."""
    import torch

    cb = logical_bhld(cache, layout)  # [B or pages, Hkv, rows, D]
    if block_table is None:
        return cb[batch_index:batch_index + 1, :, :length]
    page_size = cb.shape[2]
    rows = torch.arange(length, device=cache.device)
    pages = block_table[batch_index].long()[rows // page_size]
    return cb[pages, :, rows % page_size].permute(1, 0, 2).unsqueeze(0)


def reference_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                           cache_seqlens: torch.Tensor | None, block_table: torch.Tensor | None,
                           causal: bool, scale: float, layout: str = "blhd"
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, Hq, Lq, D], lse [B, Hq, Lq]) in fp32 of attention against a KV cache, one
    sequence at a time (the host reads the lengths: this is the reference, not the kernel).
    A sequence of length 0 gives out = 0 and lse = -inf."""
    import torch

    qb = logical_bhld(q, layout)
    batch, heads_q, seqlen_q, head_dim = qb.shape
    rows = (logical_bhld(k_cache, layout).shape[2] * block_table.shape[1]
            if block_table is not None else logical_bhld(k_cache, layout).shape[2])
    lengths = ([int(n) for n in cache_seqlens.tolist()] if cache_seqlens is not None
               else [rows] * batch)
    out = torch.zeros(batch, heads_q, seqlen_q, head_dim, device=q.device)
    lse = torch.full((batch, heads_q, seqlen_q), float("-inf"), device=q.device)
    for b, length in enumerate(lengths):
        length = max(0, min(length, rows))
        if length == 0:
            continue
        k = gather_kv_cache(k_cache, b, length, block_table=block_table, layout=layout)
        v = gather_kv_cache(v_cache, b, length, block_table=block_table, layout=layout)
        out[b:b + 1], lse[b:b + 1] = reference_attention(qb[b:b + 1], k, v, causal=causal,
                                                         scale=scale)
    return out, lse
