"""benchmarks/ holds tools, not a diary: every script there and in probes/ is listed in
benchmarks/README.md and answers --help (argparse, nothing run), and the probes stay few."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(
    [*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("*.sh"), *(BENCHMARKS / "probes").glob("*.py")]
)


def test_every_script_is_listed_and_the_probes_are_few() -> None:
    readme = (BENCHMARKS / "README.md").read_text()
    unlisted = [p.name for p in SCRIPTS if p.name not in readme]
    assert not unlisted, f"not in benchmarks/README.md: {unlisted}"
    assert len(list((BENCHMARKS / "probes").glob("*.py"))) <= 5


@pytest.mark.parametrize(
    "script",
    [p for p in SCRIPTS if p.suffix == ".py"],
    ids=lambda p: p.relative_to(BENCHMARKS).as_posix(),
)
def test_every_script_answers_help(
    script: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(script), run_name="__main__")
    assert ended.value.code == 0
    assert "usage:" in capsys.readouterr().out
