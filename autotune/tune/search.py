"""The tuning loop of one problem: Optuna proposes, the space prunes, the backend compiles then
validates and times, the store records, and a final re-timing of the finalists picks the winner.

The kernel family is a search dimension: each family the GPU can run (its space file says which)
gets its own Optuna study and trial budget, since the families share no parameters; the final
re-timing puts the top configs of every family side by side, and the fastest of any family wins.

This is the one place where the pipeline is chained. Search strategy never compiles (the backend
does), statically invalid configs never reach the backend, and compiling never overlaps timing:
each batch is built first and timed after.

A study outlives the process that runs it. Each trial records the host and process running it
and the build it measured; a trial left RUNNING by a process that is gone is settled by the next
session (told the value that process already stored, else failed as "interrupted"); a config's
failure stands only for the build it failed with (a new toolchain or kernel tries it again); and
a failure of the machinery (a compile pool that keeps dying) is never held against a config.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from .._process import Owner, is_gone, this_process
from ..build.compiler import INFRASTRUCTURE, BuildResult
from ..build.compiler import INVALID as INVALID_CONFIG
from ..model.config import Config, InvalidConfig
from ..model.problem import Problem
from ..model.space import load_space, supported_families, unsupported_reason
from ..store.records import BaselineTiming, DeviceInfo, TrialResult
from ..store.repo import BrokenRow, TuningStore
from .backends import SDPA_FAMILY, Backend

SAMPLERS = ("tpe", "grid", "random")
# A trial's "status" (an Optuna user attribute) is the TrialResult status of what it evaluated,
# or one of these, which say nothing of the config and are neither counted as trials of the
# study nor held against the config.
INVALID, REPEAT, REUSED, INTERRUPTED = "invalid", "repeat", "reused", "interrupted"
NOT_COUNTED = (None, INVALID, REPEAT, INTERRUPTED, INFRASTRUCTURE)
# Consecutive infrastructure failures (in batches) after which a session stops: the machinery,
# not the configs, is broken.
INFRASTRUCTURE_BATCHES = 3


class InfrastructureError(RuntimeError):
    """Trials keep failing for reasons that are not the configs' (the compile pool dies)."""


@dataclass(frozen=True)
class SearchSettings:
    sampler: str = "tpe"
    seed: int = 0
    # Configs to evaluate per family searched: new ones, added to what the study already holds;
    # with `resume`, the study's budget: the trials of today's builds it already ran count.
    trials: int = 40
    resume: bool = False
    time_budget_s: float | None = None  # seconds of search per family
    batch_size: int = 4  # configs compiled together before the GPU times them
    rounds: int = 5
    round_ms: float = 20.0
    rerank_top: int = 5
    rerank_rounds: int = 11
    rerank_round_ms: float = 30.0
    reuse: bool = True  # serve configs already measured on this device and build from the store
    warm_start: int = 3  # best configs of the nearest tuned problems, tried first
    tpe_startup: int = 5  # random trials before TPE models the space
    local_search: bool = True  # half of each TPE batch: neighbours of the incumbent
    seed_heuristic: bool = True  # try the family's default config for the problem class first
    # torch SDPA's backends join the final re-ranking (the stored best may be SDPA itself);
    # off only to study the kernels' search alone.
    sdpa_finalists: bool = True

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.trials < 1 or self.batch_size < 1 or self.rerank_top < 1:
            raise ValueError("trials, batch_size and rerank_top must be >= 1")


@dataclass
class Progress:
    """Counters of the search of one family, handed to the progress callback after every
    trial."""

    problem: Problem
    family: str
    evaluated: int = 0
    failed: int = 0
    pruned: int = 0
    reused: int = 0
    best_us: float | None = None
    sdpa_default_us: float | None = None
    last: TrialResult | None = None

    def best_tflops(self) -> float | None:
        return self.problem.tflops(self.best_us) if self.best_us else None

    def speedup(self) -> float | None:
        if not self.best_us or not self.sdpa_default_us:
            return None
        return self.sdpa_default_us / self.best_us


@dataclass(frozen=True)
class FamilyOutcome:
    """What the search of one kernel family did for a problem, and its fastest finalist."""

    family: str
    study: str
    best: TrialResult | None  # this family's fastest config in the final re-timing
    evaluated: int
    failed: int
    pruned: int
    reused: int
    total_trials: int

    def tflops(self, problem: Problem) -> float | None:
        return self.best.tflops(problem) if self.best else None


