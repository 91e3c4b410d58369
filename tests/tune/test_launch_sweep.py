"""Launch values swept on each build (the decode family's KV split count, a launch argument of
the same cubin), on the replay backend with the decode recording: every split count of each
built tile is timed right after it, recorded as its own measurement and Optuna trial, and
`trials` counts builds, also when a killed session resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.model.space import load_space
from autotune.store.repo import TuningStore
from autotune.tune.backends import ReplayBackend
from autotune.tune.search import SearchSettings, study_name, tune_problem
from autotune.tune.study import Study

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "data" / "sweep_decode_h200.json.gz"
SPLITS = load_space("decode").params["num_splits"].values


@pytest.fixture(scope="module")
def backend() -> ReplayBackend:
    return ReplayBackend(RECORDING)


def _settings(**values: object) -> SearchSettings:
    return SearchSettings(sdpa_finalists=False, warm_start=0, rerank_top=1, **values)  # type: ignore[arg-type]


def _search_rows(store: TuningStore, problem: object) -> list[dict[str, object]]:
    return [
        t
        for t in store.trials(problem=problem)  # type: ignore[arg-type]
        if t["phase"] == "search"
    ]


def test_every_split_count_of_each_build_is_timed_and_trials_count_builds(
    backend: ReplayBackend, tmp_path: Path
) -> None:
    store = TuningStore(f"sqlite:///{tmp_path}/t.db")
    problem = backend.problems[0]  # B1 H32/8 Lq1 Lk8k: every split count is valid
    outcome = tune_problem(problem, backend, store, _settings(trials=3, seed=1))
    [family] = outcome.families
    builds: dict[str, set[int]] = {}
    for row in _search_rows(store, problem):
        config = dict(row["config"])  # type: ignore[call-overload]
        splits = config.pop("num_splits")
        builds.setdefault(json.dumps(config, sort_keys=True), set()).add(splits)
    assert len(builds) == 3 and all(s == set(SPLITS) for s in builds.values()), builds
    assert family.evaluated == 3 * len(SPLITS) and family.swept == 3 * (len(SPLITS) - 1)
    # each swept value is a complete trial of the study, so the sampler learns from it
    study = Study(
        study_name(backend.device(), "decode", problem),
        store.url,
        None,
        load_space("decode"),
        problem.space_values(),
    )
    assert len(study.knowledge(backend.build_key).known) == 3 * len(SPLITS)


def test_without_the_sweep_trials_count_configs(backend: ReplayBackend, tmp_path: Path) -> None:
    store = TuningStore(f"sqlite:///{tmp_path}/t.db")
    outcome = tune_problem(
        backend.problems[0], backend, store, _settings(trials=3, seed=1, sweep_launch=False)
    )
    [family] = outcome.families
    assert family.evaluated == 3 and family.swept == 0


def test_a_resumed_session_counts_the_builds_it_ran(
    backend: ReplayBackend, tmp_path: Path
) -> None:
    """`resume` (what a worker's item runs with) keeps the builds already searched today, not
    the configs: a budget of 3 after 2 builds adds one build, with its split counts."""
    store = TuningStore(f"sqlite:///{tmp_path}/t.db")
    problem = backend.problems[0]
    tune_problem(problem, backend, store, _settings(trials=2, seed=1, resume=True))
    again = tune_problem(problem, backend, store, _settings(trials=3, seed=1, resume=True))
    [family] = again.families
    assert (family.evaluated, family.swept) == (len(SPLITS), len(SPLITS) - 1), family


class _SettledSampler:
    """A sampler that has settled on one config, as TPE can on the incumbent's build: every
    proposal is that config (queued trials still come first, as Optuna asks them before any
    sampler)."""

    def __init__(self, values: dict[str, object]) -> None:
        self.values = values

    def infer_relative_search_space(self, study: object, trial: object) -> dict[str, object]:
        return {}

    def sample_relative(
        self, study: object, trial: object, space: dict[str, object]
    ) -> dict[str, object]:
        return {}

    def sample_independent(
        self, study: object, trial: object, name: str, distribution: object
    ) -> object:
        return self.values[name]

    def before_trial(self, study: object, trial: object) -> None:
        pass

    def after_trial(self, study: object, trial: object, state: object, values: object) -> None:
        pass

    def reseed_rng(self) -> None:
        pass


def test_a_sampler_settled_on_one_build_still_gets_its_budget_of_builds(
    backend: ReplayBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once every launch value of the build the sampler keeps proposing is timed, its
    proposals are all repeats: configs of builds not yet measured are queued among them, so
    the search makes its `trials` builds instead of stopping after 200 repeats."""
    import autotune.tune.loop as loop
    from autotune.model.target import Target

    problem = backend.problems[0]
    space = load_space("decode")
    target: Target = backend.target()
    settled = next(iter(space.valid_configs(target, problem.space_values())))
    values = {p.name: settled[p.name] for p in space.tunable_params}
    monkeypatch.setattr(loop, "sampler_for", lambda *args: _SettledSampler(values))
    store = TuningStore(f"sqlite:///{tmp_path}/t.db")
    outcome = tune_problem(problem, backend, store, _settings(trials=4, seed=1))
    [family] = outcome.families
    builds = {
        json.dumps(
            {
                k: v
                for k, v in dict(row["config"]).items()  # type: ignore[call-overload]
                if k != "num_splits"
            },
            sort_keys=True,
        )
        for row in _search_rows(store, problem)
    }
    assert len(builds) == 4, (len(builds), family.repeated)
    assert family.repeated < loop.STALE_ASKS
