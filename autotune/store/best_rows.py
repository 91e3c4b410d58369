"""Best configs: stored per (GPU model, problem) and looked up exactly, by the nearest tuned
problem, or by region against SDPA."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, contains_eager, joinedload

from ..measure.environment import Environment
from ..model.config import Config
from ..model.problem import Problem
from ..model.status import Status
from .base import StoreBase
from .exchange import BrokenRow
from .models import (
    BestConfig,
    Build,
    Device,
    KernelConfig,
    Measurement,
    ProblemRow,
)
from .records import BestRecord, DeviceInfo, TrialResult
from .row_checks import (
    check_best_numbers,
    device_of,
    positive,
    referenced,
)
from .row_helpers import (
    _build_key,
    _config_of,
    _distance,
    _env_of,
    _in_class,
    _insert_unless_present,
    _is_problem,
    _of_device,
    _problem_of,
    _problem_or_none,
    _sizes_or_none,
    same_gpu,
)

_log = logging.getLogger(__name__)


class BestRows(StoreBase):
    """The best config per (GPU model, problem), and the lookups dispatch and tuning make."""

    # -- best configs -----------------------------------------------------------------------

    def set_best(
        self,
        device: DeviceInfo,
        problem: Problem,
        result: TrialResult,
        *,
        measurement_id: int | None,
        study: str,
        trials: int,
        sdpa_default_us: float | None,
        sdpa_flash_us: float | None,
        source: str = "tuned",
        decision: str | None = None,
        runner_up_us: float | None = None,
    ) -> None:
        if not result.ok or result.median_us is None:
            raise ValueError("only a timed result can be the best")
        with self._transaction() as s:
            self._put_best(
                s,
                self._device(s, device).id,
                self._problem(s, problem).id,
                self._config(s, result.config).id,
                problem,
                result,
                measurement_id=measurement_id,
                study=study,
                trials=trials,
                sdpa_default_us=sdpa_default_us,
                sdpa_flash_us=sdpa_flash_us,
                source=source,
                decision=decision,
                runner_up_us=runner_up_us,
            )

    @staticmethod
    def _put_best(
        s: Session,
        device_id: int,
        problem_id: int,
        config_id: int,
        problem: Problem,
        result: TrialResult,
        *,
        measurement_id: int | None,
        study: str,
        trials: int,
        sdpa_default_us: float | None,
        sdpa_flash_us: float | None,
        source: str,
        decision: str | None = None,
        runner_up_us: float | None = None,
        row: BestConfig | None = None,
    ) -> None:
        """Insert or replace the best row of (device, problem), inside a transaction (`row`:
        the existing one, when the caller has it)."""
        median = result.median_us
        assert median is not None
        if row is None:
            row = s.scalars(
                select(BestConfig).filter_by(device_id=device_id, problem_id=problem_id)
            ).first()
        if row is None:
            # created first with what a best row must hold, so that a concurrent creator's row
            # is updated below instead of colliding with it
            _insert_unless_present(
                s,
                BestConfig,
                {
                    "device_id": device_id,
                    "problem_id": problem_id,
                    "config_id": config_id,
                    "family": result.config.family,
                    "study": study,
                    "median_us": median,
                    "tflops": problem.tflops(median),
                    "trials": trials,
                    "source": source,
                },
            )
            row = s.scalars(
                select(BestConfig).filter_by(device_id=device_id, problem_id=problem_id)
            ).one()
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
        query = (
            select(BestConfig)
            .outerjoin(Device)
            .options(
                joinedload(BestConfig.device),
                joinedload(BestConfig.problem),
                joinedload(BestConfig.config),
            )
        )
        return list(s.scalars(_of_device(query, device).order_by(BestConfig.id)).all())

    @staticmethod
    def _best_row(
        s: Session, device: DeviceInfo | str | None, problem: Problem
    ) -> BestConfig | None:
        """The best row of exactly `problem` on `device` (the oldest, when several devices of
        one GPU model, or several devices, have one), with its device, problem and config: one
        indexed query (devices, then the problem by uq_problems_shape, then uq_best_per_problem
        or ix_best_configs_problem)."""
        query = (
            select(BestConfig)
            .join(BestConfig.device)
            .join(BestConfig.problem)
            .options(
                contains_eager(BestConfig.device),
                contains_eager(BestConfig.problem),
                joinedload(BestConfig.config),
            )
            .where(*_is_problem(problem))
        )
        return s.scalars(_of_device(query, device).order_by(BestConfig.id).limit(1)).first()

    @staticmethod
    def _record(row: BestConfig) -> BestRecord:
        problem = _problem_of(referenced(row, "problem"))
        device = device_of(referenced(row, "device"))
        check_best_numbers(row)
        return BestRecord(
            device=device,
            problem=problem,
            config=_config_of(referenced(row, "config"), problem),
            median_us=row.median_us,
            tflops=row.tflops,
            sdpa_default_us=row.sdpa_default_us,
            sdpa_flash_us=row.sdpa_flash_us,
            trials=row.trials,
            study=row.study,
            source=row.source,
            updated_at=row.updated_at.isoformat(timespec="seconds") if row.updated_at else "",
            p20_us=row.p20_us,
            p80_us=row.p80_us,
            decision=row.decision,
            runner_up_us=row.runner_up_us,
            torch_version=row.torch_version,
            cudnn_version=row.cudnn_version,
            regime=row.regime,
        )

    def tuned_problems(self, device: DeviceInfo | str | None) -> frozenset[Problem]:
        """The problems that have a best config on `device` (one query of the problems, their
        configs not read; a broken problem row is left out)."""
        query = (
            select(ProblemRow)
            .join(BestConfig, BestConfig.problem_id == ProblemRow.id)
            .join(Device, BestConfig.device_id == Device.id)
        )
        with self._reading() as s:
            rows = s.scalars(_of_device(query, device).distinct()).all()
            return frozenset(p for p in map(_problem_or_none, rows) if p is not None)

    def best(self, device: DeviceInfo | str | None, problem: Problem) -> BestRecord | None:
        """The best config of exactly this problem (on this device, or any device if None)."""
        with self._reading() as s:
            row = self._best_row(s, device, problem)
            return self._record(row) if row is not None else None

    def timed_build_keys(
        self, device: DeviceInfo | str | None = None
    ) -> dict[tuple[str, Problem], str]:
        """(device name, problem) -> artifact key of the build each best was timed with; rows
        without one (imported, or timed before builds were recorded) are left out. Kept apart
        from the records, which dispatch reads: it costs two more queries."""
        with self._reading() as s:
            query = (
                select(BestConfig.id, Build)
                .select_from(BestConfig)
                .join(Measurement, Measurement.id == BestConfig.measurement_id)
                .join(Build, Build.id == Measurement.build_id)
            )
            timed = {
                best_id: key
                for best_id, build in s.execute(query)
                if (key := _build_key(build)) is not None
            }
            return {
                (row.device.name, problem): timed[row.id]
                for row in self._best_rows(s, device)
                if timed.get(row.id)
                and row.device is not None
                and (problem := _problem_or_none(row.problem))
            }

    def family_tuned(
        self,
        device: DeviceInfo,
        problem: Problem,
        study: str,
        current_key: Callable[[Config], str] | None = None,
    ) -> bool:
        """Whether the study searched this problem and the best config was decided after its
        last search measurement (a session killed inside the study, or between its search and
        the re-timing, has not tuned it). An imported best config has no study here: False.

        With `current_key` (the backend's build key of a config): also False when the study's
        last built search trial ran a build other than the one the current kernel sources,
        toolchain and flags make, so a kernel update is searched again rather than trusted."""
        with self._reading() as s:
            best = s.execute(
                _of_device(
                    select(BestConfig.problem_id, BestConfig.measurement_id)
                    .join(BestConfig.device)
                    .join(BestConfig.problem)
                    .where(*_is_problem(problem)),
                    device,
                )
                .order_by(BestConfig.id)
                .limit(1)
            ).first()
            if best is None or best.measurement_id is None:
                return False
            mine = (
                select(func.max(Measurement.id))
                .join(Device)
                .where(
                    Measurement.study == study,
                    Measurement.problem_id == best.problem_id,
                    Device.name == device.name,
                )
            )
            last_any = s.scalar(mine)
            last_search = s.scalar(mine.where(Measurement.phase == "search"))
            searched = last_any is not None
            if not (searched and (last_search is None or best.measurement_id > last_search)):
                return False
            if current_key is not None:
                built = s.scalar(
                    mine.where(Measurement.phase == "search", Measurement.build_id.is_not(None))
                )
                trial = s.get(Measurement, built) if built is not None else None
                try:
                    moved = (
                        trial is not None
                        and trial.build is not None
                        and (
                            _build_key(trial.build)
                            != current_key(_config_of(referenced(trial, "config")))
                        )
                    )
                except BrokenRow as exc:  # searched again rather than trusted
                    _log.warning("%s: the study is searched again", exc)
                    return False
                if moved:
                    return False
            return True

    def nearest(
        self,
        device: DeviceInfo | str | None,
        problem: Problem,
        *,
        family: str | tuple[str, ...] | None = None,
        accept: Callable[[BestRecord], bool] | None = None,
    ) -> tuple[BestRecord, float] | None:
        """The tuned problem of the same dtype, head dim, causality and KV-cache kind nearest to
        `problem` (of those whose best config is of `family`, or of one of several, when given,
        and whose best `accept` takes); a refused row is logged and passed over for the next
        nearest."""
        # SQL keeps the best rows of the problem class on the device (ix_problems_class), a
        # few columns each; they are ranked here by problem_distance (a tie goes to the oldest
        # row), and only the nearest is read whole.
        query = (
            select(
                BestConfig.id,
                ProblemRow.id,
                ProblemRow.batch,
                ProblemRow.heads_q,
                ProblemRow.heads_kv,
                ProblemRow.seqlen_q,
                ProblemRow.seqlen_k,
            )
            .join(BestConfig.device)
            .join(BestConfig.problem)
            .where(
                *_in_class(
                    problem.dtype,
                    problem.head_dim,
                    problem.causal,
                    problem.kv_cache,
                    problem.backward,
                    problem.deterministic,
                )
            )
        )
        if family is not None:
            families = (family,) if isinstance(family, str) else tuple(family)
            query = query.join(BestConfig.config).where(KernelConfig.family.in_(families))
        with self._reading() as s:
            candidates = [
                (_distance(problem, *valid), best_id)
                for best_id, problem_id, *sizes in s.execute(_of_device(query, device))
                if (valid := _sizes_or_none(problem_id, sizes)) is not None
            ]
            for distance, best_id in sorted(candidates):
                row = s.scalars(
                    select(BestConfig)
                    .where(BestConfig.id == best_id)
                    .options(
                        joinedload(BestConfig.device),
                        joinedload(BestConfig.problem),
                        joinedload(BestConfig.config),
                    )
                ).one()
                try:
                    record = self._record(row)
                except BrokenRow as exc:
                    _log.warning("%s: passed over for the next nearest", exc)
                    continue
                if accept is None or accept(record):
                    return record, distance
            return None

    def families_faster_than_sdpa(
        self, device: DeviceInfo, region: tuple[int, str, bool, str], bucket: Callable[[int], str]
    ) -> set[str]:
        """The kernel families timed faster than torch SDPA's default beside them on some
        problem of `region` (head dim, dtype, causality, Lq bucket as `bucket` names it) on
        this GPU model: a stored best with a speed-up above 1, or a measurement faster than
        the SDPA timing stored with it."""
        return self.families_against_sdpa(device, region, bucket)[0]

    def families_against_sdpa(
        self, device: DeviceInfo, region: tuple[int, str, bool, str], bucket: Callable[[int], str]
    ) -> tuple[set[str], set[str]]:
        """(the kernel families timed faster than SDPA's default on some problem of `region`
        on this GPU model, as `families_faster_than_sdpa`; the kernel families timed there at
        all, beside SDPA: a stored best or a measurement with an SDPA timing)."""
        head_dim, dtype, causal, lq = region
        # SQL keeps the rows of the problem class on this GPU model that claim to be faster;
        # the Lq bucket, a function of the caller's, is applied to those few here, and so is
        # the check that the claim is made of real times (SQLite compares text in a number
        # column as greater than any number, and a time of -1 is below any).
        best = (
            select(
                BestConfig.id,
                BestConfig.family,
                ProblemRow.seqlen_q,
                BestConfig.median_us,
                BestConfig.sdpa_default_us,
                BestConfig.speedup_vs_default,
            )
            .join(BestConfig.device)
            .join(BestConfig.problem)
            .where(
                *same_gpu(device),
                *_in_class(dtype, head_dim, causal),
                BestConfig.family != "sdpa",
                BestConfig.speedup_vs_default > 1.0,
            )
        )
        measured = (
            select(
                Measurement.id,
                KernelConfig.family,
                ProblemRow.seqlen_q,
                Measurement.median_us,
                Measurement.baseline_us,
            )
            .select_from(Measurement)
            .join(KernelConfig)
            .join(ProblemRow)
            .join(Device)
            .where(
                *same_gpu(device),
                *_in_class(dtype, head_dim, causal),
                Measurement.status == Status.OK,
                KernelConfig.family != "sdpa",
                Measurement.median_us < Measurement.baseline_us,
            )
        )
        timed = (
            select(KernelConfig.family, ProblemRow.seqlen_q)
            .distinct()
            .select_from(Measurement)
            .join(KernelConfig)
            .join(ProblemRow)
            .join(Device)
            .where(
                *same_gpu(device),
                *_in_class(dtype, head_dim, causal),
                Measurement.status == Status.OK,
                KernelConfig.family != "sdpa",
                Measurement.baseline_us.is_not(None),
            )
        )
        stored = (
            select(BestConfig.family, ProblemRow.seqlen_q)
            .distinct()
            .join(BestConfig.device)
            .join(BestConfig.problem)
            .where(
                *same_gpu(device), *_in_class(dtype, head_dim, causal), BestConfig.family != "sdpa"
            )
        )
        families: set[str] = set()
        seen: set[str] = set()
        with self._reading() as s:
            for query in (timed, stored):
                seen.update(
                    family
                    for family, seqlen_q in s.execute(query)
                    if isinstance(seqlen_q, int) and bucket(seqlen_q) == lq
                )
            for best_id, family, seqlen_q, median, sdpa, speedup in s.execute(best):
                if not (
                    positive(median)
                    and positive(sdpa)
                    and positive(speedup)
                    and math.isclose(speedup, sdpa / median, rel_tol=1e-6)
                ):
                    _log.warning(
                        "stored best config #%s has no valid speed-up (%r us, SDPA "
                        "%r us, %r): left out",
                        best_id,
                        median,
                        sdpa,
                        speedup,
                    )
                elif bucket(seqlen_q) == lq:
                    families.add(family)
            for measurement_id, family, seqlen_q, time, baseline in s.execute(measured):
                if not (positive(time) and positive(baseline)):
                    _log.warning(
                        "stored measurement #%s has no valid median_us or baseline_us "
                        "(%r, %r): left out",
                        measurement_id,
                        time,
                        baseline,
                    )
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

    def best_environment(self, device: DeviceInfo, problem: Problem) -> Environment | None:
        """What the stored best of `problem` on this GPU model was timed under: the
        environment of the measurement it points to, else the torch and cuDNN versions kept
        with the best row; None when neither is known (an imported row, an older schema)."""
        with self._reading() as s:
            row = self._best_row(s, device, problem)
            if row is None:
                return None
            measured = (
                s.get(Measurement, row.measurement_id) if row.measurement_id is not None else None
            )
            env = _env_of(measured) if measured is not None else None
            if env is not None:
                return env
            if row.torch_version or row.cudnn_version or row.regime:
                return Environment(
                    regime=row.regime or "",
                    torch_version=row.torch_version or "",
                    cudnn_version=row.cudnn_version or "",
                )
            return None
