"""Recheck stored bests after an upgrade (a driver, CUDA, torch or cuDNN release): each stored
winner is re-timed beside its runners-up of the latest re-ranking and every torch SDPA backend,
together in one alternation (`search.rerank_finalists`, phase "recheck", the earlier
measurements kept), and the best is decided again only where the order moved beyond the noise:
the fastest now is another config and its p80 is below the stored winner's p20 in the new
timings. Anything closer keeps the stored best, so that a recheck never flips a winner on a
tie.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..measure.environment import Environment
from ..model.config import Config
from ..model.problem import Problem
from ..model.space import SDPA_FAMILY, load_space
from ..store.records import BestRecord, DeviceInfo, TrialResult
from ..store.repo import TuningStore
from .backends import Backend
from .search import SearchSettings, rerank_finalists, sdpa_configs, study_name

RUNNERS_UP_PER_FAMILY = 5
PHASE = "recheck"
KEPT_NOISE = "kept: within noise"
KEPT_FASTEST = "kept: still fastest"
KEPT_NOT_RUN = "kept: the stored winner did not run now (tune again)"
KEPT_NOTHING = "kept: nothing ran now"
REDECIDED = "re-decided"

_SOFTWARE = ("driver", "CUDA", "torch", "cuDNN")  # the order of Environment.software()


def version_changes(then: Environment | None, now: Environment | None) -> str:
    """What changed between two environments, e.g. "torch 2.11.0 -> 2.12.0; cuDNN 91900 ->
    92000"; "unchanged"; "unknown" when either side is not known (an imported best, a replayed
    recording). A version only one side names is not compared."""
    if then is None or now is None:
        return "unknown"
    known = [
        (label, a, b)
        for label, a, b in zip(_SOFTWARE, then.software(), now.software(), strict=True)
        if a and b
    ]
    if not known:
        return "unknown"
    changed = [f"{label} {a} -> {b}" for label, a, b in known if a != b]
    return "; ".join(changed) if changed else "unchanged"


@dataclass(frozen=True)
class RecheckRow:
    device: DeviceInfo
    problem: Problem
    stored: Config  # the stored winner before the recheck
    stored_then_us: float  # its stored median
    then: Environment | None  # what the stored winner was timed under
    now: Environment | None  # what the new timings ran under
    stored_now: TrialResult | None  # the stored winner re-timed now (None: it did not run)
    fastest_now: TrialResult | None  # the fastest config of the new timings
    verdict: str  # KEPT_* or REDECIDED
    finalists: int  # configs re-timed together

    @property
    def versions(self) -> str:
        return version_changes(self.then, self.now)

    @property
    def redecided(self) -> bool:
        return self.verdict == REDECIDED

    def as_dict(self) -> dict[str, Any]:
        def timing(t: TrialResult | None) -> dict[str, Any] | None:
            if t is None:
                return None
            return {
                "config": t.config.as_dict(),
                "name": _name(t.config),
                "median_us": t.median_us,
                "p20_us": t.p20_us,
                "p80_us": t.p80_us,
            }

        return {
            "device": self.device.as_dict(),
            "problem": self.problem.as_dict(),
            "stored": self.stored.as_dict(),
            "stored_name": _name(self.stored),
            "stored_then_us": self.stored_then_us,
            "then": self.then.as_dict() if self.then else None,
            "now": self.now.as_dict() if self.now else None,
            "versions": self.versions,
            "stored_now": timing(self.stored_now),
            "fastest_now": timing(self.fastest_now),
            "verdict": self.verdict,
            "finalists": self.finalists,
        }


def _name(config: Config) -> str:
    return load_space(config.family).name_of(config)


def runners_up(
    session: Sequence[TrialResult], winner: Config, per_family: int = RUNNERS_UP_PER_FAMILY
) -> list[Config]:
    """The kernel configs a re-ranking timed besides `winner` (those that ran), the fastest
    `per_family` of each family; SDPA's backends are left out (every recheck times them all)."""
    ranked = sorted(
        (t for t in session if t.ok and t.config.family != SDPA_FAMILY and t.config != winner),
        key=lambda t: t.median_us or 0.0,
    )
    kept: list[Config] = []
    count: dict[str, int] = {}
    for t in ranked:
        family = t.config.family
        if count.get(family, 0) < per_family and t.config not in kept:
            kept.append(t.config)
            count[family] = count.get(family, 0) + 1
    return kept


