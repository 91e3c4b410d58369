"""Search strategies: what to try next. A strategy proposes configs of one family's space and is
told how each ended; it never compiles, times or stores anything (the loop, tune/loop.py, does).

Every strategy asks through the family's study (tune/study.py): each proposal is a trial of it,
so that a study records every config a session tried, and Optuna's samplers learn from what it
holds. Configs a strategy wants tried first go on the study's queue, which Optuna asks before
its sampler; the queue is stored, so what one session leaves queued the next asks first.

* SamplerSearch: Optuna's sampler proposes: TPE, or uniformly random.
* GridSearch: every valid config not yet measured, each once; then nothing.
* LocalSearch (around another strategy): half of each batch refines good configs.
* WarmStart (around another strategy): given configs first (the best of the nearest tuned
  problems, the family's default).
* ModelRanked: the builds the performance model predicts fastest, in that order, until the
  measured leader is separated from the rest (tune/model_seeding.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from ..model.config import Config, Value
from ..model.perf_model import Prediction
from ..model.space import Space
from ..model.target import Target
from .settings import SearchSettings
from .study import Outcome, Proposal, Study


class Strategy(Protocol):
    def begin_batch(self, size: int) -> None:
        """The loop is about to ask for up to `size` configs, to build together then time."""
        ...

    def propose(self) -> Proposal | None:
        """The next config to try, or None when the strategy has nothing left to propose."""
        ...

    def tell(self, proposal: Proposal, outcome: Outcome) -> None:
        """How a proposal ended; every proposal is told exactly once."""
        ...


def sampler_for(settings: SearchSettings, launch_params: Iterable[str] = ()) -> Any:
    """The Optuna sampler behind the study of `settings.sampler`. `launch_params`: the
    parameters a build sweeps (every value timed on it, each a complete trial), which TPE's
    random start then counts in builds, not trials."""
    import optuna

    # "grid" is a random sampler behind a queue holding every valid config (GridSearch), which
    # it never reaches: Optuna's GridSampler enumerates the full product, invalid points
    # included, and stops the study from inside `tell`, which ask-and-tell use does not allow.
    if settings.sampler in ("grid", "random", "model"):
        return optuna.samplers.RandomSampler(seed=settings.seed)
    # Configs of a batch are proposed before any of them is timed: the constant liar makes TPE
    # treat the pending ones as bad, so a batch spreads out instead of repeating one guess.
    # `group` models conditional structure within a family's space.
    # A family without launch values has a trial per build: Optuna's own random start.
    launch_params = tuple(launch_params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        tpe = optuna.samplers.TPESampler(
            seed=settings.seed,
            multivariate=True,
            group=True,
            constant_liar=True,
            n_startup_trials=0 if launch_params else settings.tpe_startup,
        )
    if not launch_params:
        return tpe
    return BuildStartupSampler(
        tpe,
        optuna.samplers.RandomSampler(seed=settings.seed),
        settings.tpe_startup,
        launch_params,
        settings.seed,
    )


class BuildStartupSampler:
    """TPE once `startup` builds were measured; before that, each build parameter takes one of
    its values the measured builds (and pruned or pending proposals) have least often, at
    random among those, so the first builds cover every value of every parameter.

    Optuna's own `n_startup_trials` counts trials, and a swept build is one trial per launch
    value: the first build's split counts can end the random start on their own, TPE then
    models the space from that one build, and a search can end without ever trying a tile
    size the exhaustive best uses. A sampler in Optuna's sense (the calls its studies make),
    built from two."""

    def __init__(
        self,
        tpe: Any,
        random: Any,
        startup: int,
        launch_params: tuple[str, ...],
        seed: int | None = None,
    ) -> None:
        import numpy

        self._tpe, self._random = tpe, random
        self._rng = numpy.random.default_rng(seed)
        self.startup, self.launch_params = startup, launch_params

    def measured_builds(self, study: Any) -> list[dict[str, Any]]:
        """The build parameters of the study's complete trials, each build once."""
        import optuna

        trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        builds = {
            tuple(
                sorted((k, repr(v)) for k, v in t.params.items() if k not in self.launch_params)
            ): t.params
            for t in trials
        }
        return [
            {k: v for k, v in params.items() if k not in self.launch_params}
            for params in builds.values()
        ]

    def _starting(self, study: Any) -> bool:
        return len(self.measured_builds(study)) < self.startup

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        if self._starting(study):
            return {}
        space: dict[str, Any] = self._tpe.infer_relative_search_space(study, trial)
        return space

    def sample_relative(
        self, study: Any, trial: Any, search_space: dict[str, Any]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        params: dict[str, Any] = self._tpe.sample_relative(study, trial, search_space)
        return params

    def sample_independent(
        self, study: Any, trial: Any, param_name: str, param_distribution: Any
    ) -> Any:
        if not self._starting(study):
            return self._tpe.sample_independent(study, trial, param_name, param_distribution)
        from optuna.trial import TrialState

        choices = getattr(param_distribution, "choices", None)
        if param_name in self.launch_params or choices is None:
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        # Pruned proposals count too (a value whose rarest pairing is invalid moves on), and
        # so do the batch's proposals not yet timed (a batch spreads out).
        others = study.get_trials(deepcopy=False, states=(TrialState.PRUNED, TrialState.RUNNING))
        seen = [build.get(param_name) for build in self.measured_builds(study)]
        seen += [t.params.get(param_name) for t in others if t.number != trial.number]
        counts = [sum(1 for value in seen if value == choice) for choice in choices]
        rarest = [c for c, n in zip(choices, counts, strict=True) if n == min(counts)]
        return rarest[int(self._rng.integers(len(rarest)))]

    def before_trial(self, study: Any, trial: Any) -> None:
        self._tpe.before_trial(study, trial)

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        self._tpe.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        import numpy

        self._tpe.reseed_rng()
        self._random.reseed_rng()
        self._rng = numpy.random.default_rng()


class SamplerSearch:
    """The study's sampler proposes (after any config waiting in the study's queue). Its
    proposals are configs of the space, not necessarily valid ones, and may repeat: the loop
    prunes both, and the sampler learns from those trials too."""

    def __init__(self, study: Study) -> None:
        self._study = study

    def begin_batch(self, size: int) -> None:
        pass

    def propose(self) -> Proposal | None:
        return self._study.ask()

    def tell(self, proposal: Proposal, outcome: Outcome) -> None:
        self._study.tell(proposal, outcome)


class GridSearch:
    """Every valid config not measured yet, each once, in the space's order; then None. A
    config lost to the machinery is not proposed again this session (the next one tries it)."""

    def __init__(
        self,
        study: Study,
        target: Target,
        known: Mapping[str, float | None],
        settle: Callable[[], None],
    ) -> None:
        self._study = study
        self._settle = settle
        self._todo = [
            c for c in study.space.valid_configs(target, study.fixed) if c.digest not in known
        ]
        self._asked: set[str] = set()
        study.enqueue(self._todo)
        # The study's whole queue: configs an earlier session left queued are asked first.
        self._left = study.waiting()

    def begin_batch(self, size: int) -> None:
        pass

    def propose(self) -> Proposal | None:
        # Never past the queue: the study's sampler would propose random configs, all of them
        # known or invalid, until the loop gives up on stale proposals (up to 200 junk trials).
        if self._left <= 0:
            self._left = self._requeue_lost()
            if self._left <= 0:
                return None
        self._left -= 1
        proposal = self._study.ask()
        self._asked.add(proposal.config.digest)
        return proposal

    def _requeue_lost(self) -> int:
        """Queue again the configs of this grid that neither this session asked nor the study
        holds as run or running; returns the queue's length (0: none such).

        The queue is the study's, shared: an item whose lease ran out while its worker still
        ran is taken again (tune.worker), and until the old worker notices it can take configs
        off the queue this session counted, then give them up ("interrupted" on LeaseLost, or
        left RUNNING if it is killed). Without this, the last asks found the queue empty and
        the item ended with those configs never measured (once in the 8-worker kill rounds,
        tests/faults/test_fault_rounds.py)."""
        # A worker killed after storing a config's outcome left its trial RUNNING: settled with
        # that outcome first, the config counts as run. Queued again, a stored failure would be
        # measured twice (the loop reuses stored times, not failures).
        self._settle()
        taken = self._study.taken()
        lost = [c for c in self._todo if c.digest not in self._asked and c.digest not in taken]
        if not lost:
            return 0
        self._study.enqueue(lost)
        return self._study.waiting()

    def tell(self, proposal: Proposal, outcome: Outcome) -> None:
        self._study.tell(proposal, outcome)


class LocalSearch:
    """Half of each batch refines what was measured: untried neighbours of good configs (see
    `neighbours`) are proposed first, then `inner` proposes. TPE models the whole space well but
    finds the last few percent slowly; the best config is usually one step from a good one (a
    stage count, a tile edge)."""

    def __init__(
        self, inner: Strategy, study: Study, target: Target, known: Mapping[str, float | None]
    ) -> None:
        self._inner, self._study, self._target = inner, study, target
        self._known = dict(known)

    def begin_batch(self, size: int) -> None:
        found = neighbours(self._study.space, self._target, self._study.fixed, self._known)
        self._study.enqueue(found[: max(1, size // 2)])
        self._inner.begin_batch(size)

    def propose(self) -> Proposal | None:
        return self._inner.propose()

    def tell(self, proposal: Proposal, outcome: Outcome) -> None:
        self._inner.tell(proposal, outcome)
        if outcome.measured:
            self._known[proposal.config.digest] = outcome.value


class WarmStart:
    """`seeds` not measured yet, in their order, before anything `inner` proposes: queued on the
    study when made, ahead of what `inner` queues per batch."""

    def __init__(
        self,
        inner: Strategy,
        study: Study,
        seeds: Iterable[Config],
        known: Mapping[str, float | None],
    ) -> None:
        self._inner = inner
        study.enqueue(c for c in dict.fromkeys(seeds) if c.digest not in known)

    def begin_batch(self, size: int) -> None:
        self._inner.begin_batch(size)

    def propose(self) -> Proposal | None:
        return self._inner.propose()

    def tell(self, proposal: Proposal, outcome: Outcome) -> None:
        self._inner.tell(proposal, outcome)


class ModelRanked:
    """`ranked` (configs with their predicted times, fastest predicted first) not measured
    yet, in that order; then None, and None as soon as the leader is separated: once
    `MIN_MEASURED` of them were measured, when no config left is predicted, at its optimistic
    end (the 20th percentile) times how far the model was off here (the least ratio of
    measured over predicted: the most hopeful reading of its error), to beat the fastest
    measured. Configs the study's queue holds (seeds, a
    queue left by an earlier session) are asked first."""

    MIN_MEASURED = 2

    def __init__(
        self,
        study: Study,
        ranked: Sequence[tuple[Config, Prediction]],
        known: Mapping[str, float | None],
    ) -> None:
        self._study = study
        self._predicted = {c.digest: guess for c, guess in ranked}
        self._todo = [c for c, _ in ranked if c.digest not in known]
        self._measured = {d: v for d, v in known.items() if v is not None and d in self._predicted}
        self._asked: set[str] = set()

    def begin_batch(self, size: int) -> None:
        pass

    def separated(self) -> bool:
        if len(self._measured) < self.MIN_MEASURED:
            return False
        left = [c for c in self._todo if c.digest not in self._asked]
        if not left:
            return True
        off = min(v / self._predicted[d].median_us for d, v in self._measured.items())
        optimistic = min(self._predicted[c.digest].low_us for c in left) * off
        return optimistic >= min(self._measured.values())

    def propose(self) -> Proposal | None:
        if self.separated():
            return None
        if not self._study.waiting():
            left = [c for c in self._todo if c.digest not in self._asked]
            if not left:
                return None
            self._study.enqueue(left[:1])
        proposal = self._study.ask()
        self._asked.add(proposal.config.digest)
        return proposal

    def tell(self, proposal: Proposal, outcome: Outcome) -> None:
        self._study.tell(proposal, outcome)
        if (
            outcome.measured
            and outcome.value is not None
            and proposal.config.digest in self._predicted
        ):
            self._measured[proposal.config.digest] = outcome.value


def strategy_for(
    settings: SearchSettings,
    study: Study,
    target: Target,
    known: Mapping[str, float | None],
    seeds: Iterable[Config] = (),
    settle: Callable[[], None] = lambda: None,
    ranked: Sequence[tuple[Config, Prediction]] = (),
) -> Strategy:
    """The strategy `settings` name, on a study opened with `sampler_for(settings)`. `known`:
    what the study measured already (by digest); `seeds`: configs to try first (not by grid,
    which tries everything); `settle`: settles the trials of processes gone since the session
    began (`Study.settle_abandoned`), run by grid before it re-queues lost configs; `ranked`:
    the model sampler's configs with their predictions (tune/model_seeding.py)."""
    if settings.sampler == "grid":
        return GridSearch(study, target, known, settle)
    strategy: Strategy = (
        ModelRanked(study, ranked, known) if settings.sampler == "model" else SamplerSearch(study)
    )
    if settings.local_search and settings.sampler == "tpe":
        strategy = LocalSearch(strategy, study, target, known)
    seeds = list(seeds)
    if seeds:
        strategy = WarmStart(strategy, study, seeds, known)
    return strategy


def neighbours(
    space: Space, target: Target, fixed: Mapping[str, Value], known: Mapping[str, float | None]
) -> list[Config]:
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
    parents = list(
        dict.fromkeys(order[:3] + sorted(set(best_with.values()), key=lambda d: timed[d]))
    )
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
