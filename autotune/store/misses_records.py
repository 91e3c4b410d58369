"""What the store hands out about runtime misses (kept apart from records.py: a frozen value
that crosses the store's boundary, no ORM object)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model.problem import Problem


@dataclass(frozen=True)
class MissRecord:
    """A problem `attention()` served without an exact tuned entry on one GPU model, by one
    path, `count` times over every process that recorded it (times: ISO 8601, UTC)."""

    device_name: str
    compute_capability: int
    sm_count: int
    problem: Problem
    path: str
    count: int
    first_seen: str
    last_seen: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "device_name": self.device_name,
            "compute_capability": self.compute_capability,
            "sm_count": self.sm_count,
            "problem": self.problem.as_dict(),
            "path": self.path,
            "count": self.count,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
        }
