"""SQLAlchemy 2 ORM models of the tuning database.

Table names never collide with Optuna's RDB storage, which lives in the same database (studies,
trials, ... and its own `alembic_version`); our migrations keep their revision in
`cute_autotune_schema` for the same reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

INT32 = (-(2**31), 2**31 - 1)
_log = logging.getLogger(__name__)


class StoredDateTime(TypeDecorator[datetime]):
    """A timezone-aware date column whose unreadable stored value reads as none, with a
    warning: SQLite keeps any text in a date column, and one such row must not fail every read
    of its table (PostgreSQL refuses the text on write)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def result_processor(
        self, dialect: Dialect, coltype: Any
    ) -> Callable[[Any], datetime | None] | None:
        parse = self.impl_instance.result_processor(dialect, coltype)
        if parse is None:
            return None

        def read(value: Any) -> datetime | None:
            try:
                return parse(value)
            except (ValueError, TypeError):
                _log.warning("a stored date is not one: %r (read as none)", value)
                return None

        return read


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Device(Base):
    __tablename__ = "devices"
    __table_args__ = (
        UniqueConstraint(
            "name",
            "compute_capability",
            "sm_count",
            "driver_version",
            "cuda_version",
            name="uq_devices_identity",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    compute_capability: Mapped[int] = mapped_column(Integer)  # 90 for sm_90
    sm_count: Mapped[int] = mapped_column(Integer)
    driver_version: Mapped[str] = mapped_column(String(32))
    cuda_version: Mapped[str] = mapped_column(String(32))


class KernelConfig(Base):
    __tablename__ = "kernel_configs"

    id: Mapped[int] = mapped_column(primary_key=True)
    family: Mapped[str] = mapped_column(String(32))
    digest: Mapped[str] = mapped_column(String(16), unique=True)
    config_json: Mapped[str] = mapped_column(Text)  # canonical JSON (Config.to_json)


class Build(Base):
    __tablename__ = "builds"

    id: Mapped[int] = mapped_column(primary_key=True)
    config_id: Mapped[int] = mapped_column(ForeignKey("kernel_configs.id"))
    artifact_key: Mapped[str] = mapped_column(String(64), unique=True)
    arch: Mapped[str] = mapped_column(String(16))
    nvcc_version: Mapped[str] = mapped_column(String(32))
    cutlass_version: Mapped[str] = mapped_column(String(32))
    kernel_source_hash: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    registers: Mapped[int | None] = mapped_column(Integer)
    spill_store_bytes: Mapped[int | None] = mapped_column(Integer)
    spill_load_bytes: Mapped[int | None] = mapped_column(Integer)
    stack_frame_bytes: Mapped[int | None] = mapped_column(Integer)
    smem_bytes: Mapped[int | None] = mapped_column(Integer)
    threads: Mapped[int | None] = mapped_column(Integer)
    compile_seconds: Mapped[float | None] = mapped_column(Float)
    artifact_digest: Mapped[str | None] = mapped_column(String(64))  # sha256 of the cubin

    config: Mapped[KernelConfig] = relationship()


class ProblemRow(Base):
    __tablename__ = "problems"
    __table_args__ = (
        UniqueConstraint(
            "dtype",
            "batch",
            "heads_q",
            "heads_kv",
            "seqlen_q",
            "seqlen_k",
            "head_dim",
            "causal",
            "kv_cache",
            "backward",
            "deterministic",
            name="uq_problems_shape",
        ),
        CheckConstraint("heads_q % heads_kv = 0", name="ck_problems_gqa"),
        # The problem class (a config's fixed values) first: what `nearest` and the region rule
        # of dispatch filter on. The sizes after it make the index covering: the rows of a class
        # are ranked from the index alone (1.1 -> 0.65 ms for 250 rows of 5k, SQLite).
        Index(
            "ix_problems_class",
            "dtype",
            "head_dim",
            "causal",
            "kv_cache",
            "backward",
            "deterministic",
            "seqlen_q",
            "seqlen_k",
            "batch",
            "heads_q",
            "heads_kv",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    dtype: Mapped[str] = mapped_column(String(8))
    batch: Mapped[int] = mapped_column(Integer)
    heads_q: Mapped[int] = mapped_column(Integer)
    heads_kv: Mapped[int] = mapped_column(Integer)
    seqlen_q: Mapped[int] = mapped_column(Integer)
    seqlen_k: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer)
    causal: Mapped[bool] = mapped_column(Boolean)
    # How the keys and values are held (model.problem.KV_CACHES); "dense" for rows older than
    # schema 0.4.0.
    kv_cache: Mapped[str] = mapped_column(String(16), default="dense", server_default="dense")
    # The backward pass (model.problem.Problem.backward), deterministic or not; false for rows
    # older than schema 0.7.0.
    backward: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    deterministic: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class TimedUnder:
    """Under what a time was taken (measure.environment), on every table of timings: SDPA's
    speed is torch's and cuDNN's, a kernel's depends on the driver, and every time depends on
    the clock it ran at."""

    regime: Mapped[str | None] = mapped_column(String(32))
    driver_version: Mapped[str | None] = mapped_column(String(32))
    cuda_version: Mapped[str | None] = mapped_column(String(32))
    torch_version: Mapped[str | None] = mapped_column(String(64))
    cudnn_version: Mapped[str | None] = mapped_column(String(32))
    sm_clock_mhz: Mapped[float | None] = mapped_column(Float)
    power_w: Mapped[float | None] = mapped_column(Float)


class Measurement(TimedUnder, Base):
    """One trial of one config on one problem and device: timed, or why it was not."""

    __tablename__ = "measurements"
    __table_args__ = (Index("ix_measurements_lookup", "device_id", "problem_id", "config_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    config_id: Mapped[int] = mapped_column(ForeignKey("kernel_configs.id"))
    build_id: Mapped[int | None] = mapped_column(ForeignKey("builds.id"))
    study: Mapped[str] = mapped_column(String(200))
    phase: Mapped[str] = mapped_column(String(16))  # "search" or "rerank"
    status: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")
    median_us: Mapped[float | None] = mapped_column(Float)
    p20_us: Mapped[float | None] = mapped_column(Float)
    p80_us: Mapped[float | None] = mapped_column(Float)
    rounds: Mapped[int | None] = mapped_column(Integer)
    tflops: Mapped[float | None] = mapped_column(Float)
    rel_err: Mapped[float | None] = mapped_column(Float)
    max_abs_err: Mapped[float | None] = mapped_column(Float)
    baseline_us: Mapped[float | None] = mapped_column(Float)  # SDPA default, same session
    created_at: Mapped[datetime] = mapped_column(StoredDateTime(), default=utcnow)

    config: Mapped[KernelConfig] = relationship()
    build: Mapped[Build | None] = relationship()


class Baseline(TimedUnder, Base):
    """torch SDPA on a problem, per backend, measured in a tuning session."""

    __tablename__ = "baselines"
    __table_args__ = (Index("ix_baselines_lookup", "device_id", "problem_id", "backend"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    study: Mapped[str] = mapped_column(String(200))
    backend: Mapped[str] = mapped_column(String(16))  # default, flash, efficient, cudnn
    median_us: Mapped[float] = mapped_column(Float)
    p20_us: Mapped[float] = mapped_column(Float)
    p80_us: Mapped[float] = mapped_column(Float)
    tflops: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(StoredDateTime(), default=utcnow)


class BestConfig(Base):
    """The winner of the latest tuning of a problem on a device, with its speed-ups."""

    __tablename__ = "best_configs"
    __table_args__ = (
        UniqueConstraint("device_id", "problem_id", name="uq_best_per_problem"),
        # From a problem (or the problems of a class) to its best rows on any device: the
        # unique constraint's index starts with the device.
        Index("ix_best_configs_problem", "problem_id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    config_id: Mapped[int] = mapped_column(ForeignKey("kernel_configs.id"))
    measurement_id: Mapped[int | None] = mapped_column(ForeignKey("measurements.id"))
    family: Mapped[str] = mapped_column(String(32))
    study: Mapped[str] = mapped_column(String(200))
    median_us: Mapped[float] = mapped_column(Float)
    tflops: Mapped[float] = mapped_column(Float)
    sdpa_default_us: Mapped[float | None] = mapped_column(Float)
    sdpa_flash_us: Mapped[float | None] = mapped_column(Float)
    speedup_vs_default: Mapped[float | None] = mapped_column(Float)
    speedup_vs_flash: Mapped[float | None] = mapped_column(Float)
    trials: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(32), default="tuned")  # tuned | imported
    p20_us: Mapped[float | None] = mapped_column(Float)
    p80_us: Mapped[float | None] = mapped_column(Float)
    # How the winner was chosen over the runner-up: "fastest" (p20-p80 ranges apart) or a tie
    # rule ("tie: sdpa" / "tie: resources"), and what it was chosen over.
    decision: Mapped[str | None] = mapped_column(Text)
    runner_up_us: Mapped[float | None] = mapped_column(Float)
    torch_version: Mapped[str | None] = mapped_column(String(64))
    cudnn_version: Mapped[str | None] = mapped_column(String(32))
    regime: Mapped[str | None] = mapped_column(String(32))
    updated_at: Mapped[datetime] = mapped_column(StoredDateTime(), default=utcnow, onupdate=utcnow)

    device: Mapped[Device] = relationship()
    problem: Mapped[ProblemRow] = relationship()
    config: Mapped[KernelConfig] = relationship()


class RuntimeMiss(Base):
    """Problems `attention()` served without an exact tuned entry, counted per process and
    added here off the hot path (autotune.runtime.misses): what to tune next."""

    __tablename__ = "runtime_misses"
    __table_args__ = (
        UniqueConstraint(
            "device_name",
            "compute_capability",
            "sm_count",
            "problem_id",
            "path",
            name="uq_runtime_misses",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    device_name: Mapped[str] = mapped_column(String(128))
    compute_capability: Mapped[int] = mapped_column(Integer)
    sm_count: Mapped[int] = mapped_column(Integer)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    path: Mapped[str] = mapped_column(String(16))  # nearest | heuristic | sdpa | fallback
    count: Mapped[int] = mapped_column(BigInteger)
    first_seen: Mapped[datetime] = mapped_column(StoredDateTime(), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(StoredDateTime(), default=utcnow)

    problem: Mapped[ProblemRow] = relationship()


# A work item's states (store.queue).
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
WORK_STATES = (QUEUED, RUNNING, DONE, FAILED)


class WorkItem(Base):
    """A problem to tune on one GPU model (`tune --enqueue`), taken by a `worker` of that model
    under a lease it renews while it runs (schema 0.5.0). state: queued | running | done |
    failed; a running item whose lease ran out is taken again by the next worker."""

    __tablename__ = "work_items"
    __table_args__ = (
        UniqueConstraint(
            "device_name",
            "compute_capability",
            "sm_count",
            "problem_id",
            "families",
            name="uq_work_items",
        ),
        Index("ix_work_items_take", "device_name", "compute_capability", "sm_count", "state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    device_name: Mapped[str] = mapped_column(String(128))
    compute_capability: Mapped[int] = mapped_column(Integer)
    sm_count: Mapped[int] = mapped_column(Integer)
    problem_id: Mapped[int] = mapped_column(ForeignKey("problems.id"))
    families: Mapped[str] = mapped_column(String(200))  # comma list; "" = every family it runs
    settings_json: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))
    worker: Mapped[str | None] = mapped_column(String(200))
    lease_until: Mapped[datetime | None] = mapped_column(StoredDateTime())
    attempts: Mapped[int] = mapped_column(Integer)
    message: Mapped[str | None] = mapped_column(Text)
    enqueued_at: Mapped[datetime] = mapped_column(StoredDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(StoredDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(StoredDateTime())

    problem: Mapped[ProblemRow] = relationship()


class PerfModelRow(Base):
    """The performance model of one GPU model (its name), fitted over this database's
    measurements (schema 0.6.0): the document's JSON text, read by store.perf_models, which
    refuses one whose digest does not match its text."""

    __tablename__ = "perf_models"
    __table_args__ = (UniqueConstraint("device_name", name="uq_perf_models_device"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    device_name: Mapped[str] = mapped_column(String(128))
    digest: Mapped[str] = mapped_column(String(64))
    data_digest: Mapped[str] = mapped_column(String(64))
    timings: Mapped[int] = mapped_column(Integer)
    fitted_by: Mapped[str] = mapped_column(String(32))  # tune | import | model fit
    fitted_at: Mapped[datetime] = mapped_column(StoredDateTime(), default=utcnow)
    doc_json: Mapped[str] = mapped_column(Text)


def check_column_bounds(session: Session, *_: object) -> None:
    """Refuse, before a flush writes anything, a string longer than its column or an integer
    outside a 32-bit column: PostgreSQL would refuse them with a DataError mid-transaction,
    SQLite would store them; this makes every database refuse them alike (a `before_flush`
    listener on the store's sessions)."""
    for obj in [*session.new, *session.dirty]:
        if isinstance(obj, Base):
            check_row_bounds(
                type(obj), {c.key: getattr(obj, c.key, None) for c in obj.__table__.columns}
            )


def check_row_bounds(model: type[Base], values: dict[str, object]) -> None:
    """`check_column_bounds` for one row's values (an INSERT written without the ORM)."""
    for column in model.__table__.columns:
        value = values.get(column.key)
        length = getattr(column.type, "length", None)
        if isinstance(value, str) and length is not None and len(value) > length:
            raise ValueError(
                f"{column.table.name}.{column.name} holds at most {length} "
                f"characters, got {len(value)}"
            )
        if isinstance(value, str) and "\x00" in value:  # PostgreSQL's text cannot hold it
            raise ValueError(f"{column.table.name}.{column.name} cannot hold the NUL character")
        if (
            isinstance(column.type, Integer)
            and not isinstance(column.type, BigInteger)
            and isinstance(value, int)
            and not INT32[0] <= value <= INT32[1]
        ):
            raise ValueError(
                f"{column.table.name}.{column.name} holds a 32-bit integer, got {value}"
            )
