"""Host time per call (microseconds, median, no synchronisation per call) of the pieces of a
decode-sized call that dispatch hands to torch SDPA: torch directly, transformers' SDPA
attention function, ours (the transformers attention function, `attention` in each layout),
then a cache that grows by one key per call (a new geometry per call), and with `--profile`
a cProfile of 50 growing calls. Cited by benchmarks/results/generalize/COMMANDS.md.

    python benchmarks/probes/probe_host.py [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

B, H, HK, D, L = 1, 32, 8, 128, 4096


def host_us(fn: Callable[[], Any], calls: int = 3000) -> float:
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
        if i % 200 == 0:  # keep the queue short: the host time, not a full queue's back-pressure
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    for lq in (1, 8):
        probe(lq, args.profile)


def probe(lq: int, profile_growing: bool) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    import autotune
    from autotune.runtime.transformers_attention import attention_forward, bottom_right_marker

    class Layer(torch.nn.Module):
        is_causal = True
        num_key_value_groups = H // HK

    layer = Layer()
    scale = D**-0.5
    projected = torch.randn(B, lq, H, D, device="cuda", dtype=torch.bfloat16)
    q = projected.transpose(1, 2)  # transformers' view
    k = torch.randn(B, HK, L, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    causal = lq > 1
    kwargs: dict[str, Any] = {"enable_gqa": True}
    marker, mask = None, None
    if causal:
        kwargs["attn_mask"] = causal_lower_right(lq, L)
        marker = bottom_right_marker(q.device)
        mask = torch.ones(lq, L, dtype=torch.bool, device="cuda").tril(L - lq)
    rows: dict[str, Callable[[], Any]] = {
        "F.sdpa direct": lambda: F.scaled_dot_product_attention(q, k, v, **kwargs),
        "transformers sdpa_attention_forward": lambda: sdpa_attention_forward(
            layer, q, k, v, mask, scaling=scale
        ),
        "ours attention_forward": lambda: attention_forward(layer, q, k, v, marker, scaling=scale),
        "autotune.attention blhd": lambda: autotune.attention(
            projected,
            k.transpose(1, 2),
            v.transpose(1, 2),
            causal=causal,
            scale=scale,
            layout="blhd",
        ),
        "autotune.attention bhld": lambda: autotune.attention(q, k, v, causal=causal, scale=scale),
        "3 transposes": lambda: (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
        "os.environ.get": lambda: os.environ.get("CUTE_AUTOTUNE_STRICT", "0"),
    }
    print(f"== Lq {lq} Lk {L} H{H}/{HK} D{D} bf16 causal={causal}")
    for name, fn in rows.items():
        print(f"  {name:40s} {host_us(fn):9.2f} us")
    keys = [torch.randn(B, HK, L + i, D, device="cuda", dtype=torch.bfloat16) for i in range(400)]
    turn = iter(range(10**9))

    def growing() -> Any:
        grown = keys[next(turn) % len(keys)]
        return autotune.attention(q, grown, grown, causal=causal, scale=scale)

    autotune.configure()
    print(
        f"  {'growing cache (400 lengths, fresh memo)':40s} {host_us(growing, calls=399):9.2f} us"
    )
    print(f"  {'growing cache, memo warm':40s} {host_us(growing, calls=399):9.2f} us")
    if profile_growing:
        autotune.configure()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(50):
            growing()
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(30)
        print(text.getvalue())


if __name__ == "__main__":
    main()
