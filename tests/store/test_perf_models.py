"""The performance model kept in the tuning database (schema 0.6.0, issue 38 item 1): saved and
read back whole, one per GPU model; a row whose text no longer matches its digest, is not JSON
or names another GPU is refused, never evaluated; the database's model is preferred to the
shipped one where it learnt from at least as many timings; a refit over unchanged data is
skipped, and one without scikit-learn says how to get it."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.model import Problem, target_for_arch
from autotune.model.perf_model import digest_of
from autotune.runtime.dispatch import Dispatcher, with_prediction
from autotune.store import TuningStore
from autotune.store.exchange import BrokenRow
from autotune.store.perf_models import PerfModels, model_for
from autotune.store.records import DeviceInfo
from autotune.tune.fit_model import Timing
from autotune.tune.refit import database_timings, fitted_subset, refit

REPO = Path(__file__).resolve().parents[2]
SHIPPED = json.loads((REPO / "db" / "h200.model.json").read_text())
RECORDED = REPO / "tests" / "data" / "h200_noregret.db"
H100 = "NVIDIA H100 80GB HBM3"


def _as(doc: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """`doc` with `changes`, its digest made again (a model fitted elsewhere, say)."""
    made = {**doc, **changes}
    made["digest"] = digest_of(made)
    return made


def _store(tmp_path: Path) -> TuningStore:
    return TuningStore(f"sqlite:///{tmp_path}/models.db")


def test_a_model_is_kept_whole_and_replaced_by_the_next(tmp_path: Path) -> None:
    models = PerfModels(_store(tmp_path))
    assert models.load("NVIDIA H200") is None and models.describe("NVIDIA H200") is None
    saved = models.save(SHIPPED, "model fit")
    assert saved.timings == SHIPPED["timings"] and saved.fitted_by == "model fit"
    loaded = models.load("NVIDIA H200")
    assert loaded is not None and loaded.doc == SHIPPED
    models.save(_as(SHIPPED, timings=7), "tune")
    assert [m.timings for m in models.all()] == [7]  # one row per GPU model
    with pytest.raises(ValueError, match="fitted_by"):
        models.save(SHIPPED, "someone")


def test_a_damaged_document_is_refused_before_it_is_stored(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="digest"):
        PerfModels(_store(tmp_path)).save({**SHIPPED, "timings": 1}, "tune")


@pytest.mark.parametrize("damage", ["value", "not json", "other gpu"])
def test_a_damaged_row_is_refused_when_read(tmp_path: Path, damage: str) -> None:
    store = _store(tmp_path)
    PerfModels(store).save(SHIPPED, "model fit")
    text = json.dumps(SHIPPED, separators=(",", ":"))
    if damage == "value":  # one leaf of one tree changed: the digest no longer matches
        doc = json.loads(text)
        doc["ensembles"]["p50"]["trees"][0]["value"][1] += 1.0
        text = json.dumps(doc)
    elif damage == "not json":
        text = text[: len(text) // 2]
    else:  # a whole, valid model of another GPU put under this GPU's name
        text = json.dumps(_as(SHIPPED, device=H100))
    with sqlite3.connect(tmp_path / "models.db") as db:
        db.execute("UPDATE perf_models SET doc_json = ?", (text,))
    with pytest.raises(BrokenRow, match="refused.*model fit --store"):
        PerfModels(store).load("NVIDIA H200")
    with pytest.warns(UserWarning, match="refused"):
        model, source = model_for(store, "NVIDIA H200")
    assert model is not None and source == "shipped in db/"  # the shipped one stands in


def test_the_database_model_is_preferred_where_it_learnt_from_as_much(tmp_path: Path) -> None:
    store = _store(tmp_path)
    models = PerfModels(store)
    models.save(_as(SHIPPED, timings=SHIPPED["timings"] - 1), "tune")
    assert model_for(store, "NVIDIA H200")[1] == "shipped in db/"
    models.save(_as(SHIPPED, timings=SHIPPED["timings"]), "tune")
    assert model_for(store, "NVIDIA H200")[1].startswith("fitted in ")
    assert model_for(store, H100) == (None, "none")
    models.save(_as(SHIPPED, device=H100, timings=25), "tune")  # no model ships for it
    model, source = model_for(store, H100)
    assert model is not None and model.device == H100 and source.startswith("fitted in ")


def test_explain_shows_the_database_model_of_a_gpu_without_a_shipped_one(tmp_path: Path) -> None:
    store = _store(tmp_path)
    device = DeviceInfo(H100, 90, 132, "", "13.0")
    problem = Problem(3, 12, 12, 1531, 1531, 64, "fp16", True)
    decision = Dispatcher(store.url, use_shipped=False, untuned="kernel").would_run(
        problem, device, target_for_arch(90)
    )
    assert decision.config is not None
    assert with_prediction(decision, problem, device, store) == decision
    PerfModels(store).save(_as(SHIPPED, device=H100), "tune")
    shown = with_prediction(decision, problem, device, store)
    assert shown.predicted is not None and f"the {H100} model (fitted in " in shown.predicted


def _recorded(tmp_path: Path) -> TuningStore:
    copy = tmp_path / "recorded.db"
    shutil.copy(RECORDED, copy)
    return TuningStore(f"sqlite:///{copy}")


def test_a_refit_is_kept_and_skipped_over_the_same_data(tmp_path: Path) -> None:
    store = _recorded(tmp_path)
    first = refit(store, "NVIDIA H200", "tune", trees=10)
    assert (
        first.status == "fitted"
        and first.timings == len(database_timings(store, "NVIDIA H200")) > 500
    )
    kept = PerfModels(store).describe("NVIDIA H200")
    assert kept is not None and kept.fitted_by == "tune" and kept.timings == first.timings
    assert refit(store, "NVIDIA H200", "import", trees=10).status == "unchanged"
    assert PerfModels(store).describe("NVIDIA H200") == kept


def test_a_refit_needs_data_and_scikit_learn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _recorded(tmp_path)
    assert refit(store, H100, "tune").status == "too few"  # nothing of it measured
    monkeypatch.setitem(sys.modules, "sklearn", None)  # an import of it fails
    outcome = refit(store, "NVIDIA H200", "tune")
    assert outcome.status == "no scikit-learn" and "pip install scikit-learn" in outcome.message
    assert PerfModels(store).describe("NVIDIA H200") is None


def test_the_fitted_subset_is_the_same_whatever_the_order(tmp_path: Path) -> None:
    data = database_timings(_recorded(tmp_path), "NVIDIA H200")
    subset = fitted_subset(data, limit=100)
    assert len(subset) == 100 and set(subset) <= set(data)
    assert fitted_subset(list(reversed(data)), limit=100) == subset
    assert fitted_subset(data[:50], limit=100) == data[:50]
    assert all(isinstance(t, Timing) for t in subset)
