"""The fp32 reference every kernel is validated against (TF32 off, explicit softmax)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..launch.tensors import logical_bhld

if TYPE_CHECKING:
    import torch

_CHUNK_BYTES = 256 << 20  # bound on one chunk of the score matrix
_SLICE_BYTES = 64 << 20  # bound on one slice of K and V in fp32


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


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    layout: str = "bhld",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) in fp32, out as [B, H, Lq, D] whatever the input layout.

    Causal is aligned bottom-right (query i sees keys j <= i + Lk - Lq); a query that sees no
    key gets out = 0 and lse = -inf, the kernels' contract.

    Memory: the fp32 output and LSE, plus a working set bounded by `_SLICE_BYTES` (K and V)
    and `_CHUNK_BYTES` (scores) whatever the inputs' layout. K and V are converted to fp32 a
    slice of (batch, KV head) at a time, and each KV head's group of query heads is multiplied
    against it as one matrix (no copy of K and V per query head): inputs expanded with stride 0
    (a small cache viewed as a large one) are never materialised whole.
    """
    import torch

    qb, kb, vb = (logical_bhld(t, layout) for t in (q, k, v))
    batch, heads_q, seqlen_q, head_dim = qb.shape
    heads_kv, seqlen_k = kb.shape[1], kb.shape[2]
    group = heads_q // heads_kv
    out = torch.empty(batch, heads_q, seqlen_q, head_dim, device=q.device)
    lse = torch.empty(batch, heads_q, seqlen_q, device=q.device)
    # (batch, KV head) pairs per slice: their fp32 K and V within one chunk
    per_head = max(1, 2 * 4 * seqlen_k * head_dim)
    heads_per_slice = max(1, min(heads_kv, _SLICE_BYTES // per_head))
    batch_per_slice = (
        max(1, _SLICE_BYTES // (per_head * heads_kv)) if heads_per_slice == heads_kv else 1
    )
    rows = group * seqlen_q  # a KV head's query rows, its group's heads one after another
    with exact_fp32():
        for b0 in range(0, batch, batch_per_slice):
            b1 = min(batch, b0 + batch_per_slice)
            for h0 in range(0, heads_kv, heads_per_slice):
                h1 = min(heads_kv, h0 + heads_per_slice)
                kf, vf = (t[b0:b1, h0:h1].float() for t in (kb, vb))
                qf = (
                    qb[b0:b1, h0 * group : h1 * group]
                    .float()
                    .reshape(b1 - b0, h1 - h0, rows, head_dim)
                )
                o, l_ = _attend_rows(qf, kf, vf, causal=causal, scale=scale, seqlen_q=seqlen_q)
                out[b0:b1, h0 * group : h1 * group] = o.reshape(
                    b1 - b0, (h1 - h0) * group, seqlen_q, head_dim
                )
                lse[b0:b1, h0 * group : h1 * group] = l_.reshape(
                    b1 - b0, (h1 - h0) * group, seqlen_q
                )
    return out, lse


def _attend_rows(
    qf: torch.Tensor,
    kf: torch.Tensor,
    vf: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    seqlen_q: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of fp32 [b, h, rows, D] queries (row r is query r % seqlen_q) against fp32
    [b, h, Lk, D] keys and values, the score matrix a chunk of rows at a time."""
    import torch

    batch, heads, rows, _ = qf.shape
    seqlen_k = kf.shape[2]
    rows_per_chunk = max(1, _CHUNK_BYTES // (4 * batch * heads * max(1, seqlen_k)))
    kt = kf.transpose(-1, -2)
    outs, lses = [], []
    for start in range(0, rows, rows_per_chunk):
        stop = min(rows, start + rows_per_chunk)
        scores = torch.matmul(qf[:, :, start:stop], kt) * scale
        if causal:
            query = torch.arange(start, stop, device=qf.device)[:, None] % seqlen_q
            cols = torch.arange(seqlen_k, device=qf.device)[None, :]
            scores.masked_fill_(cols > query + (seqlen_k - seqlen_q), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        weights = torch.exp(scores - lse[..., None])
        weights = torch.nan_to_num(weights, nan=0.0)  # rows with no visible key
        outs.append(torch.matmul(weights, vf))
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def gather_kv_cache(
    cache: torch.Tensor,
    batch_index: int,
    length: int,
    *,
    block_table: torch.Tensor | None,
    layout: str,
) -> torch.Tensor:
    """The first `length` rows of one sequence of a KV cache, as [1, Hkv, length, D]:
    contiguous ([B, Lk_max, Hkv, D] in "blhd"), or paged through `block_table`."""
    import torch

    cb = logical_bhld(cache, layout)  # [B or pages, Hkv, rows, D]
    if block_table is None:
        return cb[batch_index : batch_index + 1, :, :length]
    page_size = cb.shape[2]
    rows = torch.arange(length, device=cache.device)
    pages = block_table[batch_index].long()[rows // page_size]
    return cb[pages, :, rows % page_size].permute(1, 0, 2).unsqueeze(0)


def reference_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor | None,
    block_table: torch.Tensor | None,
    causal: bool,
    scale: float,
    layout: str = "blhd",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, Hq, Lq, D], lse [B, Hq, Lq]) in fp32 of attention against a KV cache, one
    sequence at a time (the host reads the lengths: this is the reference, not the kernel).
    A sequence of length 0 gives out = 0 and lse = -inf."""
    import torch

    qb = logical_bhld(q, layout)
    batch, heads_q, seqlen_q, head_dim = qb.shape
    rows = (
        logical_bhld(k_cache, layout).shape[2] * block_table.shape[1]
        if block_table is not None
        else logical_bhld(k_cache, layout).shape[2]
    )
    lengths = (
        [int(n) for n in cache_seqlens.tolist()] if cache_seqlens is not None else [rows] * batch
    )
    out = torch.zeros(batch, heads_q, seqlen_q, head_dim, device=q.device)
    lse = torch.full((batch, heads_q, seqlen_q), float("-inf"), device=q.device)
    for b, length in enumerate(lengths):
        length = max(0, min(length, rows))
        if length == 0:
            continue
        k = gather_kv_cache(k_cache, b, length, block_table=block_table, layout=layout)
        v = gather_kv_cache(v_cache, b, length, block_table=block_table, layout=layout)
        out[b : b + 1], lse[b : b + 1] = reference_attention(
            qb[b : b + 1], k, v, causal=causal, scale=scale
        )
    return out, lse
