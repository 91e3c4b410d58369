"""Measurements and baselines: every trial's timing, written once and read back by the search
(reuse), the report and recheck."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import ColumnElement, select

from ..build.compiler import BuildResult
from ..model.config import Config
from ..model.problem import Problem
from ..model.status import Status
from .base import StoreBase
from .exchange import BrokenRow
from .models import (
    Baseline,
    Build,
    Device,
    KernelConfig,
    Measurement,
    ProblemRow,
)
from .records import BaselineTiming, DeviceInfo, TrialResult
from .row_checks import (
    check_baseline,
)
from .row_helpers import (
    _env_columns,
    _env_of,
    _is_problem,
    _passes,
    _problem_or_none,
    same_gpu,
)

_log = logging.getLogger(__name__)


class TrialRows(StoreBase):
    """Measurements and SDPA baselines: what every trial timed."""

    # -- measurements -----------------------------------------------------------------------

    def record_trial(
        self,
        device: DeviceInfo,
        problem: Problem,
        result: TrialResult,
        *,
        build: BuildResult | None,
        study: str,
        phase: str,
        baseline_us: float | None,
    ) -> int:
        with self._transaction() as s:
            config_row = self._config(s, result.config)
            build_row = self._build(s, config_row, build) if build is not None else None
            row = Measurement(
                device_id=self._device(s, device).id,
                problem_id=self._problem(s, problem).id,
                config_id=config_row.id,
                build_id=build_row.id if build_row else None,
                study=study,
                phase=phase,
                status=result.status,
                reason=result.reason,
                median_us=result.median_us,
                p20_us=result.p20_us,
                p80_us=result.p80_us,
                rounds=result.rounds,
                tflops=result.tflops(problem),
                rel_err=result.rel_err,
                max_abs_err=result.max_abs_err,
                baseline_us=baseline_us,
                **_env_columns(result.env),
            )
            s.add(row)
            s.flush()
            return row.id

    def find_trial(
        self, device: DeviceInfo, problem: Problem, config: Config, build_key: str | None
    ) -> TrialResult | None:
        """The latest timed measurement of this (device, problem, config, build), if any; a
        newer row whose time cannot be one is refused by name and the next one taken."""
        found = self._latest_measurement(
            device, problem, config, build_key, Measurement.status == Status.OK
        )
        # The config and build as asked, not as the row names them (no key: any build was)
        return replace(found, config=config, build_key=build_key) if found is not None else None

    def find_failure(
        self, device: DeviceInfo, problem: Problem, config: Config, build_key: str
    ) -> TrialResult | None:
        """The latest failed (not OK) measurement of this (device, problem, config, build), if
        any, with its status and reason: what a process that stored it and was gone before it
        told its study found (tune.study settles that trial with it). Never a reason to skip a
        config elsewhere: find_trial reuses times only."""
        return self._latest_measurement(
            device, problem, config, build_key, Measurement.status != Status.OK
        )

    def _latest_measurement(
        self,
        device: DeviceInfo,
        problem: Problem,
        config: Config,
        build_key: str | None,
        outcome: ColumnElement[bool],
    ) -> TrialResult | None:
        """The latest measurement of this (device, problem, config) on the GPU model, of the
        build `build_key` (None: any), whose row meets `outcome`; a newer row that cannot be
        read back (BrokenRow) is refused by name and the next one taken."""
        with self._transaction() as s:
            query = (
                select(Measurement)
                .join(Device)
                .join(ProblemRow)
                .join(KernelConfig)
                .where(
                    *same_gpu(device),
                    KernelConfig.digest == config.digest,
                    ProblemRow.id == self._problem(s, problem).id,
                    outcome,
                )
                .order_by(Measurement.id.desc())
            )
            if build_key is not None:
                query = query.join(Build, Measurement.build_id == Build.id).where(
                    Build.artifact_key == build_key
                )
            for row in s.scalars(query):
                try:
                    return self._timing_of(row)
                except BrokenRow as exc:
                    _log.warning("%s: not reused", exc)
            return None

    def trials(
        self,
        device: DeviceInfo | None = None,
        problem: Problem | None = None,
        study: str | None = None,
    ) -> list[dict[str, Any]]:
        # Without a problem, a plain read (no write lock, BEGIN IMMEDIATE, held meanwhile: a
        # refit reads every measurement while other sessions write); `_problem` may make one.
        with self._reading() if problem is None else self._transaction() as s:
            query = select(Measurement, ProblemRow, Device).join(ProblemRow).join(Device)
            if study is not None:
                query = query.where(Measurement.study == study)
            if problem is not None:
                query = query.where(ProblemRow.id == self._problem(s, problem).id)
            if device is not None:
                query = query.where(Device.name == device.name)
            rows = s.execute(query.order_by(Measurement.id)).all()
            return [
                {
                    "id": m.id,
                    "study": m.study,
                    "phase": m.phase,
                    "status": m.status,
                    "reason": m.reason,
                    "config": json.loads(m.config.config_json),
                    "median_us": m.median_us,
                    "tflops": m.tflops,
                    "problem": problem.as_dict(),
                    "device": d.name,
                }
                for m, p, d in rows
                if (problem := _problem_or_none(p)) is not None
            ]

    # -- baselines --------------------------------------------------------------------------

    def record_baselines(
        self, device: DeviceInfo, problem: Problem, study: str, timings: Sequence[BaselineTiming]
    ) -> None:
        with self._transaction() as s:
            device_id, problem_id = self._device(s, device).id, self._problem(s, problem).id
            for t in timings:
                s.add(
                    Baseline(
                        device_id=device_id,
                        problem_id=problem_id,
                        study=study,
                        backend=t.backend,
                        median_us=t.median_us,
                        p20_us=t.p20_us,
                        p80_us=t.p80_us,
                        tflops=problem.tflops(t.median_us),
                        **_env_columns(t.env),
                    )
                )

    def latest_baselines(self, device: DeviceInfo, problem: Problem) -> dict[str, BaselineTiming]:
        with self._transaction() as s:
            rows = s.scalars(
                select(Baseline)
                .where(
                    Baseline.device_id == self._device(s, device).id,
                    Baseline.problem_id == self._problem(s, problem).id,
                )
                .order_by(Baseline.id)
            ).all()
            return {
                r.backend: BaselineTiming(r.backend, r.median_us, r.p20_us, r.p80_us, _env_of(r))
                for r in rows
                if _passes(check_baseline, r)
            }

    def timings(self, device: DeviceInfo, problem: Problem) -> list[TrialResult]:
        """Every timed (ok) measurement of `problem` on this GPU model, of every phase and
        family (torch SDPA's included), oldest first; rows whose config fails validation are
        left out."""
        with self._reading() as s:
            query = self._model_measurements(device, problem).where(
                Measurement.status == Status.OK
            )
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

    def latest_baseline(
        self, device: DeviceInfo, problem: Problem, backend: str = "default"
    ) -> BaselineTiming | None:
        """The newest timing of one torch SDPA backend on `problem` on this GPU model. Reads
        only (`latest_baselines` creates the device and problem rows it does not find)."""
        with self._reading() as s:
            query = (
                select(Baseline)
                .join(Device, Baseline.device_id == Device.id)
                .join(ProblemRow, Baseline.problem_id == ProblemRow.id)
                .where(*same_gpu(device), Baseline.backend == backend, *_is_problem(problem))
                .order_by(Baseline.id.desc())
            )
            for row in s.scalars(query):
                if _passes(check_baseline, row):
                    return BaselineTiming(
                        row.backend, row.median_us, row.p20_us, row.p80_us, _env_of(row)
                    )
            return None
