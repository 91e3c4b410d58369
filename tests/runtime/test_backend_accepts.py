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
from autotune.runtime.attention import sdpa_route, seen_growing


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


@pytest.mark.parametrize("lq", [1, 4, 16])
def test_a_growing_decode_call_leaves_torch_s_default(lq: int) -> None:
    """torch's default builds a plan per new key length on decode-sized calls: a geometry seen
    growing goes to cuDNN named alone (no plan per length), else flash, else efficient."""
    assert sdpa_route("default", lq, True, lambda backend: True) == "cudnn"
    assert sdpa_route("default", lq, True, lambda backend: backend != "cudnn") == "flash"
    assert sdpa_route("default", lq, True, lambda backend: backend == "efficient") == "efficient"
    assert sdpa_route("default", lq, True, lambda backend: False) == "default"


def test_a_call_at_one_length_a_named_backend_and_prefill_keep_their_backend() -> None:
    asked: list[str] = []

    def accepts(backend: str) -> bool:
        asked.append(backend)
        return True

    assert sdpa_route("default", 1, False, accepts) == "default"  # not seen growing
    assert sdpa_route("cudnn", 1, True, accepts) == "cudnn"  # measured as itself
    assert sdpa_route("flash", 1, True, accepts) == "flash"
    assert sdpa_route("default", 17, True, accepts) == "default"  # prefill-sized
    assert asked == []


def test_growth_is_two_lengths_in_one_class_or_a_class_after_the_one_below() -> None:
    attention_module._lengths_seen.clear()
    geometry = ("B1 H32/8 Lq1 D128", "bf16")
    assert not seen_growing(geometry, 4096)  # a first length
    assert not seen_growing(geometry, 4096)  # the same again
    assert seen_growing(geometry, 4097)  # a second length of the class: growing
    other = ("B8 H32/8 Lq1 D128", "bf16")
    assert not seen_growing(other, 1024)
    assert not seen_growing(other, 4096)  # a few fixed lengths, classes apart
    assert not seen_growing(other, 16384)
    upper = next(n for n in range(1024, 4096) if length_class(n) > length_class(1024))
    assert seen_growing(other, upper)  # the class just above one seen: grown into it
    assert len(attention_module._lengths_seen) == 2
