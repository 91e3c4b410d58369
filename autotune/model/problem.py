"""An attention problem: the shapes, dtype and masking a kernel is asked to solve."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .._shown import shown

DTYPES = ("fp16", "bf16")
# How the keys and values are held (the decode families' KV caches): "dense" is q, k, v
# tensors with every key valid (plain attention; a full contiguous cache); "seqlens" a padded
# contiguous cache of seqlen_k rows per sequence with per-sequence lengths (timed with the
# lengths of `Problem.cache_lengths`); "paged<N>" a paged cache of N-row pages (N a power of
# two) through a block table, every sequence seqlen_k rows long.
KV_CACHES = ("dense", "seqlens", "paged<N>")
_PAGED = re.compile(r"paged([1-9][0-9]{0,4})")


def page_size_of(kv_cache: object) -> int:
    """Rows per page of a `kv_cache` kind "paged<N>"; 0 for any other kind (or a malformed
    one)."""
    match = _PAGED.fullmatch(kv_cache) if isinstance(kv_cache, str) else None
    if match is None:
        return 0
    size = int(match.group(1))
    return size if size <= MAX_PAGE_SIZE and not size & (size - 1) else 0


MAX_PAGE_SIZE = 65536
# Every size is a 32-bit int in the kernels' params and in the database's columns.
MAX_SIZE = 2**31 - 1


@dataclass(frozen=True, order=True)
class Problem:
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str = "fp16"
    causal: bool = False
    kv_cache: str = "dense"
    # What is timed: the forward pass (False), or the backward pass (the gradients of q, k and
    # v from the output's, with the forward's log-sum-exp given), bit-identical from run to run
    # when `deterministic`. A backward problem is a problem of its own: its best config, its
    # SDPA baseline (torch's backward) and its class are never a forward's.
    backward: bool = False
    deterministic: bool = False

    def __post_init__(self) -> None:
        for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim"):
            value = getattr(self, name)
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or not (1 <= value <= MAX_SIZE)
            ):
                raise ValueError(f"{name} must be an integer from 1 to 2^31-1, got {shown(value)}")
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {shown(self.dtype)}")
        for name in ("causal", "backward", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {shown(getattr(self, name))}")
        if self.deterministic and not self.backward:
            raise ValueError("deterministic is a mode of the backward pass (backward=True)")
        if self.backward and self.kv_cache != "dense":
            raise ValueError(
                f"a backward problem has dense keys and values (kv_cache 'dense'), "
                f"got {shown(self.kv_cache)}"
            )
        if self.kv_cache in ("dense", "seqlens"):
            return
        page = self.page_size
        if not page:
            raise ValueError(
                f"kv_cache must be one of {KV_CACHES} (N a power of two up to "
                f"{MAX_PAGE_SIZE}), got {shown(self.kv_cache)}"
            )
        if self.seqlen_k % page:
            raise ValueError(
                f"a {self.kv_cache} cache holds whole pages: seqlen_k "
                f"({self.seqlen_k}) must be a multiple of {page}"
            )

    @property
    def page_size(self) -> int:
        """Rows per page of a paged cache ("paged<N>"); 0 for any other kind (or a malformed
        one)."""
        return page_size_of(self.kv_cache)

    @property
    def cache_lengths(self) -> tuple[int, ...] | None:
        """The per-sequence lengths a "seqlens" problem is timed with (None for other kinds):
        spread over [Lk/2, Lk] by a fixed low-discrepancy rule, 3/4 of Lk at B=1, so that every
        process and GPU times the same work."""
        if self.kv_cache != "seqlens":
            return None
        golden = 0.6180339887498949
        return tuple(
            max(1, round(self.seqlen_k * (0.5 + 0.5 * ((b * golden + 0.5) % 1.0))))
            for b in range(self.batch)
        )

    @property
    def group_size(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def visible_pairs(self) -> int:
        """(query, key) pairs that are not masked, per (batch, head).

        Causal is aligned bottom-right: query i sees keys j <= i + Lk - Lq.
        """
        lq, lk = self.seqlen_q, self.seqlen_k
        if not self.causal:
            return lq * lk
        offset = lk - lq
        # rows i where 0 < i + 1 + offset < lk see i + 1 + offset keys; later rows see all lk.
        # The partial rows' sum is an arithmetic series, summed in closed form: a count by
        # rows would take as long as the lengths are large (2^31 rows: minutes).
        first_full = max(0, lk - 1 - offset)  # first row that sees every key
        start, stop = max(0, -offset), min(lq, first_full)
        rows = max(0, stop - start)
        partial = (start + stop - 1) * rows // 2 + rows * (1 + offset)
        return partial + max(0, lq - first_full) * lk

    @property
    def flops(self) -> int:
        """FLOPs that matter, unmasked pairs only: the forward's 2 GEMMs x 2 FLOPs per
        multiply-add; a backward's 5 GEMMs (S and dP recomputed, dV, dK, dQ) counted as 2.5
        times the forward's, as FlashAttention and cuDNN count them."""
        forward = 4 * self.batch * self.heads_q * self.head_dim * self.visible_pairs
        return forward * 5 // 2 if self.backward else forward

    def tflops(self, median_us: float) -> float:
        """TFLOP/s of the pass timed (`flops`) in `median_us` microseconds."""
        return self.flops / median_us / 1e6

    def gbytes_per_s(self, median_us: float) -> float:
        """GB/s of a forward pass that takes `median_us` microseconds (the minimum bytes)."""
        return self.bytes / median_us / 1e3

    @property
    def bytes(self) -> int:
        """Bytes a forward pass must move at least: Q and O once, K and V once (2-byte types);
        the figure of merit of memory-bound (decode) problems."""
        q = self.batch * self.heads_q * self.seqlen_q * self.head_dim
        lengths = self.cache_lengths
        rows = sum(lengths) if lengths is not None else self.batch * self.seqlen_k
        kv = self.heads_kv * rows * self.head_dim
        return 2 * (2 * q + 2 * kv)

    def space_values(self) -> dict[str, int | str | bool]:
        """The problem-bound parameters every family has (a family's own, such as a backward
        family's `deterministic`: `Space.problem_values`)."""
        return {"head_dim": self.head_dim, "dtype": self.dtype, "causal": self.causal}

    def as_dict(self) -> dict[str, int | str | bool]:
        return asdict(self)

    def describe(self) -> str:
        heads = f"H{self.heads_q}"
        if self.heads_kv != self.heads_q:
            heads += f"/{self.heads_kv}"
        seq = f"L{self.seqlen_q}"
        if self.seqlen_k != self.seqlen_q:
            seq = f"Lq{self.seqlen_q} Lk{self.seqlen_k}"
        mask = " causal" if self.causal else ""
        cache = "" if self.kv_cache == "dense" else f" {self.kv_cache}"
        grad = ""
        if self.backward:
            grad = " backward deterministic" if self.deterministic else " backward"
        return f"B{self.batch} {heads} {seq} D{self.head_dim} {self.dtype}{mask}{cache}{grad}"
