"""The performance model (issue 38, item 1, first slice): fitted with scikit-learn over a
database's measurements, written as JSON, evaluated in plain Python to the same numbers, refused
when altered, better on problems it never saw than a throughput rule."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from autotune.cli.main import main
from autotune.model.perf_model import PerfModel, digest_of
from autotune.store.repo import TuningStore
from autotune.tune.fit_model import Timing, _export, _matrix, _schema, fit, held_out, timings

pytest.importorskip("sklearn")

RECORDED = Path(__file__).resolve().parents[1] / "data" / "h200_noregret.db"
DEVICE = "NVIDIA H200"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[Timing]:
    copy = tmp_path_factory.mktemp("db") / "h200.db"
    shutil.copy(RECORDED, copy)
    found = timings(TuningStore(f"sqlite:///{copy}", create=False))
    assert len(found) > 700
    return found


@pytest.fixture(scope="module")
def doc(data: list[Timing]) -> dict[str, Any]:
    return fit(data, DEVICE, trees=40)


def test_the_json_trees_predict_what_scikit_learn_predicts(data: list[Timing]) -> None:
    from sklearn.ensemble import GradientBoostingRegressor

    from autotune.model.perf_model import _Ensemble

    names, families, categories = _schema(data)
    x = _matrix(data, names, families, categories)
    y = [math.log(t.median_us) for t in data]
    learner = GradientBoostingRegressor(
        loss="quantile", alpha=0.8, n_estimators=25, max_depth=3
    ).fit(x, y)
    ours = _Ensemble(json.loads(json.dumps(_export(learner))), len(names))
    for row, theirs in zip(x[::7], learner.predict(x[::7]), strict=True):
        assert ours.predict(row) == pytest.approx(float(theirs), abs=1e-9)


def test_a_prediction_has_a_range_and_the_model_knows_its_data(
    doc: dict[str, Any], data: list[Timing]
) -> None:
    model = PerfModel(doc)
    for t in data[::50]:
        guess = model.predict(t.problem, t.config)
        assert 0 < guess.low_us <= guess.median_us <= guess.high_us
    assert doc["timings"] == len(data) and len(doc["data_digest"]) == 64
    assert set(doc["kernel_sources"]) == {"sdpa", "sm80", "sm90"}
    # The problems it saw, kept so a benchmark of generalization can refuse to judge on them.
    assert model.fit_problems == {t.problem for t in data}


@pytest.mark.parametrize("damage", ["value", "digest", "node", "version"])
def test_an_altered_model_is_refused(doc: dict[str, Any], damage: str) -> None:
    bad = json.loads(json.dumps(doc))
    tree = bad["ensembles"]["p50"]["trees"][0]
    if damage == "value":
        tree["value"][-1] += 1.0
    elif damage == "digest":
        bad["digest"] = "0" * 64
    elif damage == "node":
        tree["left"][0] = 0  # a cycle: the walk would never end
        bad["digest"] = digest_of(bad)
    else:
        bad["version"] = 99
        bad["digest"] = digest_of(bad)
    with pytest.raises(ValueError, match="digest|points outside|version"):
        PerfModel(bad)


def test_stale_families_are_named(doc: dict[str, Any]) -> None:
    model = PerfModel(doc)
    current = dict(doc["kernel_sources"])
    assert model.stale_families(current) == []
    current["sm90"] = "another"
    assert model.stale_families(current) == ["sm90"]


def test_on_unseen_problems_it_beats_a_throughput_rule(data: list[Timing]) -> None:
    """Held out by problem, the model's median error per kernel family is below that of
    predicting each config's time from the problem's FLOPs at its family's median TFLOP/s
    (fitted on the same folds)."""
    errors = {e.family: e for e in held_out(data, DEVICE, folds=4, trees=60)}
    problems = sorted({t.problem for t in data})
    fold_of = {p: i % 4 for i, p in enumerate(problems)}
    rule: dict[str, list[float]] = {}
    for fold in range(4):
        train = [t for t in data if fold_of[t.problem] != fold]
        rates: dict[str, list[float]] = {}
        for t in train:
            rates.setdefault(t.config.family, []).append(t.problem.flops / t.median_us)
        for t in data:
            if fold_of[t.problem] == fold and t.config.family in rates:
                guess = t.problem.flops / statistics.median(rates[t.config.family])
                rule.setdefault(t.config.family, []).append(abs(guess / t.median_us - 1))
    for family in ("sm80", "sm90", "sdpa"):
        assert errors[family].median_error < statistics.median(rule[family]), (
            family,
            errors[family],
            statistics.median(rule[family]),
        )
        assert 0.2 <= errors[family].covered <= 0.95


def test_cli_fit_and_predict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "h200.db"
    shutil.copy(RECORDED, db)
    out = tmp_path / "model.json"
    assert (
        main(
            [
                "model",
                "fit",
                "--db",
                f"sqlite:///{db}",
                "--out",
                str(out),
                "--trees",
                "20",
                "--folds",
                "2",
            ]
        )
        == 0
    )
    said = capsys.readouterr().out
    assert "772 timings of 100 problems on NVIDIA H200" in said and "in p20-p80" in said
    config = (
        '{"family": "sm80", "block_m": 128, "block_n": 64, "num_warps": 4, '
        '"kv_stages": 2, "swizzle": 3, "q_in_regs": true}'
    )
    assert (
        main(
            [
                "model",
                "predict",
                "--model",
                str(out),
                "--config",
                config,
                "--batch",
                "2",
                "--heads-q",
                "16",
                "--seqlen-q",
                "3000",
                "--head-dim",
                "128",
            ]
        )
        == 0
    )
    assert "us (p20-p80" in capsys.readouterr().out
    out.write_text(out.read_text().replace('"trees":20', '"trees":21'))
    assert (
        main(
            [
                "model",
                "predict",
                "--model",
                str(out),
                "--config",
                config,
                "--batch",
                "2",
                "--heads-q",
                "16",
                "--seqlen-q",
                "3000",
                "--head-dim",
                "128",
            ]
        )
        == 2
    )
    assert "digest does not match" in capsys.readouterr().err


def test_cli_fit_of_an_empty_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path}/empty.db"
    TuningStore(db)
    assert main(["model", "fit", "--db", db, "--out", str(tmp_path / "m.json")]) == 1
    assert "nothing to fit" in capsys.readouterr().out


def test_backward_timings_stay_out_of_the_forward_model(tmp_path: Path) -> None:
    """A backward problem's timings (its kernel's and torch's backward) would teach the forward
    model that a problem of the same shape takes 2-3 times as long: every source of timings
    leaves them out."""
    from autotune.model.problem import Problem
    from autotune.model.space import load_space
    from autotune.store.records import DeviceInfo, TrialResult
    from autotune.tune.fit_model import timings_of_recording, timings_of_results

    copy = tmp_path / "h200.db"
    shutil.copy(RECORDED, copy)
    store = TuningStore(f"sqlite:///{copy}")
    before = timings(store)
    backward = Problem(2, 32, 8, 4096, 4096, 128, "bf16", True, backward=True)
    bwd = load_space("bwd")
    config = bwd.heuristic(bwd.problem_values(backward))
    assert config is not None
    result = TrialResult(config, "ok", median_us=900.0, p20_us=890.0, p80_us=910.0, rounds=9)
    device = DeviceInfo(DEVICE, 90, 132, "580.159.04", "13.0")
    mid = store.record_trial(
        device, backward, result, build=None, study="b", phase="rerank", baseline_us=800.0
    )
    store.set_best(
        device,
        backward,
        result,
        measurement_id=mid,
        study="b",
        trials=1,
        sdpa_default_us=800.0,
        sdpa_flash_us=None,
    )
    assert timings(store) == before
    exported = store.export()["results"]
    assert any(e["problem"].get("backward") for e in exported)
    assert all(not t.problem.backward for t in timings_of_results(exported))
    recording = {
        "shapes": [
            {
                "problem": backward.as_dict(),
                "configs": [{"config": config.as_dict(), "status": "ok", "median_us": 900.0}],
                "sdpa": {"default": {"median_us": 800.0}},
            }
        ]
    }
    assert timings_of_recording(recording) == []
