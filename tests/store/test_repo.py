from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import target_for_arch
from autotune.store.records import BaselineTiming, DeviceInfo, TrialResult
from autotune.store.repo import BrokenRow, TuningStore, problem_distance

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
OTHER_DRIVER = DeviceInfo("NVIDIA H200", 90, 132, "590.1", "13.1")
A100 = DeviceInfo("NVIDIA A100-SXM4-80GB", 80, 108, "580.1", "13.0")
P = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)


def cfg(problem: Problem = P, **tile: object) -> Config:
    values = {
        "block_m": 128,
        "block_n": 64,
        "num_warps": 4,
        "kv_stages": 2,
        "swizzle": 3,
        "q_in_regs": False,
        **tile,
    }
    return load_space("sm80").config(**problem.space_values(), **values)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> TuningStore:
    return TuningStore(f"sqlite:///{tmp_path}/t.db")


def put_best(
    store: TuningStore, problem: Problem, us: float, device: DeviceInfo = H200, **tile: object
) -> Config:
    config = cfg(problem, **tile)
    result = TrialResult(config, "ok", median_us=us, p20_us=us, p80_us=us, rounds=9)
    mid = store.record_trial(
        device, problem, result, build=None, study="s", phase="rerank", baseline_us=200.0
    )
    store.set_best(
        device,
        problem,
        result,
        measurement_id=mid,
        study="s",
        trials=12,
        sdpa_default_us=200.0,
        sdpa_flash_us=420.0,
    )
    return config


def test_trials_are_recorded_and_reused(store: TuningStore) -> None:
    ok = TrialResult(
        cfg(), "ok", median_us=410.0, p20_us=405.0, p80_us=415.0, rounds=5, build_key=None
    )
    failed = TrialResult(cfg(block_n=32), "crashed", "worker process died (exit code -11)")
    store.record_trial(H200, P, ok, build=None, study="s", phase="search", baseline_us=200.0)
    store.record_trial(H200, P, failed, build=None, study="s", phase="search", baseline_us=200.0)
    again = store.find_trial(OTHER_DRIVER, P, cfg(), None)  # same GPU model, other driver
    assert again is not None and again.reused and again.median_us == 410.0
    assert store.find_trial(H200, P, cfg(block_n=32), None) is None  # failures are not reused
    assert store.find_trial(A100, P, cfg(), None) is None
    statuses = {(t["status"], t["reason"]) for t in store.trials(study="s")}
    assert ("crashed", "worker process died (exit code -11)") in statuses


def test_best_exact_nearest_and_per_device(store: TuningStore) -> None:
    put_best(store, P, 400.0)
    far = Problem(1, 16, 16, 16384, 16384, 128, "fp16", False)
    put_best(store, far, 9000.0, block_n=32)
    put_best(store, P, 700.0, device=A100, num_warps=8)
    best = store.best(H200, P)
    assert best is not None and best.median_us == 400.0 and best.speedup_vs_default == 0.5
    assert best.speedup_vs_flash == pytest.approx(1.05)
    assert store.best("NVIDIA A100-SXM4-80GB", P).config["num_warps"] == 8  # type: ignore[union-attr]
    near = store.nearest(H200, Problem(2, 16, 16, 4096, 4096, 128, "fp16", False))
    assert near is not None and near[0].problem == P and near[1] == pytest.approx(3.0)
    assert store.nearest(H200, Problem(4, 16, 16, 2048, 2048, 128, "fp16", True)) is None
    assert store.nearest(H200, Problem(4, 16, 16, 2048, 2048, 64, "fp16", False)) is None


def test_distance_is_symmetric_in_log_space() -> None:
    a = Problem(4, 16, 16, 2048, 2048, 128)
    b = Problem(1, 16, 16, 8192, 8192, 128)
    assert problem_distance(a, b) == problem_distance(b, a) == pytest.approx(2 + 2 + 2)
    gqa = Problem(4, 16, 4, 2048, 2048, 128)
    assert problem_distance(a, gqa) == pytest.approx(0.5 * 2)


