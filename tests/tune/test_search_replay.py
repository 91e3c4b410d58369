"""The whole tuning loop on the replay backend: real H200 measurements (an exhaustive sweep of
the sm80 space, benchmarks/sweep.py), a real SQLite file, Optuna's RDB storage beside ours."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.cli.main import main
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.store.records import BaselineTiming
from autotune.store.repo import TuningStore
from autotune.tune.backends import ReplayBackend, Reranking
from autotune.tune.search import SearchSettings, study_name, tune_problem
from autotune.tune.tuning import best_config

from ..conftest import LONG


def kernel_settings(**values: object) -> SearchSettings:
    """Settings of a session studying the kernels' search alone: torch SDPA's backends out of
    the final re-ranking (tests/tune/test_no_regret.py covers them in it)."""
    return SearchSettings(sdpa_finalists=False, **values)  # type: ignore[arg-type]


REPO = Path(__file__).resolve().parents[2]
# every seed in a long run (tests/conftest.py), the first in the default run
SEEDS = range(3) if LONG else range(1)
RECORDING = Path(
    os.environ.get(
        "CUTE_AUTOTUNE_TEST_RECORDING", REPO / "tests" / "data" / "sweep_sm80_h200.json"
    )
)


@pytest.fixture(scope="module")
def recording() -> dict[str, Any]:
    return json.loads(RECORDING.read_text())  # type: ignore[no-any-return]


@pytest.fixture
def backend(recording: dict[str, Any]) -> ReplayBackend:
    return ReplayBackend(recording)


@pytest.fixture
def store(tmp_path: Path) -> TuningStore:
    return TuningStore(f"sqlite:///{tmp_path}/tune.db")


def exhaustive_best(backend: ReplayBackend, problem: Problem) -> float:
    rows = backend.rows(problem, "sm80")
    return min(r["median_us"] for r in rows if r.get("median_us"))


def test_end_to_end_study_then_best(backend: ReplayBackend, store: TuningStore) -> None:
    problem = backend.problems[0]
    outcome = tune_problem(problem, backend, store, kernel_settings(trials=20, seed=0))
    assert outcome.best is not None and outcome.evaluated == 20
    assert outcome.best.median_us is not None
    assert outcome.best.median_us >= exhaustive_best(backend, problem) * (1 - 1e-9)
    assert {"default", "flash"} <= set(outcome.baselines)
    best = store.best(backend.device(), problem)
    assert best is not None and best.config == outcome.best.config
    assert best.sdpa_default_us == outcome.baselines["default"].median_us
    phases = {t["phase"] for t in store.trials(study=outcome.study)}
    assert phases == {"search", "rerank"}  # the winner comes from the re-timing
    study = optuna.load_study(study_name=outcome.study, storage=store.url)
    assert study.best_value == pytest.approx(
        min(t.value for t in study.trials if t.value is not None)
    )


def test_static_pruning_never_reaches_the_compiler(
    backend: ReplayBackend, store: TuningStore
) -> None:
    problem = backend.problems[0]
    outcome = tune_problem(problem, backend, store, kernel_settings(trials=25, seed=1))
    space, target = load_space("sm80"), backend.target()
    assert outcome.pruned > 0, "the sampler never proposed an invalid config (test is vacuous)"
    assert backend.build_calls and all(space.is_valid(c, target) for c in backend.build_calls)
    study = optuna.load_study(study_name=outcome.study, storage=store.url)
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert len(pruned) == outcome.pruned
    assert all(t.user_attrs["status"] == "invalid" and t.user_attrs["reason"] for t in pruned)


def test_failures_are_recorded_with_their_reasons(
    backend: ReplayBackend, store: TuningStore, recording: dict[str, Any]
) -> None:
    problem = backend.problems[0]
    space, target = load_space("sm80"), backend.target()
    configs = space.valid_configs(target, problem.space_values())
    faults = {
        configs[0].digest: ("crashed", "worker process died (exit code -11)"),
        configs[1].digest: ("timeout", "no answer within 120 s (hang?)"),
        configs[2].digest: ("failed_validation", "relative error 3.1e-01 above 1.0e-03"),
    }
    faulty = ReplayBackend(recording, faults=faults)
    outcome = tune_problem(problem, faulty, store, kernel_settings(sampler="grid", trials=400))
    assert outcome.failed == 3
    statuses = {(t["status"], t["reason"]) for t in store.trials(study=outcome.study)}
    assert set(faults.values()) <= statuses
    study = optuna.load_study(study_name=outcome.study, storage=store.url)
    failed = [
        t
        for t in study.trials
        if t.state == optuna.trial.TrialState.FAIL and t.user_attrs["status"] != "repeat"
    ]
    assert {t.user_attrs["reason"] for t in failed} == {r for _, r in faults.values()}
    assert outcome.best is not None and outcome.best.config.digest not in faults


def test_resuming_adds_trials(backend: ReplayBackend, store: TuningStore) -> None:
    problem = backend.problems[0]
    first = tune_problem(problem, backend, store, kernel_settings(trials=8, seed=2))
    second = tune_problem(problem, backend, store, kernel_settings(trials=8, seed=2))
    assert first.study == second.study
    assert first.total_trials == 8 and second.total_trials == 16
    evaluated = [t for t in store.trials(study=first.study) if t["phase"] == "search"]
    configs = [json.dumps(t["config"], sort_keys=True) for t in evaluated]
    assert len(configs) == 16 and len(set(configs)) == 16  # nothing measured twice


def test_measurements_are_reused_not_retimed(backend: ReplayBackend, store: TuningStore) -> None:
    problem = backend.problems[0]
    grid = kernel_settings(sampler="grid", trials=10)
    first = tune_problem(problem, backend, store, grid)
    measured = {c.digest for c in backend.build_calls}
    optuna.delete_study(study_name=first.study, storage=store.url)  # forget the search only
    backend.build_calls.clear()
    again = tune_problem(problem, backend, store, grid)
    # the same ten configs come first again: served from the database, never rebuilt or timed
    assert again.reused == 10 and again.evaluated == 10
    rebuilt = {c.digest for c in backend.build_calls}
    assert len(measured) == 10 and not (
        measured & rebuilt - {r.config.digest for r in again.finalists}
    )
    assert again.best is not None


def test_grid_search_is_exhaustive(backend: ReplayBackend, store: TuningStore) -> None:
    problem = backend.problems[0]
    outcome = tune_problem(problem, backend, store, kernel_settings(sampler="grid", trials=1000))
    valid = len(load_space("sm80").valid_configs(backend.target(), problem.space_values()))
    assert outcome.evaluated == valid
    assert outcome.best is not None and outcome.best.median_us is not None
    # re-ranking serves the recorded medians again, so the winner is the exhaustive best
    assert outcome.best.median_us == pytest.approx(exhaustive_best(backend, problem))


def test_grid_search_stops_when_the_grid_is_done(
    backend: ReplayBackend, store: TuningStore
) -> None:
    """The last batch is not filled up with random proposals: the study holds each valid
    config once and nothing else (the space's valid count is no multiple of the batch)."""
    problem = backend.problems[0]
    valid = len(load_space("sm80").valid_configs(backend.target(), problem.space_values()))
    assert valid % 4, "the last batch is full: the test would prove nothing"
    outcome = tune_problem(
        problem, backend, store, kernel_settings(sampler="grid", trials=1000, batch_size=4)
    )
    study = optuna.load_study(study_name=outcome.study, storage=store.url)
    assert outcome.evaluated == len(study.trials) == valid and outcome.pruned == 0
    assert len({t.user_attrs["digest"] for t in study.trials}) == valid


def test_warm_start_tries_the_nearest_tuned_best_first(
    backend: ReplayBackend, store: TuningStore
) -> None:
    pairs = [
        (a, b)
        for a in backend.problems
        for b in backend.problems
        if a != b and a.space_values() == b.space_values()
    ]
    if not pairs:
        pytest.fail("the recording needs two shapes of one problem class for this test")
    first, second = pairs[0]
    tuned = tune_problem(first, backend, store, kernel_settings(trials=12, seed=5))
    assert tuned.best is not None
    warm = tune_problem(second, backend, store, kernel_settings(trials=4, seed=5))
    study = optuna.load_study(study_name=warm.study, storage=store.url)
    first_trial = min(study.trials, key=lambda t: t.number)
    assert Config.from_json(first_trial.user_attrs["config"]) == tuned.best.config


def test_cli_tune_best_export_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, other = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    recording = json.loads(RECORDING.read_text())
    p = Problem(**recording["shapes"][0]["problem"])
    shape = [
        "--batch",
        str(p.batch),
        "--heads-q",
        str(p.heads_q),
        "--heads-kv",
        str(p.heads_kv),
        "--seqlen-q",
        str(p.seqlen_q),
        "--head-dim",
        str(p.head_dim),
        "--dtype",
        p.dtype,
    ] + (["--causal"] if p.causal else [])
    assert (
        main(["tune", *shape, "--trials", "10", "--replay", str(RECORDING), "--db", db, "--quiet"])
        == 0
    )
    out = capsys.readouterr().out
    assert p.describe() in out and "vs SDPA" in out
    assert main(["best", *shape, "--db", db]) == 0
    assert "exact match" in capsys.readouterr().out
    assert main(["export", "--db", db, "-o", str(tmp_path / "x.json")]) == 0
    assert main(["import", str(tmp_path / "x.json"), "--db", other]) == 0
    assert main(["list", "--db", other]) == 0
    assert p.describe() in capsys.readouterr().out
    answer = best_config(p, db=other)
    assert answer is not None and answer.record.source == "imported"


def trials_to_reach(
    backend: ReplayBackend,
    problem: Problem,
    settings: SearchSettings,
    factor: float,
    tmp_path: Path,
) -> int | None:
    """Evaluated trials until the best so far is within `factor` of the exhaustive best."""
    target = exhaustive_best(backend, problem) * factor
    store = TuningStore(f"sqlite:///{tmp_path}/eff-{settings.seed}-{abs(hash(problem))}.db")
    reached: list[int] = []

    def watch(progress: Any) -> None:
        if progress.best_us is not None and progress.best_us <= target:
            reached.append(progress.evaluated)
            raise _Reached  # the count is known: the rest of the budget would not change it

    try:
        tune_problem(problem, backend, store, settings, on_progress=watch)
    except _Reached:
        pass
    return reached[0] if reached else None


class _Reached(Exception):
    """Raised from the progress callback once the target is reached."""


def quarter(backend: ReplayBackend, problem: Problem) -> int:
    return len(load_space("sm80").valid_configs(backend.target(), problem.space_values())) // 4


def test_search_efficiency_on_the_recorded_sweeps(backend: ReplayBackend, tmp_path: Path) -> None:
    """The default search (TPE, local refinement, the family's default tile tried first)
    reaches within 2% of the exhaustive best within a quarter of the valid configs, on every
    recorded shape, for every seed."""
    misses = []
    for problem in backend.problems:
        for seed in SEEDS:
            settings = kernel_settings(trials=quarter(backend, problem), seed=seed, warm_start=0)
            if trials_to_reach(backend, problem, settings, 1.02, tmp_path) is None:
                misses.append(f"{problem.describe()} seed {seed}")
    assert not misses, misses


def test_search_efficiency_without_the_default_tile(
    backend: ReplayBackend, tmp_path: Path
) -> None:
    """Without the default tile as a first guess the search still gets within 5% of the best in
    a quarter of the space every time, and within 2% in at least three runs out of four."""
    within_2, runs, misses_5 = 0, 0, []
    for problem in backend.problems:
        for seed in range(3):  # a share of runs: every seed, always
            settings = kernel_settings(
                trials=quarter(backend, problem), seed=seed, warm_start=0, seed_heuristic=False
            )
            runs += 1
            if trials_to_reach(backend, problem, settings, 1.02, tmp_path) is not None:
                within_2 += 1
            elif trials_to_reach(backend, problem, settings, 1.05, tmp_path / "5") is None:
                misses_5.append(f"{problem.describe()} seed {seed}")
    assert not misses_5, misses_5
    assert within_2 >= 0.75 * runs, f"within 2% in only {within_2} of {runs} runs"


def test_study_names_are_stable(backend: ReplayBackend) -> None:
    name = study_name(backend.device(), "sm80", Problem(4, 16, 4, 2048, 1024, 128, "bf16", True))
    assert name.endswith("/sm80/bf16-d128-causal-b4-hq16-hkv4-lq2048-lk1024")


def test_every_session_times_sdpa_again(
    backend: ReplayBackend, store: TuningStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The speed-up stored with a best config divides two timings of the same run."""
    problem = backend.problems[0]
    tune_problem(problem, backend, store, kernel_settings(trials=2, seed=0))
    first = store.latest_baselines(backend.device(), problem)["default"].median_us
    recorded = backend.baselines(problem)
    monkeypatch.setattr(
        backend,
        "baselines",
        lambda p: [
            type(b)(b.backend, 2 * b.median_us, 2 * b.p20_us, 2 * b.p80_us) for b in recorded
        ],
    )
    again = tune_problem(problem, backend, store, kernel_settings(trials=2, seed=0))
    assert again.baselines["default"].median_us == 2 * first
    best = store.best(backend.device(), problem)
    assert best is not None and best.sdpa_default_us == 2 * first


class _SdpaBesideFinalists(ReplayBackend):
    """A backend whose re-timing also times SDPA in the same rounds (as the GPU backend's
    does), here slower than the recorded standalone baseline, as under a power cap."""

    def rerank(self, problem: Problem, builds: Any, *, rounds: int, round_ms: float) -> Reranking:
        reranking = super().rerank(problem, builds, rounds=rounds, round_ms=round_ms)
        beside = [
            BaselineTiming(b.backend, b.median_us * 1.25, b.p20_us * 1.25, b.p80_us * 1.25)
            for b in self.baselines(problem)
        ]
        return Reranking(reranking.results, beside)


def test_the_stored_speedup_uses_sdpa_timed_beside_the_finalists(
    recording: dict[str, Any], store: TuningStore
) -> None:
    backend = _SdpaBesideFinalists(recording)
    problem = backend.problems[0]
    standalone = {b.backend: b.median_us for b in backend.baselines(problem)}
    outcome = tune_problem(problem, backend, store, kernel_settings(trials=8, seed=0))
    assert outcome.best is not None and outcome.best.median_us is not None
    beside = standalone["default"] * 1.25
    assert outcome.baselines["default"].median_us == pytest.approx(beside)
    best = store.best(backend.device(), problem)
    assert best is not None
    assert best.sdpa_default_us == pytest.approx(beside)
    assert best.sdpa_flash_us == pytest.approx(standalone["flash"] * 1.25)
    assert best.speedup_vs_default == pytest.approx(beside / outcome.best.median_us)
    # recorded as the newest SDPA timing of the problem
    latest = store.latest_baselines(backend.device(), problem)
    assert latest["default"].median_us == pytest.approx(beside)
