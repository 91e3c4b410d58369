"""The documentation's replayed examples are what the commands print: every ```text block after
a replay-example comment in README.md or docs/ is run here, command by command (on the replay
backend, no GPU), and its output compared with the page's, line for line. A change of output,
table layout or recording that the documentation does not follow fails here.
`<!-- replay-example: NAME -->` first puts SETUPS[NAME] into the default database (the state an
earlier GPU step would leave)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from autotune.cli.main import main
from autotune.model import Problem
from autotune.store.records import DeviceInfo
from autotune.store.repo import TuningStore

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- replay-example(?:: ([\w-]+))? -->\s*```text\n(.*?)```", re.S)


def demo_misses(url: str) -> None:
    """The misses `cute-autotune demo` recorded on the H200 in the README's `misses` example."""
    h200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
    seen = datetime(2026, 12, 1, 5, 24, 37, tzinfo=UTC)
    TuningStore(url).add_misses(
        [
            (h200, Problem(2, 32, 8, 4096, 4096, 128, "bf16", True), "nearest", 1840, seen, seen),
            (h200, Problem(4, 16, 16, 2048, 2048, 128, "fp16"), "sdpa", 912, seen, seen),
            (h200, Problem(16, 16, 16, 512, 512, 64, "fp16"), "heuristic", 311, seen, seen),
            (h200, Problem(4, 16, 16, 2048, 2048, 128, "fp16"), "nearest", 40, seen, seen),
        ]
    )


def shipped_results(url: str) -> None:
    """db/h200.json imported, as `cute-autotune import db/h200.json` does."""
    assert main(["import", str(REPO / "db" / "h200.json"), "--db", url]) == 0


SETUPS: dict[str, Callable[[str], None]] = {
    "demo-misses": demo_misses,
    "shipped-results": shipped_results,
}


def examples() -> list[tuple[str, list[tuple[str, str]]]]:
    """Each marked block: its setup's name ("" for none) and its (command, expected output)
    pairs, in order."""
    blocks = []
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
    for setup, text in (found for page in pages for found in BLOCK.findall(page.read_text())):
        pairs: list[tuple[str, list[str]]] = []
        continuing = False
        for line in text.splitlines():
            if line.startswith("$ ") or continuing:
                command = line[2:] if line.startswith("$ ") and not continuing else line
                if continuing:
                    pairs[-1] = (pairs[-1][0] + " " + command.strip().rstrip("\\"), [])
                else:
                    pairs.append((command.rstrip("\\").strip(), []))
                continuing = line.endswith("\\")
            else:
                pairs[-1][1].append(line)
        blocks.append((setup, [(cmd, "\n".join(out).strip()) for cmd, out in pairs]))
    return blocks


def test_the_readme_has_replayed_examples_of_every_family() -> None:
    commands = " ".join(cmd for _, pairs in examples() for cmd, _ in pairs)
    for recording in (
        "sweep_sm80_llm_prefill_h200.json.gz",
        "sweep_sm90_h200.json.gz",
        "sweep_decode_h200.json.gz",
    ):
        assert f"tests/data/{recording}" in commands
        assert (REPO / "tests" / "data" / recording).is_file()


@pytest.mark.parametrize("block", range(len(examples())))
def test_a_replayed_readme_example_prints_what_the_readme_shows(
    block: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("COLUMNS", "100")  # the README's tables are printed at 100 columns
    default_db = f"sqlite:///{tmp_path}/demo/tuning.db"
    monkeypatch.setenv("CUTE_AUTOTUNE_DB", default_db)
    setup, pairs = examples()[block]
    if setup:
        (tmp_path / "demo").mkdir()
        SETUPS[setup](default_db)
        capsys.readouterr()
    for command, expected in pairs:
        argv = shlex.split(command.replace("/tmp/", f"{tmp_path}/"))
        assert argv[0] == "cute-autotune"
        main(argv[1:])
        captured = capsys.readouterr()
        printed = (captured.out + captured.err).replace(f"{tmp_path}/", "/tmp/").strip()
        assert [line.rstrip() for line in printed.splitlines()] == [
            line.rstrip() for line in expected.splitlines()
        ], command


@pytest.mark.parametrize(
    "recording, family, shape_set",
    [
        ("sweep_sm80_llm_prefill_h200.json.gz", "sm80", "llm-prefill"),
        ("sweep_sm90_h200.json.gz", "sm90", "llm-prefill"),
        ("sweep_decode_h200.json.gz", "decode", "llm-decode"),
    ],
)
def test_a_shipped_recording_holds_every_valid_config_of_8_problems(
    recording: str, family: str, shape_set: str
) -> None:
    # A space that gains or loses a config since makes the recording stale: record it again
    # (`REC=FAMILY bash benchmarks/evidence.sh record`).
    from autotune._jsonfile import read_json
    from autotune.model import Config, Problem, load_shape_set, load_space, target_for_arch

    data = read_json(REPO / "tests" / "data" / recording)
    assert data["family"] == family and data["device"]["name"] == "NVIDIA H200"
    problems = [Problem(**shape["problem"]) for shape in data["shapes"]]
    assert len(set(problems)) >= 8 and set(problems) <= set(load_shape_set(shape_set))
    space, target = load_space(family), target_for_arch(90)
    for problem, shape in zip(problems, data["shapes"], strict=True):
        recorded = {Config.from_dict(row["config"]).digest for row in shape["configs"]}
        valid = {c.digest for c in space.valid_configs(target, problem.space_values())}
        assert recorded == valid, problem.describe()
        assert all(row["status"] == "ok" and row["median_us"] > 0 for row in shape["configs"])
