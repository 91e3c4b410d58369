"""What a row read back from the tuning database must hold before it is served.

SQLite stores what it is given (text in an integer column, -1 or infinity as a time), and a
database shared by many workers, or copied from elsewhere, may have been written by anything.
So a row is checked as it is read, by the rules an imported entry passes (store.exchange; its
times without the check against the GPU's peak, which test and replayed databases exceed):
one that fails is a BrokenRow naming its table and id, which the reader refuses while it
serves the rest.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeGuard

from .._shown import shown
from ..model.problem import MAX_SIZE
from ..model.target import MAX_CC, MIN_CC
from .exchange import MAX_MEDIAN_US, MIN_MEDIAN_US, BrokenRow, parse_device
from .models import (
    WORK_STATES,
    Baseline,
    BestConfig,
    Build,
    Device,
    Measurement,
    RuntimeMiss,
    WorkItem,
)
from .records import DeviceInfo

# An artifact key as build.cache makes it, or a replayed recording's (tune.backends): never a
# path separator or anything else that could leave the cubin cache or reach generated code.
_BUILD_KEY = re.compile(r"(replay-)?[0-9a-f]{16,64}")
# How dispatch names the path that served a miss (runtime.attention: "nearest:sdpa", ...).
_MISS_PATH = re.compile(r"[a-z][a-z0-9_:-]{0,15}")
# A work item's families as `tune --enqueue` writes them: a comma list of family names.
_FAMILIES = re.compile(r"([a-z][a-z0-9_]{0,31}(,[a-z][a-z0-9_]{0,31})*)?")

# How a refusal names a row of each table that refers to others: "stored best config #4 ...".
ROW_NAMES: dict[type[Any], str] = {
    BestConfig: "best config",
    Measurement: "measurement",
    Baseline: "baseline",
    Build: "build",
    RuntimeMiss: "runtime miss",
    WorkItem: "work item",
}


def referenced(row: Any, relation: str) -> Any:
    """The row that `row` refers to by the foreign key of `relation` (its `relation`_id);
    BrokenRow when the key names no row: SQLite does not enforce foreign keys, and a database
    edited by hand, or restored in part, may hold one that names nothing."""
    target = getattr(row, relation)
    if target is None:
        raise BrokenRow(
            f"stored {ROW_NAMES[type(row)]} #{row.id} refers to {relation} "
            f"#{shown(getattr(row, f'{relation}_id'))}, which is not there"
        )
    return target


def _integer(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def positive(value: Any) -> TypeGuard[float]:
    """A finite number above zero (not a bool, not text that SQLite kept in a number column)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def is_time(value: Any) -> bool:
    """A time a kernel or torch SDPA can take: from half a microsecond to an hour."""
    return positive(value) and MIN_MEDIAN_US <= value <= MAX_MEDIAN_US


def readable(value: Any) -> bool:
    """Text that can be shown as it is: printable, and not bytes read back as U+FFFD
    (schema._text_of: SQLite keeps text that is not UTF-8)."""
    return isinstance(value, str) and value.isprintable() and "\ufffd" not in value


def device_of(row: Device) -> DeviceInfo:
    try:
        if not readable(row.name):
            raise BrokenRow(f"name {shown(row.name)} is not printable UTF-8 text")
        return parse_device(
            {
                "name": row.name,
                "compute_capability": row.compute_capability,
                "sm_count": row.sm_count,
                "driver_version": row.driver_version,
                "cuda_version": row.cuda_version,
            }
        )
    except BrokenRow as exc:
        raise BrokenRow(f"stored device #{row.id} is not valid: {exc}") from None


