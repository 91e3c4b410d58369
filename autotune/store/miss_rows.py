"""Runtime misses: what `attention()` served untuned, counted per process and merged into the
database."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import case, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import joinedload

from ..model.problem import Problem
from .base import StoreBase
from .misses_records import MissRecord
from .models import (
    RuntimeMiss,
)
from .records import DeviceInfo
from .row_checks import (
    check_miss,
)
from .row_helpers import (
    _InsertRace,
    _iso_utc,
    _merge_misses,
    _MissKey,
    _served_problem,
    same_gpu,
)


class MissRows(StoreBase):
    """Runtime misses: problems served without an exact tuned entry, merged across processes."""

    # -- runtime misses ---------------------------------------------------------------------

    def add_misses(
        self, entries: Sequence[tuple[DeviceInfo, Problem, str, int, datetime, datetime]]
    ) -> int:
        """Add counts of runtime misses, (device, problem, path, count, first seen, last seen)
        each, in one transaction: a stored key's count grows by `count`, its first seen becomes
        the earlier and its last seen the later; a new key is inserted. Entries of one key
        (device name, compute capability, SM count, problem, path) are merged first. Returns
        the rows touched.

        Safe beside other processes adding the same keys: counts are added in SQL (`count =
        count + n`, never read and written back), and an insert that loses the race to a
        concurrent one (IntegrityError) is retried once in a fresh transaction, which then
        finds the other's row and adds to it."""
        merged = _merge_misses(entries)
        if not merged:
            return 0
        try:
            return self._add_misses(merged, retry=True)
        except _InsertRace:
            return self._add_misses(merged, retry=False)

    def _add_misses(
        self, merged: dict[_MissKey, tuple[int, datetime, datetime]], *, retry: bool
    ) -> int:
        with self._transaction() as s:
            try:
                problems = self._problem_ids(s, {key[3] for key in merged})
                for (name, cc, sm, problem, path), (count, first, last) in merged.items():
                    seen = (
                        update(RuntimeMiss)
                        .where(
                            RuntimeMiss.device_name == name,
                            RuntimeMiss.compute_capability == cc,
                            RuntimeMiss.sm_count == sm,
                            RuntimeMiss.problem_id == problems[problem],
                            RuntimeMiss.path == path,
                        )
                        .values(
                            count=RuntimeMiss.count + count,
                            first_seen=case(
                                (RuntimeMiss.first_seen > first, first),
                                else_=RuntimeMiss.first_seen,
                            ),
                            last_seen=case(
                                (RuntimeMiss.last_seen < last, last), else_=RuntimeMiss.last_seen
                            ),
                        )
                        .execution_options(synchronize_session=False)
                    )
                    if cast("CursorResult[Any]", s.execute(seen)).rowcount == 0:
                        s.add(
                            RuntimeMiss(
                                device_name=name,
                                compute_capability=cc,
                                sm_count=sm,
                                problem_id=problems[problem],
                                path=path,
                                count=count,
                                first_seen=first,
                                last_seen=last,
                            )
                        )
                s.flush()
            except IntegrityError:
                if not retry:
                    raise
                raise _InsertRace from None  # leaves the transaction, which rolls back
            return len(merged)

    def list_misses(
        self, device: DeviceInfo | str | None = None, *, limit: int | None = None
    ) -> list[MissRecord]:
        """Stored runtime misses, the most frequent first (of one GPU model: name, compute
        capability and SM count; of a device name; or of every device)."""
        with self._reading() as s:
            query = select(RuntimeMiss).options(joinedload(RuntimeMiss.problem))
            if isinstance(device, str):
                query = query.where(RuntimeMiss.device_name == device)
            elif device is not None:
                query = query.where(
                    *same_gpu(
                        device,
                        RuntimeMiss.device_name,
                        RuntimeMiss.compute_capability,
                        RuntimeMiss.sm_count,
                    )
                )
            query = query.order_by(
                RuntimeMiss.count.desc(), RuntimeMiss.last_seen.desc(), RuntimeMiss.id
            )
            # no LIMIT in SQL: a refused row (text sorts above every count in SQLite) must not
            # take the place of one that is served
            found = [
                MissRecord(
                    row.device_name,
                    row.compute_capability,
                    row.sm_count,
                    problem,
                    row.path,
                    row.count,
                    _iso_utc(row.first_seen),
                    _iso_utc(row.last_seen),
                )
                for row in s.scalars(query)
                if (problem := _served_problem(check_miss, row)) is not None
            ]
            return found[:limit]
