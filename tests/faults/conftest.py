"""Helpers of the fault-injection suite: real read-only folders, config and export builders,
and the suite's summary (one line per case at the end of the run, and a JSON file)."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

H200_DEVICE = {
    "name": "NVIDIA H200",
    "compute_capability": 90,
    "sm_count": 132,
    "driver_version": "580.159.04",
    "cuda_version": "13.0",
}


def sm80_config(**changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "family": "sm80",
        "head_dim": 128,
        "dtype": "fp16",
        "causal": False,
        "block_m": 128,
        "block_n": 64,
        "num_warps": 4,
        "kv_stages": 2,
        "swizzle": 3,
        "q_in_regs": False,
    }
    values.update(changes)
    return values


def export_entry(seqlen: int = 2048, **changes: Any) -> dict[str, Any]:
    """One valid exported best config (an sm80 one of B4 H16 D128 fp16 on the H200)."""
    entry: dict[str, Any] = {
        "device": dict(H200_DEVICE),
        "problem": {
            "batch": 4,
            "heads_q": 16,
            "heads_kv": 16,
            "seqlen_q": seqlen,
            "seqlen_k": seqlen,
            "head_dim": 128,
            "dtype": "fp16",
            "causal": False,
        },
        "family": "sm80",
        "config": sm80_config(),
        "median_us": 400.0,
        "tflops": 343.6,
        "sdpa_default_us": 230.0,
        "sdpa_flash_us": 460.0,
        "trials": 24,
        "study": "s",
        "source": "tuned",
    }
    entry.update(changes)
    return entry


def export_doc(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "format": "cute-autotune-results",
        "version": 1,
        "schema": "0.1.0",
        "exported_at": "2026-12-01T00:00:00+00:00",
        "results": entries,
    }


def _mount_read_only(path: Path) -> bool:
    """Bind-mount `path` read-only over itself (root ignores file modes, not a read-only
    mount: this is the EROFS a read-only volume gives)."""
    for command in (
        ["mount", "--bind", str(path), str(path)],
        ["mount", "-o", "remount,bind,ro", str(path)],
    ):
        if subprocess.run(command, capture_output=True).returncode != 0:
            subprocess.run(["umount", str(path)], capture_output=True)
            return False
    return True


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """Make the folder `path` really read-only for this process while the block runs: file
    modes for an ordinary user, a read-only bind mount for root (skips where neither works)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
        try:
            yield path
        finally:
            path.chmod(mode)
        return
    if not _mount_read_only(path):
        pytest.skip("running as root and a read-only bind mount is not allowed here")
    try:
        yield path
    finally:
        # lazily: a database engine of the test may still hold a file open in it
        subprocess.run(["umount", "--lazy", str(path)], capture_output=True, check=True)


# -- the fault suite's summary ----------------------------------------------------------------

# A JSON file that receives every case of the fault suite run in this session (issue 17:
# benchmarks/results/fault_suite.json is made this way).
SUMMARY_ENV = "CUTE_AUTOTUNE_FAULT_SUMMARY"
_cases: list[dict[str, Any]] = []


@pytest.fixture
def fault_summary() -> Callable[[dict[str, Any]], None]:
    """Adds one case to the suite's summary (printed at the end of the run, and written to
    $CUTE_AUTOTUNE_FAULT_SUMMARY): what was done to it and what came out, before its asserts
    run, so that a failing case is in the summary too."""
    return _cases.append


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _cases:
        return
    terminalreporter.section("fault suite")
    for case in _cases:
        terminalreporter.write_line(json.dumps(case))
    out = os.environ.get(SUMMARY_ENV)
    if out:
        doc = {
            "command": f"{SUMMARY_ENV}={out} python -m pytest {' '.join(sys.argv[1:])}",
            "cases": _cases,
        }
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
