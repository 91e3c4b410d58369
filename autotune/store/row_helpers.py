"""Helpers the store's row classes share: problem and config rows read back, device and problem
filters, get-or-create inside a transaction, the checks a read row must pass, and times in UTC."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, TypeVarTuple

from sqlalchemy import ColumnElement, Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .._shown import shown
from ..measure.environment import Environment
from ..model.config import Config, InvalidConfig
from ..model.problem import MAX_SIZE, Problem
from ..model.space import class_mismatch, validate_config
from .exchange import BrokenRow
from .models import (
    Baseline,
    Build,
    Device,
    KernelConfig,
    Measurement,
    ProblemRow,
    check_row_bounds,
)
from .records import DeviceInfo
from .row_checks import (
    build_key_of,
    referenced,
)

_log = logging.getLogger(__name__)


def problem_distance(a: Problem, b: Problem) -> float:
    """How far apart two problems of the same dtype, head dim and causality are.

    Sum of |log2 ratio| of Lq, Lk and B*Hq, plus half the |log2 ratio| of the GQA group size:
    a kernel tuned for a shape twice as long is as near as one for twice the batch.
    """
    return _distance(a, b.batch, b.heads_q, b.heads_kv, b.seqlen_q, b.seqlen_k)


def _distance(
    a: Problem, batch: int, heads_q: int, heads_kv: int, seqlen_q: int, seqlen_k: int
) -> float:
    """`problem_distance` from `a` to the problem of these sizes (and `a`'s class), computed
    on a row's columns: `nearest` ranks every row of a class without making a Problem of
    each."""

    def term(x: float, y: float) -> float:
        return abs(math.log2(x / y))

    return (
        term(a.seqlen_q, seqlen_q)
        + term(a.seqlen_k, seqlen_k)
        + term(a.batch * a.heads_q, batch * heads_q)
        + 0.5 * term(a.group_size, heads_q // heads_kv)
    )


def _problem_of(row: ProblemRow) -> Problem:
    """The stored problem, validated again: a broken row is refused, never run."""
    try:
        return Problem(
            row.batch,
            row.heads_q,
            row.heads_kv,
            row.seqlen_q,
            row.seqlen_k,
            row.head_dim,
            row.dtype,
            bool(row.causal),
            row.kv_cache,
            bool(row.backward),
            bool(row.deterministic),
        )
    except ValueError as exc:
        raise BrokenRow(f"stored problem #{row.id} is not valid: {exc}") from None


def _problem_or_none(row: ProblemRow | None) -> Problem | None:
    """`_problem_of`, None for a broken or missing row: a listing skips it (broken_rows names
    it)."""
    try:
        return None if row is None else _problem_of(row)
    except BrokenRow:
        return None


def _sizes_or_none(problem_id: Any, sizes: Sequence[Any]) -> tuple[int, ...] | None:
    """A problem row's batch, heads and lengths as `_distance` takes them, when they can be
    (integers of the contract's range, the query heads a multiple of the KV heads); else None,
    logged: a row with text or zero in them is passed over, never ranked."""
    if (
        all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIZE for v in sizes)
        and sizes[1] % sizes[2] == 0
    ):
        return tuple(sizes)
    _log.warning(
        "stored problem #%s is not valid: sizes %s: passed over for the next nearest",
        shown(problem_id),
        shown(tuple(sizes), 120),
    )
    return None


def _config_of(row: KernelConfig, problem: Problem | None = None) -> Config:
    """The stored config, validated again: a broken row is refused, never run."""
    try:
        if not isinstance(row.config_json, str):  # SQLite keeps bytes in a text column
            raise InvalidConfig([f"config_json is not text: {shown(row.config_json)}"])
        config = validate_config(Config.from_json(row.config_json))
    except InvalidConfig as exc:
        raise BrokenRow(f"stored config {row.digest} is not valid: {exc}") from None
    if config.digest != row.digest:
        raise BrokenRow(f"stored config {row.digest} does not match its digest {config.digest}")
    if problem is not None:
        mismatch = class_mismatch(problem, config)
        if mismatch:
            raise BrokenRow(
                f"stored config {row.digest} is for another problem class ({mismatch} differ)"
            )
    return config


def _build_key(build: Build | None) -> str | None:
    """The artifact key of a measurement's build; None (logged) for a build row that cannot
    be one: the timing is then served as of an unknown build."""
    if build is None:
        return None
    try:
        return build_key_of(build)
    except BrokenRow as exc:
        _log.warning("%s: its timings are served without it", exc)
        return None


def _env_columns(env: Environment | None) -> dict[str, Any]:
    """The columns a timing's environment is stored in (measurements, baselines)."""
    if env is None:
        return {}
    return {
        "regime": env.regime or None,
        "driver_version": env.driver_version or None,
        "cuda_version": env.cuda_version or None,
        "torch_version": env.torch_version or None,
        "cudnn_version": env.cudnn_version or None,
        "sm_clock_mhz": env.sm_clock_mhz,
        "power_w": env.power_w,
    }


def _env_of(row: Measurement | Baseline) -> Environment | None:
    if row.regime is None and row.torch_version is None:
        return None
    return Environment(
        row.regime or "",
        row.driver_version or "",
        row.cuda_version or "",
        row.torch_version or "",
        row.cudnn_version or "",
        row.sm_clock_mhz,
        row.power_w,
    )


def same_gpu(
    device: DeviceInfo,
    name: Any = Device.name,
    capability: Any = Device.compute_capability,
    sm_count: Any = Device.sm_count,
) -> tuple[Any, ...]:
    """The conditions that a row is of `device`'s GPU model (name, compute capability and SM
    count: driver and CUDA versions may differ between machines), on the given columns."""
    return (
        name == device.name,
        capability == device.compute_capability,
        sm_count == device.sm_count,
    )


Columns = TypeVarTuple("Columns")


def _of_device(query: Select[*Columns], device: DeviceInfo | str | None) -> Select[*Columns]:
    """`query` (joined to devices) narrowed to one GPU model (see `same_gpu`), a device name,
    or left as it is for every device."""
    if isinstance(device, str):
        return query.where(Device.name == device)
    if device is not None:
        return query.where(*same_gpu(device))
    return query


def _is_problem(problem: Problem) -> tuple[ColumnElement[bool], ...]:
    """The conditions that a problems row is `problem` (uq_problems_shape's index)."""
    return tuple(getattr(ProblemRow, k) == v for k, v in problem.as_dict().items())


def _in_class(
    dtype: str,
    head_dim: int,
    causal: bool,
    kv_cache: str = "dense",
    backward: bool = False,
    deterministic: bool = False,
) -> tuple[ColumnElement[bool], ...]:
    """The conditions that a problems row is of this problem class (ix_problems_class): a
    config's fixed values, how the keys are held and which pass is timed (forward unless
    said)."""
    return (
        ProblemRow.dtype == dtype,
        ProblemRow.head_dim == head_dim,
        ProblemRow.causal == causal,
        ProblemRow.kv_cache == kv_cache,
        ProblemRow.backward == backward,
        ProblemRow.deterministic == deterministic,
    )


RowT = TypeVar("RowT", Device, ProblemRow, KernelConfig)


def _get_or_create(
    s: Session, model: type[RowT], identity: dict[str, Any], extra: dict[str, Any] | None = None
) -> RowT:
    """The row whose columns equal `identity` (a unique key of the table), created (with
    `extra`) if there is none: race-free when another process creates it at the same time."""
    row = s.scalars(select(model).filter_by(**identity)).first()
    if row is None:
        _insert_unless_present(s, model, {**identity, **(extra or {})})
        row = s.scalars(select(model).filter_by(**identity)).one()
    return row


def _insert_unless_present(s: Session, model: type[Any], values: dict[str, Any]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING on a unique key of `model`: a row another process
    inserted first wins, and this one is not an error. (SQLite's writers are serialised by
    BEGIN IMMEDIATE, store.schema; PostgreSQL's are not.) Other databases: a savepoint that an
    IntegrityError rolls back."""
    check_row_bounds(model, values)
    dialect = s.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        from sqlalchemy.dialects import postgresql, sqlite

        insert = sqlite.insert if dialect == "sqlite" else postgresql.insert
        s.execute(insert(model).values(**values).on_conflict_do_nothing())
        return
    try:
        with s.begin_nested():
            s.add(model(**values))
    except IntegrityError:
        pass


def _served_problem(check: Callable[[Any], None], row: Any) -> Problem | None:
    """The problem of a row that refers to one (a runtime miss, a work item), when the row
    passes `check` and its problem is there and valid; else None, logged."""
    try:
        check(row)
        return _problem_of(referenced(row, "problem"))
    except BrokenRow as exc:
        _log.warning("%s: left out", exc)
        return None


def _passes(check: Callable[[Any], None], row: Any) -> bool:
    """Whether `row` passes `check` (row_checks); a row that fails is logged and left out."""
    try:
        check(row)
    except BrokenRow as exc:
        _log.warning("%s: left out", exc)
        return False
    return True


# -- runtime misses: helpers ----------------------------------------------------------------

# (device name, compute capability, SM count, problem, path): a row of runtime_misses
_MissKey = tuple[str, int, int, Problem, str]


class _InsertRace(Exception):
    """A concurrent writer inserted a runtime miss this transaction was inserting too."""


def _utc(moment: datetime) -> datetime:
    """An aware UTC time (a naive one is taken as UTC: SQLite hands times back naive, and
    compares them as text, so every stored time must be UTC)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _iso_utc(moment: datetime) -> str:
    return _utc(moment).isoformat(timespec="seconds")


def _merge_misses(
    entries: Sequence[tuple[DeviceInfo, Problem, str, int, datetime, datetime]],
) -> dict[_MissKey, tuple[int, datetime, datetime]]:
    merged: dict[_MissKey, tuple[int, datetime, datetime]] = {}
    for device, problem, path, count, first, last in entries:
        if count < 0:
            raise ValueError(f"a runtime miss count cannot be negative, got {count}")
        if count == 0:
            continue
        key = (device.name, device.compute_capability, device.sm_count, problem, path)
        first, last = _utc(first), _utc(last)
        if key in merged:
            n, f, la = merged[key]
            count, first, last = n + count, min(f, first), max(la, last)
        merged[key] = (count, first, last)
    return merged
