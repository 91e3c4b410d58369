"""benchmarks/sdpa_through_dispatch.py (issue 38, item 3) without a GPU: the scratch results it
imports make dispatch choose torch SDPA's default for every problem it times, per head dim."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from autotune.model import target_for_arch
from autotune.runtime.dispatch import Dispatcher
from autotune.store import TuningStore
from autotune.store.records import DeviceInfo

REPO = Path(__file__).resolve().parents[2]
H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")


def test_dispatch_picks_sdpa_for_every_row(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "sdpa_through_dispatch", REPO / "benchmarks" / "sdpa_through_dispatch.py"
    )
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["sdpa_through_dispatch"] = bench
    spec.loader.exec_module(bench)

    chosen = bench.problems()
    assert {p.head_dim for _, p in chosen} == {64, 96, 128, 256}
    assert {layout for layout, _ in chosen} == {"bhld", "blhd"}
    url = f"sqlite:///{tmp_path}/sdpa.db"
    TuningStore(url).import_results(
        bench.scratch_results(H200, sorted({p for _, p in chosen}, key=str))
    )
    dispatcher = Dispatcher(url, use_shipped=False)
    for _, problem in chosen:
        decision = dispatcher.would_run(problem, H200, target_for_arch(90))
        assert decision.config is not None and decision.config.family == "sdpa", decision
        assert decision.sdpa_backend == "default"
