from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli.main import main


def config_dict(**changes: object) -> dict[str, object]:
    values: dict[str, object] = {"family": "sm80", "head_dim": 64, "dtype": "fp16",
                                 "causal": False, "block_m": 64, "block_n": 64, "num_warps": 4,
                                 "kv_stages": 2, "swizzle": 3, "q_in_regs": False}
    values.update(changes)
    return values


@pytest.mark.parametrize("payload, fragment", [
    (config_dict(block_m=96), "block_m = 96 is not one of [64, 128]"),
    (config_dict(dtype="fp8"), "dtype = 'fp8'"),
    (config_dict(family="sm99"), "unknown kernel family 'sm99'"),
    ([config_dict(), config_dict(causal="yes")], "config #1 refused"),
    ({k: v for k, v in config_dict().items() if k != "swizzle"}, "missing parameter 'swizzle'"),
])
def test_broken_config_files_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         payload: object, fragment: str) -> None:
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(payload))
    assert main(["compile", "--config", f"@{path}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and fragment in err


def test_unreadable_and_malformed_inputs(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "--config", "{nope", "--quiet"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["compile", "--config", f"@{tmp_path}/missing.json"]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["compile", "--head-dim", "64", "--set", "block_m=96"]) == 2
    assert "block_m = 96" in capsys.readouterr().err
    assert main(["compile", "--head-dim", "64", "--set", "block_m"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err


def test_statically_invalid_config_is_reported_not_compiled(
        cache_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = config_dict(head_dim=128, block_m=64, num_warps=8)
    assert main(["compile", "--config", json.dumps(bad), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "invalid" in out and "multiple of 16 * num_warps" in out and "1 pruned" in out


def test_space_lists_parameters_and_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["space", "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "kv_stages" in out and "q_in_regs" in out and "exceeds the device limit" in out
    assert "128       fp16   90    90" in out


def test_check_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["check", "--head-dim", "64", "--limit", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
