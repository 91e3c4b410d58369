"""Dispatch decisions on the CPU: the GPU identity and kernel loading are stubbed, everything
else (database, shipped defaults, space, heuristic, memo) is real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune._paths import shipped_results_files
from autotune.model.buckets import representative
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import Target, target_for_arch
from autotune.runtime import dispatch as dispatch_module
from autotune.runtime.dispatch import Dispatcher
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore, problem_distance

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
P = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)


class FakeKernel:
    def __init__(self, config: Config) -> None:
        self.config = config


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [])

    def factory(target_cc: int = 90, **kwargs: Any) -> Dispatcher:
        # The kernels' built-in defaults on untuned problems, as before the no-regret rule
        # (tests/tune/test_no_regret.py covers the rule itself).
        d = Dispatcher(f"sqlite:///{tmp_path}/user.db", **{"untuned": "kernel", **kwargs})
        target = (
            target_for_arch(target_cc)
            if target_cc >= 80
            else Target(target_cc, 65536, f"sm_{target_cc}")
        )
        d._identify = lambda index: (H200, target)  # type: ignore[method-assign]
        d._load = lambda config, target, index, problems: FakeKernel(config)  # type: ignore[method-assign,assignment]
        return d

    return factory


def tuned(db: str, problem: Problem, us: float, **tile: object) -> Config:
    values = {
        "block_m": 128,
        "block_n": 64,
        "num_warps": 8,
        "kv_stages": 3,
        "swizzle": 3,
        "q_in_regs": True,
        **tile,
    }
    config = load_space("sm80").config(**problem.space_values(), **values)  # type: ignore[arg-type]
    store = TuningStore(db)
    result = TrialResult(config, "ok", median_us=us)
    store.set_best(
        H200,
        problem,
        result,
        measurement_id=None,
        study="s",
        trials=30,
        sdpa_default_us=2 * us,
        sdpa_flash_us=3 * us,
    )
    return config


def test_exact_then_nearest_then_heuristic(make) -> None:  # type: ignore[no-untyped-def]
    d = make()
    config = tuned(d.db, P, 400.0)
    exact = d.decide(P, 0)
    assert exact.path == "exact" and exact.config == config and exact.speedup_vs_sdpa == 2.0
    assert isinstance(exact.kernel, FakeKernel)
    other_shape = Problem(2, 16, 16, 4096, 4096, 128, "fp16", False)
    near = d.decide(other_shape, 0)
    # decided for its length class: the distance is its representative's (Lq = Lk = 4277)
    assert near.decided_for == representative(other_shape) != other_shape
    assert near.path == "nearest" and near.tuned_problem == P
    assert near.distance == pytest.approx(problem_distance(P, near.decided_for))
    assert f"distance {near.distance:.2f}" in near.describe()
    causal = Problem(4, 16, 16, 2048, 2048, 128, "fp16", True)  # nothing tuned of this class
    heuristic = d.decide(causal, 0)
    assert heuristic.path == "heuristic"
    # the default of the family of highest dispatch priority on an H200
    assert heuristic.config == load_space("sm90").heuristic(causal.space_values())


def test_repeated_calls_are_memoised(make, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    d = make()
    tuned(d.db, P, 400.0)
    first = d.decide(P, 0)
    queries = d.db_queries

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("the database was queried on a repeated call")

    monkeypatch.setattr(TuningStore, "best", boom)
    monkeypatch.setattr(TuningStore, "nearest", boom)
    d._load = boom  # type: ignore[method-assign,assignment]
    for _ in range(3):
        assert d.decide(P, 0) is first
    assert d.db_queries == queries


def test_fallback_when_nothing_can_run(make) -> None:  # type: ignore[no-untyped-def]
    old = make(target_cc=75)
    decision = old.decide(P, 0)
    assert decision.path == "fallback" and "older than" in decision.reason
    no_compile = make()
    no_compile._load = lambda config, target, index, problems: problems.append(  # type: ignore[method-assign,assignment]
        "not compiled and compile-on-miss is off"
    )
    decision = no_compile.decide(P, 0)
    assert decision.path == "fallback" and "compile-on-miss is off" in decision.reason


def test_a_tuned_config_invalid_on_this_device_is_skipped(make) -> None:  # type: ignore[no-untyped-def]
    d = make(target_cc=86)  # 99 KB of shared memory per block
    tuned(d.db, P, 400.0, block_m=64, block_n=128, num_warps=4, kv_stages=3)  # needs 208 KB
    decision = d.decide(P, 0)
    assert decision.path == "heuristic"


def test_broken_database_row_is_refused(make) -> None:  # type: ignore[no-untyped-def]
    d = make()
    tuned(d.db, P, 400.0)
    with TuningStore(d.db).engine.begin() as c:
        c.exec_driver_sql(
            "UPDATE kernel_configs SET config_json = "
            "replace(config_json, '\"num_warps\":8', '\"num_warps\":6')"
        )
    decision = d.decide(P, 0)
    assert decision.path == "heuristic"  # the broken row never runs


def test_shipped_defaults_seed_an_empty_database(
    make, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    source = TuningStore(f"sqlite:///{tmp_path}/ship.db")
    config = tuned(source.url, P, 333.0)
    shipped = json.loads(json.dumps(source.export()))
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [shipped])
    d = make()
    decision = d.decide(P, 0)
    assert decision.path == "exact" and decision.config == config
    assert decision.measured_us == 333.0
    records = TuningStore(d.db).list_best()
    assert [r.source for r in records] == ["imported"]
    # tuning more adds to the user's database; the shipped rows stay
    tuned(d.db, Problem(1, 16, 16, 8192, 8192, 128, "fp16", False), 900.0)
    assert len(TuningStore(d.db).list_best()) == 2


def test_the_shipped_h200_results_answer_every_llm_problem(
    make, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The real db/*.json, not a fixture: valid on import and exact for the whole shape set."""
    from autotune.model.shapes import load_shape_set

    # the fixture stubbed shipped_results(), so read the files the way it does
    real = [json.loads(p.read_text()) for p in shipped_results_files()]
    assert real, "no shipped results in db/"
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: real)
    d = make()
    families = []
    for problem in load_shape_set("llm-prefill") + load_shape_set("llm-decode"):
        decision = d.decide(problem, 0)
        assert decision.path == "exact", (problem, decision.reason)
        assert decision.config is not None and decision.decided
        assert decision.measured_tflops and decision.speedup_vs_sdpa
        # a winner of the re-ranking beside SDPA is never measurably slower than SDPA's default
        assert decision.speedup_vs_sdpa >= 0.99, (problem, decision.describe())
        families.append((problem.seqlen_q > 16, decision.config.family))
    # the shipped re-ranking: sm90 or SDPA on prefill; on the decode problems decode90 where
    # a kernel is faster (every llm-decode problem a decode kernel holds), SDPA elsewhere
    assert {f for prefill, f in families if prefill} == {"sm90", "sdpa"}
    assert {f for prefill, f in families if not prefill} == {"decode90", "sdpa"}


