"""benchmarks/quick_tune.py (issue 38, item 4) without a GPU: the problems it tunes are drawn by
the seed, half prefill and half decode, with D=256 and fp16 among them, for any seed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seed", range(12))
def test_the_problems_span_what_the_issue_asks(seed: int) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "quick_tune", REPO / "benchmarks" / "quick_tune.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["quick_tune"] = bench
    spec.loader.exec_module(bench)
    picked = bench.chosen(seed, 8)
    assert len({d.problem for d in picked}) == 8
    assert sum(d.kind == "prefill" for d in picked) == 4
    assert any(d.problem.head_dim == 256 for d in picked)
    assert any(d.problem.dtype == "fp16" for d in picked)
    assert [d.problem for d in picked] == [d.problem for d in bench.chosen(seed, 8)]
    assert "--quick" not in bench.problem_args(picked[0].problem)
