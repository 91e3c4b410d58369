"""`attention_with_kvcache`: decode attention against the KV caches serving engines hold.

Caches are contiguous ([B, Lk_max, Hkv, D] in layout "blhd", FlashAttention's; [B, Hkv, Lk_max,
D] in "bhld") or paged ([num_pages, page_size, Hkv, D] with a block table [B, max_pages], the
layout vLLM and FlashInfer use). `cache_seqlens` (int32 [B], on the GPU) gives each sequence's
length; it is never read on the host (that would synchronise), so the launch depends only on the
shapes. New tokens `k_new`/`v_new` are written into the caches at `cache_seqlens` first (torch
index writes on the caller's stream), then attended to, as `flash_attn_with_kvcache` does.

The kernel is a decode-family config (search_spaces/decode.toml): the one given, else the one
the tuning database knows best for the cache's shape and the batch (`decode_choice`: measured
for the problem, else the nearest tuned problem), else the family's untuned default for the
head dim. `num_splits` (the KV splits, a launch-time argument
of the same binary) is the one given, else the given config's, else (untuned) enough splits for
one wave of CTAs.

Inputs the kernels do not take but attention is defined for (CPU tensors, fp32 or fp64) are
computed through torch in fp32 with the same contract (the append, per-sequence lengths, paged
caches, bottom-right causal alignment, O = 0 and LSE = -inf for an empty sequence), with a
warning once, as `attention()` falls back to torch SDPA; `strict=True` (or
CUTE_AUTOTUNE_STRICT=1) raises instead.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .._bounded import LruDict
from .._shown import shown
from ..build.obtain import obtain
from ..launch.kernel import MAX_LAUNCH_SPLITS, CompiledKernel, PreparedLaunch
from ..launch.tensors import ALIGN_BYTES, LAYOUTS, InputError, dtype_name, logical_bhld
from ..model.config import Config
from ..model.problem import MAX_PAGE_SIZE, Problem
from ..model.space import load_space
from ..model.target import target_for_device
from .attention import Unsupported, _strict, dispatcher, generation, valid_scale
from .dispatch import MEMO_SIZE
from .kv_append import AppendPlan, plan_append

if TYPE_CHECKING:
    import torch

FAMILY = "decode"
# The families whose kernels split the keys and take a KV cache's layout (decode90: sm_90 only,
# pages of at least 16 rows; Space.reads says which cache kinds each reads).
SPLIT_KV_FAMILIES = ("decode", "decode90")
MAX_SPLITS = 128

_kernels: dict[tuple[str, int], CompiledKernel] = {}
_resolved: LruDict[tuple[Any, ...], tuple[CompiledKernel, int]] = LruDict(MEMO_SIZE)


@dataclass(frozen=True)
class _Prepared:
    """What a repeated call of one geometry reuses: the kernel's launch and, for a call that
    appends, the append's index constants."""

    launch: PreparedLaunch
    append: AppendPlan | None


# The geometry of every tensor argument and the flags -> what was made for them. Filled on
# the first call of each geometry; a later call checks pointer alignment, appends and launches
# (at B=1 the kernel runs for ~20 us: the host work of a call must stay well under that).
# Bounded: the least recently used geometries are dropped.
_prepared: LruDict[tuple[Any, ...], _Prepared] = LruDict(MEMO_SIZE)
_sm_counts: dict[int, int] = {}
_lock = threading.Lock()


