"""The tuning session of one problem: each kernel family searched in its own study (the loop,
tune/loop.py; the strategies, tune/strategies.py), then a final re-timing of every family's
finalists, torch SDPA's backends among them, that picks the winner.

The kernel family is a search dimension: each family the GPU can run (its space file says which)
gets its own Optuna study and trial budget, since the families share no parameters; the final
re-timing puts the top configs of every family side by side, and the fastest of any family wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ..build.compiler import BuildResult
from ..model.config import Config
from ..model.perf_model import Prediction
from ..model.problem import Problem
from ..model.space import (
    FORWARD,
    ValidConfig,
    backward_families,
    load_space,
    supported_families,
    unsupported_reason,
)
from ..model.status import Status
from ..model.target import Target
from ..store.records import BaselineTiming, DeviceInfo, TrialResult
from ..store.repo import BrokenRow, TuningStore
from .backends import SDPA_FAMILY, Backend
from .counts import Counted, SearchCounts
from .loop import InfrastructureError, Progress, search_family, warm_start_seeds
from .model_seeding import perf_model_for, quick_plan, shipped_seeds
from .settings import SAMPLERS, SearchSettings
from .study import counted_trials

# Names other modules import from here, whichever module of the stage defines them.
__all__ = [
    "SAMPLERS",
    "FamilyOutcome",
    "Final",
    "InfrastructureError",
    "Progress",
    "SearchSettings",
    "TuneOutcome",
    "choose_winner",
    "families_to_search",
    "problem_key",
    "rerank_finalists",
    "sdpa_configs",
    "study_name",
    "tune_problem",
]

DEFAULT_SETTINGS = SearchSettings()


@dataclass(frozen=True)
class FamilyOutcome(Counted):
    """What the search of one kernel family did for a problem (its counters, read as
    attributes: `evaluated`, `failed`, ...), and its fastest finalist."""

    family: str
    study: str
    best: TrialResult | None  # this family's fastest config in the final re-timing
    counts: SearchCounts

    def tflops(self, problem: Problem) -> float | None:
        return self.best.tflops(problem) if self.best else None


@dataclass(frozen=True)
class TuneOutcome(Counted):
    """A problem's session: the overall winner (whatever its family) and, in `families`, each
    family's search. Counters are sums over the families searched (`total_trials` with the
    stored winner's study when it defended its place)."""

    problem: Problem
    device: DeviceInfo
    study: str  # the winner's study (the first family's when nothing passed)
    best: TrialResult | None
    baselines: dict[str, BaselineTiming]
    counts: SearchCounts
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
    """The problem in a study's name: every field that makes it another problem (a KV-cache
    kind other than dense and a backward pass are appended, so the names of dense forward
    problems' studies stay as they were before either existed)."""
    kind = "" if problem.kv_cache == "dense" else f"-{problem.kv_cache}"
    if problem.backward:
        kind += "-bwd-det" if problem.deterministic else "-bwd"
    return (
        f"{problem.dtype}-d{problem.head_dim}-{'causal' if problem.causal else 'full'}"
        f"-b{problem.batch}-hq{problem.heads_q}-hkv{problem.heads_kv}"
        f"-lq{problem.seqlen_q}-lk{problem.seqlen_k}{kind}"
    )


def study_name(device: DeviceInfo, family: str, problem: Problem) -> str:
    return f"{device.key}/{family}/{problem_key(problem)}"


@dataclass(frozen=True)
class _Reranked:
    result: TrialResult
    measurement_id: int
    study: str


def families_to_search(
    backend: Backend, families: Sequence[str] | None = None, problem: Problem | None = None
) -> list[str]:
    """The kernel families a session searches: those asked for (each must run on the backend's
    target), else every family the backend can run there that is meant for `problem`'s query
    length (the decode family is not searched on prefill problems unless asked for)."""
    target = backend.target()
    if problem is not None and problem.backward:
        return _backward_families_to_search(target, families, problem)
    if families is None:
        chosen = backend.families()
        if problem is not None:
            chosen = [
                f
                for f in chosen
                if load_space(f).serves(problem.seqlen_q) and load_space(f).reads(problem.kv_cache)
            ]
        if not chosen:
            supported = supported_families(target)
            raise ValueError(
                f"no kernel family to search on {target.name}: "
                + (
                    f"the backend offers none of {', '.join(supported)}"
                    if supported
                    else unsupported_reason(target)
                )
            )
        return chosen
    chosen = list(dict.fromkeys(families))
    if problem is not None and any(f in backward_families() for f in chosen):
        # a shape set may mix forward and backward problems: each gets the families of its
        # pass among those asked for
        chosen = [f for f in chosen if load_space(f).direction == FORWARD]
        if not chosen:
            raise ValueError(
                f"only backward families were asked for, and {problem.describe()} is a "
                "forward problem"
            )
    if not chosen:
        raise ValueError("no kernel family to search")
    for family in chosen:
        space = load_space(family)  # an unknown family is refused here, with the known ones
        if not space.supports(target.cc):
            raise ValueError(
                f"family {family} runs on {space.cc_range()}; {target.name} is {target.arch}"
            )
    if problem is not None and problem.kv_cache != "dense":
        # A shape set may mix plain and KV-cache problems: the latter go to the families
        # that read caches among those asked for.
        chosen = [f for f in chosen if load_space(f).reads(problem.kv_cache)]
        if not chosen:
            raise ValueError(
                f"none of the families asked for reads a {problem.kv_cache} KV "
                f"cache ({problem.describe()}); the decode family does"
            )
    return chosen


