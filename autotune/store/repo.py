"""Operations on the tuning database. Each public method owns exactly one transaction."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar, TypeVarTuple, cast

from sqlalchemy import ColumnElement, Select, case, event, func, select, update
from sqlalchemy.engine import CursorResult, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, contains_eager, joinedload, sessionmaker

from .._shown import shown
from ..build.cache import DIGEST
from ..build.compiler import BuildResult
from ..measure.environment import Environment
from ..model.config import Config, InvalidConfig
from ..model.problem import MAX_SIZE, Problem
from ..model.space import validate_config
from ..model.status import Status
from .exchange import EXPORT_FORMAT, EXPORT_VERSION, BrokenRow, ImportEntry, parse_export
from .misses_records import MissRecord
from .models import (
    Baseline,
    BestConfig,
    Build,
    Device,
    KernelConfig,
    Measurement,
    ProblemRow,
    RuntimeMiss,
    check_column_bounds,
    check_row_bounds,
)
from .records import BaselineTiming, BestRecord, DeviceInfo, TrialResult
from .row_checks import (
    build_key_of,
    check_baseline,
    check_best_numbers,
    check_miss,
    device_of,
    positive,
    referenced,
)
from .schema import (
    READ_ONLY,
    database_error,
    database_url,
    default_url,
    ensure_schema,
    head_revision,
    open_engine,
)

__all__ = ["BrokenRow", "TuningStore", "problem_distance"]

_log = logging.getLogger(__name__)


def problem_distance(a: Problem, b: Problem) -> float:
    """How far apart two problems of the same dtype, head dim and causality are.

    Sum of |log2 ratio| of Lq, Lk and B*Hq, plus half the |log2 ratio| of the GQA group size:
    a kernel tuned for a shape twice as long is as near as one for twice the batch.
    """
    return _distance(a, b.batch, b.heads_q, b.heads_kv, b.seqlen_q, b.seqlen_k)


def _distance(a: Problem, batch: int, heads_q: int, heads_kv: int, seqlen_q: int,
              seqlen_k: int) -> float:
    """`problem_distance` from `a` to the problem of these sizes (and `a`'s class), computed
    on a row's columns: `nearest` ranks every row of a class without making a Problem of
    each."""
    def term(x: float, y: float) -> float:
        return abs(math.log2(x / y))

    return (term(a.seqlen_q, seqlen_q) + term(a.seqlen_k, seqlen_k)
            + term(a.batch * a.heads_q, batch * heads_q)
            + 0.5 * term(a.group_size, heads_q // heads_kv))


def _problem_of(row: ProblemRow) -> Problem:
    """The stored problem, validated again: a broken row is refused, never run."""
    try:
        return Problem(row.batch, row.heads_q, row.heads_kv, row.seqlen_q, row.seqlen_k,
                       row.head_dim, row.dtype, bool(row.causal), row.kv_cache)
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
    if all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIZE
           for v in sizes) and sizes[1] % sizes[2] == 0:
        return tuple(sizes)
    _log.warning("stored problem #%s is not valid: sizes %s: passed over for the next nearest",
                 shown(problem_id), shown(tuple(sizes), 120))
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
        mismatch = {k: v for k, v in problem.space_values().items() if config[k] != v}
        if mismatch:
            raise BrokenRow(f"stored config {row.digest} is for another problem class "
                            f"({mismatch} differ)")
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
    return {"regime": env.regime or None, "driver_version": env.driver_version or None,
            "cuda_version": env.cuda_version or None,
            "torch_version": env.torch_version or None,
            "cudnn_version": env.cudnn_version or None, "sm_clock_mhz": env.sm_clock_mhz,
            "power_w": env.power_w}


def _env_of(row: Measurement | Baseline) -> Environment | None:
    if row.regime is None and row.torch_version is None:
        return None
    return Environment(row.regime or "", row.driver_version or "", row.cuda_version or "",
                       row.torch_version or "", row.cudnn_version or "", row.sm_clock_mhz,
                       row.power_w)


def same_gpu(device: DeviceInfo, name: Any = Device.name,
             capability: Any = Device.compute_capability, sm_count: Any = Device.sm_count
             ) -> tuple[Any, ...]:
    """The conditions that a row is of `device`'s GPU model (name, compute capability and SM
    count: driver and CUDA versions may differ between machines), on the given columns."""
    return (name == device.name, capability == device.compute_capability,
            sm_count == device.sm_count)


Columns = TypeVarTuple("Columns")


def _of_device(query: Select[*Columns],
               device: DeviceInfo | str | None) -> Select[*Columns]:
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


def _in_class(dtype: str, head_dim: int, causal: bool,
              kv_cache: str = "dense") -> tuple[ColumnElement[bool], ...]:
    """The conditions that a problems row is of this problem class (ix_problems_class): a
    config's fixed values and how the keys are held."""
    return (ProblemRow.dtype == dtype, ProblemRow.head_dim == head_dim,
            ProblemRow.causal == causal, ProblemRow.kv_cache == kv_cache)