def _check(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    block_table: torch.Tensor | None,
    layout: str,
) -> None:
    """Raise InputError for inputs no decode kernel can take, naming the argument."""
    import torch

    if layout not in LAYOUTS:
        raise InputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise InputError(f"{name} must be a 4-D tensor ({layout})")
        if t.device != q.device or t.dtype != q.dtype:
            raise InputError(
                f"{name} must share q's device and dtype ({q.device}, {q.dtype}); "
                f"got {t.device}, {t.dtype}"
            )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise InputError(
            f"q has dtype {q.dtype}; attention needs float16, bfloat16, float32 or float64"
        )
    if k_cache.shape != v_cache.shape:
        raise InputError(
            f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} "
            f"and {tuple(v_cache.shape)}"
        )
    qb, kb = logical_bhld(q, layout), logical_bhld(k_cache, layout)
    batch, heads_q, _, head_dim = qb.shape
    _, heads_kv, rows, kv_dim = kb.shape
    if kv_dim != head_dim or heads_kv < 1 or heads_q % heads_kv:
        raise InputError(
            f"q {tuple(q.shape)} and k_cache {tuple(k_cache.shape)} ({layout}) "
            "need one head dim and query heads a multiple of KV heads"
        )
    for name, index in (("cache_seqlens", cache_seqlens), ("block_table", block_table)):
        if index is not None and (
            not isinstance(index, torch.Tensor)
            or index.dtype != torch.int32
            or index.device != q.device
        ):
            raise InputError(f"{name} must be an int32 tensor on {q.device}")
    if cache_seqlens is not None and (
        cache_seqlens.shape != (batch,) or cache_seqlens.stride(0) != 1
    ):
        raise InputError(
            f"cache_seqlens must be a contiguous [B] = [{batch}] tensor, got "
            f"shape {tuple(cache_seqlens.shape)}"
        )
    if block_table is not None:
        if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.stride(1) != 1:
            raise InputError(
                f"block_table must be [B, max_pages] = [{batch}, n] with "
                f"contiguous rows, got shape {tuple(block_table.shape)}"
            )
        if rows < 1 or rows & (rows - 1) or rows > MAX_PAGE_SIZE:
            raise InputError(
                f"page_size (the cache's row dim, {rows}) must be a power of two "
                f"up to {MAX_PAGE_SIZE}"
            )
    elif kb.shape[0] != batch:
        raise InputError(
            f"a contiguous cache has q's batch ({batch}) first, got {tuple(k_cache.shape)}"
        )
    if (k_new is None) != (v_new is None):
        raise InputError("k_new and v_new come together")
    if k_new is not None and v_new is not None:
        if cache_seqlens is None:
            raise InputError("appending k_new/v_new needs cache_seqlens (where to write)")
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            if t.dim() != 4 or t.device != q.device or t.dtype != q.dtype:
                raise InputError(f"{name} must be 4-D ({layout}) on q's device and dtype")
            nb = logical_bhld(t, layout)
            if nb.shape[0] != batch or nb.shape[1] != heads_kv or nb.shape[3] != head_dim:
                raise InputError(
                    f"{name} must be [B, L_new, Hkv, D] ({layout}); got {tuple(t.shape)}"
                )


def _append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None,
    layout: str,
    plan: AppendPlan | None = None,
) -> torch.Tensor:
    """Write the new rows at each sequence's end (device-side indices, no host sync); returns
    the lengths after the append. `plan`: the memo's for this geometry (None: made here, for a
    one-off call). Rows past the cache's capacity fail torch's device-side bounds check rather
    than land elsewhere (kv_append says how)."""
    if plan is None:
        plan = plan_append(k_cache, v_cache, k_new, block_table, layout)
    return plan.write(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table)


# How much farther a problem tuned on a dense cache counts than one of the same cache kind, in
# `problem_distance`'s units (a factor of 4 in one size): a padded or paged cache is read by the
# same kernels, through the lengths or the block table, so a much nearer shape tuned dense says
# more than a far one tuned on the kind.
KIND_DISTANCE = 2.0


def decode_choice(problem: Problem, device: int) -> tuple[Config, str] | None:
    """The tuned split-KV config for a KV-cache problem and why (the tuning database's fastest
    measured config of the problem among the split-KV families that run on this GPU and read
    its cache kind, else that of the nearest tuned problem of its cache kind or, where nearer
    by more than KIND_DISTANCE, of the nearest tuned with the cache held dense); None: the
    decode family's default. The problem's seqlen_k is the cache's capacity per sequence."""
    cc = target_for_device(device).cc
    families = tuple(
        f
        for f in SPLIT_KV_FAMILIES
        if load_space(f).supports(cc) and load_space(f).reads(problem.kv_cache)
    )
    chosen = dispatcher().tuned_config(problem, device, families)
    if problem.kv_cache == "dense" or (chosen is not None and chosen.distance == 0.0):
        return None if chosen is None else (chosen.config, chosen.reason)
    dense = dispatcher().tuned_config(replace(problem, kv_cache="dense"), device, families)
    if dense is not None and (chosen is None or dense.distance + KIND_DISTANCE < chosen.distance):
        why = f"no {problem.kv_cache} cache tuned" if chosen is None else "nearer"
        return dense.config, f"{dense.reason}, tuned on a dense cache ({why})"
    return None if chosen is None else (chosen.config, chosen.reason)


