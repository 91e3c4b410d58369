"""What a measurement produces: the outcome of one trial, a baseline's timing, the GPU it ran on.

Frozen values; they cross the worker's process boundary (pickled) and are what the store
records, so they live in the stage that makes them (the store re-exports them)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..model.config import Config
from ..model.problem import Problem
from ..model.status import Status
from .environment import Environment


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

    @property
    def model(self) -> str:
        """The GPU model in words: name, compute capability and SM count."""
        return gpu_model_words(self.name, self.compute_capability, self.sm_count)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_model_words(name: str, compute_capability: int, sm_count: int) -> str:
    return f"{name} (sm_{compute_capability}, {sm_count} SMs)"


@dataclass(frozen=True)
class TrialResult:
    """The outcome of one config on one problem: a time, or why there is none."""

    config: Config
    status: Status
    reason: str = ""
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    rounds: int | None = None
    rel_err: float | None = None  # the validator's worst relative error over its cases
    max_abs_err: float | None = None
    build_key: str | None = None
    reused: bool = False  # served from the database instead of measured again
    env: Environment | None = None  # what it was timed under (versions, clock, power)
    baseline_us: float | None = None  # SDPA's default timed in the same alternation

    def __post_init__(self) -> None:
        # Rows read back from the database and recordings carry the stored string; holding
        # the member makes `status is Status.X` and `.config_at_fault` work on every result.
        object.__setattr__(self, "status", Status(self.status))

    @property
    def ok(self) -> bool:
        return (
            self.status is Status.OK
            and self.median_us is not None
            and math.isfinite(self.median_us)
        )

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
