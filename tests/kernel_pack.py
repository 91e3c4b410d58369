"""Kernel packs of fake builds, for the CPU tests of packing and of running without nvcc.

A fake toolchain stands in for nvcc: each fake cubin is stored in the cubin cache under the key
a real build would have, with the record `compile_config` writes, so that `compile_many` answers
every config from the cache and `write_pack` runs as it does for real, nvcc never started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from datetime import UTC, datetime
from pathlib import Path

import pytest

from autotune.build import compiler, pack_writer
from autotune.build.cache import ArtifactCache, artifact_key
from autotune.build.compiler import NVCC_FLAGS, BuildResult
from autotune.build.cubin import LaunchInfo
from autotune.build.pack import LauncherFile
from autotune.build.pack_writer import write_pack
from autotune.build.ptxas import PtxasReport
from autotune.build.toolchain import Toolchain, ToolchainError, family_source_hash
from autotune.launch import launcher
from autotune.model.config import Config
from autotune.model.space import ValidConfig, load_space
from autotune.model.status import Status
from autotune.model.target import Target, target_for_arch

H200 = target_for_arch(90)
FAKE_TOOLS = Toolchain(
    Path("/nonexistent/bin/nvcc"), "13.0.88", Path("/nonexistent/include"), "4.2.0"
)
NO_NVCC = "nvcc not found: install the CUDA toolkit and put nvcc on PATH, or set CUDA_HOME"


def decode64(num_splits: int = 1) -> ValidConfig:
    """The decode family's default for D=64 fp16 (a split count is a launch parameter: every
    count shares one build)."""
    space = load_space("decode")
    config = space.heuristic({"head_dim": 64, "dtype": "fp16", "causal": False})
    assert config is not None
    return space.validate(config.replace(num_splits=num_splits))


def sm80_64() -> ValidConfig:
    config = load_space("sm80").heuristic({"head_dim": 64, "dtype": "fp16", "causal": False})
    assert config is not None
    return config


def with_fake_nvcc(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvcc "is here" (the fake toolchain), but running it fails the test."""

    def no_run(command: list[str], **kwargs: object) -> object:
        raise AssertionError(f"nvcc ran: {command[:2]}")

    for module in (compiler, pack_writer):
        monkeypatch.setattr(module, "toolchain", lambda: FAKE_TOOLS)
    monkeypatch.setattr(
        compiler,
        "subprocess",
        types.SimpleNamespace(run=no_run, TimeoutExpired=subprocess.TimeoutExpired),
    )


def without_nvcc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine has no CUDA toolkit: finding nvcc fails as it does there."""

    def missing() -> Toolchain:
        raise ToolchainError(NO_NVCC)

    for module in (compiler, pack_writer):
        monkeypatch.setattr(module, "toolchain", missing)


def fake_cubin(config: Config) -> bytes:
    return b"\x7fELF\x02\x01fake cubin of " + config.to_json().encode() + bytes(range(256))


def fake_build(cache: ArtifactCache, config: ValidConfig, target: Target = H200) -> BuildResult:
    """Store a fake build of `config` in `cache`, as compile_config with FAKE_TOOLS would."""
    space = config.space
    view = space.build_view(config)
    gencode = space.gencode_for(target)
    key = artifact_key(view, gencode, family_source_hash(space), FAKE_TOOLS, NVCC_FLAGS)
    ptxas = PtxasReport("cute_autotune_fwd", target.arch, 96, 0, 0, 0, 0, 1)
    info = LaunchInfo(
        3,
        2,
        int(config["head_dim"]),
        0,
        0,
        int(config["block_m"]),
        int(config["block_n"]),
        128,
        32768,
    )
    record = {
        "key": key,
        "config": view.as_dict(),
        "name": space.name_of(view),
        "arch": target.arch,
        "gencode": gencode,
        "flags": NVCC_FLAGS,
        "toolchain": {
            "nvcc": FAKE_TOOLS.nvcc_version,
            "cutlass": FAKE_TOOLS.cutlass_version,
            "kernel_source": family_source_hash(space),
        },
        "ptxas": ptxas.as_dict(),
        "launch_info": info.as_dict(),
        "compile_seconds": 20.0,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    entry = cache.put(config.family, key, fake_cubin(view), record, {})
    return BuildResult(
        view, target.arch, Status.OK, key=key, cubin=entry.cubin, record=entry.record
    )


def fake_launcher(folder: Path, **abi: str) -> LauncherFile:
    """A file standing in for the launcher extension built for this Python (or for the
    suffix and pybind11 version given)."""
    suffix, pybind = launcher._abi()
    suffix, pybind = abi.get("suffix", suffix), abi.get("pybind11", pybind)
    path = folder / f"{launcher.MODULE_NAME}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF fake launcher extension")
    return LauncherFile(launcher._tag(suffix, pybind), suffix, pybind, path)


def make_pack(
    out: Path, configs: list[ValidConfig], monkeypatch: pytest.MonkeyPatch, target: Target = H200
) -> Path:
    """Write a kernel pack of fake builds of `configs` to `out` (the package folder inside is
    returned); $CUTE_AUTOTUNE_KERNELS points at it. Leaves the fake nvcc in place."""
    cache = ArtifactCache(out.parent / f"{out.name}-cache")
    with_fake_nvcc(monkeypatch)
    for config in configs:
        fake_build(cache, config, target)
    report = write_pack(
        out, [(target, configs)], fake_launcher(out.parent / "launcher-build"), cache=cache, jobs=1
    )
    assert not report.failed, [b.message for b in report.failed]
    monkeypatch.setenv("CUTE_AUTOTUNE_KERNELS", str(out))
    return out / "cute_autotune_kernels"


def entry_folder(package: Path, config: ValidConfig) -> Path:
    """The folder of `config`'s build in the pack."""
    manifest = json.loads((package / "pack.json").read_text())
    view = config.space.build_view(config).as_dict()
    (key,) = [k for k, e in manifest["entries"].items() if e["config"] == view]
    return package / "cubins" / config.family / str(key)


def pip_install(source: Path, site: Path) -> None:
    """`pip install` a folder into `site` (no index: setuptools from this environment)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
