"""The search loop of one kernel family for one problem: the strategy proposes, the space prunes
what is invalid or known, the backend builds a batch then evaluates each config of it, the store
records every measurement, and the strategy is told every outcome.

This is the one place where search meets compiling and timing: strategies (tune/strategies.py)
only propose and learn, the backend only builds and times, and compiling never overlaps timing
(each batch is built first and timed after).

A study outlives the process that runs it. Each trial records the process running it and the
build it measured; a trial left RUNNING by a process that is gone is settled by the next session
(tune/study.py); a config's failure stands only for the build it failed with (a new toolchain or
kernel tries it again); and a failure of the machinery (a compile pool that keeps dying) is
never held against a config.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from ..model.config import Config, Value
from ..model.perf_model import Prediction
from ..model.problem import Problem
from ..model.space import Space, ValidConfig, load_space
from ..model.status import Status
from ..model.target import Target
from ..store.records import DeviceInfo, TrialResult
from ..store.repo import TuningStore
from ..store.schema import lost_connection
from .backends import Backend
from .counts import Counted, SearchCounts
from .settings import SearchSettings
from .strategies import Strategy, sampler_for, strategy_for
from .study import Outcome, Proposal, Study

# Consecutive infrastructure failures (in batches) after which a session stops: the machinery,
# not the configs, is broken.
INFRASTRUCTURE_BATCHES = 3
# Proposals in a row that were invalid or already known, after which the strategy is taken to
# have nothing new to offer.
STALE_ASKS = 200
# Repeats in a row after which a config of a build not yet measured, at random, goes on the
# study's queue. TPE can settle on the incumbent's build and propose only its launch values,
# all of them timed: a decode90 search can make a few builds, then nothing but repeats until
# STALE_ASKS ends it with most of the space untried.
# 10 is more than one build's launch values (decode's 7 split counts, all timed by the sweep):
# a sampler that only revisits the incumbent's build gets a new build every 10 proposals. The
# pick is seeded by the search's seed (`fresh_picks`), so a replayed session is reproducible;
# it goes through the loop like any proposal, so it counts against the budget.
REPEATS_BEFORE_FRESH = 10


class InfrastructureError(RuntimeError):
    """Trials keep failing for reasons that are not the configs' (the compile pool dies)."""


@dataclass
class Progress(Counted):
    """Counters of the search of one family, handed to the progress callback after every
    trial."""

    problem: Problem
    family: str
    counts: SearchCounts = field(default_factory=SearchCounts)
    best_us: float | None = None
    sdpa_default_us: float | None = None
    last: TrialResult | None = None

    def best_tflops(self) -> float | None:
        return self.problem.tflops(self.best_us) if self.best_us else None

    def speedup(self) -> float | None:
        if not self.best_us or not self.sdpa_default_us:
            return None
        return self.sdpa_default_us / self.best_us

    def found(self, value: float) -> None:
        if self.best_us is None or value < self.best_us:
            self.best_us = value


@dataclass(frozen=True)
class FamilySearch(Counted):
    """What the search of one family left for the final re-timing, and its counters."""

    family: str
    study: str
    top: list[Config]  # the fastest distinct configs of the study, fastest first
    counts: SearchCounts


def warm_start_seeds(
    store: TuningStore,
    device: DeviceInfo,
    problem: Problem,
    space: Space,
    target: Target,
    settings: SearchSettings,
) -> list[Config]:
    """Configs to try first: the best config of the nearest tuned problem, the family's default
    for the problem class, then best configs of other problems of the class."""
    fixed = space.problem_values(problem)
    near = store.nearest(device, problem, family=space.family) if settings.warm_start else None
    seeds = [near[0].config] if near else []
    default = space.heuristic(fixed) if settings.seed_heuristic else None
    if default is not None and space.is_valid(default, target):
        seeds.append(default)
    for record in store.list_best(device) if settings.warm_start else []:
        if len(seeds) >= settings.warm_start + int(default is not None):
            break
        if (
            record.config.family == space.family
            and record.problem != problem
            and all(record.config[k] == v for k, v in fixed.items())
        ):
            seeds.append(record.config)
    return seeds


