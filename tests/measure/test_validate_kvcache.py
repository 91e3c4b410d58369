"""The validator's KV-cache cases can fail: a kernel computed by the reference itself passes
them all, and kernels that ignore the lengths, read a stale (NaN) slot, leave a row unwritten or
get the LSE of an empty sequence wrong each fail with the reason named (CPU, no GPU)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from autotune.launch.tensors import logical_bhld
from autotune.measure.reference import reference_with_kvcache
from autotune.measure.validate_kvcache import KV_CASES, check_kv_case


class ReferenceKernel:
    """with_kvcache computed by the fp32 reference, with a fault switched on by name."""

    num_splits = 1

    def __init__(self, causal: bool, fault: str = "") -> None:
        self.causal, self.fault = causal, fault

    def with_kvcache(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        cache_seqlens: torch.Tensor | None,
        block_table: torch.Tensor | None,
        layout: str,
        out: torch.Tensor,
        lse: torch.Tensor,
        **_: Any,
    ) -> Any:
        lengths = cache_seqlens
        if self.fault == "ignores_lengths" and lengths is not None:
            lengths = torch.full_like(
                lengths,
                logical_bhld(k, layout).shape[2]
                * (1 if block_table is None else block_table.shape[1]),
            )
        ref, ref_lse = reference_with_kvcache(
            q,
            k,
            v,
            cache_seqlens=lengths,
            block_table=block_table,
            causal=self.causal,
            scale=1 / math.sqrt(q.shape[-1]),
            layout=layout,
        )
        if self.fault == "empty_lse_zero":
            ref_lse = torch.nan_to_num(ref_lse, neginf=0.0)
        logical_bhld(out, layout).copy_(ref)
        lse.copy_(ref_lse)
        if self.fault == "unwritten_row":
            logical_bhld(out, layout)[0, 0, -1] = math.nan
        return out, lse


def _case(name: str) -> tuple[Any, int]:
    case, splits = next((c, s) for n, c, s in KV_CASES if n == name)
    return case.of_class(32, "fp16", False), splits


def test_the_reference_passes_every_case() -> None:
    for name, case, splits in KV_CASES:
        result = check_kv_case(
            ReferenceKernel(False),
            name,
            case.of_class(32, "fp16", False),
            splits,
            1,
            torch.device("cpu"),
        )
        assert result.passed, (name, result.reason)


@pytest.mark.parametrize(
    "fault, case, needle",
    [
        ("ignores_lengths", "lengths_0_1_tail_end", "NaN"),
        ("unwritten_row", "paged16_shuffled", "NaN"),
        ("empty_lse_zero", "lengths_0_1_tail_end", "-inf"),
    ],
)
def test_a_faulty_kernel_fails(fault: str, case: str, needle: str) -> None:
    kv_case, splits = _case(case)
    result = check_kv_case(
        ReferenceKernel(False, fault), case, kv_case, splits, 1, torch.device("cpu")
    )
    assert not result.passed and needle in result.reason, result


def test_a_family_that_reads_full_caches_only_gets_the_full_cache_cases() -> None:
    """A split-KV family that reads contiguous full caches only (`kv_caches = false`) gets the
    KV cases with no lengths and no pages, every such case of the set; a family that reads
    caches (decode, decode90) gets them all."""
    from autotune.measure.validate_kvcache import validate_kvcache

    full = validate_kvcache(
        ReferenceKernel(False),
        head_dim=32,
        dtype="fp16",
        causal=False,
        device=torch.device("cpu"),
        seed=1,
        reads_caches=False,
    )
    wanted = [n for n, c, _ in KV_CASES if c.lengths is None and c.page_size == 0]
    assert [r.case for r in full] == wanted and len(wanted) >= 3
    assert all(r.passed for r in full)
    every = validate_kvcache(
        ReferenceKernel(False),
        head_dim=32,
        dtype="fp16",
        causal=False,
        device=torch.device("cpu"),
        seed=1,
    )
    assert [r.case for r in every] == [n for n, _, _ in KV_CASES]
