"""A compiled backward config loaded on a GPU and called on torch tensors.

The backward of attention for one config of a backward family (search_spaces/backward/): from
the forward's inputs, its output, its log-sum-exp and the output's gradient, the gradients of
q, k and v on the caller's stream. The fp32 workspaces it needs (the dQ accumulator, the LSE in
base 2, rowsum(dO * O)) come from torch's caching allocator; no synchronisation, no copy of an
input.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..build.compiler import BuildResult
from ..build.cubin import read_launch_info
from ..model.config import Config
from ..model.space import BACKWARD, INFO_SYMBOLS
from .kernel import current_stream_handle
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
            info = read_launch_info(Path(cubin), INFO_SYMBOLS[BACKWARD])
            fields = tuple(info.as_dict().values())
            kernel = _loaded[key] = launcher().BwdKernel(cubin, device, fields)
    return kernel


def _same_geometry(name: str, t: torch.Tensor, like: torch.Tensor, layout: str) -> None:
    if t.shape != like.shape or t.dtype != like.dtype or t.device != like.device:
        raise InputError(
            f"{name} must match {tuple(like.shape)} {like.dtype} on {like.device} "
            f"({layout}), got {tuple(t.shape)} {t.dtype} on {t.device}"
        )


class CompiledBackward:
    def __init__(self, build: BuildResult, device: int = 0) -> None:
        if not build.ok or build.cubin is None:
            raise ValueError(f"cannot load a build with status {build.status!r}: {build.message}")
        self.build = build
        self.config: Config = build.config
        self.device = device
        self._kernel = _load(str(build.cubin), device)

    @property
    def causal(self) -> bool:
        return bool(self.config["causal"])

    @property
    def deterministic(self) -> bool:
        """Whether two runs give bit-identical gradients (dQ added in a fixed order)."""
        return bool(self.config["deterministic"])

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        dout: torch.Tensor,
        lse: torch.Tensor,
        *,
        scale: float | None = None,
        layout: str = "bhld",
        dq: torch.Tensor | None = None,
        dk: torch.Tensor | None = None,
        dv: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq, dk, dv) of attention(q, k, v) = out, given dout = dLoss/dout and the forward's
        `lse` (fp32 [B, Hq, Lq], contiguous, natural base; -inf for a row that sees no key).
        `out` and `dout` are laid out as q; dq, dk, dv may be given to write into (laid out as
        q, k and v), else they are allocated like them."""
        import torch

        problem = read_problem(q, k, v, causal=self.causal, layout=layout)
        _same_geometry("out", out, q, layout)
        _same_geometry("dout", dout, q, layout)
        b, hq, lq, d = problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim
        if (
            lse.dtype != torch.float32
            or tuple(lse.shape) != (b, hq, lq)
            or not lse.is_contiguous()
            or lse.device != q.device
        ):
            raise InputError(
                f"lse must be a contiguous fp32 [{b}, {hq}, {lq}] tensor on {q.device}, got "
                f"{lse.dtype} {tuple(lse.shape)}"
            )
        grads = []
        for name, given, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
            if given is None:
                given = torch.empty_like(like)
            else:
                _same_geometry(name, given, like, layout)
            grads.append(given)
        views = [logical_bhld(t, layout) for t in (q, k, v, out, dout, *grads)]
        names = ("q", "k", "v", "out", "dout", "dq", "dk", "dv")
        ops = [operand(name, t) for name, t in zip(names, views, strict=True)]
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        plan = self._kernel.plan(
            *(op.strides for op in ops),
            batch=b,
            heads_q=hq,
            heads_kv=problem.heads_kv,
            seqlen_q=lq,
            seqlen_k=problem.seqlen_k,
            head_dim=d,
            dtype=_DTYPE_CODES[problem.dtype],
            causal=self.causal,
            scale=scale,
        )
        rows = int(plan.seqlen_q_rounded)
        lse_log2 = torch.empty((b, hq, rows), dtype=torch.float32, device=q.device)
        dpsum = torch.empty_like(lse_log2)
        dq_accum = torch.empty((b, hq, rows, d), dtype=torch.float32, device=q.device)
        semaphore = None
        if self.deterministic:  # a counter per query tile, zeroed by the preprocess entry
            tiles = rows // int(self.config["block_m"]) * int(self.config["d_slices"])
            semaphore = torch.empty((b, hq, tiles), dtype=torch.int32, device=q.device)
        plan.launch(
            *(op.ptr for op in ops),
            lse=lse.data_ptr(),
            lse_log2=lse_log2.data_ptr(),
            dpsum=dpsum.data_ptr(),
            dq_accum=dq_accum.data_ptr(),
            stream=current_stream_handle(q.device),
            dq_semaphore=0 if semaphore is None else semaphore.data_ptr(),
        )
        return grads[0], grads[1], grads[2]
