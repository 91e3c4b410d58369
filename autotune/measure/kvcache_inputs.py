"""KV-cache inputs as serving engines hold them, for the validator's KV-cache cases and the
tests: padded contiguous caches and paged ones (pages in shuffled order), per-sequence lengths,
and every cache slot past a sequence's length poisoned with NaN (it must never reach the
output)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..model.problem import Problem

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class KVCase:
    """A problem (its seqlen_k is the cache's capacity per sequence: Lk_max, or pages x page
    size when paged) and how its KV cache is held."""

    problem: Problem
    lengths: tuple[int, ...] | None  # cache_seqlens, None = all `capacity` rows
    page_size: int = 0  # 0 = contiguous
    layout: str = "blhd"
    new: int = 0  # rows appended through k_new / v_new

    @classmethod
    def make(
        cls,
        batch: int,
        heads_q: int,
        heads_kv: int,
        seqlen_q: int,
        capacity: int,
        lengths: tuple[int, ...] | None,
        *,
        head_dim: int = 128,
        dtype: str = "bf16",
        causal: bool = False,
        page_size: int = 0,
        layout: str = "blhd",
        new: int = 0,
    ) -> KVCase:
        problem = Problem(batch, heads_q, heads_kv, seqlen_q, capacity, head_dim, dtype, causal)
        return cls(problem, lengths, page_size, layout, new)

    def of_class(self, head_dim: int, dtype: str, causal: bool) -> KVCase:
        """The same case for another problem class (a kernel's head dim, dtype, causality)."""
        return replace(
            self, problem=replace(self.problem, head_dim=head_dim, dtype=dtype, causal=causal)
        )

    @property
    def capacity(self) -> int:
        return self.problem.seqlen_k

    @property
    def head_dim(self) -> int:
        return self.problem.head_dim

    @property
    def dtype(self) -> str:
        return self.problem.dtype

    @property
    def causal(self) -> bool:
        return self.problem.causal

    def describe(self) -> str:
        p = self.problem
        kind = f"paged{self.page_size}" if self.page_size else "contiguous"
        lengths = "full" if self.lengths is None else ",".join(map(str, self.lengths))
        return (
            f"B{p.batch} H{p.heads_q}/{p.heads_kv} Lq{p.seqlen_q} cap{self.capacity} "
            f"len[{lengths}] D{p.head_dim} {p.dtype} {'causal ' if p.causal else ''}{kind} "
            f"{self.layout} new{self.new}"
        )


@dataclass
class KVInputs:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor | None
    block_table: torch.Tensor | None
    k_new: torch.Tensor | None
    v_new: torch.Tensor | None


def _shape(layout: str, outer: int, heads: int, rows: int, dim: int) -> tuple[int, ...]:
    return (outer, rows, heads, dim) if layout == "blhd" else (outer, heads, rows, dim)


def make_kv_inputs(case: KVCase, device: str, seed: int = 0) -> KVInputs:
    """Random inputs of `case` (drawn on the CPU from `seed`, so every device gets the same):
    cache rows a sequence does not hold are NaN (before an append the appended rows are NaN
    too: the append must overwrite them)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    p = case.problem
    dtype = torch.float16 if p.dtype == "fp16" else torch.bfloat16

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    lengths = list(case.lengths) if case.lengths is not None else [case.capacity] * p.batch
    held = [n - case.new for n in lengths]  # rows already in the cache before the append
    assert all(0 <= n <= case.capacity for n in held) and all(n <= case.capacity for n in lengths)
    q = randn(*_shape(case.layout, p.batch, p.heads_q, p.seqlen_q, p.head_dim))
    seq_shape = _shape(case.layout, p.batch, p.heads_kv, case.capacity, p.head_dim)
    k_seq, v_seq = randn(*seq_shape), randn(*seq_shape)
    row_axis = 1 if case.layout == "blhd" else 2
    for t in (k_seq, v_seq):  # poison what no sequence holds
        for b, n in enumerate(held):
            t.select(0, b).narrow(row_axis - 1, n, case.capacity - n).fill_(float("nan"))
    k_new = v_new = None
    if case.new:
        new_shape = _shape(case.layout, p.batch, p.heads_kv, case.new, p.head_dim)
        k_new, v_new = randn(*new_shape), randn(*new_shape)
    block_table = None
    k_cache, v_cache = k_seq, v_seq
    if case.page_size:
        per_seq = case.capacity // case.page_size
        assert per_seq * case.page_size == case.capacity
        total = p.batch * per_seq + 3  # spare pages, NaN, that no table points at
        order = torch.randperm(total, generator=gen)[: p.batch * per_seq]
        table = order.view(p.batch, per_seq)
        block_table = table.to(device=device, dtype=torch.int32)
        page_shape = _shape(case.layout, total, p.heads_kv, case.page_size, p.head_dim)
        k_cache = torch.full(page_shape, float("nan"), device=device, dtype=dtype)
        v_cache = torch.full(page_shape, float("nan"), device=device, dtype=dtype)
        for src, dst in ((k_seq, k_cache), (v_seq, v_cache)):
            for b in range(p.batch):
                for i in range(per_seq):
                    rows = src.select(0, b).narrow(
                        row_axis - 1, i * case.page_size, case.page_size
                    )
                    dst.select(0, int(table[b, i])).copy_(rows)
    seqlens = None
    if case.lengths is not None or case.new:
        seqlens = torch.tensor(held if case.new else lengths, dtype=torch.int32, device=device)
    return KVInputs(q, k_cache, v_cache, seqlens, block_table, k_new, v_new)
