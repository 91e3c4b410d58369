"""The append of `attention_with_kvcache`: k_new/v_new written at each sequence's end, in as few
torch ops as the cache's strides allow.

Eager decoding pays the host for every op dispatched (5-15 us each on CUDA), and the append ran
two `index_put_`s with three broadcast index tensors each: ~160 us of host time a call
(benchmarks/NOTES.md, "A decode call's host cost"), more than the attention kernel. Whatever
depends only on the geometry (aranges, per-(sequence, head) row offsets, the cache's rows
view) is made once per geometry in an `AppendPlan`, which the kvcache memo keeps beside the
launch. A call then computes one flat row index for the new rows and copies K and V with one
`index_copy_` each into the caches viewed as [rows, D].

A call reads nothing on the host and every op's shape is fixed by the geometry, so the append
stays CUDA-graph capturable (the plan's constants are copied from the host once per geometry,
outside any capture: `_on_device`). A position past the cache's capacity must fail (a device-side
assert on CUDA, an IndexError on the CPU) rather than write elsewhere; how each index keeps
that is said where it is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..launch.tensors import logical_bhld

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class _RowsView:
    """A cache as [rows, D] (as_strided over the cache's own extent): every (sequence or page,
    head, position) cell is one row, and no two cells share one."""

    shape: tuple[int, int]
    stride: tuple[int, int]


@dataclass(frozen=True)
class _SequenceRows:
    """Rows of a contiguous cache: base[b, h] + row_at[pos]. Looking the position up with
    `gather` bounds-checks it against the capacity per sequence: with one flat index, a
    position past the capacity would otherwise land in the next head's or sequence's rows."""

    base: torch.Tensor  # the grid with a 1 on the token axis: b and h offsets in rows
    row_at: torch.Tensor  # [Lk_max] offsets in rows, expanded over the batch on the grid's axes
    token_axis: int

    def rows(self, pos: torch.Tensor, block_table: torch.Tensor | None) -> torch.Tensor:
        import torch

        return self.base + torch.gather(self.row_at, self.token_axis, pos)


@dataclass(frozen=True)
class _PagedRows:
    """Rows of a paged cache: page * page_rows + h offset + (pos % page_size) * slot_rows.
    `gather` on the block table bounds-checks the position against the table's pages. A page
    id outside [0, num_pages) lands outside the rows view, so `index_copy_` refuses it (the
    page stride is larger than a page's extent: `_paged_rows` checks it)."""

    head_base: torch.Tensor  # the grid with 1 on the batch and token axes: h offsets in rows
    table_shape: tuple[int, int, int]  # the block table on the grid's axes
    token_axis: int
    page_shift: int  # log2(page_size): page sizes are powers of two
    page_rows: int
    slot_rows: int

    def rows(self, pos: torch.Tensor, block_table: torch.Tensor | None) -> torch.Tensor:
        import torch

        assert block_table is not None
        page = torch.gather(
            block_table.view(self.table_shape), self.token_axis, pos >> self.page_shift
        )
        in_page = torch.add(
            self.head_base, pos & ((1 << self.page_shift) - 1), alpha=self.slot_rows
        )
        return torch.add(in_page, page, alpha=self.page_rows)


@dataclass(frozen=True)
class AppendPlan:
    """The append for one geometry of caches, new rows and block table. `rows_view` and
    `index` are None for caches no rows view covers (strides that are not multiples of one
    row stride, or that overlap): those take the per-dimension `index_put_`."""

    layout: str
    new: int
    seqlens_shape: tuple[int, int, int]  # cache_seqlens on the grid's axes: [B, 1, 1]
    steps: torch.Tensor  # 0..new-1 (int64) on the grid's token axis
    rows_view: _RowsView | None
    index: _SequenceRows | _PagedRows | None

    def write(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        cache_seqlens: torch.Tensor,
        block_table: torch.Tensor | None,
    ) -> torch.Tensor:
        """Write the new rows at each sequence's end; the lengths after the append."""
        if self.rows_view is None or self.index is None:
            _write_by_dimension(
                k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, self.layout
            )
            return cache_seqlens + self.new
        pos = cache_seqlens.view(self.seqlens_shape) + self.steps
        rows = self.index.rows(pos, block_table).view(-1)
        shape, stride = self.rows_view.shape, self.rows_view.stride
        for cache, src in ((k_cache, k_new), (v_cache, v_new)):
            # The index follows k_new's own dim order, so the source is a view of it
            # whenever its first three dims merge (a copy otherwise).
            cache.as_strided(shape, stride).index_copy_(0, rows, src.reshape(-1, shape[1]))
        return cache_seqlens + self.new


def plan_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    block_table: torch.Tensor | None,
    layout: str,
) -> AppendPlan:
    """The append's plan for these geometries (the arguments already checked)."""
    import torch

    grid = tuple(int(n) for n in k_new.shape[:3])  # k_new's (batch, token, head) in its order
    token_axis = 1 if layout == "blhd" else 2
    new = grid[token_axis]
    steps = _on_device(torch.arange(new).view(_on_axis(token_axis, new)), k_cache.device)
    view = _rows_view(k_cache, v_cache, layout)
    index: _SequenceRows | _PagedRows | None = None
    if view is not None:
        index = (
            _sequence_rows(k_cache, token_axis, layout, view)
            if block_table is None
            else _paged_rows(k_cache, block_table, token_axis, layout, view)
        )
    return AppendPlan(
        layout, new, (grid[0], 1, 1), steps, view if index is not None else None, index
    )


