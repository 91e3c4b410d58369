from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune._paths import kernel_src_dir
from autotune.launch.launcher import build_launcher, import_launcher

pytestmark = pytest.mark.nvcc  # needs cuda.h from the toolkit


def test_builds_once_and_speaks_the_header_abi(cache_root: Path) -> None:
    module = import_launcher()  # bypass the per-process memo, build into this cache
    header = (kernel_src_dir() / "fwd_params.h").read_text()
    abi = int(re.search(r"kAbiVersion = (\d+);", header).group(1))  # type: ignore[union-attr]
    assert module.ABI_VERSION == abi
    path = build_launcher()
    mtime = path.stat().st_mtime_ns
    assert build_launcher() == path and path.stat().st_mtime_ns == mtime  # cached, not rebuilt
    assert str(cache_root) in str(path)


def test_without_a_driver_loading_a_kernel_says_why(cache_root: Path) -> None:
    module = import_launcher()
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is present here")
    except OSError:
        pass
    with pytest.raises(RuntimeError, match="cannot load the CUDA driver"):
        module.Kernel("/nonexistent.cubin", 0, (1, 80, 64, 0, 0, 128, 64, 128, 49152))
