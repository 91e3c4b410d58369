"""What a tuning session (or `cute-autotune check`) asks its GPU worker, and what comes back.

Each request is a frozen record deriving from `Request[its reply type]`, pickled across the
process boundary by measure.worker; the worker answers with that reply, or with a
`WorkerFailure` (a Status and a reason) when it could not. The tasks answering them are in
measure.gpu_tasks; the trial itself is measure.trial.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..build.compiler import BuildResult
from ..model.problem import Problem
from .records import BaselineTiming, DeviceInfo, TrialResult
from .validate import ValidationReport
from .worker import Request


@dataclass(frozen=True)
class TrialRequest(Request[TrialResult]):
    """Validate one built config, then time it on the problem beside SDPA's default."""

    problem: Problem
    build: BuildResult
    rounds: int
    round_ms: float


@dataclass(frozen=True)
class ValidateRequest(Request[ValidationReport]):
    """The validator alone on one built config (what `cute-autotune check` asks)."""

    build: BuildResult
    seed: int | None = None


@dataclass(frozen=True)
class Reranked:
    results: tuple[TrialResult, ...]  # in the order of the request's builds


@dataclass(frozen=True)
class RerankRequest(Request[Reranked]):
    """Finalists, already validated (kernels and torch SDPA configs of family `sdpa`), timed
    together in one alternation."""

    problem: Problem
    builds: tuple[BuildResult, ...]
    rounds: int
    round_ms: float


@dataclass(frozen=True)
class Baselines:
    timings: tuple[BaselineTiming, ...]  # one per SDPA backend that accepts the problem


@dataclass(frozen=True)
class BaselinesRequest(Request[Baselines]):
    """Every torch SDPA backend that accepts the problem, timed together."""

    problem: Problem
    rounds: int
    round_ms: float


@dataclass(frozen=True)
class DeviceDescription:
    info: DeviceInfo
    max_smem_per_block: int  # opt-in shared memory per block, 0 if torch does not say

    def as_dict(self) -> dict[str, Any]:
        return {**self.info.as_dict(), "max_smem_per_block": self.max_smem_per_block}


@dataclass(frozen=True)
class DeviceRequest(Request[DeviceDescription]):
    """The worker's GPU: name, compute capability, SMs, driver and CUDA versions."""
