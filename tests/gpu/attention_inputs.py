"""Inputs for `autotune.attention` on the GPU and the check of its output against the fp32
reference, shared by the GPU tests of dispatch."""

from __future__ import annotations

import math

import torch

from autotune.measure.reference import reference_attention
from autotune.model.problem import Problem


def make(problem: Problem, layout: str = "bhld") -> tuple[torch.Tensor, ...]:
    """Random q, k, v of `problem` in `layout` ("bhld" or "blhd")."""
    dtype = torch.float16 if problem.dtype == "fp16" else torch.bfloat16

    def tensor(heads: int, length: int) -> torch.Tensor:
        shape = (
            (problem.batch, heads, length, problem.head_dim)
            if layout == "bhld"
            else (problem.batch, length, heads, problem.head_dim)
        )
        return torch.randn(shape, device="cuda", dtype=dtype)

    return (
        tensor(problem.heads_q, problem.seqlen_q),
        tensor(problem.heads_kv, problem.seqlen_k),
        tensor(problem.heads_kv, problem.seqlen_k),
    )


def check(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    layout: str,
    lse: torch.Tensor | None = None,
    *,
    fp16_tol: float = 1e-3,
    bf16_tol: float = 8e-3,
) -> None:
    """Relative error of `out` (and `lse`, fp32 [B, Hq, Lq]) against the fp32 reference."""
    ref, ref_lse = reference_attention(
        q, k, v, causal=problem.causal, scale=1 / math.sqrt(problem.head_dim), layout=layout
    )
    got = out if layout == "bhld" else out.transpose(1, 2)
    assert out.shape == q.shape and bool(torch.isfinite(out).all())
    err = torch.linalg.vector_norm(got.float() - ref) / torch.linalg.vector_norm(ref)
    assert float(err) < (fp16_tol if problem.dtype == "fp16" else bf16_tol)
    if lse is not None:
        assert lse.shape == ref_lse.shape and lse.dtype == torch.float32
        torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=1e-4)