def _sm_count(device: int) -> int:
    import torch

    if device not in _sm_counts:
        _sm_counts[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sm_counts[device]


def default_splits(
    kernel: CompiledKernel,
    *,
    batch: int,
    heads_q: int,
    heads_kv: int,
    seqlen_q: int,
    seqlen_k: int,
) -> int:
    """The untuned KV split count: enough splits for one wave (a CTA per SM), never more than
    the key tiles of the longest sequence. (The v1 search on the H200 picked about one wave on
    every Lq=1 problem: 16 splits at B=1, 2 at B=8, 1 at B=64, 8 KV heads.)"""
    group = heads_q // heads_kv if kernel.pack_gqa else 1
    m_blocks = math.ceil(seqlen_q * group / kernel.block_m)
    ctas = m_blocks * (heads_kv if kernel.pack_gqa else heads_q) * batch
    tiles = max(1, math.ceil(seqlen_k / kernel.block_n))
    wanted = math.ceil(_sm_count(kernel.device) / ctas)
    return max(1, min(wanted, tiles, MAX_SPLITS))


def decode_kernel(
    config: Config | None, *, head_dim: int, dtype: str, causal: bool, device: int
) -> CompiledKernel:
    """The loaded decode kernel of `config` (or the family's default for the problem): from
    the cubin cache or the kernel pack, else compiled on first use. `config` may also be one of
    decode90."""
    if config is not None and config.family not in SPLIT_KV_FAMILIES:
        raise InputError(
            f"config {config.to_json()} is not of a decode family ({', '.join(SPLIT_KV_FAMILIES)})"
        )
    space = load_space(FAMILY if config is None else config.family)
    values: dict[str, int | str | bool] = {"head_dim": head_dim, "dtype": dtype, "causal": causal}
    if config is None:
        config = space.heuristic(values)
        if config is None:
            raise InputError(f"the decode family has no default for head_dim {head_dim}")
    config = space.validate(config)
    if any(config[key] != value for key, value in values.items()):
        raise InputError(f"config {config.to_json()} does not fit this problem {values}")
    key = (config.digest, device)
    with _lock:
        kernel = _kernels.get(key)
    if kernel is None:
        target = target_for_device(device)
        reasons = space.violations(config, target)
        if reasons:
            raise InputError(
                f"{space.name_of(config)} cannot run on {target.name}: {'; '.join(reasons)}"
            )
        build = obtain(config, target)  # the cubin cache, the kernel pack, else nvcc
        if not build.ok:
            raise InputError(
                f"{space.name_of(config)} did not build: {build.status}: {build.message}"
            )
        kernel = CompiledKernel(build, device)
        with _lock:
            kernel = _kernels.setdefault(key, kernel)
    return kernel


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    layout: str = "blhd",
    num_splits: int | None = None,
    config: Config | None = None,
    strict: bool | None = None,
) -> Any:
    """softmax(scale * Q K^T [+ causal mask]) V of q (Lq a few tokens) against KV caches.

    q: [B, Lq, Hq, D] ("blhd") or [B, Hq, Lq, D] ("bhld"). Causal masking aligns each
    sequence's queries to the end of its keys (after the append). A sequence of length 0 gives
    O = 0 and LSE = -inf. Returns out (q's layout), and with return_lse the fp32 LSE
    [B, Hq, Lq]. Runs on the caller's current stream without synchronising, so it can be
    captured in a CUDA graph once the kernel is loaded; under torch.compile it is the custom op
    torch.ops.cute_autotune.attention_with_kvcache (which declares the caches mutated).
    """
    import torch

    # a plain expression, not a loop: this is a decode step's host path (grad is off in
    # generation, and is_grad_enabled answers first)
    if torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False)
        or getattr(k_cache, "requires_grad", False)
        or getattr(v_cache, "requires_grad", False)
        or getattr(k_new, "requires_grad", False)
        or getattr(v_new, "requires_grad", False)
    ):
        raise ValueError(
            "attention_with_kvcache() is forward-only (an inference path: it writes the caches "
            "in place); an input requires grad: call autotune.attention() for gradients, or "
            "run under torch.no_grad()"
        )
    if torch.compiler.is_compiling():
        out, lse = torch.ops.cute_autotune.attention_with_kvcache(
            q,
            k_cache,
            v_cache,
            k_new,
            v_new,
            cache_seqlens,
            block_table,
            causal,
            scale,
            return_lse,
            layout,
            num_splits,
            None if config is None else config.to_json(),
        )
        return (out, lse) if return_lse else out
    out, lse = _eager_with_kvcache(
        q,
        k_cache,
        v_cache,
        k_new=k_new,
        v_new=v_new,
        cache_seqlens=cache_seqlens,
        block_table=block_table,
        causal=causal,
        scale=scale,
        return_lse=return_lse,
        layout=layout,
        num_splits=num_splits,
        config=config,
        strict=_strict(strict),
    )
    return (out, lse) if return_lse else out


