"""The validator's KV-cache cases, for kernels with split-KV (the decode family), run after the
plain cases of measure.validate: per-sequence lengths of 0, 1, a tail and the cache's end, more
splits than key tiles, paged caches with pages in shuffled order and lengths that are not a
multiple of the page, (query, head) rows that are not a multiple of the tile, both layouts. Every
cache slot a sequence does not hold is NaN (it must never reach the output), the output and LSE
buffers start as NaN (every element must be written), two launches must agree bit for bit.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..launch.tensors import logical_bhld
from .kvcache_inputs import KVCase, make_kv_inputs
from .reference import reference_with_kvcache
from .validate import CaseResult, judge

if TYPE_CHECKING:
    import torch

    from ..launch.kernel import CompiledKernel

# (name, case with the head dim, dtype and causality the kernel's, splits: 0 = the config's)
KV_CASES: tuple[tuple[str, KVCase, int], ...] = (
    ("lengths_0_1_tail_end", KVCase.make(4, 8, 1, 3, 777, (0, 1, 500, 777)), 0),
    ("splits_more_than_tiles", KVCase.make(1, 12, 4, 5, 100, None), 64),
    ("paged16_shuffled", KVCase.make(3, 16, 2, 2, 512, (5, 333, 0), page_size=16), 0),
    (
        "paged64_bhld_lq8",
        KVCase.make(2, 32, 8, 8, 1024, (1000, 64), page_size=64, layout="bhld"),
        4,
    ),
    ("mha_bhld_lq16", KVCase.make(3, 4, 4, 16, 300, (300, 17, 2), layout="bhld"), 2),
    ("gqa5_rows_not_a_tile_multiple", KVCase.make(2, 10, 2, 3, 640, None), 0),
    # Full caches: 128 packed rows of GQA 8 at Lq=16 (one wgmma tile pair), and MQA's 96 rows.
    ("gqa8_lq16_bhld_full_cache", KVCase.make(2, 16, 2, 16, 1000, None, layout="bhld"), 4),
    ("mqa32_lq3_full_cache", KVCase.make(1, 32, 1, 3, 333, None), 2),
)


def check_kv_case(
    kernel: CompiledKernel, name: str, case: KVCase, splits: int, seed: int, device: torch.device
) -> CaseResult:
    import torch

    inputs = make_kv_inputs(case, str(device), seed)
    problem = f"{case.describe()} splits {splits or kernel.num_splits}"

    def fail(reason: str, **stats: float) -> CaseResult:
        return CaseResult(name, problem, False, reason, **stats)

    runs = []
    for _ in range(2):
        out = torch.full_like(inputs.q, math.nan)
        lse = torch.full(
            logical_bhld(inputs.q, case.layout).shape[:3],
            math.nan,
            dtype=torch.float32,
            device=device,
        )
        try:
            kernel.with_kvcache(
                inputs.q,
                inputs.k_cache,
                inputs.v_cache,
                cache_seqlens=inputs.cache_seqlens,
                block_table=inputs.block_table,
                layout=case.layout,
                out=out,
                lse=lse,
                num_splits=splits or None,
            )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:  # a launch error is this case's result
            return fail(f"launch failed: {type(exc).__name__}: {exc}")
        runs.append((out, lse))
    (out, lse), (out2, lse2) = runs
    if torch.isnan(out).any():
        return fail(
            f"{int(torch.isnan(out).sum())} output elements are NaN (unwritten, or a "
            "poisoned cache slot leaked)"
        )
    if torch.isnan(lse).any():
        return fail(f"{int(torch.isnan(lse).sum())} LSE entries are NaN (unwritten)")
    if not (
        torch.equal(out.view(torch.int16), out2.view(torch.int16))
        and torch.equal(lse.view(torch.int32), lse2.view(torch.int32))
    ):
        return fail("two launches on the same inputs differ (a race)")

    ref, ref_lse = reference_with_kvcache(
        inputs.q,
        inputs.k_cache,
        inputs.v_cache,
        cache_seqlens=inputs.cache_seqlens,
        block_table=inputs.block_table,
        causal=case.causal,
        scale=1.0 / math.sqrt(case.head_dim),
        layout=case.layout,
    )
    return judge(
        name, problem, logical_bhld(out, case.layout).float(), ref, lse, ref_lse, case.dtype
    )


def validate_kvcache(
    kernel: CompiledKernel,
    *,
    head_dim: int,
    dtype: str,
    causal: bool,
    device: torch.device,
    seed: int,
    reads_caches: bool = True,
) -> tuple[CaseResult, ...]:
    """The KV-cache cases on a split-KV kernel of the problem class (head_dim, dtype, causal);
    without `reads_caches` (a family that reads contiguous full caches only, decode90) only the
    cases whose cache is full and contiguous."""
    return tuple(
        check_kv_case(
            kernel, name, case.of_class(head_dim, dtype, causal), splits, seed + i, device
        )
        for i, (name, case, splits) in enumerate(KV_CASES)
        if reads_caches or (case.lengths is None and case.page_size == 0)
    )