def test_broken_rows_are_refused_not_run(store: TuningStore) -> None:
    put_best(store, P, 400.0)
    with store.engine.begin() as c:  # someone edits the database by hand
        c.exec_driver_sql(
            "UPDATE kernel_configs SET config_json = "
            "replace(config_json, '\"block_m\":128', '\"block_m\":96')"
        )
    with pytest.raises(BrokenRow, match="not valid"):
        store.best(H200, P)
    assert store.list_best() == []
    assert any("block_m = 96" in reason for reason in store.broken_rows())


def test_export_import_round_trip(store: TuningStore, tmp_path: Path) -> None:
    put_best(store, P, 400.0)
    put_best(store, Problem(1, 32, 8, 8192, 8192, 64, "bf16", True), 1500.0, block_m=64)
    data = json.loads(json.dumps(store.export()))
    other = TuningStore(f"sqlite:///{tmp_path}/other.db")
    assert other.import_results(data) == {"imported": 2, "kept_existing": 0, "duplicates": 0}
    assert other.import_results(data) == {"imported": 0, "kept_existing": 2, "duplicates": 0}
    mine = {(r.problem, r.config, r.median_us, r.sdpa_default_us) for r in store.list_best()}
    theirs = {(r.problem, r.config, r.median_us, r.sdpa_default_us) for r in other.list_best()}
    assert mine == theirs
    assert {r.source for r in other.list_best()} == {"imported"}


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda e: e["config"].update(block_m=96), "block_m = 96"),
        (lambda e: e["config"].update(head_dim=64), "another problem class"),
        (lambda e: e.update(median_us=-1), "median_us must be a time from 0.5 us"),
        (lambda e: e["problem"].update(heads_kv=5), "multiple of heads_kv"),
        (
            lambda e: e["problem"].update(kv_cache="paged3'); DROP TABLE problems; --"),
            "kv_cache must be one of",
        ),
        (lambda e: e["problem"].update(kv_cache="paged48"), "kv_cache must be one of"),
        (lambda e: e.pop("device"), "entry #0"),
    ],
)
def test_import_validates_every_entry_and_imports_nothing_on_error(
    store: TuningStore, tmp_path: Path, mutate, fragment: str
) -> None:  # type: ignore[no-untyped-def]
    put_best(store, P, 400.0)
    put_best(store, Problem(8, 16, 16, 1024, 1024, 128, "fp16", False), 300.0)
    data = store.export()
    mutate(data["results"][0])
    other = TuningStore(f"sqlite:///{tmp_path}/other.db")
    with pytest.raises(BrokenRow, match=fragment):
        other.import_results(data)
    assert other.list_best() == []


def test_baselines_latest_wins(store: TuningStore) -> None:
    store.record_baselines(H200, P, "s1", [BaselineTiming("default", 250, 249, 251)])
    store.record_baselines(
        H200,
        P,
        "s2",
        [BaselineTiming("default", 230, 229, 231), BaselineTiming("flash", 460, 455, 465)],
    )
    latest = store.latest_baselines(H200, P)
    assert latest["default"].median_us == 230 and latest["flash"].median_us == 460


def sm90_cfg(problem: Problem = P) -> Config:
    """The last valid sm90 config of the problem class on an H200 (taken from the space, which
    grows parameters of its own)."""
    return load_space("sm90").valid_configs(target_for_arch(90), problem.space_values())[-1]


def sm90_statically_invalid(problem: Problem) -> tuple[Config, str]:
    """An sm90 config of the problem class that is in the space's domain but breaks one of its
    constraints on an H200, and the constraint's message."""
    space, h200 = load_space("sm90"), target_for_arch(90)
    for config in space.all_configs(problem.space_values()):
        reasons = space.violations(config, h200)
        if reasons:
            return config, reasons[0]
    raise AssertionError("every sm90 config is valid: the test needs an invalid one")


