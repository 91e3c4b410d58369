"""Every CLI argument is checked as it is read: a bad value is one line naming the flag and a
non-zero exit before anything runs; every flag has help text; `--version`."""

from __future__ import annotations

import argparse

import pytest

from autotune import __version__
from autotune.cli.main import build_parser, main


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["tune", "--time-budget", "-5"], "--time-budget"),
        (["tune", "--time-budget", "nan"], "--time-budget"),
        (["tune", "--stop-after", "0"], "--stop-after"),
        (["tune", "--trials", "0"], "--trials"),
        (["tune", "--trials", "2.5"], "--trials"),
        (["tune", "--batch", "-1"], "--batch"),
        (["tune", "--rerank-top", "0"], "--rerank-top"),
        (["tune", "--seed", "-3"], "--seed"),
        (["best", "--heads-q", "0", "--seqlen-q", "1", "--head-dim", "64"], "--heads-q"),
        (["compile", "--jobs", "0"], "--jobs"),
        (["compile", "--sample", "-2"], "--sample"),
        (["check", "--timeout", "-1"], "--timeout"),
        (["bench", "--shapes", "llm-prefill", "--rounds", "0"], "--rounds"),
        (["misses", "--top", "0"], "--top"),
        (["demo", "--trials", "-6"], "--trials"),
        (["kernels", "pack", "--arch", "sm_90", "--out", "p", "--jobs", "0"], "--jobs"),
    ],
)
def test_a_bad_number_is_one_line_and_exit_2(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}" in err and "must be" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"cute-autotune {__version__}"


def test_the_cli_runs_from_a_source_checkout_without_package_metadata(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The GPU host runs the CLI from the tree on PYTHONPATH, where no distribution is installed.
    import importlib.metadata

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"cute-autotune {__version__}"


def test_the_version_is_the_one_pyproject_declares() -> None:
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == __version__


def test_every_flag_has_help() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        f"{name} {' '.join(action.option_strings) or action.dest}"
        for name, command in commands.choices.items()
        for action in command._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert not missing, missing


@pytest.mark.parametrize(
    "command",
    [
        ["tune"],
        ["best", "--heads-q", "16", "--seqlen-q", "512", "--head-dim", "64"],
        ["compile"],
        ["check"],
        ["demo"],
    ],
)
def test_causal_has_one_form_on_every_command(command: list[str]) -> None:
    parser = build_parser()
    alone = parser.parse_args([*command, "--causal"]).causal
    spelled = parser.parse_args([*command, "--causal", "true"]).causal
    off = parser.parse_args([*command, "--causal", "false"]).causal
    assert alone == spelled == "true" and off == "false"


def test_causal_both_is_for_several_problems(capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["tune", "--causal", "both"]).causal == "both"
    assert (
        main(
            [
                "best",
                "--heads-q",
                "16",
                "--seqlen-q",
                "512",
                "--head-dim",
                "64",
                "--causal",
                "both",
            ]
        )
        == 2
    )
    assert "one problem has one mask" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--causal", "both"])  # the demo runs one problem
