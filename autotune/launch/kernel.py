"""A compiled config loaded on a GPU and called on torch tensors."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._shown import shown
from ..build.compiler import BuildResult
from ..build.cubin import read_launch_info
from ..model.config import Config
from ..model.problem import Problem
from .launcher import launcher
from .tensors import InputError, dtype_name, logical_bhld, operand, read_problem

if TYPE_CHECKING:
    import torch

_DTYPE_CODES = {"fp16": 0, "bf16": 1}  # kDTypeFloat16 / kDTypeBFloat16 in fwd_params.h
MAX_LAUNCH_SPLITS = 65535  # the launcher's bound on num_splits (a grid dimension's)

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


def current_stream_handle(device: torch.device) -> int:
    """The caller's current CUDA stream on `device`, as the launcher takes it. torch's raw
    getter where it has one: `torch.cuda.current_stream` builds a Stream object per call,
    microseconds a decode call at B=1 cannot spare."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if raw is not None:
        return int(raw(index))
    return int(torch.cuda.current_stream(device).cuda_stream)


@dataclass(frozen=True)
class Paging:
    """A paged cache as the plan takes it (all 0: not paged)."""

    page_size: int = 0
    table_stride: int = 0  # elements between the block table's rows
    cache_pages: int = 0  # the extent of the cache's page dimension (a TMA kernel's maps)


@dataclass(frozen=True)
class PreparedLaunch:
    """A kernel's launch for one geometry: the launcher's plan, every size and stride in it
    decided and checked, and the output's geometry. A call with tensors of that geometry
    allocates the output (and the split workspaces) from torch's caching allocator on the
    caller's stream and launches: no checks, no plan, no Python-side problem."""

    plan: Any  # launcher Plan
    out_shape: tuple[int, ...]
    out_stride: tuple[int, ...]
    lse_shape: tuple[int, int, int]
    # (splits, B, Hq, Lq, D) of the fp32 O workspace when the combine entry reduces the
    # splits; None when there is one split or a cluster reduces them in-kernel.
    workspace: tuple[int, ...] | None

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        seqlens: torch.Tensor | None = None,
        block_table: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        import torch

        if out is None:
            out = torch.empty_strided(
                self.out_shape, self.out_stride, dtype=q.dtype, device=q.device
            )
        if return_lse and lse is None:
            lse = torch.empty(self.lse_shape, dtype=torch.float32, device=q.device)
        o_partial = lse_partial = 0
        if self.workspace is not None:
            # One allocation for both (fp32 O, then the LSE after it: 16-byte aligned, as D is a
            # multiple of 4), from the caching allocator on the caller's stream: a later call
            # reuses it only after this launch's kernels (stream order).
            o_elems = math.prod(self.workspace)
            rows = o_elems // self.workspace[-1]
            buffer = torch.empty(o_elems + rows, dtype=torch.float32, device=q.device)
            o_partial = buffer.data_ptr()
            lse_partial = o_partial + 4 * o_elems
        self.plan.launch(
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            out.data_ptr(),
            0 if lse is None else lse.data_ptr(),
            current_stream_handle(q.device),
            0 if seqlens is None else seqlens.data_ptr(),
            0 if block_table is None else block_table.data_ptr(),
            o_partial,
            lse_partial,
        )
        return out, lse