def put_sm90_best(store: TuningStore, problem: Problem, us: float) -> Config:
    config = sm90_cfg(problem)
    store.set_best(
        H200,
        problem,
        TrialResult(config, "ok", median_us=us),
        measurement_id=None,
        study="s90",
        trials=20,
        sdpa_default_us=200.0,
        sdpa_flash_us=None,
    )
    return config


def test_export_import_round_trip_keeps_each_family(store: TuningStore, tmp_path: Path) -> None:
    put_best(store, P, 400.0)
    gqa = Problem(1, 32, 8, 8192, 8192, 128, "bf16", True)
    config = put_sm90_best(store, gqa, 1100.0)
    data = json.loads(json.dumps(store.export()))
    assert sorted(e["family"] for e in data["results"]) == ["sm80", "sm90"]
    other = TuningStore(f"sqlite:///{tmp_path}/other.db")
    assert other.import_results(data) == {"imported": 2, "kept_existing": 0, "duplicates": 0}
    imported = other.best(H200, gqa)
    assert imported is not None and imported.config == config and imported.median_us == 1100.0
    with other.engine.connect() as c:
        rows = c.exec_driver_sql(
            "SELECT b.family, k.family FROM best_configs b "
            "JOIN kernel_configs k ON k.id = b.config_id"
        ).all()
    assert sorted(rows) == [("sm80", "sm80"), ("sm90", "sm90")]


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda e: e["config"].update(block_m=96), "block_m = 96 is not one of [64, 128, 192]"),
        (lambda e: e["config"].update(num_warps=4), "unknown parameter 'num_warps'"),
        (lambda e: e.update(family="sm80"), "family 'sm80' but a sm90 config"),
        (
            lambda e: e["device"].update(
                name="NVIDIA A100-SXM4-80GB", compute_capability=80, sm_count=108
            ),
            "runs on sm_90 only",
        ),
    ],
)
def test_an_sm90_entry_is_checked_against_the_sm90_space(
    store: TuningStore, tmp_path: Path, mutate, fragment: str
) -> None:  # type: ignore[no-untyped-def]
    put_best(store, P, 400.0)
    put_sm90_best(store, Problem(8, 16, 16, 1024, 1024, 128, "fp16", False), 300.0)
    data = store.export()
    entry = next(e for e in data["results"] if e["family"] == "sm90")
    mutate(entry)
    other = TuningStore(f"sqlite:///{tmp_path}/other.db")
    with pytest.raises(BrokenRow, match=re.escape(fragment)):
        other.import_results(data)
    assert other.list_best() == []


def test_an_sm90_entry_breaking_a_constraint_of_its_space_is_refused(
    store: TuningStore, tmp_path: Path
) -> None:
    problem = Problem(8, 16, 16, 1024, 1024, 128, "fp16", False)
    put_sm90_best(store, problem, 300.0)
    data = store.export()
    invalid, reason = sm90_statically_invalid(problem)
    data["results"][0]["config"] = invalid.as_dict()
    other = TuningStore(f"sqlite:///{tmp_path}/other.db")
    with pytest.raises(
        BrokenRow, match=re.escape(f"sm90 config cannot run on NVIDIA H200 (sm_90): {reason}")
    ):
        other.import_results(data)
    assert other.list_best() == []


def test_nearest_of_one_family(store: TuningStore) -> None:
    put_best(store, P, 400.0)
    far = Problem(1, 16, 16, 16384, 16384, 128, "fp16", False)
    config = put_sm90_best(store, far, 5000.0)
    asked = Problem(2, 16, 16, 4096, 4096, 128, "fp16", False)
    assert store.nearest(H200, asked)[0].problem == P  # type: ignore[index]
    near = store.nearest(H200, asked, family="sm90")
    assert near is not None and near[0].config == config and near[0].problem == far
    assert store.nearest(H200, asked, family="sm70") is None


