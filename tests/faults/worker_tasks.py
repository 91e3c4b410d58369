"""Tasks for a GpuWorker under test, on a machine that may have no GPU.

Imported inside the worker process (GpuWorker(task_modules=...)) before it selects its device:
CUDA's device selection and health check are replaced by a flag, so that `poison` can stand in
for a sticky CUDA error (a kernel that broke its context) on any machine."""

from __future__ import annotations

import os
import signal
from typing import Any

import torch

from autotune.measure.worker import register_task

_context = {"broken": False}


def _synchronize(*args: object) -> None:
    if _context["broken"]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


torch.cuda.set_device = lambda device: None  # type: ignore[assignment]
torch.cuda.synchronize = _synchronize  # type: ignore[assignment]


def ping(payload: dict[str, Any]) -> dict[str, Any]:
    return {"status": "ok", "pid": os.getpid()}


def segfault(payload: dict[str, Any]) -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGSEGV)
    return {"status": "ok"}


def exit_code(payload: dict[str, Any]) -> dict[str, Any]:
    os._exit(int(payload["code"]))


def poison(payload: dict[str, Any]) -> dict[str, Any]:
    _context["broken"] = True
    return {"status": "ok"}


for _name, _fn in (("ping", ping), ("segfault", segfault), ("exit_code", exit_code),
                   ("poison", poison)):
    register_task(_name, _fn)
