"""The one timing regime of cute-autotune: search trials, the final re-ranking, `bench` and
`recheck` all time through `measure`, so that what the tuner stores is what a user measures.

The regime ("flushed-alternating"):
* every timed call starts from a cold L2: a buffer twice the L2 size is overwritten just
  before it (untimed), as a model's other layers would leave it, and the GPU then spins for
  about 50 us, or twice the host time of the slowest candidate's call where that is longer,
  so the host has enqueued the call before its start event fires: the figure is the GPU's
  time for the call (a decode-sized call runs for less time than Python takes to issue it;
  host overhead is measured apart, benchmarks/host_overhead.py);
* candidates alternate call by call (A B C, then a new seeded shuffle of them, ...), so each
  follows every other about equally often and clock or power drift hits them alike;
* before the timed calls, the same alternation runs untimed for `warmup_ms` (at least three
  calls each), so the GPU is at the clock it holds under this load when timing starts; the
  clocks are never locked;
* CUDA events around each call; per candidate the median over its calls is kept, with the
  20th and 80th percentiles as its spread; the SM clock and power are sampled meanwhile.

Calls are enqueued without waiting for the GPU.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

REGIME = "flushed-alternating-1"

# A candidate: called with the index of the input set to use; enqueues work on the current
# stream and does not synchronise.
Candidate = Callable[[int], Any]


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    rounds: int  # timed calls
    calls_per_round: int = 1
    sm_clock_mhz: float | None = None
    power_w: float | None = None

    def overlaps(self, other: Timing) -> bool:
        """Whether the p20-p80 ranges of two timings overlap (the order is within the noise)."""
        return self.p20_us <= other.p80_us and other.p20_us <= self.p80_us

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def input_sets_needed(bytes_per_set: int, l2_bytes: int) -> int:
    """How many distinct input sets make one rotation at least 3x the L2 cache (tools that
    rotate inputs; the regime itself flushes the L2 before every call)."""
    return max(1, min(64, -(-3 * l2_bytes // max(1, bytes_per_set))))


def calls_for(
    per_call_ms: float, rounds: int, round_ms: float, *, min_calls: int = 21, max_calls: int = 400
) -> int:
    """Timed calls per candidate: about rounds x round_ms of its own GPU time, within bounds."""
    return int(min(max_calls, max(min_calls, rounds * round_ms / max(per_call_ms, 1e-3))))


SPIN_CYCLES_PER_US = 2_000  # about the H200's boost clock (a lower clock only spins longer)
# GPU clock cycles of the spin after each flush, at least: 50 us at that clock.
SPIN_CYCLES = 50 * SPIN_CYCLES_PER_US


def spin_cycles_for(host_issue_us: float) -> int:
    """The spin after each flush for candidates whose slowest takes the host `host_issue_us`
    to issue: twice that, never less than SPIN_CYCLES, so the GPU is still spinning when the
    host has issued the next call and its events. A fixed spin is not enough for a KV-cache
    decode call, whose Python and launch can outlast a short kernel: its search would time
    the host, not the kernel, and pick a split count at random."""
    return max(SPIN_CYCLES, int(2 * host_issue_us * SPIN_CYCLES_PER_US))


class L2Flush:
    """Overwrites a buffer twice the GPU's L2 cache (what the L2 held is evicted), then spins
    for `spin_cycles` so the host gets ahead of the GPU."""

    def __init__(self, device: Any = None, spin_cycles: int = SPIN_CYCLES) -> None:
        import torch

        index = torch.cuda.current_device() if device is None else device
        l2 = torch.cuda.get_device_properties(index).L2_cache_size
        self._buffer = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device=f"cuda:{index}")
        self.spin_cycles = spin_cycles

    def __call__(self) -> None:
        import torch

        self._buffer.fill_(0)
        torch.cuda._sleep(self.spin_cycles)


def measure(
    candidates: Mapping[str, Candidate],
    *,
    n_sets: int = 1,
    rounds: int = 7,
    round_ms: float = 40.0,
    warmup_ms: float = 250.0,
    seed: int = 0,
    min_calls: int = 21,
    max_calls: int = 400,
) -> dict[str, Timing]:
    """Time each candidate in the regime above. `rounds x round_ms` is the GPU time each
    candidate's timed calls add up to (at least `min_calls`, at most `max_calls` calls);
    every candidate gets the same number of calls."""
    import torch

    from .environment import ClockSampler

    names = list(candidates)
    if not names:
        return {}
    flush = L2Flush()
    for name in names:  # first calls: module load, allocator, the libraries' own caches
        for i in range(min(n_sets, 2)):
            candidates[name](i)
    torch.cuda.synchronize()
    per_call, host_us = {}, {}
    for name in names:  # a cold call's time, to size the warm-up and the timed calls
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush()
        start.record()
        issued = time.perf_counter()
        candidates[name](0)
        host_us[name] = (time.perf_counter() - issued) * 1e6
        end.record()
        end.synchronize()
        per_call[name] = max(start.elapsed_time(end), 1e-3)
    flush.spin_cycles = spin_cycles_for(max(host_us.values()))
    pass_ms = sum(per_call.values()) + 0.05 * len(names)  # + the flushes, roughly
    calls = max(
        calls_for(per_call[n], rounds, round_ms, min_calls=min_calls, max_calls=max_calls)
        for n in names
    )
    warm_passes = max(3, int(warmup_ms / pass_ms))
    rng = random.Random(seed)

    def alternate(passes: int, offset: int, timed: dict[str, list[Any]] | None) -> None:
        order = list(names)
        for p in range(passes):
            rng.shuffle(order)
            for name in order:
                flush()
                if timed is None:
                    candidates[name]((offset + p) % n_sets)
                    continue
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                candidates[name]((offset + p) % n_sets)
                end.record()
                timed[name].append((start, end))

    alternate(warm_passes, 0, None)
    events: dict[str, list[Any]] = {name: [] for name in names}
    with ClockSampler(torch.cuda.current_device()) as sampler:
        alternate(calls, warm_passes, events)
        torch.cuda.synchronize()
    clock, power = sampler.result()
    result = {}
    for name in names:
        samples = [start.elapsed_time(end) * 1e3 for start, end in events[name]]
        result[name] = Timing(
            statistics.median(samples),
            quantile(samples, 0.2),
            quantile(samples, 0.8),
            len(samples),
            1,
            clock,
            power,
        )
    return result
