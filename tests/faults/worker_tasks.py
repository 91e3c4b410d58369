"""Tasks for a GpuWorker under test, on a machine that may have no GPU.

Imported inside the worker process (GpuWorker(task_modules=...)) before it selects its device:
CUDA's device selection and health check are replaced by a flag, so that `Poison` can stand in
for a sticky CUDA error (a kernel that broke its context) on any machine."""

from __future__ import annotations

import os
import signal
import time

import torch

from autotune.measure.records import TrialResult
from autotune.measure.worker import register_task

from .worker_requests import Echo, ExitCode, Ping, Poison, Pong, Raise, Segfault, Sleep

_context = {"broken": False}


def _synchronize(*args: object) -> None:
    if _context["broken"]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


torch.cuda.set_device = lambda device: None  # type: ignore[assignment]
torch.cuda.synchronize = _synchronize  # type: ignore[assignment]


def ping(request: Ping, device: int) -> Pong:
    return Pong(os.getpid(), device)


def segfault(request: Segfault, device: int) -> Pong:
    os.kill(os.getpid(), signal.SIGSEGV)
    return Pong(os.getpid(), device)


def exit_code(request: ExitCode, device: int) -> Pong:
    os._exit(request.code)


def poison(request: Poison, device: int) -> Pong:
    _context["broken"] = True
    return Pong(os.getpid(), device)


def raise_(request: Raise, device: int) -> Pong:
    raise ValueError(request.message)


def sleep(request: Sleep, device: int) -> Pong:
    time.sleep(request.seconds)
    return Pong(os.getpid(), device)


def echo(request: Echo, device: int) -> TrialResult:
    return request.result


register_task(Ping, ping)
register_task(Segfault, segfault)
register_task(ExitCode, exit_code)
register_task(Poison, poison)
register_task(Raise, raise_)
register_task(Echo, echo)
register_task(Sleep, sleep)
