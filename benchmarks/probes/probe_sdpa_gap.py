"""Host and GPU time of small calls that dispatch hands to torch SDPA, against SDPA called
directly: the GPU window under a short and a long GPU spin (the long one hides host time), the
host time per call, and the kernels each runs. Cited by
benchmarks/results/generalize/COMMANDS.md.

    python benchmarks/probes/probe_sdpa_gap.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = [
    ("blhd", (11, 32, 8, 195, 449, 128, "bf16", False)),
    ("bhld", (4, 32, 8, 2, 165, 128, "fp16", True)),
    ("blhd", (2, 48, 1, 2, 713, 128, "bf16", True)),
    ("blhd", (2, 8, 4, 9, 421, 256, "bf16", True)),
    ("bhld", (16, 14, 2, 101, 113, 64, "fp16", True)),
]


def timings(fns: dict[str, Callable[[], Any]], spin: int, calls: int = 40) -> str:
    import torch

    gpu: dict[str, list[Any]] = {n: [] for n in fns}
    host: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            torch.cuda._sleep(spin)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            began = time.perf_counter()
            fn()
            host[name].append((time.perf_counter() - began) * 1e6)
            end.record()
            gpu[name].append((start, end))
    torch.cuda.synchronize()
    return "  ".join(
        f"{name} gpu {statistics.median(s.elapsed_time(e) * 1e3 for s, e in gpu[name]):7.1f} us"
        f" host {statistics.median(host[name]):6.1f} us"
        for name in fns
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    import torch
    from alternating_check import _sdpa
    from torch.profiler import ProfilerActivity, profile

    import autotune
    from autotune.model import Problem

    for layout, sizes in CASES:
        problem = Problem(*sizes)
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[problem.dtype]

        def tensor(
            heads: int, length: int, p: Problem = problem, lay: str = layout, dt: Any = dtype
        ) -> Any:
            shape = (
                (p.batch, heads, length, p.head_dim)
                if lay == "bhld"
                else (p.batch, length, heads, p.head_dim)
            )
            return torch.randn(shape, device="cuda", dtype=dt)

        q = tensor(problem.heads_q, problem.seqlen_q)
        k, v = (tensor(problem.heads_kv, problem.seqlen_k) for _ in range(2))
        qb, kb, vb = (t if layout == "bhld" else t.transpose(1, 2) for t in (q, k, v))

        def ours(
            q: Any = q, k: Any = k, v: Any = v, p: Problem = problem, lay: str = layout
        ) -> Any:
            return autotune.attention(q, k, v, causal=p.causal, layout=lay)

        fns = {"ours": ours, "sdpa": _sdpa(qb, kb, vb, problem.causal, None)}
        for fn in fns.values():
            fn()
            fn()
        torch.cuda.synchronize()
        decision = autotune.explain(q, k, v, causal=problem.causal, layout=layout)
        print("==", layout, problem.describe(), "|", decision.describe()[:120])
        for spin in (100_000, 2_000_000):
            print(f"  spin {spin:>8}: {timings(fns, spin)}")
        for name, fn in fns.items():
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            cuda = torch.autograd.DeviceType.CUDA  # type: ignore[attr-defined]
            kernels = [e.name[:90] for e in prof.events() if e.device_type == cuda]
            print(f"  {name} kernels: {kernels}")


if __name__ == "__main__":
    main()