def check_best_numbers(row: BestConfig) -> None:
    """The times, speed-ups and trial count of a best row: a negative, infinite or absurd one
    would win every comparison dispatch and `report` make."""
    columns = {
        name: getattr(row, name)
        for name in (
            "median_us",
            "p20_us",
            "p80_us",
            "sdpa_default_us",
            "sdpa_flash_us",
            "runner_up_us",
        )
    }
    try:
        for name, value in columns.items():
            if not (is_time(value) or value is None and name != "median_us"):
                raise BrokenRow(
                    f"{name} must be a time from {MIN_MEDIAN_US} us to an hour, got {value!r}"
                )
        for speedup, sdpa in (
            ("speedup_vs_default", "sdpa_default_us"),
            ("speedup_vs_flash", "sdpa_flash_us"),
        ):
            value = getattr(row, speedup)
            # written as the SDPA time over the median: any other value was not written by us
            if value is not None and not (
                positive(value)
                and columns[sdpa] is not None
                and math.isclose(value, columns[sdpa] / row.median_us, rel_tol=1e-6)
            ):
                raise BrokenRow(f"{speedup} {value!r} is not {sdpa} / median_us")
        if not positive(row.tflops):
            raise BrokenRow(f"tflops must be a positive number, got {row.tflops!r}")
        if not (isinstance(row.trials, int) and 0 <= row.trials <= MAX_SIZE):
            raise BrokenRow(f"trials must be an integer from 0 to {MAX_SIZE}, got {row.trials!r}")
    except BrokenRow as exc:
        raise BrokenRow(f"stored best config #{row.id} is not valid: {exc}") from None


def check_baseline(row: Baseline) -> None:
    for name in ("median_us", "p20_us", "p80_us"):
        if not is_time(getattr(row, name)):
            raise BrokenRow(
                f"stored baseline #{row.id} has no valid {name}: {getattr(row, name)!r}"
            )
    if not isinstance(row.backend, str) or not row.backend.isidentifier():
        raise BrokenRow(f"stored baseline #{row.id} has no valid backend: {row.backend!r}")


def build_key_of(row: Build) -> str:
    """The artifact key of a build row; BrokenRow for one that cannot be a key."""
    if not isinstance(row.artifact_key, str) or not _BUILD_KEY.fullmatch(row.artifact_key):
        raise BrokenRow(f"stored build #{row.id} has no valid artifact_key: {row.artifact_key!r}")
    return row.artifact_key


def check_miss(row: RuntimeMiss) -> None:
    """A runtime miss's count ranks what `tune --misses` tunes; its device and path are shown."""
    reason = (
        "count"
        if not _integer(row.count, 1, 2**63 - 1)
        else "compute_capability"
        if not _integer(row.compute_capability, MIN_CC, MAX_CC)
        else "sm_count"
        if not _integer(row.sm_count, 1, MAX_SIZE)
        else "path"
        if not (isinstance(row.path, str) and _MISS_PATH.fullmatch(row.path))
        else "device_name"
        if not (readable(row.device_name) and row.device_name)
        else "first_seen"
        if row.first_seen is None
        else "last_seen"
        if row.last_seen is None
        else ""
    )
    if reason:
        raise BrokenRow(
            f"stored runtime miss #{row.id} has no valid {reason}: {shown(getattr(row, reason))}"
        )


def check_work_item(row: WorkItem) -> None:
    """What `queue` shows of an item and a worker matches it by: its GPU model, state,
    families and attempts (its settings are checked when a worker takes it)."""
    reason = (
        "device_name"
        if not (readable(row.device_name) and row.device_name)
        else "compute_capability"
        if not _integer(row.compute_capability, MIN_CC, MAX_CC)
        else "sm_count"
        if not _integer(row.sm_count, 1, MAX_SIZE)
        else "state"
        if row.state not in WORK_STATES
        else "families"
        if not (isinstance(row.families, str) and _FAMILIES.fullmatch(row.families))
        else "attempts"
        if not _integer(row.attempts, 0, MAX_SIZE)
        else ""
    )
    if reason:
        raise BrokenRow(
            f"stored work item #{row.id} has no valid {reason}: {shown(getattr(row, reason))}"
        )