@dataclass(frozen=True)
class TuneOutcome:
    """A problem's session: the overall winner (whatever its family) and, in `families`, each
    family's search. Counters are sums over the families searched."""

    problem: Problem
    device: DeviceInfo
    study: str  # the winner's study (the first family's when nothing passed)
    best: TrialResult | None
    baselines: dict[str, BaselineTiming]
    evaluated: int
    failed: int
    pruned: int
    reused: int
    total_trials: int
    finalists: list[TrialResult] = field(default_factory=list)
    families: tuple[FamilyOutcome, ...] = ()

    def family(self, name: str) -> FamilyOutcome | None:
        return next((f for f in self.families if f.family == name), None)

    def tflops(self) -> float | None:
        return self.best.tflops(self.problem) if self.best else None

    def speedup(self, backend: str = "default") -> float | None:
        base = self.baselines.get(backend)
        if not self.best or not self.best.median_us or not base:
            return None
        return base.median_us / self.best.median_us


def problem_key(problem: Problem) -> str:
    return (f"{problem.dtype}-d{problem.head_dim}-{'causal' if problem.causal else 'full'}"
            f"-b{problem.batch}-hq{problem.heads_q}-hkv{problem.heads_kv}"
            f"-lq{problem.seqlen_q}-lk{problem.seqlen_k}")


def study_name(device: DeviceInfo, family: str, problem: Problem) -> str:
    return f"{device.key}/{family}/{problem_key(problem)}"


def _sampler(settings: SearchSettings) -> Any:
    import optuna

    # "grid" is a random sampler behind a queue holding every valid config (see tune_problem):
    # Optuna's GridSampler enumerates the full product, invalid points included, and stops the
    # study from inside `tell`, which ask-and-tell use does not allow.
    if settings.sampler in ("grid", "random"):
        return optuna.samplers.RandomSampler(seed=settings.seed)
    # Configs of a batch are proposed before any of them is timed: the constant liar makes TPE
    # treat the pending ones as bad, so a batch spreads out instead of repeating one guess.
    # `group` models conditional structure within a family's space.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=settings.seed, multivariate=True, group=True,
                                          constant_liar=True,
                                          n_startup_trials=settings.tpe_startup)


def _neighbours(space: Any, target: Any, fixed: dict[str, Any],
                known: dict[str, float | None]) -> list[Config]:
    """Valid, untried configs one parameter away from good measured ones, best parents first.

    Parents are the three fastest configs and, for every value of every parameter, the fastest
    config having that value, so that each basin along each dimension gets refined, not only
    the incumbent's. A move to a value whose best measurement so far is more than 1.3x slower
    than the incumbent is not proposed (an unswizzled layout, say, stays explored once).
    """
    by_digest = {c.digest: c for c in space.valid_configs(target, fixed)}
    timed = {d: v for d, v in known.items() if v is not None and d in by_digest}
    if not timed:
        return []
    order = sorted(timed, key=lambda d: timed[d])
    incumbent = timed[order[0]]
    best_with: dict[tuple[str, Any], str] = {}
    for digest in order:
        for name, value in by_digest[digest].values:
            best_with.setdefault((name, value), digest)
    parents = list(dict.fromkeys(order[:3] + sorted(set(best_with.values()),
                                                    key=lambda d: timed[d])))
    found: dict[str, Config] = {}
    for digest in parents:
        parent = by_digest[digest]
        for param in space.tunable_params:
            for value in param.values:
                if value == parent[param.name]:
                    continue
                seen = best_with.get((param.name, value))
                if seen is not None and timed[seen] > 1.3 * incumbent:
                    continue
                candidate = parent.replace(**{param.name: value})
                if candidate.digest not in known and candidate.digest in by_digest:
                    found.setdefault(candidate.digest, candidate)
    return list(found.values())


@dataclass(frozen=True)
class _FamilySearch:
    family: str
    study: str
    top: list[Config]  # the fastest distinct configs of the study, for the final re-timing
    evaluated: int
    failed: int
    pruned: int
    reused: int
    total_trials: int


@dataclass(frozen=True)
class _Reranked:
    result: TrialResult
    measurement_id: int
    study: str


