"""The timing regime on a GPU: a call whose host side takes longer than the fixed spin after
the flush is still timed at its GPU time, not its host time (a KV-cache decode call's ~60 us
of Python was timed in place of its 20 us kernel, H200, 2026-12-02)."""

from __future__ import annotations

import time

import pytest
import torch

from autotune.measure.timing import measure

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HOST_US = 200.0  # four times the fixed spin


def test_a_slow_host_call_is_timed_at_its_gpu_time() -> None:
    x = torch.zeros(1024, device="cuda")

    def slow_host(_set: int) -> None:
        until = time.perf_counter() + HOST_US / 1e6
        while time.perf_counter() < until:  # the host's work before it enqueues the kernel
            pass
        x.add_(1.0)

    def quick(_set: int) -> None:
        x.add_(1.0)

    timings = measure(
        {"slow_host": slow_host, "quick": quick},
        rounds=1,
        round_ms=1.0,
        warmup_ms=5.0,
        min_calls=21,
        max_calls=21,
    )
    # The same kernel either way: a few microseconds, far below the host's 200.
    assert timings["slow_host"].median_us < HOST_US / 4, timings
    assert timings["slow_host"].median_us < timings["quick"].median_us + 20.0, timings