def _on_axis(axis: int, n: int, batch: int = 1) -> tuple[int, int, int]:
    """A grid shape with `n` on `axis` (1 or 2), `batch` first and 1 on the other axis."""
    return (batch, n, 1) if axis == 1 else (batch, 1, n)


def _on_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A constant made on the host, copied to `device` with a blocking copy (a stream sync,
    once per geometry). Made by a kernel instead, it could be read by a call on another stream
    before it ran, and inside a CUDA-graph capture it would hold nothing until the graph's
    first replay; the copy refuses to run there instead."""
    return values.to(device)


def _rows_view(k_cache: torch.Tensor, v_cache: torch.Tensor, layout: str) -> _RowsView | None:
    """The [rows, D] view both caches share, or None: the head dim contiguous, the outer
    strides multiples of the smallest (at least D) and not overlapping, the same in K and V."""
    if k_cache.stride() != v_cache.stride():
        return None
    kb = logical_bhld(k_cache, layout)
    head_dim = int(kb.shape[3])
    if kb.stride(3) != 1 and head_dim > 1:
        return None
    outer = sorted((int(kb.stride(d)), int(kb.shape[d])) for d in range(3) if kb.shape[d] > 1)
    row = outer[0][0] if outer else head_dim
    if row < head_dim or any(stride % row for stride, _ in outer):
        return None
    if any(s_next < s * n for (s, n), (s_next, _) in zip(outer, outer[1:], strict=False)):
        return None
    rows = 1 + sum((n - 1) * s // row for s, n in outer)
    return _RowsView((rows, head_dim), (row, 1))


def _sequence_rows(
    cache: torch.Tensor, token_axis: int, layout: str, view: _RowsView
) -> _SequenceRows:
    import torch

    kb = logical_bhld(cache, layout)
    row = view.stride[0]
    batch, heads, capacity = int(kb.shape[0]), int(kb.shape[1]), int(kb.shape[2])
    head_axis = 3 - token_axis
    b = torch.arange(batch).view(batch, 1, 1) * (kb.stride(0) // row)
    h = torch.arange(heads).view(_on_axis(head_axis, heads)) * (kb.stride(1) // row)
    row_at = torch.arange(capacity).view(_on_axis(token_axis, capacity)) * (kb.stride(2) // row)
    return _SequenceRows(
        _on_device(b + h, cache.device),
        _on_device(row_at, cache.device).expand(_on_axis(token_axis, capacity, batch)),
        token_axis,
    )


def _paged_rows(
    cache: torch.Tensor, block_table: torch.Tensor, token_axis: int, layout: str, view: _RowsView
) -> _PagedRows | None:
    """None where a page id past the pages could still land on a row of the view: the page
    stride must exceed a page's extent (pages outermost, the case of every paged cache
    engines hold) and be a multiple of the row stride."""
    import torch

    kb = logical_bhld(cache, layout)
    row = view.stride[0]
    heads, page_size = int(kb.shape[1]), int(kb.shape[2])
    page_stride, head_stride, slot_stride = (int(kb.stride(d)) for d in range(3))
    if (
        page_stride % row
        or page_stride <= (heads - 1) * head_stride + (page_size - 1) * slot_stride
    ):
        return None
    head_axis = 3 - token_axis
    h = torch.arange(heads).view(_on_axis(head_axis, heads)) * (head_stride // row)
    table_shape = _on_axis(token_axis, int(block_table.shape[1]), int(block_table.shape[0]))
    return _PagedRows(
        _on_device(h, cache.device),
        table_shape,
        token_axis,
        page_size.bit_length() - 1,
        page_stride // row,
        slot_stride // row,
    )


def _write_by_dimension(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None,
    layout: str,
) -> None:
    """The append for caches no rows view covers: `index_put_` with one index per dimension,
    each bounds-checked by torch."""
    import torch

    kn = logical_bhld(k_new, layout)
    batch, heads_kv, new, _ = kn.shape
    device = k_cache.device
    pos = cache_seqlens.long()[:, None] + torch.arange(new, device=device)[None, :]  # [B, new]
    b_idx = torch.arange(batch, device=device)[:, None, None]
    h_idx = torch.arange(heads_kv, device=device)[None, :, None]
    if block_table is None:
        where = (b_idx, h_idx, pos[:, None, :])
    else:
        page_size = logical_bhld(k_cache, layout).shape[2]
        page = torch.gather(block_table.long(), 1, pos // page_size)
        where = (page[:, None, :], h_idx, (pos % page_size)[:, None, :])
    for cache, rows in ((k_cache, k_new), (v_cache, v_new)):
        logical_bhld(cache, layout).index_put_(where, logical_bhld(rows, layout))
