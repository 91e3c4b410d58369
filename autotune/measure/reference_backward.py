"""The fp32 reference of attention's gradients, which a backward kernel is validated against:
dQ, dK and dV of softmax(scale * Q K^T [+ causal mask]) V for an upstream gradient dO, from the
explicit formulas (TF32 off), causal aligned bottom-right as in the forward.

    P = softmax(S), S = scale * Q K^T;  dV = P^T dO;  dP = dO V^T;  D = rowsum(dO * O);
    dS = P * (dP - D);  dQ = scale * dS K;  dK = scale * dS^T Q

A query that sees no key has P = 0, so its dQ row is 0; with GQA, dK and dV sum over the query
heads of a key/value head.

`rounded_to` gives the same computation with what a kernel holds in the input dtype rounded to
it (O, P and dS, the operands of the products that follow them, and the gradients written;
products accumulated in fp32):
how far that lands from the fp32 reference is the error the dtype itself brings to a case, the
yardstick a kernel's error is measured by (a case can have gradients that are 0 but for
rounding, where a relative error says nothing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..launch.tensors import logical_bhld
from .reference import exact_fp32

if TYPE_CHECKING:
    import torch


def reference_gradients(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    layout: str = "bhld",
    rounded_to: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in fp32 as [B, H, L, D] whatever the input layout; `dout` is in q's layout.
    One (batch, key/value head) at a time: the score matrix of its query heads is the working
    set."""
    import torch

    def held(t: torch.Tensor) -> torch.Tensor:  # what a kernel keeps in the input dtype
        return t if rounded_to is None else t.to(rounded_to).float()

    qb, kb, vb, dob = (logical_bhld(t, layout) for t in (q, k, v, dout))
    batch, heads_q, seqlen_q, head_dim = qb.shape
    heads_kv, seqlen_k = kb.shape[1], kb.shape[2]
    group = heads_q // heads_kv
    dq = torch.zeros(batch, heads_q, seqlen_q, head_dim, device=q.device)
    dk = torch.zeros(batch, heads_kv, seqlen_k, head_dim, device=q.device)
    dv = torch.zeros_like(dk)
    hidden = None
    if causal:  # key j is hidden from query i where j > i + Lk - Lq
        rows = torch.arange(seqlen_q, device=q.device)[:, None]
        hidden = torch.arange(seqlen_k, device=q.device)[None, :] > rows + (seqlen_k - seqlen_q)
    with exact_fp32():
        for b in range(batch):
            for h in range(heads_kv):
                heads = slice(h * group, (h + 1) * group)
                qf, dof = qb[b, heads].float(), dob[b, heads].float()  # [group, Lq, D]
                kf, vf = kb[b, h].float(), vb[b, h].float()  # [Lk, D]
                scores = torch.matmul(qf, kf.T) * scale
                if hidden is not None:
                    scores.masked_fill_(hidden, float("-inf"))
                lse = torch.logsumexp(scores, dim=-1, keepdim=True)
                p = torch.nan_to_num(torch.exp(scores - lse), nan=0.0)  # rows seeing no key
                out = held(torch.matmul(held(p), vf))
                dv[b, h] = torch.matmul(held(p).transpose(-1, -2), dof).sum(0)
                dp = torch.matmul(dof, vf.T)
                ds = held(p * (dp - (dof * out).sum(-1, keepdim=True)))
                dq[b, heads] = torch.matmul(ds, kf) * scale
                dk[b, h] = (torch.matmul(ds.transpose(-1, -2), qf) * scale).sum(0)
    if rounded_to is not None:
        dq, dk, dv = (held(t) for t in (dq, dk, dv))
    return dq, dk, dv
