"""Operations on the tuning database. Each public method owns exactly one transaction."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from ..compiler import BuildResult
from ..config import Config, InvalidConfig
from ..problem import Problem
from ..space import load_space, validate_config
from ..target import target_for_arch
from .models import (
    Baseline,
    BestConfig,
    Build,
    Device,
    KernelConfig,
    Measurement,
    ProblemRow,
)
from .records import BaselineTiming, BestRecord, DeviceInfo, TrialResult
from .schema import head_revision, open_engine

EXPORT_FORMAT = "cute-autotune-results"
EXPORT_VERSION = 1


class BrokenRow(ValueError):
    """A database row (or an imported entry) that does not describe a runnable kernel."""


def problem_distance(a: Problem, b: Problem) -> float:
    """How far apart two problems of the same dtype, head dim and causality are.

    Sum of |log2 ratio| of Lq, Lk and B*Hq, plus half the |log2 ratio| of the GQA group size:
    a kernel tuned for a shape twice as long is as near as one for twice the batch.
    """
    def term(x: float, y: float) -> float:
        return abs(math.log2(x / y))

    return (term(a.seqlen_q, b.seqlen_q) + term(a.seqlen_k, b.seqlen_k)
            + term(a.batch * a.heads_q, b.batch * b.heads_q)
            + 0.5 * term(a.group_size, b.group_size))


def _problem_of(row: ProblemRow) -> Problem:
    return Problem(row.batch, row.heads_q, row.heads_kv, row.seqlen_q, row.seqlen_k,
                   row.head_dim, row.dtype, bool(row.causal))


def _device_of(row: Device) -> DeviceInfo:
    return DeviceInfo(row.name, row.compute_capability, row.sm_count, row.driver_version,
                      row.cuda_version)


def _config_of(row: KernelConfig, problem: Problem | None = None) -> Config:
    """The stored config, validated again: a broken row is refused, never run."""
    try:
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


RowT = TypeVar("RowT", Device, ProblemRow, KernelConfig)


def _get_or_create(s: Session, model: type[RowT], identity: dict[str, Any],
                   extra: dict[str, Any] | None = None) -> RowT:
    """The row whose columns equal `identity`, created (with `extra`) if there is none."""
    row = s.scalars(select(model).filter_by(**identity)).first()
    if row is None:
        row = model(**identity, **(extra or {}))
        s.add(row)
        s.flush()
    return row


class TuningStore:
    def __init__(self, url: str | None = None, engine: Engine | None = None) -> None:
        self.engine = engine or open_engine(url)
        self.url = str(self.engine.url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        with self._sessions() as session, session.begin():
            yield session

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
        digest = None
        if build.cubin is not None and build.cubin.is_file():
            digest = hashlib.sha256(build.cubin.read_bytes()).hexdigest()
        row = Build(
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
            compile_seconds=build.seconds, artifact_digest=digest)
        s.add(row)
        s.flush()
        return row

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
                max_abs_err=result.max_abs_err, baseline_us=baseline_us)
            s.add(row)
            s.flush()
            return row.id

    def find_trial(self, device: DeviceInfo, problem: Problem, config: Config,
                   build_key: str | None) -> TrialResult | None:
        """The latest timed measurement of this (device, problem, config, build), if any."""
        with self._transaction() as s:
            query = (select(Measurement).join(Device).join(ProblemRow).join(KernelConfig)
                     .where(Device.name == device.name,
                            Device.compute_capability == device.compute_capability,
                            Device.sm_count == device.sm_count,
                            KernelConfig.digest == config.digest,
                            ProblemRow.id == self._problem(s, problem).id,
                            Measurement.status == "ok")
                     .order_by(Measurement.id.desc()))
            if build_key is not None:
                query = query.join(Build, Measurement.build_id == Build.id).where(
                    Build.artifact_key == build_key)
            row = s.scalars(query).first()
            if row is None:
                return None
            return TrialResult(config, row.status, row.reason, row.median_us, row.p20_us,
                               row.p80_us, row.rounds, row.rel_err, row.max_abs_err, build_key,
                               reused=True)

    def trials(self, device: DeviceInfo | None = None, problem: Problem | None = None,
               study: str | None = None) -> list[dict[str, Any]]:
        with self._transaction() as s:
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
                     "problem": _problem_of(p).as_dict(), "device": d.name}
                    for m, p, d in rows]

    # -- baselines --------------------------------------------------------------------------

    def record_baselines(self, device: DeviceInfo, problem: Problem, study: str,
                         timings: Sequence[BaselineTiming]) -> None:
        with self._transaction() as s:
            device_id, problem_id = self._device(s, device).id, self._problem(s, problem).id
            for t in timings:
                s.add(Baseline(device_id=device_id, problem_id=problem_id, study=study,
                               backend=t.backend, median_us=t.median_us, p20_us=t.p20_us,
                               p80_us=t.p80_us,
                               tflops=problem.flops / (t.median_us * 1e-6) / 1e12))

    def latest_baselines(self, device: DeviceInfo, problem: Problem) -> dict[str, BaselineTiming]:
        with self._transaction() as s:
            rows = s.scalars(select(Baseline).where(
                Baseline.device_id == self._device(s, device).id,
                Baseline.problem_id == self._problem(s, problem).id).order_by(Baseline.id)).all()
            return {r.backend: BaselineTiming(r.backend, r.median_us, r.p20_us, r.p80_us)
                    for r in rows}

    # -- best configs -----------------------------------------------------------------------

    def set_best(self, device: DeviceInfo, problem: Problem, result: TrialResult, *,
                 measurement_id: int | None, study: str, trials: int,
                 sdpa_default_us: float | None, sdpa_flash_us: float | None,
                 source: str = "tuned") -> None:
        if not result.ok or result.median_us is None:
            raise ValueError("only a timed result can be the best")
        with self._transaction() as s:
            device_id, problem_id = self._device(s, device).id, self._problem(s, problem).id
            config_id = self._config(s, result.config).id
            row = s.scalars(select(BestConfig).filter_by(device_id=device_id,
                                                         problem_id=problem_id)).first()
            if row is None:
                row = BestConfig(device_id=device_id, problem_id=problem_id)
            row.config_id = config_id
            row.measurement_id = measurement_id
            row.family = result.config.family
            row.study = study
            row.median_us = result.median_us
            row.tflops = problem.flops / (result.median_us * 1e-6) / 1e12
            row.sdpa_default_us = sdpa_default_us
            row.sdpa_flash_us = sdpa_flash_us
            median = result.median_us
            row.speedup_vs_default = sdpa_default_us / median if sdpa_default_us else None
            row.speedup_vs_flash = sdpa_flash_us / median if sdpa_flash_us else None
            row.trials = trials
            row.source = source
            row.updated_at = datetime.now(UTC)
            s.add(row)

    def _best_rows(self, s: Session, device: DeviceInfo | str | None) -> list[BestConfig]:
        """Best rows of one GPU model (name, compute capability and SM count; driver and CUDA
        versions may differ between machines), of a device name, or of every device."""
        query = select(BestConfig).join(Device)
        if isinstance(device, str):
            query = query.where(Device.name == device)
        elif device is not None:
            query = query.where(Device.name == device.name,
                                Device.compute_capability == device.compute_capability,
                                Device.sm_count == device.sm_count)
        return list(s.scalars(query.order_by(BestConfig.id)).all())

    @staticmethod
    def _record(row: BestConfig) -> BestRecord:
        problem = _problem_of(row.problem)
        return BestRecord(
            device=_device_of(row.device), problem=problem,
            config=_config_of(row.config, problem), median_us=row.median_us, tflops=row.tflops,
            sdpa_default_us=row.sdpa_default_us, sdpa_flash_us=row.sdpa_flash_us,
            trials=row.trials, study=row.study, source=row.source,
            updated_at=row.updated_at.isoformat(timespec="seconds") if row.updated_at else "")

    def best(self, device: DeviceInfo | str | None, problem: Problem) -> BestRecord | None:
        """The best config of exactly this problem (on this device, or any device if None)."""
        with self._transaction() as s:
            for row in self._best_rows(s, device):
                if _problem_of(row.problem) == problem:
                    return self._record(row)
            return None

    def timed_build_keys(self, device: DeviceInfo | str | None = None
                         ) -> dict[tuple[str, Problem], str]:
        """(device name, problem) -> artifact key of the build each best was timed with; rows
        without one (imported, or timed before builds were recorded) are left out. Kept apart
        from the records, which dispatch reads: it costs two more queries."""
        with self._transaction() as s:
            query = (select(BestConfig.id, Build.artifact_key).select_from(BestConfig)
                     .join(Measurement, Measurement.id == BestConfig.measurement_id)
                     .join(Build, Build.id == Measurement.build_id))
            timed = {best_id: key for best_id, key in s.execute(query)}
            return {(row.device.name, _problem_of(row.problem)): timed[row.id]
                    for row in self._best_rows(s, device) if timed.get(row.id)}

    def family_tuned(self, device: DeviceInfo, problem: Problem, study: str,
                     current_key: Callable[[Config], str] | None = None) -> bool:
        """Whether the study searched this problem and the best config was decided after its
        last search measurement (a session killed inside the study, or between its search and
        the re-timing, has not tuned it). An imported best config has no study here: False.

        With `current_key` (the backend's build key of a config): also False when the study's
        last built search trial ran a build other than the one the current kernel sources,
        toolchain and flags make, so a kernel update is searched again rather than trusted."""
        with self._transaction() as s:
            best = next((row for row in self._best_rows(s, device)
                         if _problem_of(row.problem) == problem), None)
            if best is None or best.measurement_id is None:
                return False
            mine = (select(func.max(Measurement.id)).join(ProblemRow).join(Device)
                    .where(Measurement.study == study, ProblemRow.id == best.problem_id,
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
                if trial is not None and trial.build is not None and (
                        trial.build.artifact_key != current_key(_config_of(trial.config))):
                    return False
            return True

    def nearest(self, device: DeviceInfo | str | None, problem: Problem, *,
                family: str | None = None) -> tuple[BestRecord, float] | None:
        """The tuned problem of the same dtype, head dim and causality nearest to `problem`
        (of those whose best config is of `family`, when given)."""
        with self._transaction() as s:
            candidates = []
            for row in self._best_rows(s, device):
                if family is not None and row.config.family != family:
                    continue
                other = _problem_of(row.problem)
                if (other.dtype, other.head_dim, other.causal) == (
                        problem.dtype, problem.head_dim, problem.causal):
                    candidates.append((problem_distance(problem, other), row.id, row))
            if not candidates:
                return None
            distance, _, row = min(candidates, key=lambda c: (c[0], c[1]))
            return self._record(row), distance

    def list_best(self, device: DeviceInfo | str | None = None) -> list[BestRecord]:
        """Every stored best; rows that fail validation are skipped (see `broken_rows`)."""
        with self._transaction() as s:
            records = []
            for row in self._best_rows(s, device):
                try:
                    records.append(self._record(row))
                except BrokenRow:
                    continue
            return records

    def broken_rows(self) -> list[str]:
        with self._transaction() as s:
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
            } for r in self.list_best(device)],
        }

    def import_results(self, data: Any, *, overwrite: bool = False,
                       refresh_imported: bool = False) -> dict[str, int]:
        """Import an export; every entry is validated first and a bad file imports nothing.

        An existing best config is kept unless `overwrite`; with `refresh_imported`, one that
        was itself imported (not tuned here) is replaced when the entry differs, which is how
        newer shipped results reach a database seeded by older ones. Entries equal to what is
        stored write nothing."""
        entries = parse_export(data)
        counts = {"imported": 0, "kept_existing": 0}
        with self._transaction() as s:
            stored = {(r.device.name, r.device.sm_count, r.problem): r
                      for r in map(self._record, self._best_rows(s, None))}
        for device, problem, result, extra in entries:
            existing = stored.get((device.name, device.sm_count, problem))
            replace = overwrite or (refresh_imported and existing is not None
                                    and existing.source == "imported"
                                    and (existing.config, existing.median_us)
                                    != (result.config, result.median_us))
            if existing is not None and not replace:
                counts["kept_existing"] += 1
                continue
            self.set_best(device, problem, result, measurement_id=None,
                          study=extra["study"], trials=extra["trials"],
                          sdpa_default_us=extra["sdpa_default_us"],
                          sdpa_flash_us=extra["sdpa_flash_us"], source="imported")
            counts["imported"] += 1
        return counts


def _positive(value: Any, name: str, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise BrokenRow(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _violations_on(config: Config, device: DeviceInfo) -> list[str]:
    """Why `config` cannot run on `device`, by its family's space: compute capability, then
    the static constraints where the device's limits are known."""
    space = load_space(config.family)
    if not space.supports(device.compute_capability):
        return [f"family {config.family} runs on {space.cc_range()}"]
    try:
        target = target_for_arch(device.compute_capability)
    except ValueError:  # a GPU model this release has no table entry for
        return []
    return space.violations(config, target)


def parse_export(data: Any) -> list[tuple[DeviceInfo, Problem, TrialResult, dict[str, Any]]]:
    """Validate an exported document; raise BrokenRow listing every bad entry."""
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise BrokenRow(f"not a {EXPORT_FORMAT} document")
    if data.get("version") != EXPORT_VERSION:
        raise BrokenRow(f"export version {data.get('version')!r} is not {EXPORT_VERSION}")
    results = data.get("results")
    if not isinstance(results, list):
        raise BrokenRow("'results' must be a list")
    parsed, errors = [], []
    for i, entry in enumerate(results):
        try:
            if not isinstance(entry, dict):
                raise BrokenRow("entry is not an object")
            d = entry.get("device") or {}
            device = DeviceInfo(str(d["name"]), int(d["compute_capability"]), int(d["sm_count"]),
                                str(d["driver_version"]), str(d["cuda_version"]))
            problem = Problem(**entry["problem"])
            config = validate_config(Config.from_dict(entry["config"]))
            if entry.get("family", config.family) != config.family:
                raise BrokenRow(f"family {entry['family']!r} but a {config.family} config")
            reasons = _violations_on(config, device)
            if reasons:
                raise BrokenRow(f"{config.family} config cannot run on {device.name} "
                                f"(sm_{device.compute_capability}): {'; '.join(reasons)}")
            mismatch = {k: v for k, v in problem.space_values().items() if config[k] != v}
            if mismatch:
                raise BrokenRow(f"config is for another problem class ({mismatch} differ)")
            median = _positive(entry.get("median_us"), "median_us")
            extra = {
                "sdpa_default_us": _positive(entry.get("sdpa_default_us"), "sdpa_default_us",
                                             optional=True),
                "sdpa_flash_us": _positive(entry.get("sdpa_flash_us"), "sdpa_flash_us",
                                           optional=True),
                "trials": int(entry.get("trials", 0)),
                "study": str(entry.get("study", "imported")),
            }
            parsed.append((device, problem, TrialResult(config, "ok", median_us=median), extra))
        except (BrokenRow, InvalidConfig, KeyError, TypeError, ValueError) as exc:
            errors.append(f"entry #{i}: {exc}")
    if errors:
        raise BrokenRow("refused, nothing imported:\n  " + "\n  ".join(errors))
    return parsed
