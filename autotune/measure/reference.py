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
