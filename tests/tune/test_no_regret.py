"""Issue 13 on the CPU: torch SDPA as the `sdpa` family of the search (a finalist of every
re-ranking, stored as the best where it wins), the tie rule, what dispatch runs for SDPA
winners and untuned problems (the no-regret rule), the llm-decode shape set, and the stored
environment and decision surviving export and import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.build.compiler import BuildResult
from autotune.build.cubin import LaunchInfo
from autotune.build.ptxas import PtxasReport
from autotune.measure.environment import Environment
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.shapes import load_shape_set
from autotune.model.space import load_space
from autotune.model.target import target_for_arch
from autotune.runtime import dispatch as dispatch_module
from autotune.runtime.dispatch import Dispatcher, lq_bucket
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore
from autotune.tune.backends import ReplayBackend
from autotune.tune.search import SearchSettings, _Reranked, choose_winner, tune_problem

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"
H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
P = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)


def sdpa(problem: Problem, backend: str = "default") -> Config:
    return load_space("sdpa").config(**problem.space_values(), backend=backend)


def sm80(problem: Problem, **tile: Any) -> Config:
    values = {
        "block_m": 128,
        "block_n": 64,
        "num_warps": 8,
        "kv_stages": 3,
        "swizzle": 3,
        "q_in_regs": True,
        **tile,
    }
    return load_space("sm80").config(**problem.space_values(), **values)


@pytest.fixture
def recording() -> dict[str, Any]:
    return dict(json.loads(RECORDING.read_text()))


def test_sdpa_is_a_finalist_and_wins_where_it_is_faster(
    tmp_path: Path, recording: dict[str, Any]
) -> None:
    backend = ReplayBackend(recording)
    store = TuningStore(f"sqlite:///{tmp_path}/t.db")
    problem = backend.problems[0]
    outcome = tune_problem(problem, backend, store, SearchSettings(trials=8, seed=0))
    rerank = [t for t in store.trials(problem=problem) if t["phase"] == "rerank"]
    backends = {t["config"]["backend"] for t in rerank if t["config"]["family"] == "sdpa"}
    assert backends == set(recording["shapes"][0]["sdpa"])  # every recorded backend re-ranked
    fastest = min(t["median_us"] for t in rerank if t["status"] == "ok")
    assert outcome.best is not None and outcome.best.median_us == fastest
    best = store.best(H200, problem)
    assert best is not None and best.config == outcome.best.config
    assert best.config.family == "sdpa"  # cuDNN's Hopper kernel beats sm80 on an H200
    assert best.decision and best.speedup_vs_default and best.speedup_vs_default >= 1.0
    # studying the kernels alone leaves SDPA out, as before
    alone = tune_problem(
        problem,
        backend,
        TuningStore(f"sqlite:///{tmp_path}/k.db"),
        SearchSettings(trials=8, seed=0, sdpa_finalists=False),
    )
    assert alone.best is not None and alone.best.config.family == "sm80"


def test_family_sdpa_alone_only_reranks_the_backends(
    tmp_path: Path, recording: dict[str, Any]
) -> None:
    backend = ReplayBackend(recording)
    store = TuningStore(f"sqlite:///{tmp_path}/t.db")
    problem = backend.problems[0]
    outcome = tune_problem(problem, backend, store, families=["sdpa"])
    assert outcome.best is not None and outcome.best.config.family == "sdpa"
    assert outcome.evaluated == 0 and all(c.family == "sdpa" for c in backend.build_calls)
    assert all(t["phase"] == "rerank" for t in store.trials(problem=problem))


def reranked(config: Config, median: float, p20: float, p80: float) -> _Reranked:
    return _Reranked(TrialResult(config, "ok", median_us=median, p20_us=p20, p80_us=p80), 0, "s")


def build(config: Config, registers: int, smem: int) -> BuildResult:
    ptxas = PtxasReport("cute_autotune_fwd", "sm_90", registers, 0, 0, 0, 0, 1)
    info = LaunchInfo(1, 80, 128, 0, 0, 128, 64, 128, smem)
    return BuildResult(config, "sm_90", "ok", key="k", ptxas=ptxas, launch_info=info)


def test_ranges_apart_the_fastest_wins() -> None:
    fast, slow = sm80(P), sm80(P, num_warps=4)
    winner, decision, other = choose_winner(
        [reranked(slow, 110, 108, 112), reranked(fast, 100, 99, 101)]
    )
    assert winner is not None and winner.result.config == fast
    assert decision.startswith("fastest: 10.0% ahead") and other is not None


def test_a_tie_goes_to_sdpa() -> None:
    kernel, torch_sdpa = sm80(P), sdpa(P, "cudnn")
    winner, decision, other = choose_winner(
        [reranked(kernel, 100, 98, 103), reranked(torch_sdpa, 101, 99, 104)]
    )
    assert winner is not None and winner.result.config == torch_sdpa
    assert "torch SDPA preferred" in decision and other is not None
    assert other.config == kernel


def test_a_tie_between_kernels_goes_to_fewer_registers_and_less_shared_memory() -> None:
    heavy, light = sm80(P), sm80(P, num_warps=4, kv_stages=2)
    ranks = [reranked(heavy, 100, 98, 103), reranked(light, 101, 99, 104)]
    builds = {heavy.digest: build(heavy, 255, 98304), light.digest: build(light, 168, 65536)}
    winner, decision, _ = choose_winner(ranks, builds)
    assert winner is not None and winner.result.config == light
    assert "fewer registers and less shared memory (168 regs, 65536 B" in decision
    assert "tie with fwd_sm80" in decision and load_space("sm80").name_of(heavy) in decision
    # neither uses fewer of both: the faster median stays
    builds[light.digest] = build(light, 168, 131072)
    winner, decision, _ = choose_winner(ranks, builds)
    assert winner is not None and winner.result.config == heavy
    assert "neither uses fewer resources" in decision


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [])

    def factory(**kwargs: Any) -> Dispatcher:
        d = Dispatcher(f"sqlite:///{tmp_path}/user.db", **kwargs)
        d._identify = lambda index: (H200, target_for_arch(90))  # type: ignore[method-assign]
        d._load = lambda config, target, index, problems: config  # type: ignore[method-assign,assignment]
        return d

    return factory


def store_best(db: str, problem: Problem, config: Config, us: float, sdpa_us: float) -> None:
    TuningStore(db).set_best(
        H200,
        problem,
        TrialResult(config, "ok", median_us=us),
        measurement_id=None,
        study="s",
        trials=1,
        sdpa_default_us=sdpa_us,
        sdpa_flash_us=None,
        decision="fastest",
    )


def test_dispatch_runs_an_sdpa_winner_and_its_nearest_neighbours(make) -> None:  # type: ignore[no-untyped-def]
    d = make()
    store_best(d.db, P, sdpa(P, "cudnn"), 200.0, 210.0)
    exact = d.decide(P, 0)
    assert exact.path == "exact" and exact.sdpa_backend == "cudnn" and exact.kernel is None
    assert "torch SDPA (cudnn backend)" in exact.describe() and "fastest" in exact.describe()
    near = d.decide(Problem(2, 16, 16, 4096, 4096, 128, "fp16", False), 0)
    assert near.path == "nearest" and near.sdpa_backend == "cudnn"


def test_untuned_regions_go_to_sdpa_until_a_kernel_is_measured_faster(make) -> None:  # type: ignore[no-untyped-def]
    d = make()
    untuned = d.decide(P, 0)
    assert untuned.path == "heuristic" and untuned.sdpa_backend == "default"
    assert "no kernel family was measured faster than torch SDPA" in untuned.reason
    # a kernel measured faster than SDPA in the region (D=128 fp16 non-causal, Lq > 128)
    other = Problem(1, 16, 16, 8192, 8192, 128, "fp16", False)
    store_best(d.db, other, sm80(other), 100.0, 120.0)
    d.clear()
    near = d.decide(P, 0)
    assert near.path == "nearest" and near.config is not None
    assert near.config.family == "sm80"
    # the same kernel region rule keeps a decode shape off prefill kernels
    decode = Problem(4, 16, 16, 1, 8192, 128, "fp16", False)
    decision = d.decide(decode, 0)
    assert decision.sdpa_backend == "default" and decision.path == "heuristic"
    assert any("never measured faster than torch SDPA" in s for s in decision.skipped)
    # with the kernels' defaults asked for, untuned problems run them as before
    kernel = make(untuned="kernel").decide(Problem(4, 16, 16, 2048, 2048, 64, "bf16", True), 0)
    assert kernel.path == "heuristic" and kernel.config is not None
    assert kernel.config.family == "sm90"


def test_a_kernel_slower_than_sdpa_does_not_open_its_region(make) -> None:  # type: ignore[no-untyped-def]
    d = make()
    other = Problem(1, 16, 16, 8192, 8192, 128, "fp16", False)
    store_best(d.db, other, sm80(other), 130.0, 120.0)  # 0.92x of SDPA: not faster
    decision = d.decide(P, 0)
    assert decision.sdpa_backend == "default"


def test_lq_buckets() -> None:
    assert [lq_bucket(n) for n in (1, 2, 16, 17, 128, 129, 8192)] == [
        "1",
        "2-16",
        "2-16",
        "17-128",
        "17-128",
        ">128",
        ">128",
    ]


def test_llm_decode_shape_set() -> None:
    problems = load_shape_set("llm-decode")
    assert len(problems) == 36 and len(set(problems)) == 36
    for p in problems:
        assert 2 * 2 * p.batch * p.heads_kv * p.seqlen_k * p.head_dim <= 16 * 2**30
        assert p.causal == (p.seqlen_q > 1)
    grid = [p for p in problems if (p.head_dim, p.dtype) == (128, "bf16") and p.heads_kv == 8]
    assert len(grid) == 2 * 3 * 2 * 3 - 4  # B64 with a 128k cache exceeds 16 GiB
    extra = [p for p in problems if p not in grid]
    assert {p.head_dim for p in extra} == {64, 128} and "fp16" in {p.dtype for p in extra}
    assert any(p.heads_q == p.heads_kv == 32 for p in extra)


def test_environment_decision_and_spread_survive_export_and_import(tmp_path: Path) -> None:
    source = TuningStore(f"sqlite:///{tmp_path}/a.db")
    env = Environment(
        "flushed-alternating-1", "580.159.04", "13.0", "2.11.0+cu130", "91900", 1755.0, 690.0
    )
    result = TrialResult(
        sdpa(P, "cudnn"), "ok", median_us=200.0, p20_us=198.0, p80_us=203.0, env=env
    )
    source.set_best(
        H200,
        P,
        result,
        measurement_id=None,
        study="s",
        trials=1,
        sdpa_default_us=205.0,
        sdpa_flash_us=400.0,
        decision="tie: torch SDPA preferred",
        runner_up_us=201.0,
    )
    exported = source.export()
    entry = exported["results"][0]
    assert (entry["torch_version"], entry["cudnn_version"], entry["regime"]) == (
        "2.11.0+cu130",
        "91900",
        "flushed-alternating-1",
    )
    target = TuningStore(f"sqlite:///{tmp_path}/b.db")
    target.import_results(json.loads(json.dumps(exported)))
    best = target.best(H200, P)
    assert best is not None and best.config == sdpa(P, "cudnn")
    assert (best.p20_us, best.p80_us, best.runner_up_us) == (198.0, 203.0, 201.0)
    assert best.decision == "tie: torch SDPA preferred" and best.torch_version == "2.11.0+cu130"


def test_measurements_keep_their_environment(tmp_path: Path) -> None:
    store = TuningStore(f"sqlite:///{tmp_path}/a.db")
    env = Environment(
        "flushed-alternating-1", "580.159.04", "13.0", "2.11.0", "91900", 1600.0, 700.0
    )
    store.record_trial(
        H200,
        P,
        TrialResult(sm80(P), "ok", median_us=300.0, p20_us=299.0, p80_us=302.0, env=env),
        build=None,
        study="s",
        phase="rerank",
        baseline_us=280.0,
    )
    found = store.find_trial(H200, P, sm80(P), None)
    assert found is not None and found.env == env
