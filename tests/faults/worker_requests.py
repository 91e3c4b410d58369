"""Requests for a GpuWorker under test (tests.faults.worker_tasks answers them there). Apart from
the tasks, so that the test process can make requests without the tasks' stand-ins for CUDA."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.measure.records import TrialResult
from autotune.measure.worker import Request


@dataclass(frozen=True)
class Pong:
    pid: int
    device: int


@dataclass(frozen=True)
class Ping(Request[Pong]):
    pass


@dataclass(frozen=True)
class Segfault(Request[Pong]):
    pass


@dataclass(frozen=True)
class ExitCode(Request[Pong]):
    code: int


@dataclass(frozen=True)
class Poison(Request[Pong]):
    pass


@dataclass(frozen=True)
class Raise(Request[Pong]):
    message: str


@dataclass(frozen=True)
class Echo(Request[TrialResult]):
    """Sends a trial result there and back: the reply type of the real trial task."""

    result: TrialResult


@dataclass(frozen=True)
class Unserved(Request[Pong]):
    """No task module of the worker registers this."""


@dataclass(frozen=True)
class Sleep(Request[Pong]):
    seconds: float
