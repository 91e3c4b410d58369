"""The work queue of tuning in the database (`tune --enqueue`, `cute-autotune worker`,
`cute-autotune queue`): items are problems to tune on one GPU model (name, compute capability
and SM count), each with the families and search settings it was enqueued with.

A worker takes the oldest item of its own GPU model that is queued, or running under a lease
that ran out (its worker died or lost the database), and holds it by a lease it renews while it
runs. Taking is one transaction that cannot hand an item to two workers: on PostgreSQL a row
lock (`FOR UPDATE SKIP LOCKED`: workers never wait on each other's candidates), on SQLite the
write lock every writable transaction takes first (BEGIN IMMEDIATE, store.schema). A renewal or
an end from a worker that no longer holds the item (its lease ran out and another took it)
changes nothing and says so. Lease times are the workers' own clocks in UTC: hosts sharing a
PostgreSQL queue must keep their clocks in step (NTP) to well within the lease.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, and_, func, or_, select, update
from sqlalchemy.orm import joinedload

from ..measure.records import DeviceInfo, gpu_model_words
from ..model.problem import Problem
from .models import DONE, FAILED, QUEUED, RUNNING, ProblemRow, WorkItem, utcnow
from .repo import TuningStore
from .row_checks import check_work_item
from .row_helpers import _problem_or_none, _served_problem, _utc, same_gpu


@dataclass(frozen=True)
class QueuedItem:
    id: int
    device_name: str
    compute_capability: int
    sm_count: int
    problem: Problem
    families: tuple[str, ...]  # empty: every family the worker's GPU runs
    settings: dict[str, Any]  # SearchSettings fields
    state: str
    worker: str | None
    attempts: int
    lease_until: datetime | None
    enqueued_at: datetime | None  # None: the stored date was unreadable (models.StoredDateTime)
    started_at: datetime | None
    finished_at: datetime | None
    message: str | None

    @property
    def gpu_model(self) -> str:
        return gpu_model_words(self.device_name, self.compute_capability, self.sm_count)


def _of_model(device: DeviceInfo) -> tuple[Any, ...]:
    return same_gpu(device, WorkItem.device_name, WorkItem.compute_capability, WorkItem.sm_count)


def _maybe_utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else _utc(moment)


def _settings_or_none(row: WorkItem) -> dict[str, Any] | None:
    """The item's search settings; None when the stored text is not a JSON object."""
    try:
        settings = json.loads(row.settings_json)
    except (TypeError, ValueError):
        return None
    return settings if isinstance(settings, dict) else None


def _item(row: WorkItem, problem: Problem) -> QueuedItem:
    return QueuedItem(
        row.id,
        row.device_name,
        row.compute_capability,
        row.sm_count,
        problem,
        tuple(f for f in row.families.split(",") if f),
        _settings_or_none(row) or {},
        row.state,
        row.worker,
        row.attempts,
        _maybe_utc(row.lease_until),
        _maybe_utc(row.enqueued_at),
        _maybe_utc(row.started_at),
        _maybe_utc(row.finished_at),
        row.message,
    )


