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

from ..model.problem import MAX_SIZE
from ..model.target import MAX_CC, MIN_CC
from .exchange import MAX_MEDIAN_US, MIN_MEDIAN_US, BrokenRow, parse_device
from .models import Baseline, BestConfig, Build, Device, RuntimeMiss
from .records import DeviceInfo

# An artifact key as build.cache makes it, or a replayed recording's (tune.backends): never a
# path separator or anything else that could leave the cubin cache or reach generated code.
_BUILD_KEY = re.compile(r"(replay-)?[0-9a-f]{16,64}")
# How dispatch names the path that served a miss (runtime.attention: "nearest:sdpa", ...).
_MISS_PATH = re.compile(r"[a-z][a-z0-9_:-]{0,15}")


def positive(value: Any) -> TypeGuard[float]:
    """A finite number above zero (not a bool, not text that SQLite kept in a number column)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def is_time(value: Any) -> bool:
    """A time a kernel or torch SDPA can take: from half a microsecond to an hour."""
    return positive(value) and MIN_MEDIAN_US <= value <= MAX_MEDIAN_US


def device_of(row: Device) -> DeviceInfo:
    try:
        return parse_device({"name": row.name, "compute_capability": row.compute_capability,
                             "sm_count": row.sm_count, "driver_version": row.driver_version,
                             "cuda_version": row.cuda_version})
    except BrokenRow as exc:
        raise BrokenRow(f"stored device #{row.id} is not valid: {exc}") from None


def check_best_numbers(row: BestConfig) -> None:
    """The times, speed-ups and trial count of a best row: a negative, infinite or absurd one
    would win every comparison dispatch and `report` make."""
    columns = {name: getattr(row, name) for name in (
        "median_us", "p20_us", "p80_us", "sdpa_default_us", "sdpa_flash_us", "runner_up_us")}
    try:
        for name, value in columns.items():
            if not (is_time(value) or value is None and name != "median_us"):
                raise BrokenRow(f"{name} must be a time from {MIN_MEDIAN_US} us to an hour, "
                                f"got {value!r}")
        for speedup, sdpa in (("speedup_vs_default", "sdpa_default_us"),
                              ("speedup_vs_flash", "sdpa_flash_us")):
            value = getattr(row, speedup)
            # written as the SDPA time over the median: any other value was not written by us
            if value is not None and not (positive(value) and columns[sdpa] is not None
                                          and math.isclose(value,
                                                           columns[sdpa] / row.median_us,
                                                           rel_tol=1e-6)):
                raise BrokenRow(f"{speedup} {value!r} is not {sdpa} / median_us")
        if not positive(row.tflops):
            raise BrokenRow(f"tflops must be a positive number, got {row.tflops!r}")
        if not (isinstance(row.trials, int) and 0 <= row.trials <= MAX_SIZE):
            raise BrokenRow(f"trials must be an integer from 0 to {MAX_SIZE}, "
                            f"got {row.trials!r}")
    except BrokenRow as exc:
        raise BrokenRow(f"stored best config #{row.id} is not valid: {exc}") from None


def check_baseline(row: Baseline) -> None:
    for name in ("median_us", "p20_us", "p80_us"):
        if not is_time(getattr(row, name)):
            raise BrokenRow(f"stored baseline #{row.id} has no valid {name}: "
                            f"{getattr(row, name)!r}")
    if not isinstance(row.backend, str) or not row.backend.isidentifier():
        raise BrokenRow(f"stored baseline #{row.id} has no valid backend: {row.backend!r}")


def build_key_of(row: Build) -> str:
    """The artifact key of a build row; BrokenRow for one that cannot be a key."""
    if not isinstance(row.artifact_key, str) or not _BUILD_KEY.fullmatch(row.artifact_key):
        raise BrokenRow(f"stored build #{row.id} has no valid artifact_key: "
                        f"{row.artifact_key!r}")
    return row.artifact_key


def check_miss(row: RuntimeMiss) -> None:
    """A runtime miss's count ranks what `tune --misses` tunes; its device and path are shown."""
    def integer(value: Any, low: int, high: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

    reason = (
        "count" if not integer(row.count, 1, 2**63 - 1)
        else "compute_capability" if not integer(row.compute_capability, MIN_CC, MAX_CC)
        else "sm_count" if not integer(row.sm_count, 1, MAX_SIZE)
        else "path" if not (isinstance(row.path, str) and _MISS_PATH.fullmatch(row.path))
        else "device_name" if not (isinstance(row.device_name, str) and row.device_name
                                   and row.device_name.isprintable())
        else "first_seen" if row.first_seen is None
        else "last_seen" if row.last_seen is None else "")
    if reason:
        raise BrokenRow(f"stored runtime miss #{row.id} has no valid {reason}: "
                        f"{getattr(row, reason)!r}")
