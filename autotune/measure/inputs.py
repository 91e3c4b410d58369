"""The inputs a process times a problem on, and torch SDPA on those inputs.

Input tensors of a problem are generated once per process and reused by every trial and
baseline of that problem, so all candidates and SDPA see the same data; there are enough input
sets to rotate through 3x the L2 cache. One problem is held at a time, which keeps device
memory bounded. Used in GPU worker processes (measure.gpu_tasks) and by the recording sweep.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..model.problem import Problem
from .environment import Environment, software
from .sdpa import accepted_backends
from .timing import REGIME, Candidate, Timing, input_sets_needed

_inputs: dict[Problem, list[tuple[Any, ...]]] = {}
# Of the problem whose inputs are held: torch SDPA's backends that accept it, per input set
# (each backend tried once per set, not once per trial), and SDPA's output on the first set.
_sdpa: dict[Problem, list[dict[str, Callable[[], Any]]]] = {}
_expected: dict[Problem, Any] = {}
_software: dict[int, Environment] = {}


def problem_inputs(problem: Problem) -> list[tuple[Any, ...]]:
    """(q, k, v, out) per input set of `problem`, on the current device."""
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
        sets = []
        for _ in range(input_sets_needed(set_bytes, l2)):
            q = torch.randn(q_shape, device="cuda", dtype=dtype)
            k = torch.randn(kv_shape, device="cuda", dtype=dtype)
            v = torch.randn(kv_shape, device="cuda", dtype=dtype)
            sets.append((q, k, v, torch.empty_like(q)))
        _inputs[problem] = sets
    return _inputs[problem]


def problem_sdpa(problem: Problem) -> list[dict[str, Callable[[], Any]]]:
    """Per input set of `problem_inputs`, the SDPA backends that run it, as calls."""
    sets = problem_inputs(problem)
    if problem not in _sdpa:
        _sdpa[problem] = [accepted_backends(*s[:3], causal=problem.causal) for s in sets]
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
