"""sm90 family on an H100/H200: every valid config of a sub-space against the fp32 reference,
through `cute-autotune check` (compile, then validate each config in a worker process).
CUTE_AUTOTUNE_GPU_SAMPLE=N validates a random N configs per sub-space."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autotune.cli import main

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
    report = tmp_path / f"check_sm90_d{head_dim}_{dtype}_{causal}.json"
    args = ["check", "--family", "sm90", "--head-dim", str(head_dim), "--dtype", dtype,
            "--causal", causal, "--json", str(report), "--quiet"]
    sample = os.environ.get("CUTE_AUTOTUNE_GPU_SAMPLE")
    if sample:
        args += ["--sample", sample, "--seed", "0"]
    rc = main(args)
    data = json.loads(report.read_text())
    assert data["valid"] > 0 and data["compiled"] == data["valid"], data["failures"]
    assert data["passed"] == data["valid"], "\n".join(
        f"{f['name']}: {f['status']}: {f['reason']}" for f in data["failures"])
    assert rc == 0
