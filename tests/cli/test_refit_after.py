"""`tune` and `import` refit the GPU's performance model in the database after adding
measurements (issue 38 item 1; `--no-refit` leaves it, `tune --quick` never waits for it),
`model fit --store` keeps one there, and `model list` shows what a database holds beside the
shipped models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.store import TuningStore
from autotune.store.perf_models import PerfModels

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"
SHAPE = [
    "--batch",
    "4",
    "--heads-q",
    "16",
    "--seqlen-q",
    "2048",
    "--head-dim",
    "128",
    "--dtype",
    "fp16",
]


def _stored(url: str) -> list[tuple[str, str]]:
    return [(m.device_name, m.fitted_by) for m in PerfModels(TuningStore(url)).all()]


def test_tune_refits_unless_told_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    tune = ["tune", *SHAPE, "--replay", str(RECORDING), "--without-sdpa", "--db", url, "--quiet"]
    assert main([*tune, "--trials", "8", "--no-refit"]) == 0
    assert "performance model" not in capsys.readouterr().out and _stored(url) == []
    assert main([*tune, "--trials", "24"]) == 0
    assert "refitted the performance model of NVIDIA H200 over" in capsys.readouterr().out
    assert _stored(url) == [("NVIDIA H200", "tune")]


def test_import_refits_each_gpu_model_it_brought(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the listing names the database's path, as long as the test runner's temporary folder:
    # wide enough that its columns stay in the grid
    monkeypatch.setenv("COLUMNS", "250")
    url = f"sqlite:///{tmp_path}/i.db"
    shipped = REPO / "db" / "h200.json"
    assert main(["import", str(shipped), "--db", url, "--no-refit"]) == 0
    assert _stored(url) == []
    url = f"sqlite:///{tmp_path}/j.db"
    assert main(["import", str(shipped), "--db", url]) == 0
    assert "refitted the performance model of NVIDIA H200" in capsys.readouterr().out
    assert _stored(url) == [("NVIDIA H200", "import")]
    assert main(["import", str(shipped), "--db", url]) == 0  # nothing new: no refit
    assert "refitted" not in capsys.readouterr().out
    assert main(["model", "list", "--db", url]) == 0
    listed = capsys.readouterr().out
    assert "by import" in listed and "shipped (h200.model.json)" in listed


def test_model_fit_store_keeps_the_model_in_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/f.db"
    assert (
        main(
            [
                "model",
                "fit",
                "--recording",
                str(RECORDING),
                "--folds",
                "0",
                "--trees",
                "10",
                "--db",
                url,
            ]
        )
        == 2
    )  # neither --out nor --store
    assert (
        main(
            [
                "model",
                "fit",
                "--recording",
                str(RECORDING),
                "--folds",
                "0",
                "--trees",
                "10",
                "--db",
                url,
                "--store",
                "--out",
                str(tmp_path / "m.json"),
            ]
        )
        == 0
    )
    assert _stored(url) == [("NVIDIA H200", "model fit")]
    kept = PerfModels(TuningStore(url)).load("NVIDIA H200")
    assert kept is not None and kept.doc == json.loads((tmp_path / "m.json").read_text())
