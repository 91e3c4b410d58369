"""The runtime's documented errors for numbers no float holds, and a CPU fallback whose memory
does not grow with the logical size of expanded inputs (issue 37, item 6).

Before: `attention(scale=10**400)` raised OverflowError from `math.isfinite` (the contract is
a ValueError naming the argument), `attention_with_kvcache` the same and took `True` as a
scale, a `num_splits` past the launcher's bound reached pybind11; the CPU fallback with
`return_lse=True` copied K and V to fp32 once per query head, so K and V of 2 MB expanded
with stride 0 to [16, 8, 8192, 128] took 4.6 GB.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autotune.launch.tensors import InputError
from autotune.runtime.attention import attention, valid_scale
from autotune.runtime.kvcache import attention_with_kvcache
from autotune.runtime.sdpa_dropin import scaled_dot_product_attention

HUGE = 10**400  # past float's range: float(HUGE) raises OverflowError
NOT_SCALES = {
    "10**400": HUGE,
    "-10**400": -HUGE,
    "10**5000": 10**5000,
    "Fraction 10**400": Fraction(HUGE),
    "Fraction 10**-400": Fraction(1, HUGE),
    "bool": True,
    "complex": 1j,
    "numpy inf": np.float64("inf"),
    "str": "0.1",
}
SCALES = {"int": 2, "float": 0.125, "numpy": np.float32(0.5), "Fraction": Fraction(1, 8)}


def _qkv(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    return (
        torch.randn(2, 4, 3, 16, dtype=dtype),
        torch.randn(2, 2, 5, 16, dtype=dtype),
        torch.randn(2, 2, 5, 16, dtype=dtype),
    )


@pytest.mark.parametrize("scale", NOT_SCALES.values(), ids=NOT_SCALES.keys())
def test_valid_scale_answers_without_raising(scale: Any) -> None:
    assert valid_scale(scale) is False


@pytest.mark.parametrize("scale", SCALES.values(), ids=SCALES.keys())
def test_every_real_scale_a_float_holds_runs(scale: Any) -> None:
    assert valid_scale(scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CPU fallback says so
        out, lse = attention(*_qkv(), scale=scale, return_lse=True)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())


@pytest.mark.parametrize("name", NOT_SCALES)
def test_attention_refuses_a_scale_no_float_holds_naming_it(
    name: str, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    try:
        attention(*_qkv(), scale=NOT_SCALES[name])
        said = "ran"
    except Exception as error:  # noqa: BLE001 - what it raised is the case's result
        said = f"{type(error).__name__}: {str(error)[:80]}"
    fault_summary({"case": f"attention(scale={name})", "raised": said})
    with pytest.raises(InputError, match="scale must be a finite number > 0"):
        attention(*_qkv(), scale=NOT_SCALES[name])


def _cache_args() -> tuple[torch.Tensor, ...]:
    # [B, L, H, D]: the KV-cache API's default layout (on the CPU: the arguments are checked
    # before the device is)
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(2, 32, 2, 64, dtype=torch.bfloat16)
    return q, cache, cache.clone()


@pytest.mark.parametrize("scale", NOT_SCALES.values(), ids=NOT_SCALES.keys())
def test_attention_with_kvcache_refuses_a_scale_no_float_holds(scale: Any) -> None:
    with pytest.raises(InputError, match="scale must be a finite number > 0"):
        attention_with_kvcache(*_cache_args(), scale=scale)


@pytest.mark.parametrize(
    "splits",
    [HUGE, 65536, 0, -1, True, 2.0, "4"],
    ids=["10**400", "65536", "0", "-1", "bool", "float", "str"],
)
def test_attention_with_kvcache_refuses_num_splits_past_the_launchers_bound(
    splits: Any, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    with pytest.raises(InputError, match="num_splits must be an int from 1 to 65535") as caught:
        attention_with_kvcache(*_cache_args(), num_splits=splits)
    fault_summary(
        {
            "case": f"attention_with_kvcache(num_splits={type(splits).__name__} "
            f"{str(splits)[:12]})",
            "raised": str(caught.value)[:100],
        }
    )


def test_the_sdpa_drop_in_raises_what_torch_raises_for_a_huge_scale() -> None:
    """The drop-in's contract is torch's function, errors included."""
    q, k, v = _qkv()
    k, v = (t.repeat_interleave(2, dim=1) for t in (k, v))
    with pytest.raises(Exception) as torchs:
        F.scaled_dot_product_attention(q, k, v, scale=HUGE)
    with pytest.raises(type(torchs.value)):
        scaled_dot_product_attention(q, k, v, scale=HUGE)


PROBE = textwrap.dedent("""
    import json, sys, warnings, torch
    from autotune.runtime.attention import attention

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    B, HQ, HKV, LQ, LK, D = 16, 32, 8, 1, 8192, 128
    q = torch.randn(B, HQ, LQ, D, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 1, LK, D, dtype=torch.bfloat16).expand(B, HKV, LK, D)
            for _ in range(2))
    warnings.simplefilter("ignore")
    attention(q[:1, :4], k[:1, :1, :64], v[:1, :1, :64], return_lse=True)  # imports, warm-up
    open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from here
    before = status("VmRSS")
    out, lse = attention(q, k, v, return_lse=True)
    assert bool(torch.isfinite(lse).all())
    print(json.dumps({"growth": status("VmHWM") - before,
                      "logical_kv": 2 * k.numel() * k.element_size()}))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's peak RSS reset")
def test_cpu_fallback_memory_does_not_grow_with_expanded_inputs(
    fault_summary: Callable[[dict[str, Any]], None],
) -> None:
    import json

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    fault_summary(
        {
            "case": "CPU fallback with return_lse=True, K and V of 2 MB expanded to "
            "[16, 8, 8192, 128] bf16",
            "peak_growth_mb": round(measured["growth"] / 2**20),
            "logical_kv_mb": round(measured["logical_kv"] / 2**20),
        }
    )
    # the working set is bounded (a slice of K and V in fp32, a chunk of scores), not the
    # 4.6 GB of fp32 K and V per query head it took before
    assert measured["growth"] < 600 * 2**20, measured
