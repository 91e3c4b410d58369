"""A GPU model with no results of its own reads the shipped results of the GPU model of the same
compute capability and SM count (an H100 SXM reads the H200's), and its decisions say so; a
GPU of another SM count, a database holding the GPU's own results, or shipped results turned
off keep to its own (none). The GPU identity and kernel loading are stubbed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import Target
from autotune.runtime import dispatch as dispatch_module
from autotune.runtime.dispatch import Dispatcher
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
H100_SXM = DeviceInfo("NVIDIA H100 80GB HBM3", 90, 132, "", "13.0")
H100_PCIE = DeviceInfo("NVIDIA H100 PCIe", 90, 114, "", "13.0")
P = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)


class FakeKernel:
    def __init__(self, config: Config) -> None:
        self.config = config


def _tuned(store: TuningStore, device: DeviceInfo, us: float, block_n: int) -> Config:
    config = load_space("sm80").config(
        **P.space_values(),
        block_m=128,
        block_n=block_n,
        num_warps=8,
        kv_stages=3,
        swizzle=3,
        q_in_regs=True,
    )
    store.set_best(
        device,
        P,
        TrialResult(config, "ok", median_us=us),
        measurement_id=None,
        study="s",
        trials=30,
        sdpa_default_us=2 * us,
        sdpa_flash_us=3 * us,
    )
    return config


@pytest.fixture
def shipped_h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    source = TuningStore(f"sqlite:///{tmp_path}/ship.db")
    config = _tuned(source, H200, 300.0, 64)
    document = json.loads(json.dumps(source.export()))
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [document])
    return config


def _dispatcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: DeviceInfo, **kwargs: Any
) -> Dispatcher:
    monkeypatch.setattr(dispatch_module, "device_info", lambda index: gpu)
    monkeypatch.setattr(
        dispatch_module,
        "target_for_device",
        lambda index: Target(gpu.compute_capability, 232448, gpu.name),
    )
    d = Dispatcher(f"sqlite:///{tmp_path}/user.db", untuned="kernel", **kwargs)
    d._load = lambda config, target, index, problems: FakeKernel(config)  # type: ignore[method-assign,assignment]
    return d


def test_an_h100_sxm_reads_the_shipped_h200_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped_h200: Config
) -> None:
    d = _dispatcher(tmp_path, monkeypatch, H100_SXM)
    decision = d.decide(P, 0)
    assert decision.path == "exact" and decision.config == shipped_h200
    assert "from the results of the NVIDIA H200 (sm_90, 132 SMs)" in decision.reason
    assert d.results_device(H100_SXM).name == "NVIDIA H200"


def test_another_sm_count_has_no_sibling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped_h200: Config
) -> None:
    d = _dispatcher(tmp_path, monkeypatch, H100_PCIE)
    decision = d.decide(P, 0)
    assert decision.path == "heuristic" and "H200" not in decision.reason
    assert d.results_device(H100_PCIE) == H100_PCIE


def test_the_gpus_own_results_come_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped_h200: Config
) -> None:
    own = _tuned(TuningStore(f"sqlite:///{tmp_path}/user.db"), H100_SXM, 350.0, 128)
    d = _dispatcher(tmp_path, monkeypatch, H100_SXM)
    decision = d.decide(P, 0)
    assert decision.path == "exact" and decision.config == own != shipped_h200
    assert "H200" not in decision.reason


def test_without_shipped_results_no_sibling_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped_h200: Config
) -> None:
    d = _dispatcher(tmp_path, monkeypatch, H100_SXM, use_shipped=False)
    assert d.decide(P, 0).path == "heuristic"
    assert d.results_device(H100_SXM) == H100_SXM


def test_the_gpu_is_identified_once_per_dispatcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shipped_h200: Config
) -> None:
    """A cache growing by a token per step decides at every new length class and plans at every
    new length: the GPU's identity and target are read once, not at each."""
    d = _dispatcher(tmp_path, monkeypatch, H100_SXM)
    asked: list[int] = []
    real = dispatch_module.device_info
    monkeypatch.setattr(
        dispatch_module, "device_info", lambda index: asked.append(index) or real(index)
    )
    for length in range(2048, 2048 + 40 * 300, 300):
        d.decide(Problem(4, 16, 16, 1, length, 128, "fp16", False), 0)
    assert asked == [0]
