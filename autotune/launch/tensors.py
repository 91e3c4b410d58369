"""Read an attention problem off torch tensors, with clear errors for what the kernels cannot take.

Kernels see every tensor as logical (B, H, L, D) with element strides for batch, head and row
and a contiguous head dimension. `layout` says how the caller's tensors are ordered:
"bhld" ([B, H, L, D], torch SDPA's order) or "blhd" ([B, L, H, D], FlashAttention's order).
Neither needs a copy. The sizes the tensors pose are a `Problem` (model/problem.py), the one
problem type; the layout is how they lie in memory, not part of the problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model.problem import Problem

if TYPE_CHECKING:
    import torch

LAYOUTS = ("bhld", "blhd")
ALIGN_BYTES = 16  # 128-bit cp.async loads and vector stores


class InputError(ValueError):
    """The tensors do not describe an attention problem the kernels can run."""


@dataclass(frozen=True)
class Operand:
    ptr: int
    strides: tuple[int, int, int]  # (batch, head, row), in elements


def dtype_name(dtype: torch.dtype) -> str:
    import torch

    names = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    if dtype not in names:
        raise InputError(f"dtype {dtype} is not supported: use torch.float16 or torch.bfloat16")
    return names[dtype]


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def logical_bhld(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A [B, H, L, D] view of a tensor in `layout` (no copy)."""
    if layout not in LAYOUTS:
        raise InputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return t if layout == "bhld" else t.transpose(1, 2)


def operand(name: str, t: torch.Tensor) -> Operand:
    """`t` as a kernel operand; `t` is already the logical [B, H, L, D] view."""
    if t.stride(3) != 1 and t.shape[3] > 1:
        raise InputError(
            f"{name}: the head dimension must be contiguous (stride 1), got "
            f"strides {tuple(t.stride())}"
        )
    elem = t.element_size()
    if t.data_ptr() % ALIGN_BYTES:
        raise InputError(f"{name}: data pointer must be {ALIGN_BYTES}-byte aligned")
    strides = (t.stride(0), t.stride(1), t.stride(2))
    for axis, stride in zip(("batch", "head", "row"), strides, strict=True):
        if (stride * elem) % ALIGN_BYTES:
            raise InputError(
                f"{name}: {axis} stride {stride} is not a multiple of "
                f"{ALIGN_BYTES // elem} elements ({ALIGN_BYTES} bytes)"
            )
    return Operand(t.data_ptr(), strides)


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: str) -> None:
    """Raise InputError for anything that is not attention at all (ranks, mismatched sizes,
    Hq % Hkv, mixed devices or dtypes, unknown layout); `problem_of` then reads the sizes."""
    if layout not in LAYOUTS:
        raise InputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise InputError(f"{name} must be 4-D ({layout}), got shape {tuple(t.shape)}")
    if not (q.device == k.device == v.device):
        raise InputError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    lq, lk, lv = (logical_bhld(t, layout) for t in (q, k, v))
    batch, heads_q, seqlen_q, head_dim = lq.shape
    if lk.shape != lv.shape:
        raise InputError(
            f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if lk.shape[0] != batch or lk.shape[3] != head_dim:
        raise InputError(
            f"k/v batch and head dim must match q: q {tuple(q.shape)}, "
            f"k {tuple(k.shape)} ({layout})"
        )
    heads_kv, seqlen_k = lk.shape[1], lk.shape[2]
    if min(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim) < 1:
        raise InputError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if heads_q % heads_kv:
        raise InputError(
            f"query heads ({heads_q}) must be a multiple of key/value heads ({heads_kv})"
        )


def problem_of(
    q: torch.Tensor, k: torch.Tensor, *, dtype: str, causal: bool, layout: str
) -> Problem:
    """The Problem of q and k (in `layout`) that `check_shapes` accepted, in `dtype` (the
    kernels' name of q's dtype: "fp16" or "bf16")."""
    batch, heads_q, seqlen_q, head_dim = logical_bhld(q, layout).shape
    heads_kv, seqlen_k = logical_bhld(k, layout).shape[1:3]
    return Problem(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, bool(causal))


def read_problem(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, layout: str = "bhld"
) -> Problem:
    """The Problem these tensors pose; raises InputError naming what is wrong."""
    check_shapes(q, k, v, layout)
    return problem_of(q, k, dtype=dtype_name(q.dtype), causal=causal, layout=layout)
