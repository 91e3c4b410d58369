"""Validate every valid config of one sub-space through `cute-autotune check` (compile, then
validate each config in a worker process that may crash without taking the test down).

CUTE_AUTOTUNE_GPU_SAMPLE=N validates a random N configs of the sub-space instead of all;
CUTE_AUTOTUNE_EVIDENCE_DIR keeps each check's JSON report there."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from autotune.cli.main import main


def check_subspace(tmp_path: Path, family: str, head_dim: int, dtype: str, causal: str) -> None:
    report = tmp_path / f"check_{family}_d{head_dim}_{dtype}_{causal}.json"
    args = [
        "check",
        "--family",
        family,
        "--head-dim",
        str(head_dim),
        "--dtype",
        dtype,
        "--causal",
        causal,
        "--json",
        str(report),
        "--quiet",
    ]
    sample = os.environ.get("CUTE_AUTOTUNE_GPU_SAMPLE")
    if sample:
        args += ["--sample", sample, "--seed", "0"]
    rc = main(args)
    data = json.loads(report.read_text())
    evidence = os.environ.get("CUTE_AUTOTUNE_EVIDENCE_DIR")
    if evidence:
        Path(evidence).mkdir(parents=True, exist_ok=True)
        shutil.copy(report, Path(evidence) / report.name)
    assert data["valid"] > 0 and data["compiled"] == data["valid"], data["failures"]
    assert data["passed"] == data["valid"], "\n".join(
        f"{f['name']}: {f['status']}: {f['reason']}" for f in data["failures"]
    )
    assert rc == 0
