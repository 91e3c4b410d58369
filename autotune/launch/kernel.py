"""A compiled config loaded on a GPU and called on torch tensors."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..build.compiler import BuildResult
from ..build.cubin import read_launch_info
from ..model.config import Config
from ..model.problem import Problem
from .launcher import launcher
from .tensors import InputError, logical_bhld, operand, read_problem

if TYPE_CHECKING:
    import torch

_DTYPE_CODES = {"fp16": 0, "bf16": 1}  # kDTypeFloat16 / kDTypeBFloat16 in fwd_params.h

_loaded: dict[tuple[str, int], Any] = {}
_lock = threading.Lock()


def _load(cubin: str, device: int) -> Any:
    """One driver module per (cubin, device) for the life of the process."""
    key = (cubin, device)
    with _lock:
        kernel = _loaded.get(key)
        if kernel is None:
            info = read_launch_info(Path(cubin))  # what the kernel's traits wrote
            fields = tuple(info.as_dict().values())
            kernel = _loaded[key] = launcher().Kernel(cubin, device, fields)
    return kernel


class CompiledKernel:
    def __init__(self, build: BuildResult, device: int = 0) -> None:
        if not build.ok or build.cubin is None:
            raise ValueError(f"cannot load a build with status {build.status!r}: {build.message}")
        self.build = build
        self.config: Config = build.config
        self.device = device
        self._kernel = _load(str(build.cubin), device)

    @property
    def block_m(self) -> int:
        return int(self._kernel.block_m)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                 scale: float | None = None, layout: str = "bhld",
                 out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                 return_lse: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention forward on the caller's current stream; returns (out, lse or None).

        `out` (same shape and layout as q) and `lse` (fp32 [B, Hq, Lq], contiguous) may be given
        to write into; otherwise they are allocated through torch's caching allocator.
        """
        import torch

        causal = bool(self.config["causal"])
        problem = read_problem(q, k, v, causal=causal, layout=layout)
        expected = {key: self.config[key] for key in problem.space_values()}
        if problem.space_values() != expected:
            raise InputError(f"problem {problem.describe()} does not match kernel {expected}")
        if q.device != torch.device("cuda", self.device):
            raise InputError(f"tensors are on {q.device}, this kernel is loaded on "
                             f"cuda:{self.device}")
        if out is None:
            out = torch.empty_like(q)
        if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
            raise InputError(f"out must match q: {tuple(out.shape)} {out.dtype} vs "
                             f"{tuple(q.shape)} {q.dtype}")
        lse_shape = (problem.batch, problem.heads_q, problem.seqlen_q)
        if return_lse and lse is None:
            lse = torch.empty(lse_shape, device=q.device, dtype=torch.float32)
        if lse is not None and (tuple(lse.shape) != lse_shape or lse.dtype != torch.float32
                                or not lse.is_contiguous() or lse.device != q.device):
            raise InputError(f"lse must be a contiguous float32 tensor of shape {lse_shape}")
        ops = [operand(name, logical_bhld(t, layout))
               for name, t in (("q", q), ("k", k), ("v", v), ("out", out))]
        scale = 1.0 / math.sqrt(problem.head_dim) if scale is None else float(scale)
        if not (math.isfinite(scale) and scale > 0):
            raise InputError(f"scale must be finite and > 0, got {scale}")
        plan = self.plan(problem, [op.strides for op in ops], scale)
        plan.launch(ops[0].ptr, ops[1].ptr, ops[2].ptr, ops[3].ptr,
                    0 if lse is None else lse.data_ptr(),
                    torch.cuda.current_stream(q.device).cuda_stream)
        return out, lse

    def plan(self, problem: Problem, strides: Sequence[tuple[int, int, int]],
             scale: float) -> Any:
        """A launch plan (launcher `Plan`) for this problem and these (batch, head, row) element
        strides of q, k, v, out: `plan.launch(q, k, v, out, lse, stream)` takes addresses."""
        return self._kernel.plan(
            *strides, problem.batch, problem.heads_q, problem.heads_kv, problem.seqlen_q,
            problem.seqlen_k, problem.head_dim, _DTYPE_CODES[problem.dtype], problem.causal,
            scale)
