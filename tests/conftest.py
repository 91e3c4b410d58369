from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _nvcc_available() -> bool:
    from autotune.toolchain import ToolchainError, find_nvcc

    try:
        find_nvcc()
    except ToolchainError:
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    no_nvcc = pytest.mark.skip(reason="needs nvcc (the CUDA toolkit)")
    gpu, nvcc = _gpu_available(), _nvcc_available()
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(no_gpu)
        if "nvcc" in item.keywords and not nvcc:
            item.add_marker(no_nvcc)


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private cache directory for one test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("CUTE_AUTOTUNE_CACHE", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)