class WorkQueue:
    """The queue in a tuning database (`store`)."""

    def __init__(self, store: TuningStore) -> None:
        self.store = store

    def enqueue(
        self,
        device: DeviceInfo,
        problems: list[Problem],
        families: list[str],
        settings: dict[str, Any],
    ) -> tuple[int, int]:
        """Add an item per problem for `device`'s GPU model; one already there for the same
        problem and families (in any state) is kept as it is. Returns (added, kept)."""
        names = ",".join(sorted(families))
        added = 0
        with self.store._transaction() as s:
            for problem in problems:
                problem_id = self.store._problem(s, problem).id
                exists = s.scalars(
                    select(WorkItem.id).where(
                        *_of_model(device),
                        WorkItem.problem_id == problem_id,
                        WorkItem.families == names,
                    )
                ).first()
                if exists is not None:
                    continue
                s.add(
                    WorkItem(
                        device_name=device.name,
                        compute_capability=device.compute_capability,
                        sm_count=device.sm_count,
                        problem_id=problem_id,
                        families=names,
                        settings_json=json.dumps(settings, sort_keys=True),
                        state=QUEUED,
                        attempts=0,
                        enqueued_at=utcnow(),
                    )
                )
                added += 1
        return added, len(problems) - added

    def take(self, device: DeviceInfo, worker: str, lease_s: float) -> QueuedItem | None:
        """The oldest item of `device`'s GPU model that is queued or whose lease ran out, now
        held by `worker` for `lease_s` seconds; None when there is none."""
        now = utcnow()
        with self.store._transaction() as s:
            query = (
                select(WorkItem)
                .where(
                    *_of_model(device),
                    or_(
                        WorkItem.state == QUEUED,
                        and_(WorkItem.state == RUNNING, WorkItem.lease_until < now),
                    ),
                )
                .order_by(WorkItem.id)
                .limit(1)
            )
            if s.get_bind().dialect.name == "postgresql":
                query = query.with_for_update(skip_locked=True)
            while (row := s.scalars(query).first()) is not None:
                stored = s.get(ProblemRow, row.problem_id)
                problem = _problem_or_none(stored) if stored is not None else None
                if problem is None:  # a broken problem row: refused, never run
                    row.state, row.finished_at = FAILED, now
                    row.message = f"problem row {row.problem_id} is not a valid problem; not run"
                    s.flush()
                    continue
                settings = _settings_or_none(row)
                if settings is None:  # a hostile settings row: refused, never run
                    row.state, row.finished_at = FAILED, now
                    row.message = (
                        f"work item {row.id}: its settings are not a JSON object of "
                        "search settings; not run"
                    )
                    s.flush()
                    continue
                if row.state == RUNNING:
                    row.message = f"taken again: the lease of {row.worker} ran out"
                row.state, row.worker = RUNNING, worker
                row.lease_until = now + timedelta(seconds=lease_s)
                row.attempts += 1
                row.started_at = now
                return _item(row, problem)
            return None

    def renew(self, item_id: int, worker: str, lease_s: float) -> bool:
        """Extend `worker`'s lease; False when it no longer holds the item."""
        with self.store._transaction() as s:
            done = s.execute(
                update(WorkItem)
                .where(
                    WorkItem.id == item_id, WorkItem.worker == worker, WorkItem.state == RUNNING
                )
                .values(lease_until=utcnow() + timedelta(seconds=lease_s))
            )
            return bool(cast(CursorResult[Any], done).rowcount)

    def finish(self, item_id: int, worker: str, ok: bool, message: str = "") -> bool:
        """Mark `worker`'s item done (or failed, with the reason); False when it no longer
        holds it (its lease ran out and another worker took it)."""
        with self.store._transaction() as s:
            values: dict[str, Any] = {
                "state": DONE if ok else FAILED,
                "finished_at": utcnow(),
                "lease_until": None,
            }
            if message:  # else the item keeps its note (e.g. that it was taken again)
                values["message"] = message[:2000]
            done = s.execute(
                update(WorkItem)
                .where(
                    WorkItem.id == item_id, WorkItem.worker == worker, WorkItem.state == RUNNING
                )
                .values(**values)
            )
            return bool(cast(CursorResult[Any], done).rowcount)

    def pending(self, device: DeviceInfo) -> int:
        """Items of `device`'s GPU model still queued or running."""
        with self.store._transaction() as s:
            return int(
                s.scalar(
                    select(func.count())
                    .select_from(WorkItem)
                    .where(*_of_model(device), WorkItem.state.in_((QUEUED, RUNNING)))
                )
                or 0
            )

    def items(self) -> list[QueuedItem]:
        """Every item, oldest first (a broken row, or one whose problem is, left out and
        logged)."""
        with self.store._transaction() as s:
            rows = s.scalars(
                select(WorkItem).options(joinedload(WorkItem.problem)).order_by(WorkItem.id)
            )
            return [
                _item(row, problem)
                for row in rows
                if (problem := _served_problem(check_work_item, row)) is not None
            ]
