"""Which launcher extension a process imports (CPU, nothing compiled): the one built here when
a C++ compiler and cuda.h are at hand, else a kernel pack's built for this Python ABI, never
one built for another ABI or one that is not the file the pack recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.build import pack_writer
from autotune.build import toolchain as toolchain_module
from autotune.build.cache import ArtifactCache
from autotune.build.toolchain import ToolchainError, find_cuda_include
from autotune.launch import launcher

from ..kernel_pack import H200, decode64, fake_build, fake_launcher, with_fake_nvcc


@pytest.fixture(autouse=True)
def private_cache(cache_root: Path) -> None:
    """No launcher built here earlier: each test starts from an empty cache."""


def pack_with_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **abi: str) -> Path:
    """A pack (in $CUTE_AUTOTUNE_KERNELS) with a fake launcher of this Python's ABI (or of the
    suffix and pybind11 version given); returns the launcher's file in the pack."""
    with_fake_nvcc(monkeypatch)
    cache = ArtifactCache(tmp_path / "cache")
    fake_build(cache, decode64())
    out = tmp_path / "pack"
    pack_writer.write_pack(
        out, [(H200, [decode64()])], fake_launcher(tmp_path / "build", **abi), cache=cache
    )
    monkeypatch.setenv("CUTE_AUTOTUNE_KERNELS", str(out))
    manifest = json.loads((out / "cute_autotune_kernels" / "pack.json").read_text())
    return out / "cute_autotune_kernels" / str(manifest["launchers"][0]["file"])


def no_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> str:
        raise ToolchainError("no C++ compiler found to build the launcher (set CXX)")

    monkeypatch.setattr(launcher, "_compiler", missing)


def test_a_machine_that_can_build_it_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack_with_launcher(tmp_path, monkeypatch)
    built = tmp_path / "built.so"
    monkeypatch.setattr(launcher, "build_launcher", lambda: built)
    assert launcher.launcher_path() == built


def test_without_a_compiler_the_packs_launcher_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = pack_with_launcher(tmp_path, monkeypatch)
    no_compiler(monkeypatch)
    assert launcher.launcher_path() == packed


def test_without_cuda_h_the_packs_launcher_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = pack_with_launcher(tmp_path, monkeypatch)

    def no_header() -> Path:
        raise ToolchainError("cuda.h not found: set CUDA_HOME to the CUDA toolkit")

    monkeypatch.setattr(launcher, "find_cuda_include", no_header)
    assert launcher.launcher_path() == packed


@pytest.mark.parametrize(
    "abi", [{"suffix": ".cpython-310-x86_64-linux-gnu.so"}, {"pybind11": "2.11.0"}]
)
def test_a_launcher_built_for_another_abi_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, abi: dict[str, str]
) -> None:
    pack_with_launcher(tmp_path, monkeypatch, **abi)
    no_compiler(monkeypatch)
    with pytest.raises(ToolchainError) as caught:
        launcher.launcher_path()
    message = str(caught.value)
    assert "no C++ compiler" in message and "no prebuilt one for this Python" in message
    assert next(iter(abi.values())) in message  # what the pack's launcher was built for


def test_a_launcher_of_other_sources_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack_with_launcher(tmp_path, monkeypatch)
    no_compiler(monkeypatch)
    monkeypatch.setattr(launcher, "_sources", lambda: [Path(pack_writer.__file__)])
    with pytest.raises(ToolchainError, match="no prebuilt one for this Python"):
        launcher.launcher_path()


def test_a_replaced_launcher_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packed = pack_with_launcher(tmp_path, monkeypatch)
    packed.write_bytes(b"\x7fELF something else")
    no_compiler(monkeypatch)
    with pytest.raises(ToolchainError, match="does not match its recorded SHA-256"):
        launcher.launcher_path()


def test_cuda_h_is_found_without_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher needs the header only: a machine with cuda.h and no nvcc builds it."""

    def no_nvcc() -> Path:
        raise ToolchainError("nvcc not found")

    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda.h").write_text("/* the driver API */\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(toolchain_module, "find_nvcc", no_nvcc)
    assert find_cuda_include() == tmp_path / "include"