def test_list_says_whether_a_timing_is_of_the_kernel_built_today(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`list` compares the build each best was timed with to the build the current sources,
    toolchain and flags make: a kernel update shows as "older" (needs nvcc's version and the
    CUTLASS headers, as the compile-only tests do; nothing is compiled)."""
    from autotune.build.compiler import BuildResult, build_key
    from autotune.cli.main import main

    db = f"sqlite:///{tmp_path}/k.db"
    store = TuningStore(db)
    config = cfg()
    today = build_key(config, target_for_arch(90))
    assert len(today) == 32
    rows = {}
    for batch, key in ((1, today), (2, "0" * 32), (3, None)):
        problem = Problem(batch, 16, 16, 2048, 2048, 128, "fp16", False)
        result = TrialResult(
            config, "ok", median_us=100.0 * batch, p20_us=1.0, p80_us=1.0, rounds=5
        )
        mid = None
        if key is not None:
            mid = store.record_trial(
                H200,
                problem,
                result,
                build=BuildResult(config, "sm_90", "ok", key=key),
                study="s",
                phase="rerank",
                baseline_us=1.0,
            )
        store.set_best(
            H200,
            problem,
            result,
            measurement_id=mid,
            study="s",
            trials=1,
            sdpa_default_us=None,
            sdpa_flash_us=None,
            source="tuned" if key else "imported",
        )
        rows[problem.describe()] = {today: "current", None: "?"}.get(key, "older")
    assert main(["list", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "timed kernel" in out
    lines = out.splitlines()
    for shape, state in rows.items():
        row = next(i for i, x in enumerate(lines) if shape + " " in x)
        # the column ends the row, or (a table wider than the output) sits under it
        details = [x.strip() for x in lines[row + 1 : row + 4] if x.startswith("    ")]
        assert lines[row].rstrip().endswith(state) or f"timed kernel: {state}" in details, lines[
            row : row + 4
        ]


def test_a_kv_cache_kind_is_its_own_problem_and_class(store: TuningStore, tmp_path: Path) -> None:
    """A paged or padded cache of the same shape is another problem: its best, its timings and
    its nearest neighbours never mix with the dense one's; export and import keep the kind."""
    dense = Problem(8, 32, 8, 1, 32768, 128, "fp16", False)
    paged = Problem(8, 32, 8, 1, 32768, 128, "fp16", False, "paged64")
    put_best(store, dense, 100.0)
    assert store.best(H200, paged) is None
    assert store.nearest(H200, paged) is None  # another kind is not a neighbour
    put_best(store, paged, 130.0, block_n=32)
    best = store.best(H200, paged)
    assert best is not None and best.problem == paged and best.median_us == 130.0
    assert store.best(H200, dense).median_us == 100.0  # type: ignore[union-attr]
    near = store.nearest(H200, Problem(16, 32, 8, 1, 32768, 128, "fp16", False, "paged64"))
    assert near is not None and near[0].problem == paged
    assert {r.problem for r in store.list_best()} == {dense, paged}
    path = tmp_path / "out.json"
    path.write_text(json.dumps(store.export()))
    other = TuningStore(f"sqlite:///{tmp_path}/other.db")
    other.import_results(json.loads(path.read_text()))
    assert {r.problem for r in other.list_best()} == {dense, paged}


def test_a_problem_row_with_a_hostile_kv_cache_is_refused_not_run(store: TuningStore) -> None:
    put_best(store, P, 400.0)
    paged = Problem(8, 32, 8, 1, 32768, 128, "fp16", False, "paged64")
    put_best(store, paged, 130.0)
    with store.engine.begin() as c:  # someone edits the database by hand
        c.exec_driver_sql(
            "UPDATE problems SET kv_cache = 'paged64; rm -rf /' WHERE kv_cache = 'paged64'"
        )
    assert [r.problem for r in store.list_best()] == [P]  # the rest is served
    assert any("kv_cache must be one of" in reason for reason in store.broken_rows())