class CompiledKernel:
    def __init__(self, build: BuildResult, device: int = 0) -> None:
        if not build.ok or build.cubin is None:
            raise ValueError(f"cannot load a build with status {build.status!r}: {build.message}")
        self.build = build
        self.config: Config = build.config
        self.device = device
        self._kernel = _load(str(build.cubin), device)
        values = dict(self.config.values)
        self._num_splits = int(values["num_splits"]) if "num_splits" in values else 1

    @property
    def block_m(self) -> int:
        return int(self._kernel.block_m)

    @property
    def block_n(self) -> int:
        return int(self._kernel.block_n)

    @property
    def num_splits(self) -> int:
        """The config's KV split count (a launch parameter of the decode family), else 1."""
        return self._num_splits

    @property
    def split_kv(self) -> bool:
        """Whether the kernel takes num_splits > 1 and KV caches (the decode family)."""
        return bool(self._kernel.split_kv)

    @property
    def pack_gqa(self) -> bool:
        return bool(self._kernel.pack_gqa)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scale: float | None = None,
        layout: str = "bhld",
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        num_splits: int | None = None,
        cluster_combine: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention forward on the caller's current stream; returns (out, lse or None).

        `out` (same shape and layout as q) and `lse` (fp32 [B, Hq, Lq], contiguous) may be given
        to write into; otherwise they are allocated through torch's caching allocator.
        `num_splits` > 1 (kernels with split-KV only) splits the keys of each row over that many
        CTAs; None: the config's own count. A kernel that can (decode90) reduces them inside a
        thread-block cluster where the device fits one of that many CTAs; `cluster_combine`
        False makes it use the combine entry instead (the two paths are tested against each
        other).
        """
        problem = read_problem(q, k, v, causal=bool(self.config["causal"]), layout=layout)
        return self._launch(
            problem,
            q,
            k,
            v,
            scale=scale,
            layout=layout,
            out=out,
            lse=lse,
            return_lse=return_lse,
            num_splits=num_splits,
            cluster_combine=cluster_combine,
        )

    def with_kvcache(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        *,
        cache_seqlens: torch.Tensor | None = None,
        block_table: torch.Tensor | None = None,
        scale: float | None = None,
        layout: str = "blhd",
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        num_splits: int | None = None,
        cluster_combine: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of q against a KV cache (split-KV kernels only), nothing appended: the
        checked entry is `autotune.attention_with_kvcache` (runtime/kvcache.py), which also
        validates the cache tensors; this trusts them.

        Contiguous caches are [B, Lk_max, Hkv, D] ("blhd") or [B, Hkv, Lk_max, D] ("bhld");
        `cache_seqlens` (int32 [B], on the GPU) gives each sequence's length, else all Lk_max.
        Paged caches are [num_pages, page_size, Hkv, D] in "blhd" ([num_pages, Hkv, page_size,
        D] in "bhld") with `block_table` (int32 [B, max_pages]).
        """
        problem, paging = self._kvcache_problem(q, k_cache, block_table, layout)
        return self._launch(
            problem,
            q,
            k_cache,
            v_cache,
            scale=scale,
            layout=layout,
            out=out,
            lse=lse,
            return_lse=return_lse,
            num_splits=num_splits,
            seqlens=cache_seqlens,
            block_table=block_table,
            page_size=paging.page_size,
            table_stride=paging.table_stride,
            cache_pages=paging.cache_pages,
            cluster_combine=cluster_combine,
        )

    def _launch(
        self,
        problem: Problem,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scale: float | None,
        layout: str,
        out: torch.Tensor | None,
        lse: torch.Tensor | None,
        return_lse: bool,
        num_splits: int | None,
        seqlens: torch.Tensor | None = None,
        block_table: torch.Tensor | None = None,
        page_size: int = 0,
        table_stride: int = 0,
        cache_pages: int = 0,
        cluster_combine: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        import torch

        if out is None:  # one allocation: its geometry is the plan's, its memory the output
            out = torch.empty_like(q)
        prepared = self.prepare(
            problem,
            q,
            k,
            v,
            scale=scale,
            layout=layout,
            out=out,
            num_splits=num_splits,
            page_size=page_size,
            table_stride=table_stride,
            cache_pages=cache_pages,
            cluster_combine=cluster_combine,
        )
        if lse is not None and (
            tuple(lse.shape) != prepared.lse_shape
            or lse.dtype != torch.float32
            or not lse.is_contiguous()
            or lse.device != q.device
        ):
            raise InputError(
                f"lse must be a contiguous float32 tensor of shape {prepared.lse_shape}"
            )
        return prepared.run(
            q,
            k,
            v,
            out=out,
            lse=lse,
            return_lse=return_lse,
            seqlens=seqlens,
            block_table=block_table,
        )

    def prepare_kvcache(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        *,
        block_table: torch.Tensor | None = None,
        scale: float | None = None,
        layout: str = "blhd",
        num_splits: int | None = None,
        cluster_combine: bool = True,
    ) -> PreparedLaunch:
        """`with_kvcache`'s launch for this geometry (shapes, strides, page size, split count),
        made once: calling it with tensors of that geometry checks nothing and launches."""
        problem, paging = self._kvcache_problem(q, k_cache, block_table, layout)
        return self.prepare(
            problem,
            q,
            k_cache,
            v_cache,
            scale=scale,
            layout=layout,
            num_splits=num_splits,
            page_size=paging.page_size,
            table_stride=paging.table_stride,
            cache_pages=paging.cache_pages,
            cluster_combine=cluster_combine,
        )

    def _kvcache_problem(
        self, q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor | None, layout: str
    ) -> tuple[Problem, Paging]:
        """The Problem a KV-cache call poses (seqlen_k: the cache's capacity per sequence) and
        its paging arguments for the plan."""
        if not self.split_kv:
            raise InputError(f"{self.build.name} has no KV-cache entry (not a decode kernel)")
        kb = logical_bhld(k_cache, layout)
        qb = logical_bhld(q, layout)
        paging = Paging()
        seqlen_k = int(kb.shape[2])
        if block_table is not None:
            paging = Paging(int(kb.shape[2]), int(block_table.stride(0)), int(kb.shape[0]))
            seqlen_k = int(block_table.shape[1]) * paging.page_size
        batch, heads_q, seqlen_q, head_dim = (int(x) for x in qb.shape)
        problem = Problem(
            batch,
            heads_q,
            int(kb.shape[1]),
            seqlen_q,
            seqlen_k,
            head_dim,
            dtype_name(q.dtype),
            bool(self.config["causal"]),
        )
        return problem, paging

    def prepare(
        self,
        problem: Problem,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scale: float | None,
        layout: str,
        out: torch.Tensor | None = None,
        num_splits: int | None = None,
        page_size: int = 0,
        table_stride: int = 0,
        cache_pages: int = 0,
        cluster_combine: bool = True,
    ) -> PreparedLaunch:
        """The launch of `problem` for tensors of the geometry of these (`out`: the output's,
        else q's shape in q's memory format), checked and planned once."""
        import torch

        expected = {key: self.config[key] for key in problem.space_values()}
        if problem.space_values() != expected:
            raise InputError(f"problem {problem.describe()} does not match kernel {expected}")
        if q.device != torch.device("cuda", self.device):
            raise InputError(
                f"tensors are on {q.device}, this kernel is loaded on cuda:{self.device}"
            )
        if out is None:
            out = torch.empty_like(q)  # the output's geometry: q's shape in q's memory format
        if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
            raise InputError(
                f"out must match q: {tuple(out.shape)} {out.dtype} vs {tuple(q.shape)} {q.dtype}"
            )
        ops = [
            operand(name, logical_bhld(t, layout))
            for name, t in (("q", q), ("k", k), ("v", v), ("out", out))
        ]
        try:
            scale = 1.0 / math.sqrt(problem.head_dim) if scale is None else float(scale)
        except (OverflowError, ValueError, TypeError):
            raise InputError(f"scale must be a finite number > 0, got {shown(scale)}") from None
        if not (math.isfinite(scale) and scale > 0):
            raise InputError(f"scale must be finite and > 0, got {scale}")
        if num_splits is None:
            num_splits = self.num_splits
        if (
            type(num_splits) is not int
            or not 1 <= num_splits <= MAX_LAUNCH_SPLITS
            or (num_splits > 1 and not self.split_kv)
        ):
            raise InputError(
                f"num_splits must be an int from 1 to {MAX_LAUNCH_SPLITS} (above "
                f"1 only for a split-KV kernel: the decode families); got "
                f"{shown(num_splits)}"
            )
        plan = self.plan(
            problem,
            [op.strides for op in ops],
            scale,
            num_splits=num_splits,
            page_size=page_size,
            block_table_stride=table_stride,
            cluster_combine=cluster_combine,
            cache_pages=cache_pages,
        )
        lse_shape = (problem.batch, problem.heads_q, problem.seqlen_q)
        workspace = None
        if num_splits > 1 and not plan.cluster:  # a cluster reduces its splits in-kernel
            workspace = (num_splits, *lse_shape, problem.head_dim)
        return PreparedLaunch(plan, tuple(out.shape), tuple(out.stride()), lse_shape, workspace)

    def plan(
        self,
        problem: Problem,
        strides: Sequence[tuple[int, int, int]],
        scale: float,
        *,
        num_splits: int = 1,
        page_size: int = 0,
        block_table_stride: int = 0,
        cluster_combine: bool = True,
        cache_pages: int = 0,
    ) -> Any:
        """A launch plan (launcher `Plan`) for this problem and these (batch, head, row) element
        strides of q, k, v, out: `plan.launch(q, k, v, out, lse, stream)` takes addresses
        (and, for a KV-cache kernel, the lengths, the block table and the split workspaces).
        `plan.cluster` is the cluster size when the splits are reduced in-kernel (then no
        workspaces are needed), else 0. A paged cache gives its page size and its number of
        pages (`cache_pages`: a TMA kernel's maps span them)."""
        return self._kernel.plan(
            *strides,
            problem.batch,
            problem.heads_q,
            problem.heads_kv,
            problem.seqlen_q,
            problem.seqlen_k,
            problem.head_dim,
            _DTYPE_CODES[problem.dtype],
            problem.causal,
            scale,
            num_splits,
            page_size,
            block_table_stride,
            cluster_combine,
            cache_pages,
        )