def families_to_search(backend: Backend, families: Sequence[str] | None = None) -> list[str]:
    """The kernel families a session searches: those asked for (each must run on the backend's
    target), else every family the backend can run there."""
    target = backend.target()
    if families is None:
        chosen = backend.families()
        if not chosen:
            supported = supported_families(target)
            raise ValueError(f"no kernel family to search on {target.name}: "
                             + (f"the backend offers none of {', '.join(supported)}" if supported
                                else unsupported_reason(target)))
        return chosen
    chosen = list(dict.fromkeys(families))
    if not chosen:
        raise ValueError("no kernel family to search")
    for family in chosen:
        space = load_space(family)  # an unknown family is refused here, with the known ones
        if not space.supports(target.cc):
            raise ValueError(f"family {family} runs on {space.cc_range()}; {target.name} is "
                             f"{target.arch}")
    return chosen


def tune_problem(problem: Problem, backend: Backend, store: TuningStore,
                 settings: SearchSettings = SearchSettings(), *,
                 families: Sequence[str] | None = None,
                 on_progress: Callable[[Progress], None] | None = None) -> TuneOutcome:
    """Search each family (default: every family the backend runs on its GPU) in its own study,
    `settings.trials` new configs each, then re-time the top configs of all of them together;
    the fastest, whatever its family, becomes the best config of (device, problem)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chosen = families_to_search(backend, families)
    device = backend.device()
    studies = {family: study_name(device, family, problem) for family in chosen}

    # SDPA is timed again in every session (a second or two), for the search trials' records;
    # the speed-up stored with the best config comes from SDPA timed in the re-timing's own
    # interleaved rounds where the backend can (GPU), never from another run.
    searched = any(load_space(f).compiled for f in chosen)
    measured = backend.baselines(problem) if searched else []
    store.record_baselines(device, problem, studies[chosen[0]], measured)
    baselines = {b.backend: b for b in measured}
    sdpa_default = _median_us(baselines, "default")

    # torch SDPA is not searched (a handful of backends): each backend is a finalist of every
    # re-ranking. Asked for alone (`--family sdpa`), the session only re-ranks them.
    searches = [_search_family(problem, family, studies[family], backend, store, settings,
                               sdpa_default, on_progress)
                for family in chosen if load_space(family).compiled]
    finalists = [(search.study, config) for search in searches for config in search.top]
    # A best config of a family not searched now (tuned earlier) defends its place in the same
    # re-timing, so that tuning one family again cannot replace a faster kernel of another.
    defender_trials = 0
    try:
        stored = store.best(device, problem)
    except BrokenRow:
        stored = None
    if stored is not None and stored.config.family not in chosen \
            and stored.config.family in backend.families():
        defender = study_name(device, stored.config.family, problem)
        finalists.append((defender, stored.config))
        defender_trials = _counted_trials(store, defender)

    if settings.sdpa_finalists or not searches:
        finalists += [(study_name(device, SDPA_FAMILY, problem), c)
                      for c in sdpa_configs(problem)]
    total = sum(search.total_trials for search in searches) + defender_trials
    final = rerank_finalists(problem, backend, store, settings, finalists, device,
                             studies[chosen[0]], sdpa_default, trials=total)
    reranked, winner = final.reranked, final.winner
    if final.baselines:
        baselines = final.baselines
    outcomes = []
    for search in searches:
        mine = [r.result for r in reranked if r.result.config.family == search.family]
        outcomes.append(FamilyOutcome(
            search.family, search.study,
            min(mine, key=lambda r: r.median_us or math.inf) if mine else None,
            search.evaluated, search.failed, search.pruned, search.reused, search.total_trials))
    return TuneOutcome(problem, device, winner.study if winner else studies[chosen[0]],
                       winner.result if winner else None, baselines,
                       sum(o.evaluated for o in outcomes), sum(o.failed for o in outcomes),
                       sum(o.pruned for o in outcomes), sum(o.reused for o in outcomes), total,
                       [r.result for r in reranked], tuple(outcomes))


def _counted_trials(store: TuningStore, name: str) -> int:
    """Trials of a study that evaluated a config (see NOT_COUNTED)."""
    import optuna

    try:
        study = optuna.load_study(study_name=name, storage=store.url)
    except KeyError:  # a best config imported from another database has no study here
        return 0
    return _counted(study.get_trials(deepcopy=False))


def _counted(trials: Sequence[Any]) -> int:
    return len([t for t in trials if t.user_attrs.get("status") not in NOT_COUNTED])


def _of_current_build(trial: Any, backend: Backend) -> bool:
    """Whether a trial measured the build that the backend makes of its config today."""
    raw, key = trial.user_attrs.get("config"), trial.user_attrs.get("build_key")
    if not raw or not key:
        return False
    try:
        return bool(backend.build_key(Config.from_json(raw)) == key)
    except (InvalidConfig, ValueError):
        return False


def _enqueue(study: Any, space: Any, configs: Sequence[Config]) -> None:
    """Queue configs to be asked next, each once: one already queued (WAITING) is not queued
    again. (Optuna's skip_if_exists would also skip a config tried before, whose failure under
    an older build, or of the machinery, the caller wants tried again.)"""
    from optuna.trial import TrialState

    tunable = [p.name for p in space.tunable_params]
    queued = {json.dumps(t.system_attrs.get("fixed_params", t.params), sort_keys=True)
              for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
    for config in configs:
        params = {name: config[name] for name in tunable}
        key = json.dumps(params, sort_keys=True)
        if key not in queued:
            queued.add(key)
            study.enqueue_trial(params)


def _settle_abandoned(study: Any, store: TuningStore, device: DeviceInfo, problem: Problem,
                      backend: Backend) -> None:
    """Settle the RUNNING trials of processes that are gone (same host, dead pid): told the
    value their process already stored in the database, else failed as "interrupted" with
    the reason. A trial of a live process, or of another host, is never touched."""
    import optuna
    from optuna.trial import TrialState

    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = Owner.from_json(frozen.user_attrs.get("owner"))
        if owner is None or not is_gone(owner):
            continue
        # Optuna sets a trial's attributes only through a Trial object; this is its
        # constructor on an existing trial's id (frozen trials expose it privately).
        trial = optuna.trial.Trial(study, frozen._trial_id)
        raw = frozen.user_attrs.get("config")
        measured = None
        if raw and frozen.user_attrs.get("build_key"):
            measured = store.find_trial(device, problem, Config.from_json(raw),
                                        frozen.user_attrs["build_key"])
        value = measured.median_us if measured is not None else None
        if value is not None:
            trial.set_user_attr("status", "ok")
            trial.set_user_attr("reason", f"measured by {owner.describe()}, which died before "
                                "telling the study; told by a later session")
            study.tell(frozen.number, value)
        else:
            trial.set_user_attr("status", INTERRUPTED)
            trial.set_user_attr("reason", f"{owner.describe()} died before this trial "
                                "finished")
            study.tell(frozen.number, state=TrialState.FAIL)


def _search_family(problem: Problem, family: str, name: str, backend: Backend,
                   store: TuningStore, settings: SearchSettings, sdpa_default: float | None,
                   on_progress: Callable[[Progress], None] | None) -> _FamilySearch:
    """One family's study: Optuna proposes, the space prunes, the backend builds then times."""
    import optuna
    from optuna.distributions import BaseDistribution, CategoricalDistribution
    from optuna.trial import TrialState

    space = load_space(family)
    device, target = backend.device(), backend.target()
    study = optuna.create_study(study_name=name, storage=store.url, direction="minimize",
                                sampler=_sampler(settings), load_if_exists=True)
    _settle_abandoned(study, store, device, problem, backend)
    distributions: dict[str, BaseDistribution] = {
        p.name: CategoricalDistribution(list(p.values)) for p in space.tunable_params}
    fixed = problem.space_values()
    valid = {c.digest for c in space.valid_configs(target, fixed)}
    progress = Progress(problem, family)
    progress.sdpa_default_us = sdpa_default

    # What this study already knows, by config digest: value (median us) or None for a failure
    # of the build made today (a failure under another toolchain or kernel is tried again).
    known: dict[str, float | None] = {}
    ran_today = 0  # trials of today's builds that evaluated a config: the budget a resume keeps
    for t in study.get_trials(deepcopy=False):
        digest, status = t.user_attrs.get("digest"), t.user_attrs.get("status")
        today = _of_current_build(t, backend)
        ran_today += today and status not in (*NOT_COUNTED, REUSED)
        if digest and t.state == TrialState.COMPLETE:
            known[digest] = t.value
            if t.value is not None and (progress.best_us is None or t.value < progress.best_us):
                progress.best_us = t.value
        elif digest and t.state == TrialState.FAIL and status not in NOT_COUNTED and today:
            known.setdefault(digest, None)
    budget = max(0, settings.trials - ran_today) if settings.resume else settings.trials

    if settings.sampler == "grid":
        _enqueue(study, space, [c for c in space.valid_configs(target, fixed)
                                if c.digest not in known])
    elif settings.warm_start or settings.seed_heuristic:
        near = store.nearest(device, problem, family=family) if settings.warm_start else None
        seeds = [near[0].config] if near else []
        default = space.heuristic(fixed) if settings.seed_heuristic else None
        if default is not None and space.is_valid(default, target):
            seeds.append(default)
        for record in store.list_best(device) if settings.warm_start else []:
            if len(seeds) >= settings.warm_start + int(default is not None):
                break
            if record.config.family == family and record.problem != problem and all(
                    record.config[k] == v for k, v in fixed.items()):
                seeds.append(record.config)
        _enqueue(study, space, [c for c in dict.fromkeys(seeds) if c.digest not in known])

    start = time.monotonic()

    def out_of_time() -> bool:
        return (settings.time_budget_s is not None
                and time.monotonic() - start > settings.time_budget_s)

    stale_asks = 0
    infrastructure = 0  # consecutive trials lost to the machinery
    while progress.evaluated < budget and not out_of_time():
        if len({d for d in known if d in valid}) >= len(valid):
            break  # every valid config has been measured (or failed): nothing left to learn
        pending: list[tuple[Any, Config]] = []
        want = min(settings.batch_size, budget - progress.evaluated)
        if settings.local_search and settings.sampler == "tpe":
            # Half of each batch refines the incumbent: its untried one-parameter neighbours go
            # first. TPE models the whole space well but finds the last few percent slowly; the
            # best config is usually one step from a good one (a stage count, a tile edge).
            _enqueue(study, space, _neighbours(space, target, fixed, known)[: max(1, want // 2)])
        while len(pending) < want and stale_asks < 200:
            trial = study.ask(distributions)
            trial.set_user_attr("owner", this_process().as_json())
            config = space.config(**fixed, **trial.params)
            trial.set_user_attr("digest", config.digest)
            trial.set_user_attr("config", config.to_json())
            reasons = space.violations(config, target)
            if reasons:  # pruned statically: costs no compile and no GPU time
                trial.set_user_attr("status", INVALID)
                trial.set_user_attr("reason", "; ".join(reasons))
                study.tell(trial, state=TrialState.PRUNED)
                progress.pruned += 1
                stale_asks += 1
                continue
            if config.digest in known or any(c.digest == config.digest for _, c in pending):
                value = known.get(config.digest)
                trial.set_user_attr("status", REPEAT)
                if value is None:
                    trial.set_user_attr("reason", "an earlier trial of this config failed")
                    study.tell(trial, state=TrialState.FAIL)
                else:
                    study.tell(trial, value)
                stale_asks += 1
                continue
            if settings.reuse:
                previous = store.find_trial(device, problem, config, backend.build_key(config))
                if previous is not None and previous.median_us is not None:
                    trial.set_user_attr("status", REUSED)
                    study.tell(trial, previous.median_us)
                    known[config.digest] = previous.median_us
                    progress.reused += 1
                    if progress.best_us is None or previous.median_us < progress.best_us:
                        progress.best_us = previous.median_us
                    continue
            stale_asks = 0
            pending.append((trial, config))
        if not pending:
            if stale_asks >= 200:
                break  # the sampler keeps proposing what is known or invalid
            continue

        with _settled_on_exit(study, [trial for trial, _ in pending]) as told:
            builds = backend.build([config for _, config in pending])  # compile phase
            for (trial, config), build in zip(pending, builds, strict=True):  # timing phase
                result = backend.evaluate(problem, build, rounds=settings.rounds,
                                          round_ms=settings.round_ms)
                if result.status == INFRASTRUCTURE:  # the machinery's failure, not the config's
                    trial.set_user_attr("status", INFRASTRUCTURE)
                    trial.set_user_attr("reason", result.reason[:2000])
                    study.tell(trial, state=TrialState.FAIL)
                    told.add(trial.number)
                    infrastructure += 1
                    if infrastructure >= INFRASTRUCTURE_BATCHES * settings.batch_size:
                        raise InfrastructureError(
                            f"{infrastructure} trials in a row could not be built or run, for "
                            f"reasons that are not the configs': {result.reason}")
                    continue
                infrastructure = 0
                _record(study, trial, config, result, build, store, device, problem, name,
                        sdpa_default, known, progress)
                told.add(trial.number)
                if on_progress:
                    on_progress(progress)

    ranked: dict[str, tuple[float, Config]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        digest, raw = t.user_attrs.get("digest"), t.user_attrs.get("config")
        if digest and raw and t.value is not None:
            if digest not in ranked or t.value < ranked[digest][0]:
                ranked[digest] = (t.value, Config.from_json(raw))
    top = [config for _, config in sorted(ranked.values(), key=lambda vc: vc[0])]
    total = _counted(study.get_trials(deepcopy=False))
    return _FamilySearch(family, name, top[: settings.rerank_top], progress.evaluated,
                         progress.failed, progress.pruned, progress.reused, total)


def _record(study: Any, trial: Any, config: Config, result: TrialResult, build: BuildResult,
            store: TuningStore, device: DeviceInfo, problem: Problem, name: str,
            sdpa_default: float | None, known: dict[str, float | None],
            progress: Progress) -> None:
    """Store one evaluated trial's measurement, then tell the study (in that order: a session
    killed in between leaves a RUNNING trial whose value the next session finds)."""
    from optuna.trial import TrialState

    trial.set_user_attr("build_key", build.key)
    store.record_trial(device, problem, result, build=build, study=name, phase="search",
                       baseline_us=result.baseline_us or sdpa_default)
    trial.set_user_attr("status", result.status)
    if result.ok and result.median_us is not None:
        study.tell(trial, result.median_us)
        known[config.digest] = result.median_us
        if progress.best_us is None or result.median_us < progress.best_us:
            progress.best_us = result.median_us
    else:
        trial.set_user_attr("reason", result.reason[:2000])
        study.tell(trial, state=TrialState.FAIL)
        known[config.digest] = None
        progress.failed += 1
    progress.evaluated += 1
    progress.last = result


@contextmanager
def _settled_on_exit(study: Any, trials: list[Any]) -> Iterator[set[int]]:
    """Yield the set of trial numbers told so far; if the block ends with an exception (an
    interrupt, an infrastructure error), the trials not told are failed as "interrupted"
    rather than left RUNNING."""
    from optuna.trial import TrialState

    told: set[int] = set()
    try:
        yield told
    except BaseException as exc:
        for trial in trials:
            if trial.number not in told:
                trial.set_user_attr("status", INTERRUPTED)
                trial.set_user_attr("reason", f"the session stopped: {type(exc).__name__}")
                study.tell(trial, state=TrialState.FAIL)
        raise


def sdpa_configs(problem: Problem) -> list[Config]:
    """torch SDPA's backends as configs of the `sdpa` family for this problem's class: every
    re-ranking times each one that accepts the problem beside the kernels' finalists."""
    space = load_space(SDPA_FAMILY)
    fixed = problem.space_values()
    return [space.config(**fixed, backend=str(b)) for b in space.params["backend"].values]


@dataclass(frozen=True)
class Final:
    """A re-ranking's outcome: every finalist timed (those that ran), SDPA's timings by
    backend from the same alternation, the winner and how it was chosen."""

    reranked: list[_Reranked]
    baselines: dict[str, BaselineTiming]
    winner: _Reranked | None
    decision: str
    runner_up: TrialResult | None


def _resources(build: BuildResult | None) -> tuple[int, int] | None:
    if build is None or build.ptxas is None:
        return None
    smem = build.launch_info.smem_bytes if build.launch_info else 0
    return build.ptxas.registers, smem


def _label(config: Config) -> str:
    return load_space(config.family).name_of(config)


def choose_winner(reranked: Sequence[_Reranked],
                  builds: dict[str, BuildResult] | None = None
                  ) -> tuple[_Reranked | None, str, TrialResult | None]:
    """The fastest finalist, unless its p20-p80 range overlaps the runner-up's: then torch
    SDPA if it is one of the two, else the one with fewer registers and less shared memory
    (neither using fewer: the faster median). Returns (winner, decision, the other one)."""
    ordered = sorted(reranked, key=lambda r: r.result.median_us or math.inf)
    if not ordered:
        return None, "no finalist ran", None
    first = ordered[0]
    if len(ordered) == 1:
        return first, "the only finalist that ran", None
    second = ordered[1]
    a, b = first.result, second.result
    assert a.median_us is not None and b.median_us is not None
    gap = 100 * (b.median_us / a.median_us - 1)
    if not ((a.p20_us or a.median_us) <= (b.p80_us or b.median_us)
            and (b.p20_us or b.median_us) <= (a.p80_us or a.median_us)):
        return first, f"fastest: {gap:.1f}% ahead of {_label(b.config)}, p20-p80 ranges " \
                      "apart", b
    def tie(chosen: _Reranked, rule: str) -> str:
        other = second if chosen is first else first
        return (f"tie with {_label(other.result.config)} ({gap:.1f}% apart, p20-p80 ranges "
                f"overlap): {rule}")

    sdpa = [r for r in (first, second) if r.result.config.family == SDPA_FAMILY]
    if sdpa:
        chosen = sdpa[0]
        other = second if chosen is first else first
        return chosen, tie(chosen, "torch SDPA preferred"), other.result
    builds = builds or {}
    ra, rb = (_resources(builds.get(r.result.config.digest)) for r in (first, second))
    if ra is not None and rb is not None and rb != ra and rb[0] <= ra[0] and rb[1] <= ra[1]:
        return second, tie(second, f"fewer registers and less shared memory ({rb[0]} regs, "
                                   f"{rb[1]} B against {ra[0]}, {ra[1]})"), a
    if ra is not None and rb is not None and ra != rb and ra[0] <= rb[0] and ra[1] <= rb[1]:
        return first, tie(first, f"fewer registers and less shared memory ({ra[0]} regs, "
                                 f"{ra[1]} B against {rb[0]}, {rb[1]})"), b
    return first, tie(first, "neither uses fewer resources, the faster median kept"), b


def rerank_finalists(problem: Problem, backend: Backend, store: TuningStore,
                     settings: SearchSettings, finalists: list[tuple[str, Config]],
                     device: DeviceInfo, baseline_study: str, sdpa_default: float | None, *,
                     trials: int, phase: str = "rerank", write_best: bool = True) -> Final:
    """Re-time the finalists of every family, torch SDPA's backends among them, together in
    one alternation (autotune.measure.timing); record each measurement under its family's study,
    choose the winner (`choose_winner`) and, with `write_best`, store it as the best config
    of (device, problem) with the speed-up over SDPA from the same alternation."""
    if not finalists:
        return Final([], {}, None, "no finalist", None)
    study_of = {config.digest: study for study, config in finalists}
    unique = list(dict.fromkeys(c for _, c in finalists))
    builds: list[BuildResult] = [b for b in backend.build(unique) if b.ok]
    reranking = backend.rerank(problem, builds, rounds=settings.rerank_rounds,
                               round_ms=settings.rerank_round_ms)
    beside = {b.backend: b for b in reranking.baselines}
    if beside:
        store.record_baselines(device, problem, baseline_study, reranking.baselines)
        sdpa_default = _median_us(beside, "default") or sdpa_default
    final = []
    for build, result in zip(builds, reranking.results, strict=True):
        if result.status == INVALID_CONFIG and build.config.family == SDPA_FAMILY:
            continue  # a backend that refuses the problem is not a finalist
        study = study_of[build.config.digest]
        measurement_id = store.record_trial(device, problem, result, build=build, study=study,
                                            phase=phase, baseline_us=sdpa_default)
        if result.ok:
            final.append(_Reranked(result, measurement_id, study))
    winner, decision, runner_up = choose_winner(final, {b.config.digest: b for b in builds})
    if winner is not None and write_best:
        store.set_best(device, problem, winner.result, measurement_id=winner.measurement_id,
                       study=winner.study, trials=trials, sdpa_default_us=sdpa_default,
                       sdpa_flash_us=_median_us(beside, "flash"), decision=decision,
                       runner_up_us=runner_up.median_us if runner_up else None)
    return Final(final, beside, winner, decision, runner_up)


def _median_us(baselines: dict[str, BaselineTiming], backend: str) -> float | None:
    timing = baselines.get(backend)
    return timing.median_us if timing else None
