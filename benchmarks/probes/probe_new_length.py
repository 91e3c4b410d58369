"""What a call costs at a key length torch SDPA has not seen before, as a KV cache growing by one
token per step meets it: torch's default SDPA against FlashAttention's aten op called directly
(and the memory-efficient one), on decode-sized problems. Per geometry: the backend torch's
default picks (kernel names from the profiler), the wall time of a call at a new length and at a
length seen before (synchronised, median), and the GPU time at a fixed length (events, L2
flushed before each call, the two paths alternating). Cited by
benchmarks/results/generalize/COMMANDS.md.

    python benchmarks/probes/probe_new_length.py [--steps 24]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

# (batch, heads_q, heads_kv, lq, lk, head_dim, dtype, causal)
CASES = [
    (1, 32, 8, 1, 4096, 128, "bf16", True),
    (1, 32, 32, 1, 4096, 128, "bf16", True),
    (8, 32, 8, 1, 2048, 128, "fp16", True),
    (1, 32, 8, 1, 4096, 64, "bf16", False),
    (4, 32, 8, 4, 1024, 128, "bf16", False),
    (1, 40, 8, 1, 8192, 128, "bf16", True),
    (2, 16, 16, 1, 1000, 256, "bf16", True),
]


def _kernels(fn: Callable[[], Any]) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        import torch

        torch.cuda.synchronize()
    names = sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})
    return "; ".join(n[:70] for n in names) or "?"


def _growing(call: Callable[..., Any], q: Any, kv: Any) -> Callable[[int], Any]:
    """The call on q and the first n keys (and values) of kv."""

    def run(n: int) -> Any:
        return call(q, kv[:, :, :n], kv[:, :, :n])

    return run


def main() -> None:
    import torch

    import autotune
    from autotune.measure.sdpa import backend_call, sdpa_kwargs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    print(
        f"torch {torch.__version__} cuDNN {torch.backends.cudnn.version()} "
        f"{torch.cuda.get_device_name()}"
    )
    for b, hq, hkv, lq, lk, d, dt, causal in CASES:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
        q = torch.randn(b, hq, lq, d, device="cuda", dtype=dtype)
        kv = torch.randn(b, hkv, lk + args.steps + 1, d, device="cuda", dtype=dtype)
        kwargs = sdpa_kwargs(lq, lk, hq, hkv, causal=causal, scale=d**-0.5)
        kwargs.pop("attn_mask", None)  # causal rows here have lq == 1: no mask
        paths: dict[str, Callable[[int], Any]] = {}
        for name in ("default", "flash", "efficient", "cudnn"):
            call = backend_call(name, kwargs)
            paths[name] = _growing(call, q, kv)
        paths["ours"] = _growing(
            functools.partial(autotune.attention, causal=causal, scale=d**-0.5), q, kv
        )
        row = f"B{b} H{hq}/{hkv} Lq{lq} Lk{lk} D{d} {dt}"
        ref = paths["default"](lk).float()
        print(f"{row}: default runs [{_kernels(functools.partial(paths['default'], lk))}]")
        for name in list(paths):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    err = (paths[name](lk).float() - ref).abs().max().item()
            except RuntimeError as exc:
                print(f"  {name:9s} refuses: {str(exc).splitlines()[0][:80]}")
                del paths[name]
                continue
            new: list[float] = []
            seen: list[float] = []
            for i in range(args.steps):
                n = lk + 1 + i
                for bucket in (new, seen):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    paths[name](n)
                    torch.cuda.synchronize()
                    bucket.append((time.perf_counter() - t0) * 1e6)
            print(
                f"  {name:9s} wall per call: new length median {statistics.median(new):9.1f} "
                f"us (max {max(new):9.1f}), seen length median {statistics.median(seen):7.1f}"
                f" us; max|diff| to default {err:.2e}"
            )
        gpu: dict[str, list[Any]] = {n: [] for n in paths}
        for _ in range(30):
            for name, fn in paths.items():
                flush.zero_()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn(lk)
                end.record()
                gpu[name].append((start, end))
        torch.cuda.synchronize()
        med = {n: statistics.median(s.elapsed_time(e) * 1e3 for s, e in v) for n, v in gpu.items()}
        print(
            f"  GPU at Lk {lk} (events around the call, L2 flushed, alternating): "
            + ", ".join(f"{n} {t:.1f} us" for n, t in med.items())
        )


if __name__ == "__main__":
    main()
