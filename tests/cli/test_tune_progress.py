"""`tune`'s progress bar ends at 100% when the session ends (it used to reset per shape and
end at 0%), and each Optuna study names its objective."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest

from autotune.cli.main import main

RECORDING = Path(__file__).resolve().parents[2] / "tests" / "data" / "sweep_sm80_h200.json"
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


def test_the_bar_ends_at_100_percent_and_the_objective_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    assert (
        main(
            [
                "tune",
                *SHAPE,
                "--replay",
                str(RECORDING),
                "--trials",
                "5",
                "--without-sdpa",
                "--db",
                url,
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    percents = [int(p) for p in re.findall(r"(\d+)%\|", err)]
    assert percents and percents[-1] == 100, err[-500:]
    names = optuna.get_all_study_names(storage=url)
    assert names and all(
        optuna.load_study(study_name=n, storage=url).metric_names == ["median_us"] for n in names
    )