def _geometry(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    """What of a tensor argument a prepared launch depends on (AttributeError: no tensor)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _eager_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    layout: str = "blhd",
    num_splits: int | None = None,
    config: Config | None = None,
    strict: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    import torch

    try:
        key = (
            _geometry(q),
            _geometry(k_cache),
            _geometry(v_cache),
            _geometry(k_new),
            _geometry(v_new),
            _geometry(cache_seqlens),
            _geometry(block_table),
            causal,
            scale,
            layout,
            num_splits,
            config,
            generation(),
        )
        prepared = _prepared.get(key)
    except (AttributeError, TypeError):  # not tensors: _check below says which
        key, prepared = None, None
    # A hit stands for arguments checked when it was made (the key pins every shape, stride,
    # dtype and device); only what the key does not pin is checked again.
    if (
        prepared is not None
        and (causal is True or causal is False)
        and (return_lse is True or return_lse is False)
        and (num_splits is None or type(num_splits) is int)
        and not (q.data_ptr() | k_cache.data_ptr() | v_cache.data_ptr()) % ALIGN_BYTES
    ):
        return _attend(
            prepared,
            q,
            k_cache,
            v_cache,
            k_new,
            v_new,
            cache_seqlens,
            block_table,
            return_lse,
            layout,
        )
    _check(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, layout)
    if not isinstance(causal, bool):
        raise InputError(f"causal must be a bool, got {shown(causal)}")
    if scale is not None and not valid_scale(scale):
        raise InputError(f"scale must be a finite number > 0, got {shown(scale)}")
    if not isinstance(return_lse, bool):
        raise InputError(f"return_lse must be a bool, got {shown(return_lse)}")
    if num_splits is not None and (
        type(num_splits) is not int or not 1 <= num_splits <= MAX_LAUNCH_SPLITS
    ):
        raise InputError(
            f"num_splits must be an int from 1 to {MAX_LAUNCH_SPLITS} (None: "
            f"the tuned or default count), got {shown(num_splits)}"
        )
    scale = None if scale is None else float(scale)
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        reason = (
            f"tensors are on {q.device}"
            if q.device.type != "cuda"
            else f"dtype {q.dtype} (the kernels take fp16 and bf16)"
        )
        return _through_torch(
            q,
            k_cache,
            v_cache,
            k_new,
            v_new,
            cache_seqlens,
            block_table,
            causal=causal,
            scale=scale,
            return_lse=return_lse,
            layout=layout,
            reason=reason,
            strict=strict,
        )
    qb = logical_bhld(q, layout)
    batch, heads_q, seqlen_q, head_dim = (int(x) for x in qb.shape)
    kb = logical_bhld(k_cache, layout)
    heads_kv = int(kb.shape[1])
    seqlen_k = (
        int(block_table.shape[1]) * int(kb.shape[2])
        if block_table is not None
        else int(kb.shape[2])
    )
    # The cache's shape, how it is held and the batch (never the lengths: reading them would
    # synchronise)
    kind = (
        f"paged{int(kb.shape[2])}"
        if block_table is not None
        else "seqlens"
        if cache_seqlens is not None
        else "dense"
    )
    problem = Problem(
        batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype_name(q.dtype), causal, kind
    )
    kernel, splits = _resolve(problem, q.device.index or 0, config)
    launch = kernel.prepare_kvcache(
        q,
        k_cache,
        v_cache,
        block_table=block_table,
        scale=scale,
        layout=layout,
        num_splits=splits if num_splits is None else num_splits,
    )
    append = (
        plan_append(k_cache, v_cache, k_new, block_table, layout) if k_new is not None else None
    )
    prepared = _Prepared(launch, append)
    if key is not None:
        _prepared[key] = prepared
    return _attend(
        prepared, q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, return_lse, layout
    )


def _attend(
    prepared: _Prepared,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    block_table: torch.Tensor | None,
    return_lse: bool,
    layout: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The append, if any, then the prepared launch (arguments already checked)."""
    if k_new is not None and v_new is not None and cache_seqlens is not None:
        cache_seqlens = _append(
            k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, layout, prepared.append
        )
    return prepared.launch.run(
        q, k_cache, v_cache, return_lse=return_lse, seqlens=cache_seqlens, block_table=block_table
    )


_warned: set[str] = set()


def _through_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    block_table: torch.Tensor | None,
    *,
    causal: bool,
    scale: float | None,
    return_lse: bool,
    layout: str,
    reason: str,
    strict: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The call computed by torch in fp32 (inputs checked): the append, then every sequence
    against its own keys at once, masked by its length (read on the device, never the host)."""
    import warnings

    import torch

    if strict:
        raise Unsupported(
            f"cute-autotune cannot run this attention_with_kvcache: {reason} (strict mode)"
        )
    key = reason.split(" ")[0]
    if key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"cute-autotune: attention_with_kvcache computed by torch: {reason}", stacklevel=4
        )
    if k_new is not None and v_new is not None and cache_seqlens is not None:
        cache_seqlens = _append(k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, layout)
    qb, kb, vb = (logical_bhld(t, layout) for t in (q, k_cache, v_cache))
    batch, heads_q, seqlen_q, head_dim = qb.shape
    heads_kv = kb.shape[1]
    if block_table is not None:  # [pages, Hkv, page, D] -> each sequence's [Hkv, rows, D]
        kb, vb = (
            t[block_table.long()].permute(0, 2, 1, 3, 4).reshape(batch, heads_kv, -1, head_dim)
            for t in (kb, vb)
        )
    rows = kb.shape[2]
    lengths = (
        torch.full((batch,), rows, device=q.device)
        if cache_seqlens is None
        else cache_seqlens.long().clamp(0, rows)
    ).view(batch, 1, 1, 1, 1)
    group = heads_q // heads_kv
    qf = qb.float().reshape(batch, heads_kv, group, seqlen_q, head_dim)
    # rows past a sequence's length hold anything (NaN included): zeroed, as 0 x NaN is NaN
    held = torch.arange(rows, device=q.device).view(1, 1, rows, 1) < lengths.view(batch, 1, 1, 1)
    kf, vf = (t.float().masked_fill(~held, 0.0) for t in (kb, vb))
    real_scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    scores = torch.einsum("bhgqd,bhkd->bhgqk", qf, kf) * real_scale
    cols = torch.arange(rows, device=q.device).view(1, 1, 1, 1, rows)
    hidden = cols >= lengths
    if causal:  # query i sees the keys up to length - Lq + i (aligned to the end)
        query = torch.arange(seqlen_q, device=q.device).view(1, 1, 1, seqlen_q, 1)
        hidden = hidden | (cols > lengths - seqlen_q + query)
    scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.nan_to_num(torch.exp(scores - lse[..., None]), nan=0.0)
    out = (
        torch.einsum("bhgqk,bhkd->bhgqd", weights, vf)
        .reshape(batch, heads_q, seqlen_q, head_dim)
        .to(q.dtype)
    )
    out = out if layout == "bhld" else out.transpose(1, 2)
    return out, lse.reshape(batch, heads_q, seqlen_q) if return_lse else None


def _resolve(problem: Problem, device: int, config: Config | None) -> tuple[CompiledKernel, int]:
    """The kernel for a KV-cache problem and the split count of a call that gives none: the
    config given (its own count), else the tuned one (`decode_choice`, its own count), else the
    family's default (the untuned rule). Made once per (problem, device, config) and
    dispatcher (`configure` makes a new one), so a repeated call does no lookup, validation or
    database visit."""
    key = (problem, device, config, generation())
    hit = _resolved.get(key)
    if hit is not None:
        return hit
    if config is None:
        tuned = decode_choice(problem, device)
        config = tuned[0] if tuned is not None else None
    kernel = decode_kernel(
        config,
        head_dim=problem.head_dim,
        dtype=problem.dtype,
        causal=problem.causal,
        device=device,
    )
    splits = (
        kernel.num_splits
        if config is not None
        else default_splits(
            kernel,
            batch=problem.batch,
            heads_q=problem.heads_q,
            heads_kv=problem.heads_kv,
            seqlen_q=problem.seqlen_q,
            seqlen_k=problem.seqlen_k,
        )
    )
    with _lock:
        return _resolved.setdefault(key, (kernel, splits))


from . import op as _op  # noqa: E402,F401  registers torch.ops.cute_autotune.attention_with_kvcache
