"""A newcomer's first commands (issue 40 item 4): `python -m autotune` runs the command line, a
plain path names a SQLite database, a folder given as the database is named as such (nothing
made there), so is a file in a folder that does not exist, `best` of a head dim no kernel
family holds says so, and on a fresh install the reading commands answer from the shipped
results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli.main import main

REPO = Path(__file__).resolve().parents[2]
SHAPE = ["--batch", "1", "--heads-q", "8", "--seqlen-q", "512", "--dtype", "fp16"]


def test_python_dash_m_autotune_is_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0 and "best" in done.stdout


def test_a_folder_is_not_taken_for_a_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["list"], ["import", str(REPO / "db" / "h200.json"), "--no-refit"]):
        assert main([*command, "--db", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "is a folder, not a database file" in err and str(tmp_path / "tuning.db") in err
    assert list(tmp_path.iterdir()) == []


def test_a_plain_path_and_an_impossible_head_dim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "plain.db")
    assert main(["import", str(REPO / "db" / "h200.json"), "--db", db, "--no-refit"]) == 0
    assert main(["best", *SHAPE, "--head-dim", "64", "--db", db]) == 0
    assert "nearest tuned problem" in capsys.readouterr().out
    assert main(["best", *SHAPE, "--head-dim", "100", "--db", db]) == 1
    assert "no kernel family holds head dim 100" in capsys.readouterr().err


def test_a_shape_set_that_does_not_parse_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "mine.toml"
    bad.write_text("shapes = [ {batch = 1,\n")
    assert (
        main(
            [
                "tune",
                "--shapes",
                str(bad),
                "--db",
                str(tmp_path / "t.db"),
                "--replay",
                str(REPO / "tests" / "data" / "sweep_sm80_h200.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"{bad}: not valid TOML" in err and "line" in err


def test_a_fresh_install_answers_from_the_shipped_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --db, no $CUTE_AUTOTUNE_DB and no default database yet: `best` and `list` answer from
    the results shipped in db/ (and say so), creating nothing where the default would be; an
    explicit --db that does not exist is still an error."""
    monkeypatch.delenv("CUTE_AUTOTUNE_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(["best", *SHAPE, "--head-dim", "128", "--seqlen-q", "1000"]) == 0
    out = capsys.readouterr()
    assert "answered from the results shipped in db/" in out.err
    assert "nearest tuned problem" in out.out and "NVIDIA H200" in out.out
    assert main(["list"]) == 0
    assert "NVIDIA H200" in capsys.readouterr().out
    assert main(["report"]) == 0
    out = capsys.readouterr()
    assert "answered from the results shipped in db/" in out.err
    assert "NVIDIA H200 (sm_90, 132 SMs): what dispatch runs" in out.out
    exported = tmp_path / "shipped.json"
    assert main(["export", "--output", str(exported)]) == 0
    assert len(json.loads(exported.read_text())["results"]) == len(
        json.loads((REPO / "db" / "h200.json").read_text())["results"]
    )
    assert not (tmp_path / "cache").exists()
    assert main(["list", "--db", str(tmp_path / "missing.db")]) == 2
    assert "no tuning database at" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", [["list"], ["tune", "--batch", "1"], ["worker"], ["model", "list"]]
)
def test_a_file_in_a_missing_folder_is_refused(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no" / "such" / "tuning.db"
    for given in (str(missing), f"sqlite:///{missing}"):
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--db", given])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"the folder {missing.parent} of the database file tuning.db does not exist" in err
    assert list(tmp_path.iterdir()) == []
