"""`attention()` checks its arguments once, for the kernel path and the SDPA fallback alike:
what is not a tensor, a dtype nothing computes attention in, or an invalid scale is a ValueError
naming the argument, never a NaN output or an error deep inside torch."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch

from autotune.launch.tensors import InputError
from autotune.runtime.attention import attention


def qkv(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    make = lambda h, n: torch.randn(2, h, n, 64).to(dtype)  # noqa: E731
    return make(4, 16), make(2, 20), make(2, 20)


@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize(
    "convert",
    [lambda t: t.tolist(), lambda t: t.numpy(), lambda t: None, lambda t: 3.0],
    ids=["list", "numpy", "None", "float"],
)
def test_what_is_not_a_tensor_is_named(which: int, convert: Any) -> None:
    args = list(qkv())
    args[which] = convert(args[which])
    name = "qkv"[which]
    with pytest.raises(InputError, match=f"{name} must be a torch.Tensor"):
        attention(*args)


@pytest.mark.parametrize(
    "dtype",
    [torch.int32, torch.int64, torch.bool, torch.uint8, torch.complex64, torch.float8_e4m3fn],
)
def test_a_dtype_attention_is_not_defined_in_is_named(dtype: torch.dtype) -> None:
    q, k, v = (t.to(dtype) for t in qkv())
    with pytest.raises(InputError, match=f"q has dtype {dtype}"):
        attention(q, k, v)


@pytest.mark.parametrize(
    "scale",
    [
        math.nan,
        math.inf,
        -math.inf,
        0.0,
        -1.0,
        True,
        "0.125",
        np.float32("nan"),
        torch.tensor(0.125),
    ],
    ids=["nan", "inf", "-inf", "zero", "negative", "bool", "str", "numpy-nan", "tensor"],
)
def test_an_invalid_scale_is_refused_on_the_fallback_path(scale: Any) -> None:
    with pytest.raises(InputError, match="scale"):
        attention(*qkv(), scale=scale)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"causal": "yes"}, "causal"),
        ({"causal": None}, "causal"),
        ({"return_lse": 1}, "return_lse"),
    ],
)
def test_flags_are_booleans(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(InputError, match=name):
        attention(*qkv(), **kwargs)


def test_valid_scales_still_run() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for scale in (None, 0.125, 2, np.float64(0.5)):
            out = attention(*qkv(torch.float64), scale=scale)
            assert bool(torch.isfinite(out).all())
