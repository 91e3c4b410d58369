"""The kernel pack on the CPU: written from (fake) cached builds, installable with pip, and
served without nvcc only when its cubin, kernel sources and GPU arch are the ones asked for."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.build import pack as pack_module
from autotune.build.cache import ArtifactCache
from autotune.build.obtain import obtain
from autotune.build.pack import PackError
from autotune.build.pack_writer import write_pack
from autotune.model.status import Status
from autotune.model.target import target_for_arch

from ..kernel_pack import (
    H200,
    NO_NVCC,
    decode64,
    entry_folder,
    fake_build,
    fake_cubin,
    fake_launcher,
    make_pack,
    pip_install,
    sm80_64,
    with_fake_nvcc,
    without_nvcc,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def pack(tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pack of a decode and an sm80 build for sm_90 ($CUTE_AUTOTUNE_KERNELS), the cubin
    cache empty, and no nvcc on the machine."""
    package = make_pack(tmp_path / "pack", [decode64(), sm80_64()], monkeypatch)
    without_nvcc(monkeypatch)
    return package


def test_the_pack_holds_each_build_once_with_its_record_and_the_launcher(
    tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # three tuned decode configs differing only in their split count: one build
    package = make_pack(
        tmp_path / "pack", [decode64(1), decode64(4), decode64(16), sm80_64()], monkeypatch
    )
    root = package.parent
    assert (root / "pyproject.toml").is_file() and (package / "__init__.py").is_file()
    manifest = json.loads((package / "pack.json").read_text())
    assert manifest["format"] == "cute-autotune-kernel-pack" and manifest["archs"] == ["sm_90"]
    assert sorted(e["name"] for e in manifest["entries"].values()) == [
        "dec_d64_bm16_bn128_w4_s3_g_x1_fp16_full",
        "fwd_sm80_d64_bm128_bn64_w4_s2_sw3_qs_fp16_full",
    ]
    assert set(manifest["kernel_sources"]) == {"decode", "sm80"}
    for config in (decode64(16), sm80_64()):
        folder = entry_folder(package, config)
        assert sorted(p.name for p in folder.iterdir()) == ["build.json", "kernel.cubin"]
        record = json.loads((folder / "build.json").read_text())
        assert set(record) >= {
            "config",
            "key",
            "gencode",
            "flags",
            "toolchain",
            "ptxas",
            "launch_info",
            "cubin_sha256",
        }
        assert (folder / "kernel.cubin").read_bytes() == fake_cubin(
            config.space.build_view(config)
        )
    (launcher,) = manifest["launchers"]
    assert (package / launcher["file"]).is_file()
    assert launcher["file"].startswith(f"launcher/{launcher['tag']}/_cute_autotune_launcher")


def test_without_nvcc_a_config_comes_from_the_pack(pack: Path) -> None:
    build = obtain(decode64(8), H200)  # another split count of the packed build
    assert build.ok, build.message
    assert build.cubin == entry_folder(pack, decode64()) / "kernel.cubin"
    assert build.config == decode64(8) and build.launch_info is not None
    assert build.record["toolchain"]["nvcc"] == "13.0.88"  # the toolchain that made it
    assert obtain(sm80_64(), H200).ok


def test_with_nvcc_the_cache_answers_first_and_the_pack_before_a_compile(
    tmp_path: Path, pack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_fake_nvcc(monkeypatch)  # nvcc is here; running it fails the test
    cache = ArtifactCache(tmp_path / "other-cache")
    assert (
        obtain(decode64(), H200, cache=cache).cubin
        == entry_folder(pack, decode64()) / "kernel.cubin"
    )
    cached = fake_build(cache, decode64())
    assert obtain(decode64(), H200, cache=cache).cubin == cached.cubin


@pytest.mark.parametrize("damage", ["garbled", "truncated", "swapped"])
def test_a_tampered_cubin_is_refused(
    pack: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    cubin = entry_folder(pack, decode64()) / "kernel.cubin"
    data = cubin.read_bytes()
    cubin.write_bytes(
        {
            "garbled": data[:20] + b"\xff" * 8 + data[28:],
            "truncated": data[: len(data) // 2],
            "swapped": (entry_folder(pack, sm80_64()) / "kernel.cubin").read_bytes(),
        }[damage]
    )
    with caplog.at_level(logging.WARNING):
        build = obtain(decode64(), H200)
    assert build.status is Status.INFRASTRUCTURE and build.cubin is None
    assert "does not match its recorded SHA-256" in build.message
    assert NO_NVCC in build.message
    assert "refused" in caplog.text
    assert obtain(sm80_64(), H200).ok  # the other entries stay usable


def test_a_record_rewritten_to_match_a_tampered_cubin_is_refused(pack: Path) -> None:
    folder = entry_folder(pack, decode64())
    (folder / "kernel.cubin").write_bytes(b"\x7fELF something else")
    record = json.loads((folder / "build.json").read_text())
    record["cubin_sha256"] = pack_module.sha256_of(folder / "kernel.cubin")
    (folder / "build.json").write_text(json.dumps(record))
    build = obtain(decode64(), H200)  # the manifest still holds the packed cubin's digest
    assert not build.ok and "does not match its recorded SHA-256" in build.message


def test_a_pack_of_other_kernel_sources_is_not_used(
    pack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the installed kernel sources are not those the pack was built from
    monkeypatch.setattr(pack_module, "family_source_hash", lambda space: "0123456789abcdef")
    build = obtain(decode64(), H200)
    assert build.status is Status.INFRASTRUCTURE
    assert "built from other decode kernel sources" in build.message
    assert "0123456789abcdef" in build.message


def test_an_entry_built_from_other_sources_than_its_manifest_says_is_refused(pack: Path) -> None:
    folder = entry_folder(pack, decode64())
    record = json.loads((folder / "build.json").read_text())
    record["toolchain"]["kernel_source"] = "fedcba9876543210"
    (folder / "build.json").write_text(json.dumps(record))
    build = obtain(decode64(), H200)
    assert not build.ok and "built from other kernel sources (fedcba9876543210" in build.message


def test_a_pack_for_another_arch_is_not_used(pack: Path) -> None:
    build = obtain(sm80_64(), target_for_arch(80))
    assert not build.ok and "holds kernels for sm_90, not sm_80" in build.message


def test_with_neither_pack_nor_nvcc_the_build_says_both(
    tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_nvcc(monkeypatch)
    monkeypatch.delenv("CUTE_AUTOTUNE_KERNELS", raising=False)
    monkeypatch.setattr(pack_module, "find_spec", lambda name: None)
    build = obtain(decode64(), H200)
    assert build.status is Status.INFRASTRUCTURE
    assert NO_NVCC in build.message and "no kernel pack is installed" in build.message
    monkeypatch.setenv("CUTE_AUTOTUNE_KERNELS", str(tmp_path))
    assert "holds no kernel pack" in obtain(decode64(), H200).message


def test_a_torch_config_needs_neither(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.model.space import load_space

    without_nvcc(monkeypatch)
    sdpa = load_space("sdpa").heuristic({"head_dim": 64, "dtype": "fp16", "causal": False})
    assert sdpa is not None and obtain(sdpa, H200).ok


def test_a_damaged_manifest_is_a_reason(pack: Path) -> None:
    (pack / "pack.json").write_text('{"format": "cute-autotune-kernel-pack", "version": 1}')
    build = obtain(decode64(), H200)
    assert not build.ok and "pack.json is damaged" in build.message


def test_writing_replaces_a_pack_and_nothing_else(
    tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "pack"
    make_pack(out, [decode64()], monkeypatch)
    package = make_pack(out, [sm80_64()], monkeypatch)  # made again: replaced whole
    manifest = json.loads((package / "pack.json").read_text())
    assert set(manifest["kernel_sources"]) == {"sm80"}
    assert not list(tmp_path.glob(".pack.*"))  # no staging or old copy left beside it
    elsewhere = tmp_path / "documents"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("mine")
    with pytest.raises(PackError, match="is not a kernel pack"):
        write_pack(
            elsewhere,
            [(H200, [decode64()])],
            fake_launcher(tmp_path / "l"),
            cache=ArtifactCache(tmp_path / "pack-cache"),
        )
    assert (elsewhere / "notes.txt").read_text() == "mine"


def test_pip_installs_the_pack_and_the_runtime_finds_it(
    tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = make_pack(tmp_path / "pack", [decode64()], monkeypatch)
    site = tmp_path / "site"
    pip_install(package.parent, site)
    probe = (
        "import json; from autotune.build.pack import find_pack; p, why = find_pack(); "
        "print(json.dumps([str(p.root), p.archs, len(p.entries), "
        "[str(p.root / l.path) for l in p.launchers]] if p else why))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    env.pop("CUTE_AUTOTUNE_KERNELS")
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    ).stdout
    root, archs, entries, launchers = json.loads(out)
    assert root == str(site / "cute_autotune_kernels") and archs == ["sm_90"] and entries == 1
    installed = entry_folder(Path(root), decode64())
    assert (installed / "kernel.cubin").is_file() and (installed / "build.json").is_file()
    assert all(Path(p).is_file() for p in launchers)