def _low(t: TrialResult) -> float:
    value = t.p20_us if t.p20_us is not None else t.median_us
    assert value is not None
    return value


def _high(t: TrialResult) -> float:
    value = t.p80_us if t.p80_us is not None else t.median_us
    assert value is not None
    return value


def recheck(
    store: TuningStore,
    backend: Backend,
    problems: Sequence[Problem] | None = None,
    settings: SearchSettings | None = None,
    *,
    on_row: Callable[[RecheckRow], None] | None = None,
) -> list[RecheckRow]:
    """Recheck every stored best of the backend's GPU model (of `problems` only, when given),
    in the database's order, each re-timed with `settings` (default: those of tune's
    re-ranking); `on_row` is told each row as it is done."""
    settings = settings or SearchSettings()
    device = backend.device()
    wanted = set(problems) if problems is not None else None
    rows = []
    for record in store.list_best(device):
        if wanted is not None and record.problem not in wanted:
            continue
        row = _recheck_one(store, backend, device, record, settings)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def _recheck_one(
    store: TuningStore,
    backend: Backend,
    device: DeviceInfo,
    record: BestRecord,
    settings: SearchSettings,
) -> RecheckRow:
    problem, stored = record.problem, record.config
    then = store.best_environment(device, problem)
    configs = [
        stored,
        *runners_up(store.latest_rerank(device, problem), stored),
        *sdpa_configs(problem),
    ]
    finalists = [(study_name(device, c.family, problem), c) for c in dict.fromkeys(configs)]
    final = rerank_finalists(
        problem,
        backend,
        store,
        settings,
        finalists,
        device,
        record.study,
        record.sdpa_default_us,
        trials=record.trials,
        phase=PHASE,
        write_best=False,
    )
    timed = {r.result.config.digest: r for r in final.reranked}
    mine = timed.get(stored.digest)
    fastest = min(final.reranked, key=lambda r: r.result.median_us or float("inf"), default=None)
    envs = [r.result.env for r in final.reranked if r.result.env is not None]
    now = (
        mine.result.env
        if mine is not None and mine.result.env is not None
        else (envs[0] if envs else None)
    )
    if fastest is None:
        verdict = KEPT_NOTHING
    elif mine is None:
        verdict = KEPT_NOT_RUN
    elif fastest.result.config == stored:
        verdict = KEPT_FASTEST
    elif _high(fastest.result) < _low(mine.result):
        verdict = REDECIDED
        new, old = fastest.result, mine.result
        default = final.baselines.get("default")
        flash = final.baselines.get("flash")
        store.set_best(
            device,
            problem,
            new,
            measurement_id=fastest.measurement_id,
            study=fastest.study,
            trials=record.trials,
            sdpa_default_us=default.median_us if default else record.sdpa_default_us,
            sdpa_flash_us=flash.median_us if flash else record.sdpa_flash_us,
            decision=(
                f"re-decided by recheck: {_name(new.config)} p80 {_high(new):.1f} us "
                f"below {_name(stored)} p20 {_low(old):.1f} us (p20-p80 ranges apart; "
                f"stored {record.median_us:.1f} us); versions: "
                f"{version_changes(then, now)}"
            ),
            runner_up_us=old.median_us,
        )
    else:
        verdict = KEPT_NOISE
    return RecheckRow(
        device,
        problem,
        stored,
        record.median_us,
        then,
        now,
        mine.result if mine else None,
        fastest.result if fastest else None,
        verdict,
        len(finalists),
    )
