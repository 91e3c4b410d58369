"""The tuning database's engine and transactions, and what every part of the store shares: each
public method of the store owns exactly one transaction."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, joinedload, sessionmaker

from .._shown import shown
from ..build.cache import DIGEST
from ..build.compiler import BuildResult
from ..model.config import Config
from ..model.problem import Problem
from ..model.status import Status
from .exchange import BrokenRow
from .models import (
    Build,
    Device,
    KernelConfig,
    Measurement,
    ProblemRow,
    check_column_bounds,
)
from .records import DeviceInfo, TrialResult
from .row_checks import (
    positive,
    referenced,
)
from .row_helpers import (
    _build_key,
    _config_of,
    _env_of,
    _get_or_create,
    _insert_unless_present,
    _is_problem,
    _problem_or_none,
    same_gpu,
)
from .schema import (
    READ_ONLY,
    database_error,
    database_url,
    default_url,
    ensure_schema,
    open_engine,
)


class StoreBase:
    """The engine, its sessions and the get-or-create helpers every part of the store uses; a
    row read back as the TrialResult it recorded."""

    def __init__(
        self, url: str | None = None, engine: Engine | None = None, *, create: bool = True
    ) -> None:
        # The schema is checked here, once per engine; the lookups and writes never check it.
        if engine is not None:
            self.engine = engine
            self.url = engine.url.render_as_string(hide_password=False)
            ensure_schema(engine, self.url, create=create)
        else:
            self.url = database_url(url) if url else default_url()
            self.engine = open_engine(self.url, create=create)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        event.listen(self._sessions, "before_flush", check_column_bounds)
        # Lookups only read: on SQLite they begin a plain (deferred) transaction, so a reader
        # (dispatch, `best`) never waits for a writer's lock, nor holds one (store.schema).
        self._read_sessions = sessionmaker(
            self.engine.execution_options(**READ_ONLY), expire_on_commit=False
        )

    @contextmanager
    def _transaction(self, *, reads_only: bool = False) -> Iterator[Session]:
        """One transaction; `reads_only` for a lookup (see __init__)."""
        sessions = self._read_sessions if reads_only else self._sessions
        try:
            with sessions() as session, session.begin():
                yield session
        except DBAPIError as exc:
            raise database_error(self.url, exc) from None

    def _reading(self) -> AbstractContextManager[Session]:
        return self._transaction(reads_only=True)

    # -- get-or-create helpers (inside a transaction) ---------------------------------------

    @staticmethod
    def _device(s: Session, info: DeviceInfo) -> Device:
        return _get_or_create(s, Device, info.as_dict())

    @staticmethod
    def _problem(s: Session, p: Problem) -> ProblemRow:
        return _get_or_create(s, ProblemRow, p.as_dict())

    @staticmethod
    def _config(s: Session, config: Config) -> KernelConfig:
        return _get_or_create(
            s,
            KernelConfig,
            {"digest": config.digest},
            {"family": config.family, "config_json": config.to_json()},
        )

    @staticmethod
    def _build(s: Session, config_row: KernelConfig, build: BuildResult) -> Build | None:
        if build.key is None:
            return None
        row = s.scalars(select(Build).filter_by(artifact_key=build.key)).first()
        if row is not None:
            return row
        record = build.record or {}
        toolchain = record.get("toolchain", {})
        digest = record.get(DIGEST)  # the SHA-256 the cache verified the cubin against
        _insert_unless_present(
            s,
            Build,
            dict(
                config_id=config_row.id,
                artifact_key=build.key,
                arch=build.arch,
                nvcc_version=toolchain.get("nvcc", ""),
                cutlass_version=toolchain.get("cutlass", ""),
                kernel_source_hash=toolchain.get("kernel_source", ""),
                status=build.status,
                message=build.message,
                registers=build.ptxas.registers if build.ptxas else None,
                spill_store_bytes=build.ptxas.spill_store_bytes if build.ptxas else None,
                spill_load_bytes=build.ptxas.spill_load_bytes if build.ptxas else None,
                stack_frame_bytes=build.ptxas.stack_frame_bytes if build.ptxas else None,
                smem_bytes=build.launch_info.smem_bytes if build.launch_info else None,
                threads=build.launch_info.threads if build.launch_info else None,
                compile_seconds=build.seconds,
                artifact_digest=digest,
            ),
        )
        return s.scalars(select(Build).filter_by(artifact_key=build.key)).one()

    @staticmethod
    def _problem_ids(s: Session, wanted: set[Problem]) -> dict[Problem, int]:
        known = {
            problem: row
            for row in s.scalars(select(ProblemRow))
            if (problem := _problem_or_none(row)) is not None
        }
        new = {p: ProblemRow(**p.as_dict()) for p in wanted if p not in known}
        s.add_all(new.values())
        s.flush()
        return {p: (known.get(p) or new[p]).id for p in wanted}

    @staticmethod
    def _config_ids(s: Session, wanted: set[Config]) -> dict[Config, int]:
        by_digest = {c.digest: c for c in wanted}
        known = {
            row.digest: row for row in s.scalars(select(KernelConfig)) if row.digest in by_digest
        }
        new = {
            d: KernelConfig(digest=d, family=c.family, config_json=c.to_json())
            for d, c in by_digest.items()
            if d not in known
        }
        s.add_all(new.values())
        s.flush()
        return {c: (known.get(c.digest) or new[c.digest]).id for c in wanted}

    @staticmethod
    def _model_measurements(device: DeviceInfo, problem: Problem) -> Any:
        """The query of every measurement of `problem` on this GPU model (name, compute
        capability, SM count: driver and CUDA versions may differ), oldest first. Reads only:
        a problem the database does not hold matches nothing."""
        return (
            select(Measurement)
            .join(Device)
            .join(ProblemRow)
            .options(joinedload(Measurement.config))
            .where(*same_gpu(device), *_is_problem(problem))
            .order_by(Measurement.id)
        )

    @staticmethod
    def _timing_of(row: Measurement) -> TrialResult:
        """A stored measurement as the TrialResult it recorded (`reused`: from the database);
        a row whose config, status or time cannot be one is refused (BrokenRow, naming it)."""
        build_key = _build_key(row.build)
        try:
            status = Status(row.status)
        except ValueError:
            raise BrokenRow(
                f"stored measurement #{row.id} has no valid status: {row.status!r}"
            ) from None
        for name in ("median_us", "p20_us", "p80_us"):
            value = getattr(row, name)
            if (
                status == Status.OK
                and name == "median_us"
                and value is None
                or (value is not None and not positive(value))
            ):
                raise BrokenRow(
                    f"stored measurement #{row.id} has no valid {name}: {shown(value)}"
                )
        return TrialResult(
            _config_of(referenced(row, "config")),
            status,
            row.reason,
            row.median_us,
            row.p20_us,
            row.p80_us,
            row.rounds,
            row.rel_err,
            row.max_abs_err,
            build_key,
            reused=True,
            env=_env_of(row),
        )
