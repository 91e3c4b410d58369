"""Issue 13 items 4 and 5 on the CPU: the regret report (what dispatch runs against the fastest
measured, from the database alone) on the H200 database recorded for issue 13 and on one tuned
here by the replay backend; and `recheck` (re-time each stored winner beside its runners-up and
torch SDPA, decide again only beyond the noise) on the replay backend."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autotune.build.compiler import BuildResult
from autotune.cli.main import main
from autotune.cli.report import (
    NOT_MEASURED,
    RegretRow,
    regret_report,
    report_dispatcher,
    summarize,
)
from autotune.measure.environment import Environment
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import target_for_capability
from autotune.runtime.dispatch import Dispatcher
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore
from autotune.tune.backends import ReplayBackend, Reranking
from autotune.tune.recheck import (
    KEPT_FASTEST,
    KEPT_NOISE,
    REDECIDED,
    recheck,
    runners_up,
    version_changes,
)
from autotune.tune.search import SearchSettings, tune_problem

REPO = Path(__file__).resolve().parents[2]
RECORDED_DB = REPO / "tests" / "data" / "h200_noregret.db"  # issue 13, a real H200
RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"
SETTINGS = SearchSettings(trials=8, seed=0)


# -- report on the recorded H200 database -------------------------------------------------------


@pytest.fixture
def recorded(tmp_path: Path) -> str:
    path = tmp_path / "h200.db"
    shutil.copyfile(RECORDED_DB, path)
    return f"sqlite:///{path}"


def report(url: str) -> list[RegretRow]:
    return regret_report(TuningStore(url, create=False), Dispatcher(url, use_shipped=False))


@pytest.fixture(scope="module")
def recorded_rows(tmp_path_factory: pytest.TempPathFactory) -> list[RegretRow]:
    path = tmp_path_factory.mktemp("recorded") / "h200.db"
    shutil.copyfile(RECORDED_DB, path)
    return report(f"sqlite:///{path}")


def test_report_reads_through_the_store_it_is_given(recorded: str) -> None:
    path = Path(recorded.removeprefix("sqlite:///"))
    before = path.read_bytes()
    store = TuningStore(recorded, create=False)  # read-only
    dispatcher = report_dispatcher(store)
    assert dispatcher.store() is store
    rows = regret_report(store, dispatcher)
    assert len(rows) == 100 and all(r.path == "exact" for r in rows)
    assert path.read_bytes() == before


def test_report_has_a_row_for_every_stored_best(
    recorded: str, recorded_rows: list[RegretRow]
) -> None:
    store = TuningStore(recorded, create=False)
    records = {r.problem: r for r in store.list_best()}
    rows = recorded_rows
    assert len(records) == 100 and {r.problem for r in rows} == set(records)
    assert len(rows) == len(records)
    sdpa_winners = [r for r in rows if records[r.problem].config.family == "sdpa"]
    assert len(sdpa_winners) == 58
    for row in sdpa_winners:  # torch SDPA's winners run exactly as stored
        assert row.path == "exact" and row.config == records[row.problem].config
        assert row.config_name.startswith(f"sdpa_{records[row.problem].config['backend']}_")
    for row in rows:
        assert row.measured and row.timed_from == "measurement"
        assert row.regret is not None and row.regret >= 1.0
        assert row.best_us is not None and row.best_us <= records[row.problem].median_us
    fastest = [r for r in rows if r.dispatched_us == r.best_us]
    assert len(fastest) > 50 and all(r.regret == 1.0 for r in fastest)
    regrets = [r.regret or 0.0 for r in rows]
    assert regrets == sorted(regrets, reverse=True)  # the worst first
    summary = summarize(rows)
    assert (summary.problems, summary.measured) == (100, 100)
    assert summary.worst == regrets[0] and 1.0 <= (summary.geomean or 0) <= regrets[0]


def test_report_times_the_latest_measurement_of_what_dispatch_runs(
    recorded_rows: list[RegretRow],
) -> None:
    # torch's default backend was re-ranked twice on this decode shape (22.5 us, then 33.5 us):
    # dispatch is judged by the latest, the best is the fastest ever measured
    problem = Problem(1, 32, 8, 1, 8192, 128, "bf16", False)
    row = next(r for r in recorded_rows if r.problem == problem)
    assert row.config_name == "sdpa_default_d128_bf16_full"
    assert row.dispatched_us == pytest.approx(33.488, abs=1e-3)
    assert row.best_us == pytest.approx(22.528, abs=1e-3)
    assert row.best_name == row.config_name and row.regret == pytest.approx(33.488 / 22.528)
    assert row.sdpa_default_us == pytest.approx(33.488, abs=1e-3)  # the latest baseline


def test_report_says_when_what_dispatch_runs_was_never_measured(
    recorded: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A release whose sm90 space refuses a stored winner: dispatch passes over it to the sm90
    # built-in default, which was never timed on this problem.
    problem = Problem(16, 16, 16, 512, 512, 64, "fp16", False)
    stored = TuningStore(recorded, create=False).best("NVIDIA H200", problem)
    assert stored is not None and stored.config.family == "sm90"
    space = load_space("sm90")
    allowed = space.violations

    def refuse(config: Config, target: Any) -> list[str]:
        return (
            ["a constraint of a newer release"]
            if config == stored.config
            else (allowed(config, target))
        )

    monkeypatch.setattr(space, "violations", refuse)
    rows = report(recorded)
    row = next(r for r in rows if r.problem == problem)
    assert row.path == "heuristic" and row.config is not None and row.config != stored.config
    assert not row.measured and row.regret is None and row.timed_from == ""
    assert "cannot run here: a constraint of a newer release" in row.reason
    assert row.best_us is not None and row.best_us <= stored.median_us
    assert rows[-1].regret is None  # unmeasured rows come last
    assert summarize(rows).measured < 100
    assert main(["report", "--db", recorded]) == 0
    [line] = [
        x for x in capsys.readouterr().out.splitlines() if x.split("  ")[0] == problem.describe()
    ]
    assert NOT_MEASURED in line and "heuristic" in line


def test_report_cli_json_and_plot(
    recorded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "regret.json", tmp_path / "regret.png"
    assert main(["report", "--db", recorded, "--json", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr()
    assert "NVIDIA H200 (sm_90, 132 SMs)" in printed.out
    assert "100 problems, 100 measured, worst regret 1.487x, geomean regret" in printed.out
    rows = json.loads(out.read_text())
    assert len(rows) == 100 and rows[0]["regret"] == pytest.approx(33.488 / 22.528)
    assert {
        "path",
        "config_name",
        "dispatched_us",
        "best_us",
        "sdpa_default_us",
        "regret",
        "measured",
    } <= set(rows[0])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in printed.err and not png.exists()
    else:
        assert png.stat().st_size > 0


def test_report_of_a_device_without_bests(
    recorded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--db", recorded, "--device", "NVIDIA B200"]) == 0
    assert "no stored best configs" in capsys.readouterr().out


# -- the replay backend: a database tuned here ---------------------------------------------


@pytest.fixture
def recording() -> dict[str, Any]:
    return dict(json.loads(RECORDING.read_text()))


@pytest.fixture
def tuned(tmp_path: Path, recording: dict[str, Any]) -> tuple[TuningStore, Problem]:
    backend = ReplayBackend(recording)
    store = TuningStore(f"sqlite:///{tmp_path}/tune.db")
    problem = backend.problems[0]
    outcome = tune_problem(problem, backend, store, SETTINGS)
    assert outcome.best is not None
    return store, problem


def test_report_of_a_tuned_database(tuned: tuple[TuningStore, Problem]) -> None:
    store, problem = tuned
    dispatcher = Dispatcher(store.url, use_shipped=False)
    [row] = regret_report(store, dispatcher)
    best = store.best(row.device, problem)
    assert best is not None and row.problem == problem
    assert row.path == "exact" and row.config == best.config
    assert row.dispatched_us == best.median_us == row.best_us and row.regret == 1.0
    assert row.sdpa_default_us == best.sdpa_default_us
    # an untuned problem of another region: the no-regret rule sends it to SDPA, no GPU needed
    other = Problem(2, 8, 8, 1, 4096, 64, "bf16", False)
    decision = dispatcher.would_run(other, row.device, target_for_capability(90))
    assert decision.path == "heuristic" and decision.sdpa_backend == "default"


# -- recheck ------------------------------------------------------------------------------------


def scaled(
    recording: dict[str, Any], problem: Problem, name: str, factors: Sequence[float]
) -> dict[str, Any]:
    """A copy of the recording where config `name` (a kernel's name, or an SDPA backend) has
    its median, p20 and p80 multiplied by `factors`."""
    changed = copy.deepcopy(recording)
    shape = next(s for s in changed["shapes"] if Problem(**s["problem"]) == problem)
    row = (
        shape["sdpa"][name]
        if name in shape["sdpa"]
        else next(r for r in shape["configs"] if r["name"] == name)
    )
    for key, factor in zip(("median_us", "p20_us", "p80_us"), factors, strict=True):
        row[key] *= factor
    return changed


def test_recheck_with_the_same_recording_keeps_the_best(
    tuned: tuple[TuningStore, Problem], recording: dict[str, Any]
) -> None:
    store, problem = tuned
    backend = ReplayBackend(recording)
    before = store.best(backend.device(), problem)
    assert before is not None
    [row] = recheck(store, backend)
    assert row.verdict == KEPT_FASTEST and not row.redecided
    assert row.stored == before.config and row.stored_now is not None
    assert row.stored_now.median_us == before.median_us
    assert row.fastest_now is not None and row.fastest_now.config == before.config
    assert row.versions == "unknown"  # replayed timings carry no environment
    after = store.best(backend.device(), problem)
    assert after == before
    rechecked = [t for t in store.trials(problem=problem) if t["phase"] == "recheck"]
    # the winner, its runners-up of the re-ranking and each recorded SDPA backend, once each
    assert len(rechecked) == row.finalists
    configs = {json.dumps(t["config"], sort_keys=True) for t in rechecked}
    assert len(configs) == len(rechecked)
    sdpa = {t["config"]["backend"] for t in rechecked if t["config"]["family"] == "sdpa"}
    assert sdpa == set(recording["shapes"][0]["sdpa"])
    assert any(t["phase"] == "rerank" for t in store.trials(problem=problem))  # both kept


def test_recheck_decides_again_when_a_runner_up_is_faster_beyond_the_noise(
    tuned: tuple[TuningStore, Problem], recording: dict[str, Any]
) -> None:
    store, problem = tuned
    device = ReplayBackend(recording).device()
    before = store.best(device, problem)
    assert before is not None
    others = runners_up(store.latest_rerank(device, problem), before.config)
    assert others and all(c.family == "sm80" for c in others)
    runner = others[-1]  # the slowest runner-up re-ranked, now three times faster
    faster = scaled(recording, problem, load_space("sm80").name_of(runner), (1 / 3,) * 3)
    [row] = recheck(store, ReplayBackend(faster), [problem])
    assert row.verdict == REDECIDED and row.redecided
    assert row.fastest_now is not None and row.fastest_now.config == runner
    after = store.best(device, problem)
    assert after is not None and after.config == runner
    assert after.median_us == row.fastest_now.median_us
    assert after.decision is not None and after.decision.startswith("re-decided by recheck")
    assert after.runner_up_us == before.median_us  # the old winner, timed again beside it
    assert after.sdpa_default_us == before.sdpa_default_us


def test_recheck_keeps_the_best_when_the_change_is_within_the_noise(
    tuned: tuple[TuningStore, Problem], recording: dict[str, Any]
) -> None:
    store, problem = tuned
    device = ReplayBackend(recording).device()
    before = store.best(device, problem)
    assert before is not None and before.config["backend"] == "cudnn"
    sdpa = recording["shapes"][0]["sdpa"]
    cudnn, default = sdpa["cudnn"], sdpa["default"]
    # torch's default now a little faster than cuDNN's, the p20-p80 ranges overlapping
    closer = scaled(
        recording,
        problem,
        "default",
        (
            0.99 * cudnn["median_us"] / default["median_us"],
            0.99 * cudnn["p20_us"] / default["p20_us"],
            cudnn["p80_us"] / default["p80_us"],
        ),
    )
    [row] = recheck(store, ReplayBackend(closer))
    assert row.verdict == KEPT_NOISE
    assert row.fastest_now is not None and row.fastest_now.config["backend"] == "default"
    assert store.best(device, problem) == before
    # beyond the noise the same change decides again, for torch's default
    apart = scaled(recording, problem, "default", (0.8, 0.8, 0.8))
    [row] = recheck(store, ReplayBackend(apart))
    assert row.verdict == REDECIDED
    after = store.best(device, problem)
    assert after is not None and after.config["backend"] == "default"


class VersionedReplay(ReplayBackend):
    """The replay backend with an environment on every timing, as a GPU reports it."""

    def __init__(self, recording: dict[str, Any], env: Environment) -> None:
        super().__init__(recording)
        self.env = env

    def rerank(
        self, problem: Problem, builds: Sequence[BuildResult], *, rounds: int, round_ms: float
    ) -> Reranking:
        timed = super().rerank(problem, builds, rounds=rounds, round_ms=round_ms)
        results = [replace(r, env=self.env) for r in timed.results]
        return Reranking(results, [replace(b, env=self.env) for b in timed.baselines])

    def evaluate(
        self, problem: Problem, build: BuildResult, *, rounds: int, round_ms: float
    ) -> TrialResult:
        result = super().evaluate(problem, build, rounds=rounds, round_ms=round_ms)
        return replace(result, env=self.env)


OLD = Environment("flushed-alternating-1", "580.159.04", "13.0", "2.11.0+cu130", "91900")
NEW = replace(OLD, torch_version="2.12.0+cu130", cudnn_version="92000")


def test_recheck_names_the_versions_that_changed(
    tmp_path: Path, recording: dict[str, Any]
) -> None:
    store = TuningStore(f"sqlite:///{tmp_path}/v.db")
    problem = ReplayBackend(recording).problems[0]
    tune_problem(problem, VersionedReplay(recording, OLD), store, SETTINGS)
    assert store.best_environment(ReplayBackend(recording).device(), problem) == OLD
    [row] = recheck(store, VersionedReplay(recording, NEW))
    assert row.then == OLD and row.now == NEW
    assert row.versions == "torch 2.11.0+cu130 -> 2.12.0+cu130; cuDNN 91900 -> 92000"
    apart = scaled(recording, problem, "default", (0.8, 0.8, 0.8))
    [row] = recheck(store, VersionedReplay(apart, NEW))
    best = store.best(row.device, problem)
    assert row.verdict == REDECIDED and best is not None and best.decision is not None
    assert best.decision.endswith(
        "versions: torch 2.11.0+cu130 -> 2.12.0+cu130; cuDNN 91900 -> 92000"
    )
    assert (best.torch_version, best.cudnn_version) == ("2.12.0+cu130", "92000")


def test_version_changes(recorded: str) -> None:
    assert version_changes(OLD, OLD) == "unchanged"
    assert version_changes(OLD, replace(OLD, torch_version="2.12.0")) == (
        "torch 2.11.0+cu130 -> 2.12.0"
    )
    assert version_changes(OLD, replace(OLD, driver_version="590.1", cuda_version="13.1")) == (
        "driver 580.159.04 -> 590.1; CUDA 13.0 -> 13.1"
    )
    assert version_changes(None, OLD) == version_changes(OLD, None) == "unknown"
    # a best row keeps only torch and cuDNN: only those are compared
    kept = Environment(torch_version="2.11.0+cu130", cudnn_version="91900")
    assert version_changes(kept, NEW) == "torch 2.11.0+cu130 -> 2.12.0+cu130; cuDNN 91900 -> 92000"
    assert version_changes(Environment(), NEW) == "unknown"
    # the recorded H200 database: the winner's measurement holds all four
    store = TuningStore(recorded, create=False)
    record = store.list_best()[0]
    then = store.best_environment(record.device, record.problem)
    assert then is not None and then.software() == ("580.159.04", "13.0", "2.11.0+cu130", "91900")


def test_recheck_cli_with_replay(
    tuned: tuple[TuningStore, Problem], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, problem = tuned
    out = tmp_path / "recheck.json"
    assert (
        main(
            [
                "recheck",
                "--db",
                store.url,
                "--replay",
                str(RECORDING),
                "--rounds",
                "3",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert problem.describe() in printed and KEPT_FASTEST in printed and "unknown" in printed
    assert "1 stored bests of NVIDIA H200 (sm_90, 132 SMs) rechecked, 0 re-decided" in printed
    [row] = json.loads(out.read_text())
    assert row["verdict"] == KEPT_FASTEST and row["versions"] == "unknown"
    # --shapes: a shape set without the tuned problem leaves nothing to recheck
    shapes = tmp_path / "other.toml"
    shapes.write_text(
        'dtypes = ["bf16"]\nhead_dims = [64]\ncausal = [true]\n'
        "[[shapes]]\nbatch = 1\nheads_q = 8\nseqlen = 512\n"
    )
    assert (
        main(["recheck", "--db", store.url, "--replay", str(RECORDING), "--shapes", str(shapes)])
        == 0
    )
    assert "no stored best of NVIDIA H200" in capsys.readouterr().out
