"""sm90 family on an H100/H200: every valid config of a sub-space against the fp32 reference,
through `cute-autotune check` (tests/gpu/subspace.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .subspace import check_subspace

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not _hopper(), reason="the sm90 family needs compute capability 9.0")
@pytest.mark.parametrize("causal", ["false", "true"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_valid_sm90_config_passes_the_validator(tmp_path: Path, head_dim: int, dtype: str,
                                                      causal: str) -> None:
    check_subspace(tmp_path, "sm90", head_dim, dtype, causal)