def search_family(
    problem: Problem,
    family: str,
    name: str,
    backend: Backend,
    store: TuningStore,
    settings: SearchSettings,
    sdpa_default: float | None,
    on_progress: Callable[[Progress], None] | None,
    ranked: Sequence[tuple[Config, Prediction]] = (),
) -> FamilySearch:
    """One family's study (`name`): `settings.trials` configs evaluated (with `resume`, up to
    that many of today's builds in the study), fewer when the time budget runs out, the space
    is exhausted or the strategy has nothing new to propose. With `settings.sweep_launch`, a
    family with launch parameters has every launch value of each config it builds timed right
    after it, on the same build: `trials` then counts builds. `ranked`: the model sampler's
    configs of this family with their predicted times (tune/model_seeding.py)."""
    space = load_space(family)
    device, target = backend.device(), backend.target()
    fixed: dict[str, Value] = space.problem_values(problem)
    swept = [p.name for p in space.launch_params] if settings.sweep_launch else []
    study = Study(name, store.url, sampler_for(settings, swept), space, fixed)
    study.settle_abandoned(store, device, problem)
    by_digest = {c.digest: c for c in space.valid_configs(target, fixed)}
    valid = set(by_digest)
    sweep = settings.sweep_launch and settings.sampler != "grid" and bool(space.launch_params)
    progress = Progress(problem, family, sdpa_default_us=sdpa_default)

    knowledge = study.knowledge(backend.build_key)
    known = dict(knowledge.known)
    progress.best_us = knowledge.best_us
    ran = knowledge.builds_today if sweep else knowledge.ran_today
    budget = max(0, settings.trials - ran) if settings.resume else settings.trials
    seeds = (
        warm_start_seeds(store, device, problem, space, target, settings)
        if settings.sampler != "grid" and (settings.warm_start or settings.seed_heuristic)
        else []
    )
    strategy = strategy_for(
        settings,
        study,
        target,
        known,
        seeds,
        settle=lambda: study.settle_abandoned(store, device, problem),
        ranked=ranked,
    )

    def tell(proposal: Proposal, outcome: Outcome) -> None:
        strategy.tell(proposal, outcome)
        if outcome.measured:
            known[proposal.config.digest] = outcome.value
            if outcome.value is not None:
                progress.found(outcome.value)

    start = time.monotonic()

    def out_of_time() -> bool:
        return (
            settings.time_budget_s is not None
            and time.monotonic() - start > settings.time_budget_s
        )

    stale_asks = 0
    repeats = 0  # repeats in a row (REPEATS_BEFORE_FRESH)
    fresh_picks = random.Random(settings.seed)
    infrastructure = 0  # consecutive trials lost to the machinery

    def counted() -> int:  # what `budget` counts: configs, or builds when launch values sweep
        return progress.evaluated - progress.swept

    def report(result: TrialResult) -> None:
        progress.counts.failed += not result.ok
        progress.counts.evaluated += 1
        progress.last = result
        if on_progress:
            on_progress(progress)

    def sweep_launch_values(parent: Config, pending: list[Proposal]) -> None:
        """Time `parent`'s other launch values on its build (a cache hit: no compile),
        recording each as its own measurement and trial."""
        queued = {p.config.digest for p in pending}
        for sibling in _launch_siblings(space, parent, by_digest):
            if sibling.digest in known or sibling.digest in queued or out_of_time():
                continue
            [build] = backend.build([sibling])
            result = backend.evaluate(
                problem, build, rounds=settings.rounds, round_ms=settings.round_ms
            )
            if result.status == Status.INFRASTRUCTURE:
                continue  # the machinery's: the sibling is left for a later session
            store.record_trial(
                device,
                problem,
                result,
                build=build,
                study=name,
                phase="search",
                baseline_us=result.baseline_us or sdpa_default,
            )
            value = result.median_us if result.ok else None
            study.record(
                sibling, Outcome(Status(result.status), value, result.reason[:2000]), build.key
            )
            known[sibling.digest] = value
            if value is not None:
                progress.found(value)
            progress.counts.swept += 1
            report(result)

    while counted() < budget and not out_of_time():
        if len({d for d in known if d in valid}) >= len(valid):
            break  # every valid config has been measured (or failed): nothing left to learn
        want = min(settings.batch_size, budget - counted())
        strategy.begin_batch(want)
        pending: list[Proposal] = []
        exhausted = False
        while len(pending) < want and stale_asks < STALE_ASKS:
            proposal = strategy.propose()
            if proposal is None:
                exhausted = True
                break
            config = proposal.config
            reasons = space.violations(config, target)
            if reasons:  # pruned statically: costs no compile and no GPU time
                tell(proposal, Outcome(Status.INVALID, reason="; ".join(reasons), pruned=True))
                progress.counts.pruned += 1
                stale_asks += 1
                continue
            if config.digest in known or any(p.config.digest == config.digest for p in pending):
                value = known.get(config.digest)
                tell(
                    proposal,
                    Outcome(
                        Status.REPEAT,
                        value,
                        "" if value is not None else "an earlier trial of this config failed",
                    ),
                )
                progress.counts.repeated += 1
                stale_asks += 1
                repeats += 1
                # Not past STALE_ASKS (the loop ends there: a pick would be left queued), and
                # not for grid, which walks its own queue of every valid config.
                if (
                    repeats % REPEATS_BEFORE_FRESH == 0
                    and stale_asks < STALE_ASKS
                    and settings.sampler != "grid"
                ):
                    fresh = _unmeasured(space, by_digest, known, pending)
                    if fresh:
                        study.enqueue([fresh_picks.choice(fresh)])
                continue
            if settings.reuse:
                previous = store.find_trial(device, problem, config, backend.build_key(config))
                if previous is not None and previous.median_us is not None:
                    tell(proposal, Outcome(Status.REUSED, previous.median_us))
                    progress.counts.reused += 1
                    continue
            stale_asks = repeats = 0
            pending.append(proposal)
        if not pending:
            if exhausted or stale_asks >= STALE_ASKS:
                break  # the strategy has nothing new: all it proposes is known or invalid
            continue

        with _settled_on_exit(strategy, pending) as told:
            builds = backend.build([p.config for p in pending])  # compile phase
            for proposal, build in zip(pending, builds, strict=True):  # timing phase
                result = backend.evaluate(
                    problem, build, rounds=settings.rounds, round_ms=settings.round_ms
                )
                if result.status == Status.INFRASTRUCTURE:  # the machinery's, not the config's
                    tell(proposal, Outcome(Status.INFRASTRUCTURE, reason=result.reason[:2000]))
                    told.add(proposal.number)
                    infrastructure += 1
                    if infrastructure >= INFRASTRUCTURE_BATCHES * settings.batch_size:
                        raise InfrastructureError(
                            f"{infrastructure} trials in a row could not be built or run, for "
                            f"reasons that are not the configs': {result.reason}"
                        )
                    continue
                infrastructure = 0
                # The study learns the build before the store holds the measurement, and is
                # told after: a session killed in between leaves a RUNNING trial whose value
                # the next session finds (Study.settle_abandoned).
                study.note_build(proposal, build.key)
                store.record_trial(
                    device,
                    problem,
                    result,
                    build=build,
                    study=name,
                    phase="search",
                    baseline_us=result.baseline_us or sdpa_default,
                )
                tell(
                    proposal,
                    Outcome(
                        Status(result.status),
                        result.median_us if result.ok else None,
                        result.reason[:2000],
                    ),
                )
                told.add(proposal.number)
                report(result)
                if sweep and result.ok:
                    sweep_launch_values(proposal.config, pending)

    measured, optuna_trials = study.trial_counts()
    return FamilySearch(
        family,
        name,
        study.ranked()[: settings.rerank_top],
        replace(progress.counts, total_trials=measured, optuna_trials=optuna_trials),
    )


