"""Run GPU work for untrusted kernels in a separate process that may die.

A candidate kernel can take its process down (illegal address, a hang, a poisoned CUDA context).
GpuWorker keeps one spawned process per device; each request has a timeout; a crash, a timeout
or a sticky CUDA error ends that request with a WorkerFailure (a Status and a reason), and the
next request gets a fresh process. The caller's process never touches the candidate's CUDA
context. Requests and replies are typed records (measure.protocol), pickled across the pipe.
"""

from __future__ import annotations

import multiprocessing
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar, cast

from ..model.status import Status

STARTUP_ALLOWANCE_S = 180.0
REAP_S = 10.0  # how long a dead worker is waited for, so that its exit status is known

R = TypeVar("R", covariant=True)
Q = TypeVar("Q", bound="Request[Any]")


class Request(Generic[R]):
    """A piece of GPU work whose answer is an R. Each kind is a frozen dataclass deriving from
    Request[its reply type], pickled to the worker process; its task is found by its type."""

    __slots__ = ()


@dataclass(frozen=True)
class WorkerFailure:
    """The worker's own answer when a request did not produce its reply: it ran past its
    time (TIMEOUT), the process died or its CUDA context broke (CRASHED), or it raised
    (ERROR)."""

    status: Status
    reason: str
    traceback: str = ""


# Request type -> function(request, device) -> reply. Filled by the task modules a worker
# imports at start (DEFAULT_TASK_MODULES), so that the spawned process knows them too.
TASKS: dict[type[Any], Callable[[Any, int], object]] = {}
DEFAULT_TASK_MODULES = ("autotune.measure.gpu_tasks",)


def register_task(kind: type[Q], fn: Callable[[Q, int], object]) -> None:
    """Make `fn` answer requests of type `kind` in workers; both must be importable there
    (module level), and `fn` returns the reply type `kind` names."""
    TASKS[kind] = fn


def _context_is_healthy() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any CUDA error here means the context is gone
        return False


def _answer(request: Request[Any], device: int) -> object:
    task = TASKS.get(type(request))
    if task is None:
        return WorkerFailure(
            Status.ERROR,
            f"this worker has no task for {type(request).__name__}"
            f" (task modules: {sorted({t.__module__ for t in TASKS})})",
        )
    try:
        return task(request, device)
    except Exception as exc:  # noqa: BLE001 - every failure is reported as data
        return WorkerFailure(
            Status.ERROR, f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=8)
        )


def _serve(conn: Connection, device: int, task_modules: tuple[str, ...]) -> None:
    import importlib

    import torch

    for module in task_modules:
        importlib.import_module(module)
    torch.cuda.set_device(device)
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        reply = _answer(request, device)
        if not _context_is_healthy():  # whatever the task said, this process is done for
            said = reply.reason if isinstance(reply, WorkerFailure) else "after a reply"
            conn.send(WorkerFailure(Status.CRASHED, f"CUDA context lost: {said}"))
            return
        conn.send(reply)


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
    def __init__(
        self, device: int = 0, task_modules: tuple[str, ...] = DEFAULT_TASK_MODULES
    ) -> None:
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
        self._proc = ctx.Process(
            target=_serve, args=(child, self.device, self.task_modules), daemon=True
        )
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

    def request(self, request: Request[R], timeout: float = 120.0) -> R | WorkerFailure:
        """The reply to `request`, or how the worker failed to give one."""
        startup = 0.0
        if self._proc is None or not self._proc.is_alive():
            self._stop()
            self._start()
            startup = STARTUP_ALLOWANCE_S  # importing torch, building/loading the launcher
        assert self._conn is not None and self._proc is not None
        try:
            self._conn.send(request)
            answered = self._conn.poll(timeout + startup)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            answered = True  # it died before the request arrived: recv says so below
        if not answered:
            self._stop()
            return WorkerFailure(Status.TIMEOUT, f"no answer within {timeout:.0f} s (hang?)")
        try:
            reply = self._conn.recv()
        except (EOFError, ConnectionResetError, BrokenPipeError):
            self._proc.join(REAP_S)  # reaped, its exit status is known (not None)
            reason = death(self._proc.exitcode)
            self._stop()
            return WorkerFailure(Status.CRASHED, reason)
        if isinstance(reply, WorkerFailure) and reply.status is Status.CRASHED:
            self._stop()  # it has exited (a lost CUDA context): the next request starts anew
        return cast("R | WorkerFailure", reply)

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> GpuWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
