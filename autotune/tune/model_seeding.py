"""A search seeded by the performance model (`--sampler model`, `tune --quick`): the configs the
model predicts fastest, across every family it knows, are all that is compiled (together, one
parallel build, before anything is timed) and timed, best predicted first; a family stops
early once its measured leader is separated from what is left (ModelRanked in strategies.py).

The model ranks within a problem better than it predicts a problem's absolute time (its error
by problem is mostly a factor common to every config of the problem), so what is compared is
the configs' predicted order, and a family's remaining candidates are judged by their
optimistic time (the model's 20th percentile) scaled by how far the model was off on the
configs already measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._jsonfile import read_json
from ..model.config import Config, InvalidConfig
from ..model.perf_model import PerfModel, Prediction
from ..model.problem import Problem
from ..model.space import ValidConfig, load_space
from ..model.target import Target
from ..store.perf_models import model_for
from ..store.records import DeviceInfo
from ..store.repo import TuningStore
from .settings import SearchSettings


def perf_model_for(
    settings: SearchSettings, device: DeviceInfo, store: TuningStore | None = None
) -> PerfModel:
    """The model `settings.perf_model` names, else the one fitted in `store` for this GPU
    model or the one shipped in db/, whichever learnt from more timings (store.perf_models);
    ValueError when there is none (the model sampler has nothing to rank with)."""
    if settings.perf_model:
        return PerfModel(read_json(Path(settings.perf_model)))
    found, _ = model_for(store, device.name)
    if found is None:
        raise ValueError(
            f"no performance model ships for {device.name} nor is one fitted in "
            "the database: tune it with another sampler first (the model is "
            "fitted after each session), or fit one (`cute-autotune model fit "
            "--store`) or pass one (--perf-model)"
        )
    return found


def ranked_builds(
    model: PerfModel, problem: Problem, family: str, target: Target
) -> list[tuple[ValidConfig, Prediction]]:
    """One config per build of `family`'s valid configs for `problem` (its launch values
    predicted best), fastest predicted first; empty when the model knows nothing of the
    family (it would predict from features it never saw vary)."""
    if family not in model.families:
        return []
    space = load_space(family)
    best: dict[ValidConfig, tuple[ValidConfig, Prediction]] = {}
    for config in space.valid_configs(target, space.problem_values(problem)):
        guess = model.predict(problem, config)
        build = space.build_view(config)
        if build not in best or guess.median_us < best[build][1].median_us:
            best[build] = (config, guess)
    return sorted(best.values(), key=lambda pair: (pair[1].median_us, pair[0].digest))


def shipped_seeds(problem: Problem, family: str, device: DeviceInfo) -> list[ValidConfig]:
    """The `family` config of the shipped db/ result nearest to `problem` on this GPU model
    (of its head dim and causality; of its dtype, else the other one's, fp16 and bf16 sharing
    configs), as a seed: a database that never ran `attention()` holds none of them, and the
    model does not know every family (decode90)."""
    from ..runtime.dispatch import shipped_results
    from ..store.exchange import BrokenRow, parse_export
    from ..store.repo import problem_distance

    space = load_space(family)
    near: list[tuple[float, ValidConfig]] = []
    for doc in shipped_results():
        try:
            entries = parse_export(doc)
        except BrokenRow:
            continue
        for entry in entries:
            config, source = entry.result.config, entry.problem
            if (
                (entry.device.name, entry.device.sm_count) != (device.name, device.sm_count)
                or config.family != family
                or source.kv_cache != problem.kv_cache
                or (source.head_dim, source.causal) != (problem.head_dim, problem.causal)
            ):
                continue
            try:
                seed = space.validate(
                    Config.make(family, {**dict(config.values), "dtype": problem.dtype})
                )
            except InvalidConfig:
                continue
            twin = 0.0 if source.dtype == problem.dtype else 1.0
            near.append((problem_distance(problem, source) + twin, seed))
    return [min(near, key=lambda pair: pair[0])[1]] if near else []


@dataclass(frozen=True)
class QuickPlan:
    """The builds a seeded search compiles and times, per family, in predicted order."""

    per_family: dict[str, list[tuple[ValidConfig, Prediction]]]

    def configs(self) -> list[ValidConfig]:
        return [c for ranked in self.per_family.values() for c, _ in ranked]


def quick_plan(
    model: PerfModel, problem: Problem, families: Sequence[str], target: Target, builds: int
) -> QuickPlan:
    """`builds` builds in all, the fastest predicted across the families, each family the
    model knows keeping at least its own best (the model's error between families is larger
    than within one)."""
    ranked = {f: ranked_builds(model, problem, f, target) for f in families}
    chosen: dict[str, list[tuple[ValidConfig, Prediction]]] = {
        f: r[:1] for f, r in ranked.items() if r
    }
    pool = sorted(
        (
            (guess.median_us, f, i)
            for f, r in ranked.items()
            for i, (_, guess) in enumerate(r)
            if i > 0
        )
    )
    left = max(0, builds - sum(len(c) for c in chosen.values()))
    for _, family, i in pool[:left]:
        chosen[family].append(ranked[family][i])
    return QuickPlan({f: sorted(c, key=lambda pair: pair[1].median_us) for f, c in chosen.items()})
