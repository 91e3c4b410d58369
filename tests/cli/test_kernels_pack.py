"""`cute-autotune kernels pack`: the kernel configs of the results tuned on GPUs of an arch, one
build each, written as a kernel pack. CPU tests answer every build from fake cache entries; the
one nvcc test packs a real decode build and the real launcher and runs them without a toolkit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune._paths import shipped_results_files
from autotune.build import pack_writer
from autotune.build.cache import ArtifactCache
from autotune.build.compiler import BuildResult
from autotune.build.pack_writer import build_views
from autotune.cli import kernels
from autotune.cli.main import main
from autotune.model.space import load_space
from autotune.model.status import Status

from ..kernel_pack import (
    H200,
    decode64,
    entry_folder,
    fake_build,
    fake_launcher,
    sm80_64,
    with_fake_nvcc,
    without_nvcc,
)

A100 = {
    "name": "NVIDIA A100-SXM4-80GB",
    "compute_capability": 80,
    "sm_count": 108,
    "driver_version": "580.159.04",
    "cuda_version": "13.0",
}
H200_DEVICE = {
    "name": "NVIDIA H200",
    "compute_capability": 90,
    "sm_count": 132,
    "driver_version": "580.159.04",
    "cuda_version": "13.0",
}


def entry(device: dict[str, Any], config: Any, batch: int) -> dict[str, Any]:
    problem = {
        "batch": batch,
        "heads_q": 8,
        "heads_kv": 8,
        "seqlen_q": 1,
        "seqlen_k": 4096,
        "head_dim": 64,
        "dtype": "fp16",
        "causal": False,
    }
    if config.family == "sm80":
        problem["seqlen_q"] = 2048
    return {
        "device": device,
        "problem": problem,
        "config": config.as_dict(),
        "median_us": 50.0 if problem["seqlen_q"] == 1 else 5000.0,
    }


def results(tmp_path: Path) -> Path:
    """Two H200 decode results sharing one build, an H200 result won by torch SDPA and an A100
    result of an sm80 config."""
    sdpa = load_space("sdpa").heuristic({"head_dim": 64, "dtype": "fp16", "causal": False})
    doc = {
        "format": "cute-autotune-results",
        "version": 1,
        "schema": "0.4.0",
        "exported_at": "2026-12-01T00:00:00+00:00",
        "results": [
            entry(H200_DEVICE, decode64(1), 1),
            entry(H200_DEVICE, decode64(8), 2),
            entry(H200_DEVICE, sdpa, 4),
            entry(A100, sm80_64(), 4),
        ],
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def fake_launcher_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "prebuilt_launcher", lambda: fake_launcher(tmp_path / "l"))


def manifest_of(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "cute_autotune_kernels" / "pack.json").read_text()))


def test_pack_writes_the_builds_of_the_arch(
    tmp_path: Path,
    cache_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_launcher_here: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with_fake_nvcc(monkeypatch)
    fake_build(ArtifactCache(), decode64())
    out = tmp_path / "pack"
    assert (
        main(
            [
                "kernels",
                "pack",
                "--arch",
                "sm_90",
                "--out",
                str(out),
                "--db-json",
                str(results(tmp_path)),
                "--quiet",
            ]
        )
        == 0
    )
    manifest = manifest_of(out)
    assert [e["name"] for e in manifest["entries"].values()] == [
        "dec_d64_bm16_bn128_w4_s3_g_x1_fp16_full"
    ]  # the A100's and torch's left out
    assert manifest["archs"] == ["sm_90"] and manifest["made_with"]["nvcc"] == "13.0.88"
    assert (entry_folder(out / "cute_autotune_kernels", decode64()) / "kernel.cubin").is_file()
    assert (out / "pyproject.toml").is_file()
    printed = capsys.readouterr().out
    assert "1 kernels for sm_90 from 2 tuned configs" in printed
    assert f"pip install {out}" in printed


def test_pack_defaults_to_the_shipped_results(
    tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch, fake_launcher_here: None
) -> None:
    with_fake_nvcc(monkeypatch)
    configs = kernels.tuned_configs(shipped_results_files(), H200)
    views = build_views(configs)
    assert configs and len(views) < len(configs)  # split counts share builds
    for view in views:
        fake_build(ArtifactCache(), load_space(view.family).validate(view))
    out = tmp_path / "pack"
    assert main(["kernels", "pack", "--arch", "sm_90", "--out", str(out), "--quiet"]) == 0
    manifest = manifest_of(out)
    assert len(manifest["entries"]) == len(views)
    assert {e["family"] for e in manifest["entries"].values()} == {v.family for v in views}


def test_a_config_that_does_not_build_is_left_out_and_said(
    tmp_path: Path,
    cache_root: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_launcher_here: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with_fake_nvcc(monkeypatch)

    def failing(configs: list[Any], target: Any, **kwargs: Any) -> list[BuildResult]:
        return [
            BuildResult(c, target.arch, Status.COMPILE_ERROR, message="static_assert: no")
            for c in configs
        ]

    monkeypatch.setattr(pack_writer, "compile_many", failing)
    out = tmp_path / "pack"
    assert (
        main(
            [
                "kernels",
                "pack",
                "--arch",
                "sm_90",
                "--out",
                str(out),
                "--db-json",
                str(results(tmp_path)),
                "--quiet",
            ]
        )
        == 1
    )
    assert manifest_of(out)["entries"] == {}
    assert "1 did not build and are left out" in capsys.readouterr().out


def test_an_arch_nothing_was_tuned_on_is_said(
    tmp_path: Path, cache_root: Path, fake_launcher_here: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pack"
    assert (
        main(
            [
                "kernels",
                "pack",
                "--arch",
                "sm_86",
                "--out",
                str(out),
                "--db-json",
                str(results(tmp_path)),
            ]
        )
        == 1
    )
    assert "was tuned on a GPU of sm_86" in capsys.readouterr().err
    assert not out.exists()


def test_a_results_file_that_is_not_one_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    assert (
        main(
            [
                "kernels",
                "pack",
                "--arch",
                "sm_90",
                "--out",
                str(tmp_path / "p"),
                "--db-json",
                str(bad),
            ]
        )
        == 2
    )
    assert "not a cute-autotune-results document" in capsys.readouterr().err


@pytest.mark.nvcc
def test_a_real_pack_runs_without_the_toolkit(
    tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One real decode build (about 20 s) and the real launcher, packed; then, with neither
    nvcc nor a C++ compiler, the build comes from the pack and the pack's launcher imports."""
    from autotune.build.cubin import read_launch_info
    from autotune.build.obtain import obtain
    from autotune.build.toolchain import ToolchainError
    from autotune.launch import launcher

    doc = json.loads(results(tmp_path).read_text())
    doc["results"] = doc["results"][:1]
    (tmp_path / "one.json").write_text(json.dumps(doc))
    out = tmp_path / "pack"
    assert (
        main(
            [
                "kernels",
                "pack",
                "--arch",
                "sm_90",
                "--out",
                str(out),
                "--db-json",
                str(tmp_path / "one.json"),
                "--jobs",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    monkeypatch.setenv("CUTE_AUTOTUNE_KERNELS", str(out))
    monkeypatch.setenv("CUTE_AUTOTUNE_CACHE", str(tmp_path / "empty-cache"))
    without_nvcc(monkeypatch)

    def no_compiler() -> str:
        raise ToolchainError("no C++ compiler found to build the launcher (set CXX)")

    monkeypatch.setattr(launcher, "_compiler", no_compiler)
    build = obtain(decode64(4), H200)
    assert build.ok and build.cubin is not None, build.message
    assert str(build.cubin).startswith(str(out))
    assert read_launch_info(build.cubin) == build.launch_info
    module = launcher.import_launcher()
    assert str(launcher.launcher_path()).startswith(str(out))
    assert build.launch_info is not None
    assert module.ABI_VERSION == build.launch_info.abi_version
