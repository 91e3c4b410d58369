"""The regret of dispatch, from the database alone: for every stored best, what `attention()`
would run (`Dispatcher.would_run`: no GPU, nothing compiled), its measured time on that
problem, the fastest time measured there by any candidate (torch SDPA's backends included),
and their ratio. A regret of 1.0 means dispatch runs the fastest thing ever timed on the problem
on that GPU model; a tie decided for SDPA or for fewer resources shows as a regret a little
above 1, within the noise it was decided in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model.config import Config
from ..model.problem import Problem
from ..model.space import SDPA_FAMILY, load_space
from ..model.target import target_for_capability
from ..runtime.dispatch import FALLBACK, Dispatcher
from ..store.records import BestRecord, DeviceInfo, TrialResult
from ..store.repo import TuningStore
from ..store.schema import StoreError

NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class RegretRow:
    device: DeviceInfo
    problem: Problem
    path: str  # exact | nearest | heuristic | fallback (Decision.path)
    config: Config | None  # what dispatch runs (None: torch SDPA as the fallback)
    config_name: str
    dispatched_us: float | None  # None: that config was never timed on this problem here
    timed_from: str  # "measurement", "stored best" (a best row without measurements), or ""
    best_us: float | None  # the fastest time of any candidate on this problem here
    best_name: str
    sdpa_default_us: float | None
    reason: str = ""  # the decision's reason, and the options it passed over

    @property
    def measured(self) -> bool:
        return self.dispatched_us is not None

    @property
    def regret(self) -> float | None:
        """Dispatched time over the best time (1.0: dispatch runs the fastest)."""
        if self.dispatched_us is None or not self.best_us:
            return None
        return self.dispatched_us / self.best_us

    @property
    def speedup_vs_sdpa(self) -> float | None:
        if self.dispatched_us is None or not self.sdpa_default_us:
            return None
        return self.sdpa_default_us / self.dispatched_us

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device.as_dict(),
            "problem": self.problem.as_dict(),
            "path": self.path,
            "config": self.config.as_dict() if self.config else None,
            "config_name": self.config_name,
            "dispatched_us": self.dispatched_us,
            "timed_from": self.timed_from,
            "best_us": self.best_us,
            "best_name": self.best_name,
            "sdpa_default_us": self.sdpa_default_us,
            "regret": self.regret,
            "speedup_vs_sdpa_default": self.speedup_vs_sdpa,
            "measured": self.measured,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class RegretSummary:
    problems: int
    measured: int
    worst: float | None
    geomean: float | None

    def describe(self) -> str:
        if not self.measured:
            return f"{self.problems} problems, none with a measurement of what dispatch runs"
        assert self.worst is not None and self.geomean is not None
        return (
            f"{self.problems} problems, {self.measured} measured, worst regret "
            f"{self.worst:.3f}x, geomean regret {self.geomean:.3f}x"
        )


class _StoreDispatcher(Dispatcher):
    """A dispatcher that reads through a store it is given (one opened read-only, say) rather
    than opening its own, which would write to the database (SQLite's WAL files)."""

    def __init__(self, store: TuningStore) -> None:
        super().__init__(store.url, use_shipped=False)
        self._given = store

    def store(self) -> TuningStore:
        return self._given


def report_dispatcher(store: TuningStore) -> Dispatcher:
    """The dispatcher of a report: `store`'s database alone (the shipped results of db/ not
    imported), read through `store`."""
    return _StoreDispatcher(store)


def name_of(config: Config) -> str:
    return load_space(config.family).name_of(config)


def sdpa_default(problem: Problem) -> Config:
    """torch SDPA's own choice as a config: what the fallback path runs."""
    config = load_space(SDPA_FAMILY).heuristic(problem.space_values())
    assert config is not None, "the sdpa space has a default for every head dim"
    return config


def _model(device: DeviceInfo) -> tuple[str, int, int]:
    return (device.name, device.compute_capability, device.sm_count)


def regret_report(
    store: TuningStore, dispatcher: Dispatcher, device: str | None = None
) -> list[RegretRow]:
    """A row per stored best (of the GPUs named `device`, else of every GPU), grouped by GPU
    model in the order the database first names them, the worst regret first within each and
    the problems without a measurement of what dispatch runs last."""
    records = store.list_best(device)
    models: dict[tuple[str, int, int], list[BestRecord]] = {}
    for record in records:
        models.setdefault(_model(record.device), []).append(record)
    rows: list[RegretRow] = []
    for group in models.values():
        mine = [_row(store, dispatcher, record, group[0].device) for record in group]
        rows += sorted(
            mine, key=lambda r: (r.regret is None, -(r.regret or 0.0), r.problem.describe())
        )
    return rows


def _row(
    store: TuningStore, dispatcher: Dispatcher, record: BestRecord, device: DeviceInfo
) -> RegretRow:
    problem = record.problem
    decision = dispatcher.would_run(
        problem, device, target_for_capability(device.compute_capability)
    )
    unusable = [note for note in decision.skipped if note.startswith("tuning database")]
    if unusable:  # dispatch would run its built-in defaults: nothing to report
        raise StoreError(f"{store.url}: {unusable[0]}")
    runs = decision.config if decision.config is not None else sdpa_default(problem)
    timings = store.timings(device, problem)
    latest: dict[str, TrialResult] = {t.config.digest: t for t in timings}  # oldest first
    dispatched, timed_from = None, ""
    if runs.digest in latest:
        dispatched, timed_from = latest[runs.digest].median_us, "measurement"
    elif runs == record.config:
        dispatched, timed_from = record.median_us, "stored best"
    candidates = [(t.median_us, t.config) for t in timings if t.median_us is not None]
    candidates.append((record.median_us, record.config))
    best_us, best_config = min(candidates, key=lambda c: c[0])
    baseline = store.latest_baseline(device, problem, "default")
    reason = decision.reason + (
        f" (passed over: {'; '.join(decision.skipped)})" if decision.skipped else ""
    )
    return RegretRow(
        device,
        problem,
        decision.path,
        decision.config,
        "torch SDPA (fallback)" if decision.path == FALLBACK else name_of(runs),
        dispatched,
        timed_from,
        best_us,
        name_of(best_config),
        baseline.median_us if baseline else record.sdpa_default_us,
        reason,
    )


def summarize(rows: Sequence[RegretRow]) -> RegretSummary:
    regrets = [r.regret for r in rows if r.regret is not None]
    if not regrets:
        return RegretSummary(len(rows), 0, None, None)
    return RegretSummary(
        len(rows),
        len(regrets),
        max(regrets),
        math.exp(sum(math.log(x) for x in regrets) / len(regrets)),
    )


def by_device(rows: Sequence[RegretRow]) -> dict[tuple[str, int, int], list[RegretRow]]:
    groups: dict[tuple[str, int, int], list[RegretRow]] = {}
    for row in rows:
        groups.setdefault(_model(row.device), []).append(row)
    return groups


def plot_regret(rows: Sequence[RegretRow], path: Path) -> bool:
    """A bar per measured problem (its regret), one panel per GPU model, and a line at 1.0;
    False if matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = [
        (key, [r for r in group if r.regret is not None]) for key, group in by_device(rows).items()
    ]
    groups = [(key, group) for key, group in groups if group] or [(("no data", 0, 0), [])]
    widest = max(len(group) for _, group in groups)
    fig, axes = plt.subplots(
        len(groups), 1, squeeze=False, figsize=(max(8.0, 0.18 * widest + 3), 4.5 * len(groups))
    )
    for ax, ((name, cc, sm), group) in zip(axes[:, 0], groups, strict=True):
        colors = [
            "tab:orange" if r.config is not None and r.config.family == SDPA_FAMILY else "tab:blue"
            for r in group
        ]
        ax.bar(range(len(group)), [r.regret or 0.0 for r in group], color=colors)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(range(len(group)))
        ax.set_xticklabels(
            [r.problem.describe() for r in group], rotation=80, ha="right", fontsize=6
        )
        ax.set_ylabel("regret (dispatched / best measured)")
        summary = summarize(group)
        ax.set_title(
            f"{name} (sm_{cc}, {sm} SMs): {summary.describe()} (orange: torch SDPA)", fontsize=9
        )
        if group:
            top = max(r.regret or 1.0 for r in group)
            ax.set_ylim(0.95 if top < 1.2 else 0.0, top * 1.02 + 0.01)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
