"""Dispatch and the KV-cache entry on a GPU machine without the CUDA toolkit (CPU: the GPU's
identity and the kernel load are stubbed; the build lookup, the kernel pack and the database are
real): tuned configs run from the kernel pack, and a pack that cannot be used, or none, leaves
torch SDPA with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.build import pack as pack_module
from autotune.build.compiler import BuildResult
from autotune.launch.tensors import InputError
from autotune.model.problem import Problem
from autotune.model.status import Status
from autotune.runtime import dispatch as dispatch_module
from autotune.runtime import kvcache
from autotune.runtime.dispatch import Dispatcher
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore

from ..kernel_pack import H200, NO_NVCC, decode64, entry_folder, make_pack, sm80_64, without_nvcc

GPU = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
P64 = Problem(4, 16, 16, 2048, 2048, 64, "fp16", False)


class LoadedKernel:
    """Stands in for CompiledKernel: remembers the build it was given."""

    def __init__(self, build: BuildResult, device: int = 0) -> None:
        assert build.ok and build.cubin is not None and build.cubin.is_file()
        self.build = build
        self.config = build.config
        self.num_splits = 1


@pytest.fixture
def dispatcher(tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> Dispatcher:
    """A dispatcher of an H200 whose database holds an sm80 config tuned for P64."""
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [])
    monkeypatch.setattr(dispatch_module, "CompiledKernel", LoadedKernel)
    d = Dispatcher(f"sqlite:///{tmp_path}/user.db", untuned="kernel")
    d._identify = lambda device_index: (GPU, H200)  # type: ignore[method-assign]
    TuningStore(d.db).set_best(
        GPU,
        P64,
        TrialResult(sm80_64(), Status.OK, median_us=300.0),
        measurement_id=None,
        study="s",
        trials=1,
        sdpa_default_us=400.0,
        sdpa_flash_us=500.0,
    )
    return d


@pytest.fixture
def no_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUTE_AUTOTUNE_KERNELS", raising=False)
    monkeypatch.setattr(pack_module, "find_spec", lambda name: None)


def test_without_nvcc_the_tuned_config_runs_from_the_pack(
    tmp_path: Path, dispatcher: Dispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = make_pack(tmp_path / "pack", [sm80_64()], monkeypatch)
    without_nvcc(monkeypatch)
    decision = dispatcher.decide(P64, 0)
    assert decision.path == "exact" and decision.config == sm80_64()
    assert isinstance(decision.kernel, LoadedKernel)
    assert decision.kernel.build.cubin == entry_folder(package, sm80_64()) / "kernel.cubin"


def test_with_neither_pack_nor_nvcc_torch_sdpa_runs_with_the_reason(
    dispatcher: Dispatcher, monkeypatch: pytest.MonkeyPatch, no_pack: None
) -> None:
    without_nvcc(monkeypatch)
    decision = dispatcher.decide(P64, 0)  # no exception: a reason
    assert decision.path == "fallback" and decision.kernel is None
    assert NO_NVCC in decision.reason and "no kernel pack is installed" in decision.reason
    assert "fwd_sm80_d64" in decision.reason  # the tuned config, passed over
    assert "fallback to torch SDPA" in decision.describe()


def test_compile_on_miss_off_keeps_its_reason(dispatcher: Dispatcher, no_pack: None) -> None:
    dispatcher.compile_on_miss = False
    decision = dispatcher.decide(P64, 0)
    assert decision.path == "fallback" and "compile-on-miss is off" in decision.reason


@pytest.mark.parametrize(
    "fault, reason",
    [
        ("tampered", "does not match its recorded SHA-256"),
        ("other sources", "built from other sm80 kernel sources"),
    ],
)
def test_a_pack_that_cannot_be_used_is_passed_over_with_the_reason(
    tmp_path: Path,
    dispatcher: Dispatcher,
    monkeypatch: pytest.MonkeyPatch,
    fault: str,
    reason: str,
) -> None:
    package = make_pack(tmp_path / "pack", [sm80_64()], monkeypatch)
    without_nvcc(monkeypatch)
    if fault == "tampered":
        (entry_folder(package, sm80_64()) / "kernel.cubin").write_bytes(b"\x7fELF tampered")
    else:
        monkeypatch.setattr(pack_module, "family_source_hash", lambda space: "0" * 16)
    decision = dispatcher.decide(P64, 0)
    assert decision.kernel is None and decision.path == "fallback"
    assert reason in decision.reason


@pytest.fixture
def decode_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_kernel on a stubbed H200 with an empty kernel memo."""
    monkeypatch.setattr(kvcache, "_kernels", {})
    monkeypatch.setattr(kvcache, "CompiledKernel", LoadedKernel)
    monkeypatch.setattr(kvcache, "target_for_device", lambda device: H200)


def test_decode_kernels_come_from_the_pack_without_nvcc(
    tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch, decode_here: None
) -> None:
    package = make_pack(tmp_path / "pack", [decode64()], monkeypatch)
    without_nvcc(monkeypatch)
    kernel: Any = kvcache.decode_kernel(
        decode64(4), head_dim=64, dtype="fp16", causal=False, device=0
    )
    assert kernel.build.cubin == entry_folder(package, decode64()) / "kernel.cubin"
    assert kernel.config == decode64(4)
    # the family's default for the head dim is packed too here: no config given
    assert (
        kvcache.decode_kernel(None, head_dim=64, dtype="fp16", causal=False, device=0).build.cubin
        == kernel.build.cubin
    )


def test_a_decode_kernel_found_nowhere_says_why(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch, decode_here: None, no_pack: None
) -> None:
    without_nvcc(monkeypatch)
    with pytest.raises(InputError, match="did not build: infrastructure: .*nvcc not found"):
        kvcache.decode_kernel(decode64(), head_dim=64, dtype="fp16", causal=False, device=0)
