"""Run GPU work for untrusted kernels in a separate process that may die.

A candidate kernel can take its process down (illegal address, a hang, a poisoned CUDA context).
GpuWorker keeps one spawned process per device; each request has a timeout; a crash, a timeout
or a sticky CUDA error ends that request with a status and reason, and the next request gets a
fresh process. The caller's process never touches the candidate's CUDA context.
"""

from __future__ import annotations

import multiprocessing
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

TIMEOUT = "timeout"
CRASHED = "crashed"
ERROR = "error"
STARTUP_ALLOWANCE_S = 180.0
REAP_S = 10.0  # how long a dead worker is waited for, so that its exit status is known


# name -> function(payload) -> reply. Filled by the task modules a worker imports at start
# (DEFAULT_TASK_MODULES), so that the spawned process knows them too.
TASKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
DEFAULT_TASK_MODULES = ("autotune.measure.gpu_tasks",)


def register_task(name: str, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Make `fn` callable in workers; it must be importable there (a module-level function)."""
    TASKS[name] = fn


def _context_is_healthy() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any CUDA error here means the context is gone
        return False


def _serve(conn: Connection, device: int, task_modules: tuple[str, ...]) -> None:
    import importlib

    import torch

    for module in task_modules:
        importlib.import_module(module)
    torch.cuda.set_device(device)
    while True:
        try:
            task, payload = conn.recv()
        except EOFError:
            return
        try:
            reply = TASKS[task]({**payload, "device": device})
        except Exception as exc:  # noqa: BLE001 - every failure is reported as data
            reply = {"status": ERROR, "reason": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc(limit=8)}
        fatal = not _context_is_healthy()
        if fatal:
            reply["fatal"] = True
            reply["status"] = CRASHED
            reply["reason"] = "CUDA context lost: " + str(reply.get("reason", ""))
        conn.send(reply)
        if fatal:
            return


def death(exitcode: int | None) -> str:
    """How a worker process ended, in words: its signal or its exit code."""
    if exitcode is None:
        return f"worker process stopped answering and was still running after {REAP_S:.0f} s"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"worker process killed by {name} (signal {-exitcode})"
    return f"worker process exited with exit code {exitcode}"


class GpuWorker:
    def __init__(self, device: int = 0,
                 task_modules: tuple[str, ...] = DEFAULT_TASK_MODULES) -> None:
        self.device = device
        self.task_modules = task_modules
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._starts = 0

    @property
    def restarts(self) -> int:
        """Worker processes started after the first: after a crash, a hang or a broken CUDA
        context."""
        return max(0, self._starts - 1)

    def _start(self) -> None:
        self._starts += 1
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.device, self.task_modules),
                                 daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def _stop(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
        if self._proc is not None:
            self._proc.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def request(self, task: str, payload: dict[str, Any],
                timeout: float = 120.0) -> dict[str, Any]:
        startup = 0.0
        if self._proc is None or not self._proc.is_alive():
            self._stop()
            self._start()
            startup = STARTUP_ALLOWANCE_S  # importing torch, building/loading the launcher
        assert self._conn is not None and self._proc is not None
        try:
            self._conn.send((task, payload))
            answered = self._conn.poll(timeout + startup)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            answered = True  # it died before the request arrived: recv says so below
        if not answered:
            self._stop()
            return {"status": TIMEOUT, "reason": f"no answer within {timeout:.0f} s (hang?)"}
        try:
            reply: dict[str, Any] = self._conn.recv()
        except (EOFError, ConnectionResetError, BrokenPipeError):
            self._proc.join(REAP_S)  # reaped, its exit status is known (not None)
            reason = death(self._proc.exitcode)
            self._stop()
            return {"status": CRASHED, "reason": reason}
        if reply.get("fatal"):
            self._stop()
        return reply

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> GpuWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
