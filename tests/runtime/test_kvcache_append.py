"""The KV-cache append (runtime/kv_append.py) on CPU tensors: the flat-index path writes what a
row-by-row loop writes, in both layouts, contiguous, sliced and paged caches, and touches
nothing else; caches no rows view covers take the per-dimension path and write the same; a
position past the capacity raises before anything is written; and a call dispatches fewer
torch ops than the per-dimension path."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.launch.tensors import logical_bhld
from autotune.runtime.kv_append import AppendPlan, _write_by_dimension, plan_append
from autotune.runtime.kvcache import _append

BATCH, HEADS, HEAD_DIM, CAPACITY = 3, 3, 8, 128


@dataclass
class Append:
    """One append's arguments; `k_buffer`/`v_buffer` are what the caches were cut from (the
    test checks the whole buffer, so writes outside the cache show)."""

    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    cache_seqlens: torch.Tensor
    block_table: torch.Tensor | None
    layout: str

    def args(self) -> tuple[Any, ...]:
        return (
            self.k_cache,
            self.v_cache,
            self.k_new,
            self.v_new,
            self.cache_seqlens,
            self.block_table,
            self.layout,
        )

    def clone(self) -> Append:
        """The same append into fresh copies of the buffers (same strides and offsets)."""
        k_buffer, v_buffer = self.k_buffer.clone(), self.v_buffer.clone()

        def same_view(buffer: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
            return buffer.as_strided(cache.shape, cache.stride(), cache.storage_offset())

        return Append(
            k_buffer,
            v_buffer,
            same_view(k_buffer, self.k_cache),
            same_view(v_buffer, self.v_cache),
            self.k_new,
            self.v_new,
            self.cache_seqlens,
            self.block_table,
            self.layout,
        )


def _dims(layout: str, outer: int, heads: int, rows: int, dim: int) -> tuple[int, ...]:
    return (outer, rows, heads, dim) if layout == "blhd" else (outer, heads, rows, dim)


def _cut(buffer: torch.Tensor, layout: str, how: str, outer: int, rows: int) -> torch.Tensor:
    """The cache inside a NaN buffer: all of it ("contiguous"), or a slice past its first
    sequence or page, its first head and its first D columns, and short of its last rows
    ("sliced"), or its head dim every other element ("strided D": no rows view)."""
    if how == "contiguous":
        return buffer
    if how == "strided D":
        return buffer[..., ::2]
    row_axis, head_axis = (1, 2) if layout == "blhd" else (2, 1)
    return (
        buffer[1 : 1 + outer]
        .narrow(head_axis, 1, HEADS)
        .narrow(row_axis, 0, rows)[..., 2 : 2 + HEAD_DIM]
    )


def _buffer_shape(layout: str, how: str, outer: int, rows: int) -> tuple[int, ...]:
    if how == "contiguous":
        return _dims(layout, outer, HEADS, rows, HEAD_DIM)
    if how == "strided D":
        return _dims(layout, outer, HEADS, rows, 2 * HEAD_DIM)
    return _dims(layout, outer + 2, HEADS + 2, rows + 5, HEAD_DIM + 4)


def make_append(
    layout: str, how: str, page_size: int, new: int, lengths: tuple[int, ...], seed: int = 0
) -> Append:
    """An append of `new` rows after `lengths` into NaN caches, contiguous ([B, CAPACITY]) or
    paged (a shuffled block table over spare pages)."""
    gen = torch.Generator().manual_seed(seed)
    block_table = None
    outer, rows = BATCH, CAPACITY
    if page_size:
        per_seq = CAPACITY // page_size
        outer, rows = BATCH * per_seq + 2, page_size  # two pages no table points at
        order = torch.randperm(outer, generator=gen)[: BATCH * per_seq]
        block_table = order.view(BATCH, per_seq).to(torch.int32)
    shape = _buffer_shape(layout, how, outer, rows)
    k_buffer = torch.full(shape, float("nan"), dtype=torch.float16)
    v_buffer = torch.full(shape, float("nan"), dtype=torch.float16)
    new_shape = _dims(layout, BATCH, HEADS, new, HEAD_DIM)
    return Append(
        k_buffer,
        v_buffer,
        _cut(k_buffer, layout, how, outer, rows),
        _cut(v_buffer, layout, how, outer, rows),
        torch.randn(new_shape, generator=gen).half(),
        torch.randn(new_shape, generator=gen).half(),
        torch.tensor(lengths, dtype=torch.int32),
        block_table,
        layout,
    )


def append_row_by_row(x: Append) -> None:
    """The reference: every new row written on its own, where its position says."""
    for cache, new in ((x.k_cache, x.k_new), (x.v_cache, x.v_new)):
        cb, nb = logical_bhld(cache, x.layout), logical_bhld(new, x.layout)
        page_size = cb.shape[2]
        for b in range(nb.shape[0]):
            for j in range(nb.shape[2]):
                pos = int(x.cache_seqlens[b]) + j
                if x.block_table is None:
                    cb[b, :, pos] = nb[b, :, j]
                else:
                    page = int(x.block_table[b, pos // page_size])
                    cb[page, :, pos % page_size] = nb[b, :, j]


def assert_same_writes(x: Append, append: Callable[[Append], torch.Tensor]) -> None:
    expected = x.clone()
    append_row_by_row(expected)
    lengths = append(x)
    new = logical_bhld(x.k_new, x.layout).shape[2]
    assert lengths.dtype == torch.int32
    assert lengths.tolist() == [n + new for n in x.cache_seqlens.tolist()]
    for got, want in ((x.k_buffer, expected.k_buffer), (x.v_buffer, expected.v_buffer)):
        # the whole buffer: the new rows, and NaN everywhere the reference did not write
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        assert int((~got.isnan()).sum()) == BATCH * HEADS * new * HEAD_DIM


def _lengths(page_size: int, new: int) -> tuple[int, ...]:
    """Empty, across a page boundary (a row boundary when contiguous), and full after."""
    edge = (page_size or 64) - 2
    return (0, edge, CAPACITY - new)


CACHES = [("contiguous", 0), ("sliced", 0), ("contiguous", 16), ("sliced", 16), ("contiguous", 64)]


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize(("how", "page_size"), CACHES)
@pytest.mark.parametrize("new", [1, 5])
def test_flat_index_writes_what_a_loop_writes(
    layout: str, how: str, page_size: int, new: int
) -> None:
    x = make_append(layout, how, page_size, new, _lengths(page_size, new))
    plan = plan_append(x.k_cache, x.v_cache, x.k_new, x.block_table, layout)
    assert plan.index is not None  # the flat path, not the per-dimension one
    assert_same_writes(x, lambda a: _append(*a.args(), plan))


def _pages_not_outermost(layout: str, new: int) -> Append:
    """A paged cache whose pages interleave (the page stride is a row's): a page id past
    the pages could land on another page's row, so it takes the per-dimension path."""
    x = make_append(layout, "contiguous", 16, new, _lengths(16, new))
    swap = (1, 0, 2, 3) if layout == "blhd" else (2, 1, 0, 3)

    def interleaved(buffer: torch.Tensor) -> torch.Tensor:
        return buffer.permute(swap).contiguous().permute(swap)

    k_buffer, v_buffer = interleaved(x.k_buffer), interleaved(x.v_buffer)
    return Append(
        k_buffer,
        v_buffer,
        k_buffer,
        v_buffer,
        x.k_new,
        x.v_new,
        x.cache_seqlens,
        x.block_table,
        layout,
    )


def _rows_padded_by_less_than_a_row(layout: str, new: int) -> Append:
    """A contiguous cache whose position stride is the heads' rows plus 4 elements: no row
    stride divides every stride, so no [rows, D] view holds it."""
    x = make_append(layout, "contiguous", 0, new, _lengths(0, new))
    position = HEADS * HEAD_DIM + 4
    strides = (
        (CAPACITY * position, position, HEAD_DIM, 1)
        if layout == "blhd"
        else (CAPACITY * position, HEAD_DIM, position, 1)
    )
    k_buffer = torch.full((BATCH * CAPACITY * position,), float("nan"), dtype=torch.float16)
    v_buffer = k_buffer.clone()
    shape = tuple(x.k_cache.shape)
    return Append(
        k_buffer,
        v_buffer,
        k_buffer.as_strided(shape, strides),
        v_buffer.as_strided(shape, strides),
        x.k_new,
        x.v_new,
        x.cache_seqlens,
        None,
        layout,
    )


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize("new", [1, 5])
@pytest.mark.parametrize(
    "case",
    [
        "strided D",
        "strided D paged",
        "pages not outermost",
        "K and V strides differ",
        "rows padded by less than a row",
    ],
)
def test_caches_no_rows_view_covers_take_the_per_dimension_path(
    layout: str, new: int, case: str
) -> None:
    if case == "pages not outermost":
        x = _pages_not_outermost(layout, new)
    elif case == "rows padded by less than a row":
        x = _rows_padded_by_less_than_a_row(layout, new)
    elif case == "K and V strides differ":
        x = make_append(layout, "sliced", 0, new, _lengths(0, new))
        x.v_buffer = x.v_cache = x.v_cache.contiguous()
    else:
        page_size = 16 if case.endswith("paged") else 0
        x = make_append(layout, "strided D", page_size, new, _lengths(page_size, new))
    plan = plan_append(x.k_cache, x.v_cache, x.k_new, x.block_table, layout)
    assert plan.index is None
    assert_same_writes(x, lambda a: _append(*a.args(), plan))


def test_overlapping_cells_take_the_per_dimension_path() -> None:
    # Heads one row apart and positions one row apart: cell (h, pos) is cell (h + 1, pos - 1).
    x = make_append("blhd", "contiguous", 0, 1, (0, 1, 2))
    shape = tuple(x.k_cache.shape)
    strides = (CAPACITY * HEAD_DIM, HEAD_DIM, HEAD_DIM, 1)
    cache = x.k_buffer.view(-1).as_strided(shape, strides)
    assert plan_append(cache, cache, x.k_new, None, "blhd").index is None


def test_a_plan_made_per_call_writes_the_same() -> None:
    x = make_append("blhd", "sliced", 16, 5, _lengths(16, 5))
    assert_same_writes(x, lambda a: _append(*a.args()))


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize(("how", "page_size"), CACHES)
def test_a_position_past_the_capacity_raises_before_writing(
    layout: str, how: str, page_size: int
) -> None:
    # Contiguous: one row past sequence 0's capacity is row 0 of its next head ("bhld") or
    # of sequence 1 ("blhd") in a flat index, and a row the buffer holds when sliced.
    x = make_append(layout, how, page_size, 2, (CAPACITY - 1, 0, 5))
    plan = plan_append(x.k_cache, x.v_cache, x.k_new, x.block_table, layout)
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        _append(*x.args(), plan)
    assert x.k_buffer.isnan().all() and x.v_buffer.isnan().all()


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize("page", [-1, "past the pages", "past interleaved pages"])
def test_a_page_id_outside_the_cache_raises(layout: str, page: int | str) -> None:
    # Interleaved pages take the per-dimension path; its index_put_ wraps a negative id, as
    # it always did, so only the flat path is asked to refuse -1.
    x = (
        _pages_not_outermost(layout, 1)
        if page == "past interleaved pages"
        else make_append(layout, "sliced", 16, 1, (0, 5, 17))
    )
    assert x.block_table is not None
    pages = logical_bhld(x.k_cache, layout).shape[0]
    x.block_table[2, 1] = pages if isinstance(page, str) else page
    x.cache_seqlens[2] = 17  # the new row on the sequence's second page
    plan = plan_append(x.k_cache, x.v_cache, x.k_new, x.block_table, layout)
    with pytest.raises(IndexError, match="out of bounds"):
        _append(*x.args(), plan)


class _OpCounter(TorchDispatchMode):
    """Every torch op dispatched below autograd, by name (a CUDA call would launch or view
    for each one)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _ops(call: Callable[[], object]) -> Counter[str]:
    with _OpCounter() as counter:
        call()
    return counter.ops


# The flat path: cache_seqlens viewed, the positions, their rows (gather, add; paged: shift,
# gather, and, two adds), the index viewed flat, per cache its rows view, the source viewed
# and one index_copy_, the lengths after. The per-dimension path dispatched 15-20 ops
# contiguous and 20-26 paged, two of them index_put_ with three index tensors.
MOST_OPS = {0: 12, 16: 16}


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize("page_size", [0, 16])
def test_an_append_dispatches_few_ops(layout: str, page_size: int) -> None:
    x = make_append(layout, "contiguous", page_size, 1, _lengths(page_size, 1))
    plan = plan_append(x.k_cache, x.v_cache, x.k_new, x.block_table, layout)
    flat = _ops(lambda: _append(*x.args(), plan))
    by_dimension = _ops(lambda: _write_by_dimension(*x.args()))
    assert sum(flat.values()) <= MOST_OPS[page_size] < sum(by_dimension.values()), flat
    assert flat["aten.index_copy_.default"] == 2 and "aten.index_put_.default" not in flat
    # nothing the host would wait for, nothing per call that a plan holds
    for op in (
        "aten._local_scalar_dense.default",
        "aten.nonzero.default",
        "aten.arange.default",
        "aten._to_copy.default",
    ):
        assert op not in flat


@pytest.mark.parametrize("page_size", [0, 16])
def test_every_shape_is_fixed_by_the_geometry(page_size: int) -> None:
    # Fake tensors have no values: an op whose output shape depends on them (nonzero,
    # masked_select, a tensor read as a bool) raises here, as it could not be captured.
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = make_append("blhd", "sliced", page_size, 5, _lengths(page_size, 5))
    with FakeTensorMode(allow_non_fake_inputs=True):
        plan: AppendPlan = plan_append(x.k_cache, x.v_cache, x.k_new, x.block_table, "blhd")
        lengths = _append(*x.args(), plan)
    assert tuple(lengths.shape) == (BATCH,)
