"""Public entry points of the tuning workflow: tune problems, query the best config."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..model.problem import Problem
from ..store.records import BestRecord, DeviceInfo
from ..store.repo import BrokenRow, TuningStore
from .backends import Backend, GpuBackend, ReplayBackend
from .search import Progress, SearchSettings, TuneOutcome, tune_problem

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BestAnswer:
    record: BestRecord
    match: str  # "exact" or "nearest"
    distance: float  # 0 for exact; see store.repo.problem_distance


def open_backend(
    replay: str | Path | Sequence[str | Path] | None = None, device: int = 0
) -> Backend:
    """The GPU backend, or a replay of recorded measurements (one recording per family)."""
    if not replay:
        return GpuBackend(device)
    paths = [replay] if isinstance(replay, (str, Path)) else list(replay)
    return ReplayBackend([Path(p) for p in paths])


def tune(
    problems: Problem | Sequence[Problem],
    *,
    db: str | None = None,
    backend: Backend | None = None,
    settings: SearchSettings | None = None,
    families: Sequence[str] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    on_outcome: Callable[[TuneOutcome], None] | None = None,
) -> list[TuneOutcome]:
    """Tune each problem on the backend's device (default: the GPU) into the database.

    `families`: the kernel families to search (default: every family the device runs); each
    gets `settings.trials` trials, and the fastest config of any of them is the best."""
    items = [problems] if isinstance(problems, Problem) else list(problems)
    store = TuningStore(db)
    owned = backend is None
    backend = backend or GpuBackend()
    try:
        outcomes = []
        for problem in items:
            outcome = tune_problem(
                problem,
                backend,
                store,
                settings or SearchSettings(),
                families=families,
                on_progress=on_progress,
            )
            outcomes.append(outcome)
            if on_outcome:
                on_outcome(outcome)
        return outcomes
    finally:
        if owned:
            backend.close()


def best_config(
    problem: Problem,
    *,
    db: str | None = None,
    device: DeviceInfo | str | None = None,
    nearest: bool = True,
) -> BestAnswer | None:
    """The stored best config for `problem`: an exact match, else the nearest tuned problem of
    the same dtype, head dim and causality (when `nearest`), else None. `device` narrows the
    search to one GPU (a DeviceInfo, or a device name such as "NVIDIA H200"). Reads only: a
    database that does not exist is a StoreError, not a new one. A stored best of exactly
    `problem` that is refused (BrokenRow) is logged and the nearest served, as dispatch does;
    with `nearest=False` the refusal is the answer."""
    store = TuningStore(db, create=False)
    try:
        exact = store.best(device, problem)
    except BrokenRow as exc:
        if not nearest:
            raise
        _log.warning("%s: the nearest tuned problem is served instead", exc)
        exact = None
    if exact is not None:
        return BestAnswer(exact, "exact", 0.0)
    if nearest:
        found = store.nearest(device, problem)
        if found is not None:
            return BestAnswer(found[0], "nearest", found[1])
    return None