def _backward_families_to_search(
    target: Target, families: Sequence[str] | None, problem: Problem
) -> list[str]:
    """The backward families a backward problem's session searches: those asked for among
    them (a forward family asked for is named and left out: a shape set may mix forward and
    backward problems), else every backward family that runs on `target`."""
    runs = [f for f in backward_families() if load_space(f).supports(target.cc)]
    chosen = runs if families is None else [f for f in dict.fromkeys(families) if f in runs]
    if not chosen:
        asked = "" if families is None else f" among {', '.join(families)}"
        raise ValueError(
            f"no backward family{asked} runs {problem.describe()} on {target.name}; "
            f"the backward families: {', '.join(backward_families())}"
        )
    return chosen


def tune_problem(
    problem: Problem,
    backend: Backend,
    store: TuningStore,
    settings: SearchSettings = DEFAULT_SETTINGS,
    *,
    families: Sequence[str] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> TuneOutcome:
    """Search each family (default: every family the backend runs on its GPU) in its own study,
    `settings.trials` new configs each, then re-time the top configs of all of them together;
    the fastest, whatever its family, becomes the best config of (device, problem)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chosen = families_to_search(backend, families, problem)
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
    compiled = [family for family in chosen if load_space(family).compiled]
    ranked = (
        _seeded_and_built(problem, backend, store, settings, compiled)
        if settings.sampler == "model"
        else {}
    )
    searches = [
        search_family(
            problem,
            family,
            studies[family],
            backend,
            store,
            settings,
            sdpa_default,
            on_progress,
            ranked.get(family, []),
        )
        for family in compiled
    ]
    finalists = [(search.study, config) for search in searches for config in search.top]
    # A best config of a family not searched now (tuned earlier) defends its place in the same
    # re-timing, so that tuning one family again cannot replace a faster kernel of another.
    defender_trials = 0
    try:
        stored = store.best(device, problem)
    except BrokenRow:
        stored = None
    if (
        stored is not None
        and stored.config.family not in chosen
        and stored.config.family in backend.families()
    ):
        defender = study_name(device, stored.config.family, problem)
        finalists.append((defender, stored.config))
        defender_trials = counted_trials(store.url, defender)

    if settings.sdpa_finalists or not searches:
        finalists += [(study_name(device, SDPA_FAMILY, problem), c) for c in sdpa_configs(problem)]
    total = sum(search.total_trials for search in searches) + defender_trials
    final = rerank_finalists(
        problem,
        backend,
        store,
        settings,
        finalists,
        device,
        studies[chosen[0]],
        sdpa_default,
        trials=total,
    )
    reranked, winner = final.reranked, final.winner
    if final.baselines:
        baselines = final.baselines
    outcomes = []
    for search in searches:
        mine = [r.result for r in reranked if r.result.config.family == search.family]
        outcomes.append(
            FamilyOutcome(
                search.family,
                search.study,
                min(mine, key=lambda r: r.median_us or math.inf) if mine else None,
                search.counts,
            )
        )
    counts = sum((o.counts for o in outcomes), SearchCounts())
    return TuneOutcome(
        problem,
        device,
        winner.study if winner else studies[chosen[0]],
        winner.result if winner else None,
        baselines,
        replace(counts, total_trials=total),
        [r.result for r in reranked],
        tuple(outcomes),
    )


def _seeded_and_built(
    problem: Problem,
    backend: Backend,
    store: TuningStore,
    settings: SearchSettings,
    families: Sequence[str],
) -> dict[str, list[tuple[ValidConfig, Prediction]]]:
    """The model sampler's plan (tune/model_seeding.py): per family, the builds it will time
    in predicted order (`settings.prebuild` in all, `settings.trials` at most per family);
    those and each family's warm-start seeds compiled together now, in parallel, so the
    search's batches find them built."""
    device, target = backend.device(), backend.target()
    model = perf_model_for(settings, device, store)
    plan = quick_plan(model, problem, families, target, settings.prebuild)
    per_family = {f: ranked[: settings.trials] for f, ranked in plan.per_family.items()}
    seeds = [
        c
        for f in families
        for c in warm_start_seeds(store, device, problem, load_space(f), target, settings)
    ]
    # the shipped results' nearest config of each family (what dispatch would carry), timed
    # first: the best guess where the model knows the family least
    shipped = {
        f: [
            c
            for c in shipped_seeds(problem, f, device)
            if space_fits(c, target) and c not in seeds
        ]
        if settings.warm_start
        else []
        for f in families
    }
    per_family = {
        f: [(c, model.predict(problem, c)) for c in shipped[f]]
        + [(c, p) for c, p in per_family.get(f, []) if c not in shipped[f]]
        for f in families
    }
    wanted = list(dict.fromkeys([c for r in per_family.values() for c, _ in r] + seeds))
    backend.build(wanted)
    return per_family


def space_fits(config: ValidConfig, target: Target) -> bool:
    return not load_space(config.family).violations(config, target)


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


def choose_winner(
    reranked: Sequence[_Reranked], builds: dict[str, BuildResult] | None = None
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
    if not (
        (a.p20_us or a.median_us) <= (b.p80_us or b.median_us)
        and (b.p20_us or b.median_us) <= (a.p80_us or a.median_us)
    ):
        return first, f"fastest: {gap:.1f}% ahead of {_label(b.config)}, p20-p80 ranges apart", b

    def tie(chosen: _Reranked, rule: str) -> str:
        other = second if chosen is first else first
        return (
            f"tie with {_label(other.result.config)} ({gap:.1f}% apart, p20-p80 ranges "
            f"overlap): {rule}"
        )

    sdpa = [r for r in (first, second) if r.result.config.family == SDPA_FAMILY]
    if sdpa:
        chosen = sdpa[0]
        other = second if chosen is first else first
        return chosen, tie(chosen, "torch SDPA preferred"), other.result
    builds = builds or {}
    ra, rb = (_resources(builds.get(r.result.config.digest)) for r in (first, second))
    if ra is not None and rb is not None and rb != ra and rb[0] <= ra[0] and rb[1] <= ra[1]:
        return (
            second,
            tie(
                second,
                f"fewer registers and less shared memory ({rb[0]} regs, "
                f"{rb[1]} B against {ra[0]}, {ra[1]})",
            ),
            a,
        )
    if ra is not None and rb is not None and ra != rb and ra[0] <= rb[0] and ra[1] <= rb[1]:
        return (
            first,
            tie(
                first,
                f"fewer registers and less shared memory ({ra[0]} regs, "
                f"{ra[1]} B against {rb[0]}, {rb[1]})",
            ),
            b,
        )
    return first, tie(first, "neither uses fewer resources, the faster median kept"), b


def rerank_finalists(
    problem: Problem,
    backend: Backend,
    store: TuningStore,
    settings: SearchSettings,
    finalists: list[tuple[str, Config]],
    device: DeviceInfo,
    baseline_study: str,
    sdpa_default: float | None,
    *,
    trials: int,
    phase: str = "rerank",
    write_best: bool = True,
) -> Final:
    """Re-time the finalists of every family, torch SDPA's backends among them, together in
    one alternation (autotune.measure.timing); record each measurement under its family's study,
    choose the winner (`choose_winner`) and, with `write_best`, store it as the best config
    of (device, problem) with the speed-up over SDPA from the same alternation."""
    if not finalists:
        return Final([], {}, None, "no finalist", None)
    study_of = {config.digest: study for study, config in finalists}
    unique = list(dict.fromkeys(c for _, c in finalists))
    builds: list[BuildResult] = [b for b in backend.build(unique) if b.ok]
    reranking = backend.rerank(
        problem, builds, rounds=settings.rerank_rounds, round_ms=settings.rerank_round_ms
    )
    beside = {b.backend: b for b in reranking.baselines}
    if beside:
        store.record_baselines(device, problem, baseline_study, reranking.baselines)
        sdpa_default = _median_us(beside, "default") or sdpa_default
    final = []
    for build, result in zip(builds, reranking.results, strict=True):
        if result.status == Status.INVALID and build.config.family == SDPA_FAMILY:
            continue  # a backend that refuses the problem is not a finalist
        study = study_of[build.config.digest]
        measurement_id = store.record_trial(
            device,
            problem,
            result,
            build=build,
            study=study,
            phase=phase,
            baseline_us=sdpa_default,
        )
        if result.ok:
            final.append(_Reranked(result, measurement_id, study))
    # SDPA cannot read a KV cache (it is timed on the same keys held contiguous): beside a
    # KV-cache problem's kernels it is the baseline, never the winner.
    eligible = (
        final
        if problem.kv_cache == "dense"
        else [r for r in final if r.result.config.family != SDPA_FAMILY]
    )
    winner, decision, runner_up = choose_winner(eligible, {b.config.digest: b for b in builds})
    if winner is not None and write_best:
        store.set_best(
            device,
            problem,
            winner.result,
            measurement_id=winner.measurement_id,
            study=winner.study,
            trials=trials,
            sdpa_default_us=sdpa_default,
            sdpa_flash_us=_median_us(beside, "flash"),
            decision=decision,
            runner_up_us=runner_up.median_us if runner_up else None,
        )
    return Final(final, beside, winner, decision, runner_up)


def _median_us(baselines: dict[str, BaselineTiming], backend: str) -> float | None:
    timing = baselines.get(backend)
    return timing.median_us if timing else None
