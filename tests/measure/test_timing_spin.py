"""The spin after each L2 flush outlasts the host's issue of the next call: at least
SPIN_CYCLES, twice the slowest candidate's host time beyond that (the GPU's side is in
tests/gpu/test_timing_gpu.py)."""

from __future__ import annotations

from autotune.measure.timing import SPIN_CYCLES, SPIN_CYCLES_PER_US, spin_cycles_for


def test_a_quick_host_keeps_the_fixed_spin() -> None:
    assert spin_cycles_for(0.0) == SPIN_CYCLES
    assert spin_cycles_for(10.0) == SPIN_CYCLES


def test_a_slow_host_gets_twice_its_issue_time() -> None:
    assert spin_cycles_for(60.0) == 2 * 60 * SPIN_CYCLES_PER_US
    assert spin_cycles_for(500.0) == 2 * 500 * SPIN_CYCLES_PER_US
    assert spin_cycles_for(60.0) > SPIN_CYCLES  # the decode call that was timed at its host time
