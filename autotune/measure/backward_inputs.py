"""The inputs a process times a backward problem on (`Problem.backward`), and torch SDPA's
backwards on those inputs: what a backward trial, a re-ranking and the baselines of a backward
problem time, as measure.inputs does for the forward.

An input set holds q, k, v and the upstream gradient dout ([B, H, L, D], seeded random), the
forward's output and log-sum-exp from SDPA's default (the op that returns its LSE: the
forward is not what is timed), and the gradients' outputs, written in place by the kernel on
every call. torch's backward of a backend is timed as a training step runs it: its forward
is recorded once per set with the inputs as leaves, and each timed call is
`torch.autograd.grad` of that output (the graph kept), which runs the backend's backward
kernels (dPsum, dQ, dK, dV and their conversions) and nothing of the forward. One problem is
held at a time, which keeps device memory bounded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..model.problem import Problem
from .sdpa import BACKENDS, backend_call, fallback_lse, lse_call, sdpa_kwargs
from .timing import Candidate, input_sets_needed

if TYPE_CHECKING:
    import torch

    from ..launch.backward import CompiledBackward


@dataclass(frozen=True)
class BackwardSet:
    """One input set of a backward problem ([B, H, L, D] each; lse fp32 [B, Hq, Lq])."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


_sets: dict[Problem, list[BackwardSet]] = {}
# Of the problem whose sets are held: per set, torch's backward of each SDPA backend that
# runs the problem (its forward recorded once), and SDPA's default gradients on the first set.
_sdpa: dict[Problem, list[dict[str, Callable[[], Any]]]] = {}
_expected: dict[Problem, tuple[Any, ...]] = {}


def scale_of(problem: Problem) -> float:
    return 1.0 / math.sqrt(problem.head_dim)


def backward_inputs(problem: Problem) -> list[BackwardSet]:
    """The input sets of a backward problem, on the current device: enough of them that their
    bytes rotate through 3x the L2 cache."""
    import torch

    from ..launch.tensors import torch_dtype

    if not problem.backward:
        raise ValueError(f"{problem.describe()} is not a backward problem")
    if problem not in _sets:
        _sets.clear()
        _sdpa.clear()
        _expected.clear()
        dtype = torch_dtype(problem.dtype)
        q_shape = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
        kv_shape = (problem.batch, problem.heads_kv, problem.seqlen_k, problem.head_dim)
        # read: q, k, v, out, dout; written: dq, dk, dv (2-byte types)
        set_bytes = 2 * (5 * math.prod(q_shape) + 4 * math.prod(kv_shape))
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        scale = scale_of(problem)
        sets = []
        for _ in range(input_sets_needed(set_bytes, l2)):
            q = torch.randn(q_shape, device="cuda", dtype=dtype)
            k = torch.randn(kv_shape, device="cuda", dtype=dtype)
            v = torch.randn(kv_shape, device="cuda", dtype=dtype)
            dout = torch.randn(q_shape, device="cuda", dtype=dtype)
            forward = lse_call("default", q, k, v, causal=problem.causal, scale=scale)
            if forward is not None:
                out, lse = forward(q, k, v)
            else:  # no LSE-returning op runs it: the output from SDPA, the LSE by reference
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, **_kwargs(problem))
                lse = fallback_lse(q, k, v, causal=problem.causal, scale=scale, layout="bhld")
            sets.append(
                BackwardSet(
                    q,
                    k,
                    v,
                    dout,
                    out.contiguous(),
                    lse.contiguous(),
                    torch.empty_like(q),
                    torch.empty_like(k),
                    torch.empty_like(v),
                )
            )
        _sets[problem] = sets
    return _sets[problem]


def _kwargs(problem: Problem) -> dict[str, Any]:
    return sdpa_kwargs(
        problem.seqlen_q,
        problem.seqlen_k,
        problem.heads_q,
        problem.heads_kv,
        causal=problem.causal,
        scale=scale_of(problem),
    )


def backward_kernel_candidate(kernel: CompiledBackward, problem: Problem) -> Candidate:
    """The backward kernel on input set i of `problem` (preprocess, main and postprocess
    entries; the gradients written into the set's outputs), as a timing candidate."""
    sets = backward_inputs(problem)
    scale = scale_of(problem)

    def call(i: int) -> Any:
        s = sets[i]
        return kernel(s.q, s.k, s.v, s.out, s.dout, s.lse, scale=scale, dq=s.dq, dk=s.dk, dv=s.dv)

    return call


def _recorded_backward(backend: str, s: BackwardSet, problem: Problem) -> Callable[[], Any] | None:
    """torch's backward of `backend` on set `s` (its forward recorded now), or None where the
    backend refuses the problem, forward or backward."""
    import warnings

    import torch

    leaves = [t.detach().clone().requires_grad_() for t in (s.q, s.k, s.v)]
    forward = backend_call(backend, _kwargs(problem))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a refusing backend explains itself at length
        try:
            with torch.enable_grad():
                out = forward(*leaves)

            def call() -> Any:
                return torch.autograd.grad(out, leaves, s.dout, retain_graph=True)

            call()
        except RuntimeError:
            return None
    return call


def backward_sdpa(problem: Problem) -> list[dict[str, Callable[[], Any]]]:
    """Per input set of `backward_inputs`, torch's backward of each SDPA backend that runs the
    problem, as calls returning (dq, dk, dv)."""
    sets = backward_inputs(problem)
    if problem not in _sdpa:
        per_set = []
        for s in sets:
            calls = {}
            for backend in BACKENDS:
                call = _recorded_backward(backend, s, problem)
                if call is not None:
                    calls[backend] = call
            per_set.append(calls)
        _sdpa[problem] = per_set
    return _sdpa[problem]


def reference_gradients(problem: Problem) -> tuple[Any, ...]:
    """SDPA's default backward on the first input set, in fp32: what a backward trial's
    gradients at the tuning shape are held to."""
    if problem not in _expected:
        grads = backward_sdpa(problem)[0]["default"]()
        _expected[problem] = tuple(g.float() for g in grads)
    return _expected[problem]


def backward_sdpa_candidate(problem: Problem, backend: str) -> Candidate | None:
    """One SDPA backend's backward over the input sets as a timing candidate; None if it
    refuses the problem."""
    per_set = backward_sdpa(problem)
    if any(backend not in calls for calls in per_set):
        return None
    return lambda i: per_set[i][backend]()


def backward_sdpa_candidates(problem: Problem) -> dict[str, Candidate]:
    """Every SDPA backend whose backward runs the problem on every input set, by backend."""
    per_set = backward_sdpa(problem)
    names = sorted(set.intersection(*(set(calls) for calls in per_set)))

    def candidate(name: str) -> Candidate:
        return lambda i: per_set[i][name]()

    return {name: candidate(name) for name in names}


def gradient_difference(got: tuple[Any, ...], expected: tuple[Any, ...]) -> float:
    """The largest difference of any gradient from the expected one, relative to that
    gradient's largest value (at least 1): a long causal dK reaches tens, where bf16 rounds in
    steps of 1/16. NaN where any gradient is not finite."""
    worst = 0.0
    for a, r in zip(got, expected, strict=True):
        diff = float((a.float() - r).abs().max() / r.abs().max().clamp_min(1.0))
        if not math.isfinite(diff):
            return math.nan
        worst = max(worst, diff)
    return worst