def _unmeasured(
    space: Space,
    valid: dict[str, ValidConfig],
    known: dict[str, float | None],
    pending: list[Proposal],
) -> list[ValidConfig]:
    """Valid configs neither measured nor pending, those of builds nothing measured yet if
    any are left (in the space's order, so a seeded pick is reproducible)."""
    taken = set(known) | {p.config.digest for p in pending}
    untried = [c for d, c in valid.items() if d not in taken]
    built = {space.build_view(valid[d]).digest for d in taken if d in valid}
    unbuilt = [c for c in untried if space.build_view(c).digest not in built]
    return unbuilt or untried


def _launch_siblings(
    space: Space, config: Config, valid: dict[str, ValidConfig]
) -> list[ValidConfig]:
    """The valid configs that differ from `config` in launch parameters only (one build), the
    launch values nearest `config`'s first."""
    params = space.launch_params
    at = [p.values.index(config[p.name]) for p in params]
    combos = sorted(
        itertools.product(*(range(len(p.values)) for p in params)),
        key=lambda idx: sum(abs(i - a) for i, a in zip(idx, at, strict=True)),
    )
    siblings = []
    for idx in combos:
        sibling = config.replace(**{p.name: p.values[i] for p, i in zip(params, idx, strict=True)})
        if sibling.digest != config.digest and sibling.digest in valid:
            siblings.append(valid[sibling.digest])
    return siblings


@contextmanager
def _settled_on_exit(strategy: Strategy, pending: list[Proposal]) -> Iterator[set[int]]:
    """Yield the set of proposal numbers told so far; if the block ends with an exception (an
    interrupt, an infrastructure error), the proposals not told are told "interrupted" rather
    than left RUNNING (unless the database connection is what broke)."""
    told: set[int] = set()
    try:
        yield told
    except BaseException as exc:
        if lost_connection(exc):
            # The database cannot be told now; the trials stay RUNNING, and the next session
            # of the study settles them with the values already stored (Study.settle_abandoned)
            raise
        for proposal in pending:
            if proposal.number not in told:
                strategy.tell(
                    proposal,
                    Outcome(
                        Status.INTERRUPTED, reason=f"the session stopped: {type(exc).__name__}"
                    ),
                )
        raise
