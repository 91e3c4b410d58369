"""The inputs a process times a problem on, and torch SDPA on those inputs.

Input tensors of a problem are generated once per process and reused by every trial and
baseline of that problem, so all candidates and SDPA see the same data; there are enough input
sets to rotate through 3x the L2 cache. One problem is held at a time, which keeps device
memory bounded. Used in GPU worker processes (measure.gpu_tasks) and by the recording sweep.

A KV-cache problem (`Problem.kv_cache` other than "dense") is timed as serving engines call it:
the kernel reads a padded cache with per-sequence lengths, or a paged cache through a shuffled
block table (`KVCacheSet`). torch SDPA cannot read either, so its baseline reads the same keys
held contiguous (the pages gathered once, outside the timing) with a mask for the lengths: what
SDPA costs on the same work at best.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..model.problem import Problem
from .environment import Environment, software
from .sdpa import accepted_backends
from .timing import REGIME, Candidate, Timing, input_sets_needed

if TYPE_CHECKING:
    import torch

    from ..launch.kernel import CompiledKernel

_inputs: dict[Problem, list[tuple[Any, ...]]] = {}
# Of the problem whose inputs are held: torch SDPA's backends that accept it, per input set
# (each backend tried once per set, not once per trial), and SDPA's output on the first set.
_sdpa: dict[Problem, list[dict[str, Callable[[], Any]]]] = {}
_expected: dict[Problem, Any] = {}
_software: dict[int, Environment] = {}


@dataclass(frozen=True)
class KVCacheSet:
    """How a KV-cache problem's input set is held for the kernel ("bhld" layout), and the mask
    SDPA needs for the per-sequence lengths (None: every key of the contiguous form)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor | None
    block_table: torch.Tensor | None
    sdpa_mask: torch.Tensor | None


def problem_inputs(problem: Problem) -> list[tuple[Any, ...]]:
    """(q, k, v, out) per input set of `problem`, on the current device, [B, H, L, D]; a
    KV-cache problem's sets carry a fifth item, its `KVCacheSet` (k and v are then the same keys
    held contiguous)."""
    import torch

    from ..launch.tensors import torch_dtype

    if problem not in _inputs:
        _inputs.clear()
        _sdpa.clear()
        _expected.clear()
        dtype = torch_dtype(problem.dtype)
        q_shape = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
        kv_shape = (problem.batch, problem.heads_kv, problem.seqlen_k, problem.head_dim)
        set_bytes = 2 * (2 * math.prod(q_shape) + 2 * math.prod(kv_shape))
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        sets: list[tuple[Any, ...]] = []
        for index in range(input_sets_needed(set_bytes, l2)):
            q = torch.randn(q_shape, device="cuda", dtype=dtype)
            if problem.kv_cache == "dense":
                k = torch.randn(kv_shape, device="cuda", dtype=dtype)
                v = torch.randn(kv_shape, device="cuda", dtype=dtype)
                sets.append((q, k, v, torch.empty_like(q)))
            else:
                sets.append((q, *_kv_cache_set(problem, dtype, seed=index)))
        _inputs[problem] = sets
    return _inputs[problem]


def _kv_cache_set(
    problem: Problem, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, KVCacheSet]:
    """(k, v, out, cache) of a KV-cache problem: the cache as the kernel reads it, k and v the
    same keys contiguous for SDPA."""
    import torch

    b, h, lq, lk, d = (
        problem.batch,
        problem.heads_kv,
        problem.seqlen_q,
        problem.seqlen_k,
        problem.head_dim,
    )
    out = torch.empty((b, problem.heads_q, lq, d), device="cuda", dtype=dtype)
    page = problem.page_size
    if page:
        per_seq = lk // page  # whole pages: Problem checks it
        gen = torch.Generator(device="cpu").manual_seed(seed)
        table = torch.randperm(b * per_seq, generator=gen).view(b, per_seq)
        block_table = table.to(device="cuda", dtype=torch.int32)
        pages = [
            torch.randn((b * per_seq, h, page, d), device="cuda", dtype=dtype) for _ in range(2)
        ]
        # [B, pages, H, page, D] -> [B, H, Lk, D]: the same keys in sequence order
        k, v = (t[block_table.long()].permute(0, 2, 1, 3, 4).reshape(b, h, lk, d) for t in pages)
        return k, v, out, KVCacheSet(pages[0], pages[1], None, block_table, None)
    k = torch.randn((b, h, lk, d), device="cuda", dtype=dtype)
    v = torch.randn((b, h, lk, d), device="cuda", dtype=dtype)
    lengths = problem.cache_lengths or (lk,) * b
    seqlens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
    return k, v, out, KVCacheSet(k, v, seqlens, None, length_mask(problem, seqlens))


