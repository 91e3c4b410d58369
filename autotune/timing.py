"""Time GPU work honestly: CUDA-graph replays timed by events, after warm-up, repetitions sized by
time, input sets rotated so that no timing runs from a warm L2, several rounds reported as
median and p20/p80, and competing candidates interleaved round by round so clock and thermal
drift hit them alike.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

# A candidate: called with the index of the input set to use; enqueues work on the current
# stream and does not synchronise.
Candidate = Callable[[int], Any]


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    rounds: int
    calls_per_round: int

    def tflops(self, flops: int) -> float:
        return flops / (self.median_us * 1e-6) / 1e12

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def input_sets_needed(bytes_per_set: int, l2_bytes: int) -> int:
    """How many distinct input sets make one rotation at least 3x the L2 cache."""
    return max(1, min(64, -(-3 * l2_bytes // max(1, bytes_per_set))))


def measure(candidates: Mapping[str, Candidate], *, n_sets: int = 1, rounds: int = 7,
            round_ms: float = 40.0, use_graph: bool = True,
            max_calls: int = 2000) -> dict[str, Timing]:
    """Time each candidate; rounds alternate between candidates (A B C A B C ...)."""
    import torch

    stream = torch.cuda.Stream()
    prepared: dict[str, tuple[Callable[[], None], int]] = {}
    for name, fn in candidates.items():
        with torch.cuda.stream(stream):
            for i in range(n_sets):  # warm-up: module load, allocator, caches of the library
                fn(i)
        stream.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record()
            for i in range(3):
                fn(i % n_sets)
            end.record()
        end.synchronize()
        per_call_ms = max(start.elapsed_time(end) / 3, 1e-3)
        calls = int(min(max_calls, max(n_sets, round_ms / per_call_ms)))
        calls = max(n_sets, calls - calls % n_sets)  # whole rotations
        if use_graph:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for i in range(calls):
                    fn(i % n_sets)
            prepared[name] = (graph.replay, calls)
        else:
            def run_loop(fn: Candidate = fn, calls: int = calls) -> None:
                for i in range(calls):
                    fn(i % n_sets)
            prepared[name] = (run_loop, calls)

    samples: dict[str, list[float]] = {name: [] for name in prepared}
    with torch.cuda.stream(stream):
        for run, _ in prepared.values():
            run()  # one untimed pass of each graph
        stream.synchronize()
        for _ in range(rounds):
            for name, (run, calls) in prepared.items():
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                run()
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end) * 1e3 / calls)
    return {
        name: Timing(statistics.median(values), _quantile(values, 0.2), _quantile(values, 0.8),
                     rounds, prepared[name][1])
        for name, values in samples.items()
    }
