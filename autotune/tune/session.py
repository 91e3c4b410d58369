"""A tuning session over many problems, as `cute-autotune tune` runs one: a long session run as
pieces (a family an earlier piece searched is not searched again, a piece stops starting new
problems after a time), and the problems `tune --misses` picks from what dispatch served."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..model.problem import Problem
from ..store.records import DeviceInfo
from ..store.repo import TuningStore
from .backends import Backend
from .search import Progress, SearchSettings, TuneOutcome, study_name
from .tuning import tune


@dataclass
class SessionResult:
    outcomes: list[TuneOutcome] = field(default_factory=list)
    skipped: list[Problem] = field(default_factory=list)  # not started: the time was up
    done_before: list[Problem] = field(default_factory=list)  # every family searched already


def families_left(
    store: TuningStore, backend: Backend, problem: Problem, families: Sequence[str]
) -> list[str]:
    """The families of `families` not yet searched for `problem` on the backend's GPU. A family
    searched by an earlier piece defends its place through its best config in the re-timing of
    the families still to search; one whose kernel changed since (another build key) is searched
    again."""
    device = backend.device()
    return [
        f
        for f in families
        if not store.family_tuned(
            device, problem, study_name(device, f, problem), current_key=backend.build_key
        )
    ]


def run_session(
    problems: Sequence[Problem],
    *,
    db: str | None,
    backend: Backend,
    settings: SearchSettings,
    families: Sequence[str],
    skip_tuned: bool = False,
    stop_after: float | None = None,
    on_start: Callable[[int, Problem], None] | None = None,
    on_end: Callable[[Problem], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    on_outcome: Callable[[TuneOutcome], None] | None = None,
) -> SessionResult:
    """Tune each problem in turn on `backend` into `db`. `skip_tuned`: search only the families
    no earlier session searched (a problem with none left is passed over); `stop_after`: start
    no problem once that many seconds have gone (those left are in `skipped`, for the next
    piece). `on_start(i, problem)` before a problem is tuned, `on_end(problem)` after each
    problem however it ended (tuned, passed over or not started)."""
    result = SessionResult()
    store = TuningStore(db) if skip_tuned else None
    start = time.monotonic()
    for i, problem in enumerate(problems):
        if stop_after is not None and time.monotonic() - start > stop_after:
            result.skipped.append(problem)
        else:
            todo = (
                list(families)
                if store is None
                else families_left(store, backend, problem, families)
            )
            if not todo:
                result.done_before.append(problem)
            else:
                if on_start:
                    on_start(i, problem)
                outcomes = tune(
                    problem,
                    db=db,
                    backend=backend,
                    settings=settings,
                    families=todo,
                    on_progress=on_progress,
                    on_outcome=on_outcome,
                )
                result.outcomes.extend(outcomes)
        if on_end:
            on_end(problem)
    return result


def frequent_misses(
    store: TuningStore,
    device: DeviceInfo,
    keep: Callable[[list[Problem]], list[Problem]] = list,
    top: int = 10,
) -> list[tuple[Problem, int]]:
    """The problems `attention()` served most often on `device`'s GPU model without an exact
    tuned entry (the calls of every path added up), with their call counts: the first `top` of
    those `keep` keeps, most calls first (the latest seen first on ties). A problem tuned since
    it was recorded is left out."""
    tuned = {r.problem for r in store.list_best(device)}
    calls: dict[Problem, int] = {}
    for m in store.list_misses(device):
        if m.problem not in tuned:
            calls[m.problem] = calls.get(m.problem, 0) + m.count
    ranked = sorted(calls, key=lambda p: -calls[p])  # stable: the latest seen first on ties
    return [(p, calls[p]) for p in keep(ranked)[:top]]
