"""The cubin cache serves only what it verified: a garbled, truncated or half-described entry is
a miss (evicted and logged), `--force` replaces, and an unwritable cache is one clear error
before any nvcc runs. Compiles one small config with the real nvcc."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.build import compiler
from autotune.build.cache import ArtifactCache
from autotune.build.compiler import BuildResult, compile_config, lookup
from autotune.build.cubin import read_launch_info
from autotune.cli.main import main
from autotune.model.config import Config
from autotune.model.target import target_for_arch

from .conftest import read_only, sm80_config

pytestmark = pytest.mark.nvcc
H200 = target_for_arch(90)
SMALL = Config.from_dict(sm80_config(head_dim=64, block_m=64, block_n=64))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """One real build, compiled once for the module; tests work on copies of its entry."""
    build = compile_config(SMALL, H200, ArtifactCache(tmp_path_factory.mktemp("pristine")))
    assert build.ok, build.message
    return build


@pytest.fixture
def cache(
    tmp_path: Path, pristine: BuildResult, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ArtifactCache]:
    """A private cache holding a copy of the pristine entry (also the default cache)."""
    assert pristine.cubin is not None
    root = tmp_path / "cache"
    entry = root / "cubins" / "sm80" / pristine.cubin.parent.name
    shutil.copytree(pristine.cubin.parent, entry)
    monkeypatch.setenv("CUTE_AUTOTUNE_CACHE", str(root))
    yield ArtifactCache(root)


def entry_dir(cache: ArtifactCache, build: BuildResult) -> Path:
    assert build.key is not None
    return cache.root / "sm80" / build.key


def no_nvcc(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record nvcc runs instead of making them (a test that must not compile)."""
    calls: list[list[str]] = []

    def fake_run(command: list[str], **kwargs: object) -> object:
        calls.append(command)
        raise AssertionError(f"nvcc ran: {command[:2]}")

    monkeypatch.setattr(
        compiler,
        "subprocess",
        types.SimpleNamespace(run=fake_run, TimeoutExpired=subprocess.TimeoutExpired),
    )
    return calls


def test_an_intact_entry_is_served(cache: ArtifactCache, pristine: BuildResult) -> None:
    hit = lookup(SMALL, H200, cache)
    assert hit is not None and hit.cached and hit.cubin is not None
    assert hit.cubin.read_bytes() == pristine.cubin.read_bytes()  # type: ignore[union-attr]


def garble(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def drop_ptxas(path: Path) -> None:
    record = json.loads((path.parent / "build.json").read_text())
    del record["ptxas"]
    (path.parent / "build.json").write_text(json.dumps(record))


def garble_record(path: Path) -> None:
    (path.parent / "build.json").write_text('{"key": ')


@pytest.mark.parametrize("damage", [garble, truncate, drop_ptxas, garble_record])
def test_a_damaged_entry_is_a_logged_miss_and_evicted(
    cache: ArtifactCache,
    pristine: BuildResult,
    damage,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    fault_summary,
) -> None:  # type: ignore[no-untyped-def]
    directory = entry_dir(cache, pristine)
    damage(directory / "kernel.cubin")
    no_nvcc(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="autotune"):
        hit = lookup(SMALL, H200, cache)
    named = any(str(directory) in r.getMessage() for r in caplog.records)
    fault_summary(
        {
            "case": f"cubin cache: {damage.__name__.replace('_', ' ')}",
            "served": hit is not None,
            "evicted": not directory.exists(),
            "logged_with_its_path": named,
            "rebuilt": "by the next plain compile "
            "(test_a_damaged_entry_is_rebuilt_by_a_plain_compile)",
        }
    )
    assert hit is None
    assert not directory.exists(), "the damaged entry was left in the cache"
    assert named, caplog.text


def test_a_damaged_entry_is_rebuilt_by_a_plain_compile(
    cache: ArtifactCache, pristine: BuildResult, caplog: pytest.LogCaptureFixture, fault_summary
) -> None:  # type: ignore[no-untyped-def]
    """Detected by its digest and evicted, the entry is built again by a compile without
    --force (the cache has nothing to keep), and what it holds then is a valid cubin."""
    directory = entry_dir(cache, pristine)
    truncate(directory / "kernel.cubin")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        rebuilt = compile_config(SMALL, H200, cache)
    served = lookup(SMALL, H200, cache)
    cubin = (directory / "kernel.cubin").read_bytes() if directory.exists() else b""
    record = json.loads((directory / "build.json").read_text()) if directory.exists() else {}
    detected = any("SHA-256" in r.getMessage() for r in caplog.records)
    try:
        valid = read_launch_info(cubin) == pristine.launch_info
    except Exception:  # noqa: BLE001 - a damaged cubin served again is this case's failure
        valid = False
    fault_summary(
        {
            "case": "cubin cache: truncated cubin rebuilt by a plain compile",
            "detected_by_digest": detected,
            "rebuilt": rebuilt.ok and not rebuilt.cached,
            "served_after": served is not None and served.cached,
            "valid_cubin": valid,
        }
    )
    assert detected, caplog.text
    assert rebuilt.ok and not rebuilt.cached, rebuilt.message
    assert valid
    assert record["cubin_sha256"] == hashlib.sha256(cubin).hexdigest()
    assert served is not None and served.cached and served.cubin == directory / "kernel.cubin"


def test_force_replaces_a_broken_entry(
    cache: ArtifactCache, pristine: BuildResult, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = entry_dir(cache, pristine)
    garble(directory / "kernel.cubin")
    garbled = (directory / "kernel.cubin").read_bytes()
    assert main(["compile", "--config", SMALL.to_json(), "--force", "--quiet"]) == 0
    capsys.readouterr()
    cubin = (directory / "kernel.cubin").read_bytes()
    record = json.loads((directory / "build.json").read_text())
    assert cubin != garbled and read_launch_info(cubin) == pristine.launch_info
    assert record["cubin_sha256"] == hashlib.sha256(cubin).hexdigest()


def test_an_unwritable_cache_is_one_clear_error_before_nvcc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "readonly-cache"
    monkeypatch.setenv("CUTE_AUTOTUNE_CACHE", str(root))
    calls = no_nvcc(monkeypatch)
    with read_only(root):
        rc = main(["compile", "--config", SMALL.to_json(), "--quiet"])
    err = capsys.readouterr().err
    assert calls == []
    assert rc == 2 and str(root) in err and "CUTE_AUTOTUNE_CACHE" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_read_only_cache_still_serves_its_entries(
    cache: ArtifactCache, pristine: BuildResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_nvcc(monkeypatch)
    with read_only(cache.root.parent):
        hit = lookup(SMALL, H200, ArtifactCache(cache.root.parent))
        assert hit is not None and hit.cubin is not None
        assert hit.cubin.read_bytes() == pristine.cubin.read_bytes()  # type: ignore[union-attr]