RowT = TypeVar("RowT", Device, ProblemRow, KernelConfig)


def _get_or_create(s: Session, model: type[RowT], identity: dict[str, Any],
                   extra: dict[str, Any] | None = None) -> RowT:
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


class TuningStore:
    """The tuning database. `create=False` opens it for reading only (`list`, `best`,
    `export`): a database that does not exist is an error, not a new empty one. Every database
    error a method meets is a StoreError naming the database."""

    def __init__(self, url: str | None = None, engine: Engine | None = None, *,
                 create: bool = True) -> None:
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
        self._read_sessions = sessionmaker(self.engine.execution_options(**READ_ONLY),
                                           expire_on_commit=False)

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
        return _get_or_create(s, KernelConfig, {"digest": config.digest},
                              {"family": config.family, "config_json": config.to_json()})

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
        _insert_unless_present(s, Build, dict(
            config_id=config_row.id, artifact_key=build.key, arch=build.arch,
            nvcc_version=toolchain.get("nvcc", ""), cutlass_version=toolchain.get("cutlass", ""),
            kernel_source_hash=toolchain.get("kernel_source", ""), status=build.status,
            message=build.message,
            registers=build.ptxas.registers if build.ptxas else None,
            spill_store_bytes=build.ptxas.spill_store_bytes if build.ptxas else None,
            spill_load_bytes=build.ptxas.spill_load_bytes if build.ptxas else None,
            stack_frame_bytes=build.ptxas.stack_frame_bytes if build.ptxas else None,
            smem_bytes=build.launch_info.smem_bytes if build.launch_info else None,
            threads=build.launch_info.threads if build.launch_info else None,
            compile_seconds=build.seconds, artifact_digest=digest))
        return s.scalars(select(Build).filter_by(artifact_key=build.key)).one()

    # -- measurements -----------------------------------------------------------------------

    def record_trial(self, device: DeviceInfo, problem: Problem, result: TrialResult, *,
                     build: BuildResult | None, study: str, phase: str,
                     baseline_us: float | None) -> int:
        with self._transaction() as s:
            config_row = self._config(s, result.config)
            build_row = self._build(s, config_row, build) if build is not None else None
            row = Measurement(
                device_id=self._device(s, device).id, problem_id=self._problem(s, problem).id,
                config_id=config_row.id, build_id=build_row.id if build_row else None,
                study=study, phase=phase, status=result.status, reason=result.reason,
                median_us=result.median_us, p20_us=result.p20_us, p80_us=result.p80_us,
                rounds=result.rounds, tflops=result.tflops(problem), rel_err=result.rel_err,
                max_abs_err=result.max_abs_err, baseline_us=baseline_us,
                **_env_columns(result.env))
            s.add(row)
            s.flush()
            return row.id

    def find_trial(self, device: DeviceInfo, problem: Problem, config: Config,
                   build_key: str | None) -> TrialResult | None:
        """The latest timed measurement of this (device, problem, config, build), if any; a
        newer row whose time cannot be one is refused by name and the next one taken."""
        found = self._latest_measurement(device, problem, config, build_key,
                                         Measurement.status == Status.OK)
        # The config and build as asked, not as the row names them (no key: any build was)
        return replace(found, config=config, build_key=build_key) if found is not None else None

    def find_failure(self, device: DeviceInfo, problem: Problem, config: Config,
                     build_key: str) -> TrialResult | None:
        """The latest failed (not OK) measurement of this (device, problem, config, build), if
        any, with its status and reason: what a process that stored it and was gone before it
        told its study found (tune.study settles that trial with it). Never a reason to skip a
        config elsewhere: find_trial reuses times only."""
        return self._latest_measurement(device, problem, config, build_key,
                                        Measurement.status != Status.OK)

    def _latest_measurement(self, device: DeviceInfo, problem: Problem, config: Config,
                            build_key: str | None, outcome: ColumnElement[bool]
                            ) -> TrialResult | None:
        """The latest measurement of this (device, problem, config) on the GPU model, of the
        build `build_key` (None: any), whose row meets `outcome`; a newer row that cannot be
        read back (BrokenRow) is refused by name and the next one taken."""
        with self._transaction() as s:
            query = (select(Measurement).join(Device).join(ProblemRow).join(KernelConfig)
                     .where(*same_gpu(device), KernelConfig.digest == config.digest,
                            ProblemRow.id == self._problem(s, problem).id, outcome)
                     .order_by(Measurement.id.desc()))
            if build_key is not None:
                query = query.join(Build, Measurement.build_id == Build.id).where(
                    Build.artifact_key == build_key)
            for row in s.scalars(query):
                try:
                    return self._timing_of(row)
                except BrokenRow as exc:
                    _log.warning("%s: not reused", exc)
            return None

    def trials(self, device: DeviceInfo | None = None, problem: Problem | None = None,
               study: str | None = None) -> list[dict[str, Any]]:
        # Without a problem, a plain read (no write lock, BEGIN IMMEDIATE, held meanwhile: a
        # refit reads every measurement while other sessions write); `_problem` may make one.
        with (self._reading() if problem is None else self._transaction()) as s:
            query = select(Measurement, ProblemRow, Device).join(ProblemRow).join(Device)
            if study is not None:
                query = query.where(Measurement.study == study)
            if problem is not None:
                query = query.where(ProblemRow.id == self._problem(s, problem).id)
            if device is not None:
                query = query.where(Device.name == device.name)
            rows = s.execute(query.order_by(Measurement.id)).all()
            return [{"id": m.id, "study": m.study, "phase": m.phase, "status": m.status,
                     "reason": m.reason, "config": json.loads(m.config.config_json),
                     "median_us": m.median_us, "tflops": m.tflops,
                     "problem": problem.as_dict(), "device": d.name}
                    for m, p, d in rows if (problem := _problem_or_none(p)) is not None]

    # -- baselines --------------------------------------------------------------------------

    def record_baselines(self, device: DeviceInfo, problem: Problem, study: str,
                         timings: Sequence[BaselineTiming]) -> None:
        with self._transaction() as s:
            device_id, problem_id = self._device(s, device).id, self._problem(s, problem).id
            for t in timings:
                s.add(Baseline(device_id=device_id, problem_id=problem_id, study=study,
                               backend=t.backend, median_us=t.median_us, p20_us=t.p20_us,
                               p80_us=t.p80_us,
                               tflops=problem.tflops(t.median_us),
                               **_env_columns(t.env)))

    def latest_baselines(self, device: DeviceInfo, problem: Problem) -> dict[str, BaselineTiming]:
        with self._transaction() as s:
            rows = s.scalars(select(Baseline).where(
                Baseline.device_id == self._device(s, device).id,
                Baseline.problem_id == self._problem(s, problem).id).order_by(Baseline.id)).all()
            return {r.backend: BaselineTiming(r.backend, r.median_us, r.p20_us, r.p80_us,
                                              _env_of(r))
                    for r in rows if _passes(check_baseline, r)}

    # -- best configs -----------------------------------------------------------------------

    def set_best(self, device: DeviceInfo, problem: Problem, result: TrialResult, *,
                 measurement_id: int | None, study: str, trials: int,
                 sdpa_default_us: float | None, sdpa_flash_us: float | None,
                 source: str = "tuned", decision: str | None = None,
                 runner_up_us: float | None = None) -> None:
        if not result.ok or result.median_us is None:
            raise ValueError("only a timed result can be the best")
        with self._transaction() as s:
            self._put_best(s, self._device(s, device).id, self._problem(s, problem).id,
                           self._config(s, result.config).id, problem, result,
                           measurement_id=measurement_id, study=study, trials=trials,
                           sdpa_default_us=sdpa_default_us, sdpa_flash_us=sdpa_flash_us,
                           source=source, decision=decision, runner_up_us=runner_up_us)

    @staticmethod
    def _put_best(s: Session, device_id: int, problem_id: int, config_id: int,
                  problem: Problem, result: TrialResult, *, measurement_id: int | None,
                  study: str, trials: int, sdpa_default_us: float | None,
                  sdpa_flash_us: float | None, source: str, decision: str | None = None,
                  runner_up_us: float | None = None,
                  row: BestConfig | None = None) -> None:
        """Insert or replace the best row of (device, problem), inside a transaction (`row`:
        the existing one, when the caller has it)."""
        median = result.median_us
        assert median is not None
        if row is None:
            row = s.scalars(select(BestConfig).filter_by(device_id=device_id,
                                                         problem_id=problem_id)).first()
        if row is None:
            # created first with what a best row must hold, so that a concurrent creator's row
            # is updated below instead of colliding with it
            _insert_unless_present(s, BestConfig, {
                "device_id": device_id, "problem_id": problem_id, "config_id": config_id,
                "family": result.config.family, "study": study, "median_us": median,
                "tflops": problem.tflops(median), "trials": trials, "source": source})
            row = s.scalars(select(BestConfig).filter_by(device_id=device_id,
                                                         problem_id=problem_id)).one()
        row.config_id = config_id
        row.measurement_id = measurement_id
        row.family = result.config.family
        row.study = study
        row.median_us = median
        row.tflops = problem.tflops(median)
        row.sdpa_default_us = sdpa_default_us
        row.sdpa_flash_us = sdpa_flash_us
        row.speedup_vs_default = sdpa_default_us / median if sdpa_default_us else None
        row.speedup_vs_flash = sdpa_flash_us / median if sdpa_flash_us else None
        row.trials = trials
        row.source = source
        row.p20_us, row.p80_us = result.p20_us, result.p80_us
        row.decision = decision[:2000] if decision else None
        row.runner_up_us = runner_up_us
        env = result.env
        row.torch_version = env.torch_version or None if env else None
        row.cudnn_version = env.cudnn_version or None if env else None
        row.regime = env.regime or None if env else None
        row.updated_at = datetime.now(UTC)
        s.add(row)

    def _best_rows(self, s: Session, device: DeviceInfo | str | None) -> list[BestConfig]:
        """Best rows of one GPU model (name, compute capability and SM count; driver and CUDA
        versions may differ between machines), of a device name, or of every device."""
        # The device, problem and config of each row come in the same query: a row is never
        # read without them (one query, not three per row).
        # An outer join: a row whose device is not there is read, and refused by name.
        query = select(BestConfig).outerjoin(Device).options(
            joinedload(BestConfig.device), joinedload(BestConfig.problem),
            joinedload(BestConfig.config))
        return list(s.scalars(_of_device(query, device).order_by(BestConfig.id)).all())

    @staticmethod
    def _best_row(s: Session, device: DeviceInfo | str | None,
                  problem: Problem) -> BestConfig | None:
        """The best row of exactly `problem` on `device` (the oldest, when several devices of
        one GPU model, or several devices, have one), with its device, problem and config: one
        indexed query (devices, then the problem by uq_problems_shape, then uq_best_per_problem
        or ix_best_configs_problem)."""
        query = (select(BestConfig).join(BestConfig.device).join(BestConfig.problem)
                 .options(contains_eager(BestConfig.device), contains_eager(BestConfig.problem),
                          joinedload(BestConfig.config))
                 .where(*_is_problem(problem)))
        return s.scalars(_of_device(query, device).order_by(BestConfig.id).limit(1)).first()

    @staticmethod
    def _record(row: BestConfig) -> BestRecord:
        problem = _problem_of(referenced(row, "problem"))
        device = device_of(referenced(row, "device"))
        check_best_numbers(row)
        return BestRecord(
            device=device, problem=problem,
            config=_config_of(referenced(row, "config"), problem), median_us=row.median_us,
            tflops=row.tflops,
            sdpa_default_us=row.sdpa_default_us, sdpa_flash_us=row.sdpa_flash_us,
            trials=row.trials, study=row.study, source=row.source,
            updated_at=row.updated_at.isoformat(timespec="seconds") if row.updated_at else "",
            p20_us=row.p20_us, p80_us=row.p80_us, decision=row.decision,
            runner_up_us=row.runner_up_us, torch_version=row.torch_version,
            cudnn_version=row.cudnn_version, regime=row.regime)

    def tuned_problems(self, device: DeviceInfo | str | None) -> frozenset[Problem]:
        """The problems that have a best config on `device` (one query of the problems, their
        configs not read; a broken problem row is left out)."""
        query = (select(ProblemRow).join(BestConfig, BestConfig.problem_id == ProblemRow.id)
                 .join(Device, BestConfig.device_id == Device.id))
        with self._reading() as s:
            rows = s.scalars(_of_device(query, device).distinct()).all()
            return frozenset(p for p in map(_problem_or_none, rows) if p is not None)

    def best(self, device: DeviceInfo | str | None, problem: Problem) -> BestRecord | None:
        """The best config of exactly this problem (on this device, or any device if None)."""
        with self._reading() as s:
            row = self._best_row(s, device, problem)
            return self._record(row) if row is not None else None

    def timed_build_keys(self, device: DeviceInfo | str | None = None
                         ) -> dict[tuple[str, Problem], str]:
        """(device name, problem) -> artifact key of the build each best was timed with; rows
        without one (imported, or timed before builds were recorded) are left out. Kept apart
        from the records, which dispatch reads: it costs two more queries."""
        with self._reading() as s:
            query = (select(BestConfig.id, Build).select_from(BestConfig)
                     .join(Measurement, Measurement.id == BestConfig.measurement_id)
                     .join(Build, Build.id == Measurement.build_id))
            timed = {best_id: key for best_id, build in s.execute(query)
                     if (key := _build_key(build)) is not None}
            return {(row.device.name, problem): timed[row.id]
                    for row in self._best_rows(s, device)
                    if timed.get(row.id) and row.device is not None
                    and (problem := _problem_or_none(row.problem))}

    def family_tuned(self, device: DeviceInfo, problem: Problem, study: str,
                     current_key: Callable[[Config], str] | None = None) -> bool:
        """Whether the study searched this problem and the best config was decided after its
        last search measurement (a session killed inside the study, or between its search and
        the re-timing, has not tuned it). An imported best config has no study here: False.

        With `current_key` (the backend's build key of a config): also False when the study's
        last built search trial ran a build other than the one the current kernel sources,
        toolchain and flags make, so a kernel update is searched again rather than trusted."""
        with self._reading() as s:
            best = s.execute(_of_device(
                select(BestConfig.problem_id, BestConfig.measurement_id)
                .join(BestConfig.device).join(BestConfig.problem)
                .where(*_is_problem(problem)), device).order_by(BestConfig.id).limit(1)).first()
            if best is None or best.measurement_id is None:
                return False
            mine = (select(func.max(Measurement.id)).join(Device)
                    .where(Measurement.study == study, Measurement.problem_id == best.problem_id,
                           Device.name == device.name))
            last_any = s.scalar(mine)
            last_search = s.scalar(mine.where(Measurement.phase == "search"))
            searched = last_any is not None
            if not (searched and (last_search is None or best.measurement_id > last_search)):
                return False
            if current_key is not None:
                built = s.scalar(mine.where(Measurement.phase == "search",
                                            Measurement.build_id.is_not(None)))
                trial = s.get(Measurement, built) if built is not None else None
                try:
                    moved = trial is not None and trial.build is not None and (
                        _build_key(trial.build)
                        != current_key(_config_of(referenced(trial, "config"))))
                except BrokenRow as exc:  # searched again rather than trusted
                    _log.warning("%s: the study is searched again", exc)
                    return False
                if moved:
                    return False
            return True

    def nearest(self, device: DeviceInfo | str | None, problem: Problem, *,
                family: str | tuple[str, ...] | None = None,
                accept: Callable[[BestRecord], bool] | None = None
                ) -> tuple[BestRecord, float] | None:
        """The tuned problem of the same dtype, head dim, causality and KV-cache kind nearest to
        `problem` (of those whose best config is of `family`, or of one of several, when given,
        and whose best `accept` takes); a refused row is logged and passed over for the next
        nearest."""
        # SQL keeps the best rows of the problem class on the device (ix_problems_class), a
        # few columns each; they are ranked here by problem_distance (a tie goes to the oldest
        # row), and only the nearest is read whole.
        query = (select(BestConfig.id, ProblemRow.id, ProblemRow.batch, ProblemRow.heads_q,
                        ProblemRow.heads_kv, ProblemRow.seqlen_q, ProblemRow.seqlen_k)
                 .join(BestConfig.device).join(BestConfig.problem)
                 .where(*_in_class(problem.dtype, problem.head_dim, problem.causal,
                                   problem.kv_cache)))
        if family is not None:
            families = (family,) if isinstance(family, str) else tuple(family)
            query = query.join(BestConfig.config).where(KernelConfig.family.in_(families))
        with self._reading() as s:
            candidates = [(_distance(problem, *valid), best_id)
                          for best_id, problem_id, *sizes in s.execute(_of_device(query, device))
                          if (valid := _sizes_or_none(problem_id, sizes)) is not None]
            for distance, best_id in sorted(candidates):
                row = s.scalars(select(BestConfig).where(BestConfig.id == best_id).options(
                    joinedload(BestConfig.device), joinedload(BestConfig.problem),
                    joinedload(BestConfig.config))).one()
                try:
                    record = self._record(row)
                except BrokenRow as exc:
                    _log.warning("%s: passed over for the next nearest", exc)
                    continue
                if accept is None or accept(record):
                    return record, distance
            return None

    def families_faster_than_sdpa(self, device: DeviceInfo,
                                  region: tuple[int, str, bool, str],
                                  bucket: Callable[[int], str]) -> set[str]:
        """The kernel families timed faster than torch SDPA's default beside them on some
        problem of `region` (head dim, dtype, causality, Lq bucket as `bucket` names it) on
        this GPU model: a stored best with a speed-up above 1, or a measurement faster than
        the SDPA timing stored with it."""
        return self.families_against_sdpa(device, region, bucket)[0]

    def families_against_sdpa(self, device: DeviceInfo, region: tuple[int, str, bool, str],
                              bucket: Callable[[int], str]) -> tuple[set[str], set[str]]:
        """(the kernel families timed faster than SDPA's default on some problem of `region`
        on this GPU model, as `families_faster_than_sdpa`; the kernel families timed there at
        all, beside SDPA: a stored best or a measurement with an SDPA timing)."""
        head_dim, dtype, causal, lq = region
        # SQL keeps the rows of the problem class on this GPU model that claim to be faster;
        # the Lq bucket, a function of the caller's, is applied to those few here, and so is
        # the check that the claim is made of real times (SQLite compares text in a number
        # column as greater than any number, and a time of -1 is below any).
        best = (select(BestConfig.id, BestConfig.family, ProblemRow.seqlen_q,
                       BestConfig.median_us, BestConfig.sdpa_default_us,
                       BestConfig.speedup_vs_default)
                .join(BestConfig.device).join(BestConfig.problem)
                .where(*same_gpu(device), *_in_class(dtype, head_dim, causal),
                       BestConfig.family != "sdpa", BestConfig.speedup_vs_default > 1.0))
        measured = (select(Measurement.id, KernelConfig.family, ProblemRow.seqlen_q,
                           Measurement.median_us, Measurement.baseline_us)
                    .select_from(Measurement)
                    .join(KernelConfig).join(ProblemRow).join(Device)
                    .where(*same_gpu(device), *_in_class(dtype, head_dim, causal),
                           Measurement.status == Status.OK, KernelConfig.family != "sdpa",
                           Measurement.median_us < Measurement.baseline_us))
        timed = (select(KernelConfig.family, ProblemRow.seqlen_q).distinct()
                 .select_from(Measurement).join(KernelConfig).join(ProblemRow).join(Device)
                 .where(*same_gpu(device), *_in_class(dtype, head_dim, causal),
                        Measurement.status == Status.OK, KernelConfig.family != "sdpa",
                        Measurement.baseline_us.is_not(None)))
        stored = (select(BestConfig.family, ProblemRow.seqlen_q).distinct()
                  .join(BestConfig.device).join(BestConfig.problem)
                  .where(*same_gpu(device), *_in_class(dtype, head_dim, causal),
                         BestConfig.family != "sdpa"))
        families: set[str] = set()
        seen: set[str] = set()
        with self._reading() as s:
            for query in (timed, stored):
                seen.update(family for family, seqlen_q in s.execute(query)
                            if isinstance(seqlen_q, int) and bucket(seqlen_q) == lq)
            for best_id, family, seqlen_q, median, sdpa, speedup in s.execute(best):
                if not (positive(median) and positive(sdpa) and positive(speedup)
                        and math.isclose(speedup, sdpa / median, rel_tol=1e-6)):
                    _log.warning("stored best config #%s has no valid speed-up (%r us, SDPA "
                                 "%r us, %r): left out", best_id, median, sdpa, speedup)
                elif bucket(seqlen_q) == lq:
                    families.add(family)
            for measurement_id, family, seqlen_q, time, baseline in s.execute(measured):
                if not (positive(time) and positive(baseline)):
                    _log.warning("stored measurement #%s has no valid median_us or baseline_us "
                                 "(%r, %r): left out", measurement_id, time, baseline)
                elif bucket(seqlen_q) == lq:
                    families.add(family)
        return families, seen | families

    def list_best(self, device: DeviceInfo | str | None = None) -> list[BestRecord]:
        """Every stored best; rows that fail validation are skipped (see `broken_rows`)."""
        with self._reading() as s:
            return self._records(s, device)

    def _records(self, s: Session, device: DeviceInfo | str | None) -> list[BestRecord]:
        return self._records_of(self._best_rows(s, device))

    def _records_of(self, rows: Sequence[BestConfig]) -> list[BestRecord]:
        records = []
        for row in rows:
            try:
                records.append(self._record(row))
            except BrokenRow:
                continue
        return records

    def broken_rows(self) -> list[str]:
        with self._reading() as s:
            problems = []
            for row in self._best_rows(s, None):
                try:
                    self._record(row)
                except BrokenRow as exc:
                    problems.append(str(exc))
            return problems

    # -- export / import --------------------------------------------------------------------

    def export(self, device: DeviceInfo | str | None = None) -> dict[str, Any]:
        return {
            "format": EXPORT_FORMAT, "version": EXPORT_VERSION, "schema": head_revision(),
            "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "results": [{
                "device": r.device.as_dict(), "problem": r.problem.as_dict(),
                "family": r.config.family, "config": r.config.as_dict(),
                "median_us": r.median_us, "tflops": r.tflops,
                "sdpa_default_us": r.sdpa_default_us, "sdpa_flash_us": r.sdpa_flash_us,
                "trials": r.trials, "study": r.study, "source": r.source,
                "p20_us": r.p20_us, "p80_us": r.p80_us, "decision": r.decision,
                "runner_up_us": r.runner_up_us, "torch_version": r.torch_version,
                "cudnn_version": r.cudnn_version, "regime": r.regime,
            } for r in self.list_best(device)],
        }

    def import_results(self, data: Any, *, overwrite: bool = False,
                       refresh_imported: bool = False) -> dict[str, int]:
        """Import an export in one transaction: every entry is validated first, and a bad
        entry (or a failure while writing) imports nothing.

        An existing best config is kept unless `overwrite`; with `refresh_imported`, one that
        was itself imported (not tuned here) is replaced when the entry differs, which is how
        newer shipped results reach a database seeded by older ones. Entries equal to what is
        stored write nothing; an entry repeating an earlier one of the file is counted as a
        duplicate (one that repeats it with another result refuses the file)."""
        entries = parse_export(data)
        counts = {"imported": 0, "kept_existing": 0, "duplicates": 0}
        with self._transaction() as s, s.no_autoflush:
            rows = self._best_rows(s, None)
            stored = {(r.device.name, r.device.compute_capability, r.device.sm_count,
                       r.problem): r for r in self._records_of(rows)}
            chosen: dict[Any, ImportEntry] = {}
            for entry in entries:
                if entry.key in chosen:
                    counts["duplicates"] += 1
                elif self._replaces(stored.get(entry.key), entry, overwrite, refresh_imported):
                    chosen[entry.key] = entry
                else:
                    counts["kept_existing"] += 1
            # The rows the entries refer to, looked up and created in bulk (one flush), not
            # one round trip per entry: a shared results file can hold 100k+ entries.
            devices = {d: self._device(s, d).id for d in {e.device for e in chosen.values()}}
            problems = self._problem_ids(s, {e.problem for e in chosen.values()})
            configs = self._config_ids(s, {e.result.config for e in chosen.values()})
            existing = {(row.device_id, row.problem_id): row for row in rows}
            for entry in chosen.values():
                ids = (devices[entry.device], problems[entry.problem])
                self._put_best(
                    s, *ids, configs[entry.result.config], entry.problem, entry.result,
                    measurement_id=None, study=entry.study, trials=entry.trials,
                    sdpa_default_us=entry.sdpa_default_us, sdpa_flash_us=entry.sdpa_flash_us,
                    source="imported", decision=entry.decision,
                    runner_up_us=entry.runner_up_us,
                    row=existing.get(ids) or BestConfig(device_id=ids[0], problem_id=ids[1]))
                counts["imported"] += 1
        return counts

    @staticmethod
    def _problem_ids(s: Session, wanted: set[Problem]) -> dict[Problem, int]:
        known = {problem: row for row in s.scalars(select(ProblemRow))
                 if (problem := _problem_or_none(row)) is not None}
        new = {p: ProblemRow(**p.as_dict()) for p in wanted if p not in known}
        s.add_all(new.values())
        s.flush()
        return {p: (known.get(p) or new[p]).id for p in wanted}

    @staticmethod
    def _config_ids(s: Session, wanted: set[Config]) -> dict[Config, int]:
        by_digest = {c.digest: c for c in wanted}
        known = {row.digest: row for row in s.scalars(select(KernelConfig))
                 if row.digest in by_digest}
        new = {d: KernelConfig(digest=d, family=c.family, config_json=c.to_json())
               for d, c in by_digest.items() if d not in known}
        s.add_all(new.values())
        s.flush()
        return {c: (known.get(c.digest) or new[c.digest]).id for c in wanted}

    @staticmethod
    def _replaces(existing: BestRecord | None, entry: ImportEntry, overwrite: bool,
                  refresh_imported: bool) -> bool:
        if existing is None or overwrite:
            return True
        return refresh_imported and existing.source == "imported" and (
            existing.config, existing.median_us) != (entry.result.config, entry.result.median_us)

    # -- report and recheck -----------------------------------------------------------------

    @staticmethod
    def _model_measurements(device: DeviceInfo, problem: Problem) -> Any:
        """The query of every measurement of `problem` on this GPU model (name, compute
        capability, SM count: driver and CUDA versions may differ), oldest first. Reads only:
        a problem the database does not hold matches nothing."""
        return (select(Measurement).join(Device).join(ProblemRow)
                .options(joinedload(Measurement.config))
                .where(*same_gpu(device), *_is_problem(problem))
                .order_by(Measurement.id))

    @staticmethod
    def _timing_of(row: Measurement) -> TrialResult:
        """A stored measurement as the TrialResult it recorded (`reused`: from the database);
        a row whose config, status or time cannot be one is refused (BrokenRow, naming it)."""
        build_key = _build_key(row.build)
        try:
            status = Status(row.status)
        except ValueError:
            raise BrokenRow(f"stored measurement #{row.id} has no valid status: "
                            f"{row.status!r}") from None
        for name in ("median_us", "p20_us", "p80_us"):
            value = getattr(row, name)
            if status == Status.OK and name == "median_us" and value is None or (
                    value is not None and not positive(value)):
                raise BrokenRow(f"stored measurement #{row.id} has no valid {name}: "
                                f"{shown(value)}")
        return TrialResult(_config_of(referenced(row, "config")), status, row.reason,
                           row.median_us,
                           row.p20_us, row.p80_us, row.rounds, row.rel_err, row.max_abs_err,
                           build_key, reused=True, env=_env_of(row))

    def timings(self, device: DeviceInfo, problem: Problem) -> list[TrialResult]:
        """Every timed (ok) measurement of `problem` on this GPU model, of every phase and
        family (torch SDPA's included), oldest first; rows whose config fails validation are
        left out."""
        with self._reading() as s:
            query = self._model_measurements(device, problem).where(
                Measurement.status == Status.OK)
            found = []
            for row in s.scalars(query):
                try:
                    found.append(self._timing_of(row))
                except BrokenRow as exc:
                    _log.warning("%s: left out", exc)
                    continue
            return [t for t in found if t.ok]

    def latest_rerank(self, device: DeviceInfo, problem: Problem) -> list[TrialResult]:
        """The measurements of the latest re-ranking (phase "rerank") of `problem` on this GPU
        model, whatever their status: the run of re-rank measurements of the problem that ends
        at its newest one (a re-ranking records its finalists one after the other, each config
        once)."""
        with self._reading() as s:
            rows = list(s.scalars(self._model_measurements(device, problem)))
            session: list[TrialResult] = []
            seen: set[str] = set()
            started = False
            for row in reversed(rows):
                if row.phase != "rerank":
                    if started:
                        break
                    continue
                if row.config_id in seen:
                    break
                started = True
                seen.add(row.config_id)
                try:
                    session.append(self._timing_of(row))
                except BrokenRow:
                    continue
            return session[::-1]

    def best_environment(self, device: DeviceInfo, problem: Problem) -> Environment | None:
        """What the stored best of `problem` on this GPU model was timed under: the
        environment of the measurement it points to, else the torch and cuDNN versions kept
        with the best row; None when neither is known (an imported row, an older schema)."""
        with self._reading() as s:
            row = self._best_row(s, device, problem)
            if row is None:
                return None
            measured = (s.get(Measurement, row.measurement_id)
                        if row.measurement_id is not None else None)
            env = _env_of(measured) if measured is not None else None
            if env is not None:
                return env
            if row.torch_version or row.cudnn_version or row.regime:
                return Environment(regime=row.regime or "", torch_version=row.torch_version or "",
                                   cudnn_version=row.cudnn_version or "")
            return None

    def latest_baseline(self, device: DeviceInfo, problem: Problem,
                        backend: str = "default") -> BaselineTiming | None:
        """The newest timing of one torch SDPA backend on `problem` on this GPU model. Reads
        only (`latest_baselines` creates the device and problem rows it does not find)."""
        with self._reading() as s:
            query = (select(Baseline).join(Device, Baseline.device_id == Device.id)
                     .join(ProblemRow, Baseline.problem_id == ProblemRow.id)
                     .where(*same_gpu(device), Baseline.backend == backend,
                            *_is_problem(problem))
                     .order_by(Baseline.id.desc()))
            for row in s.scalars(query):
                if _passes(check_baseline, row):
                    return BaselineTiming(row.backend, row.median_us, row.p20_us, row.p80_us,
                                          _env_of(row))
            return None

    # -- runtime misses ---------------------------------------------------------------------

    def add_misses(self, entries: Sequence[tuple[DeviceInfo, Problem, str, int, datetime,
                                                 datetime]]) -> int:
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

    def _add_misses(self, merged: dict[_MissKey, tuple[int, datetime, datetime]], *,
                    retry: bool) -> int:
        with self._transaction() as s:
            try:
                problems = self._problem_ids(s, {key[3] for key in merged})
                for (name, cc, sm, problem, path), (count, first, last) in merged.items():
                    seen = update(RuntimeMiss).where(
                        RuntimeMiss.device_name == name, RuntimeMiss.compute_capability == cc,
                        RuntimeMiss.sm_count == sm, RuntimeMiss.problem_id == problems[problem],
                        RuntimeMiss.path == path,
                    ).values(
                        count=RuntimeMiss.count + count,
                        first_seen=case((RuntimeMiss.first_seen > first, first),
                                        else_=RuntimeMiss.first_seen),
                        last_seen=case((RuntimeMiss.last_seen < last, last),
                                       else_=RuntimeMiss.last_seen),
                    ).execution_options(synchronize_session=False)
                    if cast("CursorResult[Any]", s.execute(seen)).rowcount == 0:
                        s.add(RuntimeMiss(device_name=name, compute_capability=cc, sm_count=sm,
                                          problem_id=problems[problem], path=path, count=count,
                                          first_seen=first, last_seen=last))
                s.flush()
            except IntegrityError:
                if not retry:
                    raise
                raise _InsertRace from None  # leaves the transaction, which rolls back
            return len(merged)

    def list_misses(self, device: DeviceInfo | str | None = None, *,
                    limit: int | None = None) -> list[MissRecord]:
        """Stored runtime misses, the most frequent first (of one GPU model: name, compute
        capability and SM count; of a device name; or of every device)."""
        with self._reading() as s:
            query = select(RuntimeMiss).options(joinedload(RuntimeMiss.problem))
            if isinstance(device, str):
                query = query.where(RuntimeMiss.device_name == device)
            elif device is not None:
                query = query.where(*same_gpu(device, RuntimeMiss.device_name,
                                              RuntimeMiss.compute_capability,
                                              RuntimeMiss.sm_count))
            query = query.order_by(RuntimeMiss.count.desc(), RuntimeMiss.last_seen.desc(),
                                   RuntimeMiss.id)
            # no LIMIT in SQL: a refused row (text sorts above every count in SQLite) must not
            # take the place of one that is served
            found = [MissRecord(row.device_name, row.compute_capability, row.sm_count,
                                problem, row.path, row.count,
                                _iso_utc(row.first_seen), _iso_utc(row.last_seen))
                     for row in s.scalars(query)
                     if (problem := _served_problem(check_miss, row)) is not None]
            return found[:limit]


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


def _merge_misses(entries: Sequence[tuple[DeviceInfo, Problem, str, int, datetime, datetime]]
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