def length_mask(problem: Problem, seqlens: torch.Tensor) -> torch.Tensor:
    """SDPA's boolean mask [B, 1, Lq, Lk] of what each query sees in a padded cache: keys below
    its sequence's length, and with causal masking those up to its own diagonal (aligned to the
    end of its sequence, as the kernels align it)."""
    import torch

    device = seqlens.device
    lengths = seqlens.long()[:, None, None, None]
    key = torch.arange(problem.seqlen_k, device=device)[None, None, None, :]
    mask = key < lengths
    if problem.causal:
        query = torch.arange(problem.seqlen_q, device=device)[None, None, :, None]
        mask = mask & (key <= query + lengths - problem.seqlen_q)
    return mask


def kernel_candidate(kernel: CompiledKernel, problem: Problem) -> Candidate:
    """The kernel on input set i of `problem` (writing that set's out), as a timing
    candidate: a KV-cache problem's kernel reads the set's cache as serving engines hold it."""
    sets = problem_inputs(problem)
    if problem.kv_cache == "dense":
        return lambda i: kernel(*sets[i][:3], out=sets[i][3])

    def call(i: int) -> Any:
        q, _, _, out, cache = sets[i]
        return kernel.with_kvcache(
            q,
            cache.k_cache,
            cache.v_cache,
            cache_seqlens=cache.cache_seqlens,
            block_table=cache.block_table,
            layout="bhld",
            out=out,
        )

    return call


def problem_sdpa(problem: Problem) -> list[dict[str, Callable[[], Any]]]:
    """Per input set of `problem_inputs`, the SDPA backends that run it, as calls."""
    sets = problem_inputs(problem)
    if problem not in _sdpa:
        _sdpa[problem] = [
            accepted_backends(
                *s[:3], causal=problem.causal, mask=s[4].sdpa_mask if len(s) > 4 else None
            )
            for s in sets
        ]
    return _sdpa[problem]


def reference_output(problem: Problem) -> Any:
    """SDPA's default on the first input set, in fp32: what a trial's output is held to."""
    if problem not in _expected:
        _expected[problem] = problem_sdpa(problem)[0]["default"]().float()
    return _expected[problem]


def sdpa_candidate(problem: Problem, backend: str) -> Candidate | None:
    """One SDPA backend over the input sets as a timing candidate; None if it refuses."""
    per_set = problem_sdpa(problem)
    if any(backend not in b for b in per_set):
        return None
    return lambda i: per_set[i][backend]()


def sdpa_candidates(problem: Problem) -> dict[str, Candidate]:
    """Every SDPA backend that runs the problem on every input set, by backend."""
    per_set = problem_sdpa(problem)
    names = sorted(set.intersection(*(set(b) for b in per_set)))

    def candidate(name: str) -> Candidate:
        return lambda i: per_set[i][name]()

    return {name: candidate(name) for name in names}


def timed_env(timing: Timing, device: int) -> Environment:
    """What `timing` was taken under: this process's software versions (read once), the
    regime's name, and the clock and power sampled while it ran."""
    if device not in _software:
        _software[device] = software(REGIME)
    return _software[device].with_clock((timing.sm_clock_mhz, timing.power_w))
