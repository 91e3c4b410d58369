from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli.main import main


def config_dict(**changes: object) -> dict[str, object]:
    values: dict[str, object] = {
        "family": "sm80",
        "head_dim": 64,
        "dtype": "fp16",
        "causal": False,
        "block_m": 64,
        "block_n": 64,
        "num_warps": 4,
        "kv_stages": 2,
        "swizzle": 3,
        "q_in_regs": False,
    }
    values.update(changes)
    return values


@pytest.mark.parametrize(
    "payload, fragment",
    [
        (config_dict(block_m=96), "block_m = 96 is not one of [64, 128]"),
        (config_dict(dtype="fp8"), "dtype = 'fp8'"),
        (config_dict(family="sm99"), "unknown kernel family 'sm99'"),
        ([config_dict(), config_dict(causal="yes")], "config #1 refused"),
        (
            {k: v for k, v in config_dict().items() if k != "swizzle"},
            "missing parameter 'swizzle'",
        ),
    ],
)
def test_broken_config_files_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], payload: object, fragment: str
) -> None:
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(payload))
    assert main(["compile", "--config", f"@{path}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and fragment in err


def test_unreadable_and_malformed_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compile", "--config", "{nope", "--quiet"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["compile", "--config", f"@{tmp_path}/missing.json"]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["compile", "--head-dim", "64", "--set", "block_m=96"]) == 2
    assert "block_m = 96" in capsys.readouterr().err
    assert main(["compile", "--head-dim", "64", "--set", "block_m"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err


def test_statically_invalid_config_is_reported_not_compiled(
    cache_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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


class FakeWorker:
    """The GPU worker of `check` on a machine without a GPU: the validator passes the first
    config, fails the second, and the worker hangs on the third."""

    replies: list[object] = []
    restarts = 0

    def __init__(self, device: int) -> None:
        pass

    def __enter__(self) -> FakeWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def request(self, request: object, timeout: float = 120.0) -> object:
        return FakeWorker.replies.pop(0)


def test_check_reports_each_outcome_in_the_status_vocabulary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    from autotune.build.compiler import BuildResult
    from autotune.cli import main as cli_main
    from autotune.measure import worker
    from autotune.measure.validate import CaseResult, ValidationReport
    from autotune.model.config import Config
    from autotune.model.status import Status

    configs = [Config.from_dict(config_dict(block_n=n)) for n in (32, 64, 128)]
    builds = [BuildResult(c, "sm_90", Status.OK, key=f"k{i}") for i, c in enumerate(configs)]
    builds.append(
        BuildResult(
            Config.from_dict(config_dict(kv_stages=3)),
            "sm_90",
            Status.COMPILE_ERROR,
            message="ptxas: too many resources",
        )
    )
    FakeWorker.replies = [
        ValidationReport(True, 1, (CaseResult("aligned", "p", True, rel_err=2e-4),)),
        ValidationReport(False, 2, (CaseResult("aligned", "p", False, "a race", 1e-2),)),
        worker.WorkerFailure(Status.TIMEOUT, "no answer within 9 s (hang?)"),
    ]
    monkeypatch.setattr(cli_main, "gpu_available", lambda: True)
    monkeypatch.setattr(cli_main, "_compile", lambda configs, target, args: (builds, 1.0))
    monkeypatch.setattr(worker, "GpuWorker", FakeWorker)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    out = tmp_path / "check.json"
    args = ["check", "--arch", "sm_90", "--quiet", "--seed", "5", "--json", str(out)]
    assert cli_main.main([*args, *(a for c in configs for a in ("--config", c.to_json()))]) == 1
    text = capsys.readouterr().out
    assert "4 valid, 3 compiled, 1 passed, 3 failed" in text and "2.00e-04" in text
    data = json.loads(out.read_text())
    assert [r["validation"]["status"] for r in data["results"]] == [
        "passed",
        "failed",
        "timeout",
        "not_run",
    ]
    assert data["results"][0]["validation"]["report"]["seed"] == 1
    assert data["results"][3]["validation"]["reason"] == (
        "compile_error: ptxas: too many resources"
    )
    assert [(f["stage"], f["status"]) for f in data["failures"]] == [
        ("validate", "failed"),
        ("validate", "timeout"),
        ("compile", "not_run"),
    ]
