"""The backward family built with the real nvcc (no GPU needed): its default config compiles
through the same path as the forward families, the cubin carries the three entries and the
LaunchInfo the launcher reads, and ptxas' report is the main entry's."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.build.cache import ArtifactCache
from autotune.build.compiler import compile_config
from autotune.build.cubin import CubinError, read_launch_info
from autotune.model.space import INFO_SYMBOLS, load_space
from autotune.model.target import target_for_arch

pytestmark = pytest.mark.nvcc
H200 = target_for_arch("sm_90")


def test_default_config_builds_with_its_entries_and_launch_info(tmp_path: Path) -> None:
    space = load_space("bwd")
    config = space.heuristic({"head_dim": 64, "dtype": "fp16", "causal": True})
    assert config is not None
    result = compile_config(config, H200, ArtifactCache(tmp_path))
    assert result.ok, result.message
    assert result.ptxas is not None and result.ptxas.function == "cute_autotune_bwd"
    assert result.cubin is not None
    data = result.cubin.read_bytes()
    for entry in (b"cute_autotune_bwd\0", b"cute_autotune_bwd_pre\0", b"cute_autotune_bwd_post\0"):
        assert entry in data
    info = read_launch_info(result.cubin, INFO_SYMBOLS["backward"])
    assert info == result.launch_info
    assert (info.head_dim, info.causal, info.block_m, info.block_n, info.threads) == (
        64,
        1,
        64,
        128,
        256,
    )
    assert info.abi_version == 3  # kBwdAbiVersion: the launcher's BwdKernel checks it
    derived = space.derived_values(config, H200)
    assert info.smem_bytes == derived["smem_bytes"]
    with pytest.raises(CubinError, match="cute_autotune_fwd_info"):
        read_launch_info(result.cubin)  # not a forward cubin
