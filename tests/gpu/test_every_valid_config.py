"""Every valid config of a sub-space of each kernel family against the fp32 reference, on a real
GPU, through `cute-autotune check` (tests/gpu/subspace.py; CUTE_AUTOTUNE_GPU_SAMPLE=N validates a
random N configs per sub-space instead of all, CUTE_AUTOTUNE_EVIDENCE_DIR keeps each report).

The sm90 family runs only on compute capability 9.0 (H100/H200)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .subspace import check_subspace

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("causal", ["false", "true"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("family", ["sm80", "sm90"])
def test_every_valid_config_passes_the_validator(
    tmp_path: Path, family: str, head_dim: int, dtype: str, causal: str
) -> None:
    if family == "sm90" and not _hopper():
        pytest.skip("the sm90 family needs compute capability 9.0")
    check_subspace(tmp_path, family, head_dim, dtype, causal)
