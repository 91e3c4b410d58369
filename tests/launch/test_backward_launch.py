"""CompiledBackward's Python side on CPU tensors, with the launcher's kernel replaced by a
recorder: what reaches the plan (strides per operand and layout, sizes, the scale) and the
launch (addresses, workspaces of the rounded query length), and the inputs it refuses."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from autotune.launch import backward
from autotune.launch.backward import CompiledBackward
from autotune.launch.tensors import InputError


class RecordingKernel:
    def __init__(self) -> None:
        self.plans: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.launches: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def plan(self, *strides: Any, **sizes: Any) -> Any:
        self.plans.append((strides, sizes))
        rounded = (sizes["seqlen_q"] + 127) // 128 * 128

        def launch(*ptrs: Any, **rest: Any) -> None:
            self.launches.append((ptrs, rest))

        return SimpleNamespace(seqlen_q_rounded=rounded, launch=launch)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> tuple[CompiledBackward, RecordingKernel]:
    recorder = RecordingKernel()
    monkeypatch.setattr(backward, "current_stream_handle", lambda device: 7)
    compiled = CompiledBackward.__new__(CompiledBackward)
    compiled.config = {  # type: ignore[assignment]
        "causal": True,
        "deterministic": False,
        "block_m": 64,
        "d_slices": 1,
    }
    compiled.device = 0
    compiled._kernel = recorder
    return compiled, recorder


def tensors(layout: str) -> dict[str, torch.Tensor]:
    b, hq, hkv, lq, lk, d = 2, 6, 2, 130, 77, 64
    shape_q = (b, hq, lq, d) if layout == "bhld" else (b, lq, hq, d)
    shape_k = (b, hkv, lk, d) if layout == "bhld" else (b, lk, hkv, d)
    q = torch.randn(shape_q, dtype=torch.bfloat16)
    k = torch.randn(shape_k, dtype=torch.bfloat16)
    return {
        "q": q,
        "k": k,
        "v": torch.randn_like(k),
        "out": torch.randn_like(q),
        "dout": torch.randn_like(q),
        "lse": torch.randn(b, hq, lq, dtype=torch.float32),
    }


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
def test_plan_and_launch_get_every_operand(kernel: Any, layout: str) -> None:
    compiled, recorder = kernel
    t = tensors(layout)
    dq, dk, dv = compiled(t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"], layout=layout)
    assert dq.shape == t["q"].shape and dk.shape == t["k"].shape and dv.shape == t["v"].shape
    ((strides, sizes),) = recorder.plans
    views = [
        x if layout == "bhld" else x.transpose(1, 2)
        for x in (t["q"], t["k"], t["v"], t["out"], t["dout"], dq, dk, dv)
    ]
    assert list(strides) == [(x.stride(0), x.stride(1), x.stride(2)) for x in views]
    assert sizes == {
        "batch": 2,
        "heads_q": 6,
        "heads_kv": 2,
        "seqlen_q": 130,
        "seqlen_k": 77,
        "head_dim": 64,
        "dtype": 1,
        "causal": True,
        "scale": pytest.approx(1 / math.sqrt(64)),
    }
    ((ptrs, rest),) = recorder.launches
    order = (t["q"], t["k"], t["v"], t["out"], t["dout"], dq, dk, dv)
    assert list(ptrs) == [x.data_ptr() for x in order]
    assert rest["lse"] == t["lse"].data_ptr() and rest["stream"] == 7
    assert rest["dq_semaphore"] == 0  # not a deterministic config
    assert {rest["lse_log2"], rest["dpsum"], rest["dq_accum"]}.isdisjoint({0})


def test_a_deterministic_config_gets_a_counter_per_query_tile(kernel: Any) -> None:
    compiled, recorder = kernel
    compiled.config = {"causal": True, "deterministic": True, "block_m": 64, "d_slices": 2}
    t = tensors("bhld")
    compiled(t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"])
    ((_, rest),) = recorder.launches
    assert rest["dq_semaphore"] != 0


def test_given_gradients_are_written_into(kernel: Any) -> None:
    compiled, recorder = kernel
    t = tensors("bhld")
    mine = [torch.empty_like(t[name]) for name in ("q", "k", "v")]
    got = compiled(
        t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"], dq=mine[0], dk=mine[1], dv=mine[2]
    )
    assert all(a is b for a, b in zip(got, mine, strict=True))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lse": torch.randn(2, 6, 131)}, "lse must be a contiguous fp32"),
        ({"lse": torch.randn(2, 6, 130, dtype=torch.float64)}, "lse must be a contiguous fp32"),
        ({"out": torch.randn(2, 6, 130, 64, dtype=torch.float16)}, "out must match"),
        ({"dout": torch.randn(2, 6, 129, 64, dtype=torch.bfloat16)}, "dout must match"),
        ({"k": torch.randn(2, 4, 77, 64, dtype=torch.bfloat16)}, "k and v must have the same"),
    ],
)
def test_bad_inputs_are_refused_before_any_launch(kernel: Any, change: dict, message: str) -> None:
    compiled, recorder = kernel
    t = {**tensors("bhld"), **change}
    with pytest.raises(InputError, match=message):
        compiled(t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"])
    assert not recorder.launches


def test_a_gradient_given_with_another_shape_is_refused(kernel: Any) -> None:
    compiled, recorder = kernel
    t = tensors("bhld")
    with pytest.raises(InputError, match="dk must match"):
        compiled(
            t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"], dk=torch.empty_like(t["q"])
        )
    assert not recorder.launches
