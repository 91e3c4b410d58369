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


def test_splits_reduce_in_clusters_only_where_that_costs_no_wave(cache_root: Path) -> None:
    """A cluster must fit in one GPC, so an H200 holds 15 clusters of 8 one-per-SM CTAs at
    once (120 CTAs, not 132). A grid of 16 such clusters ran in two waves (97 us where its
    128 CTAs take 40 without clusters): its splits go to the combine entry instead. The
    numbers are the H200's (Nsight Compute's Max Active Clusters, 132 SMs)."""
    rule = import_launcher().clusters_cost_no_wave
    assert rule(ctas=64, splits=8, clusters_at_once=15, ctas_at_once=132)  # B1 H32/8 Lq1
    assert not rule(ctas=128, splits=8, clusters_at_once=15, ctas_at_once=132)  # 16 clusters
    assert rule(ctas=120, splits=8, clusters_at_once=15, ctas_at_once=132)
    assert rule(ctas=128, splits=2, clusters_at_once=66, ctas_at_once=132)  # B8 at 2 splits
    # several waves either way: 64 clusters of 8 take 5, their 512 CTAs 4
    assert not rule(ctas=512, splits=8, clusters_at_once=15, ctas_at_once=132)
    assert rule(ctas=256, splits=4, clusters_at_once=33, ctas_at_once=132)  # 2 waves each
    # two CTAs per SM: 16 clusters of 8 fit where 30 do
    assert rule(ctas=128, splits=8, clusters_at_once=30, ctas_at_once=264)
    # no cluster resident at all, or nothing to reduce
    assert not rule(ctas=64, splits=8, clusters_at_once=0, ctas_at_once=132)
    assert not rule(ctas=64, splits=1, clusters_at_once=15, ctas_at_once=132)
