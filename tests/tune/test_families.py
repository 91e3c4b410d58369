"""The kernel family as a search dimension, end to end on the replay backend: the recorded sm80
sweep of the H200 plus a small synthetic sm90 recording made here, a real SQLite file, the
CLI, and dispatch (kernel loading stubbed as in tests/runtime/test_dispatch.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.cli.main import main
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import target_for_arch
from autotune.runtime import dispatch as dispatch_module
from autotune.runtime.dispatch import Dispatcher
from autotune.store.repo import TuningStore
from autotune.tune.backends import ReplayBackend
from autotune.tune.search import SearchSettings, families_to_search, study_name, tune_problem


def kernel_settings(**values: object) -> SearchSettings:
    """Settings of a session studying the kernels' search alone: torch SDPA's backends out of
    the final re-ranking (tests/tune/test_no_regret.py covers them in it)."""
    return SearchSettings(sdpa_finalists=False, **values)  # type: ignore[arg-type]


REPO = Path(__file__).resolve().parents[2]
SM80_RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"
H200 = target_for_arch(90)
RECORDED_SM90 = 6  # configs of the synthetic sm90 recording


@pytest.fixture(scope="module")
def sm80() -> dict[str, Any]:
    return json.loads(SM80_RECORDING.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def problem(sm80: dict[str, Any]) -> Problem:
    return Problem(**sm80["shapes"][0]["problem"])


def sm80_medians(sm80: dict[str, Any], problem: Problem) -> list[float]:
    shape = next(s for s in sm80["shapes"] if Problem(**s["problem"]) == problem)
    return [r["median_us"] for r in shape["configs"] if r.get("median_us")]


def sm90_recording(
    sm80: dict[str, Any], problem: Problem, *, fastest_us: float, others_us: float
) -> dict[str, Any]:
    """A recording in benchmarks/sweep.py's format of the first few valid sm90 configs of the
    problem: the fourth at `fastest_us`, one that failed to compile, the rest at `others_us`
    and slower."""
    space = load_space("sm90")
    shape = next(s for s in sm80["shapes"] if Problem(**s["problem"]) == problem)
    rows = []
    for i, config in enumerate(space.valid_configs(H200, problem.space_values())[:RECORDED_SM90]):
        row: dict[str, Any] = {"name": space.name_of(config), "config": config.as_dict()}
        if i == 1:
            row.update(status="compile_error", reason="ptxas: too many resources requested")
        else:
            us = fastest_us if i == 3 else others_us * (1 + 0.05 * i)
            row.update(
                status="ok",
                registers=168,
                spill_stores=0,
                spill_loads=0,
                rel_err_vs_sdpa=3e-4,
                median_us=us,
                p20_us=0.99 * us,
                p80_us=1.01 * us,
                tflops=problem.tflops(us),
            )
        rows.append(row)
    return {
        "gpu": sm80["gpu"],
        "device": sm80["device"],
        "family": "sm90",
        "command": "synthetic (tests/tune/test_families.py)",
        "shapes": [
            {
                "problem": problem.as_dict(),
                "flops": problem.flops,
                "sdpa": shape["sdpa"],
                "configs": rows,
            }
        ],
    }


def fast_sm90_config(problem: Problem) -> Config:
    return load_space("sm90").valid_configs(H200, problem.space_values())[3]


def shape_args(p: Problem) -> list[str]:
    return [
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
        *(["--causal"] if p.causal else []),
    ]


def study_families(url: str) -> set[str]:
    return {name.split("/")[1] for name in optuna.get_all_study_names(storage=url)}


class FakeKernel:
    def __init__(self, config: Config) -> None:
        self.config = config


def stub_dispatcher(db: str, monkeypatch: pytest.MonkeyPatch, device: Any) -> Dispatcher:
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [])
    d = Dispatcher(db)
    d._identify = lambda index: (device, H200)  # type: ignore[method-assign]
    d._load = lambda config, target, index, problems: FakeKernel(config)  # type: ignore[method-assign,assignment]
    return d


def test_families_follow_the_target_and_the_recordings(
    sm80: dict[str, Any], problem: Problem
) -> None:
    fast = sm90_recording(sm80, problem, fastest_us=100.0, others_us=500.0)
    assert ReplayBackend(sm80).families() == ["sm80"]
    both = ReplayBackend([sm80, fast])
    assert both.families() == ["sm80", "sm90"]
    assert families_to_search(both) == ["sm80", "sm90"]
    assert families_to_search(both, ["sm90", "sm90"]) == ["sm90"]
    a100 = {
        **sm80,
        "device": {
            **sm80["device"],
            "name": "NVIDIA A100-SXM4-80GB",
            "compute_capability": 80,
            "sm_count": 108,
            "max_smem_per_block": 166912,
        },
    }
    with pytest.raises(ValueError, match="family sm90 runs on sm_90 only; .* is sm_80"):
        families_to_search(ReplayBackend(a100), ["sm90"])
    with pytest.raises(ValueError, match="recordings of different GPUs"):
        ReplayBackend([a100, fast])
    # each config is served from its own family's recording; an unrecorded one fails to build
    config80 = Config.from_dict(sm80["shapes"][0]["configs"][0]["config"])
    fast90, unrecorded = (
        load_space("sm90").valid_configs(H200, problem.space_values())[i]
        for i in (3, RECORDED_SM90)
    )
    built = {b.config: b for b in both.build([config80, fast90, unrecorded])}
    assert built[config80].ok and built[fast90].ok
    assert built[unrecorded].status == "compile_error"
    assert built[unrecorded].message == "not recorded"
    assert both.evaluate(problem, built[fast90], rounds=1, round_ms=1).median_us == 100.0
    lone = ReplayBackend(sm80).build([fast90])[0]
    assert lone.status == "compile_error" and "no sm90 recording" in lone.message


def test_the_fastest_family_wins_and_dispatch_runs_it(
    sm80: dict[str, Any],
    problem: Problem,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    best80 = min(sm80_medians(sm80, problem))
    recording = tmp_path / "sweep_sm90.json"
    recording.write_text(
        json.dumps(sm90_recording(sm80, problem, fastest_us=best80 / 1.25, others_us=2 * best80))
    )
    db = f"sqlite:///{tmp_path}/two.db"
    out_json = tmp_path / "tune.json"
    assert (
        main(
            [
                "tune",
                "--without-sdpa",
                *shape_args(problem),
                "--replay",
                str(SM80_RECORDING),
                "--replay",
                str(recording),
                "--sampler",
                "grid",
                "--trials",
                "8",
                "--db",
                db,
                "--json",
                str(out_json),
                "--quiet",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    winner = fast_sm90_config(problem)
    name = load_space("sm90").name_of(winner)
    lines = table.splitlines()  # the winner's row, its config name on the line below it
    row = next(i for i, line in enumerate(lines) if "  sm90 *  " in line)
    assert lines[row + 1].strip() == f"best config: {name}"
    assert "sm80  " in table and "fwd_sm80_" in table  # the other family's best is still shown
    assert "* the problem's best config" in table
    assert study_families(db) == {"sm80", "sm90"}

    (outcome,) = json.loads(out_json.read_text())
    assert outcome["family"] == "sm90" and Config.from_dict(outcome["config"]) == winner
    per_family = outcome["families"]
    assert set(per_family) == {"sm80", "sm90"}
    assert per_family["sm90"]["median_us"] == pytest.approx(best80 / 1.25)
    assert per_family["sm80"]["config"]["family"] == "sm80"
    assert per_family["sm80"]["median_us"] > per_family["sm90"]["median_us"]
    assert per_family["sm80"]["evaluated_now"] == per_family["sm90"]["evaluated_now"] == 8
    # two of the first eight sm90 configs are not recorded and one failed to compile
    assert per_family["sm90"]["failed_now"] == 3 and per_family["sm80"]["failed_now"] == 0

    store = TuningStore(db)
    record = store.best(ReplayBackend(sm80).device(), problem)
    assert record is not None and record.config == winner and record.config.family == "sm90"
    assert record.study.split("/")[1] == "sm90" and record.trials == 16
    with store.engine.connect() as c:
        assert c.exec_driver_sql("SELECT family FROM best_configs").scalars().all() == ["sm90"]
    with store.engine.connect() as c:  # builds (ptxas report) are kept for both families
        builds = set(
            c.exec_driver_sql(
                "SELECT k.family, b.registers, b.spill_store_bytes FROM builds b "
                "JOIN kernel_configs k ON k.id = b.config_id"
            ).all()
        )
    assert ("sm90", 168, 0) in builds and {f for f, _, _ in builds} == {"sm80", "sm90"}
    reranked = [t for t in store.trials() if t["phase"] == "rerank"]
    assert {t["config"]["family"] for t in reranked} == {"sm80", "sm90"}
    assert all(t["study"].split("/")[1] == t["config"]["family"] for t in reranked)

    assert (
        main(["best", *shape_args(problem), "--db", db, "--json", str(tmp_path / "best.json")])
        == 0
    )
    out = capsys.readouterr().out
    assert "exact match" in out and f"family: sm90 ({name})" in out
    assert json.loads((tmp_path / "best.json").read_text())["family"] == "sm90"
    assert main(["list", "--db", db]) == 0
    lines = capsys.readouterr().out.splitlines()  # the row names the family, the next its config
    row = next(i for i, line in enumerate(lines) if "  sm90  " in line)
    assert lines[row + 1].strip() == f"best config: {name}"

    d = stub_dispatcher(db, monkeypatch, ReplayBackend(sm80).device())
    decision = d.decide(problem, 0)
    assert decision.path == "exact" and decision.config == winner
    assert isinstance(decision.kernel, FakeKernel) and decision.kernel.config == winner
    assert decision.measured_us == pytest.approx(best80 / 1.25)


def test_a_slower_family_loses(
    sm80: dict[str, Any], problem: Problem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # slower than every recorded sm80 config: whatever the sm80 search finds beats it
    worst80 = max(sm80_medians(sm80, problem))
    slow = sm90_recording(sm80, problem, fastest_us=1.1 * worst80, others_us=1.2 * worst80)
    backend = ReplayBackend([sm80, slow])
    store = TuningStore(f"sqlite:///{tmp_path}/slow.db")
    outcome = tune_problem(problem, backend, store, kernel_settings(trials=10, seed=0))
    assert outcome.best is not None and outcome.best.config.family == "sm80"
    sm90 = outcome.family("sm90")
    assert sm90 is not None and sm90.evaluated == 10  # searched, with its own budget
    # each family's static constraints pruned its own proposals before any build
    assert sm90.pruned > 0 and outcome.family("sm80").pruned > 0  # type: ignore[union-attr]
    assert {c.family for c in backend.build_calls} == {"sm80", "sm90"}
    assert all(load_space(c.family).is_valid(c, H200) for c in backend.build_calls)
    assert outcome.evaluated == 20 and outcome.study == outcome.family("sm80").study  # type: ignore[union-attr]
    if sm90.best is not None:  # its finalists were re-timed with sm80's, and lost
        assert sm90.best.median_us > outcome.best.median_us  # type: ignore[operator]
    record = store.best(backend.device(), problem)
    assert record is not None and record.config.family == "sm80"
    d = stub_dispatcher(store.url, monkeypatch, backend.device())
    assert d.decide(problem, 0).config == outcome.best.config


def test_one_family_asked_for_searches_only_that_family(
    sm80: dict[str, Any], problem: Problem, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recording = tmp_path / "sweep_sm90.json"
    recording.write_text(
        json.dumps(sm90_recording(sm80, problem, fastest_us=50.0, others_us=100.0))
    )
    db = f"sqlite:///{tmp_path}/one.db"
    replay = ["--replay", str(SM80_RECORDING), "--replay", str(recording)]
    assert (
        main(
            [
                "tune",
                "--without-sdpa",
                *shape_args(problem),
                *replay,
                "--family",
                "sm80",
                "--trials",
                "6",
                "--db",
                db,
                "--quiet",
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert study_families(db) == {"sm80"}  # on an sm_90 target, yet no sm90 study
    assert "fwd_sm90_" not in table and "*" not in table
    assert {t["config"]["family"] for t in TuningStore(db).trials()} == {"sm80"}
    # a comma list searches both; the sm80 best tuned above competes again and loses
    assert (
        main(
            [
                "tune",
                "--without-sdpa",
                *shape_args(problem),
                *replay,
                "--family",
                "sm80,sm90",
                "--trials",
                "6",
                "--sampler",
                "grid",
                "--db",
                db,
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert study_families(db) == {"sm80", "sm90"}
    record = TuningStore(db).best(None, problem)
    assert record is not None and record.config == fast_sm90_config(problem)
    assert main(["tune", *shape_args(problem), *replay, "--family", "sm70", "--db", db]) == 2
    assert "unknown kernel family 'sm70'" in capsys.readouterr().err


def test_tuning_one_family_again_cannot_replace_a_faster_one(
    sm80: dict[str, Any], problem: Problem, tmp_path: Path
) -> None:
    best80 = min(sm80_medians(sm80, problem))
    backend = ReplayBackend(
        [sm80, sm90_recording(sm80, problem, fastest_us=best80 / 1.25, others_us=2 * best80)]
    )
    store = TuningStore(f"sqlite:///{tmp_path}/again.db")
    grid = kernel_settings(sampler="grid", trials=8)
    first = tune_problem(problem, backend, store, grid)
    assert first.best is not None and first.best.config.family == "sm90"
    again = tune_problem(problem, backend, store, kernel_settings(trials=6), families=["sm80"])
    assert [f.family for f in again.families] == ["sm80"]
    # the stored sm90 best was re-timed beside the sm80 finalists and kept its place
    assert again.best is not None and again.best.config == first.best.config
    assert any(r.config.family == "sm90" for r in again.finalists)
    assert store.best(backend.device(), problem).config == first.best.config  # type: ignore[union-attr]


def test_warm_start_enqueues_only_the_searched_family(
    sm80: dict[str, Any], tmp_path: Path
) -> None:
    backend = ReplayBackend(sm80)
    pairs = [
        (a, b)
        for a in backend.problems
        for b in backend.problems
        if a != b and a.space_values() == b.space_values()
    ]
    first, second = pairs[0]
    store = TuningStore(f"sqlite:///{tmp_path}/warm.db")
    # the nearest tuned problem's best is an sm90 config (imported from elsewhere)
    sm90_best = load_space("sm90").valid_configs(H200, first.space_values())[0]
    from autotune.store.records import TrialResult

    store.set_best(
        backend.device(),
        first,
        TrialResult(sm90_best, "ok", median_us=1.0),
        measurement_id=None,
        study="imported",
        trials=1,
        sdpa_default_us=None,
        sdpa_flash_us=None,
        source="imported",
    )
    warm = tune_problem(second, backend, store, kernel_settings(trials=4, seed=5))
    study = optuna.load_study(study_name=warm.study, storage=store.url)
    tried = [Config.from_json(t.user_attrs["config"]) for t in study.trials]
    assert all(c.family == "sm80" for c in tried)
    # the first trial is the sm80 default tile, not a translation of the sm90 config
    assert tried[0] == load_space("sm80").heuristic(second.space_values())


def test_a_session_in_pieces_narrows_the_set_and_skips_per_family(
    sm80: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tune --shapes SET --head-dim D --skip-tuned`, run again with another family: the second
    run searches only the new family, and a third run has nothing left to do."""
    full, causal = (Problem(**s["problem"]) for s in sm80["shapes"][:2])
    assert (full.head_dim, full.causal, causal.causal) == (128, False, True)
    shapes = tmp_path / "pieces.toml"
    shapes.write_text(
        f'name = "pieces"\ndtypes = ["{full.dtype}"]\nhead_dims = [128, 64]\n'
        "causal = [false, true]\n"
        f"shapes = [{{ batch = {full.batch}, heads_q = {full.heads_q}, "
        f"seqlen = {full.seqlen_q} }}]\n"
    )
    sm90 = sm90_recording(sm80, full, fastest_us=50.0, others_us=100.0)
    sm90["shapes"] += sm90_recording(sm80, causal, fastest_us=50.0, others_us=100.0)["shapes"]
    recording = tmp_path / "sweep_sm90.json"
    recording.write_text(json.dumps(sm90))
    db = f"sqlite:///{tmp_path}/pieces.db"
    base = [
        "tune",
        "--shapes",
        str(shapes),
        "--head-dim",
        "128",
        "--skip-tuned",
        "--trials",
        "6",
        "--sampler",
        "grid",
        "--replay",
        str(SM80_RECORDING),
        "--replay",
        str(recording),
        "--db",
        db,
        "--quiet",
        "--without-sdpa",
    ]

    def tuned(family: str, out: str) -> list[dict[str, Any]]:
        assert main([*base, "--family", family, "--json", str(tmp_path / out)]) == 0
        capsys.readouterr()
        path = tmp_path / out
        return json.loads(path.read_text()) if path.exists() else []

    first = tuned("sm80", "first.json")
    assert len(first) == 2  # the D=64 problems of the set were left out (not recorded either)
    assert study_families(db) == {"sm80"}
    assert tuned("sm80", "again.json") == []  # nothing left for sm80
    # ... unless the kernel changed: a build key other than the searched trials' means the
    # stored timings are of another kernel, and --skip-tuned searches the family again.
    store = TuningStore(db)
    device = store.best(None, full).device  # type: ignore[union-attr]
    study = study_name(device, "sm80", full)
    assert store.family_tuned(device, full, study, current_key=lambda c: f"replay-{c.digest}")
    assert not store.family_tuned(device, full, study, current_key=lambda c: "kernel-v2")
    assert store.family_tuned(device, full, study)  # no key given: the old answer

    def sm80_searches() -> int:
        return len(
            [
                t
                for t in TuningStore(db).trials()
                if t["config"]["family"] == "sm80" and t["phase"] == "search"
            ]
        )

    searched = sm80_searches()
    second = tuned("sm80,sm90", "second.json")
    assert len(second) == 2 and study_families(db) == {"sm80", "sm90"}
    assert sm80_searches() == searched  # sm80's best only defended its place in the re-timing
    for p in (full, causal):
        assert TuningStore(db).best(None, p).config.family == "sm90"  # type: ignore[union-attr]
    assert tuned("sm80,sm90", "third.json") == []
    assert (
        main(
            [
                *base[:5],
                "--dtype",
                "bf16" if full.dtype == "fp16" else "fp16",
                "--replay",
                str(SM80_RECORDING),
                "--db",
                db,
            ]
        )
        == 2
    )
    assert "no problem of shape set" in capsys.readouterr().err


def test_the_decode_family_is_searched_on_decode_problems_only() -> None:
    """Every family the GPU runs is searched by default, but the decode family only where the
    query is a few tokens (its space's max_seqlen_q); asked for by name it is searched anyway."""

    class AllFamilies:
        def target(self) -> Any:
            return target_for_arch("sm_90")

        def families(self) -> list[str]:
            return ["decode", "sm80", "sm90"]

    backend: Any = AllFamilies()
    decode = Problem(8, 32, 8, 16, 32768, 128, "bf16", True)
    prefill = Problem(2, 16, 16, 2048, 2048, 128, "bf16", False)
    assert families_to_search(backend, None, decode) == ["decode", "sm80", "sm90"]
    assert families_to_search(backend, None, prefill) == ["sm80", "sm90"]
    assert families_to_search(backend, ["decode"], prefill) == ["decode"]
