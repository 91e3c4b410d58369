"""Values that cross the store's boundary (frozen dataclasses; no ORM objects leak out)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..measure.records import BaselineTiming, DeviceInfo, TrialResult
from ..model.config import Config
from ..model.problem import Problem

# Made by the measure stage, recorded here: later stages and the tests name them through the
# store, which re-exports them.
__all__ = ["BaselineTiming", "BestRecord", "DeviceInfo", "TrialResult"]


@dataclass(frozen=True)
class BestRecord:
    device: DeviceInfo
    problem: Problem
    config: Config
    median_us: float
    tflops: float
    sdpa_default_us: float | None
    sdpa_flash_us: float | None
    trials: int
    study: str
    source: str = "tuned"
    updated_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    p20_us: float | None = None
    p80_us: float | None = None
    decision: str | None = None  # "fastest ..." or the tie rule that chose it
    runner_up_us: float | None = None
    torch_version: str | None = None
    cudnn_version: str | None = None
    regime: str | None = None

    @property
    def speedup_vs_default(self) -> float | None:
        return self.sdpa_default_us / self.median_us if self.sdpa_default_us else None

    @property
    def speedup_vs_flash(self) -> float | None:
        return self.sdpa_flash_us / self.median_us if self.sdpa_flash_us else None
