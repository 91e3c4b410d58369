"""Values that cross the store's boundary (frozen dataclasses; no ORM objects leak out)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..measure.environment import Environment
from ..model.config import Config
from ..model.problem import Problem

OK = "ok"


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: int
    sm_count: int
    driver_version: str
    cuda_version: str

    @property
    def key(self) -> str:
        """Short, stable identifier used in study names."""
        return f"{self.name.replace(' ', '_')}-sm{self.compute_capability}-{self.sm_count}sm"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TrialResult:
    """The outcome of one config on one problem: a time, or why there is none."""

    config: Config
    status: str  # ok | invalid | compile_error | timeout | crashed | failed_validation | error
    reason: str = ""
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    rounds: int | None = None
    rel_err: float | None = None
    max_abs_err: float | None = None
    build_key: str | None = None
    reused: bool = False  # served from the database instead of measured again
    env: Environment | None = None  # what it was timed under (versions, clock, power)
    baseline_us: float | None = None  # SDPA's default timed in the same alternation

    @property
    def ok(self) -> bool:
        return self.status == OK and self.median_us is not None and math.isfinite(self.median_us)

    def tflops(self, problem: Problem) -> float | None:
        if not self.ok or not self.median_us:
            return None
        return problem.tflops(self.median_us)


@dataclass(frozen=True)
class BaselineTiming:
    backend: str
    median_us: float
    p20_us: float
    p80_us: float
    env: Environment | None = None


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
