"""A tuning worker: takes the work items of its GPU model from the queue in the database
(store.queue), runs the same search as `tune` on each, and marks it done, renewing its lease
from a thread while the search runs. A worker killed at any point leaves its item running
under a lease that runs out; the next worker that asks takes it again and resumes its studies
(the trials a dead process left RUNNING are settled by the study, tune.study). A database
connection that breaks (the server restarted or ended it, the network dropped) costs the
transaction it was in, not the item nor the worker: the step is run again on a new connection
(an item resumes its studies, reusing every measurement already stored)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import ParamSpec, TypeVar

from .._process import this_process
from ..store.queue import QueuedItem, WorkQueue
from ..store.repo import TuningStore
from ..store.schema import lost_connection
from .backends import Backend
from .search import TuneOutcome
from .settings import SearchSettings
from .study import abandon_running
from .tuning import tune

# A step whose database connection broke is run again, up to this many times in a row, the
# waits between doubling from the first: 7.5 s in all, for a server that restarts.
CONNECTION_ATTEMPTS = 5
FIRST_RECONNECT_WAIT_S = 0.5

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class WorkerReport:
    name: str
    done: list[QueuedItem] = field(default_factory=list)
    failed: list[tuple[QueuedItem, str]] = field(default_factory=list)
    lost: list[QueuedItem] = field(default_factory=list)  # lease ran out and another took it


class LeaseLost(RuntimeError):
    pass


class _LeaseKeeper:
    """Renews a lease every third of its length until stopped; notes if it was lost."""

    def __init__(self, queue: WorkQueue, item: QueuedItem, worker: str, lease_s: float) -> None:
        self.lost = False
        self.trials = 0  # trials told so far: a tune's progress between connection breaks
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(queue, item, worker, lease_s),
            daemon=True,
            name=f"lease-{item.id}",
        )
        self._thread.start()

    def _run(self, queue: WorkQueue, item: QueuedItem, worker: str, lease_s: float) -> None:
        while not self._stop.wait(lease_s / 3):
            try:
                if not queue.renew(item.id, worker, lease_s):
                    self.lost = True
                    return
            except Exception:  # the database is away for a moment: the next renewal retries
                continue

    def check(self, _progress: object = None) -> None:
        """Called after every trial: a worker whose lease ran out (another took the item)
        stops the item here rather than measure beside the new holder."""
        self.trials += 1
        if self.lost:
            raise LeaseLost("the lease ran out and another worker took the item")

    def told(self) -> int:
        """Trials told so far (`check` counts them)."""
        return self.trials

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _reconnecting(step: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`step(*args, **kwargs)`, run again when the database connection broke under it (see
    the module's doc); other errors, and the last attempt's, are raised."""
    return _with_reconnects(partial(step, *args, **kwargs), lambda: 0)


def _with_reconnects(run: Callable[[], T], progress: Callable[[], int]) -> T:
    """`run()`, run again when the database connection broke under it, up to
    CONNECTION_ATTEMPTS times in a row. A break after `progress()` moved (a long tune that
    told trials since the last break) is not in a row with the ones before: the count starts
    again, so only a server that stays away fails the step, not one that drops now and then
    over hours of tuning."""
    attempt, seen = 1, progress()
    while True:
        try:
            return run()
        except Exception as exc:
            if progress() != seen:
                attempt, seen = 1, progress()
            if not lost_connection(exc) or attempt == CONNECTION_ATTEMPTS:
                raise
            # whether the trials in flight were told is unknown: the study settles them
            abandon_running()
            time.sleep(FIRST_RECONNECT_WAIT_S * 2 ** (attempt - 1))
            attempt += 1


def run_worker(
    db: str | None,
    backend: Backend,
    *,
    lease_s: float = 120.0,
    wait: bool = False,
    poll_s: float = 2.0,
    name: str | None = None,
    on_item: Callable[[QueuedItem], None] | None = None,
    on_outcome: Callable[[TuneOutcome], None] | None = None,
) -> WorkerReport:
    """Take and tune items of the backend's GPU model until none is left to take (with `wait`,
    until none of them is queued or running either: an item whose worker died is taken again
    once its lease runs out)."""
    queue = WorkQueue(_reconnecting(TuningStore, db))
    device = backend.device()
    report = WorkerReport(name or this_process().describe())
    while True:
        item = _reconnecting(queue.take, device, report.name, lease_s)
        if item is None:
            if wait and _reconnecting(queue.pending, device):
                time.sleep(poll_s)
                continue
            return report
        if on_item:
            on_item(item)
        keeper = _LeaseKeeper(queue, item, report.name, lease_s)
        try:
            # An item taken again completes its studies' budget (the trials its killed worker
            # ran count) instead of adding a budget to it: re-running an item measures nothing
            # twice (measurements already stored are reused).
            settings = SearchSettings(**{**item.settings, "resume": True})
            outcomes = _with_reconnects(
                partial(
                    tune,
                    item.problem,
                    db=db,
                    backend=backend,
                    settings=settings,
                    families=list(item.families) or None,
                    on_outcome=on_outcome,
                    on_progress=keeper.check,
                ),
                keeper.told,
            )
            ok = all(o.best for o in outcomes)
            reason = "" if ok else "no config of any family was timed"
        except Exception as exc:  # a failing item is a recorded result, not a dead worker
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        finally:
            keeper.stop()
        if not _reconnecting(queue.finish, item.id, report.name, ok, reason) or keeper.lost:
            report.lost.append(item)
        elif ok:
            report.done.append(item)
        else:
            report.failed.append((item, reason))