def test_the_shipped_h200_results_hold_each_kv_cache_kind(
    make, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Every KV-cache kind tuned on the H200 is in db/ with a config of a split-KV family
    (decode, or decode90 since it reads caches; torch SDPA cannot read a cache: it is the
    baseline there, never the stored best)."""
    real = [json.loads(p.read_text()) for p in shipped_results_files()]
    entries = [e for data in real for e in data["results"]]
    kinds: dict[str, set[str]] = {}
    for entry in entries:
        problem = Problem(**entry["problem"])
        kinds.setdefault(problem.kv_cache, set()).add(entry["family"])
    assert kinds.keys() == {"dense", "seqlens", "paged16", "paged64"}
    assert all(
        families <= {"decode", "decode90"} for kind, families in kinds.items() if kind != "dense"
    )
    assert "decode90" in kinds["seqlens"]  # B1 H32/8 Lq1 Lk32k, re-tuned with both families
    assert "decode90" in kinds["paged16"] and "decode90" in kinds["paged64"]  # re-tuned with it


def sm90_config(problem: Problem) -> Config:
    """The last valid sm90 config of the problem class on an H200 (taken from the space, which
    grows parameters of its own)."""
    return load_space("sm90").valid_configs(target_for_arch(90), problem.space_values())[-1]


def test_heuristic_comes_from_the_supported_family_of_highest_priority(
    make, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    sm80, sm90 = load_space("sm80"), load_space("sm90")
    assert sm90.dispatch_priority > sm80.dispatch_priority  # as shipped
    decision = make(target_cc=90).decide(P, 0)
    assert decision.path == "heuristic" and decision.config == sm90.heuristic(P.space_values())
    # another default tile for sm90, then the priorities swapped: sm80's default wins
    tile = {k: v for k, v in sm90_config(P).values if k not in P.space_values()}
    monkeypatch.setattr(sm90, "_heuristic", {128: tile})
    decision = make(target_cc=90).decide(P, 0)
    assert decision.path == "heuristic" and decision.config == sm90_config(P)
    monkeypatch.setattr(sm90, "dispatch_priority", sm80.dispatch_priority - 1)
    decision = make(target_cc=90).decide(P, 0)
    assert decision.path == "heuristic" and decision.config == sm80.heuristic(P.space_values())
    # a GPU sm90 cannot run keeps sm80's default whatever the priorities
    decision = make(target_cc=80).decide(P, 0)
    assert decision.path == "heuristic" and decision.config is not None
    assert decision.config.family == "sm80"
    # a head dim sm90 has no default for falls to the next family
    d96 = Problem(4, 16, 16, 2048, 2048, 96, "fp16", False)
    assert make(target_cc=90).decide(d96, 0).config.family == "sm80"


def test_a_tuned_config_of_a_family_this_gpu_cannot_run_is_skipped(make) -> None:  # type: ignore[no-untyped-def]
    d = make(target_cc=80)
    config = sm90_config(P)
    TuningStore(d.db).set_best(
        H200,
        P,
        TrialResult(config, "ok", median_us=250.0),
        measurement_id=None,
        study="s",
        trials=30,
        sdpa_default_us=500.0,
        sdpa_flash_us=None,
    )
    decision = d.decide(P, 0)
    assert decision.path == "heuristic" and decision.config is not None
    assert decision.config.family == "sm80"
    assert len(decision.skipped) == 1
    assert decision.skipped[0].startswith("exact sm90 config cannot run here: family sm90 needs")
    assert "passed over: exact sm90 config" in decision.describe()
    # the same row is the exact answer on the GPU that runs it
    exact = make(target_cc=90).decide(P, 0)  # the same database

    assert exact.path == "exact" and exact.config == config and exact.skipped == ()


def test_no_family_for_an_old_gpu_is_a_clear_fallback(make) -> None:  # type: ignore[no-untyped-def]
    decision = make(target_cc=75).decide(P, 0)
    assert decision.path == "fallback"
    assert "sm_75 is older than any kernel family supports" in decision.reason
    assert "sm80 needs sm_80 and newer" in decision.reason


def test_shipped_results_fill_gaps_refresh_shipped_rows_and_keep_tuned_ones(
    make, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A database that has tuned one shape still gets the shipped results of the others, and
    newer shipped results replace older shipped rows but never a config tuned there."""
    other = Problem(1, 16, 16, 8192, 8192, 128, "fp16", False)
    ship = TuningStore(f"sqlite:///{tmp_path}/ship.db")
    tuned(ship.url, P, 333.0)
    shipped_config = tuned(ship.url, other, 900.0)
    old_release = json.loads(json.dumps(ship.export()))
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [old_release])
    d = make()
    mine = tuned(d.db, P, 300.0)  # the user tuned P before the first attention call
    assert d.decide(P, 0).config == mine
    assert d.decide(other, 0).path == "exact"  # the gap is filled from the shipped file
    stored = {r.problem: r for r in TuningStore(d.db).list_best()}
    assert stored[P].source == "tuned" and stored[other].source == "imported"
    # a newer release: faster for both problems; only the shipped row is refreshed
    newer = TuningStore(f"sqlite:///{tmp_path}/ship2.db")
    tuned(newer.url, P, 100.0)
    tuned(newer.url, other, 450.0)
    new_release = json.loads(json.dumps(newer.export()))
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [new_release])
    again = make()  # a new process: the same database, the newer shipped files
    assert again.decide(other, 0).measured_us == 450.0
    assert again.decide(P, 0).measured_us == 300.0 and again.decide(P, 0).config == mine
    store = TuningStore(d.db)
    stored = {r.problem: r for r in store.list_best()}
    assert stored[P].source == "tuned" and stored[other].config == shipped_config
    assert store.import_results(new_release, refresh_imported=True) == {
        "imported": 0,
        "kept_existing": 2,
        "duplicates": 0,
    }  # equal entries write nothing
