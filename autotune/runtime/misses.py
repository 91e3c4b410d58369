"""Runtime misses: the problems `attention()` served without an exact tuned entry, counted per
process and added to the tuning database off the hot path, so that `cute-autotune misses`
shows what to tune next and `cute-autotune tune --misses` tunes it.

Counting costs the hot path one attribute increment: the runtime asks `MissRecorder.miss`
once per new dispatch key for that key's `Miss` and adds one to `Miss.calls` on every call it
serves (the first included). Nothing else happens on a call: no lock, no query, no write. A
daemon thread adds the counts not yet written to the database every `interval_s` seconds
(only when there are some), in one transaction, and an atexit hook adds the rest when the
process ends. A database that cannot be written loses nothing: the counts stay and the next
flush tries again (one warning per recorder says why). $CUTE_AUTOTUNE_RECORD_MISSES=0
turns recording off.

`last_seen` is the time of the flush that wrote a count, so it is at most `interval_s` late.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy.exc import SQLAlchemyError

from ..model.problem import Problem
from ..store.misses_records import MissRecord
from ..store.records import DeviceInfo
from ..store.repo import TuningStore
from ..store.schema import StoreError

__all__ = ["ENV", "PATH_LENGTH", "Miss", "MissRecord", "MissRecorder"]

ENV = "CUTE_AUTOTUNE_RECORD_MISSES"
PATH_LENGTH = 16  # runtime_misses.path is a String(16)

log = logging.getLogger(__name__)

# How misses are told apart: the database's key (a GPU model, not one machine's driver).
_Key = tuple[str, int, int, Problem, str]


def recording_enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


class Miss:
    """The counter of one (GPU model, problem, path): `calls` is what the runtime served,
    `written` how many of them are in the database."""

    __slots__ = ("device", "problem", "path", "calls", "written", "first_seen", "last_seen")

    def __init__(self, device: DeviceInfo, problem: Problem, path: str) -> None:
        self.device = device
        self.problem = problem
        self.path = path
        self.calls = 0
        self.written = 0
        self.first_seen = datetime.now(UTC)
        self.last_seen = self.first_seen

    def __repr__(self) -> str:
        return (
            f"Miss({self.device.name!r}, {self.problem.describe()!r}, {self.path!r}, "
            f"calls={self.calls}, written={self.written})"
        )


class MissRecorder:
    """The misses of one process. `store` returns the database to write to; it is called at
    each flush (never on a call), so it should hand back a store it keeps open."""

    def __init__(self, store: Callable[[], TuningStore], *, interval_s: float = 5.0) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._store = store
        self.interval_s = interval_s
        self._misses: dict[_Key, Miss] = {}
        self._lock = threading.Lock()  # guards _misses and the thread's start and stop
        self._flush_lock = threading.Lock()  # one flush at a time; miss() never waits on it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._at_exit_registered = False
        self._warned = False
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(ref))

    def miss(self, device: DeviceInfo, problem: Problem, path: str) -> Miss | None:
        """The counter of this (GPU model, problem, path), the same object every time; None
        when recording is off. Counts nothing itself: the caller adds one to `calls` per call
        it serves. Starts the flushing thread and the atexit flush the first time."""
        if not recording_enabled():
            return None
        if not path or len(path) > PATH_LENGTH:
            raise ValueError(f"a miss path is 1 to {PATH_LENGTH} characters, got {path!r}")
        key = (device.name, device.compute_capability, device.sm_count, problem, path)
        with self._lock:
            found = self._misses.get(key)
            if found is None:
                found = self._misses[key] = Miss(device, problem, path)
            if self._thread is None:
                self._start()
            return found

    def misses(self) -> list[Miss]:
        """Every counter of this process, in the order they were made."""
        with self._lock:
            return list(self._misses.values())

    def pending(self) -> bool:
        """Whether some calls are not in the database yet."""
        return any(m.calls != m.written for m in self.misses())

    def flush(self) -> int:
        """Add every count not yet written to the database, in one transaction; returns the
        rows touched (0 when nothing was pending or the database could not be written: then
        the counts are kept for the next flush)."""
        with self._flush_lock:
            now = datetime.now(UTC)
            todo = []
            for m in self.misses():
                calls = m.calls  # read once: the hot path may add to it meanwhile
                if calls > m.written:
                    todo.append((m, calls))
            if not todo:
                return 0
            entries = [
                (m.device, m.problem, m.path, calls - m.written, m.first_seen, now)
                for m, calls in todo
            ]
            try:
                touched = self._store().add_misses(entries)
            except (StoreError, SQLAlchemyError, OSError) as exc:
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "cute-autotune: runtime misses not recorded (kept for the next try): %s",
                        exc,
                    )
                return 0
            for m, calls in todo:
                m.written = calls
                m.last_seen = now
            return touched

    def close(self) -> None:
        """Stop the flushing thread and flush. A later `miss` starts them again."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
            if self._at_exit_registered:
                atexit.unregister(self._at_exit)
                self._at_exit_registered = False
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self.flush()

    # -- inside -----------------------------------------------------------------------------

    def _start(self) -> None:  # under self._lock
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name="cute-autotune-misses", daemon=True
        )
        self._thread.start()
        if not self._at_exit_registered:
            atexit.register(self._at_exit)
            self._at_exit_registered = True

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            if self.pending():
                self.flush()

    def _at_exit(self) -> None:
        self.close()

    def _forked(self) -> None:
        """In a child made by fork: the parent writes the counts it has, its thread does not
        exist here, and a lock it held would stay held. The child counts from here on and
        writes at exit, or from a thread started by its next new miss."""
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._thread = None
        for m in self._misses.values():
            m.written = m.calls
            m.first_seen = datetime.now(UTC)


def _after_fork(ref: weakref.ref[MissRecorder]) -> None:
    recorder = ref()
    if recorder is not None:
        recorder._forked()
