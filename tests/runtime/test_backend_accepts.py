"""Whether a torch SDPA backend dispatch chose runs the caller's inputs is found by one real
call, made once per kind of input and length class: a cache growing by a token per step does
not pay a second attention call at every step (before, it did: the check was made per exact
geometry, and each new length is a new geometry)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import autotune.measure.sdpa as sdpa_module
from autotune.model.buckets import length_class
from autotune.runtime import attention as attention_module
from autotune.runtime.attention import sdpa_route


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The checking calls made, as (backend, Lk); a backend named "refusing" raises as torch
    does for inputs a backend does not take."""
    made: list[tuple[str, int]] = []

    def fake_call(backend: str, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        def run() -> None:
            made.append((backend, k.shape[2 if kwargs["layout"] == "bhld" else 1]))
            if backend == "refusing":
                raise RuntimeError("No available kernel. Aborting execution.")

        return run

    monkeypatch.setattr(sdpa_module, "sdpa_call", fake_call)
    attention_module._accepted.clear()
    return made


def _accepts(
    backend: str, lk: int, *, dtype: torch.dtype = torch.float16, layout: str = "bhld", lq: int = 1
) -> bool:
    shape_q, shape_kv = (2, 8, lq, 64), (2, 2, lk, 64)
    if layout == "blhd":
        shape_q, shape_kv = (2, lq, 8, 64), (2, lk, 2, 64)
    q = torch.zeros(shape_q, dtype=dtype)
    kv = torch.zeros(shape_kv, dtype=dtype)
    return attention_module._accepts(backend, q, kv, kv, causal=True, scale=None, layout=layout)


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
def test_a_growing_cache_is_checked_once_per_length_class(
    calls: list[tuple[str, int]], layout: str
) -> None:
    lengths = range(1000, 1400)
    assert all(_accepts("flash", n, layout=layout) for n in lengths)
    classes = {length_class(n) for n in lengths}
    assert len(calls) == len(classes) < len(lengths) / 50
    assert {length_class(n) for _, n in calls} == classes


def test_a_refusal_is_remembered_too(calls: list[tuple[str, int]]) -> None:
    assert not _accepts("refusing", 2048)
    assert not _accepts("refusing", 2049)
    assert calls == [("refusing", 2048)]


def test_another_kind_of_input_is_checked_again(calls: list[tuple[str, int]]) -> None:
    assert _accepts("flash", 512)
    assert _accepts("efficient", 512)  # another backend
    assert _accepts("flash", 512, dtype=torch.bfloat16)  # another dtype
    assert _accepts("flash", 512, lq=4)  # another query length
    assert _accepts("flash", 512 * 4)  # another length class
    assert _accepts("flash", 513)  # the first one's class
    assert len(calls) == 5


def test_torch_s_default_needs_no_check(calls: list[tuple[str, int]]) -> None:
    assert _accepts("default", 100) and calls == []


@pytest.mark.parametrize("chosen", ["default", "cudnn"])
@pytest.mark.parametrize("lq", [1, 4, 16])
def test_a_decode_sized_call_leaves_the_backends_that_plan_per_length(
    chosen: str, lq: int
) -> None:
    """cuDNN builds an execution plan per new key length: a decode step of a growing cache goes
    to FlashAttention's backend, or the memory-efficient one where flash refuses the inputs."""
    assert sdpa_route(chosen, lq, lambda backend: True) == "flash"
    assert sdpa_route(chosen, lq, lambda backend: backend == "efficient") == "efficient"
    assert sdpa_route(chosen, lq, lambda backend: False) == chosen


@pytest.mark.parametrize("chosen", ["flash", "efficient"])
def test_a_backend_without_a_plan_per_length_is_kept(chosen: str) -> None:
    assert sdpa_route(chosen, 1, lambda backend: True) == chosen


def test_a_prefill_sized_call_keeps_torch_s_choice() -> None:
    asked: list[str] = []
    assert sdpa_route("default", 17, lambda b: asked.append(b) or True) == "default"
    assert asked == []
