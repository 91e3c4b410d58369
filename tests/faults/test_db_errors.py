"""Every database and file error of the CLI is one clear line and a non-zero exit; read-only
commands create nothing; dispatch keeps a database error as its reason."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.model.problem import Problem
from autotune.model.target import target_for_arch
from autotune.runtime import dispatch as dispatch_module
from autotune.runtime.dispatch import Dispatcher
from autotune.store.repo import TuningStore

from .conftest import H200_DEVICE, export_doc, export_entry, read_only

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"


def one_line_error(capsys: pytest.CaptureFixture[str], rc: int) -> str:
    err = capsys.readouterr().err.strip()
    assert rc not in (0, None), err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def populated(path: Path, n: int = 30) -> str:
    """A real tuning database with n best configs in it."""
    url = f"sqlite:///{path}"
    store = TuningStore(url)
    store.import_results(export_doc([export_entry(64 * (i + 1)) for i in range(n)]))
    store.engine.dispose()  # the last connection checkpoints the WAL into the file
    assert not Path(f"{path}-wal").exists()
    return url


def not_a_database(path: Path) -> None:
    path.write_text("these are my notes, not a database\n" * 100)


def garbled(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for page in range(1, len(data) // 4096):  # keep the header page, scramble the rest
        data[page * 4096 : page * 4096 + 512] = bytes(range(256)) * 2
    path.write_bytes(bytes(data))


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:5000])


@pytest.mark.parametrize("damage", [not_a_database, garbled, truncated])
@pytest.mark.parametrize(
    "command",
    [["list"], ["export"], ["best", "--heads-q", "16", "--seqlen-q", "512", "--head-dim", "128"]],
)
def test_a_damaged_database_is_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[Path], None],
    command: list[str],
) -> None:
    path = tmp_path / "tuning.db"
    url = populated(path)
    damage(path)
    err = one_line_error(capsys, main([*command, "--db", url]))
    assert str(path) in err and "database" in err


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("notaurl", "no tuning database at"),  # a plain path names a SQLite file (none there)
        ("nosuchdialect://x/y", "not a database URL"),
    ],
)
def test_a_url_that_is_not_one_is_one_line(
    url: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = one_line_error(capsys, main(["list", "--db", url]))
    assert fragment in err and url in err


@pytest.mark.parametrize(
    "url, module",
    [
        ("postgresql+psycopg2://u@localhost/tuning", "psycopg2"),
        ("mysql://u@localhost/tuning", "MySQLdb"),
    ],
)
def test_a_url_whose_driver_is_missing_says_which(
    url: str, module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    err = one_line_error(capsys, main(["list", "--db", url]))
    assert module in err and "pip install" in err


def test_a_wal_database_in_a_read_only_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    url = populated(folder / "tuning.db")
    with read_only(folder):
        err = one_line_error(capsys, main(["list", "--db", url]))
        assert str(folder / "tuning.db") in err
        err = one_line_error(
            capsys,
            main(
                [
                    "tune",
                    "--replay",
                    str(RECORDING),
                    "--batch",
                    "4",
                    "--heads-q",
                    "16",
                    "--seqlen-q",
                    "2048",
                    "--head-dim",
                    "128",
                    "--trials",
                    "2",
                    "--quiet",
                    "--db",
                    url,
                ]
            ),
        )
        assert str(folder / "tuning.db") in err


@pytest.mark.parametrize(
    "command",
    [["list"], ["export"], ["best", "--heads-q", "16", "--seqlen-q", "512", "--head-dim", "128"]],
)
def test_read_only_commands_create_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    missing = tmp_path / "tuning.db"  # a file not made yet, in a folder that exists
    err = one_line_error(capsys, main([*command, "--db", f"sqlite:///{missing}"]))
    assert "no tuning database" in err and str(missing) in err
    assert not missing.exists()
    typo = tmp_path / "tunnig" / "tuning.db"  # a mistyped folder: refused as argparse reads it
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--db", f"sqlite:///{typo}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert f"the folder {typo.parent} of the database file tuning.db does not exist" in err
    assert not typo.parent.exists()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (
            ["--replay", "/no/such/recording.json", "--heads-q", "16", "--seqlen-q", "2048"],
            "/no/such/recording.json",
        ),
        (["--replay", str(RECORDING), "--heads-q", "12", "--seqlen-q", "999"], "not recorded"),
    ],
)
def test_replay_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    err = one_line_error(
        capsys,
        main(
            [
                "tune",
                *args,
                "--head-dim",
                "128",
                "--trials",
                "2",
                "--quiet",
                "--db",
                f"sqlite:///{tmp_path}/t.db",
            ]
        ),
    )
    assert fragment in err


def test_a_recording_that_is_not_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "recording.json"
    bad.write_text(json.dumps({"device": H200_DEVICE}))
    err = one_line_error(
        capsys,
        main(
            [
                "tune",
                "--replay",
                str(bad),
                "--heads-q",
                "16",
                "--seqlen-q",
                "2048",
                "--head-dim",
                "128",
                "--quiet",
                "--db",
                f"sqlite:///{tmp_path}/t.db",
            ]
        ),
    )
    assert str(bad) in err


P = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)


def test_dispatch_keeps_the_database_error_as_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tuning.db"
    url = populated(path)
    garbled(path)
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [])
    d = Dispatcher(url)
    d._identify = lambda index: (  # type: ignore[method-assign]
        dispatch_module.DeviceInfo(**H200_DEVICE),
        target_for_arch(90),
    )
    d._load = lambda config, target, index, problems: object()  # type: ignore[method-assign,assignment]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = d.decide(P, 0)
        d.decide(Problem(2, 16, 16, 1024, 1024, 128, "fp16", False), 0)
    assert first.path == "heuristic"
    assert any("tuning database" in s and str(path) in s for s in first.skipped), first.skipped
    assert "tuning database" in first.describe()
    said = [w for w in caught if "tuning database" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]


def test_sqlite_files_used_here_are_real_databases(tmp_path: Path) -> None:
    url = populated(tmp_path / "t.db", n=2)
    with sqlite3.connect(url[len("sqlite:///") :]) as c:
        assert c.execute("select count(*) from best_configs").fetchone() == (2,)
